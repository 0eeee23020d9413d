//! The snapshot driver, one component of the pipeline: what the stream loop
//! keeps of a chunked snapshot between messages (the chunks in flight, the
//! read task, the transactions the stream carried lately, to tell whether a
//! chunk's SELECT missed one of them) and the quarantine's fixes seen. The
//! snapshot's plan itself is part of the offset record, so it is the
//! committer's staged position, which the driver's methods are handed, as
//! they are handed the source's chunk reads ([`ChunkReads`]) and the
//! encoder of a chunk's table: the driver reaches nothing through the
//! pipeline.
//!
//! Chunks are read ahead: the next chunk of a table is read while the one
//! before it waits for its high watermark and is published, so the reads,
//! the stream and the encoding overlap. Every chunk in flight has its own
//! window; they publish in order, and when one is not published (read
//! again, paused, stopped) the ones after it are abandoned too, so a
//! table's progress only ever moves to the end of a published chunk.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::fixes::Fixes;
use crate::envelope::{SourceIdentity, TableEncoder};
use crate::error::CaptureError;
use crate::metrics::{CaptureMetrics, SnapshotView};
use crate::offset::SourceOffset;
use crate::seam::{ChunkError, ChunkRows};
pub(crate) use crate::seam::{ChunkReads, ChunkTask};
use crate::snapshot::window::Window;
use oncely_core::wire::format_lsn;

/// Chunks in flight at most: one waiting for its high watermark (or being
/// published) and the next one being read. The reads share one connection
/// and a chunk starts at the key where the one before it ended, so reading
/// further ahead would only hold more rows while they wait.
pub(super) const CHUNKS_IN_FLIGHT: usize = 2;

/// Transactions the stream carried that are remembered, newest first, to
/// tell whether a chunk's SELECT missed one of them.
const STREAMED_XIDS: usize = 65_536;

/// The snapshot driver's state: the chunks in flight and what they need.
pub(super) struct SnapshotDriver<T> {
    pub(super) chunk_size: usize,
    pub(super) chunks_started: u64,
    /// Oldest first; only the newest can still be reading.
    pub(super) inflight: VecDeque<InFlight<T>>,
    /// Reads of abandoned chunks that have not ended yet: no chunk starts on
    /// the connection until they have.
    draining: Vec<ChunkTask<T>>,
    /// Encoder of the last chunk's table, reused while it holds.
    pub(super) encoder: Option<CachedEncoder<T>>,
    /// Rows and time at the last progress log line, for the rate.
    pub(super) last_log: Option<(Instant, u64)>,
    /// The transactions the stream carried lately, by xid, with their
    /// ordinal (`streamed`); at most [`STREAMED_XIDS`] of them.
    recent: HashMap<u32, u64>,
    recent_order: VecDeque<u32>,
    /// Transactions the stream began so far.
    pub(super) streamed: u64,
    /// `snapshot.mode = initial_only`: stop once no snapshot runs.
    pub(super) exit_when_done: bool,
    /// Where the fixes of quarantined tables were seen (see `quarantine`).
    pub(super) fixes: Fixes,
    /// `table.filter` by `schema.table`: every chunk of a filtered table
    /// reads matching rows only, a signal's own filter besides.
    pub(super) row_filters: BTreeMap<String, String>,
    pub(super) metrics: CaptureMetrics,
}

/// A chunk encoder with what it was built from: the table's shape and the
/// source columns its fields are (a column dropped and added again under
/// its name and type leaves the shape as it was but is another column).
pub(super) struct CachedEncoder<T> {
    pub(super) table: T,
    pub(super) identity: Option<SourceIdentity>,
    pub(super) encoder: TableEncoder,
    pub(super) topic: Arc<str>,
}

pub(super) struct InFlight<T> {
    pub(super) id: String,
    pub(super) snapshot_id: String,
    pub(super) table: String,
    pub(super) key_columns: Vec<String>,
    /// What the stream did to the table's keys since launch.
    pub(super) window: Window,
    /// Transactions the stream had begun at launch (`SnapshotDriver::streamed`).
    pub(super) launched: u64,
    pub(super) task: Option<ChunkTask<T>>,
    pub(super) read: Option<Result<ChunkRows<T>, ChunkError>>,
}

impl<T> SnapshotDriver<T> {
    pub(super) fn new(chunk_size: usize, metrics: CaptureMetrics) -> Self {
        SnapshotDriver {
            chunk_size,
            chunks_started: 0,
            inflight: VecDeque::new(),
            draining: Vec::new(),
            encoder: None,
            last_log: None,
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            streamed: 0,
            exit_when_done: false,
            fixes: Fixes::default(),
            row_filters: BTreeMap::new(),
            metrics,
        }
    }

    /// The row filters (`table.filter`) every chunk of their tables reads by.
    pub(super) fn with_row_filters(mut self, row_filters: BTreeMap<String, String>) -> Self {
        self.row_filters = row_filters;
        self
    }

    /// The filter of a chunk of `table`: the table's row filter and the
    /// snapshot's own (a signal's `additional-conditions`), both when set.
    /// Each was checked alone, balanced parentheses included, so the two
    /// cannot join into more than their conjunction.
    pub(super) fn chunk_filter(&self, table: &str, own: Option<&str>) -> Option<String> {
        match (self.row_filters.get(table), own) {
            (Some(rows), Some(own)) => Some(format!("({rows}) AND ({own})")),
            (Some(rows), None) => Some(rows.clone()),
            (None, own) => own.map(str::to_owned),
        }
    }

    /// `snapshot.mode = initial_only`: the pipeline stops once no snapshot runs.
    pub(super) fn exiting_when_done(mut self, exit_when_done: bool) -> Self {
        self.exit_when_done = exit_when_done;
        self
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
    pub(super) fn began_before(&self, xids: &[u32], launched: u64) -> Option<u32> {
        xids.iter()
            .copied()
            .find(|x| self.recent.get(x).is_some_and(|n| *n <= launched))
    }
}

impl<T> Drop for SnapshotDriver<T> {
    /// A pipeline that stops (shutdown, error) abandons its chunk: the next
    /// life reads it again, so its task has nothing left to do.
    fn drop(&mut self) {
        let reading = self.inflight.iter().filter_map(|c| c.task.as_ref());
        for task in reading.chain(&self.draining) {
            task.abort();
        }
    }
}

impl<T> SnapshotDriver<T> {
    /// Whether a chunk is reading or an abandoned read has not ended: the
    /// connection is busy.
    pub(super) fn reading(&self) -> bool {
        !self.draining.is_empty() || self.inflight.iter().any(|c| c.task.is_some())
    }

    /// Gives up the chunks in flight: none of them is published. A read
    /// still running ends on its own (its watermarks match no chunk).
    pub(super) fn abandon(&mut self) {
        for chunk in self.inflight.drain(..) {
            self.draining.extend(chunk.task);
        }
    }

    /// Gives up the chunks in flight of `table`.
    pub(super) fn abandon_table(&mut self, table: &str) {
        if self.inflight.iter().any(|c| c.table == table) {
            self.abandon();
        }
    }
}

/// Completes when a read task ends: `Some` with the newest chunk's rows, or
/// `None` when an abandoned read ended. Never without a task.
pub(super) async fn chunk_read<T>(
    snap: &mut SnapshotDriver<T>,
) -> Option<Result<ChunkRows<T>, ChunkError>> {
    if let Some(task) = snap.draining.first_mut() {
        // Its outcome no longer matters; its watermarks match no chunk.
        let _ = task.await;
        snap.draining.remove(0);
        return None;
    }
    match snap.inflight.back_mut().and_then(|c| c.task.as_mut()) {
        Some(task) => {
            let result = join(task).await;
            if let Some(c) = snap.inflight.back_mut() {
                c.task = None;
            }
            Some(result)
        }
        None => std::future::pending().await,
    }
}

pub(super) async fn join<T>(task: &mut ChunkTask<T>) -> Result<ChunkRows<T>, ChunkError> {
    task.await
        .unwrap_or_else(|e| Err(ChunkError::Capture(CaptureError::task("snapshot chunk")(e))))
}

/// How often progress is logged at most (and always when a table is done).
const PROGRESS_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Progress: the log line and what `oncely status` and the gauges show.
impl<T> SnapshotDriver<T> {
    pub(super) fn log_progress(
        &mut self,
        table: &str,
        rows: u64,
        estimate: Option<u64>,
        table_done: bool,
        lsn: u64,
    ) {
        let now = Instant::now();
        let (since, rows_then) = *self.last_log.get_or_insert((now, 0));
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
        self.last_log = Some((now, rows));
    }

    /// Updates what progress displays and the gauges show, from the
    /// position the committer stages.
    pub(super) fn publish_view(&self, position: &SourceOffset) {
        self.publish_view_with(position, None);
    }

    /// [`SnapshotDriver::publish_view`], with the current table's estimate.
    pub(super) fn publish_view_with(&self, position: &SourceOffset, estimate: Option<u64>) {
        let view = position.snapshot.as_ref().and_then(|p| {
            p.current().map(|t| SnapshotView {
                table: t.table.clone(),
                rows: t.rows,
                estimate,
                tables_after: p.tables.len() - 1,
                paused: p.paused,
            })
        });
        let running = position.snapshot.is_some();
        let paused = position.snapshot.as_ref().is_some_and(|p| p.paused);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_of_a_filtered_table_reads_by_its_row_filter_and_the_snapshots_own() {
        let snap = SnapshotDriver::<()>::new(10, CaptureMetrics::new("test"))
            .with_row_filters([("public.t".to_owned(), "region = 'eu'".to_owned())].into());
        assert_eq!(
            snap.chunk_filter("public.t", Some("id > 5")).as_deref(),
            Some("(region = 'eu') AND (id > 5)")
        );
        assert_eq!(
            snap.chunk_filter("public.t", None).as_deref(),
            Some("region = 'eu'")
        );
        assert_eq!(
            snap.chunk_filter("public.u", Some("id > 5")).as_deref(),
            Some("id > 5")
        );
        assert_eq!(snap.chunk_filter("public.u", None), None);
    }

    #[test]
    fn transactions_begun_before_a_launch_are_told_from_later_ones() {
        let mut snap = SnapshotDriver::<()>::new(10, CaptureMetrics::new("test"));
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
