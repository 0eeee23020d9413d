//! Row filters (`table.filter`) in the publication: PostgreSQL 15+ sends a
//! filtered table's changes only for rows its `WHERE` holds for, and turns
//! an UPDATE that moves a row out of the filter into a DELETE and one that
//! moves it in into an INSERT. On PostgreSQL 13 and 14 the publication
//! carries no filter and capture evaluates it on the stream with the same
//! semantics (`sources/postgres/filter.rs`); the start-up checks below
//! refuse there what PostgreSQL 15 would refuse.
//!
//! What the server keeps is its own rendering of a filter
//! (`pg_get_expr(prqual)`: parentheses and casts added), so a configured
//! filter is compared by the rendering the server gives it: it is added to a
//! probe publication in a transaction that is rolled back. The same probe
//! names the columns the filter reads (the server records them in
//! `pg_depend`): under a replica identity that does not cover them, the
//! server refuses every UPDATE and DELETE on the table, so capture refuses
//! to add such a filter and refuses to start on a publication that has one.

use tokio_postgres::Client;

use super::{privilege_or, CapturedTable};
use crate::config::{AutocreateMode, CaptureConfig};
use crate::error::CaptureError;
use crate::naming::quote_ident;
use crate::sources::postgres::filter;

pub use crate::sources::postgres::filter::ROW_FILTER_VERSION;

/// The probe publication's name (it never commits).
const PROBE: &str = "oncely_row_filter_probe";

/// A filter as the server holds it for one table of one publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFilter {
    /// `pg_get_expr(prqual, prrelid)`.
    pub rendered: String,
    /// The columns it reads that the table's replica identity lacks.
    pub outside_identity: Vec<String>,
}

/// `"schema"."table"`, followed by ` WHERE (filter)` when `table.filter`
/// filters it and the server filters publications (`by_server`): a table
/// as `CREATE`/`ALTER PUBLICATION` lists it.
pub fn publication_entry(cfg: &CaptureConfig, t: &CapturedTable, by_server: bool) -> String {
    match cfg.row_filter(&t.schema, &t.name) {
        Some(filter) if by_server => format!("{} WHERE ({filter})", t.quoted()),
        _ => t.quoted(),
    }
}

/// On a server without publication row filters, where capture evaluates
/// them: refuses a filter PostgreSQL 15 would refuse in a publication (a
/// function or operator that is not an immutable built-in, a user-defined
/// type or collation) and one reading columns outside the replica
/// identity (a DELETE's old row would lack them).
pub async fn check_evaluated(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    for table in tables {
        let Some(wanted) = cfg.row_filter(&table.schema, &table.name) else {
            continue;
        };
        let probed = filter::probe(client, &table.schema, &table.name, wanted).await?;
        if !probed.refused.is_empty() {
            return Err(CaptureError::Prerequisite(format!(
                "table.filter of {} uses {}: a row filter may call only immutable built-in functions and operators on built-in types, as PostgreSQL 15 allows in a publication",
                table.qualified(),
                probed.refused.join(", ")
            )));
        }
        if !probed.outside_identity.is_empty() {
            return Err(identity_refusal(table, &probed.outside_identity));
        }
    }
    Ok(())
}

/// The filter publication `publication` holds for `table`, if any.
async fn server_filter(
    client: &Client,
    publication: &str,
    table: &CapturedTable,
) -> Result<Option<ServerFilter>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT pg_get_expr(pr.prqual, pr.prrelid),
                    ARRAY(SELECT a.attname::text
                          FROM pg_depend d
                          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid
                          WHERE d.classid = 'pg_publication_rel'::regclass AND d.objid = pr.oid
                            AND d.refobjid = c.oid AND d.refobjsubid > 0
                            AND c.relreplident <> 'f'
                            AND NOT EXISTS (
                                SELECT 1 FROM pg_index i
                                WHERE i.indrelid = c.oid
                                  AND ((c.relreplident = 'd' AND i.indisprimary)
                                       OR (c.relreplident = 'i' AND i.indisreplident))
                                  AND a.attnum = ANY(i.indkey::int2[]))
                          ORDER BY a.attnum)
             FROM pg_publication_rel pr
             JOIN pg_publication p ON p.oid = pr.prpubid
             JOIN pg_class c ON c.oid = pr.prrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE p.pubname = $1 AND n.nspname = $2 AND c.relname = $3",
            &[&publication, &table.schema, &table.name],
        )
        .await?;
    Ok(row.and_then(|r| {
        let rendered: Option<String> = r.get(0);
        rendered.map(|rendered| ServerFilter {
            rendered,
            outside_identity: r.get(1),
        })
    }))
}

/// How the server renders `filter` on `table`, and the columns it reads
/// outside the replica identity: a probe publication, rolled back.
/// `Ok(None)`: the role may not create it (no ownership of the table).
async fn probe(
    client: &Client,
    cfg: &CaptureConfig,
    table: &CapturedTable,
) -> Result<Option<ServerFilter>, CaptureError> {
    client
        .batch_execute("BEGIN")
        .await
        .map_err(CaptureError::pg("begin row filter probe"))?;
    let created = client
        .batch_execute(&format!(
            // As capture's own: a partitioned table's filter needs it.
            "CREATE PUBLICATION {PROBE} FOR TABLE {} WITH (publish_via_partition_root = true)",
            publication_entry(cfg, table, true)
        ))
        .await;
    let read = match created {
        Ok(()) => server_filter(client, PROBE, table).await.map(Some),
        Err(e) => Err(e),
    };
    client
        .batch_execute("ROLLBACK")
        .await
        .map_err(CaptureError::pg("end row filter probe"))?;
    match read {
        Ok(filter) => Ok(filter.flatten()),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            Ok(None)
        }
        // The server refused the filter itself (a mutable function, a
        // user-defined operator, a column that does not exist): its SQLSTATE
        // and message name the reason and hold no row value.
        Err(e) if e.as_db_error().is_some() => Err(CaptureError::Prerequisite(format!(
            "table.filter of {} is refused by the server as a publication row filter: {} (SQLSTATE {})",
            table.qualified(),
            e.as_db_error().map(|d| d.message()).unwrap_or_default(),
            e.code().map(|c| c.code()).unwrap_or_default()
        ))),
        Err(e) => Err(CaptureError::pg("row filter probe")(e)),
    }
}

/// The fix for a filter reading columns outside the replica identity.
fn identity_refusal(table: &CapturedTable, columns: &[String]) -> CaptureError {
    CaptureError::Prerequisite(format!(
        "the row filter of {} reads column(s) {} that its replica identity does not hold, so PostgreSQL would refuse every UPDATE and DELETE on the table: run ALTER TABLE {} REPLICA IDENTITY FULL, or filter on key columns only",
        table.qualified(),
        columns.join(", "),
        table.quoted()
    ))
}

/// Refuses a configured filter of `tables` that reads columns outside the
/// table's replica identity, before it is published.
pub async fn check_identity(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    for table in tables {
        if cfg.row_filter(&table.schema, &table.name).is_none() {
            continue;
        }
        if let Some(wanted) = probe(client, cfg, table).await? {
            if !wanted.outside_identity.is_empty() {
                return Err(identity_refusal(table, &wanted.outside_identity));
            }
        }
    }
    Ok(())
}

/// Makes the publication's row filters of the captured `tables` those of
/// `table.filter` (mode `filtered`), or checks they are (mode `disabled`,
/// naming the SQL to run); refuses a filter the replica identity does not
/// cover. Called after the tables are in the publication.
pub async fn ensure_row_filters(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    let name = &cfg.publication_name;
    check_not_in_schema(client, cfg, tables).await?;
    for table in tables {
        let wanted = match cfg.row_filter(&table.schema, &table.name) {
            Some(_) => probe(client, cfg, table).await?,
            None => None,
        };
        if let Some(columns) = wanted.as_ref().map(|w| &w.outside_identity) {
            if !columns.is_empty() {
                return Err(identity_refusal(table, columns));
            }
        }
        let held = server_filter(client, name, table)
            .await
            .map_err(CaptureError::pg("read publication row filter"))?;
        let configured = cfg.row_filter(&table.schema, &table.name);
        if same_filter(held.as_ref(), wanted.as_ref(), configured) {
            if let Some(columns) = held.as_ref().map(|h| &h.outside_identity) {
                if !columns.is_empty() {
                    return Err(identity_refusal(table, columns));
                }
            }
            continue;
        }
        set_row_filter(client, cfg, table, held.as_ref()).await?;
    }
    Ok(())
}

/// Refuses a filtered table that the publication holds through `FOR
/// TABLES IN SCHEMA`: such a table has no row of its own to carry a
/// filter, and the server refuses adding one by name beside its schema.
async fn check_not_in_schema(
    client: &Client,
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
) -> Result<(), CaptureError> {
    let name = &cfg.publication_name;
    let schemas: Vec<String> = client
        .query(
            "SELECT n.nspname::text FROM pg_publication_namespace pn
             JOIN pg_publication p ON p.oid = pn.pnpubid
             JOIN pg_namespace n ON n.oid = pn.pnnspid
             WHERE p.pubname = $1",
            &[name],
        )
        .await
        .map_err(CaptureError::pg("read publication schemas"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let Some(table) = tables
        .iter()
        .find(|t| schemas.contains(&t.schema) && cfg.row_filter(&t.schema, &t.name).is_some())
    else {
        return Ok(());
    };
    let publication = quote_ident(name);
    Err(CaptureError::Prerequisite(format!(
        "publication `{name}` publishes {} through FOR TABLES IN SCHEMA {}, which cannot filter rows, and table.filter filters it: run ALTER PUBLICATION {publication} DROP TABLES IN SCHEMA {} and publish the captured tables by name (ALTER PUBLICATION {publication} ADD TABLE {}), or drop the publication and let publication.autocreate.mode = \"filtered\" create it",
        table.qualified(),
        table.schema,
        quote_ident(&table.schema),
        publication_entry(cfg, table, true)
    )))
}

/// Whether the publication holds the configured filter: compared by the
/// server's rendering when the probe could make one, else (no ownership to
/// probe with) by the text less white space and outer parentheses.
fn same_filter(
    held: Option<&ServerFilter>,
    wanted: Option<&ServerFilter>,
    configured: Option<&str>,
) -> bool {
    match (held, configured) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(held), Some(configured)) => match wanted {
            Some(wanted) => held.rendered == wanted.rendered,
            None => squeezed(&held.rendered) == squeezed(configured),
        },
    }
}

/// `text` without white space and parentheses, for a comparison that
/// tolerates the server's added parentheses only.
fn squeezed(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
        .collect()
}

/// Replaces `table`'s row filter in the publication (mode `filtered`: the
/// table is dropped from it and added back with the filter in one
/// transaction, so no change between is published unfiltered), or names
/// the SQL to run.
async fn set_row_filter(
    client: &Client,
    cfg: &CaptureConfig,
    table: &CapturedTable,
    held: Option<&ServerFilter>,
) -> Result<(), CaptureError> {
    let name = quote_ident(&cfg.publication_name);
    let sql = format!(
        "BEGIN; ALTER PUBLICATION {name} DROP TABLE {}; ALTER PUBLICATION {name} ADD TABLE {}; COMMIT",
        table.quoted(),
        publication_entry(cfg, table, true)
    );
    let configured = cfg.row_filter(&table.schema, &table.name);
    if cfg.publication_autocreate_mode != AutocreateMode::Filtered {
        return Err(CaptureError::Prerequisite(format!(
            "publication `{}` filters the rows of {} by {} but table.filter says {}: run {sql}; or set publication.autocreate.mode = \"filtered\" to let capture do it",
            cfg.publication_name,
            table.qualified(),
            held.map_or("nothing".to_owned(), |h| format!("({})", h.rendered)),
            configured.map_or("nothing".to_owned(), |c| format!("({c})")),
        )));
    }
    if let Err(e) = client.batch_execute(&sql).await {
        // A failed statement leaves the transaction open.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(privilege_or(
            e,
            &format!(
                "changing the row filter of {} in publication `{}` needs ownership of both",
                table.qualified(),
                cfg.publication_name
            ),
            "alter publication row filter",
        ));
    }
    // Rows the new filter lets in are not in the targets and rows it now
    // leaves out stay there: the stream carries changes only.
    tracing::warn!(
        table = %table.qualified(),
        was = held.map_or("(none)", |h| h.rendered.as_str()),
        now = configured.unwrap_or("(none)"),
        "the table's row filter changed: rows it now lets in reach the targets only when changed or by an incremental snapshot of the table (execute-snapshot), and rows it now leaves out stay in the targets until deleted; oncely verify reports both"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{same_filter, squeezed, ServerFilter};

    fn filter(rendered: &str) -> ServerFilter {
        ServerFilter {
            rendered: rendered.into(),
            outside_identity: vec![],
        }
    }

    #[test]
    fn a_filter_is_compared_by_the_servers_rendering_when_probed() {
        let held = filter("(id > 10)");
        assert!(same_filter(
            Some(&held),
            Some(&filter("(id > 10)")),
            Some("id>10")
        ));
        assert!(!same_filter(
            Some(&held),
            Some(&filter("(id > 11)")),
            Some("id > 10")
        ));
        assert!(!same_filter(None, None, Some("id > 10")));
        assert!(!same_filter(Some(&held), None, None));
        assert!(same_filter(None, None, None));
    }

    #[test]
    fn without_a_probe_only_white_space_and_parentheses_are_ignored() {
        let held = filter("((id % 2) = 0)");
        assert!(same_filter(Some(&held), None, Some("id % 2 = 0")));
        assert!(!same_filter(Some(&held), None, Some("id % 3 = 0")));
        assert_eq!(squeezed(" (a <> 'x') "), "a<>'x'");
    }
}
