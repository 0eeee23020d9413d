//! Waiting until the targets have caught up with the source: first capture
//! (its committed offset record covers the source's WAL position taken at
//! the start), then each sink (its positions reach the end the topics had
//! once capture covered that position).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use oncely_capture::catalog::read_stored_offset;
use oncely_capture::catalog::CaptureContext;
use oncely_capture::config::CaptureConfig;
use oncely_sinks::TopicPartition;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::sink_target::Target;
use super::source::format_lsn;
use super::VerifyError;

const POLL: Duration = Duration::from_millis(250);
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until capture's last committed offset record covers `lsn`.
pub async fn capture(cfg: &CaptureConfig, lsn: u64, deadline: Instant) -> Result<(), VerifyError> {
    loop {
        let offset = read_stored_offset(cfg)
            .await
            .map_err(|e| VerifyError::Kafka(format!("read capture's offset: {e}")))?;
        let at = offset.as_ref().map(|o| o.flush_lsn);
        if at.is_some_and(|at| at >= lsn) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(VerifyError::Timeout(format!(
                "capture `{}` has not published up to the source position {} (its committed offset is at {}). \
                 Is `oncely capture` running? With no captured change after that position, only a heartbeat \
                 (heartbeat.interval.ms) moves the offset; raise --timeout or use --no-wait",
                cfg.connector_name(),
                format_lsn(lsn),
                at.map_or("nothing yet".to_owned(), format_lsn),
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The partitions of `topics` (missing topics have none) with their low and
/// high watermarks.
pub async fn topic_ends(
    client: &ClientConfig,
    topics: &[String],
) -> Result<HashMap<TopicPartition, (i64, i64)>, VerifyError> {
    let client = client.clone();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer = reader(client)?;
        let metadata = consumer
            .fetch_metadata(None, KAFKA_TIMEOUT)
            .map_err(|e| VerifyError::Kafka(format!("read topic metadata: {e}")))?;
        let mut out = HashMap::new();
        for t in metadata.topics() {
            if !topics.iter().any(|want| want == t.name()) {
                continue;
            }
            for p in t.partitions() {
                let marks = consumer
                    .fetch_watermarks(t.name(), p.id(), KAFKA_TIMEOUT)
                    .map_err(|e| {
                        VerifyError::Kafka(format!("read the end of {}[{}]: {e}", t.name(), p.id()))
                    })?;
                out.insert(TopicPartition::new(t.name(), p.id()), marks);
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| VerifyError::Kafka(format!("watermark task failed: {e}")))?
}

/// How far each sink was behind when the wait began, and how long it took.
#[derive(Debug, Clone)]
pub struct SinkWait {
    pub label: String,
    /// Offsets between its positions and the topics' ends when the wait began
    /// (transaction markers included, so an upper bound of records).
    pub lag_offsets: i64,
    pub waited: Duration,
}

/// Waits until `target` has applied every committed record before `ends`.
pub async fn sink(
    client: &ClientConfig,
    target: &Target,
    ends: &HashMap<TopicPartition, (i64, i64)>,
    deadline: Instant,
) -> Result<SinkWait, VerifyError> {
    let started = Instant::now();
    let partitions: Vec<TopicPartition> = ends
        .keys()
        .filter(|tp| target.covers(&tp.topic))
        .cloned()
        .collect();
    let mut lag_offsets = None;
    loop {
        let positions = target.positions(&partitions).await?;
        let at = |p: &TopicPartition| positions.get(p).copied().unwrap_or(ends[p].0);
        lag_offsets
            .get_or_insert_with(|| partitions.iter().map(|p| (ends[p].1 - at(p)).max(0)).sum());
        let behind: Vec<(TopicPartition, i64, i64)> = partitions
            .iter()
            .filter(|p| at(p) < ends[*p].1)
            .map(|p| (p.clone(), at(p), ends[p].1))
            .collect();
        let behind = unapplied(client, behind).await?;
        if behind.is_empty() {
            return Ok(SinkWait {
                label: target.label.clone(),
                lag_offsets: lag_offsets.unwrap_or(0),
                waited: started.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            let list = behind
                .iter()
                .take(5)
                .map(|(tp, at, end)| format!("{tp} at offset {at}, end {end}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(VerifyError::Timeout(format!(
                "sink {} has not caught up: {list}. Is its `oncely sink` running? Raise --timeout or use --no-wait",
                target.label
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Of the partitions with a position before their end, those where a
/// committed record lies in between (the rest are only transaction markers
/// or aborted records, which a sink never sees).
async fn unapplied(
    client: &ClientConfig,
    behind: Vec<(TopicPartition, i64, i64)>,
) -> Result<Vec<(TopicPartition, i64, i64)>, VerifyError> {
    if behind.is_empty() {
        return Ok(behind);
    }
    let client = client.clone();
    tokio::task::spawn_blocking(move || {
        let consumer = reader(client)?;
        let mut out = Vec::new();
        for (partition, from, end) in behind {
            if first_committed_between(&consumer, &partition, from, end)?.is_some() {
                out.push((partition, from, end));
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| VerifyError::Kafka(format!("lag reader task failed: {e}")))?
}

/// Per partition, the Kafka timestamp (ms) of the first committed record in
/// `[from, end)`, or `None` when there is none (only transaction markers or
/// aborted records): how long the oldest change a sink has not applied has
/// waited (`oncely status`).
pub async fn oldest_unapplied(
    client: &ClientConfig,
    behind: Vec<(TopicPartition, i64, i64)>,
) -> Result<HashMap<TopicPartition, Option<Unapplied>>, VerifyError> {
    let client = client.clone();
    tokio::task::spawn_blocking(move || {
        let consumer = reader(client)?;
        let mut out = HashMap::new();
        for (partition, from, end) in behind {
            let first = first_committed_between(&consumer, &partition, from, end)?;
            out.insert(partition, first.flatten());
        }
        Ok(out)
    })
    .await
    .map_err(|e| VerifyError::Kafka(format!("lag reader task failed: {e}")))?
}

/// The oldest committed record a sink has not applied: when it reached
/// Kafka and when its change committed at the source (milliseconds since
/// the epoch, each when the record has one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unapplied {
    pub kafka_ms: Option<i64>,
    pub source_ms: Option<i64>,
}

impl Unapplied {
    fn of(message: &BorrowedMessage<'_>) -> Self {
        Self {
            kafka_ms: message.timestamp().to_millis(),
            source_ms: message.payload().and_then(source_ts_ms),
        }
    }
}

/// `source.ts_ms` of a change event (schemas on or off; Debezium's and
/// oncely's envelopes alike): when its transaction committed at the source.
fn source_ts_ms(value: &[u8]) -> Option<i64> {
    let doc: serde_json::Value = serde_json::from_slice(value).ok()?;
    let envelope = doc.get("payload").filter(|p| p.is_object()).unwrap_or(&doc);
    envelope.get("source")?.get("ts_ms")?.as_i64()
}

/// `Some(..)` when a committed record lies in `[from, end)`, `None` when
/// none does.
fn first_committed_between(
    consumer: &BaseConsumer<CaptureContext>,
    TopicPartition { topic, partition }: &TopicPartition,
    from: i64,
    end: i64,
) -> Result<Option<Option<Unapplied>>, VerifyError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, *partition, Offset::Offset(from))
        .map_err(|e| VerifyError::Kafka(e.to_string()))?;
    consumer
        .assign(&tpl)
        .map_err(|e| VerifyError::Kafka(format!("assign {topic}[{partition}]: {e}")))?;
    let deadline = Instant::now() + KAFKA_TIMEOUT;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                return Ok((m.offset() < end).then(|| Some(Unapplied::of(&m))));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(None),
            Some(Err(e)) => {
                return Err(VerifyError::Kafka(format!(
                    "read {topic}[{partition}]: {e}"
                )))
            }
        }
    }
    // Nothing readable yet (an open transaction holds the stable offset back): still behind.
    Ok(Some(None))
}

/// `client`: the capture's brokers and connection properties.
fn reader(mut client: ClientConfig) -> Result<BaseConsumer<CaptureContext>, VerifyError> {
    client
        .set("group.id", "oncely-verify")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create_with_context(CaptureContext::default())
        .map_err(|e| VerifyError::Kafka(format!("create a consumer: {e}")))
}
