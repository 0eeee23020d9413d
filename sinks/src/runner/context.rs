//! The consumer context: rebalances and statistics, both served on the poll thread.
//!
//! On **assignment** the start offset of each new partition is resolved — from
//! the sink when it owns positions, else from Kafka's committed offsets — and
//! written into the assignment itself, so consumption starts exactly there; the
//! sink's [`Sink::assigned`](crate::Sink::assigned) hook runs, then one worker
//! per partition is started.
//!
//! On **revocation** each revoked partition's worker finishes its current batch
//! (or is abandoned after `shutdown.timeout.ms`), its position is committed to
//! Kafka synchronously, and only then is the partition released. Partitions
//! *lost* (session expired) are abandoned without a commit: another member may
//! already own them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::decoder::Incoming;
use super::shared::{Gap, Shared};
use super::worker::{Control, Worker};
use crate::config::GapRecovery;
use crate::config::OffsetReset;
use crate::error::SinkError;
use crate::sink::{Positions, TopicPartition};
use oncely_core::backoff::{retry, RetryOutcome};

/// How long a metadata or committed-offsets request may take during a rebalance.
const REBALANCE_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct WorkerHandle {
    tx: mpsc::Sender<Incoming>,
    /// The offset after the last record admitted to this worker (at first
    /// the partition's start, when known): a record below it was handed to
    /// this worker before (see [`RunnerContext::admit`]).
    next: Option<i64>,
    stop: CancellationToken,
    abandon: CancellationToken,
    task: JoinHandle<()>,
}

/// Where [`RunnerContext::admit`] sends a record.
pub(crate) enum Admit {
    /// To this worker.
    Send(mpsc::Sender<Incoming>),
    /// Nowhere: the partition's worker was handed this offset already, or it
    /// lies before the partition's start; `next` is the offset it expects.
    Again { next: i64 },
    /// Nowhere: the partition has no worker here.
    Unassigned,
}

/// The runner's consumer context (see the module docs).
pub(crate) struct RunnerContext {
    shared: Arc<Shared>,
    workers: Mutex<HashMap<TopicPartition, WorkerHandle>>,
}

impl RunnerContext {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            workers: Mutex::new(HashMap::new()),
        }
    }

    /// Where the record at `offset` of `topic`/`partition` goes: its worker's
    /// channel, or nowhere because that worker had it already or the partition
    /// has no worker here.
    ///
    /// Rule: a worker is handed each offset at most once, in increasing
    /// order. librdkafka may deliver a record again without any reassignment:
    /// every cooperative rebalance pauses the partitions this member keeps,
    /// and the pause saves as the next fetch position the application
    /// position, which is one record behind while the poll thread holds a
    /// record it popped but librdkafka has not yet marked consumed
    /// (`rd_kafka_event_message_next`); the resume then fetches that record
    /// again (`sinks/tests/it/runner_kafka.rs` shows it on librdkafka
    /// alone). Dropping it is exact: a
    /// worker applies (or dead-letters) every record admitted to it, in
    /// order, or ends — and an ended worker is never handed anything again
    /// (a new assignment starts a new worker at the position the sink or
    /// Kafka stored). So an offset below `next` is one this worker holds or
    /// applied, or one before the stored start.
    pub(crate) fn admit(&self, topic: &str, partition: i32, offset: i64) -> Admit {
        let key = TopicPartition::new(topic, partition);
        let mut workers = self.lock_workers();
        let Some(worker) = workers.get_mut(&key) else {
            return Admit::Unassigned;
        };
        match worker.next {
            Some(next) if offset < next => Admit::Again { next },
            _ => {
                // Counted as handed over even if the send then fails: that
                // happens only when the worker ended or the runner stops.
                worker.next = Some(offset + 1);
                Admit::Send(worker.tx.clone())
            }
        }
    }

    /// The state shared with the workers.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Every partition with a worker.
    pub(crate) fn assigned(&self) -> Vec<TopicPartition> {
        self.lock_workers().keys().cloned().collect()
    }

    fn lock_workers(&self) -> std::sync::MutexGuard<'_, HashMap<TopicPartition, WorkerHandle>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn on_assign(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let tps: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| TopicPartition::new(e.topic(), e.partition()))
            .filter(|tp| !self.shared.filter.is_ignored(&tp.topic))
            .collect();
        if tps.is_empty() {
            return;
        }
        let starts = match self.resolve_starts(consumer, &tps) {
            Ok(starts) => starts,
            Err(e) => return self.fail_unless_stopping(e),
        };
        let set_aside = self.set_aside();
        for tp in &tps {
            if set_aside.contains(tp) {
                // Kept assigned at its stored offset: librdkafka refuses to
                // fetch it (`auto.offset.reset = error`) and no worker runs.
                if let Some(n) = starts.get(tp) {
                    let _ = tpl.set_partition_offset(&tp.topic, tp.partition, Offset::Offset(*n));
                }
                continue;
            }
            let offset = match starts.get(tp) {
                Some(n) => {
                    self.shared.assigned(tp, *n);
                    Offset::Offset(*n)
                }
                None => self.reset_offset(),
            };
            if let Err(e) = tpl.set_partition_offset(&tp.topic, tp.partition, offset) {
                tracing::warn!(%tp, "cannot set the start offset: {e}");
            }
            tracing::info!(%tp, start = ?offset, "partition assigned");
        }
        if let Err(e) = self.block_on_retried(|| self.shared.sink.assigned(&starts)) {
            return self.fail_unless_stopping(e);
        }
        let mut workers = self.lock_workers();
        for tp in tps.into_iter().filter(|tp| !set_aside.contains(tp)) {
            let handle = self.spawn_worker(&tp, starts.get(&tp).copied());
            workers.insert(tp, handle);
        }
    }

    /// Start offsets: the sink's positions when it owns them, else Kafka's committed
    /// offsets; `auto.offset.reset` resolved to a concrete offset where possible.
    fn resolve_starts(
        &self,
        consumer: &BaseConsumer<Self>,
        tps: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        let mut starts = if self.shared.sink.owns_positions() {
            let group = self.shared.group.clone();
            self.block_on_retried(|| self.shared.sink.load_positions(&group, tps))?
        } else {
            self.block_on_retried(|| async { committed(consumer, tps) })?
        };
        for tp in tps {
            if let Some(next) = starts.get(tp).copied() {
                self.check_gap(consumer, tp, next, &mut starts);
                continue;
            }
            match consumer.fetch_watermarks(&tp.topic, tp.partition, REBALANCE_REQUEST_TIMEOUT) {
                // Never applied, reading from the earliest: it needs offset 0,
                // so a log that lost its start is a gap like any other.
                Ok((low, _))
                    if low > 0 && self.shared.config.auto_offset_reset == OffsetReset::Earliest =>
                {
                    self.check_gap(consumer, tp, 0, &mut starts);
                }
                Ok((low, high)) => {
                    let start = match self.shared.config.auto_offset_reset {
                        OffsetReset::Earliest => low,
                        OffsetReset::Latest => high,
                    };
                    starts.insert(tp.clone(), start);
                }
                Err(e) => {
                    tracing::warn!(%tp, "cannot read watermarks, using auto.offset.reset: {e}")
                }
            }
        }
        Ok(starts)
    }

    /// A stored position below the log's start is a gap: the partition is
    /// recovered (`gap.recovery = "snapshot"`) or stopped, or with
    /// `--resume-after-gap` starts at the log's start (loudly).
    fn check_gap(
        &self,
        consumer: &BaseConsumer<Self>,
        tp: &TopicPartition,
        next: i64,
        starts: &mut Positions,
    ) {
        let low =
            match consumer.fetch_watermarks(&tp.topic, tp.partition, REBALANCE_REQUEST_TIMEOUT) {
                Ok((low, _)) => low,
                // Unknown: fetched as stored; librdkafka reports an offset out of range.
                Err(e) => {
                    return tracing::warn!(%tp, "cannot read the log start to check for a gap: {e}")
                }
            };
        if next >= low {
            return;
        }
        let gap = Gap {
            next,
            log_start: low,
        };
        if self.recover(tp, gap) {
            starts.insert(tp.clone(), low);
            return;
        }
        if self.shared.config.resume_after_gap {
            tracing::warn!(
                "{tp}: resuming at the log start {low} after a gap of {} offsets (--resume-after-gap): the changes in them are only in the target if their tables were snapshotted again",
                low - next
            );
            starts.insert(tp.clone(), low);
        } else {
            self.shared.report_gap(tp, gap);
        }
    }

    /// With `gap.recovery = "snapshot"`: requests the snapshot, removes what
    /// it will not bring back and watches it (`runner::gap`); true when `tp`
    /// may resume at the log start. Called while `tp` has no worker.
    fn recover(&self, tp: &TopicPartition, gap: Gap) -> bool {
        if self.shared.config.gap_recovery != GapRecovery::Snapshot {
            return false;
        }
        let Some(signals) = self.shared.signals.clone() else {
            return false;
        };
        let shared = self.shared.clone();
        let request =
            match self.block_on_retried(|| shared.recover_gap(&signals, tp, gap.log_start)) {
                Ok(request) => request,
                Err(e) => {
                    tracing::error!("{tp}: the gap cannot be recovered by a snapshot: {e}");
                    return false;
                }
            };
        let partition = tp.partition.to_string();
        self.shared
            .metrics
            .gap_offsets
            .with_label_values(&[tp.topic.as_str(), partition.as_str()])
            .set(gap.log_start - gap.next);
        tracing::warn!(
            "{tp}: the sink needs offset {} but Kafka's log starts at {}: {} offsets were deleted (retention.ms) before they were applied; recovering by a snapshot (gap.recovery = \"snapshot\"), resuming at the log start",
            gap.next,
            gap.log_start,
            gap.log_start - gap.next
        );
        self.shared.watch_recovery(signals, tp.clone(), request);
        true
    }

    /// Partitions set aside (a gap or a quarantine).
    fn set_aside(&self) -> std::collections::HashSet<TopicPartition> {
        self.shared
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// After librdkafka reported an offset out of range (retention deleted
    /// records a running partition had not fetched yet): each partition with
    /// a worker whose fetch position is below its log start stops, its
    /// applied records committed; with `gap.recovery = "snapshot"` it is
    /// recovered and fetched again from the log start, else set aside.
    pub(crate) fn stop_gapped(&self, consumer: &BaseConsumer<Self>) {
        let Ok(positions) = consumer.position() else {
            return tracing::warn!("offset out of range, and the fetch positions cannot be read");
        };
        let mut gapped = Vec::new();
        for tp in self.assigned() {
            let Some(Offset::Offset(next)) = positions
                .find_partition(&tp.topic, tp.partition)
                .map(|e| e.offset())
            else {
                continue;
            };
            if let Ok((low, _)) =
                consumer.fetch_watermarks(&tp.topic, tp.partition, REBALANCE_REQUEST_TIMEOUT)
            {
                if next < low {
                    gapped.push((
                        tp,
                        Gap {
                            next,
                            log_start: low,
                        },
                    ));
                }
            }
        }
        if gapped.is_empty() {
            tracing::warn!("librdkafka reported an offset out of range, but no partition's fetch position is below its log start");
        }
        let stopped: Vec<TopicPartition> = gapped.iter().map(|(tp, _)| tp.clone()).collect();
        self.stop_workers(&stopped, false);
        for (tp, gap) in gapped {
            let recovering = self.shared.config.gap_recovery == GapRecovery::Snapshot
                && self.shared.signals.is_some();
            // Assigned again at the log start (a seek is refused once the
            // fetch failed out of range); nothing is dispatched before the
            // new worker exists, as dispatching runs on this thread.
            if recovering {
                if let Err(e) = reassign(consumer, &tp, gap.log_start) {
                    tracing::error!(%tp, "cannot move the fetch position to the log start: {e}");
                    self.shared.report_gap(&tp, gap);
                    continue;
                }
            }
            if !recovering || !self.recover(&tp, gap) {
                if recovering {
                    // Back at the missing offset, which librdkafka refuses to fetch.
                    let _ = reassign(consumer, &tp, gap.next);
                }
                self.shared.report_gap(&tp, gap);
                continue;
            }
            self.shared
                .record_progress(&tp.topic, tp.partition, gap.log_start);
            let handle = self.spawn_worker(&tp, Some(gap.log_start));
            self.lock_workers().insert(tp, handle);
        }
    }

    /// A retriable error here means the retries were cut short by a stop: not a failure.
    fn fail_unless_stopping(&self, e: SinkError) {
        if e.is_retriable() && self.shared.stop.is_cancelled() {
            tracing::info!("stopping while partitions were being assigned: {e}");
        } else {
            self.shared.fail(e);
        }
    }

    fn reset_offset(&self) -> Offset {
        match self.shared.config.auto_offset_reset {
            OffsetReset::Earliest => Offset::Beginning,
            OffsetReset::Latest => Offset::End,
        }
    }

    /// Runs a sink call from the poll thread, retrying transient errors until the runner stops.
    fn block_on_retried<T, F, Fut>(&self, op: F) -> Result<T, SinkError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, SinkError>>,
    {
        let mut backoff = self.shared.backoff();
        let outcome = self.shared.handle.block_on(retry(
            &mut backoff,
            &self.shared.stop,
            op,
            SinkError::is_retriable,
            |e, delay| {
                tracing::warn!("sink call during rebalance failed, retrying in {delay:?}: {e:#}")
            },
        ));
        match outcome {
            Ok(v) => Ok(v),
            Err(RetryOutcome::Failed(e) | RetryOutcome::Cancelled(e)) => Err(e),
        }
    }

    /// Starts the worker of `tp`, which reads from `start` when known.
    fn spawn_worker(&self, tp: &TopicPartition, start: Option<i64>) -> WorkerHandle {
        let capacity = self.shared.config.batch_max_records.clamp(16, 10_000);
        let (tx, rx) = mpsc::channel(capacity);
        let control = Control {
            stop: CancellationToken::new(),
            abandon: CancellationToken::new(),
        };
        let (stop, abandon) = (control.stop.clone(), control.abandon.clone());
        let worker = Worker::new(
            self.shared.clone(),
            (Arc::from(tp.topic.as_str()), tp.partition),
            rx,
            control,
        );
        let task = self.shared.handle.spawn(worker.run());
        WorkerHandle {
            tx,
            next: start,
            stop,
            abandon,
            task,
        }
    }

    /// Stops the workers of `tps`: gracefully (finish the current batch) unless `lost`,
    /// abandoning any still running after `shutdown.timeout.ms`. Blocks until all ended.
    pub(crate) fn stop_workers(&self, tps: &[TopicPartition], lost: bool) {
        let handles: Vec<(&TopicPartition, WorkerHandle)> = {
            let mut workers = self.lock_workers();
            tps.iter()
                .filter_map(|tp| Some((tp, workers.remove(tp)?)))
                .collect()
        };
        for (_, h) in &handles {
            h.stop.cancel();
            if lost {
                h.abandon.cancel();
            }
        }
        let deadline = tokio::time::Instant::now() + self.shared.config.shutdown_timeout();
        self.shared.handle.block_on(async {
            for (tp, mut h) in handles {
                match tokio::time::timeout_at(deadline, &mut h.task).await {
                    Ok(Ok(())) => {}
                    // A worker catches its stages' panics; this is one of its own.
                    Ok(Err(e)) => {
                        let stage = "stopping";
                        self.shared.worker_died(tp, stage, e);
                    }
                    Err(_) => {
                        tracing::warn!(%tp, "a partition worker did not finish within shutdown.timeout.ms; abandoning its batch");
                        h.abandon.cancel();
                        h.task.abort();
                        let _ = h.task.await;
                    }
                }
            }
        });
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let tps: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| TopicPartition::new(e.topic(), e.partition()))
            .collect();
        let lost = consumer.assignment_lost();
        self.stop_workers(&tps, lost);
        let positions = self.shared.take_positions(&tps);
        if !lost {
            super::commit(consumer, &positions, rdkafka::consumer::CommitMode::Sync);
        }
        for tp in &tps {
            let partition = tp.partition.to_string();
            let labels = [tp.topic.as_str(), partition.as_str()];
            let m = &self.shared.metrics;
            let _ = m.consumer_lag.remove_label_values(&labels);
            let _ = m.uncommitted_records.remove_label_values(&labels);
            let _ = m.commit_lag_seconds.remove_label_values(&labels);
            // Its next owner decides for itself (a quarantined table is
            // replayed from its stored position there).
            self.shared.forget_set_aside(tp);
            tracing::info!(%tp, lost, "partition revoked");
        }
    }
}

/// Assigns `tp` again, to fetch from `offset` (cooperative protocol).
fn reassign(
    consumer: &BaseConsumer<RunnerContext>,
    tp: &TopicPartition,
    offset: i64,
) -> Result<(), rdkafka::error::KafkaError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.topic, tp.partition);
    consumer.incremental_unassign(&tpl)?;
    let mut at = TopicPartitionList::new();
    at.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(offset))?;
    consumer.incremental_assign(&at)
}

/// Kafka's committed offsets for `tps` (missing where none). An error is
/// retried: read as "none", a partition would start at `auto.offset.reset`
/// and skip or repeat what the group had applied.
fn committed(
    consumer: &BaseConsumer<RunnerContext>,
    tps: &[TopicPartition],
) -> Result<Positions, SinkError> {
    let mut tpl = TopicPartitionList::new();
    for tp in tps {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    let list = consumer
        .committed_offsets(tpl, REBALANCE_REQUEST_TIMEOUT)
        .map_err(|e| SinkError::retriable_from("read the group's committed offsets", e))?;
    Ok(list
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some((TopicPartition::new(e.topic(), e.partition()), n)),
            _ => None,
        })
        .collect())
}

impl ClientContext for RunnerContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                if *partition < 0 || p.consumer_lag < 0 {
                    continue;
                }
                let partition = partition.to_string();
                self.shared
                    .metrics
                    .consumer_lag
                    .with_label_values(&[topic, &partition])
                    .set(p.consumer_lag);
            }
        }
    }
}

impl RunnerContext {
    /// An offset commit failed; its positions stay pending and go out again.
    pub(crate) fn commit_failed(&self, e: &rdkafka::error::KafkaError) {
        // Sent every 200 ms while refused: rate-limited, counted in the metric.
        static REFUSED: oncely_core::log_limit::LogLimit =
            oncely_core::log_limit::LogLimit::new(Duration::from_secs(10), 3);
        self.shared.metrics.offset_commit_failures.inc();
        if let Some(suppressed) = REFUSED.admit() {
            tracing::warn!(
                suppressed,
                "offset commit failed (sent again with the next commit; at most 3 such lines per 10 s, `suppressed` counts those not logged): {e}"
            );
        }
    }
}

impl ConsumerContext for RunnerContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.shared.liveness.joined();
                self.on_assign(consumer, tpl);
                if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.on_revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!("rebalance error: {other:?}");
                return;
            }
        };
        if let Err(e) = result {
            tracing::error!("cannot apply the rebalance: {e}");
        }
    }
}
