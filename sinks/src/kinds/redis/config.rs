//! `[sink] kind = "redis"`: keys, defaults and checks.
//!
//! Keys are dotted like Kafka Connect's; inside `[sink]` they may be written
//! bare (`key.pattern = "..."`) or quoted (`"key.pattern" = "..."`). The
//! `password` accepts `${env:NAME}` and `${file:PATH}` and is never logged.
//! `rediss://` URLs connect with TLS (rustls), trusting the CAs of
//! `tls.ca.file` or, without it, the system's.

use std::time::Duration;

use oncely_core::config::in_range;
use serde::Deserialize;

use crate::error::ConfigError;
use crate::native::ValueFormat;
use oncely_core::Secret;

/// Default `url`.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
/// Default `key.pattern`: `<table>:<primary key>`.
pub const DEFAULT_KEY_PATTERN: &str = "{table}:{key}";
/// Default `key.separator`: joins the values of a composite primary key in `{key}`.
pub const DEFAULT_KEY_SEPARATOR: &str = ":";
/// Default `version.key.prefix`: each row's version lives at `<prefix><row key>`.
pub const DEFAULT_VERSION_PREFIX: &str = "oncely:v:";
/// Default `version.field`: the hash field holding a live row's version (hash layout).
pub const DEFAULT_VERSION_FIELD: &str = "_oncely_version";
/// Default `keyset.key.prefix`: a table's row keys live in the set `<prefix><db>.<schema>.<table>`.
pub const DEFAULT_KEYSET_PREFIX: &str = "oncely:keyset:";
/// Default `fence.key.prefix`: a partition's fence is the hash `<prefix><topic>:<partition>`.
pub const DEFAULT_FENCE_PREFIX: &str = "oncely:fence:";
/// Default `positions.key.prefix`: a group's positions live in the hash `<prefix><group.id>`.
pub const DEFAULT_POSITIONS_PREFIX: &str = "oncely:positions:";
/// Default `ttl.seconds`: rows never expire.
pub const DEFAULT_TTL_SECONDS: u64 = 0;
/// Default `tombstone.ttl.seconds`: a deleted row's version is kept 7 days.
pub const DEFAULT_TOMBSTONE_TTL_SECONDS: u64 = 7 * 24 * 3600;
/// Default `script.max.changes`: changes per script call (bounds how long Redis is blocked).
pub const DEFAULT_SCRIPT_MAX_CHANGES: usize = 1000;
/// Default `script.max.bytes`: argument bytes per script call.
pub const DEFAULT_SCRIPT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Default `connect.timeout.ms`.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Default `response.timeout.ms`: must exceed the longest script call.
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 10_000;
/// Default `reconnect.backoff.max.ms`: cap of the jittered exponential reconnect backoff.
pub const DEFAULT_RECONNECT_BACKOFF_MAX_MS: u64 = 5_000;
/// Default `reconnect.retries`: reconnect attempts per failure before the error reaches
/// the runner (which retries the batch with its own backoff).
pub const DEFAULT_RECONNECT_RETRIES: usize = 6;
/// Upper bound of `script.max.changes`.
pub const MAX_SCRIPT_CHANGES: usize = 10_000;
/// Placeholders `key.pattern` may use.
pub const KEY_PLACEHOLDERS: &[&str] = &["{topic}", "{db}", "{schema}", "{table}", "{key}"];

/// How a row is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A hash per row: one field per non-null column (strings as is, other values as JSON text).
    #[default]
    Hash,
    /// A string per row holding the row as a JSON object (columns in table order).
    Json,
}

/// `[sink] kind = "redis"` (see the module docs of [`super`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `url`: `redis://host:port[/db]`, or `rediss://...` for TLS.
    #[serde(default = "default_url")]
    pub url: String,
    /// `username`: ACL user (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// `password`: AUTH password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// `tls.ca.file`: PEM file of the CAs to trust for `rediss://` (default: the system's).
    #[serde(rename = "tls.ca.file", default)]
    pub tls_ca_file: Option<String>,
    /// `layout`: `hash` (default) or `json`.
    #[serde(default)]
    pub layout: Layout,
    /// `value.format`: `native` (default: dates and times as ISO-8601, JSON
    /// columns nested in the JSON layout; [`crate::native`]) or `wire` (as
    /// in Kafka).
    #[serde(rename = "value.format", default)]
    pub value_format: ValueFormat,
    /// `key.pattern`: the row key from `{topic}`, `{db}`, `{schema}`, `{table}`, `{key}`.
    #[serde(rename = "key.pattern", default = "default_key_pattern")]
    pub key_pattern: String,
    /// `key.separator`: between the values of a composite primary key.
    #[serde(rename = "key.separator", default = "default_key_separator")]
    pub key_separator: String,
    /// `version.key.prefix`: prefix of a deleted row's tombstone key (and, in
    /// the JSON layout, of each live row's version key).
    #[serde(rename = "version.key.prefix", default = "default_version_prefix")]
    pub version_prefix: String,
    /// `version.field`: the hash field holding a live row's version (hash layout).
    #[serde(rename = "version.field", default = "default_version_field")]
    pub version_field: String,
    /// `positions.key.prefix`: prefix of the hash holding a group's positions.
    #[serde(rename = "positions.key.prefix", default = "default_positions_prefix")]
    pub positions_prefix: String,
    /// `keyset.key.prefix`: prefix of the set of a table's row keys (what a truncate removes).
    #[serde(rename = "keyset.key.prefix", default = "default_keyset_prefix")]
    pub keyset_prefix: String,
    /// `fence.key.prefix`: prefix of each partition's fence (which runner
    /// may write its keys) and of the truncate counter.
    #[serde(rename = "fence.key.prefix", default = "default_fence_prefix")]
    pub fence_prefix: String,
    /// `ttl.seconds`: rows (and their versions) expire after this long; 0 = never.
    #[serde(rename = "ttl.seconds", default)]
    pub ttl_seconds: u64,
    /// `tombstone.ttl.seconds`: how long a deleted row's version is kept; 0 = forever.
    #[serde(rename = "tombstone.ttl.seconds", default = "default_tombstone_ttl")]
    pub tombstone_ttl_seconds: u64,
    /// `script.max.changes`: changes per script call.
    #[serde(rename = "script.max.changes", default = "default_max_changes")]
    pub script_max_changes: usize,
    /// `script.max.bytes`: argument bytes per script call (a larger single change goes alone).
    #[serde(rename = "script.max.bytes", default = "default_max_bytes")]
    pub script_max_bytes: usize,
    /// `connect.timeout.ms`.
    #[serde(rename = "connect.timeout.ms", default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    /// `response.timeout.ms`.
    #[serde(rename = "response.timeout.ms", default = "default_response_timeout")]
    pub response_timeout_ms: u64,
    /// `reconnect.backoff.max.ms`.
    #[serde(rename = "reconnect.backoff.max.ms", default = "default_backoff_max")]
    pub reconnect_backoff_max_ms: u64,
    /// `reconnect.retries`.
    #[serde(rename = "reconnect.retries", default = "default_reconnect_retries")]
    pub reconnect_retries: usize,
    /// `fields.include`: the only columns stored, with the key fields
    /// ([`crate::fields`]); not with `fields.exclude`.
    #[serde(rename = "fields.include", default)]
    pub fields_include: Vec<String>,
    /// `fields.exclude`: columns never stored; key fields may not be listed
    /// ([`crate::fields`]).
    #[serde(rename = "fields.exclude", default)]
    pub fields_exclude: Vec<String>,
}

fn default_url() -> String {
    DEFAULT_URL.into()
}
fn default_key_pattern() -> String {
    DEFAULT_KEY_PATTERN.into()
}
fn default_key_separator() -> String {
    DEFAULT_KEY_SEPARATOR.into()
}
fn default_version_prefix() -> String {
    DEFAULT_VERSION_PREFIX.into()
}
fn default_version_field() -> String {
    DEFAULT_VERSION_FIELD.into()
}
fn default_positions_prefix() -> String {
    DEFAULT_POSITIONS_PREFIX.into()
}
fn default_keyset_prefix() -> String {
    DEFAULT_KEYSET_PREFIX.into()
}
fn default_fence_prefix() -> String {
    DEFAULT_FENCE_PREFIX.into()
}
fn default_tombstone_ttl() -> u64 {
    DEFAULT_TOMBSTONE_TTL_SECONDS
}
fn default_max_changes() -> usize {
    DEFAULT_SCRIPT_MAX_CHANGES
}
fn default_max_bytes() -> usize {
    DEFAULT_SCRIPT_MAX_BYTES
}
fn default_connect_timeout() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_response_timeout() -> u64 {
    DEFAULT_RESPONSE_TIMEOUT_MS
}
fn default_backoff_max() -> u64 {
    DEFAULT_RECONNECT_BACKOFF_MAX_MS
}
fn default_reconnect_retries() -> usize {
    DEFAULT_RECONNECT_RETRIES
}

impl RedisConfig {
    /// A configuration with every default, writing to `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            username: None,
            password: None,
            tls_ca_file: None,
            layout: Layout::Hash,
            value_format: ValueFormat::Native,
            key_pattern: DEFAULT_KEY_PATTERN.into(),
            key_separator: DEFAULT_KEY_SEPARATOR.into(),
            version_prefix: DEFAULT_VERSION_PREFIX.into(),
            version_field: DEFAULT_VERSION_FIELD.into(),
            positions_prefix: DEFAULT_POSITIONS_PREFIX.into(),
            keyset_prefix: DEFAULT_KEYSET_PREFIX.into(),
            fence_prefix: DEFAULT_FENCE_PREFIX.into(),
            ttl_seconds: DEFAULT_TTL_SECONDS,
            tombstone_ttl_seconds: DEFAULT_TOMBSTONE_TTL_SECONDS,
            script_max_changes: DEFAULT_SCRIPT_MAX_CHANGES,
            script_max_bytes: DEFAULT_SCRIPT_MAX_BYTES,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            response_timeout_ms: DEFAULT_RESPONSE_TIMEOUT_MS,
            reconnect_backoff_max_ms: DEFAULT_RECONNECT_BACKOFF_MAX_MS,
            reconnect_retries: DEFAULT_RECONNECT_RETRIES,
            fields_include: Vec::new(),
            fields_exclude: Vec::new(),
        }
    }

    /// Checks the values (the password was resolved when the configuration was read); errors name `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim();
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(ConfigError::new(
                "sink.url",
                "must start with redis:// or rediss:// (TLS)",
            ));
        }
        if self.tls_ca_file.is_some() && !url.starts_with("rediss://") {
            return Err(ConfigError::new(
                "sink.tls.ca.file",
                "set, but `url` is not rediss:// (TLS)",
            ));
        }
        if !self.key_pattern.contains("{key}") {
            return Err(ConfigError::new(
                "sink.key.pattern",
                "must contain {key}, or rows of different keys would share one Redis key",
            ));
        }
        let mut rest = self.key_pattern.clone();
        for p in KEY_PLACEHOLDERS {
            rest = rest.replace(p, "");
        }
        if rest.contains('{') || rest.contains('}') {
            return Err(ConfigError::new(
                "sink.key.pattern",
                format!(
                    "unknown placeholder; known: {}",
                    KEY_PLACEHOLDERS.join(", ")
                ),
            ));
        }
        // Values are escaped up to the text that ends them (see `KeyPattern`):
        // two placeholders side by side could split their text anywhere.
        if let Some(pair) = KEY_PLACEHOLDERS.iter().find_map(|a| {
            KEY_PLACEHOLDERS
                .iter()
                .map(|b| format!("{a}{b}"))
                .find(|ab| self.key_pattern.contains(ab.as_str()))
        }) {
            return Err(ConfigError::new(
                "sink.key.pattern",
                format!("{pair}: put a character such as ':' between two placeholders, or keys of different rows could be equal"),
            ));
        }
        if self.key_separator.is_empty() || self.key_separator.contains('\\') {
            return Err(ConfigError::new(
                "sink.key.separator",
                "must not be empty nor contain '\\' (the escape character of key values)",
            ));
        }
        if self.version_prefix.is_empty() {
            return Err(ConfigError::new(
                "sink.version.key.prefix",
                "must not be empty (versions would overwrite rows)",
            ));
        }
        if self.version_field.is_empty() {
            return Err(ConfigError::new("sink.version.field", "must not be empty"));
        }
        if self.positions_prefix.is_empty() {
            return Err(ConfigError::new(
                "sink.positions.key.prefix",
                "must not be empty",
            ));
        }
        if self.keyset_prefix.is_empty() {
            return Err(ConfigError::new(
                "sink.keyset.key.prefix",
                "must not be empty (key sets would share names with rows)",
            ));
        }
        if self.fence_prefix.is_empty() {
            return Err(ConfigError::new(
                "sink.fence.key.prefix",
                "must not be empty (fences would share names with rows)",
            ));
        }
        in_range(
            "sink.script.max.changes",
            self.script_max_changes,
            1,
            MAX_SCRIPT_CHANGES,
        )?;
        in_range(
            "sink.script.max.bytes",
            self.script_max_bytes,
            1024,
            512 * 1024 * 1024,
        )?;
        for (key, v) in [
            ("sink.connect.timeout.ms", self.connect_timeout_ms),
            ("sink.response.timeout.ms", self.response_timeout_ms),
            (
                "sink.reconnect.backoff.max.ms",
                self.reconnect_backoff_max_ms,
            ),
        ] {
            in_range(key, v, 1, 3_600_000)?;
        }
        if self.reconnect_retries > 100 {
            return Err(ConfigError::new(
                "sink.reconnect.retries",
                "must be at most 100",
            ));
        }
        if self.username.is_some() && self.password.is_none() {
            return Err(ConfigError::new(
                "sink.password",
                "required when `username` is set",
            ));
        }
        Ok(())
    }

    /// `ttl.seconds` in milliseconds (0 = none).
    pub(super) fn ttl_ms(&self) -> u64 {
        self.ttl_seconds.saturating_mul(1000)
    }

    /// `tombstone.ttl.seconds` in milliseconds (0 = forever).
    pub(super) fn tombstone_ttl_ms(&self) -> u64 {
        self.tombstone_ttl_seconds.saturating_mul(1000)
    }

    /// `connect.timeout.ms` as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// `response.timeout.ms` as a duration.
    pub fn response_timeout(&self) -> Duration {
        Duration::from_millis(self.response_timeout_ms)
    }
}
