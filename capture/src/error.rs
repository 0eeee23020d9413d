//! What can stop capture, split by what to do about it: retry (restart the
//! pipeline from the last committed offset) or stop with a message.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The configuration cannot work; fix it and start again.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The database is not set up for capture (wal_level, publication, keys,
    /// slot plugin, privileges). The message says what to change.
    #[error("{0}")]
    Prerequisite(String),

    /// The slot was confirmed past what Kafka holds: changes in between were
    /// never published.
    #[error("{0}")]
    Gap(String),

    /// Another instance with the same connector name took over.
    #[error("this instance was fenced: another capture with transactional.id {transactional_id} started; only one instance per connector name may run ({detail})")]
    Fenced {
        transactional_id: String,
        detail: String,
    },

    /// Kafka failed; `retriable` says whether restarting from the committed offset can help.
    #[error("kafka: {context}: {source}")]
    Kafka {
        context: &'static str,
        source: KafkaError,
        retriable: bool,
    },

    /// The Kafka cluster refused the login: the credentials or the mechanism are wrong.
    #[error("kafka refused the login: {reason}. Check security.protocol, sasl.mechanisms, sasl.username and sasl.password under [kafka.producer]")]
    KafkaLogin { reason: String },

    /// A query on a connection to the source database (`database` names
    /// it) failed; `retriable`, set by the source from the error's code,
    /// says whether restarting from the committed offset can help.
    #[error("{database}: {context}: {source}")]
    Database {
        database: &'static str,
        context: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
        retriable: bool,
    },

    /// A connection to the source database could not be opened. Fatal when
    /// its TLS settings, the server's certificate or an SSL requirement is
    /// the reason; a database error is classified as a failed query is.
    #[error("postgres: connect: {source}")]
    Connect {
        source: oncely_core::postgres::ConnectError,
        retriable: bool,
    },

    /// A read from the source table could not complete yet (e.g. a
    /// transaction the stream sent is not visible yet); retrying may help.
    #[error("postgres: {0}")]
    SourceRead(String),

    /// The source's change stream failed; `retriable`, set by the source,
    /// says whether connecting again can help.
    #[error("replication stream: {source}")]
    Stream {
        source: Box<dyn std::error::Error + Send + Sync>,
        retriable: bool,
    },

    /// The replication stream carried something we cannot decode: a bug or an
    /// unsupported server; restarting would only meet it again.
    #[error("replication protocol: {0}")]
    Protocol(String),

    /// A change could not be encoded as an event (a key column missing from
    /// the row, say). Definite: the same change would fail again.
    #[error("encode: {0}")]
    Encode(#[from] crate::envelope::EnvelopeError),

    /// A task capture ran on another thread (a blocking Kafka client call,
    /// a commit) panicked or was cancelled: a bug, so fatal.
    #[error("internal task `{task}` failed: {source}")]
    Task {
        task: &'static str,
        source: tokio::task::JoinError,
    },

    /// A change's record is larger than Kafka accepts. Definite: restarting
    /// would meet the same row again, and skipping it would lose it.
    #[error(transparent)]
    RecordTooLarge(Box<TooLargeRecord>),

    /// A stored offset record could not be read.
    #[error("offset record on topic {topic} is unreadable: {reason}")]
    CorruptOffset { topic: String, reason: String },

    /// A change holds a value its field cannot carry (a `timestamp` beyond
    /// 64-bit µs, an interval beyond them under `interval.handling.mode =
    /// "numeric"`). The pipeline refuses that change — logs it, counts it in
    /// `oncely_capture_refused_changes_total{table}` and goes on — so this
    /// never stops capture.
    #[error(transparent)]
    ValueRefused(Box<RefusedValue>),

    /// A record could not be written as Avro: the schema registry is
    /// unreachable (retriable), refused the schema, or a value does not fit
    /// its Avro schema (definite: the same change would fail again).
    #[error("avro: {0}")]
    Avro(#[from] oncely_core::avro::AvroError),

    /// A record of the schema-change topic could not be read (capture reads
    /// the columns its last committed events used from it at start).
    #[error("schema-change record on topic {topic} is unreadable: {reason}; capture writes only JSON records there: remove what another producer wrote (or delete the topic, and capture takes the catalog's columns as its baseline)")]
    CorruptSchemaHistory { topic: String, reason: String },
}

/// The change behind [`CaptureError::RecordTooLarge`].
#[derive(Debug, thiserror::Error)]
#[error("a change of table {table} (key {key}) is a record of {size} bytes on topic {topic}, larger than Kafka accepts ({limit}). Capture stops rather than skip it: raise {setting}, then start capture again")]
pub struct TooLargeRecord {
    pub table: String,
    pub topic: String,
    pub key: String,
    pub size: usize,
    /// What refused it, with the limit where known.
    pub limit: String,
    /// The setting(s) to raise.
    pub setting: String,
}

/// The change behind [`CaptureError::ValueRefused`].
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct RefusedValue {
    /// `schema.table`.
    pub table: String,
    /// Names table, column, value and the fix.
    pub reason: String,
    /// The event ordinals the change takes all the same (as
    /// `Pipeline::ordinals` counts them), so the numbering of the
    /// transaction's later events does not depend on the refusal.
    pub ordinals: u64,
}

impl CaptureError {
    /// Whether restarting the pipeline from the last committed offset may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            CaptureError::Kafka { retriable, .. } => *retriable,
            CaptureError::SourceRead(_) => true,
            CaptureError::Avro(e) => e.is_retriable(),
            CaptureError::Database { retriable, .. }
            | CaptureError::Connect { retriable, .. }
            | CaptureError::Stream { retriable, .. } => *retriable,
            _ => false,
        }
    }

    /// For a failed [`tokio::task::JoinHandle`] of `task`.
    pub(crate) fn task(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> CaptureError {
        move |source| CaptureError::Task { task, source }
    }

    /// Classifies a Kafka error; a fenced producer becomes [`CaptureError::Fenced`].
    pub(crate) fn kafka(
        context: &'static str,
        transactional_id: &str,
        source: KafkaError,
    ) -> CaptureError {
        if is_fenced(&source) {
            return CaptureError::Fenced {
                transactional_id: transactional_id.to_string(),
                detail: source.to_string(),
            };
        }
        let retriable = match &source {
            // The same records would be refused again.
            _ if is_too_large(&source) => false,
            KafkaError::Transaction(e) => !e.is_fatal(),
            KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => false,
            _ => true,
        };
        CaptureError::Kafka {
            context,
            source,
            retriable,
        }
    }
}

/// Whether Kafka refused a record (or a batch) for its size: librdkafka's
/// local `message.max.bytes` check and the broker's `max.message.bytes` give
/// the same code.
pub fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fenced)
            | Some(RDKafkaErrorCode::ProducerFenced)
            | Some(RDKafkaErrorCode::InvalidProducerEpoch)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicked helper task is a bug: fatal, and named, not a "protocol" error.
    #[tokio::test]
    async fn a_failed_task_is_fatal_and_named() {
        let join = tokio::spawn(async { panic!("boom") })
            .await
            .expect_err("the task panics");
        let e = CaptureError::task("offset reader")(join);
        assert!(matches!(e, CaptureError::Task { .. }), "{e:?}");
        assert!(!e.is_retriable());
        assert!(e.to_string().contains("`offset reader`"), "{e}");
    }

    #[test]
    fn size_refusals_are_definite() {
        let local = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(!CaptureError::kafka("send", "t", local).is_retriable());
        let batch = KafkaError::MessageProduction(RDKafkaErrorCode::MessageBatchTooLarge);
        assert!(!CaptureError::kafka("send", "t", batch).is_retriable());
        let full = KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull);
        assert!(CaptureError::kafka("send", "t", full).is_retriable());
        let too_large = CaptureError::RecordTooLarge(Box::new(TooLargeRecord {
            table: "public.t".into(),
            topic: "p.public.t".into(),
            key: "{\"id\":1}".into(),
            size: 2_000_000,
            limit: "1048576".into(),
            setting: "topic.creation.default.max.message.bytes".into(),
        }));
        assert!(!too_large.is_retriable());
    }
}
