//! Re-reading the records just before a start offset, to rebuild a dedup window
//! after a restart (see `oncely-dedup`): call it from [`Sink::assigned`](crate::Sink::assigned)
//! with the start offsets the runner passes, and remember each record's identity.
//!
//! Reads with `isolation.level=read_committed` and without a consumer group
//! (nothing is committed). Undecodable records are skipped: they were
//! dead-lettered, not applied.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientConfig;

use crate::error::SinkError;
use crate::event::{decode_key, decode_value};
use crate::sink::{Record, TopicPartition};

/// What to re-read.
#[derive(Debug, Clone)]
pub struct Warmup {
    /// Kafka brokers.
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (security...).
    pub kafka: BTreeMap<String, String>,
    /// The partition.
    pub partition: TopicPartition,
    /// Read records with offsets below this one (the start offset of the partition).
    pub end_offset: i64,
    /// At most this many records (the last ones before `end_offset`).
    pub max_records: usize,
    /// Give up after this long (transient: the caller may retry).
    pub timeout: Duration,
}

/// Reads up to `max_records` decodable records just before `end_offset`, in offset order.
/// Blocking Kafka calls run on the blocking pool.
pub async fn read_before(request: Warmup) -> Result<Vec<Record>, SinkError> {
    tokio::task::spawn_blocking(move || read_blocking(&request))
        .await
        .map_err(|e| SinkError::fatal_from("warm-up task", e))?
}

fn read_blocking(w: &Warmup) -> Result<Vec<Record>, SinkError> {
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
        .map_err(|e| SinkError::retriable_from("create the warm-up consumer", e))?;
    let tp = &w.partition;
    let (low, _high) = consumer
        .fetch_watermarks(&tp.topic, tp.partition, w.timeout)
        .map_err(|e| SinkError::retriable_from("read watermarks", e))?;
    let span = i64::try_from(w.max_records).unwrap_or(i64::MAX);
    let start = low.max(w.end_offset.saturating_sub(span));
    if start >= w.end_offset || w.max_records == 0 {
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(start))
        .map_err(|e| SinkError::fatal_from("warm-up assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| SinkError::retriable_from("assign", e))?;
    let deadline = Instant::now() + w.timeout;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if let Some(result) = consumer.poll(Duration::from_millis(100)) {
            let m = result.map_err(|e| SinkError::retriable_from("warm-up read", e))?;
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
    Err(SinkError::retriable(format!(
        "warm-up of {tp} did not reach offset {} in time",
        w.end_offset
    )))
}

/// True once the consumer's position is at or past `end` (transaction markers leave gaps).
fn reached(consumer: &BaseConsumer, tp: &TopicPartition, end: i64) -> bool {
    consumer.position().is_ok_and(|list| {
        list.find_partition(&tp.topic, tp.partition)
            .is_some_and(|e| matches!(e.offset(), Offset::Offset(n) if n >= end))
    })
}
