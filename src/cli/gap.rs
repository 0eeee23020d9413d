//! `gap.recovery = "snapshot"` for `oncely sink`: the recovery snapshot is
//! requested through the signal table of the capture named by
//! `gap.capture.config`, exactly as `oncely capture snapshot --table` does,
//! and is done once that capture's stored offset has moved past the signal
//! with none of the tables left in its running snapshot. A PostgreSQL
//! capture's position is its WAL position; a MySQL or MariaDB capture's
//! (`source = "mysql"`) the binlog's end as the order key of its offset
//! records, in their failover epoch (as `oncely verify` waits for it).

use std::path::Path;

use anyhow::{bail, Context};
use async_trait::async_trait;
use oncely_capture::catalog::mysql::MySqlCatalog;
use oncely_capture::catalog::SourceOffset;
use oncely_capture::config::{CaptureConfig, SourceKind};
use oncely_core::clock::now_ms;
use oncely_sinks::runner::{SnapshotRequest, SnapshotSignals};
use oncely_sinks::{SinkError, Version};

use super::insert_signal;

/// Signals the capture of `gap.capture.config` (see the module docs).
pub struct CaptureSignals {
    cfg: CaptureConfig,
    /// `(schema, table)` of `signal.data.collection`.
    signal_table: (String, String),
    group: String,
}

impl CaptureSignals {
    /// Loads the capture configuration; it must name a signal table.
    pub fn load(path: &Path, group: &str) -> anyhow::Result<Self> {
        let cfg = CaptureConfig::load(path).with_context(|| {
            format!(
                "gap.capture.config: invalid capture configuration in {}",
                path.display()
            )
        })?;
        let Some(table) = cfg.signal_table() else {
            bail!(
                "gap.recovery = \"snapshot\": {} sets no signal.data.collection; add e.g. signal.data.collection = \"public.oncely_signal\" (\"<database>.oncely_signal\" on MySQL; a captured table with columns id, type, data) to the capture, or set gap.recovery = \"stop\"",
                path.display()
            );
        };
        let Some((schema, name)) = table.split_once('.') else {
            bail!(
                "{}: signal.data.collection must be schema.table (database.table on MySQL)",
                path.display()
            );
        };
        let signal_table = (schema.to_owned(), name.to_owned());
        Ok(Self {
            cfg,
            signal_table,
            group: group.to_owned(),
        })
    }

    async fn connect(&self) -> Result<Source, SinkError> {
        let failed = |e: &dyn std::fmt::Display| {
            SinkError::retriable(format!("connect to the source for a gap recovery: {e}"))
        };
        if self.cfg.source == SourceKind::Mysql {
            return MySqlCatalog::connect(&self.cfg)
                .await
                .map(Source::Mysql)
                .map_err(|e| failed(&e));
        }
        let pg = oncely_capture::catalog::pg_config(&self.cfg, "oncely-sink-gap-recovery");
        oncely_capture::catalog::connect_with(&self.cfg, &pg, "gap recovery signal")
            .await
            .map(Source::Pg)
            .map_err(|e| failed(&e))
    }
}

/// The server's WAL write position, as a number.
async fn wal_position(client: &tokio_postgres::Client) -> Result<u64, SinkError> {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .map_err(|e| SinkError::retriable_from("read the source's WAL position", e))?;
    let lsn: i64 = row.get(0);
    Ok(lsn.unsigned_abs())
}

/// A connection to the capture's source database.
enum Source {
    Pg(tokio_postgres::Client),
    Mysql(MySqlCatalog),
}

impl Source {
    /// `(schema, table)` of the captured tables that write `topic` (a MySQL
    /// database is the schema).
    async fn tables(
        &mut self,
        cfg: &CaptureConfig,
        topic: &str,
    ) -> Result<Vec<(String, String)>, SinkError> {
        let all: Vec<(String, String)> = match self {
            Self::Pg(client) => client
                .query(
                    "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                    &[&cfg.publication_name],
                )
                .await
                .map_err(|e| SinkError::retriable_from("list the published tables", e))?
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect(),
            Self::Mysql(catalog) => catalog
                .captured_tables(cfg)
                .await
                .map_err(|e| SinkError::retriable(format!("list the captured tables: {e}")))?
                .into_iter()
                .map(|shape| (shape.database, shape.table))
                .collect(),
        };
        Ok(all
            .into_iter()
            .filter(|(s, t)| cfg.table_topic(s, t) == topic)
            .collect())
    }

    /// The source's position now, as capture's offset records order it.
    async fn position(&mut self, cfg: &CaptureConfig) -> Result<u64, SinkError> {
        match self {
            Self::Pg(client) => wal_position(client).await,
            Self::Mysql(catalog) => oncely::verify::binlog_end_key(catalog, cfg)
                .await
                .map_err(|e| SinkError::retriable(format!("read the binlog's end: {e}"))),
        }
    }

    async fn insert_signal(
        &mut self,
        table: (&str, &str),
        id: &str,
        data: &str,
    ) -> Result<(), SinkError> {
        let what = "insert the recovery snapshot's signal";
        match self {
            Self::Pg(client) => insert_signal(client, table, id, "execute-snapshot", Some(data))
                .await
                .map(drop)
                .map_err(|e| SinkError::retriable_from(what, e)),
            Self::Mysql(catalog) => catalog
                .insert_signal(table, id, "execute-snapshot", Some(data))
                .await
                .map_err(|e| SinkError::retriable(format!("{what}: {e}"))),
        }
    }
}

#[async_trait]
impl SnapshotSignals for CaptureSignals {
    async fn request(&self, topic: &str) -> Result<SnapshotRequest, SinkError> {
        let mut source = self.connect().await?;
        let tables = source.tables(&self.cfg, topic).await?;
        let database = match self.cfg.source {
            SourceKind::Mysql => tables.first().map(|(db, _)| db.clone()).unwrap_or_default(),
            _ => self.cfg.database_dbname.clone(),
        };
        if tables.is_empty() {
            return Ok(SnapshotRequest {
                database,
                tables,
                before: Version::default(),
                token: 0,
                signal: String::new(),
            });
        }
        // Read before the signal: every chunk starts after capture saw it.
        let before = source.position(&self.cfg).await?;
        let names: Vec<String> = tables.iter().map(|(s, t)| format!("{s}.{t}")).collect();
        let data = serde_json::json!({ "data-collections": names, "type": "incremental" });
        let id = format!("gap-{}-{topic}-{}", self.group, now_ms());
        let (schema, table) = &self.signal_table;
        source
            .insert_signal((schema, table), &id, &data.to_string())
            .await?;
        // The offset record that covers this position is committed after
        // the signal's transaction, whose offset holds the signal's plan.
        let token = source.position(&self.cfg).await?;
        tracing::warn!(signal = %id, tables = %names.join(", "), "recovery snapshot requested for a gap in {topic}");
        Ok(SnapshotRequest {
            database,
            tables,
            before: Version::new(before, 0),
            token,
            signal: id,
        })
    }

    async fn finished(&self, request: &SnapshotRequest) -> Result<bool, SinkError> {
        let offset = oncely_capture::catalog::read_stored_offset(&self.cfg)
            .await
            .map_err(|e| SinkError::retriable(format!("read the capture's offset: {e}")))?;
        let Some(offset) = offset else {
            return Ok(false);
        };
        recovered(&offset, request)
    }
}

/// Whether capture's stored `offset` shows the recovery snapshot of
/// `request` done. Covered as `oncely verify` reads it (`flush_lsn`: the
/// source position capture has published up to, moved by a heartbeat when
/// nothing else is written), not by a later transaction's commit, which an
/// idle source never writes. A signal's plan commits with its own
/// transaction (a signal acts on the staged position), so an offset record
/// covering the signal lists the tables while their snapshot runs, and
/// says whether capture refused the signal: then no snapshot runs, and the
/// recovery fails (fatal) rather than end with rows missing. An older
/// capture records no outcome: read as taken.
fn recovered(offset: &SourceOffset, request: &SnapshotRequest) -> Result<bool, SinkError> {
    let refused = offset
        .signal(&request.signal)
        .and_then(|s| s.refused.as_deref());
    if let Some(reason) = refused {
        let tables: Vec<String> = request
            .tables
            .iter()
            .map(|(s, t)| format!("{s}.{t}"))
            .collect();
        return Err(SinkError::fatal(format!(
            "capture refused the recovery snapshot of {} (signal {}), so none runs: {reason}",
            tables.join(", "),
            request.signal
        )));
    }
    if offset.flush_lsn < request.token {
        return Ok(false);
    }
    let running = offset.snapshot.as_ref().is_some_and(|s| {
        s.tables.iter().any(|t| {
            request
                .tables
                .iter()
                .any(|(schema, name)| t.table == format!("{schema}.{name}"))
        })
    });
    Ok(!running)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(json: serde_json::Value) -> SourceOffset {
        serde_json::from_value(json).expect("an offset record")
    }

    fn request(token: u64) -> SnapshotRequest {
        SnapshotRequest {
            database: "shop".into(),
            tables: vec![("shop".into(), "orders".into())],
            before: Version::default(),
            token,
            signal: "gap-1".into(),
        }
    }

    #[test]
    fn a_refused_signal_fails_the_recovery_with_capture_s_reason() {
        let reason = "shop.orders: is quarantined (no primary key); capture snapshots it by itself once it is fixed";
        let refused = offset(serde_json::json!({
            "commit_lsn": 1000, "events": 1, "complete": true, "flush_lsn": 1200,
            "signals": [{"id": "gap-0"}, {"id": "gap-1", "refused": reason}]
        }));
        let e = recovered(&refused, &request(1000)).expect_err("refused");
        assert!(!e.is_retriable(), "not asked again: {e}");
        let e = e.to_string();
        assert!(e.contains(reason), "{e}");
        assert!(e.contains("gap-1"), "{e}");
        // Read as soon as it is committed, even before the heartbeat covers it.
        let early = offset(serde_json::json!({
            "commit_lsn": 900, "events": 1, "complete": true, "flush_lsn": 950,
            "signals": [{"id": "gap-1", "refused": reason}]
        }));
        assert!(recovered(&early, &request(1000)).is_err());
    }

    #[test]
    fn a_taken_signal_or_an_older_capture_s_offset_recovers_as_before() {
        let taken = offset(serde_json::json!({
            "commit_lsn": 1000, "events": 1, "complete": true, "flush_lsn": 1200,
            "signals": [{"id": "gap-1"}, {"id": "gap-2", "refused": "shop.other: not captured"}]
        }));
        assert!(recovered(&taken, &request(1000)).unwrap());
        let older = offset(serde_json::json!({
            "commit_lsn": 1000, "events": 1, "complete": true, "flush_lsn": 1200
        }));
        assert!(recovered(&older, &request(1000)).unwrap());
    }

    #[test]
    fn an_idle_source_s_heartbeat_past_the_signal_ends_the_recovery() {
        // No transaction after the signal's: its commit key stays below the
        // position read after the signal, the heartbeat's flush covers it.
        let idle = offset(serde_json::json!({
            "commit_lsn": 900, "events": 1, "complete": true, "flush_lsn": 1000
        }));
        assert!(recovered(&idle, &request(1000)).unwrap());
    }

    #[test]
    fn the_recovery_waits_for_the_signal_and_for_its_tables() {
        let before = offset(serde_json::json!({
            "commit_lsn": 900, "events": 1, "complete": true, "flush_lsn": 999
        }));
        assert!(!recovered(&before, &request(1000)).unwrap());
        let running = offset(serde_json::json!({
            "commit_lsn": 1000, "events": 1, "complete": true, "flush_lsn": 1200,
            "snapshot": {
                "id": "gap-1", "kind": "incremental",
                "tables": [{"table": "shop.orders"}]
            }
        }));
        assert!(!recovered(&running, &request(1000)).unwrap());
    }
}
