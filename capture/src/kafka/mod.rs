//! The transactional Kafka producer and the topics capture writes (created by
//! [`TopicCreator`], in `topics.rs`).
//!
//! librdkafka's transaction calls block until the coordinator answers, so they
//! run on tokio's blocking pool, never on the runtime threads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use tokio_util::sync::CancellationToken;

use crate::config::CaptureConfig;
use crate::error::{is_too_large, CaptureError};

/// The transactional producer's fixed settings, before the queue and
/// message sizes (from the config) and `[kafka.producer]` (which wins).
/// The snapshot benchmark's Kafka floor sends with the same ones.
pub const PRODUCER_SETTINGS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // Keys land on the partitions a Java client would choose.
    ("partitioner", "murmur2_random"),
    ("linger.ms", "5"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
    // crate::config::DEFAULT_TRANSACTION_TIMEOUT_MS; `[kafka.producer]` may set it.
    ("transaction.timeout.ms", "60000"),
    // With queue.buffering.max.kbytes, bounds the producer's memory.
    ("queue.buffering.max.messages", "100000"),
];

pub use oncely_core::kafka::is_connection_property;

/// A client config for `bootstrap` with the connection properties among `props`
/// (see [`is_connection_property`]), for clients other than the producer.
pub fn client_config<'a>(
    bootstrap: &str,
    props: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", bootstrap);
    for (k, v) in props {
        if is_connection_property(k) {
            client.set(k, v);
        }
    }
    client
}

impl CaptureConfig {
    /// The base config of this capture's admin and reader clients: its
    /// brokers and the connection properties of `[kafka.producer]`.
    pub fn kafka_client(&self) -> ClientConfig {
        client_config(&self.kafka_bootstrap_servers, &self.kafka_producer)
    }
}

/// The context of capture's Kafka clients: logs librdkafka's errors and
/// remembers a refused login. librdkafka reports a refused login (bad SASL
/// credentials or mechanism) only through this callback, retrying for ever,
/// while the operation that needed the connection just times out; capture
/// turns such a timeout into [`CaptureError::KafkaLogin`] and stops.
#[derive(Default)]
pub struct CaptureContext {
    refused: Mutex<Option<String>>,
    too_large: Mutex<Option<RefusedRecord>>,
}

/// A record the broker refused for its size (its delivery report), kept so
/// the failed commit can say which change it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub size: usize,
}

impl CaptureContext {
    /// Why the cluster refused this client's login, if it did.
    pub fn refused(&self) -> Option<String> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// `error`, or a login refusal when that is what lies behind it.
    pub fn explain(&self, error: CaptureError) -> CaptureError {
        match (&error, self.refused()) {
            (CaptureError::Kafka { .. }, Some(reason)) => CaptureError::KafkaLogin { reason },
            _ => error,
        }
    }

    /// The first record the broker refused for its size, if any (taken).
    pub fn take_too_large(&self) -> Option<RefusedRecord> {
        self.too_large.lock().ok().and_then(|mut r| r.take())
    }

    fn record_refusal(&self, reason: &str) {
        if let Ok(mut refused) = self.refused.lock() {
            if refused.is_none() {
                tracing::error!("kafka refused the login: {reason}");
                *refused = Some(reason.to_owned());
            }
        }
    }
}

impl ClientContext for CaptureContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        // librdkafka's broker threads report a refused login here (and retry);
        // the error callback sees it only on clients that poll their main queue.
        if message.contains("SASL authentication error")
            || message.contains("Authentication failed")
        {
            return self.record_refusal(message);
        }
        // librdkafka retries what it reports as errors (a refused connection,
        // say); capture itself decides what is fatal, so these are warnings.
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
                tracing::error!("librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Error | RDKafkaLogLevel::Warning => {
                tracing::warn!("librdkafka: {facility} {message}")
            }
            _ => tracing::debug!("librdkafka: {facility} {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            // Reaching the end of a partition is how a reader knows it is done.
            Some(RDKafkaErrorCode::PartitionEOF) => {}
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
                self.record_refusal(reason)
            }
            // Connection state, already logged by librdkafka's own FAIL line
            // and retried by it.
            Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure) => {
                tracing::debug!("librdkafka: {error}: {reason}")
            }
            _ => tracing::warn!("librdkafka: {error}: {reason}"),
        }
    }
}

impl ConsumerContext for CaptureContext {}

impl ProducerContext for CaptureContext {
    type DeliveryOpaque = ();
    // Delivery is awaited through the in-flight count before each commit, and
    // a failed delivery fails the transaction's commit. A record refused for
    // its size is remembered: the commit's error does not say which it was.
    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        use rdkafka::message::Message;
        if let Err((e, msg)) = result {
            if is_too_large(e) {
                if let Ok(mut slot) = self.too_large.lock() {
                    slot.get_or_insert_with(|| RefusedRecord {
                        topic: msg.topic().to_owned(),
                        key: msg.key().map(<[u8]>::to_vec),
                        size: msg.key().map_or(0, <[u8]>::len)
                            + msg.payload().map_or(0, <[u8]>::len),
                    });
                }
            }
        }
    }
}

/// Connects to the cluster as capture's clients will, before anything else
/// uses it: a refused login becomes [`CaptureError::KafkaLogin`] within a
/// second or two instead of a timeout of the first operation; an unreachable
/// cluster a retriable error after `timeout`. Returns early once `stop` is cancelled.
pub async fn check_login(
    cfg: &CaptureConfig,
    timeout: Duration,
    stop: &CancellationToken,
) -> Result<(), CaptureError> {
    let stop = stop.clone();
    let mut client = cfg.kafka_client();
    // A consumer serves librdkafka's log and error events when polled (an
    // admin client never does); it joins no group.
    client.set("group.id", "oncely-login-check");
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<CaptureContext> = client
            .create_with_context(CaptureContext::default())
            .map_err(|e| CaptureError::kafka("create a client", "-", e))?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let answer = consumer.fetch_metadata(None, Duration::from_millis(500));
            // Serves queued log and error events, among them a refused login.
            let _ = consumer.poll(Duration::from_millis(100));
            if let Some(reason) = consumer.context().refused() {
                return Err(CaptureError::KafkaLogin { reason });
            }
            match answer {
                Ok(_) => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(CaptureError::kafka("connect", "-", e))
                }
                Err(_) => {}
            }
        }
    })
    .await
    .map_err(CaptureError::task("kafka login check"))?
}

/// How long a transaction call may wait for the coordinator.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One connector's transactional producer. A new instance with the same
/// `transactional.id` fences the previous one; its next call fails with
/// [`CaptureError::Fenced`].
#[derive(Clone)]
pub struct TxProducer {
    inner: Arc<ThreadedProducer<CaptureContext>>,
    transactional_id: Arc<str>,
    /// The producer's `message.max.bytes`.
    max_message_bytes: usize,
}

impl TxProducer {
    /// Creates the producer and runs `init_transactions`, which fences any
    /// older instance and aborts its open transaction.
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, CaptureError> {
        let transactional_id = cfg.transactional_id();
        // The topics capture creates take records up to this size; the
        // producer's own check matches them (unless `[kafka.producer]` says
        // otherwise), and its queue holds at least one such record.
        let max_message_bytes = cfg
            .producer_message_max_bytes()
            .unwrap_or(cfg.max_message_bytes());
        let queue_kbytes = (max_message_bytes / 1024 + 1024).max(65536);
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &cfg.kafka_bootstrap_servers)
            .set("transactional.id", &transactional_id);
        for (k, v) in PRODUCER_SETTINGS {
            client.set(*k, *v);
        }
        client
            // Bounded producer memory: sends wait when the queue is full. It
            // matches the default batch.max.bytes, so a batch rarely waits.
            .set("queue.buffering.max.kbytes", queue_kbytes.to_string())
            .set("message.max.bytes", max_message_bytes.to_string());
        for (k, v) in &cfg.kafka_producer {
            client.set(k, v);
        }
        let producer: ThreadedProducer<CaptureContext> = client
            .create_with_context(CaptureContext::default())
            .map_err(|e| CaptureError::kafka("create producer", &transactional_id, e))?;
        let tx = TxProducer {
            inner: Arc::new(producer),
            transactional_id: transactional_id.into(),
            max_message_bytes,
        };
        tx.blocking("init_transactions", |p| {
            p.init_transactions(TXN_CALL_TIMEOUT)
        })
        .await
        .map_err(|e| explain_timeout(e, cfg))?;
        Ok(tx)
    }

    /// The producer's `message.max.bytes`: larger records are refused at `send`.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// The first record the broker refused for its size since the last call.
    pub fn take_too_large(&self) -> Option<RefusedRecord> {
        self.inner.context().take_too_large()
    }

    /// The first record the broker refused for its size, waiting at most
    /// `max` for the delivery reports still due: the refusal fails the
    /// transaction at once, so the next send can fail (`Erroneous state`)
    /// before the producer's thread has run the refused record's report.
    pub async fn await_too_large(&self, max: Duration) -> Option<RefusedRecord> {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            if let Some(r) = self.take_too_large() {
                return Some(r);
            }
            if self.inner.in_flight_count() == 0 || tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How many partitions `topic` has now, from fresh cluster metadata.
    pub async fn partition_count(&self, topic: &str) -> Result<i32, CaptureError> {
        let inner = Arc::clone(&self.inner);
        let name = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            // A topic created a moment ago can be missing from a broker's
            // metadata for a moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let metadata = inner
                    .client()
                    .fetch_metadata(Some(&name), Duration::from_secs(10))
                    .map_err(|e| CaptureError::kafka("read topic metadata", "-", e))?;
                let count = metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == name && t.error().is_none())
                    .map_or(0, |t| t.partitions().len());
                if count > 0 {
                    return Ok(count as i32);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(CaptureError::Kafka {
                        context: "read topic metadata",
                        source: KafkaError::MetadataFetch(
                            RDKafkaErrorCode::UnknownTopicOrPartition,
                        ),
                        retriable: true,
                    });
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .await
        .map_err(CaptureError::task("kafka metadata"))?
    }

    pub fn begin(&self) -> Result<(), CaptureError> {
        self.inner
            .begin_transaction()
            .map_err(|e| CaptureError::kafka("begin_transaction", &self.transactional_id, e))
    }

    /// Queues one record, with its headers, in the open transaction, to
    /// `partition` when given (else the key's partition); waits while the
    /// local queue is full.
    pub async fn send_with_headers(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<&[(&str, &[u8])]>,
    ) -> Result<(), CaptureError> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(p) = partition {
            record = record.partition(p);
        }
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
        F: FnOnce(&ThreadedProducer<CaptureContext>) -> Result<(), KafkaError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let id = Arc::clone(&self.transactional_id);
        tokio::task::spawn_blocking(move || call(&inner))
            .await
            .map_err(CaptureError::task(context))?
            .map_err(|e| {
                self.inner
                    .context()
                    .explain(CaptureError::kafka(context, &id, e))
            })
    }
}

/// The broker refuses a `transaction.timeout.ms` above its
/// `transaction.max.timeout.ms` when the producer starts: say which setting.
fn explain_timeout(e: CaptureError, cfg: &CaptureConfig) -> CaptureError {
    match &e {
        CaptureError::Kafka { source, .. }
            if source.rdkafka_error_code() == Some(RDKafkaErrorCode::InvalidTransactionTimeout) =>
        {
            CaptureError::Prerequisite(format!(
                "the Kafka broker refuses [kafka.producer] \"transaction.timeout.ms\" = {}: it is above the broker's transaction.max.timeout.ms (900000 unless configured). Lower it (default {}) or raise the broker's limit ({e})",
                cfg.transaction_timeout_ms().unwrap_or_default(),
                crate::config::DEFAULT_TRANSACTION_TIMEOUT_MS,
            ))
        }
        _ => e,
    }
}

mod topics;

pub use topics::{check_one_partition, InternalTopic, TopicCreator};

#[cfg(test)]
mod tests;
