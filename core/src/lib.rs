//! oncely-core: the one home of what capture, the sinks and verify share.
//!
//! [`avro`] (the Avro converter: Connect schemas and payloads to Avro and
//! back, Confluent's wire format, the schema registry client),
//! [`kafka`] (the connection properties every Kafka client needs),
//! [`config`] (the one loader of dotted keys and its [`ConfigError`]),
//! [`wire`] (the envelope's ops, the unavailable-value marker, LSN text),
//! [`sql`] (identifier and literal quoting), [`backoff`] (jittered
//! exponential backoff and the retry loops), [`secret`] (values that never print themselves, `${env:..}` and
//! `${file:..}` references, URLs and configuration errors told without the
//! secrets in them), [`tls`] (the rustls provider, CA files, client
//! certificates, the `sslmode` verifiers), [`postgres`] (the one
//! PostgreSQL connection builder: `sslmode` and friends, connecting, and the
//! errors that retrying cannot fix), [`endpoint`] (the HTTP listener of
//! `/metrics`, `/healthz` and `/readyz`) and [`log_limit`] (rate-limited
//! warnings), [`calendar`] (days to dates, the
//! wire's infinity sentinels), [`clock`] (the one `now_ms`) and [`shutdown`]
//! (the one SIGTERM/SIGINT listener).

pub mod avro;
pub mod backoff;
pub mod calendar;
pub mod clock;
pub mod config;
pub mod endpoint;
pub mod kafka;
pub mod log_limit;
pub mod postgres;
pub mod secret;
pub mod shutdown;
pub mod sql;
pub mod tls;
pub mod wire;

pub use config::ConfigError;
pub use secret::{redact_url, redact_url_path, toml_error, Secret, SecretError, SecretUrl};
