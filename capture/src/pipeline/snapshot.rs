//! The snapshot driver's work (see `snapshot_runtime` for its state and
//! `crate::snapshot` for the rules): launching a chunk, noting the keys the
//! stream changes while it is in flight, and publishing the surviving rows
//! at its high watermark. The committer whose staged position holds the
//! snapshot's plan, the source's chunk reads and the encoder of a chunk's
//! table are handed in.

use std::borrow::Cow;
use std::sync::Arc;

use super::committer::{Committer, Transactions};
use super::snapshot_runtime::{
    join, CachedEncoder, ChunkReads, InFlight, SnapshotDriver, CHUNKS_IN_FLIGHT,
};
use super::{now_ms, refusable, refuse_value, Pipeline, Record};
use crate::change::{Datum, OldRow, RowChange, RowImage, StreamTable};
use crate::envelope::{Op, SnapshotMarker, SourceIdentity, SourcePosition, TableEncoder};
use crate::error::CaptureError;
use crate::offset::SourceOffset;
use crate::seam::{ChunkError, ChunkRequest, ChunkRows, RoutedTable, Source};
use crate::snapshot::window::{Verdict, Window};
use crate::snapshot::{
    new_chunk_id, parse_watermark, row_key, split_table, SnapshotKind, TableProgress, Watermark,
};
use oncely_core::wire::format_lsn;

/// A chunk whose high watermark came, read whole and wanted: its rows are
/// published next.
pub(super) struct ReadyChunk<R> {
    pub(super) chunk: InFlight<R>,
    pub(super) rows: ChunkRows<R>,
}

/// What publishing a chunk takes from outside the driver: the encoder of
/// its table's shape and the topic it writes, and the topic's partitions
/// when the chunk ends a table released from quarantine
/// ([`SnapshotDriver::removes_stale`]).
pub(super) struct ChunkEncoding {
    pub(super) encoder: TableEncoder,
    pub(super) topic: Arc<str>,
    pub(super) partitions: Option<i32>,
}

/// The records of one chunk's surviving rows, and what was left out.
struct ChunkRecords {
    records: Vec<Record>,
    dropped: usize,
    completed: usize,
}

impl<R: StreamTable + Clone + PartialEq> SnapshotDriver<R> {
    /// Whether a chunk is being read (of the snapshot's current table).
    pub(super) fn in_flight(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// True when no snapshot runs (in the committer's `position`) and no
    /// chunk is in flight or reading.
    pub(super) fn finished(&self, position: &SourceOffset) -> bool {
        position.snapshot.is_none() && self.inflight.is_empty() && !self.reading()
    }

    /// Starts reading the next chunk when a snapshot runs, is not paused,
    /// the connection is free and fewer than [`CHUNKS_IN_FLIGHT`] chunks are
    /// in flight: the first chunk after the table's progress, or the one
    /// after the newest chunk read (read ahead, before that one is
    /// published). `key_columns` names a table's key columns.
    pub(super) async fn launch<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        key_columns: impl Fn(&str) -> Option<Vec<String>>,
        reads: &mut impl ChunkReads<Table = R>,
    ) -> Result<(), CaptureError> {
        let Some((req, snapshot_id, table)) = self.next_request(kafka, key_columns) else {
            return Ok(());
        };
        let task = reads.start(req.clone()).await?;
        self.inflight.push_back(InFlight {
            id: req.id,
            snapshot_id,
            table,
            key_columns: req.key_columns,
            window: Window::default(),
            launched: self.streamed,
            task: Some(task),
            read: None,
        });
        Ok(())
    }

    /// The next chunk to read, with its snapshot's id and its table, if one
    /// can be read now ([`SnapshotDriver::launch`]).
    fn next_request<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        key_columns: impl Fn(&str) -> Option<Vec<String>>,
    ) -> Option<(ChunkRequest, String, String)> {
        if self.inflight.len() >= CHUNKS_IN_FLIGHT || self.reading() {
            return None;
        }
        let progress = kafka.position().snapshot.as_ref()?;
        if progress.paused {
            return None;
        }
        let snapshot_id = progress.id.clone();
        let Some(current) = progress.current().cloned() else {
            kafka.stage().snapshot = None;
            self.publish_view(kafka.position());
            return None;
        };
        // Queued while set aside (a signal, a schema-change backfill): its
        // rows wait for the snapshot its release queues.
        if kafka.position().quarantined.contains_key(&current.table) {
            self.drop_snapshot_of(kafka, &current.table);
            return None;
        }
        let after = self.read_after(&current, &snapshot_id)?;
        let (schema, table, key_columns) = self.readable(kafka, &current, key_columns)?;
        self.chunks_started += 1;
        let req = ChunkRequest {
            id: new_chunk_id(self.chunks_started),
            schema,
            table,
            key_columns,
            after,
            filter: self.chunk_filter(&current.table, current.filter.as_deref()),
            size: self.chunk_size,
        };
        Some((req, snapshot_id, current.table))
    }

    /// Where the next chunk of `current` starts: after its progress, or
    /// after the newest chunk in flight when that one read well in the same
    /// table and says more rows follow (read ahead); `None` when no chunk
    /// can start now.
    fn read_after(
        &self,
        current: &TableProgress,
        snapshot_id: &str,
    ) -> Option<Option<Vec<Option<String>>>> {
        let Some(newest) = self.inflight.back() else {
            return Some(current.last_key.clone());
        };
        match &newest.read {
            Some(Ok(rows))
                if rows.more
                    && newest.table == current.table
                    && newest.snapshot_id == snapshot_id =>
            {
                Some(Some(last_key(rows)))
            }
            _ => None,
        }
    }

    /// `current`'s schema, name and key columns when it can be read;
    /// otherwise it is skipped, saying why.
    fn readable<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        current: &TableProgress,
        key_columns: impl Fn(&str) -> Option<Vec<String>>,
    ) -> Option<(String, String, Vec<String>)> {
        let Some((schema, table)) = split_table(&current.table) else {
            self.skip_table(kafka, &current.table, "is not a schema.table name");
            return None;
        };
        // A filter stored by an older version (a snapshot in progress
        // across an upgrade) was never held to the current rules.
        if let Some(Err(reason)) = current
            .filter
            .as_deref()
            .map(|f| crate::snapshot::signal::check_filter_on(f, schema, table))
        {
            self.skip_table(kafka, &current.table, &reason);
            return None;
        }
        let Some(key_columns) = key_columns(&current.table) else {
            let reason = "has no primary key and no key columns in message.key.columns, so it cannot be read in key order: add a primary key or configure message.key.columns for it";
            self.skip_table(kafka, &current.table, reason);
            return None;
        };
        Some((schema.to_owned(), table.to_owned(), key_columns))
    }

    /// The newest chunk's read finished (before its high watermark reaches
    /// us); `None`: an abandoned read ended.
    pub(super) fn on_chunk_read<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        read: Option<Result<ChunkRows<R>, ChunkError>>,
    ) -> Result<(), CaptureError> {
        let Some(read) = read else {
            return Ok(());
        };
        match read {
            Ok(rows) => {
                if let Some(c) = self.inflight.back_mut() {
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
                let table = self.inflight.back().map(|c| c.table.clone());
                if let Some(table) = table {
                    self.skip_table(kafka, &table, &reason);
                }
                Ok(())
            }
            Err(ChunkError::Capture(e)) => Err(e),
        }
    }

    /// Notes what this change does to keys of the in-flight chunks' table;
    /// `relation_of` gives the stream's relation of an id.
    pub(super) fn mark_dirty<'r, Id: Copy>(
        &mut self,
        change: RowChange<'_, Id>,
        relation_of: impl Fn(Id) -> Option<&'r R>,
    ) where
        R: 'r,
    {
        for chunk in &mut self.inflight {
            mark_chunk_dirty(chunk, change, &relation_of);
        }
    }

    /// A watermark in the stream: the in-flight chunk's high watermark
    /// hands out its rows when they are to be published (read whole, the
    /// window intact, the snapshot still wanting them); otherwise the chunk
    /// is read again, skipped, or the watermark is not ours.
    pub(super) async fn take_ready<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        content: &[u8],
    ) -> Result<Option<ReadyChunk<R>>, CaptureError> {
        let Some((id, side)) = parse_watermark(content) else {
            return Ok(None);
        };
        // High watermarks arrive in the order the chunks were read.
        let ours = self.inflight.front().is_some_and(|c| c.id == id);
        if !ours || side != Watermark::High {
            // A low watermark, or one of an abandoned chunk or of a chunk a
            // previous process read.
            return Ok(None);
        }
        let Some(mut chunk) = self.inflight.pop_front() else {
            return Ok(None);
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
                self.skip_table(kafka, &chunk.table, &reason);
                return Ok(None);
            }
            Err(ChunkError::Capture(e)) => return Err(e),
        };
        if !self.publishable(&chunk, &rows, kafka.position()) {
            self.abandon();
            return Ok(None);
        }
        Ok(Some(ReadyChunk { chunk, rows }))
    }

    /// Whether a chunk read whole may be published at its high watermark;
    /// when not, it is read again (or, stopped, never).
    fn publishable(
        &self,
        chunk: &InFlight<R>,
        rows: &ChunkRows<R>,
        position: &SourceOffset,
    ) -> bool {
        if let Some(xid) = self.began_before(&rows.invisible, chunk.launched) {
            // The stream carried this transaction before the chunk was
            // launched, so the window did not note its changes, yet the
            // SELECT did not see it: its commit was in the WAL but not yet
            // visible. Nothing of the chunk is published; it is read again.
            tracing::debug!(table = %chunk.table, xid, "snapshot chunk read again: its SELECT missed a transaction the stream had carried");
            return false;
        }
        if rows.relation.shape_ahead_of_stream() {
            // DDL committed between the chunk's read view and its catalog
            // read: the stream is before it at the high watermark, so
            // its columns cannot be numbered there. Read again, after it;
            // at info, once per chunk, so repeated re-reads show.
            tracing::info!(table = %chunk.table, chunk = %chunk.id, "snapshot chunk read again: its columns were read past DDL the stream had not reached at its position");
            return false;
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
            return false;
        }
        // Stopped or paused by a signal while in flight: read again when
        // resumed (a stopped snapshot's chunks never are).
        position.snapshot.as_ref().is_some_and(|p| {
            !p.paused
                && p.id == chunk.snapshot_id
                && p.current().is_some_and(|t| t.table == chunk.table)
        })
    }

    /// Whether publishing `ready` ends its table's snapshot with a removal
    /// of the rows deleted while it was quarantined (an unfiltered pass of a
    /// table released from quarantine, its last chunk): the caller then
    /// hands in the topic's partitions.
    pub(super) fn removes_stale(&self, ready: &ReadyChunk<R>, position: &SourceOffset) -> bool {
        // A filtered pass reads some rows only: the others are not newer.
        let whole = position
            .snapshot
            .as_ref()
            .and_then(|p| p.current())
            .is_some_and(|t| t.table == ready.chunk.table && t.filter.is_none());
        !ready.rows.more && whole && position.stale_before.contains_key(&ready.chunk.table)
    }

    /// Publishes a ready chunk's surviving rows at `src` (its high
    /// watermark's commit LSN and time) into the committer's open
    /// transaction, and moves the snapshot's progress past it there.
    pub(super) async fn publish<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        ready: ReadyChunk<R>,
        encoding: &ChunkEncoding,
        src: &SourcePosition,
    ) -> Result<(), CaptureError> {
        let Some(kind) = kafka
            .position()
            .snapshot
            .as_ref()
            .map(|p| (p.kind, p.tables.len() == 1))
        else {
            return Ok(());
        };
        let ReadyChunk { chunk, rows } = ready;
        let mut out = self.chunk_records(&chunk, &rows, encoding, kind, src)?;
        tracing::debug!(
            table = %chunk.table,
            rows = rows.rows.len(),
            dropped = out.dropped,
            completed = out.completed,
            high_watermark = %format_lsn(src.commit_lsn),
            "snapshot chunk published"
        );
        if let Some(partitions) = encoding.partitions {
            // The table's last chunk: a table back from quarantine drops
            // the rows deleted meanwhile, in this same transaction.
            let stale = self.stale_rows_removal(kafka, &chunk.table, encoding, partitions, src);
            out.records.extend(stale);
        }
        kafka.publish(out.records).await?;
        let last_key = (!rows.rows.is_empty()).then(|| last_key(&rows));
        self.count_chunk(&chunk.table, &rows, out.dropped);
        self.advance_snapshot(kafka, &chunk, &rows, last_key, src);
        Ok(())
    }

    /// The records of a chunk's rows the stream did not touch as read, and
    /// of rows it updated in place leaving columns out, completed from its
    /// updates (`Window`). `kind`: the snapshot's kind and whether this is
    /// its last table.
    fn chunk_records(
        &self,
        chunk: &InFlight<R>,
        rows: &ChunkRows<R>,
        encoding: &ChunkEncoding,
        (kind, last_table): (SnapshotKind, bool),
        src: &SourcePosition,
    ) -> Result<ChunkRecords, CaptureError> {
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
            if let Some(record) = self.row_record(encoding, row, &pos, now)? {
                records.push(record);
            }
        }
        Ok(ChunkRecords {
            records,
            dropped,
            completed,
        })
    }

    /// One snapshot row's record at `pos`; a row holding a value its field
    /// cannot carry is refused (logged, counted) like a streamed change, and
    /// the rest of the chunk goes.
    fn row_record(
        &self,
        encoding: &ChunkEncoding,
        row: &RowImage,
        pos: &SourcePosition,
        now: i64,
    ) -> Result<Option<Record>, CaptureError> {
        let encoder = &encoding.encoder;
        let encoded = encoder.key(row).and_then(|key| {
            let value = encoder.value(Op::Read, None, Some(row), pos, now)?;
            Ok((key, value))
        });
        match encoded.map_err(refusable(1)) {
            Ok((key, value)) => Ok(Some(Record::change(
                &encoding.topic,
                key,
                value,
                pos,
                Some(encoder),
            ))),
            Err(CaptureError::ValueRefused(refused)) => {
                refuse_value(&self.metrics, &refused);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The snapshot metrics of one published chunk.
    fn count_chunk(&self, table: &str, rows: &ChunkRows<R>, dropped: usize) {
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
    fn advance_snapshot<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        chunk: &InFlight<R>,
        rows: &ChunkRows<R>,
        last_key: Option<Vec<Option<String>>>,
        src: &SourcePosition,
    ) {
        let table_done = !rows.more;
        let stage = kafka.stage();
        let Some(progress) = stage.snapshot.as_mut() else {
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
                stage.snapshot = None;
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
            self.last_log = None;
        }
        // The next table's estimate comes with its first chunk.
        self.publish_view_with(kafka.position(), rows.estimate.filter(|_| !table_done));
    }

    /// Leaves a table that cannot be snapshotted, saying why, and goes on.
    pub(super) fn skip_table<T: Transactions>(
        &mut self,
        kafka: &mut Committer<T>,
        table: &str,
        reason: &str,
    ) {
        tracing::error!(table, reason, "snapshot of this table skipped");
        self.abandon_table(table);
        let stage = kafka.stage();
        if let Some(p) = stage.snapshot.as_mut() {
            p.tables.retain(|t| t.table != table);
            if p.tables.is_empty() {
                stage.snapshot = None;
            }
        }
        self.publish_view(kafka.position());
    }

    /// The encoder cached for a chunk's table shape `rel` whose columns are
    /// the source columns `identity`, with its topic.
    pub(super) fn cached_encoder(
        &self,
        rel: &R,
        identity: Option<&SourceIdentity>,
    ) -> Option<(TableEncoder, Arc<str>)> {
        match &self.encoder {
            Some(c) if c.table == *rel && c.identity.as_ref() == identity => {
                Some((c.encoder.clone(), Arc::clone(&c.topic)))
            }
            _ => None,
        }
    }

    /// Keeps `encoder`, built for `rel` and `identity`, for the chunks after.
    pub(super) fn cache_encoder(
        &mut self,
        rel: &R,
        identity: Option<SourceIdentity>,
        encoder: &TableEncoder,
        topic: &Arc<str>,
    ) {
        self.encoder = Some(CachedEncoder {
            table: rel.clone(),
            identity,
            encoder: encoder.clone(),
            topic: Arc::clone(topic),
        });
    }
}

/// The stream loop's side of a chunk: the driver's work that needs the
/// router, the schema watch and the producer.
impl<S: Source> Pipeline<'_, S> {
    /// A watermark in the stream: the in-flight chunk's high watermark
    /// publishes its surviving rows at `src` (its commit LSN and time).
    pub(super) async fn on_watermark(
        &mut self,
        content: &[u8],
        src: &SourcePosition,
    ) -> Result<(), CaptureError> {
        let Some(ready) = self.snapshot.take_ready(&mut self.kafka, content).await? else {
            return Ok(());
        };
        let (encoder, topic) = self
            .chunk_encoder(&ready.rows.relation, &ready.chunk.key_columns)
            .await?;
        let partitions = if self.snapshot.removes_stale(&ready, self.kafka.position()) {
            Some(self.kafka.partition_count(&topic).await?)
        } else {
            None
        };
        let encoding = ChunkEncoding {
            encoder,
            topic,
            partitions,
        };
        self.snapshot
            .publish(&mut self.kafka, ready, &encoding, src)
            .await
    }

    /// The encoder of a chunk's table (built once per shape and column
    /// numbers).
    async fn chunk_encoder(
        &mut self,
        rel: &S::Table,
        key_columns: &[String],
    ) -> Result<(TableEncoder, Arc<str>), CaptureError> {
        let qualified = format!("{}.{}", rel.namespace(), rel.name());
        // A chunk's Relation is read from the catalog as it is now; its
        // column numbers are read for every chunk, since DDL between two
        // chunks may change them and not the shape (DROP c, ADD c).
        let identity = self
            .source
            .schema
            .source_identity(&self.source.control, &qualified, rel, None)
            .await?;
        if let Some(cached) = self.snapshot.cached_encoder(rel, identity.as_ref()) {
            return Ok(cached);
        }
        let enc = rel
            .encoder(
                self.router.types(),
                Some(key_columns),
                self.router.envelope(),
                identity.as_ref(),
            )
            .map_err(|e| CaptureError::Prerequisite(e.to_string()))?
            .with_heads_apart(self.router.heads_apart());
        let topic: Arc<str> = enc.topic().into();
        self.kafka.ensure_topic(&topic).await?;
        self.snapshot.cache_encoder(rel, identity, &enc, &topic);
        Ok((enc, topic))
    }
}

/// Notes what `change` does to keys of `chunk`'s table.
fn mark_chunk_dirty<'r, R: StreamTable + 'r, Id: Copy>(
    chunk: &mut InFlight<R>,
    change: RowChange<'_, Id>,
    relation_of: &impl Fn(Id) -> Option<&'r R>,
) {
    let relation_of = |id: Id| {
        relation_of(id).filter(|r| format!("{}.{}", r.namespace(), r.name()) == chunk.table)
    };
    let key_columns = &chunk.key_columns;
    let key_idx = |rel: &R| -> Option<Vec<usize>> {
        key_columns
            .iter()
            .map(|k| (0..rel.width()).position(|i| rel.column_name(i) == k))
            .collect()
    };
    let window = &mut chunk.window;
    match change {
        RowChange::Insert { table, new } => {
            if let Some(rel) = relation_of(table) {
                replaced(window, key_idx(rel).and_then(|idx| row_key(new, &idx)));
            }
        }
        RowChange::Delete { table, old } => {
            if let Some(rel) = relation_of(table) {
                replaced(
                    window,
                    key_idx(rel).and_then(|idx| row_key(old.row(), &idx)),
                );
            }
        }
        RowChange::Update { table, old, new } => {
            let Some(rel) = relation_of(table) else {
                return;
            };
            let Some(idx) = key_idx(rel) else {
                return window.all_changed();
            };
            let new_key = row_key(new, &idx);
            let old_key = old.map(|o| row_key(o.row(), &idx));
            match (new_key, old_key) {
                (Some(key), None) => window.updated(key, rel, &filled(new, old)),
                (Some(key), Some(Some(old_key))) if old_key == key => {
                    window.updated(key, rel, &filled(new, old))
                }
                // A primary-key change: a row left one key and came to another.
                (Some(key), Some(Some(old_key))) => {
                    window.replaced(key);
                    window.replaced(old_key);
                }
                (None, _) | (_, Some(None)) => window.all_changed(),
            }
        }
        RowChange::Truncate { tables } if tables.iter().any(|id| relation_of(*id).is_some()) => {
            window.all_changed();
        }
        RowChange::Truncate { .. } => {}
    }
}

/// The key of a chunk's last row, in text form, as progress stores it and
/// the next chunk starts after it (`None` per non-text value).
fn last_key<R>(rows: &ChunkRows<R>) -> Vec<Option<String>> {
    let Some(row) = rows.rows.last() else {
        return Vec::new();
    };
    rows.key_idx
        .iter()
        .map(|&i| match &row.0[i] {
            Datum::Text(b) => Some(String::from_utf8_lossy(b).into_owned()),
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
fn filled<'a>(new: &'a RowImage, old: Option<OldRow<'_>>) -> Cow<'a, RowImage> {
    match old {
        Some(OldRow::Full(full)) => match super::router::fill_unchanged_toast(new, full) {
            Some(row) => Cow::Owned(row),
            None => Cow::Borrowed(new),
        },
        _ => Cow::Borrowed(new),
    }
}
