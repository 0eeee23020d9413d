//! Quarantine: a table that cannot be captured as it is — no key, a topic
//! another table holds, a replica identity without its key — is set aside
//! instead of stopping capture, so every other table flows and the slot
//! advances. Nothing of it is published (its changes are counted in
//! `oncely_capture_refused_changes_total`, never sent), and it is never
//! silent: the log, `/readyz`, `oncely_capture_quarantined{table}` and the
//! offset record (which `oncely status` reads) name it with the reason and
//! the fix.
//!
//! ```text
//!  problem seen (start-up, a Relation message)       fix seen in the catalog (heartbeat)
//!         |                                                   |
//!  quarantined: changes skipped, snapshots of it       fixed_at = the server's WAL end now
//!  dropped, kept in every offset record                       |
//!         |                                           the stream passes fixed_at: released,
//!  restart: still broken -> stays; fixed -> as right   an incremental snapshot of it queued
//!                                                             |
//!                                                     its last chunk: a truncate versioned at
//!                                                     fixed_at removes the rows deleted meanwhile
//! ```
//!
//! The invariant: a table's changes are skipped only while it is in the
//! offset record's `quarantined`, and it leaves that record only with a
//! snapshot of it queued in the same record (or because it is no longer
//! captured). Releasing only once the stream has passed the position where
//! the catalog showed the fix keeps a change made before the fix (replayed
//! after a restart, with the Relation message of its time) from setting the
//! table aside again. A row deleted while the table was set aside is not in
//! the snapshot: when the snapshot completes, a truncate event versioned at
//! the fix (`stale_rows_removal`) removes from every target the rows older
//! than it, which by then are only those.

use super::committer::{Committer, Transactions};
use super::snapshot::ChunkEncoding;
use super::snapshot_runtime::SnapshotDriver;
use super::{now_ms, Pipeline, Record};
use crate::config::ReplicaIdentityCheck;
use crate::envelope::SourcePosition;
use crate::error::CaptureError;
use crate::naming::check_length;
use crate::offset::SourceOffset;
use crate::seam::{CapturedTable, QuarantineChecks, Source};
use crate::snapshot::{request, SnapshotKind, TableProgress};
use oncely_core::wire::format_lsn;

/// What the catalog says of a quarantined table now.
enum Verdict {
    /// No longer selected (dropped, renamed, excluded): nothing is owed.
    Gone,
    /// Still cannot be captured: the reason and the fix.
    Broken(String),
    /// Can be captured, keyed by these columns.
    Fine(CapturedTable),
}

/// The quarantine's work on the snapshot and the committer's staged
/// position, which holds the quarantined tables.
impl<Rel> SnapshotDriver<Rel> {
    /// Sets `table` aside for `reason` (which names the fix). Its snapshot,
    /// queued or in flight, is dropped: a snapshot of it is queued again
    /// when it is released.
    pub(super) fn quarantine<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        table: &str,
        reason: String,
    ) {
        self.fixes.forget(table);
        if kafka.position().quarantined.get(table) == Some(&reason) {
            return;
        }
        tracing::error!(
            table,
            metric = crate::metrics::QUARANTINED,
            "table {table} is quarantined: {reason}. Its changes are not published until it is fixed; the other tables go on. Once the fix is in the catalog (or in the configuration, after a restart), capture snapshots {table} again by itself"
        );
        kafka.stage().quarantined.insert(table.to_owned(), reason);
        self.drop_snapshot_of(kafka, table);
        self.show_quarantine(kafka.position());
    }

    /// Removes `table` from the snapshot queue and abandons its chunks in
    /// flight: a quarantined table's rows are never published.
    pub(super) fn drop_snapshot_of<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        table: &str,
    ) {
        self.abandon_table(table);
        let stage = kafka.stage();
        if let Some(p) = stage.snapshot.as_mut() {
            let before = p.tables.len();
            p.tables.retain(|t| t.table != table);
            if p.tables.len() != before {
                tracing::info!(table, "snapshot of a quarantined table dropped; it is snapshotted whole once the table is fixed");
            }
            if p.tables.is_empty() {
                stage.snapshot = None;
            }
        }
        self.publish_view(kafka.position());
    }

    /// The gauge and `/readyz` show the quarantined tables of `position`.
    pub(super) fn show_quarantine(&self, position: &SourceOffset) {
        let gauge = &self.metrics.quarantined;
        gauge.reset();
        for table in position.quarantined.keys() {
            gauge.with_label_values(&[table.as_str()]).set(1);
        }
        self.metrics.health.quarantined(
            position
                .quarantined
                .iter()
                .map(|(t, why)| (t.clone(), why.clone()))
                .collect(),
        );
    }

    /// The quarantined table `table` is gone from what is captured: nothing
    /// is owed.
    pub(super) fn forget_gone<T: Transactions>(&mut self, kafka: &mut Committer<T>, table: &str) {
        tracing::info!(table = %table, "quarantined table is no longer captured (dropped, renamed or left out): nothing owed");
        kafka.stage().quarantined.remove(table);
        self.fixes.forget(table);
    }

    /// Ends `table`'s quarantine: an incremental snapshot of it, queued in
    /// the same offset record, covers every change skipped meanwhile (the
    /// caller decides its routes again).
    pub(super) fn release<T: Transactions>(&mut self, kafka: &mut Committer<T>, table: &str) {
        let stage = kafka.stage();
        if let Some(at) = self.fixes.take(table) {
            stage.stale_before.insert(table.to_owned(), at);
        }
        stage.quarantined.remove(table);
        stage
            .tables
            .get_or_insert_with(Default::default)
            .insert(table.to_owned());
        let added = request(
            &mut stage.snapshot,
            format!("quarantine-{}", now_ms()),
            SnapshotKind::Incremental,
            vec![TableProgress::new(table, None)],
        );
        tracing::info!(table, snapshot = ?added, "table {table} is no longer quarantined: its changes are published again, and an incremental snapshot of it brings the targets up to date");
        self.publish_view(kafka.position());
    }

    /// When an unfiltered snapshot of a table released from quarantine completes:
    /// a truncate event on every partition of its topic, versioned at the
    /// position where its fix was seen (`stale_before`, event ordinal 0,
    /// which no change takes). Every sink applies a truncate to the rows
    /// older than it only, and by then every row the source holds is newer
    /// (read by the snapshot, or changed since), so what it removes are the
    /// rows deleted while the table was set aside. Empty for other tables.
    pub(super) fn stale_rows_removal<T: Transactions>(
        &self,
        kafka: &mut Committer<T>,
        table: &str,
        encoding: &ChunkEncoding,
        partitions: i32,
        src: &SourcePosition,
    ) -> Vec<Record> {
        let Some(before) = kafka.stage().stale_before.remove(table) else {
            return Vec::new();
        };
        let at = SourcePosition {
            tx_id: src.tx_id,
            lsn: before,
            commit_lsn: before,
            event_seq: 0,
            commit_ts_ms: src.commit_ts_ms,
            snapshot: crate::envelope::SnapshotMarker::Incremental,
        };
        let value = encoding.encoder.truncate_value(&at, now_ms());
        let records = (0..partitions)
            .map(|partition| {
                let mut record = Record::new(&encoding.topic, None, Some(value.clone()));
                record.partition = Some(partition);
                record.headers.push((
                    crate::envelope::HEADER_POSITION,
                    crate::envelope::position_header(&at),
                ));
                record
            })
            .collect();
        tracing::info!(table, before = %format_lsn(before), "snapshot of a table released from quarantine complete: rows older than its fix (deleted while it was set aside) removed from the targets");
        records
    }
}

/// The quarantine's catalog checks, asked of the source ([`QuarantineChecks`]).
impl<S: Source> Pipeline<'_, S> {
    /// Sets `table` aside for `reason` ([`SnapshotDriver::quarantine`]).
    pub(super) fn quarantine(&mut self, table: &str, reason: String) {
        self.snapshot.quarantine(&mut self.kafka, table, reason);
    }

    /// At each heartbeat: reads the catalog for every quarantined table,
    /// notes where a fix was first seen, and releases the tables whose fix
    /// the stream has passed.
    pub(super) async fn check_quarantine(&mut self) -> Result<(), CaptureError> {
        if self.kafka.position().quarantined.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = self.kafka.position().quarantined.keys().cloned().collect();
        let verdicts = match self.evaluate(&names).await {
            Ok(v) => v,
            // A catalog the filters cannot read now (a partition created
            // without its root selected): the tables stay set aside.
            Err(CaptureError::Prerequisite(why)) => {
                tracing::warn!(%why, "quarantined tables not checked");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for (table, verdict) in names.into_iter().zip(verdicts) {
            match verdict {
                Verdict::Gone => self.snapshot.forget_gone(&mut self.kafka, &table),
                Verdict::Broken(reason) => self.quarantine(&table, reason),
                Verdict::Fine(t) if !self.snapshot.fixes.seen(&table) => {
                    self.note_fix(table, t).await?
                }
                Verdict::Fine(_) => {}
            }
        }
        let reached = self
            .source
            .server_position
            .max(self.kafka.position().flush_lsn);
        for table in self.snapshot.fixes.passed(reached) {
            self.release(&table);
        }
        self.snapshot.show_quarantine(self.kafka.position());
        Ok(())
    }

    /// The catalog shows quarantined `table` fixed (as `t`): its changes
    /// are published from here on, and it is released once the stream
    /// passes the server's WAL end now.
    async fn note_fix(&mut self, table: String, t: CapturedTable) -> Result<(), CaptureError> {
        let control = &mut self.source.control;
        // Its changes reach the stream from here on (a filtered publication
        // holds keyed tables only).
        if let Err(e) = control.publish(self.cfg, &t).await {
            return match e {
                CaptureError::Prerequisite(why) => {
                    self.quarantine(&table, why);
                    Ok(())
                }
                e => Err(e),
            };
        }
        let at = self.source.control.position_now().await?;
        tracing::info!(table = %table, fixed_at = %format_lsn(at), "quarantined table is fixed in the catalog; released once the stream passes this position");
        self.router.learn_key(table.clone(), t.key_columns);
        self.snapshot.fixes.note(table, at);
        Ok(())
    }

    /// Ends `table`'s quarantine ([`SnapshotDriver::release`]); its routes
    /// are decided again.
    fn release(&mut self, table: &str) {
        self.snapshot.release(&mut self.kafka, table);
        self.router.release(table);
    }

    /// What the catalog and the configuration say of each of `tables` now,
    /// by the rules start-up applies (see `start::set_aside`).
    async fn evaluate(&mut self, tables: &[String]) -> Result<Vec<Verdict>, CaptureError> {
        let control = &mut self.source.control;
        let selected = control.selected(self.cfg).await?;
        let mut verdicts = Vec::with_capacity(tables.len());
        for name in tables {
            if selected.keyless.contains(name) {
                verdicts.push(Verdict::Broken(control.keyless_reason(name)));
                continue;
            }
            let Some(t) = selected.tables.iter().find(|t| &t.qualified() == name) else {
                verdicts.push(Verdict::Gone);
                continue;
            };
            let topic = self.cfg.table_topic(&t.schema, &t.name);
            if let Err(e) = check_length(&topic, name) {
                verdicts.push(Verdict::Broken(e.to_string()));
                continue;
            }
            if let Err(e) = self.router.claim_table(&topic, &t.schema, &t.name) {
                verdicts.push(Verdict::Broken(e.to_string()));
                continue;
            }
            if self.cfg.replica_identity_check == ReplicaIdentityCheck::Fail {
                if let Some(why) = control.identity_problem(t).await? {
                    verdicts.push(Verdict::Broken(why));
                    continue;
                }
            }
            verdicts.push(Verdict::Fine(t.clone()));
        }
        Ok(verdicts)
    }
}
