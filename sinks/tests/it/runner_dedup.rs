//! `[dedup]` in the runner, in-process against the real Kafka and Redis of
//! `scripts/services`: identities from a Kafka header (`identity.header`),
//! a change without the header dead-lettered (never skipped silently), a
//! replay from older offsets applying nothing again, and the applied and
//! skipped counters each counting only their own records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::Secret;
use oncely_sinks::metrics::Metrics;
use oncely_sinks::runner::dedup::{DedupConfig, DedupStore};
use oncely_sinks::runner::{HEADER_ERROR, HEADER_OFFSET};
use oncely_sinks::{Batch, Runner, RunnerConfig, Sink, SinkError};
use oncely_testkit::kafka::*;
use tokio_util::sync::CancellationToken;

const HEADER: &str = "event-id";

/// Records each applied record as (offset, identity header).
#[derive(Default)]
struct Recording {
    seen: Mutex<Vec<(i64, String)>>,
}

#[async_trait]
impl Sink for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let mut seen = self.seen.lock().expect("lock");
        for r in batch.records() {
            let id = String::from_utf8_lossy(r.identity_header().unwrap_or_default());
            seen.push((r.offset, id.into_owned()));
        }
        Ok(())
    }
}

fn redis_url() -> String {
    match std::env::var("ONCELY_REDIS_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_REDIS_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

fn config(topic: &str, group: &str, dlq: &str, prefix: &str) -> RunnerConfig {
    let mut c = RunnerConfig::new(brokers(), group, vec![topic.to_owned()]);
    c.batch_max_records = 3;
    c.batch_max_ms = 5;
    c.retry_backoff_ms = 10;
    c.retry_backoff_max_ms = 50;
    c.dlq_topic = Some(dlq.to_owned());
    c.dedup = Some(DedupConfig {
        store: DedupStore::Redis,
        redis_url: Some(Secret::new(redis_url())),
        redis_key_prefix: Some(prefix.to_owned()),
        identity_header: Some(HEADER.to_owned()),
        ..Default::default()
    });
    c
}

/// Runs a runner over `topic` until it committed `end`, then stops it; returns its metrics.
async fn run_to(config: RunnerConfig, sink: Arc<Recording>, end: i64) -> Metrics {
    let (topic, group) = (config.topics[0].clone(), config.group_id.clone());
    let stop = CancellationToken::new();
    let runner = Runner::new(config, sink).expect("valid config");
    let metrics = runner.metrics().clone();
    let task = tokio::spawn(runner.run(stop.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while committed(&group, &topic, 1).await != vec![end] {
        if std::time::Instant::now() > deadline {
            stop.cancel();
            panic!("{group} never committed offset {end}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    task.await.expect("join").expect("runner ends cleanly");
    metrics
}

fn counts(m: &Metrics, topic: &str) -> (u64, u64) {
    (
        m.events_applied
            .with_label_values(&["recording", topic])
            .get(),
        m.dedup_skipped
            .with_label_values(&["recording", topic])
            .get(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_identity_is_applied_once_across_republishing_and_replays() {
    let (topic, dlq) = (unique("dedup_hdr"), unique("dedup_hdr_dlq"));
    let prefix = format!("oncely:test:{}:", unique("hdr"));
    create_topic(&topic, 1).await;
    let out = |id: u64, lsn: u64| Out {
        key: Some(key(id)),
        value: Some(envelope(id, lsn, 0, lsn)),
        partition: Some(0),
    };
    let records = [
        out(1, 100),
        out(2, 101),
        out(3, 102),
        out(1, 103),
        out(4, 104),
    ];
    let headers: [&[(&str, &str)]; 5] = [
        &[(HEADER, "e-1")],
        &[("other", "x"), (HEADER, "e-2")],
        &[("other", "no identity")], // a change without the header: a dead letter
        &[(HEADER, "e-1")],          // the same event published again: skipped
        &[(HEADER, "e-3")],
    ];
    let headed: Vec<_> = records.iter().zip(headers).collect();
    produce_headed(&topic, &headed).await;

    let first = Arc::new(Recording::default());
    let metrics = run_to(
        config(&topic, &unique("g"), &dlq, &prefix),
        first.clone(),
        5,
    )
    .await;
    assert_eq!(
        *first.seen.lock().expect("lock"),
        [(0, "e-1".into()), (1, "e-2".into()), (4, "e-3".into())]
    );
    assert_eq!(counts(&metrics, &topic), (3, 1), "(applied, skipped)");
    let letters = read_topic(&dlq, 1, 1).await;
    assert_eq!(letters.len(), 1, "only the change without the header");
    assert_eq!(header(&letters[0], HEADER_OFFSET).as_deref(), Some("2"));
    let reason = header(&letters[0], HEADER_ERROR).expect("reason");
    assert!(reason.contains("no `event-id` header"), "{reason}");

    // A restart from older offsets (a new group from the start): the Redis
    // window holds every identity, nothing is applied again.
    let replay = Arc::new(Recording::default());
    let metrics = run_to(
        config(&topic, &unique("g"), &dlq, &prefix),
        replay.clone(),
        5,
    )
    .await;
    assert_eq!(*replay.seen.lock().expect("lock"), []);
    assert_eq!(counts(&metrics, &topic), (0, 4), "(applied, skipped)");
}

/// A Debezium snapshot row of `public.t` (no `commit_lsn`): every row of one
/// snapshot carries the same `source.lsn` and `source.sequence`.
fn debezium_row(id: u64, snapshot: &str, lsn: u64) -> Out {
    let value = serde_json::json!({
        "before": null,
        "after": {"id": id, "v": id},
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz",
            "snapshot": snapshot, "db": "d", "sequence": format!("[null,\"{lsn}\"]"),
            "schema": "public", "table": "t", "txId": 7, "lsn": lsn},
        "op": "r",
        "ts_ms": 1
    });
    Out {
        key: Some(key(id)),
        value: Some(value.to_string().into_bytes()),
        partition: Some(0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_a_debezium_snapshot_passes_the_position_window_once() {
    let (topic, dlq) = (unique("dedup_dbz"), unique("dedup_dbz_dlq"));
    let prefix = format!("oncely:test:{}:", unique("dbz"));
    create_topic(&topic, 1).await;
    let rows: Vec<Out> = (1..=6)
        .map(|id| debezium_row(id, if id == 1 { "first" } else { "true" }, 500))
        .collect();
    produce(&topic, &rows).await;
    let window = |c: &mut RunnerConfig| {
        // Schemas off, as Debezium's JSON converter may be set.
        c.debezium_schemaless_accept = true;
        if let Some(d) = c.dedup.as_mut() {
            d.identity_header = None;
        }
    };

    let first = Arc::new(Recording::default());
    let mut c = config(&topic, &unique("g"), &dlq, &prefix);
    window(&mut c);
    let metrics = run_to(c, first.clone(), 6).await;
    let applied: Vec<i64> = first
        .seen
        .lock()
        .expect("lock")
        .iter()
        .map(|s| s.0)
        .collect();
    assert_eq!(applied, [0, 1, 2, 3, 4, 5], "every snapshot row");
    assert_eq!(counts(&metrics, &topic), (6, 0), "(applied, skipped)");

    // The same records read again by a new group: each is a repeat of itself.
    let replay = Arc::new(Recording::default());
    let mut c = config(&topic, &unique("g"), &dlq, &prefix);
    window(&mut c);
    let metrics = run_to(c, replay.clone(), 6).await;
    assert_eq!(*replay.seen.lock().expect("lock"), []);
    assert_eq!(counts(&metrics, &topic), (0, 6), "(applied, skipped)");
}
