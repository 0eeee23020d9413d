//! `gap.recovery = "snapshot"` for `oncely sink`: the recovery snapshot is
//! requested through the signal table of the capture named by
//! `gap.capture.config`, exactly as `oncely capture snapshot --table` does,
//! and is done once that capture's stored offset has moved past the signal
//! with none of the tables left in its running snapshot.

use std::path::Path;

use anyhow::{bail, Context};
use async_trait::async_trait;
use oncely_capture::config::CaptureConfig;
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
                "gap.recovery = \"snapshot\": {} sets no signal.data.collection; add e.g. signal.data.collection = \"public.oncely_signal\" (a captured table with columns id, type, data) to the capture, or set gap.recovery = \"stop\"",
                path.display()
            );
        };
        let Some((schema, name)) = table.split_once('.') else {
            bail!(
                "{}: signal.data.collection must be schema.table",
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

    async fn connect(&self) -> Result<tokio_postgres::Client, SinkError> {
        let pg = oncely_capture::catalog::pg_config(&self.cfg, "oncely-sink-gap-recovery");
        oncely_capture::catalog::connect_with(&self.cfg, &pg, "gap recovery signal")
            .await
            .map_err(|e| {
                SinkError::retriable(format!("connect to the source for a gap recovery: {e}"))
            })
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

#[async_trait]
impl SnapshotSignals for CaptureSignals {
    async fn request(&self, topic: &str) -> Result<SnapshotRequest, SinkError> {
        let client = self.connect().await?;
        let rows = client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
                &[&self.cfg.publication_name],
            )
            .await
            .map_err(|e| SinkError::retriable_from("list the published tables", e))?;
        let tables: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .filter(|(s, t)| self.cfg.table_topic(s, t) == topic)
            .collect();
        if tables.is_empty() {
            return Ok(SnapshotRequest {
                database: self.cfg.database_dbname.clone(),
                tables,
                before: Version::default(),
                token: 0,
            });
        }
        // Read before the signal: every chunk starts after capture saw it.
        let before = wal_position(&client).await?;
        let names: Vec<String> = tables.iter().map(|(s, t)| format!("{s}.{t}")).collect();
        let data = serde_json::json!({ "data-collections": names, "type": "incremental" });
        let id = format!("gap-{}-{topic}-{}", self.group, now_ms());
        let (schema, table) = &self.signal_table;
        let data = data.to_string();
        insert_signal(
            &client,
            (schema, table),
            &id,
            "execute-snapshot",
            Some(&data),
        )
        .await
        .map_err(|e| SinkError::retriable_from("insert the recovery snapshot's signal", e))?;
        let after = wal_position(&client).await?;
        tracing::warn!(signal = %id, tables = %names.join(", "), "recovery snapshot requested for a gap in {topic}");
        Ok(SnapshotRequest {
            database: self.cfg.database_dbname.clone(),
            tables,
            before: Version::new(before, 0),
            token: after,
        })
    }

    async fn finished(&self, request: &SnapshotRequest) -> Result<bool, SinkError> {
        let offset = oncely_capture::catalog::read_stored_offset(&self.cfg)
            .await
            .map_err(|e| SinkError::retriable(format!("read the capture's offset: {e}")))?;
        let Some(offset) = offset else {
            return Ok(false);
        };
        // A transaction committed after the signal is published only once
        // capture has handled the signal (commit order), so its offset
        // record lists the tables while their snapshot runs.
        if offset.commit_lsn <= request.token {
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
}
