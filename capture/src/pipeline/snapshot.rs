//! The stream loop's side of a chunked snapshot: launching a chunk, noting
//! the keys the stream changes while it is in flight, and publishing the
//! surviving rows at its high watermark (see `crate::snapshot`).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::{now_ms, refusable, Pipeline, Record};
use crate::envelope::{Op, SnapshotMarker, SourcePosition, TableEncoder};
use crate::error::CaptureError;
use crate::metrics::SnapshotView;
use crate::pgoutput::{LogicalMessage, OldTuple, Relation};
use crate::snapshot::chunk::{self, ChunkError, ChunkRequest, ChunkRows};
use crate::snapshot::window::{Verdict, Window};
use crate::snapshot::{
    new_chunk_id, parse_watermark, row_key, split_table, SnapshotKind, Watermark,
};
use crate::source::format_lsn;

/// How often progress is logged at most (and always when a table is done).
const PROGRESS_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// Transactions the stream carried that are remembered, newest first, to
/// tell whether a chunk's SELECT missed one of them.
const STREAMED_XIDS: usize = 65_536;

/// The chunk being read and what it needs.
pub(super) struct SnapshotRuntime {
    chunk_size: usize,
    /// Opened on the first chunk; SELECTs never wait behind control queries.
    conn: Option<Arc<Client>>,
    chunks_started: u64,
    inflight: Option<InFlight>,
    /// Encoder of the last chunk's table shape, reused while it holds.
    encoder: Option<(Relation, TableEncoder, Arc<str>)>,
    /// Rows and time at the last progress log line, for the rate.
    last_log: Option<(Instant, u64)>,
    /// The transactions the stream carried lately, by xid, with their
    /// ordinal (`streamed`); at most [`STREAMED_XIDS`] of them.
    recent: HashMap<u32, u64>,
    recent_order: VecDeque<u32>,
    /// Transactions the stream began so far.
    streamed: u64,
}

struct InFlight {
    id: String,
    snapshot_id: String,
    table: String,
    key_columns: Vec<String>,
    /// What the stream did to the table's keys since launch.
    window: Window,
    /// Transactions the stream had begun at launch (`SnapshotRuntime::streamed`).
    launched: u64,
    task: Option<JoinHandle<Result<ChunkRows, ChunkError>>>,
    read: Option<Result<ChunkRows, ChunkError>>,
}

impl SnapshotRuntime {
    pub(super) fn new(chunk_size: usize) -> Self {
        SnapshotRuntime {
            chunk_size,
            conn: None,
            chunks_started: 0,
            inflight: None,
            encoder: None,
            last_log: None,
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            streamed: 0,
        }
    }

    /// The stream began transaction `xid`.
    pub(super) fn note_begin(&mut self, xid: u32) {
        self.streamed += 1;
        self.recent.insert(xid, self.streamed);
        self.recent_order.push_back(xid);
        while self.recent_order.len() > STREAMED_XIDS {
            if let Some(old) = self.recent_order.pop_front() {
                if self
                    .recent
                    .get(&old)
                    .is_some_and(|n| self.streamed - n >= STREAMED_XIDS as u64)
                {
                    self.recent.remove(&old);
                }
            }
        }
    }

    /// Whether the stream began one of `xids` before ordinal `launched`
    /// (transactions it had carried, fully or partly, when a chunk launched).
    fn began_before(&self, xids: &[u32], launched: u64) -> Option<u32> {
        xids.iter()
            .copied()
            .find(|x| self.recent.get(x).is_some_and(|n| *n <= launched))
    }
}

impl Drop for SnapshotRuntime {
    /// A pipeline that stops (shutdown, error) abandons its chunk: the next
    /// life reads it again, so its task has nothing left to do.
    fn drop(&mut self) {
        if let Some(task) = self.inflight.as_ref().and_then(|c| c.task.as_ref()) {
            task.abort();
        }
    }
}

/// Completes when the in-flight chunk's read task ends; never without one.
pub(super) async fn chunk_read(snap: &mut SnapshotRuntime) -> Result<ChunkRows, ChunkError> {
    match snap.inflight.as_mut().and_then(|c| c.task.as_mut()) {
        Some(task) => {
            let result = join(task).await;
            if let Some(c) = snap.inflight.as_mut() {
                c.task = None;
            }
            result
        }
        None => std::future::pending().await,
    }
}

async fn join(
    task: &mut JoinHandle<Result<ChunkRows, ChunkError>>,
) -> Result<ChunkRows, ChunkError> {
    task.await.unwrap_or_else(|e| {
        Err(ChunkError::Capture(CaptureError::Protocol(format!(
            "snapshot chunk task failed: {e}"
        ))))
    })
}

impl Pipeline<'_> {
    /// Whether a chunk is being read (of the snapshot's current table).
    pub(super) fn snap_in_flight(&self) -> bool {
        self.snap.inflight.is_some()
    }

    /// True when no snapshot runs and no chunk is in flight.
    pub(super) fn snapshot_finished(&self) -> bool {
        self.kafka.pending.snapshot.is_none()
            && self.snap.inflight.is_none()
            && !self.tracker.in_tx()
    }

    /// Starts reading the next chunk when a snapshot runs, is not paused and
    /// no chunk is in flight.
    pub(super) async fn launch_chunk(&mut self) -> Result<(), CaptureError> {
        if self.snap.inflight.is_some() {
            return Ok(());
        }
        let Some(progress) = self.kafka.pending.snapshot.as_ref() else {
            return Ok(());
        };
        if progress.paused {
            return Ok(());
        }
        let Some(current) = progress.current().cloned() else {
            self.kafka.pending.snapshot = None;
            self.publish_view();
            return Ok(());
        };
        let snapshot_id = progress.id.clone();
        let Some((schema, table)) = split_table(&current.table) else {
            self.skip_table(&current.table, "is not a schema.table name");
            return Ok(());
        };
        let Some(key_columns) = self.key_columns.get(&current.table).cloned() else {
            let reason = "has no primary key and no key columns in message.key.columns, so it cannot be read in key order: add a primary key or configure message.key.columns for it";
            self.skip_table(&current.table, reason);
            return Ok(());
        };
        let conn = match &self.snap.conn {
            Some(c) => Arc::clone(c),
            None => {
                let c = Arc::new(chunk::connect(self.cfg).await?);
                self.snap.conn = Some(Arc::clone(&c));
                c
            }
        };
        self.snap.chunks_started += 1;
        let req = ChunkRequest {
            id: new_chunk_id(self.snap.chunks_started),
            schema: schema.to_string(),
            table: table.to_string(),
            key_columns: key_columns.clone(),
            after: current.last_key.clone(),
            filter: current.filter.clone(),
            size: self.snap.chunk_size,
        };
        let id = req.id.clone();
        let task = tokio::spawn(async move { chunk::read_chunk(&conn, &req).await });
        self.snap.inflight = Some(InFlight {
            id,
            snapshot_id,
            table: current.table.clone(),
            key_columns,
            window: Window::default(),
            launched: self.snap.streamed,
            task: Some(task),
            read: None,
        });
        Ok(())
    }

    /// The chunk's read finished (before its high watermark reaches us).
    pub(super) async fn on_chunk_read(
        &mut self,
        read: Result<ChunkRows, ChunkError>,
    ) -> Result<(), CaptureError> {
        match read {
            Ok(rows) => {
                if let Some(c) = self.snap.inflight.as_mut() {
                    c.window.chunk_read(
                        rows.rows
                            .iter()
                            .filter_map(|row| row_key(row, &rows.key_idx)),
                    );
                    c.read = Some(Ok(rows));
                }
                Ok(())
            }
            Err(ChunkError::Table(reason)) => {
                let table = self.snap.inflight.take().map(|c| c.table);
                if let Some(table) = table {
                    self.skip_table(&table, &reason);
                }
                Ok(())
            }
            Err(ChunkError::Capture(e)) => Err(e),
        }
    }

    /// Notes what this change does to keys of the in-flight chunk's table.
    pub(super) fn mark_chunk_dirty(&mut self, change: &LogicalMessage) {
        let Some(chunk) = self.snap.inflight.as_mut() else {
            return;
        };
        let relation_of = |id: u32| {
            self.relations
                .get(id)
                .filter(|r| format!("{}.{}", r.namespace, r.name) == chunk.table)
        };
        let key_columns = &chunk.key_columns;
        let key_idx = |rel: &Relation| -> Option<Vec<usize>> {
            key_columns
                .iter()
                .map(|k| rel.columns.iter().position(|c| &c.name == k))
                .collect()
        };
        let window = &mut chunk.window;
        match change {
            LogicalMessage::Insert { relation_id, new } => {
                if let Some(rel) = relation_of(*relation_id) {
                    replaced(window, key_idx(rel).and_then(|idx| row_key(new, &idx)));
                }
            }
            LogicalMessage::Delete { relation_id, old } => {
                if let Some(rel) = relation_of(*relation_id) {
                    replaced(
                        window,
                        key_idx(rel).and_then(|idx| row_key(old.tuple(), &idx)),
                    );
                }
            }
            LogicalMessage::Update {
                relation_id,
                old,
                new,
            } => {
                let Some(rel) = relation_of(*relation_id) else {
                    return;
                };
                let Some(idx) = key_idx(rel) else {
                    return window.all_changed();
                };
                let new_key = row_key(new, &idx);
                let old_key = old.as_ref().map(|o| row_key(o.tuple(), &idx));
                match (new_key, old_key) {
                    (Some(key), None) => window.updated(key, rel, &filled(new, old.as_ref())),
                    (Some(key), Some(Some(old_key))) if old_key == key => {
                        window.updated(key, rel, &filled(new, old.as_ref()))
                    }
                    // A primary-key change: a row left one key and came to another.
                    (Some(key), Some(Some(old_key))) => {
                        window.replaced(key);
                        window.replaced(old_key);
                    }
                    (None, _) | (_, Some(None)) => window.all_changed(),
                }
            }
            LogicalMessage::Truncate { relation_ids, .. }
                if relation_ids.iter().any(|id| relation_of(*id).is_some()) =>
            {
                window.all_changed();
            }
            _ => {}
        }
    }

    /// A watermark in the stream: the in-flight chunk's high watermark
    /// publishes its surviving rows at `src` (its commit LSN and time).
    pub(super) async fn on_watermark(
        &mut self,
        content: &[u8],
        src: &SourcePosition,
    ) -> Result<(), CaptureError> {
        let Some((id, side)) = parse_watermark(content) else {
            return Ok(());
        };
        let ours = self.snap.inflight.as_ref().is_some_and(|c| c.id == id);
        if !ours || side != Watermark::High {
            // A low watermark, or one of a chunk a previous process read.
            return Ok(());
        }
        let Some(mut chunk) = self.snap.inflight.take() else {
            return Ok(());
        };
        let read = match (chunk.read.take(), chunk.task.take()) {
            (Some(read), _) => read,
            // The high watermark committed, so the task is just returning.
            (None, Some(mut task)) => join(&mut task).await,
            (None, None) => {
                return Err(CaptureError::Protocol(
                    "snapshot chunk finished without rows".into(),
                ))
            }
        };
        let rows = match read {
            Ok(rows) => rows,
            Err(ChunkError::Table(reason)) => {
                self.skip_table(&chunk.table, &reason);
                return Ok(());
            }
            Err(ChunkError::Capture(e)) => return Err(e),
        };
        if let Some(xid) = self.snap.began_before(&rows.invisible, chunk.launched) {
            // The stream carried this transaction before the chunk was
            // launched, so the window did not note its changes, yet the
            // SELECT did not see it: its commit was in the WAL but not yet
            // visible. Nothing of the chunk is published; it is read again.
            tracing::debug!(table = %chunk.table, xid, "snapshot chunk read again: its SELECT missed a transaction the stream had carried");
            return Ok(());
        }
        let wanted = self.kafka.pending.snapshot.as_ref().is_some_and(|p| {
            p.id == chunk.snapshot_id && p.current().is_some_and(|t| t.table == chunk.table)
        });
        if !wanted {
            // Stopped by a signal while in flight.
            return Ok(());
        }
        self.publish_chunk(&chunk, rows, src).await
    }

    async fn publish_chunk(
        &mut self,
        chunk: &InFlight,
        rows: ChunkRows,
        src: &SourcePosition,
    ) -> Result<(), CaptureError> {
        let (kind, last_table) = match self.kafka.pending.snapshot.as_ref() {
            Some(p) => (p.kind, p.tables.len() == 1),
            None => return Ok(()),
        };
        let (encoder, topic) = self
            .chunk_encoder(&rows.relation, &chunk.key_columns)
            .await?;
        // Rows the stream did not touch as read; rows it updated in place
        // leaving columns out, completed from its updates (`Window`).
        let verdicts: Vec<Verdict> = rows
            .rows
            .iter()
            .map(|row| {
                let key = row_key(row, &rows.key_idx);
                chunk.window.verdict(&rows.relation, row, key.as_ref())
            })
            .collect();
        let completed = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Complete(_)))
            .count();
        let survivors: Vec<_> = verdicts
            .iter()
            .zip(&rows.rows)
            .filter_map(|(verdict, row)| verdict.row(row))
            .collect();
        let dropped = rows.rows.len() - survivors.len();
        let now = now_ms();
        let mut records = Vec::with_capacity(survivors.len());
        for (i, row) in survivors.iter().enumerate() {
            let marker = match kind {
                SnapshotKind::Incremental => SnapshotMarker::Incremental,
                SnapshotKind::Initial if last_table && !rows.more && i + 1 == survivors.len() => {
                    SnapshotMarker::Last
                }
                SnapshotKind::Initial => SnapshotMarker::True,
            };
            // Every row takes the high watermark's commit LSN as its version
            // (a completed row is the row as of the high watermark); the
            // ordinal keeps (commit_lsn, event_seq) unique.
            let pos = SourcePosition {
                tx_id: src.tx_id,
                lsn: src.commit_lsn,
                commit_lsn: src.commit_lsn,
                event_seq: i as u64 + 1,
                commit_ts_ms: src.commit_ts_ms,
                snapshot: marker,
            };
            // A row holding a value its field cannot carry is refused (logged,
            // counted) like a streamed change; the rest of the chunk goes.
            let encoded = encoder.key(row).and_then(|key| {
                let value = encoder.value(Op::Read, None, Some(row), &pos, now)?;
                Ok((key, value))
            });
            let (key, value) = match encoded.map_err(refusable(1)) {
                Ok(kv) => kv,
                Err(CaptureError::ValueRefused(refused)) => {
                    self.refuse_value(&refused);
                    continue;
                }
                Err(e) => return Err(e),
            };
            records.push(Record::change(&topic, key, value, &pos));
        }
        tracing::debug!(
            table = %chunk.table,
            rows = rows.rows.len(),
            dropped,
            completed,
            high_watermark = %format_lsn(src.commit_lsn),
            "snapshot chunk published"
        );
        self.publish(records).await?;

        let last_key = rows.rows.last().map(|row| {
            rows.key_idx
                .iter()
                .map(|&i| match &row.0[i] {
                    crate::pgoutput::TupleValue::Text(b) => {
                        Some(String::from_utf8_lossy(b).into_owned())
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        });
        let table_label = [chunk.table.as_str()];
        self.metrics
            .snapshot_rows
            .with_label_values(&table_label)
            .inc_by(rows.rows.len() as u64);
        self.metrics
            .snapshot_rows_dropped
            .with_label_values(&table_label)
            .inc_by(dropped as u64);
        if let Some(estimate) = rows.estimate {
            self.metrics
                .snapshot_rows_estimated
                .with_label_values(&table_label)
                .set(estimate as i64);
        }
        self.metrics.snapshot_chunks.inc();
        let table_done = !rows.more;
        let Some(progress) = self.kafka.pending.snapshot.as_mut() else {
            return Ok(());
        };
        let Some(current) = progress.tables.first_mut() else {
            return Ok(());
        };
        current.rows += rows.rows.len() as u64;
        current.chunks += 1;
        if last_key.is_some() {
            current.last_key = last_key;
        }
        let done_rows = current.rows;
        if table_done {
            progress.tables.remove(0);
            if progress.tables.is_empty() {
                tracing::info!(snapshot = %progress.id, "snapshot complete");
                self.kafka.pending.snapshot = None;
            }
        }
        self.log_progress(
            &chunk.table,
            done_rows,
            rows.estimate,
            table_done,
            src.commit_lsn,
        );
        if table_done {
            self.snap.last_log = None;
        }
        // The next table's estimate comes with its first chunk.
        self.publish_view_with(rows.estimate.filter(|_| !table_done));
        Ok(())
    }

    /// The encoder of a chunk's table shape (built once per shape).
    async fn chunk_encoder(
        &mut self,
        rel: &Relation,
        key_columns: &[String],
    ) -> Result<(TableEncoder, Arc<str>), CaptureError> {
        if let Some((cached, enc, topic)) = &self.snap.encoder {
            if cached == rel {
                return Ok((enc.clone(), Arc::clone(topic)));
            }
        }
        let qualified = format!("{}.{}", rel.namespace, rel.name);
        let identity = self.source_identity(&qualified, rel).await?;
        let enc = TableEncoder::identified(
            rel,
            &self.types,
            Some(key_columns),
            &self.envelope,
            identity.as_ref(),
        )
        .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        let topic: Arc<str> = enc.topic().into();
        self.kafka.tx.topics.ensure(&topic).await?;
        self.snap.encoder = Some((rel.clone(), enc.clone(), Arc::clone(&topic)));
        Ok((enc, topic))
    }

    /// Leaves a table that cannot be snapshotted, saying why, and goes on.
    pub(super) fn skip_table(&mut self, table: &str, reason: &str) {
        tracing::error!(table, reason, "snapshot of this table skipped");
        if let Some(p) = self.kafka.pending.snapshot.as_mut() {
            p.tables.retain(|t| t.table != table);
            if p.tables.is_empty() {
                self.kafka.pending.snapshot = None;
            }
        }
        self.publish_view();
    }

    fn log_progress(
        &mut self,
        table: &str,
        rows: u64,
        estimate: Option<u64>,
        table_done: bool,
        lsn: u64,
    ) {
        let now = Instant::now();
        let (since, rows_then) = *self.snap.last_log.get_or_insert((now, 0));
        let elapsed = now.duration_since(since);
        if !table_done && elapsed < PROGRESS_LOG_INTERVAL {
            return;
        }
        let rate = if elapsed.as_secs_f64() > 0.0 {
            (rows.saturating_sub(rows_then)) as f64 / elapsed.as_secs_f64()
        } else {
            0.0
        };
        let percent = estimate
            .filter(|e| *e > 0)
            .map(|e| (rows as f64 * 100.0 / e as f64).min(100.0));
        tracing::info!(
            table,
            rows,
            estimated_rows = estimate,
            percent = percent.map(|p| format!("{p:.1}")),
            rows_per_s = rate.round() as u64,
            high_watermark = %format_lsn(lsn),
            done = table_done,
            "snapshot progress"
        );
        self.snap.last_log = Some((now, rows));
    }

    pub(super) fn publish_view(&self) {
        self.publish_view_with(None);
    }

    /// Updates what progress displays and the gauges show.
    fn publish_view_with(&self, estimate: Option<u64>) {
        let view = self.kafka.pending.snapshot.as_ref().and_then(|p| {
            p.current().map(|t| SnapshotView {
                table: t.table.clone(),
                rows: t.rows,
                estimate,
                tables_after: p.tables.len() - 1,
                paused: p.paused,
            })
        });
        let running = self.kafka.pending.snapshot.is_some();
        let paused = self
            .kafka
            .pending
            .snapshot
            .as_ref()
            .is_some_and(|p| p.paused);
        self.metrics.snapshot_running.set(i64::from(running));
        self.metrics.snapshot_paused.set(i64::from(paused));
        if let Ok(mut slot) = self.metrics.snapshot_view.lock() {
            // A new table's estimate arrives with its first chunk; keep the
            // one known for the same table meanwhile.
            let keep = slot
                .as_ref()
                .zip(view.as_ref())
                .filter(|(old, new)| old.table == new.table && new.estimate.is_none())
                .and_then(|(old, _)| old.estimate);
            *slot = view.map(|mut v| {
                v.estimate = v.estimate.or(keep);
                v
            });
        }
    }
}

/// An insert or delete of `key`; a key we cannot read may be any key.
fn replaced(window: &mut Window, key: Option<crate::snapshot::RowKey>) {
    match key {
        Some(k) => window.replaced(k),
        None => window.all_changed(),
    }
}

/// An update's new row, with unchanged TOAST values taken from a full old
/// row (REPLICA IDENTITY FULL) where it has them.
fn filled<'a>(
    new: &'a crate::pgoutput::TupleData,
    old: Option<&OldTuple>,
) -> Cow<'a, crate::pgoutput::TupleData> {
    match old {
        Some(OldTuple::Full(full)) => match super::router::fill_unchanged_toast(new, full) {
            Some(row) => Cow::Owned(row),
            None => Cow::Borrowed(new),
        },
        _ => Cow::Borrowed(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_begun_before_a_launch_are_told_from_later_ones() {
        let mut snap = SnapshotRuntime::new(10);
        snap.note_begin(100);
        snap.note_begin(101);
        let launched = snap.streamed;
        snap.note_begin(102);
        assert_eq!(snap.began_before(&[7, 101], launched), Some(101));
        // Begun after the launch: the window notes its changes.
        assert_eq!(snap.began_before(&[102, 103], launched), None);
        // Only the newest STREAMED_XIDS are remembered.
        for x in 0..STREAMED_XIDS as u32 + 10 {
            snap.note_begin(1_000 + x);
        }
        assert_eq!(snap.recent.len(), STREAMED_XIDS);
        assert_eq!(snap.began_before(&[100], snap.streamed), None);
        assert_eq!(snap.began_before(&[1_020], snap.streamed), Some(1_020));
    }
}
