//! Dedup windows against the real Redis and Kafka of `scripts/services`,
//! and how a memory window is rebuilt after a restart: by re-reading the
//! records just before the start offset ([`read_before`]) and remembering
//! each record's identity.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oncely_dedup::{MemoryWindow, RedisWindow, Seen, WindowStore};
use oncely_sinks::event::{decode_key, decode_value};
use oncely_sinks::{Record, TopicPartition};
use oncely_testkit::kafka::{brokers, create_topic, envelope, key, produce, unique, Out};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientConfig;

fn redis_url() -> String {
    match std::env::var("ONCELY_REDIS_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_REDIS_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

#[tokio::test]
async fn memory_window_suppresses_duplicates_inside_and_forgets_outside() {
    let w = MemoryWindow::new(1000, Duration::from_millis(300));
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    // Documented limit: older than the window is reported as new.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );

    // Count bound: the oldest identity falls out once `capacity` newer ones arrived.
    let small = MemoryWindow::new(3, Duration::from_secs(60));
    for id in [b"a", b"b", b"c", b"d"] {
        assert_eq!(small.check_and_remember_now(id), Seen::New);
    }
    small.run_pending_tasks();
    assert!(!small.contains_now(b"a"), "evicted by count");
    assert!(small.contains_now(b"d") && small.contains_now(b"c") && small.contains_now(b"b"));
}

#[tokio::test]
async fn redis_window_survives_a_restart_and_expires_by_age() {
    let prefix = format!("{}:", unique("oncely:test:dedup"));
    let first = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("connect");
    assert_eq!(
        first.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        first.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    drop(first);
    // A new process would connect anew: the window is still there.
    let second = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("reconnect");
    assert_eq!(
        second.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    assert!(!second.contains(b"evt-2").await.expect("contains"));
    second.remember(b"evt-2").await.expect("remember");
    assert!(second.contains(b"evt-2").await.expect("contains"));
    second.forget(b"evt-2").await.expect("forget");
    assert_eq!(
        second.check_and_remember(b"evt-2").await.expect("check"),
        Seen::New
    );

    let short = RedisWindow::connect(
        &redis_url(),
        &format!("{prefix}short:"),
        Duration::from_millis(200),
    )
    .await
    .expect("connect");
    assert_eq!(
        short.check_and_remember(b"evt-3").await.expect("check"),
        Seen::New
    );
    let mut expired = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !short.contains(b"evt-3").await.expect("contains") {
            expired = true;
            break;
        }
    }
    assert!(expired, "identity older than the TTL must expire");
    assert_eq!(
        short.check_and_remember(b"evt-3").await.expect("check"),
        Seen::New
    );
}

#[tokio::test]
async fn concurrent_redis_checks_of_one_identity_yield_exactly_one_new() {
    let prefix = format!("{}:", unique("oncely:test:race"));
    let w = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("connect");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let w = w.clone();
            tokio::spawn(async move { w.check_and_remember(b"same").await })
        })
        .collect();
    let mut news = 0;
    for t in tasks {
        if t.await.expect("join").expect("check") == Seen::New {
            news += 1;
        }
    }
    assert_eq!(news, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_window_is_rebuilt_from_the_records_before_the_start_offset() {
    let topic = unique("warmup");
    create_topic(&topic, 1).await;
    let records: Vec<Out> = (0..10u64)
        .map(|i| Out {
            key: Some(key(i)),
            value: Some(envelope(i, 100 + i, 0, i)),
            partition: Some(0),
        })
        .collect();
    produce(&topic, &records).await;
    let warm = read_before(Warmup {
        bootstrap_servers: brokers(),
        kafka: Default::default(),
        partition: TopicPartition::new(&topic, 0),
        end_offset: 8,
        max_records: 5,
        timeout: Duration::from_secs(30),
    })
    .await
    .expect("warm-up");
    let offsets: Vec<i64> = warm.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        vec![3, 4, 5, 6, 7],
        "the last five records before offset 8"
    );
    let window = MemoryWindow::new(100, Duration::from_secs(60));
    for r in &warm {
        let version = r.event().map(|e| e.version.to_string()).unwrap_or_default();
        window.remember(version.as_bytes()).await.expect("remember");
    }
    // A redelivered record inside the warmed window is a duplicate, an older one is new.
    assert_eq!(
        window.check_and_remember(b"107/0").await.expect("check"),
        Seen::Duplicate
    );
    assert_eq!(
        window.check_and_remember(b"102/0").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        window.check_and_remember(b"108/0").await.expect("check"),
        Seen::New
    );
}

/// What to re-read.
#[derive(Debug, Clone)]
struct Warmup {
    /// Kafka brokers.
    bootstrap_servers: String,
    /// Extra librdkafka properties (security...).
    kafka: BTreeMap<String, String>,
    /// The partition.
    partition: TopicPartition,
    /// Read records with offsets below this one (the start offset of the partition).
    end_offset: i64,
    /// At most this many records (the last ones before `end_offset`).
    max_records: usize,
    /// Give up after this long (transient: the caller may retry).
    timeout: Duration,
}

/// Reads up to `max_records` decodable records just before `end_offset`, in offset order.
/// Blocking Kafka calls run on the blocking pool.
async fn read_before(request: Warmup) -> Result<Vec<Record>, String> {
    tokio::task::spawn_blocking(move || read_blocking(&request))
        .await
        .map_err(|e| format!("warm-up task: {e}"))?
}

/// Reads with `isolation.level=read_committed` and without a consumer group
/// (nothing is committed). Undecodable records are skipped: they were
/// dead-lettered, not applied.
fn read_blocking(w: &Warmup) -> Result<Vec<Record>, String> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &w.bootstrap_servers);
    for (k, v) in &w.kafka {
        config.set(k, v);
    }
    config
        .set("group.id", "oncely-warmup")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| format!("create the warm-up consumer: {e}"))?;
    let tp = &w.partition;
    let (low, _high) = consumer
        .fetch_watermarks(&tp.topic, tp.partition, w.timeout)
        .map_err(|e| format!("read watermarks: {e}"))?;
    let span = i64::try_from(w.max_records).unwrap_or(i64::MAX);
    let start = low.max(w.end_offset.saturating_sub(span));
    if start >= w.end_offset || w.max_records == 0 {
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(start))
        .map_err(|e| format!("warm-up assignment: {e}"))?;
    consumer.assign(&tpl).map_err(|e| format!("assign: {e}"))?;
    let deadline = Instant::now() + w.timeout;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if let Some(result) = consumer.poll(Duration::from_millis(100)) {
            let m = result.map_err(|e| format!("warm-up read: {e}"))?;
            if m.offset() >= w.end_offset {
                return Ok(out);
            }
            if let (Ok(key), Ok(payload)) = (decode_key(m.key()), decode_value(m.payload())) {
                out.push(Record::new(m.offset(), key, payload).with_raw(m.key(), m.payload()));
            }
        }
        if reached(&consumer, tp, w.end_offset) {
            return Ok(out);
        }
    }
    Err(format!(
        "warm-up of {tp} did not reach offset {} in time",
        w.end_offset
    ))
}

/// True once the consumer's position is at or past `end` (transaction markers leave gaps).
fn reached(consumer: &BaseConsumer, tp: &TopicPartition, end: i64) -> bool {
    consumer.position().is_ok_and(|list| {
        list.find_partition(&tp.topic, tp.partition)
            .is_some_and(|e| matches!(e.offset(), Offset::Offset(n) if n >= end))
    })
}
