//! State shared by the poll thread and the partition workers, and the topic filter.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use super::dlq::DeadLetters;
use crate::config::RunnerConfig;
use crate::error::{RunnerError, SinkError};
use crate::metrics::Metrics;
use crate::sink::{Sink, TopicPartition};
use oncely_core::backoff::Backoff;

/// Decides which topics are skipped: heartbeats, the capture offsets topic, the dead-letter topic.
pub(crate) struct TopicFilter {
    heartbeat_prefix: String,
    patterns: Vec<regex::Regex>,
    dlq: Option<String>,
}

impl TopicFilter {
    pub(crate) fn new(config: &RunnerConfig) -> Result<Self, RunnerError> {
        let patterns = config
            .ignore_topics
            .iter()
            .enumerate()
            .map(|(i, p)| {
                regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                    RunnerError::Config(crate::ConfigError::new(
                        format!("ignore.topics[{i}]"),
                        e.to_string(),
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            heartbeat_prefix: config.heartbeat_prefix.clone(),
            patterns,
            dlq: config.dlq_topic.clone(),
        })
    }

    /// True when records of `topic` are skipped (never reach the sink).
    pub(crate) fn is_ignored(&self, topic: &str) -> bool {
        (!self.heartbeat_prefix.is_empty() && topic.starts_with(&self.heartbeat_prefix))
            || self.dlq.as_deref() == Some(topic)
            || self.patterns.iter().any(|p| p.is_match(topic))
    }
}

/// State shared by the poll thread and the partition workers.
pub(crate) struct Shared {
    pub(crate) config: RunnerConfig,
    pub(crate) group: Arc<str>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) metrics: Metrics,
    pub(crate) dlq: Option<Arc<DeadLetters>>,
    pub(crate) handle: Handle,
    pub(crate) filter: TopicFilter,
    /// Runner-wide stop: the caller's token, or a fatal error.
    pub(crate) stop: CancellationToken,
    pub(crate) budget: Arc<Semaphore>,
    pub(crate) budget_total: u32,
    /// Why the runner stops, when it must: the first fatal error.
    pub(crate) fatal: Mutex<Option<RunnerError>>,
    /// Per partition owned here: what is applied and what Kafka acknowledged.
    pub(crate) positions: Mutex<CommitLedger>,
    /// What `/readyz` reads besides the ledger.
    pub(crate) liveness: Liveness,
    /// Partitions set aside while the others go on: the records they need
    /// next are gone (a gap), or their table cannot be applied (quarantine);
    /// why, with the fix.
    pub(crate) stopped: Mutex<BTreeMap<TopicPartition, String>>,
    /// What requests a recovery snapshot (`gap.recovery = "snapshot"`).
    pub(crate) signals: Option<Arc<dyn super::snapshot_signals::SnapshotSignals>>,
    /// Partitions resumed after a gap whose recovery snapshot is not done
    /// yet (`runner::gap`); why, for `/readyz`.
    pub(crate) recovering: Mutex<BTreeMap<TopicPartition, String>>,
    /// `schema.registry.url`: where the schemas of Avro records are read.
    pub(crate) registry: Option<oncely_core::avro::registry::RegistryClient>,
}

/// A partition whose next record Kafka no longer holds: `next` is the offset
/// the sink needs, `log_start` the first Kafka still has (`log_start - next`
/// offsets, records and transaction markers, are gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gap {
    pub(crate) next: i64,
    pub(crate) log_start: i64,
}

impl Gap {
    /// What `/readyz`, the log and the error say: the partition, how much is
    /// gone and the fix.
    pub(crate) fn explain(&self, tp: &TopicPartition) -> String {
        format!(
            "{tp}: the sink needs offset {}{} but Kafka's log starts at {}: {} offsets were deleted (retention.ms) before they were applied, so the target misses their changes; the partition is stopped. Fix: snapshot the topic's table (`oncely capture snapshot --table <schema.table>`), then start the sink once with `--resume-after-gap`, or let the sink do both (gap.recovery = \"snapshot\") (docs: Operating, gaps)",
            self.next,
            if self.next == 0 {
                " (it has no stored position: it never applied this partition)"
            } else {
                ""
            },
            self.log_start,
            self.log_start - self.next
        )
    }
}

/// The poll thread's signs of life, for `/readyz`.
#[derive(Debug)]
pub(crate) struct Liveness {
    since: Instant,
    /// Milliseconds after `since` of the poll loop's last turn.
    last_poll_ms: AtomicU64,
    /// The group assigned partitions to this member (an assignment arrived).
    joined: AtomicBool,
}

impl Liveness {
    pub(crate) fn new() -> Self {
        Self {
            since: Instant::now(),
            last_poll_ms: AtomicU64::new(0),
            joined: AtomicBool::new(false),
        }
    }

    /// The poll loop turned.
    pub(crate) fn polled(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_poll_ms.store(ms, Ordering::Relaxed);
    }

    /// The group's assignment arrived.
    pub(crate) fn joined(&self) {
        self.joined.store(true, Ordering::Relaxed);
    }

    fn since_poll(&self) -> Duration {
        self.since.elapsed().saturating_sub(Duration::from_millis(
            self.last_poll_ms.load(Ordering::Relaxed),
        ))
    }
}

/// Per owned partition: the applied position and its commit to Kafka.
///
/// A position counts as committed only once Kafka acknowledged it (the commit
/// callback): an offset commit can fail — during a rebalance a commit sent with
/// the old generation is refused — and is then sent again with the next
/// periodic commit, also when the partition has gone idle meanwhile.
#[derive(Debug, Default)]
pub(crate) struct CommitLedger(HashMap<TopicPartition, Progress>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    /// The next offset after the last applied record.
    applied: i64,
    /// The last offset Kafka acknowledged from this runner.
    committed: Option<i64>,
    /// Since when `applied` is ahead of `committed`.
    behind_since: Option<Instant>,
}

impl Progress {
    fn pending(&self) -> bool {
        self.committed != Some(self.applied)
    }
}

impl CommitLedger {
    fn applied(&mut self, tp: TopicPartition, next_offset: i64, now: Instant) {
        let p = self.0.entry(tp).or_insert(Progress {
            applied: next_offset,
            committed: None,
            behind_since: None,
        });
        p.applied = next_offset;
        if p.pending() && p.behind_since.is_none() {
            p.behind_since = Some(now);
        }
    }

    /// A partition assigned here, starting at `start`: the baseline of its
    /// commit lag (what it read from is not owed to Kafka).
    fn assigned(&mut self, tp: TopicPartition, start: i64) {
        self.0.insert(
            tp,
            Progress {
                applied: start,
                committed: Some(start),
                behind_since: None,
            },
        );
    }

    fn pending(&self) -> HashMap<TopicPartition, i64> {
        self.0
            .iter()
            .filter(|(_, p)| p.pending())
            .map(|(tp, p)| (tp.clone(), p.applied))
            .collect()
    }

    fn committed(&mut self, tp: &TopicPartition, offset: i64) {
        if let Some(p) = self.0.get_mut(tp) {
            p.committed = Some(p.committed.map_or(offset, |c| c.max(offset)));
            if !p.pending() {
                p.behind_since = None;
            }
        }
    }

    /// Removes `tps`, returning the applied positions still owed to Kafka.
    fn take(&mut self, tps: &[TopicPartition]) -> HashMap<TopicPartition, i64> {
        tps.iter()
            .filter_map(|tp| {
                self.0
                    .remove(tp)
                    .filter(Progress::pending)
                    .map(|p| (tp.clone(), p.applied))
            })
            .collect()
    }

    /// Per partition: records applied beyond the acknowledged commit, and
    /// seconds it has been behind.
    fn lag(&self, now: Instant) -> Vec<(TopicPartition, i64, f64)> {
        self.0
            .iter()
            .map(|(tp, p)| {
                let records = match p.committed {
                    Some(c) => (p.applied - c).max(0),
                    None => i64::from(p.pending()),
                };
                let seconds = p.behind_since.map_or(0.0, |t| (now - t).as_secs_f64());
                (tp.clone(), records, seconds)
            })
            .collect()
    }
}

impl Shared {
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.config.retry_backoff_ms),
            Duration::from_millis(self.config.retry_backoff_max_ms),
        )
    }

    /// Records that everything before `next_offset` is applied (or skipped).
    pub(crate) fn record_progress(&self, topic: &str, partition: i32, next_offset: i64) {
        self.ledger().applied(
            TopicPartition::new(topic, partition),
            next_offset,
            Instant::now(),
        );
    }

    /// A partition starts here at `start`.
    pub(crate) fn assigned(&self, tp: &TopicPartition, start: i64) {
        self.ledger().assigned(tp.clone(), start);
    }

    /// Positions Kafka has not acknowledged yet (to commit; they stay pending
    /// until [`Shared::committed`] hears the commit succeeded).
    pub(crate) fn pending_positions(&self) -> HashMap<TopicPartition, i64> {
        self.ledger().pending()
    }

    /// Kafka acknowledged `offset` for `tp`.
    pub(crate) fn committed(&self, tp: &TopicPartition, offset: i64) {
        self.ledger().committed(tp, offset);
    }

    /// Removes `tps` (on revocation and shutdown), returning the applied
    /// positions Kafka does not hold yet.
    pub(crate) fn take_positions(&self, tps: &[TopicPartition]) -> HashMap<TopicPartition, i64> {
        self.ledger().take(tps)
    }

    /// Stops `tp` for good in this process: the records it needs are gone.
    pub(crate) fn report_gap(&self, tp: &TopicPartition, gap: Gap) {
        let partition = tp.partition.to_string();
        self.metrics
            .gap_offsets
            .with_label_values(&[tp.topic.as_str(), partition.as_str()])
            .set(gap.log_start - gap.next);
        self.set_aside(tp, gap.explain(tp));
    }

    /// Sets `tp` aside: its table cannot be applied until a setting or the
    /// target changes (`SinkError::Quarantined`); the worker has ended
    /// without storing the batch's position.
    pub(crate) fn quarantine(&self, tp: &TopicPartition, reason: &str) {
        let partition = tp.partition.to_string();
        self.metrics
            .quarantined
            .with_label_values(&[tp.topic.as_str(), partition.as_str()])
            .set(1);
        self.set_aside(
            tp,
            format!("{tp}: quarantined, nothing of it is applied until the sink starts again after the fix (the other partitions go on): {reason}"),
        );
    }

    pub(super) fn set_aside(&self, tp: &TopicPartition, why: String) {
        tracing::error!("{why}");
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(tp.clone(), why);
    }

    /// Whether `tp` was set aside.
    pub(crate) fn is_set_aside(&self, tp: &TopicPartition) -> bool {
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(tp)
    }

    /// `tp` was revoked: its next owner decides for itself.
    pub(crate) fn forget_set_aside(&self, tp: &TopicPartition) {
        let removed = self
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(tp);
        if removed.is_some() {
            let partition = tp.partition.to_string();
            let labels = [tp.topic.as_str(), partition.as_str()];
            let _ = self.metrics.gap_offsets.remove_label_values(&labels);
            let _ = self.metrics.quarantined.remove_label_values(&labels);
        }
    }

    /// Sets the commit-lag gauges of every owned partition: records applied
    /// but not acknowledged by Kafka, and for how long.
    pub(crate) fn publish_commit_lag(&self) {
        for (tp, records, seconds) in self.ledger().lag(Instant::now()) {
            let partition = tp.partition.to_string();
            let labels = [tp.topic.as_str(), partition.as_str()];
            self.metrics
                .uncommitted_records
                .with_label_values(&labels)
                .set(records);
            self.metrics
                .commit_lag_seconds
                .with_label_values(&labels)
                .set(seconds);
        }
    }

    /// `/readyz`: the member joined its group, the poll loop turns, and no
    /// owned partition's commit has lagged what was applied for longer than
    /// `health.ready.max.lag.ms`; else why not.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        let bound = self.config.ready_max_lag();
        let key = "health.ready.max.lag.ms";
        if self.stop.is_cancelled() {
            return Err("stopping".into());
        }
        if !self.liveness.joined.load(Ordering::Relaxed) {
            return Err(format!(
                "consumer group {} has not assigned partitions to this member yet",
                self.group
            ));
        }
        {
            let stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(why) = stopped.values().next() {
                return Err(match stopped.len() {
                    1 => why.clone(),
                    n => format!("{n} partitions set aside; the first: {why}"),
                });
            }
        }
        {
            let recovering = self
                .recovering
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(why) = recovering.values().next() {
                return Err(why.clone());
            }
        }
        let stalled = self.liveness.since_poll();
        if stalled > bound {
            return Err(format!(
                "the consumer has not polled Kafka for {:.0} s (the sink holds every in-flight record; {key} = {})",
                stalled.as_secs_f64(),
                bound.as_millis()
            ));
        }
        let mut lagging: Vec<_> = self
            .ledger()
            .lag(Instant::now())
            .into_iter()
            .filter(|(_, _, seconds)| *seconds > bound.as_secs_f64())
            .collect();
        lagging.sort_by(|a, b| b.2.total_cmp(&a.2));
        if let Some((tp, records, seconds)) = lagging.first() {
            return Err(format!(
                "{} partition(s) applied but not committed to Kafka for longer than {key} = {} ms; the oldest: {tp}, {records} records for {seconds:.0} s",
                lagging.len(),
                bound.as_millis()
            ));
        }
        Ok(())
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, CommitLedger> {
        self.positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the runner because of `e`; the first fatal error wins.
    pub(crate) fn fail(&self, e: SinkError) {
        self.stop_with(RunnerError::Sink(e));
    }

    /// Stops the runner because a task of the worker of `tp`
    /// ended abnormally (see [`Shared::worker_panicked`]).
    pub(crate) fn worker_died(&self, tp: &TopicPartition, stage: &str, e: JoinError) {
        match e.try_into_panic() {
            Ok(panic) => self.worker_panicked(tp, stage, &*panic),
            Err(e) => self.worker_stopped(tp, format!("was cancelled while {stage} ({e})")),
        }
    }

    /// Stops the runner because the worker of `tp` panicked
    /// (a bug in decoding or in the sink). The partition cannot go on without
    /// its worker, and no record of it may be dropped: the runner stops with
    /// an error naming the partition and the panic, so the process exits
    /// non-zero and a restart resumes the partition from its committed
    /// position (nothing past what was applied is committed).
    pub(crate) fn worker_panicked(
        &self,
        tp: &TopicPartition,
        stage: &str,
        panic: &(dyn Any + Send),
    ) {
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        self.worker_stopped(tp, format!("panicked while {stage}: {message}"));
    }

    /// Stops the runner because the worker of `tp` ended: `why`.
    pub(crate) fn worker_stopped(&self, tp: &TopicPartition, why: String) {
        self.stop_with(RunnerError::Internal(format!(
            "the worker of partition {tp} {why}; stopping so that a restart resumes the partition from its committed position"
        )));
    }

    fn stop_with(&self, e: RunnerError) {
        tracing::error!("stopping: {e:#}");
        let mut fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
        fatal.get_or_insert(e);
        self.stop.cancel();
    }

    pub(crate) fn take_fatal(&self) -> Option<RunnerError> {
        self.fatal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_commit_stays_pending_until_kafka_acknowledges_it() {
        let mut ledger = CommitLedger::default();
        let t0 = Instant::now();
        let tp = TopicPartition::new("cdc.public.t", 2);
        ledger.assigned(tp.clone(), 2_000);
        assert!(ledger.pending().is_empty(), "the start is not owed");
        ledger.applied(tp.clone(), 2_591, t0);
        assert_eq!(ledger.lag(t0), vec![(tp.clone(), 591, 0.0)]);
        assert_eq!(ledger.pending().get(&tp), Some(&2_591));
        ledger.committed(&tp, 2_591);
        assert!(ledger.pending().is_empty());
        // More is applied, then the partition goes idle; the commit of it is
        // refused (no acknowledgement): it is still pending, on every later
        // round, however long the partition stays idle.
        ledger.applied(tp.clone(), 4_986, t0 + Duration::from_secs(1));
        for _ in 0..3 {
            assert_eq!(ledger.pending().get(&tp), Some(&4_986));
        }
        let lag = ledger.lag(t0 + Duration::from_secs(61));
        assert_eq!(lag, vec![(tp.clone(), 2_395, 60.0)]);
        // An older acknowledgement arriving late does not move it back.
        ledger.committed(&tp, 4_986);
        ledger.committed(&tp, 2_591);
        assert!(ledger.pending().is_empty());
        assert_eq!(
            ledger.lag(t0 + Duration::from_secs(70)),
            vec![(tp.clone(), 0, 0.0)]
        );
        // A revoked partition leaves with its applied position.
        ledger.applied(tp.clone(), 5_000, t0);
        assert_eq!(
            ledger.take(std::slice::from_ref(&tp)).get(&tp),
            Some(&5_000)
        );
        assert!(ledger.pending().is_empty());
        // Acknowledgements for partitions no longer owned are ignored.
        ledger.committed(&tp, 6_000);
        assert!(ledger.lag(t0).is_empty());
    }

    #[test]
    fn heartbeats_offsets_dlq_and_configured_topics_are_ignored() {
        let mut config = RunnerConfig::new("k:9092", "g", vec!["cdc.public.t".into()]);
        config.dlq_topic = Some("dead".into());
        config.ignore_topics.push("audit\\..*".into());
        let filter = TopicFilter::new(&config).expect("valid");
        assert!(filter.is_ignored("__debezium-heartbeat.cdc"));
        assert!(filter.is_ignored("oncely-offsets"));
        assert!(filter.is_ignored("oncely-offsets-shop"));
        assert!(filter.is_ignored("shop.schema-changes"));
        assert!(!filter.is_ignored("shop.public.schema_changes"));
        assert!(filter.is_ignored("dead"));
        assert!(filter.is_ignored("audit.log"));
        assert!(!filter.is_ignored("cdc.public.t"));
        assert!(
            !filter.is_ignored("xoncely-offsets-2"),
            "patterns match whole names"
        );
        assert!(!filter.is_ignored("xaudit.log"));
    }
}
