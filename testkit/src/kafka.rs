//! Helpers for tests against the real Kafka of `scripts/services` (never mocks).

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message};
use serde_json::json;

/// Brokers from `scripts/services env`; panics with a hint when unset (tests never skip).
pub fn brokers() -> String {
    match std::env::var("ONCELY_KAFKA_BROKERS") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!("ONCELY_KAFKA_BROKERS is not set: run `eval \"$(scripts/services env)\"` or scripts/test"),
    }
}

/// A fresh name, e.g. `prefix_3f9a0c1b2d4e5f60`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// Creates a topic with `partitions` partitions.
pub async fn create_topic(topic: &str, partitions: i32) {
    create_topic_with(topic, partitions, &[]).await;
}

/// Creates a topic with `partitions` partitions and the topic-level `configs`.
pub async fn create_topic_with(topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create topic request");
    for r in results {
        r.expect("topic created");
    }
}

/// A Debezium-style key for row `id`.
pub fn key(id: u64) -> Vec<u8> {
    json!({"id": id}).to_string().into_bytes()
}

/// An oncely envelope: update of row `id` to value `v`, version `(lsn, seq)`.
pub fn envelope(id: u64, lsn: u64, seq: u64, v: u64) -> Vec<u8> {
    json!({
        "before": null,
        "after": {"id": id, "v": v},
        "source": {"connector": "test", "lsn": lsn, "commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "t"},
        "op": "u",
        "ts_ms": 0
    })
    .to_string()
    .into_bytes()
}

/// One record to produce.
pub struct Out {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub partition: Option<i32>,
}

/// Produces `records` in order (idempotent producer, acks=all) and waits for every acknowledgement.
pub async fn produce(topic: &str, records: &[Out]) {
    let plain: Vec<(&Out, &[(&str, &str)])> = records.iter().map(|r| (r, &[][..])).collect();
    produce_headed(topic, &plain).await;
}

/// Like [`produce`], each record with its Kafka headers (name, value).
pub async fn produce_headed(topic: &str, records: &[(&Out, &[(&str, &str)])]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut pending = Vec::with_capacity(records.len());
    for (r, headers) in records {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
        if let Some(k) = &r.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &r.value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(p) = r.partition {
            rec = rec.partition(p);
        }
        if !headers.is_empty() {
            let mut h = OwnedHeaders::new_with_capacity(headers.len());
            for (key, value) in *headers {
                h = h.insert(Header {
                    key,
                    value: Some(*value),
                });
            }
            rec = rec.headers(h);
        }
        pending.push(
            producer
                .send_result(rec)
                .map_err(|(e, _)| e)
                .expect("enqueue"),
        );
    }
    for p in pending {
        p.await
            .expect("delivery future")
            .map_err(|(e, _)| e)
            .expect("delivered");
    }
}

/// Reads every record of `topic` (all partitions, from the start) until `count` arrived.
pub async fn read_topic(topic: &str, partitions: i32, count: usize) -> Vec<OwnedMessage> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        while out.len() < count {
            assert!(
                Instant::now() < deadline,
                "read {} of {count} records of {topic}",
                out.len()
            );
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                out.push(m.expect("message").detach());
            }
        }
        // Nothing more than expected: poll a little longer.
        let quiet = Instant::now() + Duration::from_millis(500);
        while Instant::now() < quiet {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                out.push(m.expect("message").detach());
            }
        }
        out
    })
    .await
    .expect("reader task")
}

/// Committed offsets of `group` for partitions `0..partitions` of `topic` (-1: none).
pub async fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", &group)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let list = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed");
        (0..partitions)
            .map(
                |p| match list.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(n)) => n,
                    _ => -1,
                },
            )
            .collect()
    })
    .await
    .expect("task")
}

/// Waits until `cond` holds, polling every 50 ms; panics after `timeout` with `what`.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of a header of `m`, as a string.
pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// Produces update events for `keys` rows over `partitions` partitions (row `id` on
/// partition `id % partitions`), `chunk` records every `pause`, until `stop` is set.
/// Returns how many records were produced (all acknowledged).
pub fn produce_steadily(
    topic: &str,
    shape: (u64, i32),
    pace: (usize, Duration),
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    let topic = topic.to_owned();
    let ((keys, partitions), (chunk, pause)) = (shape, pace);
    tokio::spawn(async move {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .expect("producer");
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut pending = Vec::with_capacity(chunk);
            for _ in 0..chunk {
                let id = n % keys;
                let (k, v) = (key(id), envelope(id, 1000 + n, 0, n));
                let rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic)
                    .key(k.as_slice())
                    .payload(v.as_slice())
                    .partition((id % partitions as u64) as i32);
                pending.push(
                    producer
                        .send_result(rec)
                        .map_err(|(e, _)| e)
                        .expect("enqueue"),
                );
                n += 1;
            }
            for p in pending {
                p.await
                    .expect("delivery future")
                    .map_err(|(e, _)| e)
                    .expect("delivered");
            }
            tokio::time::sleep(pause).await;
        }
        n
    })
}
