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

    /// A read from the source table could not complete yet (e.g. a
    /// transaction the stream sent is not visible yet); retrying may help.
    #[error("postgres: {0}")]
    SourceRead(String),

    /// The replication stream failed.
    #[error("replication stream: {0}")]
    Replication(#[from] pgwire_replication::PgWireError),

    /// The replication stream carried something we cannot decode: a bug or an
    /// unsupported server; restarting would only meet it again.
    #[error("replication protocol: {0}")]
    Protocol(String),

    /// A stored offset record could not be read.
    #[error("offset record on topic {topic} is unreadable: {reason}")]
    CorruptOffset { topic: String, reason: String },
}

impl CaptureError {
    /// Whether restarting the pipeline from the last committed offset may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            CaptureError::Kafka { retriable, .. } => *retriable,
            CaptureError::SourceRead(_) => true,
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

fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fenced)
            | Some(RDKafkaErrorCode::ProducerFenced)
            | Some(RDKafkaErrorCode::InvalidProducerEpoch)
    )
}
