//! `[sink] kind = "http"`: keys, defaults and checks.
//!
//! Keys are dotted; inside `[sink]` they may be written bare
//! (`request.timeout.ms = 5000`) or quoted. `auth.value` accepts
//! `${env:NAME}` and `${file:PATH}` and is never logged; so does `url`,
//! which is shown as its scheme, host and port only (a Slack-style webhook
//! carries its secret in the path).

use std::path::PathBuf;
use std::time::Duration;

use oncely_core::config::in_range;
use serde::Deserialize;

use crate::error::ConfigError;
use oncely_core::{Secret, SecretUrl};

/// Default `batch.size`: one change per request (the body is one JSON object).
pub const DEFAULT_BATCH_SIZE: usize = 1;
/// Default `request.timeout.ms`.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default `max.concurrency`: requests in flight at once, all partitions.
pub const DEFAULT_MAX_CONCURRENCY: usize = 16;
/// Default `retry.max.attempts`: attempts of one request before the batch is
/// handed back to the runner as a retriable failure (which retries it whole).
pub const DEFAULT_RETRY_MAX_ATTEMPTS: u32 = 5;
/// Default `retry.backoff.ms`.
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 100;
/// Default `retry.backoff.max.ms`.
pub const DEFAULT_RETRY_BACKOFF_MAX_MS: u64 = 10_000;
/// Default `retry.after.max.ms`: the longest `Retry-After` honoured.
pub const DEFAULT_RETRY_AFTER_MAX_MS: u64 = 60_000;
/// Default `auth.header`.
pub const DEFAULT_AUTH_HEADER: &str = "Authorization";

/// The `[sink]` table of `kind = "http"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `url`: where changes are POSTed (`http://` or `https://`); shown
    /// without its path and query, which may hold the webhook's secret.
    pub url: SecretUrl,
    /// `batch.size`: changes per request; above 1 the body is a JSON array.
    #[serde(rename = "batch.size", default = "default_batch_size")]
    pub batch_size: usize,
    /// `request.timeout.ms`: a request taking longer is retried.
    #[serde(rename = "request.timeout.ms", default = "default_timeout")]
    pub request_timeout_ms: u64,
    /// `max.concurrency`: requests in flight at once (different keys only).
    #[serde(rename = "max.concurrency", default = "default_concurrency")]
    pub max_concurrency: usize,
    /// `retry.max.attempts`: attempts per request inside one batch attempt.
    #[serde(rename = "retry.max.attempts", default = "default_attempts")]
    pub retry_max_attempts: u32,
    /// `retry.backoff.ms`: first delay between attempts.
    #[serde(rename = "retry.backoff.ms", default = "default_backoff")]
    pub retry_backoff_ms: u64,
    /// `retry.backoff.max.ms`: cap of the exponential backoff.
    #[serde(rename = "retry.backoff.max.ms", default = "default_backoff_max")]
    pub retry_backoff_max_ms: u64,
    /// `retry.after.max.ms`: a longer `Retry-After` is cut to this.
    #[serde(rename = "retry.after.max.ms", default = "default_retry_after_max")]
    pub retry_after_max_ms: u64,
    /// `auth.header`: the header carrying `auth.value` (default `Authorization`).
    #[serde(rename = "auth.header", default = "default_auth_header")]
    pub auth_header: String,
    /// `auth.value`: e.g. `${env:WEBHOOK_AUTH}` holding `Bearer ...`. Unset: no header.
    #[serde(rename = "auth.value", default)]
    pub auth_value: Option<Secret>,
    /// `tls.ca.file`: PEM CA certificate(s) to trust for `https://` (default: the webpki roots).
    #[serde(rename = "tls.ca.file", default)]
    pub tls_ca_file: Option<PathBuf>,
    /// `fields.include`: the only columns stored, with the key fields
    /// ([`crate::fields`]); not with `fields.exclude`.
    #[serde(rename = "fields.include", default)]
    pub fields_include: Vec<String>,
    /// `fields.exclude`: columns never stored; key fields may not be listed
    /// ([`crate::fields`]).
    #[serde(rename = "fields.exclude", default)]
    pub fields_exclude: Vec<String>,
}

fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}
fn default_timeout() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}
fn default_concurrency() -> usize {
    DEFAULT_MAX_CONCURRENCY
}
fn default_attempts() -> u32 {
    DEFAULT_RETRY_MAX_ATTEMPTS
}
fn default_backoff() -> u64 {
    DEFAULT_RETRY_BACKOFF_MS
}
fn default_backoff_max() -> u64 {
    DEFAULT_RETRY_BACKOFF_MAX_MS
}
fn default_retry_after_max() -> u64 {
    DEFAULT_RETRY_AFTER_MAX_MS
}
fn default_auth_header() -> String {
    DEFAULT_AUTH_HEADER.into()
}

impl HttpConfig {
    /// Checks the values; errors name `sink.<key>` and say what is expected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = reqwest::Url::parse(self.url.expose().trim()).map_err(|e| {
            ConfigError::new(
                "sink.url",
                format!("not a URL ({e}), e.g. https://hooks.example.com/oncely"),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::new("sink.url", "must be http:// or https://"));
        }
        if self.tls_ca_file.is_some() && url.scheme() != "https" {
            return Err(ConfigError::new(
                "sink.tls.ca.file",
                "only used with an https:// url",
            ));
        }
        let range =
            |key: &str, v: u64, min: u64, max: u64| in_range(format!("sink.{key}"), v, min, max);
        range("batch.size", self.batch_size as u64, 1, 10_000)?;
        range("request.timeout.ms", self.request_timeout_ms, 1, 600_000)?;
        range("max.concurrency", self.max_concurrency as u64, 1, 4096)?;
        range(
            "retry.max.attempts",
            u64::from(self.retry_max_attempts),
            1,
            1000,
        )?;
        range("retry.backoff.ms", self.retry_backoff_ms, 1, 3_600_000)?;
        range(
            "retry.backoff.max.ms",
            self.retry_backoff_max_ms,
            self.retry_backoff_ms,
            3_600_000,
        )?;
        range("retry.after.max.ms", self.retry_after_max_ms, 0, 3_600_000)?;
        reqwest::header::HeaderName::from_bytes(self.auth_header.as_bytes())
            .map_err(|_| ConfigError::new("sink.auth.header", "not a valid HTTP header name"))?;
        Ok(())
    }

    /// `request.timeout.ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// `retry.after.max.ms` as a duration.
    pub fn retry_after_max(&self) -> Duration {
        Duration::from_millis(self.retry_after_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use crate::kinds::{parse_config, SinkConfig};

    const HEAD: &str = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n";

    fn parse(sink: &str) -> Result<super::HttpConfig, String> {
        match parse_config(&format!("{HEAD}[sink]\nkind = \"http\"\n{sink}")) {
            Ok((_, SinkConfig::Http(c))) => Ok(c),
            Ok(_) => Err("another kind".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn defaults_and_bare_dotted_keys() {
        let c = parse("url = \"http://h/x\"\nbatch.size = 10\nrequest.timeout.ms = 500\n")
            .expect("valid");
        assert_eq!(c.batch_size, 10);
        assert_eq!(c.request_timeout_ms, 500);
        assert_eq!(c.max_concurrency, super::DEFAULT_MAX_CONCURRENCY);
        assert_eq!(c.auth_header, "Authorization");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("url = \"ftp://h/x\"\n", "sink.url"),
            ("url = \"not a url\"\n", "sink.url"),
            ("url = \"http://h\"\nbatch.size = 0\n", "sink.batch.size"),
            (
                "url = \"http://h\"\ntls.ca.file = \"/ca.pem\"\n",
                "sink.tls.ca.file",
            ),
            (
                "url = \"http://h\"\nauth.header = \"a b\"\n",
                "sink.auth.header",
            ),
            ("url = \"http://h\"\nbatch.sise = 2\n", "batch.sise"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn the_window_is_on_by_default_and_can_be_turned_off() {
        use crate::runner::dedup::DedupStore;
        let (runner, _) = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"http\"\nurl = \"http://h\"\n"
        ))
        .expect("valid");
        assert_eq!(
            runner.dedup.expect("default window").store,
            DedupStore::Memory
        );
        let (runner, _) = parse_config(&format!(
            "{HEAD}[dedup]\nstore = \"none\"\n[sink]\nkind = \"http\"\nurl = \"http://h\"\n"
        ))
        .expect("valid");
        assert_eq!(runner.dedup.expect("explicit").store, DedupStore::None);
    }

    #[test]
    fn the_example_is_valid() {
        let text = include_str!("../../../../examples/sink-http.toml");
        // Its `${env:..}` reference is resolved when read (left alone when set).
        if std::env::var_os("ONCELY_REDIS_URL").is_none() {
            std::env::set_var("ONCELY_REDIS_URL", "redis://127.0.0.1:6379");
        }
        let (runner, sink) = parse_config(text).expect("examples/sink-http.toml is valid");
        assert!(matches!(sink, SinkConfig::Http(_)));
        assert!(runner.dedup.is_some());
    }
}
