//! The three kinds of failure a sink can report, and the runner's own errors.
//!
//! A [`SinkError`] is classified by its variant, never by its message:
//!
//! | variant | runner reaction |
//! | --- | --- |
//! | [`SinkError::Retriable`] | the same batch is applied again after a jittered, capped exponential backoff |
//! | [`SinkError::Rejected`] | the named records go to the dead-letter topic, the rest of the batch is applied again |
//! | [`SinkError::Quarantined`] | the batch's partition stops (nothing of it applied, no position stored) and is reported; every other partition goes on |
//! | [`SinkError::Fatal`] | the runner stops cleanly without acknowledging the batch, and exits non-zero |
//!
//! A sink that cannot tell whether an error is transient should report it as
//! retriable ("transient unless proven otherwise"): a retried batch is harmless
//! because sinks are idempotent by version, while a wrongly fatal error stops
//! the pipeline and a wrongly rejected record loses data to the dead-letter topic.

/// A boxed error source, kept so that logs show the whole chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One record of a batch that can never be applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordFailure {
    /// Kafka offset of the record inside the batch's partition.
    pub offset: i64,
    /// Human-readable reason, written to the `oncely.dlq.error` header.
    pub reason: String,
}

impl RecordFailure {
    /// A failure for the record at `offset`.
    pub fn new(offset: i64, reason: impl Into<String>) -> Self {
        Self {
            offset,
            reason: reason.into(),
        }
    }
}

/// What went wrong while a sink applied a batch (see the module docs for the runner's reaction).
///
/// Contract shared by every variant: when `apply` returns an error, the sink
/// must not have stored the batch's position. Data it did write must be safe
/// to write again (it is, when writes are versioned).
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A transient failure (connection lost, timeout, overload, lock conflict): retry the batch.
    #[error("transient sink error: {message}")]
    Retriable {
        /// What failed.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// These records can never be applied (malformed, violate the target's schema).
    /// Nothing of the batch was committed; the runner dead-letters them and applies the rest.
    #[error("{} record(s) rejected by the sink", .0.len())]
    Rejected(Vec<RecordFailure>),
    /// One source table cannot be applied until a setting or the target
    /// changes (two tables mapped to one target, a source column named like
    /// the sink's own): the runner sets the batch's partition aside — nothing
    /// of the batch applied, no position stored — reports it on `/readyz`,
    /// in the log and a metric, and goes on with every other partition. Once
    /// the sink starts again after the fix, the partition replays from its
    /// stored position.
    #[error("table quarantined: {message}")]
    Quarantined {
        /// What is wrong and the fix.
        message: String,
    },
    /// A failure that retrying cannot fix (bad credentials, missing target, fenced writer).
    #[error("fatal sink error: {message}")]
    Fatal {
        /// What failed.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl SinkError {
    /// A transient error with a message only.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self::Retriable {
            message: message.into(),
            source: None,
        }
    }

    /// A transient error wrapping its cause.
    pub fn retriable_from(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Retriable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A fatal error with a message only.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::Fatal {
            message: message.into(),
            source: None,
        }
    }

    /// A fatal error wrapping its cause.
    pub fn fatal_from(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Fatal {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A table that cannot be applied until a setting or the target changes.
    pub fn quarantine(message: impl Into<String>) -> Self {
        Self::Quarantined {
            message: message.into(),
        }
    }

    /// True when only the batch's partition must stop.
    pub fn is_quarantine(&self) -> bool {
        matches!(self, Self::Quarantined { .. })
    }

    /// True when applying the same batch again may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Retriable { .. })
    }

    /// True when the runner must stop.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Fatal { .. })
    }

    /// The per-record failures, when this error rejects records.
    pub fn rejected(&self) -> Option<&[RecordFailure]> {
        match self {
            Self::Rejected(failures) => Some(failures),
            _ => None,
        }
    }
}

/// A bad configuration value, named by its configuration key: the one type
/// of capture, the sinks and verify, from `oncely-core`.
pub use oncely_core::config::ConfigError;

/// Why the runner stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// Kafka refused or failed an operation the runner cannot continue without.
    #[error("kafka: {context}: {source}")]
    Kafka {
        /// What the runner was doing.
        context: String,
        /// The client error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The sink reported a fatal error (or a record failure with no dead-letter topic).
    #[error("sink stopped the runner: {0}")]
    Sink(#[source] SinkError),
    /// An I/O error outside Kafka and the sink (metrics listener, signals).
    #[error("{context}: {source}")]
    Io {
        /// What the runner was doing.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An internal task died; a bug, reported rather than hidden.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunnerError {
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        Self::Kafka {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_is_by_variant() {
        assert!(SinkError::retriable("x").is_retriable());
        assert!(!SinkError::retriable("x").is_fatal());
        assert!(SinkError::fatal("x").is_fatal());
        assert!(!SinkError::fatal("x").is_retriable());
        let rejected = SinkError::Rejected(vec![RecordFailure::new(7, "bad")]);
        assert!(!rejected.is_retriable() && !rejected.is_fatal());
        assert_eq!(rejected.rejected().map(|f| f[0].offset), Some(7));
    }

    #[test]
    fn config_error_names_the_field() {
        let e = ConfigError::new("batch.max.records", "must be at least 1");
        assert_eq!(e.to_string(), "`batch.max.records`: must be at least 1");
    }
}
