//! The transactional Kafka producer and the topics capture writes.
//!
//! librdkafka's transaction calls block until the coordinator answers, so they
//! run on tokio's blocking pool, never on the runtime threads.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use crate::config::CaptureConfig;
use crate::error::CaptureError;

/// How long a transaction call may wait for the coordinator.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One connector's transactional producer. A new instance with the same
/// `transactional.id` fences the previous one; its next call fails with
/// [`CaptureError::Fenced`].
#[derive(Clone)]
pub struct TxProducer {
    inner: Arc<ThreadedProducer<DefaultProducerContext>>,
    transactional_id: Arc<str>,
}

impl TxProducer {
    /// Creates the producer and runs `init_transactions`, which fences any
    /// older instance and aborts its open transaction.
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, CaptureError> {
        let transactional_id = cfg.transactional_id();
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &cfg.kafka.bootstrap.servers)
            .set("transactional.id", &transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Keys land on the partitions a Java client would choose.
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("compression.type", "lz4")
            .set("transaction.timeout.ms", "60000")
            // Bounded producer memory: sends wait when the queue is full. It
            // matches the default batch.max.bytes, so a batch rarely waits.
            .set("queue.buffering.max.kbytes", "65536")
            .set("queue.buffering.max.messages", "100000");
        for (k, v) in &cfg.kafka.producer {
            client.set(k, v);
        }
        let producer: ThreadedProducer<DefaultProducerContext> = client
            .create()
            .map_err(|e| CaptureError::kafka("create producer", &transactional_id, e))?;
        let tx = TxProducer {
            inner: Arc::new(producer),
            transactional_id: transactional_id.into(),
        };
        tx.blocking("init_transactions", |p| {
            p.init_transactions(TXN_CALL_TIMEOUT)
        })
        .await?;
        Ok(tx)
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    pub fn begin(&self) -> Result<(), CaptureError> {
        self.inner
            .begin_transaction()
            .map_err(|e| CaptureError::kafka("begin_transaction", &self.transactional_id, e))
    }

    /// Queues one record in the open transaction; waits while the local queue is full.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), CaptureError> {
        self.send_with_headers(topic, key, value, None).await
    }

    /// [`TxProducer::send`] with record headers.
    pub async fn send_with_headers(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<&[(&str, &[u8])]>,
    ) -> Result<(), CaptureError> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(list) = headers {
            let mut owned = OwnedHeaders::new_with_capacity(list.len());
            for (name, value) in list {
                owned = owned.insert(Header {
                    key: name,
                    value: Some(*value),
                });
            }
            record = record.headers(owned);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        loop {
            match self.inner.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err((e, _)) => return Err(CaptureError::kafka("send", &self.transactional_id, e)),
            }
        }
    }

    /// Waits for every record of the open transaction to be acknowledged, then commits it.
    pub async fn commit(&self) -> Result<(), CaptureError> {
        // rdkafka's commit_transaction flushes first, and its flush polls in fixed
        // 100 ms slices that only end at the deadline: every commit with records
        // in flight cost 100 ms. The producer's own thread serves delivery
        // reports, so waiting here for the in-flight count to reach zero makes
        // that flush a no-op (commits take ~7 ms instead of ~100 ms). Past the
        // deadline the commit's own flush reports the timeout.
        let deadline = tokio::time::Instant::now() + TXN_CALL_TIMEOUT;
        while self.inner.in_flight_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.blocking("commit_transaction", |p| {
            p.commit_transaction(TXN_CALL_TIMEOUT)
        })
        .await
    }

    /// Aborts the open transaction; its records are never visible to `read_committed` readers.
    pub async fn abort(&self) -> Result<(), CaptureError> {
        self.blocking("abort_transaction", |p| {
            p.abort_transaction(TXN_CALL_TIMEOUT)
        })
        .await
    }

    async fn blocking<F>(&self, context: &'static str, call: F) -> Result<(), CaptureError>
    where
        F: FnOnce(&ThreadedProducer<DefaultProducerContext>) -> Result<(), KafkaError>
            + Send
            + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let id = Arc::clone(&self.transactional_id);
        tokio::task::spawn_blocking(move || call(&inner))
            .await
            .map_err(|e| CaptureError::Protocol(format!("{context} task failed: {e}")))?
            .map_err(|e| CaptureError::kafka(context, &id, e))
    }
}

/// Creates topics on first use, so capture works where brokers do not auto-create.
pub struct TopicCreator {
    admin: AdminClient<DefaultClientContext>,
    known: HashSet<String>,
    partitions: i32,
    replication: i32,
}

impl TopicCreator {
    pub fn new(cfg: &CaptureConfig) -> Result<Self, CaptureError> {
        let admin = ClientConfig::new()
            .set("bootstrap.servers", &cfg.kafka.bootstrap.servers)
            .create()
            .map_err(|e| CaptureError::kafka("create admin client", "-", e))?;
        Ok(TopicCreator {
            admin,
            known: HashSet::new(),
            partitions: cfg.topic.creation.default.partitions,
            replication: cfg.topic.creation.default.replication.factor,
        })
    }

    /// Makes sure a change topic exists (idempotent).
    pub async fn ensure(&mut self, topic: &str) -> Result<(), CaptureError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        let new = NewTopic::new(
            topic,
            self.partitions,
            TopicReplication::Fixed(self.replication),
        );
        self.create(new).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    /// Makes sure the compacted single-partition offsets topic exists.
    pub async fn ensure_offsets_topic(&mut self, topic: &str) -> Result<(), CaptureError> {
        let new = NewTopic::new(topic, 1, TopicReplication::Fixed(self.replication))
            .set("cleanup.policy", "compact");
        self.create(new).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    async fn create(&self, topic: NewTopic<'_>) -> Result<(), CaptureError> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = self
            .admin
            .create_topics([&topic], &opts)
            .await
            .map_err(|e| CaptureError::kafka("create topic", "-", e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(CaptureError::kafka(
                        "create topic",
                        "-",
                        KafkaError::AdminOp(code),
                    ))
                    .map_err(|e| {
                        tracing::error!(topic = %name, "cannot create topic: {e}");
                        e
                    })
                }
            }
        }
        Ok(())
    }
}
