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

    /// The control connection to PostgreSQL failed.
    #[error("postgres: {context}: {source}")]
    Postgres {
        context: &'static str,
        source: tokio_postgres::Error,
    },

    /// The replication stream failed.
    #[error("replication stream: {0}")]
    Replication(#[from] pgwire_replication::PgWireError),

    /// The replication stream carried something we cannot decode: a bug or an
    /// unsupported server; restarting would only meet it again.
    #[error("replication protocol: {0}")]
    Protocol(String),

    /// A change's record is larger than Kafka accepts. Definite: restarting
    /// would meet the same row again, and skipping it would lose it.
    #[error(transparent)]
    RecordTooLarge(Box<TooLargeRecord>),

    /// A stored offset record could not be read.
    #[error("offset record on topic {topic} is unreadable: {reason}")]
    CorruptOffset { topic: String, reason: String },
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

impl CaptureError {
    /// Whether restarting the pipeline from the last committed offset may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            CaptureError::Kafka { retriable, .. } => *retriable,
            CaptureError::Postgres { source, .. } => {
                // Transient unless the server said something definite about us.
                source.code().is_none() || source.is_closed()
            }
            CaptureError::Replication(e) => {
                use pgwire_replication::PgWireError as E;
                match e {
                    E::Io(_) | E::Task(_) => true,
                    // "replication slot ... is active for PID": the previous
                    // instance's walsender has not exited yet.
                    E::Server(msg) => msg.contains("55006") || msg.contains("is active for PID"),
                    _ => false,
                }
            }
            _ => false,
        }
    }

    pub(crate) fn pg(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CaptureError {
        move |source| CaptureError::Postgres { context, source }
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
