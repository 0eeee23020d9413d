//! The stream loop's side of schema changes (see `crate::schema_change`):
//! comparing the catalog with the columns last published, publishing the
//! schema-change record and queueing the backfill.

use std::sync::Arc;

use super::{now_ms, Pipeline, Record};
use crate::config::SchemaChangeBackfill;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::offset::SourceOffset;
use crate::schema_change::{self, ColumnChange, SchemaHistory, TableSchemas, TableShape};
use crate::seam::SchemaCatalog;
use crate::seam::Source;
use crate::snapshot::{request, SnapshotKind, TableProgress};

/// The schema watch, one component of the pipeline: where schema changes
/// go and, per captured table, the columns of its last schema-change record
/// (read back from the topic at start): what its events use. It owns both;
/// the pipeline hands it the catalog's columns and publishes what it returns.
pub(crate) struct SchemaWatch {
    /// `<topic.prefix>.schema-changes`.
    topic: Arc<str>,
    history: SchemaHistory,
}

/// What a schema-change record takes from outside the schema watch.
pub(super) struct Seen<'a> {
    /// `name`, the connector the records name.
    pub(super) connector: &'a str,
    /// `schema.change.backfill`.
    pub(super) backfill: SchemaChangeBackfill,
    /// The position the change was seen at.
    pub(super) at_lsn: u64,
    pub(super) now_ms: i64,
}

/// The schema-change records of one comparison.
pub(super) struct Compared {
    /// One per table whose columns differ from its last record, or seen
    /// the first time.
    pub(super) records: Vec<Record>,
    /// How many of them are changes (not a table seen the first time).
    pub(super) changes: u64,
}

impl SchemaWatch {
    pub(super) fn new(topic: Arc<str>, history: SchemaHistory) -> Self {
        Self { topic, history }
    }

    /// The schema-change topic.
    /// The columns and former names last published, per table.
    pub(super) fn history(&self) -> &SchemaHistory {
        &self.history
    }

    pub(super) fn topic(&self) -> &Arc<str> {
        &self.topic
    }

    /// Compares the catalog's columns (`now`, per table) with those each
    /// table's last schema-change record names, and returns a record for
    /// each table that differs (and for a table seen the first time, so the
    /// topic holds every table's columns). `queue_backfill` is called for a
    /// table whose rows changed without row events (under
    /// `schema.change.backfill = "auto"`) and returns the snapshot id the
    /// record names.
    pub(super) fn compare(
        &mut self,
        now: TableSchemas,
        seen: &Seen<'_>,
        mut queue_backfill: impl FnMut(&str) -> String,
    ) -> Compared {
        let mut compared = Compared {
            records: Vec::new(),
            changes: 0,
        };
        for (table, columns) in now {
            let changes = match self.history.columns.get(&table) {
                Some(old) if *old == columns => continue,
                Some(old) => schema_change::diff(old, &columns),
                None => Vec::new(),
            };
            let first_seen = !self.history.columns.contains_key(&table);
            self.history.note_renames(&table, &changes);
            let backfill = (!first_seen
                && seen.backfill == SchemaChangeBackfill::Auto
                && changes.iter().any(ColumnChange::changes_rows))
            .then(|| queue_backfill(&table));
            if !first_seen {
                tracing::info!(table = %table, changes = ?changes, backfill = ?backfill, "schema change");
                compared.changes += 1;
            }
            let (key, value) = schema_change::record(
                seen.connector,
                &table,
                &changes,
                TableShape {
                    columns: &columns,
                    former_names: self.history.former_names(&table),
                },
                seen.at_lsn,
                backfill.as_deref(),
                seen.now_ms,
            );
            let mut r = Record::new(&self.topic, Some(key), Some(value));
            r.partition = Some(0);
            compared.records.push(r);
            self.history.columns.insert(table, columns);
        }
        compared
    }

    /// Which source columns `rel`'s fields are (table `qualified`), for the
    /// encoder's schema ([`SchemaCatalog::identity`]); `xid`: the stream's
    /// transaction the description came in (none for a snapshot chunk's).
    pub(crate) async fn source_identity<C: SchemaCatalog>(
        &self,
        control: &C,
        qualified: &str,
        rel: &C::Table,
        xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        crate::seam::identity_in_history(control, &self.history, qualified, rel, xid).await
    }
}

impl<S: Source> Pipeline<'_, S> {
    /// Compares every captured table's columns in the catalog with those
    /// its last schema-change record names ([`SchemaWatch::compare`]),
    /// publishes the records and queues the backfills. Runs at every
    /// heartbeat and after a Relation message that differs from the cached
    /// one.
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
                crate::snapshot::split_table(t).is_some_and(|(s, n)| self.router.captures(s, n))
            })
            .cloned()
            .collect();
        if tables.is_empty() {
            return Ok(());
        }
        let now = self.source.control.columns(&tables).await?;
        let seen = Seen {
            connector: self.cfg.connector_name(),
            backfill: self.cfg.schema_change_backfill,
            at_lsn: self
                .source
                .server_position
                .max(self.kafka.position().flush_lsn),
            now_ms: now_ms(),
        };
        let in_flight = self.snapshot.in_flight();
        let stage = self.kafka.stage();
        let compared = self
            .source
            .schema
            .compare(now, &seen, |table| queue_backfill(stage, in_flight, table));
        self.metrics.schema_changes.inc_by(compared.changes);
        if compared.records.is_empty() {
            return Ok(());
        }
        self.kafka
            .ensure_compacted_topic(self.source.schema.topic())
            .await?;
        self.publish(compared.records).await?;
        // Outside a transaction nothing else would commit them soon.
        if !self.source.tracker.in_tx() && !self.kafka.committing() {
            self.commit_position().await?;
        }
        self.snapshot.publish_view(self.kafka.position());
        Ok(())
    }
}

/// Queues a snapshot of `table` that reads every row after now, in the
/// staged position `stage`, and returns the id of the snapshot it joins. A
/// pass of that table already under way (`in_flight`: a chunk of the
/// queue's first table is being read) may have read rows before the change,
/// so a new pass is queued after it; a queued pass that has not started yet
/// reads the new rows anyway.
pub(super) fn queue_backfill(stage: &mut SourceOffset, in_flight: bool, table: &str) -> String {
    if let Some(p) = stage.snapshot.as_mut() {
        let unstarted = p
            .tables
            .iter()
            .enumerate()
            .any(|(i, t)| t.table == table && t.last_key.is_none() && !(i == 0 && in_flight));
        if !unstarted {
            p.tables.push(TableProgress::new(table, None));
        }
        return p.id.clone();
    }
    let id = format!("schema-change-{}", now_ms());
    request(
        &mut stage.snapshot,
        id.clone(),
        SnapshotKind::Incremental,
        vec![TableProgress::new(table, None)],
    );
    id
}
