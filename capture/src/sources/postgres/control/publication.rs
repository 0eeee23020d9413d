//! The publication capture streams from: created, extended or altered as
//! `publication.autocreate.mode` allows, or a start-up error naming the SQL
//! to run.

use tokio_postgres::Client;

use super::row_filter::{self, publication_entry};
use super::{privilege_or, CapturedTable};
use crate::config::{AutocreateMode, CaptureConfig};
use crate::error::CaptureError;
use crate::naming::quote_ident;

/// Checks the publication covers every captured table, creating or extending
/// it as `publication.autocreate.mode` allows. It publishes partitions through
/// their root (`publish_via_partition_root`, PostgreSQL 13+): a publication
/// without it is altered unless the mode is `disabled`, where start-up stops
/// if a partitioned table is captured.
pub async fn ensure_publication(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    let name = &cfg.publication_name;
    let mode = cfg.publication_autocreate_mode;
    let features = PublicationFeatures::read(client, tables).await?;
    if !features.row_filters {
        // Capture evaluates them on the stream: refused here as 15 would.
        row_filter::check_evaluated(client, cfg, tables).await?;
    }
    let exists = client
        .query_opt(
            &format!(
                "SELECT puballtables, {}, {} FROM pg_publication WHERE pubname = $1",
                features.via_root_column(),
                features.generated_column()
            ),
            &[name],
        )
        .await
        .map_err(CaptureError::pg("read publication"))?;
    let Some(row) = exists else {
        return create_publication(client, cfg, tables, &features).await;
    };
    if !row.get::<_, bool>(2) {
        ensure_generated_columns_published(client, name, mode, tables).await?;
    }
    let (all_tables, via_root) = (row.get::<_, bool>(0), row.get::<_, bool>(1));
    if !via_root {
        ensure_via_root(client, name, mode, &features.partitioned).await?;
    }
    if all_tables {
        if !cfg.table_filter.is_empty() {
            return Err(CaptureError::Prerequisite(format!(
                "publication `{name}` is FOR ALL TABLES, which cannot filter rows, and table.filter is set: publish the captured tables by name (CREATE PUBLICATION ... FOR TABLE t WHERE (...)) or drop it and let publication.autocreate.mode = \"filtered\" create it"
            )));
        }
        return Ok(());
    }
    ensure_tables_published(client, cfg, tables, features.row_filters).await?;
    if !features.row_filters {
        // No filter to hold: capture evaluates them (checked above).
        return Ok(());
    }
    row_filter::ensure_row_filters(client, cfg, tables).await
}

/// What the server's version lets a publication do, and the captured
/// partitioned tables that depend on it.
struct PublicationFeatures {
    /// `publish_via_partition_root` (PostgreSQL 13+).
    via_root: bool,
    /// `publish_generated_columns` (PostgreSQL 18+).
    generated: bool,
    /// Publication row filters (PostgreSQL 15+; `pg_publication_rel.prqual`).
    row_filters: bool,
    /// The captured partitioned tables, qualified.
    partitioned: Vec<String>,
}

impl PublicationFeatures {
    /// Reads the server version; a partitioned table captured from a server
    /// that cannot publish through the root stops start-up.
    async fn read(client: &Client, tables: &[CapturedTable]) -> Result<Self, CaptureError> {
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(CaptureError::pg("read server version"))?
            .get(0);
        let via_root = version >= 130_000;
        let partitioned: Vec<String> = tables
            .iter()
            .filter(|t| t.partitioned)
            .map(CapturedTable::qualified)
            .collect();
        if !via_root && !partitioned.is_empty() {
            return Err(CaptureError::Prerequisite(format!(
                "partitioned table(s) {} need PostgreSQL 13 or later (publish_via_partition_root), this server is version {version}: upgrade, or leave them out with table.exclude.list",
                partitioned.join(", ")
            )));
        }
        // PostgreSQL 18 publishes stored generated columns when asked to
        // (`publish_generated_columns`); capture always asks, so targets
        // mirror them (see PUBLISHED_COLUMN).
        let generated = version >= GENERATED_COLUMNS_VERSION;
        Ok(Self {
            via_root,
            generated,
            row_filters: version >= row_filter::ROW_FILTER_VERSION,
            partitioned,
        })
    }

    /// The `WITH (...)` clause a publication capture creates gets.
    fn with_clause(&self) -> &'static str {
        match (self.via_root, self.generated) {
            (true, true) => {
                " WITH (publish_via_partition_root = true, publish_generated_columns = stored)"
            }
            (true, false) => " WITH (publish_via_partition_root = true)",
            _ => "",
        }
    }

    /// The `pg_publication` column saying it publishes through the root, or
    /// `true` where the server has no such option.
    fn via_root_column(&self) -> &'static str {
        if self.via_root {
            "pubviaroot"
        } else {
            "true"
        }
    }

    /// The condition saying it publishes stored generated columns, or `true`
    /// where the server cannot.
    fn generated_column(&self) -> &'static str {
        if self.generated {
            "pubgencols::text = 's'"
        } else {
            "true"
        }
    }
}

/// Creates the missing publication as `publication.autocreate.mode` allows,
/// or names the SQL to run when it is `disabled`.
async fn create_publication(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
    features: &PublicationFeatures,
) -> Result<(), CaptureError> {
    let (name, mode) = (&cfg.publication_name, cfg.publication_autocreate_mode);
    let with = features.with_clause();
    let quoted: Vec<String> = tables
        .iter()
        .map(|t| publication_entry(cfg, t, features.row_filters))
        .collect();
    if mode == AutocreateMode::Filtered && features.row_filters {
        // A filter the replica identity does not cover would stop every
        // UPDATE and DELETE on its table: refused before it is published.
        row_filter::check_identity(client, cfg, tables).await?;
    }
    match mode {
        AutocreateMode::Disabled => Err(CaptureError::Prerequisite(format!(
            "publication `{name}` does not exist and publication.autocreate.mode is `disabled`: create it (CREATE PUBLICATION {} FOR TABLE {}{with}) or set publication.autocreate.mode = \"filtered\"",
            quote_ident(name),
            if quoted.is_empty() { "...".to_string() } else { quoted.join(", ") }
        ))),
        AutocreateMode::AllTables => {
            let sql = format!(
                "CREATE PUBLICATION {} FOR ALL TABLES{with}",
                quote_ident(name)
            );
            client.batch_execute(&sql).await.map_err(|e| {
                privilege_or(e, &format!("creating publication `{name}` FOR ALL TABLES needs a superuser: create it as one, or use publication.autocreate.mode = \"filtered\" with a user that owns the tables"), "create publication")
            })?;
            tracing::info!(publication = %name, "created publication FOR ALL TABLES");
            Ok(())
        }
        AutocreateMode::Filtered => {
            let sql = if quoted.is_empty() {
                format!("CREATE PUBLICATION {}{with}", quote_ident(name))
            } else {
                format!(
                    "CREATE PUBLICATION {} FOR TABLE {}{with}",
                    quote_ident(name),
                    quoted.join(", ")
                )
            };
            client.batch_execute(&sql).await.map_err(|e| {
                privilege_or(e, &format!("creating publication `{name}` needs ownership of the captured tables and CREATE on the database"), "create publication")
            })?;
            tracing::info!(publication = %name, tables = quoted.len(), "created publication");
            Ok(())
        }
    }
}

/// Sets `publish_via_partition_root` on a publication that lacks it: without
/// it a partition's changes carry the partition's name while its root is what
/// is captured and snapshotted. In `disabled` mode it is left alone unless a
/// partitioned table is captured, which stops start-up.
async fn ensure_via_root(
    client: &Client,
    name: &str,
    mode: AutocreateMode,
    partitioned: &[String],
) -> Result<(), CaptureError> {
    if mode == AutocreateMode::Disabled {
        if !partitioned.is_empty() {
            return Err(CaptureError::Prerequisite(format!(
                "publication `{name}` publishes the changes of partitioned table(s) {} under their partitions' names, but capture needs them under the partitioned table: run ALTER PUBLICATION {} SET (publish_via_partition_root = true); or set publication.autocreate.mode = \"filtered\" to let capture do it",
                partitioned.join(", "),
                quote_ident(name)
            )));
        }
        return Ok(());
    }
    let sql = format!(
        "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
        quote_ident(name)
    );
    client.batch_execute(&sql).await.map_err(|e| {
        privilege_or(
            e,
            &format!("setting publish_via_partition_root on publication `{name}` needs its ownership: run {sql} as its owner, or set publication.autocreate.mode = \"disabled\" and capture no partitioned table"),
            "alter publication",
        )
    })?;
    tracing::info!(publication = %name, "publication now publishes partitions through their root (publish_via_partition_root = true)");
    Ok(())
}

/// Adds the captured tables a (not FOR ALL TABLES) publication lacks, in
/// `filtered` mode, or names the SQL to run.
async fn ensure_tables_published(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
    by_server: bool,
) -> Result<(), CaptureError> {
    let (name, mode) = (&cfg.publication_name, cfg.publication_autocreate_mode);
    // What the publication holds: its FOR TABLE members (a partitioned table
    // stays one even while pg_publication_tables lists its partitions
    // instead), and whatever else it publishes (FOR TABLES IN SCHEMA).
    let rows = client
        .query(
            "SELECT n.nspname::text || '.' || c.relname::text
             FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
             JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE p.pubname = $1
             UNION
             SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(CaptureError::pg("read publication tables"))?;
    let published: std::collections::HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
    let missing: Vec<&CapturedTable> = tables
        .iter()
        .filter(|t| !published.contains(&t.qualified()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let missing_quoted: Vec<String> = missing
        .iter()
        .map(|t| publication_entry(cfg, t, by_server))
        .collect();
    if mode == AutocreateMode::Filtered {
        if by_server {
            let missing: Vec<CapturedTable> = missing.iter().map(|t| (*t).clone()).collect();
            row_filter::check_identity(client, cfg, &missing).await?;
        }
        let sql = format!(
            "ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(name),
            missing_quoted.join(", ")
        );
        client.batch_execute(&sql).await.map_err(|e| {
            privilege_or(
                e,
                &format!("adding tables to publication `{name}` needs ownership of them"),
                "alter publication",
            )
        })?;
        tracing::info!(publication = %name, added = ?missing_quoted, "added tables to publication");
        return Ok(());
    }
    Err(CaptureError::Prerequisite(format!(
        "publication `{name}` does not include captured table(s) {}: run ALTER PUBLICATION {} ADD TABLE {}; or set publication.autocreate.mode = \"filtered\"; or narrow table.include.list",
        missing.iter().map(|t| t.qualified()).collect::<Vec<_>>().join(", "),
        quote_ident(name),
        missing_quoted.join(", ")
    )))
}

/// The first server version that publishes generated columns.
pub const GENERATED_COLUMNS_VERSION: i32 = 180_000;

/// SQL condition on `pg_attribute a`: the column is one pgoutput sends, so
/// snapshots, schema tracking and verify see the columns the stream does.
/// Stored generated columns are sent from PostgreSQL 18 on (capture's
/// publications set `publish_generated_columns = stored`); virtual ones
/// never are.
pub const PUBLISHED_COLUMN: &str = "(a.attgenerated = '' OR (a.attgenerated = 's' \
     AND current_setting('server_version_num')::int >= 180000))";

/// An existing publication of a PostgreSQL 18 server that leaves stored
/// generated columns out: set the option (modes that may alter it), or stop
/// when a captured table has such a column and capture may not.
async fn ensure_generated_columns_published(
    client: &Client,
    name: &str,
    mode: AutocreateMode,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    let sql = format!(
        "ALTER PUBLICATION {} SET (publish_generated_columns = stored)",
        quote_ident(name)
    );
    if mode == AutocreateMode::Disabled {
        let qualified: Vec<String> = tables.iter().map(CapturedTable::qualified).collect();
        let with_generated: Vec<String> = client
            .query(
                "SELECT DISTINCT n.nspname::text || '.' || c.relname::text
                 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE a.attgenerated = 's' AND NOT a.attisdropped
                   AND n.nspname::text || '.' || c.relname::text = ANY($1)
                 ORDER BY 1",
                &[&qualified],
            )
            .await
            .map_err(CaptureError::pg("read generated columns"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if with_generated.is_empty() {
            return Ok(());
        }
        return Err(CaptureError::Prerequisite(format!(
            "publication `{name}` leaves out stored generated columns, which captured table(s) {} have, so the targets would lack them: run {sql}; or set publication.autocreate.mode = \"filtered\" to let capture do it",
            with_generated.join(", ")
        )));
    }
    client.batch_execute(&sql).await.map_err(|e| {
        privilege_or(
            e,
            &format!("setting publish_generated_columns on publication `{name}` needs its ownership: run {sql} as its owner"),
            "alter publication",
        )
    })?;
    tracing::info!(publication = %name, "publication now publishes stored generated columns (publish_generated_columns = stored)");
    Ok(())
}
