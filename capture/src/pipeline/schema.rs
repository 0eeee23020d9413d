//! The stream loop's side of schema changes (see `crate::schema_change`):
//! comparing the catalog with the columns last published, publishing the
//! schema-change record and queueing the backfill.

use std::sync::Arc;

use super::{now_ms, Pipeline, Record};
use crate::config::SchemaChangeBackfill;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::schema_change::{self, ColumnChange, SchemaHistory, TableShape};
use crate::snapshot::{request, SnapshotKind, TableProgress};
use crate::sources::postgres::pgoutput::Relation;

/// The schema watch's state, one component of the pipeline: where schema
/// changes go and, per captured table, the columns of its last
/// schema-change record (read back from the topic at start): what its
/// events use.
pub(super) struct SchemaWatch {
    /// `<topic.prefix>.schema-changes`.
    pub(super) topic: Arc<str>,
    pub(super) history: SchemaHistory,
}

impl Pipeline<'_> {
    /// Compares every captured table's columns in the catalog with those
    /// its last schema-change record names; publishes a record for each
    /// table that differs (and for a table seen the first time, so the
    /// topic holds every table's columns) and queues a backfill where rows
    /// changed without row events. Runs at every heartbeat and after a
    /// Relation message that differs from the cached one.
    pub(super) async fn check_schemas(&mut self) -> Result<(), CaptureError> {
        let tables: Vec<String> = self
            .kafka
            .position()
            .tables
            .iter()
            .flatten()
            .filter(|t| self.cfg.outbox.as_ref().is_none_or(|o| &o.table != *t))
            .filter(|t| self.cfg.signal_table() != Some(t.as_str()))
            // Tables captured once but since left out of the include list.
            .filter(|t| {
                crate::snapshot::split_table(t)
                    .is_some_and(|(s, n)| self.router.filter.matches(s, n))
            })
            .cloned()
            .collect();
        if tables.is_empty() {
            return Ok(());
        }
        let now = schema_change::load(&self.control, &tables)
            .await
            .map_err(CaptureError::pg("read the captured tables' columns"))?;
        let mut records = Vec::new();
        for (table, columns) in now {
            let changes = match self.schema.history.columns.get(&table) {
                Some(old) if *old == columns => continue,
                Some(old) => schema_change::diff(old, &columns),
                None => Vec::new(),
            };
            let first_seen = !self.schema.history.columns.contains_key(&table);
            self.schema.history.note_renames(&table, &changes);
            let backfill = (!first_seen
                && self.cfg.schema_change_backfill == SchemaChangeBackfill::Auto
                && changes.iter().any(ColumnChange::changes_rows))
            .then(|| self.queue_backfill(&table));
            if !first_seen {
                tracing::info!(table = %table, changes = ?changes, backfill = ?backfill, "schema change");
                self.metrics.schema_changes.inc();
            }
            let (key, value) = schema_change::record(
                self.cfg.connector_name(),
                &table,
                &changes,
                TableShape {
                    columns: &columns,
                    former_names: self.schema.history.former_names(&table),
                },
                self.server_position.max(self.kafka.position().flush_lsn),
                backfill.as_deref(),
                now_ms(),
            );
            let mut r = Record::new(&self.schema.topic, Some(key), Some(value));
            r.partition = Some(0);
            records.push(r);
            self.schema.history.columns.insert(table, columns);
        }
        if records.is_empty() {
            return Ok(());
        }
        self.kafka
            .ensure_compacted_topic(&self.schema.topic)
            .await?;
        self.publish(records).await?;
        // Outside a transaction nothing else would commit them soon.
        if !self.tracker.in_tx() && !self.kafka.committing() {
            self.commit_position().await?;
        }
        self.publish_view();
        Ok(())
    }

    /// Which source columns `rel`'s fields are (table `qualified`), for the
    /// encoder's schema ([`schema_change::identity`]); `xid`: the stream's
    /// transaction the Relation came in (none for a snapshot chunk's).
    pub(super) async fn source_identity(
        &self,
        qualified: &str,
        rel: &Relation,
        xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        let known = self
            .schema
            .history
            .columns
            .get(qualified)
            .map(Vec::as_slice);
        let former = self.schema.history.former_names(qualified);
        schema_change::identity(&self.control, rel, known, former, xid).await
    }

    /// Queues a snapshot of `table` that reads every row after now, and
    /// returns the id of the snapshot it joins. A pass of that table already
    /// under way may have read rows before the change, so a new pass is
    /// queued after it; a queued pass that has not started yet reads the
    /// new rows anyway.
    fn queue_backfill(&mut self, table: &str) -> String {
        let in_flight = self.snap_in_flight();
        if let Some(p) = self.kafka.stage().snapshot.as_mut() {
            let unstarted =
                p.tables.iter().enumerate().any(|(i, t)| {
                    t.table == table && t.last_key.is_none() && !(i == 0 && in_flight)
                });
            if !unstarted {
                p.tables.push(TableProgress::new(table, None));
            }
            return p.id.clone();
        }
        let id = format!("schema-change-{}", now_ms());
        request(
            &mut self.kafka.stage().snapshot,
            id.clone(),
            SnapshotKind::Incremental,
            vec![TableProgress::new(table, None)],
        );
        id
    }
}
