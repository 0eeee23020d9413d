//! The Kafka floor: a topic's records re-sent by a bare transactional
//! producer with capture's settings. No row is read or encoded, so nothing
//! that produces those records can be faster on the same machine and broker.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cpu_seconds;

/// What re-sending took, and the records' sizes (a sample's means).
pub struct Floor {
    pub secs: f64,
    /// This process's CPU seconds meanwhile (the producer's cost).
    pub cpu: f64,
    pub key_bytes: f64,
    pub value_bytes: f64,
}

/// Sends `total` records copied from the first records of `source` to a new
/// topic of as many partitions, in transactions of `per_tx` records, with the
/// producer settings capture uses (`oncely_capture::catalog::PRODUCER_SETTINGS`), then
/// `overrides` (capture's `[kafka.producer]`). Blocking.
pub fn kafka_floor(
    brokers: &str,
    source: &str,
    total: usize,
    per_tx: usize,
    overrides: &[(String, String)],
) -> Result<Floor> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    use rdkafka::TopicPartitionList;

    const SAMPLE: usize = 10_000;
    let timeout = Duration::from_secs(30);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{source}-floor"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(source), timeout)?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .filter(|n| *n > 0)
        .context("capture's topic has no partitions")?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(source, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let mut sample = Vec::with_capacity(SAMPLE);
    let deadline = Instant::now() + timeout;
    while sample.len() < SAMPLE.min(total) && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m?;
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        sample.push((
            m.key().unwrap_or_default().to_vec(),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    if sample.is_empty() {
        bail!("read no records back from {source}");
    }
    let key_bytes = sample.iter().map(|(k, _, _)| k.len()).sum::<usize>() as f64;
    let value_bytes = sample.iter().map(|(_, v, _)| v.len()).sum::<usize>() as f64;
    let (key_bytes, value_bytes) = (
        key_bytes / sample.len() as f64,
        value_bytes / sample.len() as f64,
    );

    let floor = format!("{source}-floor");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(&floor, partitions as i32, TopicReplication::Fixed(1))
        .set("max.message.bytes", "10485760");
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()))?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("transactional.id", &floor)
        .set("queue.buffering.max.kbytes", "65536");
    for (k, v) in oncely_capture::catalog::PRODUCER_SETTINGS {
        config.set(*k, *v);
    }
    for (k, v) in overrides {
        config.set(k, v);
    }
    let producer: ThreadedProducer<_> = config.create()?;
    producer.init_transactions(timeout)?;
    let cpu_before = cpu_seconds(std::process::id());
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        producer.begin_transaction()?;
        for _ in 0..per_tx.min(total - sent) {
            let (key, value, headers) = &sample[sent % sample.len()];
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let mut record = BaseRecord::to(&floor)
                .key(key.as_slice())
                .payload(value.as_slice())
                .headers(owned);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            sent += 1;
        }
        producer.commit_transaction(timeout)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds(std::process::id()) - cpu_before;
    Ok(Floor {
        secs,
        cpu,
        key_bytes,
        value_bytes,
    })
}
