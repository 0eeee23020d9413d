//! The stream loop's side of a chunked snapshot: launching a chunk, noting
//! the keys the stream changes while it is in flight, and publishing the
//! surviving rows at its high watermark (see `crate::snapshot`).

use std::borrow::Cow;
use std::sync::Arc;

use super::snapshot_runtime::{join, InFlight, CHUNKS_IN_FLIGHT};
use super::{now_ms, refusable, Pipeline, Record};
use crate::envelope::{Op, SnapshotMarker, SourcePosition, TableEncoder};
use crate::error::CaptureError;
use crate::snapshot::window::{Verdict, Window};
use crate::snapshot::{
    new_chunk_id, parse_watermark, row_key, split_table, SnapshotKind, Watermark,
};
use crate::sources::postgres::chunk::{self, ChunkError, ChunkRequest, ChunkRows};
use crate::sources::postgres::control::format_lsn;
use crate::sources::postgres::pgoutput::{LogicalMessage, OldTuple, Relation};

impl Pipeline<'_> {
    /// Whether a chunk is being read (of the snapshot's current table).
    pub(super) fn snap_in_flight(&self) -> bool {
        !self.snap.inflight.is_empty()
    }

    /// True when no snapshot runs and no chunk is in flight.
    pub(super) fn snapshot_finished(&self) -> bool {
        self.kafka.position().snapshot.is_none()
            && self.snap.inflight.is_empty()
            && !self.snap.reading()
            && !self.tracker.in_tx()
    }

    /// Starts reading the next chunk when a snapshot runs, is not paused,
    /// the connection is free and fewer than [`CHUNKS_IN_FLIGHT`] chunks are
    /// in flight: the first chunk after the table's progress, or the one
    /// after the newest chunk read (read ahead, before that one is
    /// published).
    pub(super) async fn launch_chunk(&mut self) -> Result<(), CaptureError> {
        if self.snap.inflight.len() >= CHUNKS_IN_FLIGHT || self.snap.reading() {
            return Ok(());
        }
        let Some(progress) = self.kafka.position().snapshot.as_ref() else {
            return Ok(());
        };
        if progress.paused {
            return Ok(());
        }
        let Some(current) = progress.current().cloned() else {
            self.kafka.stage().snapshot = None;
            self.publish_view();
            return Ok(());
        };
        // Queued while set aside (a signal, a schema-change backfill): its
        // rows wait for the snapshot its release queues.
        if self.is_quarantined(&current.table) {
            self.drop_snapshot_of(&current.table);
            return Ok(());
        }
        // Read ahead only in the same table, after a chunk that read well
        // and says more rows follow; it starts where that one ended.
        let after = match self.snap.inflight.back() {
            None => current.last_key.clone(),
            Some(newest) => match &newest.read {
                Some(Ok(rows))
                    if rows.more
                        && newest.table == current.table
                        && newest.snapshot_id == progress.id =>
                {
                    Some(last_key(rows))
                }
                _ => return Ok(()),
            },
        };
        let snapshot_id = progress.id.clone();
        let Some((schema, table)) = split_table(&current.table) else {
            self.skip_table(&current.table, "is not a schema.table name");
            return Ok(());
        };
        // A filter stored by an older version (a snapshot in progress
        // across an upgrade) was never held to the current rules.
        if let Some(Err(reason)) = current
            .filter
            .as_deref()
            .map(|f| crate::snapshot::signal::check_filter_on(f, schema, table))
        {
            self.skip_table(&current.table, &reason);
            return Ok(());
        }
        let Some(key_columns) = self.router.key_columns(&current.table).cloned() else {
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
            after,
            filter: current.filter.clone(),
            size: self.snap.chunk_size,
        };
        let id = req.id.clone();
        let task = tokio::spawn(async move { chunk::read_chunk(&conn, &req).await });
        self.snap.inflight.push_back(InFlight {
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

    /// The newest chunk's read finished (before its high watermark reaches
    /// us); `None`: an abandoned read ended.
    pub(super) async fn on_chunk_read(
        &mut self,
        read: Option<Result<ChunkRows, ChunkError>>,
    ) -> Result<(), CaptureError> {
        let Some(read) = read else {
            return Ok(());
        };
        match read {
            Ok(rows) => {
                if let Some(c) = self.snap.inflight.back_mut() {
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
                let table = self.snap.inflight.back().map(|c| c.table.clone());
                if let Some(table) = table {
                    self.skip_table(&table, &reason);
                }
                Ok(())
            }
            Err(ChunkError::Capture(e)) => Err(e),
        }
    }

    /// Notes what this change does to keys of the in-flight chunks' table.
    pub(super) fn mark_chunk_dirty(&mut self, change: &LogicalMessage) {
        for i in 0..self.snap.inflight.len() {
            self.mark_dirty(i, change);
        }
    }

    fn mark_dirty(&mut self, chunk: usize, change: &LogicalMessage) {
        let Some(chunk) = self.snap.inflight.get_mut(chunk) else {
            return;
        };
        let relation_of = |id: u32| {
            self.router
                .relation(id)
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
        // High watermarks arrive in the order the chunks were read.
        let ours = self.snap.inflight.front().is_some_and(|c| c.id == id);
        if !ours || side != Watermark::High {
            // A low watermark, or one of an abandoned chunk or of a chunk a
            // previous process read.
            return Ok(());
        }
        let Some(mut chunk) = self.snap.inflight.pop_front() else {
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
            self.snap.abandon();
            return Ok(());
        }
        if chunk.window.must_read_again() {
            // The stream changed more of the table while the chunk was in
            // flight than its window holds (WINDOW_MAX_BYTES): which rows
            // it changed is no longer known, so nothing is published and
            // the chunk is read again. Repeated, it says the chunk takes
            // too long for the table's write rate: a smaller
            // incremental.snapshot.chunk.size reads faster.
            tracing::warn!(
                table = %chunk.table,
                limit_bytes = crate::snapshot::window::WINDOW_MAX_BYTES,
                "snapshot chunk read again: the stream changed more of the table while it was read than the window holds"
            );
            self.snap.abandon();
            return Ok(());
        }
        let wanted = self.kafka.position().snapshot.as_ref().is_some_and(|p| {
            !p.paused
                && p.id == chunk.snapshot_id
                && p.current().is_some_and(|t| t.table == chunk.table)
        });
        if !wanted {
            // Stopped or paused by a signal while in flight: read again
            // when resumed (a stopped snapshot's chunks never are).
            self.snap.abandon();
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
        let (kind, last_table) = match self.kafka.position().snapshot.as_ref() {
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
        // A filtered pass reads some rows only: the others are not newer.
        let whole = self
            .kafka
            .position()
            .snapshot
            .as_ref()
            .and_then(|p| p.current())
            .is_some_and(|t| t.table == chunk.table && t.filter.is_none());
        if !rows.more && whole {
            // The table's last chunk: a table back from quarantine drops
            // the rows deleted meanwhile, in this same transaction.
            let stale = self
                .stale_rows_removal(&chunk.table, &encoder, &topic, src)
                .await?;
            records.extend(stale);
        }
        self.publish(records).await?;

        let last_key = (!rows.rows.is_empty()).then(|| last_key(&rows));
        self.count_chunk(&chunk.table, &rows, dropped);
        self.advance_snapshot(chunk, &rows, last_key, src);
        Ok(())
    }

    /// The snapshot metrics of one published chunk.
    fn count_chunk(&self, table: &str, rows: &ChunkRows, dropped: usize) {
        let table_label = [table];
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
    }

    /// A chunk published: the running snapshot's progress moves past it (to
    /// the next table after its last chunk; none after the last table).
    fn advance_snapshot(
        &mut self,
        chunk: &InFlight,
        rows: &ChunkRows,
        last_key: Option<Vec<Option<String>>>,
        src: &SourcePosition,
    ) {
        let table_done = !rows.more;
        let Some(progress) = self.kafka.stage().snapshot.as_mut() else {
            return;
        };
        let Some(current) = progress.tables.first_mut() else {
            return;
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
                self.kafka.stage().snapshot = None;
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
        // A chunk's Relation is read from the catalog as it is now.
        let identity = self
            .schema
            .source_identity(&self.control, &qualified, rel, None)
            .await?;
        let enc = TableEncoder::identified(
            rel,
            self.router.types(),
            Some(key_columns),
            self.router.envelope(),
            identity.as_ref(),
        )
        .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        let topic: Arc<str> = enc.topic().into();
        self.kafka.ensure_topic(&topic).await?;
        self.snap.encoder = Some((rel.clone(), enc.clone(), Arc::clone(&topic)));
        Ok((enc, topic))
    }

    /// Leaves a table that cannot be snapshotted, saying why, and goes on.
    pub(super) fn skip_table(&mut self, table: &str, reason: &str) {
        tracing::error!(table, reason, "snapshot of this table skipped");
        self.snap.abandon_table(table);
        if let Some(p) = self.kafka.stage().snapshot.as_mut() {
            p.tables.retain(|t| t.table != table);
            if p.tables.is_empty() {
                self.kafka.stage().snapshot = None;
            }
        }
        self.publish_view();
    }
}

/// The key of a chunk's last row, in text form, as progress stores it and
/// the next chunk starts after it (`None` per non-text value).
fn last_key(rows: &ChunkRows) -> Vec<Option<String>> {
    let Some(row) = rows.rows.last() else {
        return Vec::new();
    };
    rows.key_idx
        .iter()
        .map(|&i| match &row.0[i] {
            crate::sources::postgres::pgoutput::TupleValue::Text(b) => {
                Some(String::from_utf8_lossy(b).into_owned())
            }
            _ => None,
        })
        .collect()
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
    new: &'a crate::sources::postgres::pgoutput::TupleData,
    old: Option<&OldTuple>,
) -> Cow<'a, crate::sources::postgres::pgoutput::TupleData> {
    match old {
        Some(OldTuple::Full(full)) => match super::router::fill_unchanged_toast(new, full) {
            Some(row) => Cow::Owned(row),
            None => Cow::Borrowed(new),
        },
        _ => Cow::Borrowed(new),
    }
}
