//! The consumer runner: reads change topics and feeds a [`Sink`] so that the
//! target ends up effectively-once.
//!
//! # Guarantees
//!
//! * Reads with `isolation.level=read_committed`: aborted capture transactions are never seen.
//! * Per-partition order: batches of a partition are applied one after another, in offset order.
//! * A partition's worker gets each offset once, also when librdkafka delivers
//!   a record again after a rebalance paused the partition (see
//!   `RunnerContext::admit` in `context.rs`).
//! * Nothing is acknowledged before it is applied: a Kafka offset is committed,
//!   and a sink stores a position, only after the batch up to it returned `Ok`
//!   (and its rejected records were written to the dead-letter topic).
//! * With a position-owning sink, each record is applied exactly once: partitions
//!   start at the sink's stored positions; Kafka commits serve lag monitoring only.
//!   Otherwise each record is applied at least once, the duplicates after a crash
//!   being exactly the records applied but not yet committed to Kafka.
//! * With `[dedup]` (see [`dedup`]), a sink that does not own its positions
//!   sits behind a window of applied identities: a redelivered record whose
//!   identity the window holds is skipped; only the batches in flight at a
//!   crash can repeat.
//!
//! # Threads and memory
//!
//! One blocking thread polls the consumer and serves rebalances (where it may
//! block: committed-offset and watermark requests, the sink's
//! `load_positions`/`assigned`, synchronous commits). Every partition has a
//! worker task fed by a bounded channel. Every record read holds a share of
//! `max.inflight.bytes` until its batch is done; when the budget is spent the
//! poll thread waits — if that lasts longer than `max.poll.interval.ms`, the
//! consumer leaves the group and rejoins afterwards (its partitions are then
//! treated as lost).
//!
//! # Shutdown
//!
//! [`Runner::run`] returns when its token fires (or a fatal error occurs): each
//! worker finishes the batch it holds (a batch waiting to retry is abandoned),
//! positions are committed synchronously, [`Sink::shutdown`] runs, and the
//! consumer leaves the group. Records read but not yet batched are dropped and
//! read again by the next owner.

mod context;
mod decoder;
pub mod dedup;
pub(crate) mod dlq;
mod gap;
mod headers;
#[cfg(test)]
mod memory;
mod ownership;
mod shared;
mod snapshot_signals;
mod worker;
#[cfg(test)]
mod worker_tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientConfig;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use self::context::{Admit, RunnerContext};
use self::decoder::Incoming;
use self::dlq::DeadLetters;
use self::headers::Payloads;
use self::shared::{Shared, TopicFilter};
use crate::config::{GapRecovery, RunnerConfig};
use crate::error::RunnerError;
use crate::metrics::Metrics;
use crate::sink::{Sink, TopicPartition};

pub use self::dlq::{
    HEADER_ERROR, HEADER_KEY_OMITTED, HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC,
    HEADER_VALUE_OMITTED,
};
pub use self::snapshot_signals::{SnapshotRequest, SnapshotSignals};

/// How often applied positions are committed to Kafka (asynchronously) while running.
const COMMIT_INTERVAL: Duration = Duration::from_millis(200);
/// How often pending commits are checked against what Kafka holds.
const COMMIT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long that check may take.
const COMMIT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one consumer poll may block.
const POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// librdkafka statistics interval when metrics are served (feeds the lag gauge).
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Commits `positions` to Kafka; failures are logged (the next commit supersedes them).
pub(crate) fn commit(
    consumer: &BaseConsumer<RunnerContext>,
    positions: &HashMap<TopicPartition, i64>,
    mode: CommitMode,
) {
    if positions.is_empty() {
        return;
    }
    // Configured as `return(<group.id>)`: only that group's commits fail, so
    // tests in one process do not disturb each other.
    #[cfg(feature = "failpoints")]
    if fail::eval("sink-offset-commit", |group| group)
        .is_some_and(|group| group.as_deref() == Some(&*consumer.context().shared().group))
    {
        let refused = rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::error::RDKafkaErrorCode::IllegalGeneration,
        );
        return consumer.context().commit_failed(&refused);
    }
    let mut tpl = TopicPartitionList::new();
    for (tp, offset) in positions {
        if let Err(e) = tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*offset)) {
            tracing::warn!(%tp, "cannot commit offset {offset}: {e}");
        }
    }
    match consumer.commit(&tpl, mode) {
        Err(e) => consumer.context().commit_failed(&e),
        // A synchronous commit returns Kafka's answer; an asynchronous one's is
        // not delivered to us (librdkafka reports it only to a native
        // callback), so [`confirm_commits`] reads it back.
        Ok(()) if matches!(mode, CommitMode::Sync) => {
            for (tp, offset) in positions {
                consumer.context().shared().committed(tp, *offset);
            }
        }
        Ok(()) => {}
    }
}

/// Reads Kafka's committed offsets of the partitions with pending positions
/// and marks what it holds as committed (one request, only when something is
/// pending). An asynchronous commit that Kafka refused leaves its partition
/// pending, so the next periodic commit sends it again.
fn confirm_commits(consumer: &BaseConsumer<RunnerContext>, shared: &Shared) {
    let pending = shared.pending_positions();
    if pending.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for tp in pending.keys() {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    match consumer.committed_offsets(tpl, COMMIT_CHECK_TIMEOUT) {
        Ok(list) => {
            for e in list.elements() {
                let tp = TopicPartition::new(e.topic(), e.partition());
                if let (Offset::Offset(n), Some(applied)) = (e.offset(), pending.get(&tp)) {
                    // Never past what this runner applied (another member's
                    // commit must not make ours look ahead).
                    shared.committed(&tp, n.min(*applied));
                }
            }
        }
        Err(e) => tracing::debug!("cannot read committed offsets to confirm commits: {e}"),
    }
}

/// Runs a [`Sink`] against Kafka topics (see the module docs for the guarantees).
pub struct Runner {
    config: RunnerConfig,
    sink: Arc<dyn Sink>,
    metrics: Metrics,
    signals: Option<Arc<dyn SnapshotSignals>>,
}

impl Runner {
    /// Validates `config` and prepares a runner for `sink`.
    pub fn new(config: RunnerConfig, sink: Arc<dyn Sink>) -> Result<Self, RunnerError> {
        config.validate()?;
        let metrics =
            Metrics::new().map_err(|e| RunnerError::Internal(format!("metrics registry: {e}")))?;
        Ok(Self {
            config,
            sink,
            metrics,
            signals: None,
        })
    }

    /// What requests the recovery snapshots of `gap.recovery = "snapshot"`
    /// (required with it, see [`SnapshotSignals`]).
    pub fn with_snapshot_signals(mut self, signals: Arc<dyn SnapshotSignals>) -> Self {
        self.signals = Some(signals);
        self
    }

    /// The runner's metrics (e.g. to register a sink's own metrics beside them).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs until SIGTERM or SIGINT, then shuts down gracefully (see the module docs).
    pub async fn run_until_signal(self) -> Result<(), RunnerError> {
        let stop = CancellationToken::new();
        let signals = oncely_core::shutdown::cancel_on_signal(stop.clone())
            .map_err(|e| tracing::warn!("cannot listen for SIGTERM and SIGINT: {e}"))
            .ok();
        let result = self.run(stop).await;
        if let Some(signals) = signals {
            signals.abort();
        }
        result
    }

    /// Runs until `stop` fires or a fatal error occurs.
    pub async fn run(self, stop: CancellationToken) -> Result<(), RunnerError> {
        let Self {
            config,
            sink,
            metrics,
            signals,
        } = self;
        if config.gap_recovery == GapRecovery::Snapshot && signals.is_none() {
            return Err(RunnerError::Config(crate::ConfigError::new(
                "gap.recovery",
                "\"snapshot\" needs what requests the snapshot: set gap.capture.config (oncely sink), or call Runner::with_snapshot_signals",
            )));
        }
        let listener = match config.metrics_addr()? {
            Some(addr) => Some(
                oncely_core::endpoint::bind(addr, "metrics.listen")
                    .await
                    .map_err(|e| RunnerError::Io {
                        context: format!("cannot listen on {addr} (set by `metrics.listen`)"),
                        source: e.source,
                    })?,
            ),
            None => None,
        };
        let sink = match &config.dedup {
            Some(dedup) => {
                let skipped = metrics.dedup_skipped.clone();
                self::dedup::wrap(sink, dedup, &config.group_id, skipped)
                    .await
                    .map_err(RunnerError::Sink)?
            }
            None => sink,
        };
        let base = client_config(&config);
        let dlq = match &config.dlq_topic {
            Some(topic) => Some(Arc::new(DeadLetters::new(&base, topic.clone())?)),
            None => None,
        };
        let budget_total = u32::try_from(config.max_inflight_bytes).unwrap_or(u32::MAX);
        let registry = match config.registry_access()? {
            Some(access) => Some(
                oncely_core::avro::registry::RegistryClient::connect(&access).map_err(|e| {
                    oncely_core::ConfigError::new("schema.registry.url", e.to_string())
                })?,
            ),
            None => None,
        };
        let shared = Arc::new(Shared {
            registry,
            group: Arc::from(config.group_id.as_str()),
            filter: TopicFilter::new(&config)?,
            budget: Arc::new(Semaphore::new(budget_total as usize)),
            budget_total,
            config,
            sink: sink.clone(),
            metrics,
            dlq,
            handle: Handle::current(),
            stop,
            fatal: Mutex::new(None),
            positions: Mutex::new(Default::default()),
            stopped: Mutex::new(Default::default()),
            signals,
            recovering: Mutex::new(Default::default()),
            liveness: shared::Liveness::new(),
        });
        let metrics_stop = CancellationToken::new();
        let server = listener.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("metrics at http://{addr}/metrics, health at /healthz and /readyz");
            }
            tokio::spawn(oncely_core::endpoint::serve(
                listener,
                Arc::new(Probe(shared.clone())),
                metrics_stop.clone(),
            ))
        });
        let poll_shared = shared.clone();
        let polled = tokio::task::spawn_blocking(move || consume(base, poll_shared)).await;
        let shutdown = sink.shutdown().await;
        metrics_stop.cancel();
        if let Some(server) = server {
            let _ = server.await;
        }
        polled.map_err(|e| RunnerError::Internal(format!("poll thread: {e}")))??;
        if let Some(e) = shared.take_fatal() {
            return Err(e);
        }
        shutdown.map_err(RunnerError::Sink)
    }
}

/// What the listener serves: the runner's metrics and readiness.
struct Probe(Arc<Shared>);

impl oncely_core::endpoint::Probe for Probe {
    fn metrics(&self) -> Vec<u8> {
        self.0.metrics.render().into_bytes()
    }

    fn ready(&self) -> Result<(), String> {
        self.0.readiness()
    }
}

/// Client properties shared by the consumer and the dead-letter producer.
fn client_config(config: &RunnerConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers);
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    if config.metrics_listen.is_some() {
        c.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    c
}

/// The poll thread: subscribe, dispatch records to workers, commit, and stop cleanly.
fn consume(base: ClientConfig, shared: Arc<Shared>) -> Result<(), RunnerError> {
    let mut config = base;
    config
        .set("group.id", &shared.config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.partition.eof", "false")
        // Start offsets are resolved here (`auto.offset.reset` only for
        // partitions without a position); librdkafka must never move a
        // partition past records retention deleted under it: it reports
        // the partition instead, and the poll loop stops it (a gap).
        .set("auto.offset.reset", "error");
    // librdkafka notices topics created after subscribing (capture creates them on
    // first use) only at its metadata refresh, 5 minutes by default: a sink started
    // before capture would sit idle that long. 10 s unless the user chose.
    if config.get("topic.metadata.refresh.interval.ms").is_none() {
        config.set("topic.metadata.refresh.interval.ms", "10000");
    }
    let consumer: BaseConsumer<RunnerContext> = config
        .create_with_context(RunnerContext::new(shared.clone()))
        .map_err(|e| RunnerError::kafka("create the consumer", e))?;
    let mut subscription: Vec<String> = shared.config.topics.clone();
    if let Some(re) = &shared.config.topics_regex {
        subscription.push(if re.starts_with('^') {
            re.clone()
        } else {
            format!("^{re}")
        });
    }
    let topics: Vec<&str> = subscription.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| RunnerError::kafka("subscribe", e))?;
    tracing::info!(group = %shared.group, ?topics, sink = shared.sink.name(), "consuming");
    let mut last_commit = Instant::now();
    let mut last_check = Instant::now();
    // Only a static member can rejoin with an assignment missing a topic.
    let mut ownership = shared
        .config
        .kafka
        .contains_key("group.instance.id")
        .then(ownership::OwnershipCheck::new);
    let identity_header = shared
        .config
        .dedup
        .as_ref()
        .and_then(|d| d.identity_header.as_deref());
    #[cfg(feature = "failpoints")]
    let mut rewound = false;
    while !shared.stop.is_cancelled() {
        shared.liveness.polled();
        match consumer.poll(POLL_TIMEOUT) {
            None => {}
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
            ))) => consumer.context().stop_gapped(&consumer),
            Some(Err(e)) => tracing::warn!("consumer: {e}"),
            Some(Ok(message)) => {
                let (topic, partition, offset) = (
                    message.topic().to_owned(),
                    message.partition(),
                    message.offset(),
                );
                let incoming = Payloads::of(&message, identity_header);
                let timestamp_ms = message.timestamp().to_millis();
                drop(message);
                dispatch(
                    &consumer,
                    &shared,
                    (&topic, partition, offset),
                    (incoming, timestamp_ms),
                );
                #[cfg(feature = "failpoints")]
                rewind_once(
                    &consumer,
                    &shared,
                    (&topic, partition, offset),
                    &mut rewound,
                );
            }
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL {
            // Positions stay pending until Kafka is seen to hold them, so a
            // refused commit is sent again next time, idle partition or not.
            commit(&consumer, &shared.pending_positions(), CommitMode::Async);
            last_commit = Instant::now();
        }
        if last_check.elapsed() >= COMMIT_CHECK_INTERVAL {
            confirm_commits(&consumer, &shared);
            shared.publish_commit_lag();
            last_check = Instant::now();
        }
        if let Some(check) = ownership.as_mut() {
            check.tick(&consumer, &shared, &topics);
        }
    }
    let context = consumer.context().clone();
    let all = context.assigned();
    context.stop_workers(&all, false);
    let mut positions = shared.pending_positions();
    positions.extend(shared.take_positions(&all));
    commit(&consumer, &positions, CommitMode::Sync);
    consumer.unsubscribe();
    tracing::info!("consumer stopped");
    Ok(())
}

/// Failpoint `sink-fetch-rewind`, configured as `return(<group.id>)`: once
/// per runner, moves the fetch position of the partition of the record just
/// handed to its worker back to that record, so Kafka delivers it again —
/// what librdkafka does when an incremental rebalance pauses the partition
/// while the poll thread holds a record whose application position is not
/// stored yet (see [`dispatch`]).
#[cfg(feature = "failpoints")]
fn rewind_once(
    consumer: &BaseConsumer<RunnerContext>,
    shared: &Shared,
    (topic, partition, offset): (&str, i32, i64),
    rewound: &mut bool,
) {
    if *rewound {
        return;
    }
    let armed = fail::eval("sink-fetch-rewind", |group| group)
        .is_some_and(|group| group.as_deref() == Some(&*shared.group));
    if !armed {
        return;
    }
    *rewound = true;
    tracing::warn!(
        topic,
        partition,
        offset,
        "failpoint sink-fetch-rewind: fetching the record again"
    );
    match consumer.seek(topic, partition, Offset::Offset(offset), POLL_TIMEOUT) {
        // For the test to see that the rewind happened (`fail::cfg_callback`).
        Ok(()) => fail::fail_point!("sink-fetch-rewound"),
        Err(e) => tracing::warn!("failpoint sink-fetch-rewind: cannot seek: {e}"),
    }
}

/// Hands one record to its partition's worker, waiting for byte budget and channel space.
fn dispatch(
    consumer: &BaseConsumer<RunnerContext>,
    shared: &Shared,
    (topic, partition, offset): (&str, i32, i64),
    (payloads, timestamp_ms): (Payloads, Option<i64>),
) {
    if shared.filter.is_ignored(topic) {
        shared.record_progress(topic, partition, offset + 1);
        return;
    }
    let tx = match consumer.context().admit(topic, partition, offset) {
        Admit::Send(tx) => tx,
        Admit::Again { next } => {
            shared
                .metrics
                .redeliveries_dropped
                .with_label_values(&[topic])
                .inc();
            // Seen around rebalances (see `RunnerContext::admit`): at most a
            // few records each time, so rate-limited.
            static AGAIN: oncely_core::log_limit::LogLimit =
                oncely_core::log_limit::LogLimit::new(Duration::from_secs(10), 3);
            if let Some(suppressed) = AGAIN.admit() {
                tracing::warn!(
                    topic,
                    partition,
                    offset,
                    next,
                    suppressed,
                    "record delivered again by the consumer, dropped: its partition's worker had it already (at most 3 such lines per 10 s; `suppressed` counts those not logged)"
                );
            }
            return;
        }
        Admit::Unassigned => {
            tracing::debug!(
                topic,
                partition,
                offset,
                "record of a partition without a worker, dropped"
            );
            return;
        }
    };
    let size = payloads.size();
    let permits = u32::try_from(size)
        .unwrap_or(u32::MAX)
        .clamp(1, shared.budget_total);
    let permit = loop {
        if shared.stop.is_cancelled() {
            return;
        }
        match shared.budget.clone().try_acquire_many_owned(permits) {
            Ok(p) => break p,
            Err(_) => {
                let wait = tokio::time::timeout(
                    POLL_TIMEOUT,
                    shared.budget.clone().acquire_many_owned(permits),
                );
                if let Ok(Ok(p)) = shared.handle.block_on(wait) {
                    break p;
                }
            }
        }
    };
    let mut incoming = Incoming {
        offset,
        timestamp_ms,
        key: payloads.key,
        value: payloads.value,
        tombstone: payloads.tombstone,
        identity_header: payloads.identity_header,
        _permit: permit,
    };
    loop {
        match tx.try_send(incoming) {
            Ok(()) => return,
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                // A worker ends only when told to (after it left the map) or
                // after stopping the runner; anything else is a bug, and
                // dropping the record would skip it: stop instead. A
                // quarantined partition's worker ended on purpose: its
                // records are read again when the sink starts after the fix.
                let tp = TopicPartition::new(topic, partition);
                if !shared.stop.is_cancelled() && !shared.is_set_aside(&tp) {
                    let why =
                        format!("ended while assigned (record at offset {offset} not delivered)");
                    shared.worker_stopped(&tp, why);
                }
                return;
            }
            Err(tokio::sync::mpsc::error::TrySendError::Full(back)) => {
                if shared.stop.is_cancelled() {
                    return;
                }
                incoming = back;
                let wait = tokio::time::timeout(POLL_TIMEOUT, tx.reserve());
                if let Ok(Ok(slot)) = shared.handle.block_on(wait) {
                    slot.send(incoming);
                    return;
                }
            }
        }
    }
}
