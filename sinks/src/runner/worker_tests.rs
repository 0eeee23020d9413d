//! A partition worker driven without Kafka: records go in through its
//! channel, a [`MemorySink`] takes the batches, and the shared state shows
//! the position reached and any fatal error.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::decoder::Incoming;
use super::memory::MemorySink;
use super::shared::{Liveness, Shared, TopicFilter};
use super::worker::{Control, Worker};
use crate::config::RunnerConfig;
use crate::error::SinkError;
use crate::metrics::Metrics;
use crate::sink::{Batch, Sink, TopicPartition};

const TOPIC: &str = "cdc.public.t";

pub(super) fn shared(sink: Arc<dyn Sink>) -> Arc<Shared> {
    let mut config = RunnerConfig::new("unused:9092", "g", vec![TOPIC.into()]);
    config.retry_backoff_ms = 1;
    config.retry_backoff_max_ms = 2;
    config.batch_max_records = 3;
    config.debezium_schemaless_accept = true;
    let budget_total = 1 << 20;
    Arc::new(Shared {
        group: Arc::from("g"),
        filter: TopicFilter::new(&config).expect("filter"),
        budget: Arc::new(Semaphore::new(budget_total as usize)),
        budget_total,
        config,
        sink,
        metrics: Metrics::new().expect("metrics"),
        dlq: None,
        handle: Handle::current(),
        stop: CancellationToken::new(),
        fatal: Mutex::new(None),
        positions: Mutex::new(Default::default()),
        stopped: Mutex::new(Default::default()),
        signals: None,
        recovering: Mutex::new(Default::default()),
        liveness: Liveness::new(),
        registry: None,
    })
}

fn change(shared: &Shared, offset: i64) -> Incoming {
    let value = json!({
        "before": null,
        "after": {"id": offset},
        "source": {"commit_lsn": 100 + offset, "event_seq": 0, "schema": "public", "table": "t"},
        "op": "c",
    });
    incoming(shared, offset, Some(value.to_string().into_bytes()))
}

fn incoming(shared: &Shared, offset: i64, value: Option<Vec<u8>>) -> Incoming {
    Incoming {
        offset,
        timestamp_ms: None,
        key: Some(json!({"id": offset}).to_string().into_bytes()),
        value,
        tombstone: None,
        identity_header: None,
        _permit: shared.budget.clone().try_acquire_owned().expect("budget"),
    }
}

/// Runs a worker over `records` (offsets 10, 11, ...) until its channel
/// closes; returns the position the partition reached, if any.
async fn run(shared: &Arc<Shared>, records: Vec<Incoming>) -> Option<i64> {
    let tp = TopicPartition::new(TOPIC, 0);
    shared.assigned(&tp, 10);
    let (tx, rx) = mpsc::channel(records.len().max(1));
    for r in records {
        tx.send(r).await.expect("send");
    }
    drop(tx);
    let control = Control {
        stop: CancellationToken::new(),
        abandon: CancellationToken::new(),
    };
    Worker::new(shared.clone(), (Arc::from(TOPIC), 0), rx, control)
        .run()
        .await;
    shared.pending_positions().get(&tp).copied()
}

#[tokio::test]
async fn batches_are_applied_in_order_once_and_the_position_follows() {
    let sink = Arc::new(MemorySink::default());
    let shared = shared(sink.clone());
    let records = (10..17).map(|o| change(&shared, o)).collect();
    let reached = run(&shared, records).await;
    assert_eq!(sink.applied(), (10..17).collect::<Vec<_>>());
    assert!(
        sink.calls().iter().all(|c| c.len() <= 3),
        "batch.max.records: {:?}",
        sink.calls()
    );
    assert_eq!(reached, Some(17), "the next offset after the last applied");
    assert!(shared.take_fatal().is_none());
}

#[tokio::test]
async fn transient_failures_are_retried_until_the_batch_is_applied() {
    let sink = Arc::new(MemorySink::default());
    sink.fail_next(2);
    let shared = shared(sink.clone());
    let records = (10..13).map(|o| change(&shared, o)).collect();
    let reached = run(&shared, records).await;
    assert_eq!(
        sink.calls(),
        vec![vec![10, 11, 12]; 3],
        "two failures, then applied"
    );
    assert_eq!(sink.applied(), vec![10, 11, 12]);
    assert_eq!(reached, Some(13));
    let retries = shared.metrics.retries.with_label_values(&["memory"]).get();
    assert_eq!(retries, 2);
}

/// Without `errors.deadletterqueue.topic.name` a record the sink refuses
/// stops the runner, and the partition's position stays before it, so a
/// restart reads it again instead of skipping it.
#[tokio::test]
async fn a_rejected_record_without_a_dead_letter_topic_is_fatal_and_not_skipped() {
    let sink = Arc::new(MemorySink::default());
    sink.reject(14);
    let shared = shared(sink.clone());
    let records = (10..17).map(|o| change(&shared, o)).collect();
    let reached = run(&shared, records).await;
    assert_eq!(sink.applied(), vec![10, 11, 12], "the batch before it only");
    assert_eq!(reached, Some(13), "not past the refused record's batch");
    let fatal = shared.take_fatal().expect("the runner must stop");
    let told = fatal.to_string();
    assert!(
        told.contains("errors.deadletterqueue.topic.name") && told.contains("@14"),
        "{told}"
    );
}

/// A record that is not an event at all is a dead letter before its batch
/// is applied: without a dead-letter topic nothing of that batch is applied.
#[tokio::test]
async fn an_undecodable_record_without_a_dead_letter_topic_is_fatal_before_its_batch() {
    let sink = Arc::new(MemorySink::default());
    let shared = shared(sink.clone());
    let mut records: Vec<Incoming> = (10..13).map(|o| change(&shared, o)).collect();
    records.push(incoming(&shared, 13, Some(b"not json".to_vec())));
    records.push(change(&shared, 14));
    let reached = run(&shared, records).await;
    assert_eq!(sink.applied(), vec![10, 11, 12]);
    assert_eq!(reached, Some(13));
    assert!(shared.take_fatal().is_some());
}

/// A sink that panics while applying: the worker ends, the runner is told to
/// stop with an error naming the partition and the panic, and the position
/// stays before the batch (a restart reads it again).
#[tokio::test]
async fn a_panic_while_applying_stops_the_runner_naming_the_partition() {
    struct Panicking;
    #[async_trait::async_trait]
    impl Sink for Panicking {
        fn name(&self) -> &str {
            "panicking"
        }
        async fn apply(&self, _: &Batch) -> Result<(), SinkError> {
            panic!("a bug in the sink")
        }
    }
    let shared = shared(Arc::new(Panicking));
    let records = (10..13).map(|o| change(&shared, o)).collect();
    let reached = run(&shared, records).await;
    assert_eq!(reached, None, "nothing applied, nothing owed to Kafka");
    assert!(shared.stop.is_cancelled(), "the runner stops");
    let told = shared
        .take_fatal()
        .expect("the runner must fail")
        .to_string();
    assert!(
        told.contains("cdc.public.t[0]") && told.contains("a bug in the sink"),
        "{told}"
    );
}
