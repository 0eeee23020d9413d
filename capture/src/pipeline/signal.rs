//! Signals read from the stream: inserts into `signal.data.collection`.
//! A signal acts once: its effect is part of the offset committed with the
//! position of its insert, and a replayed insert is skipped like any change.

use tokio_postgres::Client;

use super::committer::{Committer, Transactions};
use super::snapshot_runtime::SnapshotDriver;
use super::{Pipeline, Route};
use crate::change::Datum;
use crate::error::CaptureError;
use crate::snapshot::signal::{check_filter_on, parse, SignalAction};
use crate::snapshot::{quote_ident, request, split_table, SnapshotKind, TableProgress};
use crate::sources::postgres::chunk::FILTER_SEARCH_PATH;
use crate::sources::postgres::control;
use crate::sources::postgres::pgoutput::LogicalMessage;

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

impl Pipeline<'_> {
    /// The signal in `change` when it is an insert into the signal table.
    pub(super) async fn signal_row(
        &mut self,
        change: &LogicalMessage,
    ) -> Result<Option<SignalRow>, CaptureError> {
        let LogicalMessage::Insert { relation_id, new } = change else {
            return Ok(None);
        };
        let Some(Route::Signal(rel)) = self.route(*relation_id).await? else {
            return Ok(None);
        };
        let column = |name: &str| -> Option<String> {
            let i = rel.columns.iter().position(|c| c.name == name)?;
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

    /// Acts on a signal; one that cannot be understood is logged and changes nothing.
    pub(super) async fn on_signal(&mut self, signal: SignalRow) -> Result<(), CaptureError> {
        let action = match parse(&signal.kind, signal.data.as_deref()) {
            Ok(a) => a,
            Err(reason) => {
                tracing::warn!(signal = %signal.id, kind = %signal.kind, %reason, "signal ignored");
                return Ok(());
            }
        };
        let action = match action {
            SignalAction::ExecuteSnapshot { tables } => {
                let mut queued = Vec::with_capacity(tables.len());
                for (table, filter) in tables {
                    if let Err(reason) =
                        self.check_snapshot_table(&table, filter.as_deref()).await?
                    {
                        tracing::warn!(signal = %signal.id, table = %table, %reason, "execute-snapshot signal ignored");
                        return Ok(());
                    }
                    queued.push(TableProgress::new(&table, filter));
                }
                Checked::ExecuteSnapshot(queued)
            }
            other => Checked::Other(other),
        };
        self.snapshot.on_signal(&mut self.kafka, &signal, action);
        Ok(())
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
            None => match primary_key(&self.source.control, schema, name).await? {
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
            Some(filter) => check_filter(&self.source.control, filter, schema, name).await,
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
    /// Stop, pause or resume.
    Other(SignalAction),
}

/// Signals act on the snapshot plan in the committer's staged position, so
/// that a signal's effect commits with the position of its insert.
impl SnapshotDriver {
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
            }
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

/// The primary key of `schema.name` (`Ok(Err(reason))` when the server
/// says it cannot be read, such as no such table).
async fn primary_key(
    control: &Client,
    schema: &str,
    name: &str,
) -> Result<Result<Vec<String>, String>, CaptureError> {
    let mut looks = 0;
    loop {
        match control::primary_key(control, schema, name).await {
            Ok(pk) => return Ok(Ok(pk)),
            // A table created in the signal's own transaction: the
            // walsender sends a transaction once its commit is in the WAL, a
            // moment before the committing backend leaves the proc array, so
            // for that moment other sessions do not see the table yet.
            Err(e) if undefined_table(&e) && looks < TABLE_LOOKS => {
                looks += 1;
                tokio::time::sleep(TABLE_LOOK_PAUSE).await;
            }
            Err(e) => return definite(e).map(|r| r.map(|()| Vec::new())),
        }
    }
}

/// Whether `filter` works as a snapshot filter of `schema.name`
/// (`Ok(Err(reason))` when not).
async fn check_filter(
    control: &Client,
    filter: &str,
    schema: &str,
    name: &str,
) -> Result<Result<(), String>, CaptureError> {
    if let Err(why) = check_filter_on(filter, schema, name) {
        return Ok(Err(why));
    }
    // Prepared, never executed: the extended protocol parses one statement
    // only, and the result type says whether the filter is a boolean
    // expression of the table's columns.
    let probe = format!(
        "SELECT ({filter}) FROM {}.{} LIMIT 0",
        quote_ident(schema),
        quote_ident(name)
    );
    // Resolved as the chunk will resolve it (FILTER_SEARCH_PATH), in a
    // transaction of its own so the setting goes with it.
    match prepare_filter_probe(control, &probe).await? {
        Err(e) => filter_refused(e),
        Ok(statement) => {
            let ty = statement.columns().first().map(|c| c.type_().clone());
            if ty != Some(tokio_postgres::types::Type::BOOL) {
                return Ok(Err(format!(
                    "the filter is not a boolean expression (its type is {})",
                    ty.map_or_else(|| "unknown".to_owned(), |t| t.name().to_owned())
                )));
            }
            Ok(Ok(()))
        }
    }
}

/// Why the server refused to prepare a filter's probe. Class 42 messages
/// (no such column, operator or function) name identifiers; others, such
/// as a data exception (class 22), quote the filter's literals: only the
/// SQLSTATE is said.
fn filter_refused(e: tokio_postgres::Error) -> Result<Result<(), String>, CaptureError> {
    match e.code() {
        Some(code) if code.code().starts_with("42") => definite(CaptureError::Postgres {
            context: "check snapshot filter",
            source: e,
        })
        .map(|r| r.map_err(|why| format!("the filter does not work: {why}"))),
        Some(code) => Ok(Err(format!(
            "the filter does not work: SQLSTATE {}",
            code.code()
        ))),
        None => Err(CaptureError::Postgres {
            context: "check snapshot filter",
            source: e,
        }),
    }
}

/// Prepares (never runs) a filter's probe with the search_path its chunks
/// run with, so a name the chunk could not resolve is refused here.
async fn prepare_filter_probe(
    control: &Client,
    probe: &str,
) -> Result<Result<tokio_postgres::Statement, tokio_postgres::Error>, CaptureError> {
    control
        .batch_execute(&format!(
            "BEGIN READ ONLY; SET LOCAL search_path = {FILTER_SEARCH_PATH}"
        ))
        .await
        .map_err(CaptureError::pg("check snapshot filter"))?;
    let prepared = control.prepare(probe).await;
    control
        .batch_execute("ROLLBACK")
        .await
        .map_err(CaptureError::pg("check snapshot filter"))?;
    Ok(prepared)
}

/// How often a signal's table that does not exist is looked up again, and
/// how long apart (see `check_snapshot_table`).
const TABLE_LOOKS: u32 = 10;
const TABLE_LOOK_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

fn undefined_table(e: &CaptureError) -> bool {
    matches!(e, CaptureError::Postgres { source, .. }
        if source.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE))
}

/// A server's answer (no such table, syntax error) becomes a reason; a lost
/// connection stays an error.
fn definite(e: CaptureError) -> Result<Result<(), String>, CaptureError> {
    match &e {
        CaptureError::Postgres { source, .. } if source.code().is_some() => Ok(Err(source
            .as_db_error()
            .map_or_else(|| source.to_string(), |d| d.message().to_string()))),
        _ => Err(e),
    }
}
