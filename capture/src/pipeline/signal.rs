//! Signals read from the stream: inserts into `signal.data.collection`.
//! A signal acts once: its effect is part of the offset committed with the
//! position of its insert, and a replayed insert is skipped like any change.

use super::committer::{Committer, Transactions};
use super::snapshot_runtime::SnapshotDriver;
use super::{Pipeline, Route};
use crate::change::{Datum, RowImage, StreamTable};
use crate::error::CaptureError;
use crate::seam::SnapshotTableChecks;
use crate::seam::Source;
use crate::snapshot::signal::{parse, SignalAction};
use crate::snapshot::{request, split_table, SnapshotKind, TableProgress};

/// The columns of one signal row.
pub(super) struct SignalRow {
    id: String,
    kind: String,
    data: Option<String>,
}

#[cfg(test)]
impl SignalRow {
    /// A signal of `kind` without data.
    pub(super) fn new(id: &str, kind: &str) -> Self {
        SignalRow {
            id: id.to_owned(),
            kind: kind.to_owned(),
            data: None,
        }
    }
}

impl<S: Source> Pipeline<'_, S> {
    /// The signal in row `new` inserted into table `relation_id` when that
    /// is the signal table.
    pub(super) async fn signal_row(
        &mut self,
        relation_id: u32,
        new: &RowImage,
    ) -> Result<Option<SignalRow>, CaptureError> {
        let Some(Route::Signal(rel)) = self.route(relation_id).await? else {
            return Ok(None);
        };
        let column = |name: &str| -> Option<String> {
            let i = (0..rel.width()).position(|i| rel.column_name(i) == name)?;
            match new.0.get(i)? {
                Datum::Text(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            }
        };
        Ok(Some(SignalRow {
            id: column("id").unwrap_or_default(),
            kind: column("type").unwrap_or_default(),
            data: column("data"),
        }))
    }

    /// Acts on a signal; one that cannot be understood is logged and changes
    /// nothing but, for an execute-snapshot, its outcome in the offset.
    pub(super) async fn on_signal(&mut self, signal: SignalRow) -> Result<(), CaptureError> {
        let action = match parse(&signal.kind, signal.data.as_deref()) {
            Ok(a) => a,
            Err(reason) => {
                tracing::warn!(signal = %signal.id, kind = %signal.kind, %reason, "signal ignored");
                if signal.kind == "execute-snapshot" {
                    let refused = Checked::Refused(reason);
                    self.snapshot.on_signal(&mut self.kafka, &signal, refused);
                }
                return Ok(());
            }
        };
        let action = match action {
            SignalAction::ExecuteSnapshot { tables } => {
                self.check_snapshot(&signal, tables).await?
            }
            other => Checked::Other(other),
        };
        self.snapshot.on_signal(&mut self.kafka, &signal, action);
        Ok(())
    }

    /// An execute-snapshot's tables checked: all queued, or the signal
    /// refused as a whole when any one cannot be snapshotted.
    async fn check_snapshot(
        &mut self,
        signal: &SignalRow,
        tables: Vec<(String, Option<String>)>,
    ) -> Result<Checked, CaptureError> {
        let mut queued = Vec::with_capacity(tables.len());
        for (table, filter) in tables {
            if let Err(reason) = self.check_snapshot_table(&table, filter.as_deref()).await? {
                tracing::warn!(signal = %signal.id, table = %table, %reason, "execute-snapshot signal ignored");
                return Ok(Checked::Refused(format!("{table}: {reason}")));
            }
            queued.push(TableProgress::new(&table, filter));
        }
        Ok(Checked::ExecuteSnapshot(queued))
    }

    /// Whether `table` can be snapshotted (`Ok(Err(reason))` when not); learns
    /// its key columns. Database errors with a server code are reasons; a
    /// lost connection is an error (the signal is then read again).
    async fn check_snapshot_table(
        &mut self,
        table: &str,
        filter: Option<&str>,
    ) -> Result<Result<(), String>, CaptureError> {
        let Some((schema, name)) = split_table(table) else {
            return Ok(Err("not a schema.table name".into()));
        };
        // Existence first: "does not exist" is the clearest reason for a typo.
        let pk = match self.router.key_columns(table) {
            Some(k) => k.clone(),
            None => match self.source.control.primary_key(schema, name).await? {
                Ok(pk) => pk,
                Err(reason) => return Ok(Err(reason)),
            },
        };
        if let Err(reason) = self.snapshot_rules(table, schema, name) {
            return Ok(Err(reason));
        }
        if pk.is_empty() {
            return Ok(Err("has no primary key, so it cannot be read in key order: add one, or configure message.key.columns for it".into()));
        }
        self.router.learn_key(table.to_string(), pk);
        match filter {
            Some(filter) => self.source.control.check_filter(filter, schema, name).await,
            None => Ok(Ok(())),
        }
    }

    /// The rules of what is snapshotted: captured tables only, not the
    /// outbox or signal table, not a quarantined one.
    fn snapshot_rules(&self, table: &str, schema: &str, name: &str) -> Result<(), String> {
        if !self.router.captures(schema, name) {
            return Err(
                "not captured: add it to table.include.list (and restart) before snapshotting it"
                    .into(),
            );
        }
        if self.cfg.outbox.as_ref().is_some_and(|o| o.table == table)
            || self.cfg.signal_table() == Some(table)
        {
            return Err("the outbox and signal tables are not snapshotted".into());
        }
        if let Some(why) = self.kafka.position().quarantined.get(table) {
            return Err(format!(
                "is quarantined ({why}); capture snapshots it by itself once it is fixed"
            ));
        }
        Ok(())
    }
}

/// A signal's action once its tables were checked.
pub(super) enum Checked {
    /// Queue these tables' snapshots.
    ExecuteSnapshot(Vec<TableProgress>),
    /// An execute-snapshot that queues nothing: why (`schema.table: reason`).
    Refused(String),
    /// Stop, pause or resume.
    Other(SignalAction),
}

/// Signals act on the snapshot plan in the committer's staged position, so
/// that a signal's effect commits with the position of its insert.
impl<Rel> SnapshotDriver<Rel> {
    pub(super) fn on_signal<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        signal: &SignalRow,
        action: Checked,
    ) {
        let stage = kafka.stage();
        match action {
            Checked::ExecuteSnapshot(queued) => {
                let added = request(
                    &mut stage.snapshot,
                    signal.id.clone(),
                    SnapshotKind::Incremental,
                    queued,
                );
                tracing::info!(signal = %signal.id, tables = ?added, "execute-snapshot: tables queued");
                stage.record_signal(&signal.id, None);
            }
            Checked::Refused(reason) => stage.record_signal(&signal.id, Some(reason)),
            // Not made: an execute-snapshot comes with its tables checked.
            Checked::Other(SignalAction::ExecuteSnapshot { .. }) => {}
            Checked::Other(SignalAction::StopSnapshot { tables }) => {
                match (stage.snapshot.as_mut(), tables) {
                    (None, _) => {}
                    (Some(_), None) => stage.snapshot = None,
                    (Some(p), Some(names)) => {
                        p.tables.retain(|t| !names.contains(&t.table));
                        if p.tables.is_empty() {
                            stage.snapshot = None;
                        }
                    }
                }
                tracing::info!(signal = %signal.id, running = stage.snapshot.is_some(), "stop-snapshot");
            }
            Checked::Other(action) => {
                let pause = matches!(action, SignalAction::PauseSnapshot);
                match stage.snapshot.as_mut() {
                    Some(p) => {
                        p.paused = pause;
                        tracing::info!(signal = %signal.id, paused = pause, "snapshot {}", if pause { "paused" } else { "resumed" });
                    }
                    None => {
                        tracing::warn!(signal = %signal.id, kind = %signal.kind, reason = "no snapshot is running", "signal ignored")
                    }
                }
            }
        }
        self.publish_view(kafka.position());
    }
}
