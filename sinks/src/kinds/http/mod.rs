//! `http`: webhooks — each change POSTed as JSON to a URL. Kafka holds the
//! positions; a dedup window (`[dedup]`, in memory unless configured) stands
//! in front of it by default.
//!
//! ```toml
//! [sink]
//! kind = "http"
//! url = "https://hooks.example.com/oncely"
//! # batch.size = 1                       # changes per request (>1: a JSON array)
//! # auth.value = "${env:WEBHOOK_AUTH}"   # e.g. "Bearer ..."; header auth.header
//! # tls.ca.file = "/etc/oncely/hooks-ca.pem"
//! ```
//!
//! # Requests
//!
//! One `POST` per change (`batch.size = 1`, the default) with the body of the
//! `file` sink's lines (`topic`, `partition`, `offset`, `key`, `op`, `lsn`,
//! `seq`, `before`, `after`) plus `idempotency_key`, and the header
//! `Idempotency-Key: <topic>/<commit_lsn>/<event_seq>` — the event's source
//! position, the same identity the dedup window keeps. With `batch.size > 1`
//! the body is an array of such objects and the header `<first>..<last>`; a
//! receiver then deduplicates by each object's `idempotency_key` (a batch is
//! cut differently after a restart). Plain tombstones and Debezium
//! bookkeeping records are not sent.
//!
//! # Order and concurrency
//!
//! The changes of one key go out one after another, in offset order (a
//! batch's changes are split into lanes by key hash); different keys go out
//! concurrently, at most `max.concurrency` requests in flight for the whole
//! sink. A key's next change is sent only after the previous one was
//! answered 2xx or dead-lettered.
//!
//! # Failures
//!
//! See [`error`]: timeouts, 408, 425, 429 and 5xx are retried with the
//! jittered exponential backoff (`retry.backoff.ms`, `retry.backoff.max.ms`),
//! never sooner than the answer's `Retry-After` (seconds or an HTTP-date, at most
//! `retry.after.max.ms`), up to `retry.max.attempts` times; then the batch goes
//! back to the runner, which retries it whole after its own backoff. Other
//! 4xx answers are dead letters, their reason `webhook answered <status>:
//! <body excerpt>`; 401/403 (credentials) and 3xx (redirects are not
//! followed) stop the sink.
//!
//! # Delivery
//!
//! At least once to the receiver, effectively once with a receiver that
//! honours `Idempotency-Key`; the dedup window keeps the repeats small (see
//! [`crate::runner::dedup`] for its exact guarantee). A batch that failed
//! part-way (a retriable failure or a dead letter) is sent again whole: the
//! changes already answered 2xx go out once more, with the same key.

pub mod config;
pub mod error;
pub mod sink;

pub use config::HttpConfig;
pub use sink::{HttpSink, HEADER_IDEMPOTENCY_KEY};

#[async_trait::async_trait]
impl super::SinkKind for HttpConfig {
    fn validate(&self) -> Result<(), crate::error::ConfigError> {
        HttpConfig::validate(self)
    }
    fn field_selection(
        &self,
    ) -> Result<Option<crate::fields::FieldSelection>, crate::error::ConfigError> {
        crate::fields::FieldSelection::parse(&self.fields_include, &self.fields_exclude)
    }
    async fn build(
        &self,
    ) -> Result<std::sync::Arc<dyn crate::sink::Sink>, crate::error::SinkError> {
        Ok(std::sync::Arc::new(HttpSink::connect(self)?))
    }
    /// A webhook cannot compare versions.
    fn wants_dedup_window(&self) -> bool {
        true
    }
}
