//! The runner's configuration: Kafka-familiar keys, checked before anything starts.
//!
//! Keys use the dotted names of Kafka and Kafka Connect (`bootstrap.servers`,
//! `group.id`, `topics`, `topics.regex`, `errors.deadletterqueue.topic.name`,
//! ...). In TOML they may be written bare (`batch.max.records = 500`, which TOML
//! reads as nested tables) or quoted (`"batch.max.records" = 500`); both mean
//! the same. `"topics.regex"` must be quoted when `topics` is also set, since
//! TOML cannot make `topics` both a list and a table. Unknown keys are errors.
//! See `examples/sink.toml` for an annotated file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use oncely_core::config::{check_keys, flatten, flatten_value, from_flat, in_range, keys, Leaves};

use crate::error::ConfigError;
use crate::runner::dedup::DedupConfig;

/// Default `batch.max.records`.
pub const DEFAULT_BATCH_MAX_RECORDS: usize = 1000;
/// Default `batch.max.ms`.
pub const DEFAULT_BATCH_MAX_MS: u64 = 50;
/// Default `max.inflight.bytes`: raw bytes read from Kafka and not yet applied, all partitions.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 32 * 1024 * 1024;
/// Default `retry.backoff.ms`.
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 100;
/// Default `retry.backoff.max.ms`.
pub const DEFAULT_RETRY_BACKOFF_MAX_MS: u64 = 30_000;
/// Default `shutdown.timeout.ms`.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// Default `health.ready.max.lag.ms`: how long a partition's applied position
/// may stay ahead of its Kafka commit, and the poll loop may stall, before
/// `/readyz` answers 503.
pub const DEFAULT_READY_MAX_LAG_MS: u64 = 60_000;
/// Default `topic.heartbeat.prefix` (Debezium's heartbeat topics).
pub const DEFAULT_HEARTBEAT_PREFIX: &str = "__debezium-heartbeat";
/// Default `ignore.topics`: capture's offsets topics (`oncely-offsets-<connector>`
/// by default, `oncely-offsets` before).
pub const DEFAULT_IGNORED_TOPIC: &str = "oncely-offsets(-.+)?";
/// Default `ignore.topics` too: capture's schema-change topics
/// (`<topic.prefix>.schema-changes`), which hold no rows.
pub const DEFAULT_IGNORED_SCHEMA_TOPIC: &str = ".+\\.schema-changes";

/// Consumer properties the runner sets itself and `[kafka]` may not override.
const RESERVED_KAFKA_KEYS: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "isolation.level",
    "partition.assignment.strategy",
    "auto.offset.reset",
];

/// Where a partition starts when neither the sink nor Kafka holds a position for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OffsetReset {
    /// From the oldest retained record (the default: a new target gets everything).
    #[default]
    Earliest,
    /// From the end: only records produced from now on.
    Latest,
}

/// `gap.recovery`: what a sink does when records it needs were deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GapRecovery {
    /// Stop the partition and report it (`/readyz`, `oncely status`,
    /// `oncely_sink_gap_offsets`) until an operator snapshots the table and
    /// starts the sink with `--resume-after-gap`. The default.
    #[default]
    Stop,
    /// Request an incremental snapshot of the topic's tables through
    /// capture's signal table (`gap.capture.config`), remove the rows older
    /// than it, resume at the log start; reported as recovering until done.
    Snapshot,
}

/// Settings of the consumer runner (everything but the `[sink]` table).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerConfig {
    /// `bootstrap.servers`: Kafka brokers, `host:port[,host:port...]`.
    #[serde(rename = "bootstrap.servers")]
    pub bootstrap_servers: String,
    /// `group.id`: the consumer group; also the first part of a sink-owned position.
    #[serde(rename = "group.id")]
    pub group_id: String,
    /// `topics`: topic names to consume.
    #[serde(default)]
    pub topics: Vec<String>,
    /// `topics.regex`: a regular expression of topics to consume (with or without a leading `^`).
    #[serde(rename = "topics.regex", default)]
    pub topics_regex: Option<String>,
    /// `ignore.topics`: regular expressions (whole-name match) of topics whose records are skipped.
    #[serde(rename = "ignore.topics", default = "default_ignore_topics")]
    pub ignore_topics: Vec<String>,
    /// `topic.heartbeat.prefix`: topics starting with it are heartbeats and skipped.
    #[serde(
        rename = "topic.heartbeat.prefix",
        default = "default_heartbeat_prefix"
    )]
    pub heartbeat_prefix: String,
    /// `batch.max.records`: a batch closes when it holds this many records.
    #[serde(rename = "batch.max.records", default = "default_batch_max_records")]
    pub batch_max_records: usize,
    /// `batch.max.ms`: a batch closes at the latest this long after its first
    /// record arrived (earlier when nothing more is waiting and the sink is idle).
    #[serde(rename = "batch.max.ms", default = "default_batch_max_ms")]
    pub batch_max_ms: u64,
    /// `max.inflight.bytes`: bound on record bytes read but not yet applied, all partitions.
    #[serde(rename = "max.inflight.bytes", default = "default_max_inflight_bytes")]
    pub max_inflight_bytes: u64,
    /// `retry.backoff.ms`: first delay before retrying a batch after a transient error.
    #[serde(rename = "retry.backoff.ms", default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// `retry.backoff.max.ms`: the cap of the exponential backoff.
    #[serde(
        rename = "retry.backoff.max.ms",
        default = "default_retry_backoff_max_ms"
    )]
    pub retry_backoff_max_ms: u64,
    /// `errors.deadletterqueue.topic.name`: where records that can never be applied go.
    /// Unset: such a record stops the runner.
    #[serde(rename = "errors.deadletterqueue.topic.name", default)]
    pub dlq_topic: Option<String>,
    /// `metrics.listen`: `ip:port` serving Prometheus text at `/metrics`. Unset: no listener.
    #[serde(rename = "metrics.listen", default)]
    pub metrics_listen: Option<String>,
    /// `health.ready.max.lag.ms`: `/readyz` answers 503 when the consumer has
    /// not polled for this long, or an owned partition's applied position has
    /// been ahead of its Kafka commit for this long.
    #[serde(
        rename = "health.ready.max.lag.ms",
        default = "default_ready_max_lag_ms"
    )]
    pub ready_max_lag_ms: u64,
    /// `auto.offset.reset`: `earliest` (default) or `latest`, for partitions
    /// without a stored position. A stored position Kafka no longer holds is
    /// never reset: the partition stops (a gap).
    #[serde(rename = "auto.offset.reset", default)]
    pub auto_offset_reset: OffsetReset,
    /// Not a key: `oncely sink --resume-after-gap` starts a partition whose
    /// stored position Kafka deleted at the log start, once, after its tables
    /// were snapshotted again.
    #[serde(skip)]
    pub resume_after_gap: bool,
    /// `gap.recovery`: `stop` (the default) or `snapshot` — see
    /// [`GapRecovery`].
    #[serde(rename = "gap.recovery", default)]
    pub gap_recovery: GapRecovery,
    /// `gap.capture.config`: the capture configuration (TOML) of the capture
    /// writing the topics; `gap.recovery = "snapshot"` signals through its
    /// source connection and signal table and reads its offsets.
    #[serde(rename = "gap.capture.config", default)]
    pub gap_capture_config: Option<std::path::PathBuf>,
    /// `shutdown.timeout.ms`: how long a stopping or revoked partition may take to finish
    /// its batch before it is abandoned (not acknowledged, so redelivered).
    #[serde(
        rename = "shutdown.timeout.ms",
        default = "default_shutdown_timeout_ms"
    )]
    pub shutdown_timeout_ms: u64,
    /// `debezium.schemaless.accept`: apply change events a real Debezium
    /// connector wrote without schemas (`value.converter.schemas.enable=false`).
    /// Off (the default), each is a dead letter: under Debezium's default
    /// `decimal.handling.mode=precise` a `numeric` column is base64 text that
    /// no sink can tell from text. Turn it on once the connector uses
    /// `decimal.handling.mode=string` (docs/debezium.md).
    #[serde(rename = "debezium.schemaless.accept", default)]
    pub debezium_schemaless_accept: bool,
    /// `schema.registry.url`: a schema registry's Confluent-compatible API.
    /// Set, records in Confluent's Avro wire format (magic byte 0, schema id)
    /// are read through it, into the same events as the JSON converter's;
    /// JSON records on the same topics are read as before.
    #[serde(rename = "schema.registry.url", default)]
    pub schema_registry_url: Option<String>,
    /// `schema.registry.basic.auth.user.info`: `user:password` of the
    /// registry's HTTP basic authentication (a secret), sent with
    /// `basic.auth.credentials.source = "USER_INFO"`.
    #[serde(rename = "schema.registry.basic.auth.user.info", default)]
    pub schema_registry_user_info: Option<oncely_core::Secret>,
    /// `basic.auth.credentials.source`: `USER_INFO`.
    #[serde(rename = "basic.auth.credentials.source", default)]
    pub basic_auth_credentials_source: Option<String>,
    /// `schema.registry.ssl.ca.location`: PEM CA certificates an https
    /// registry's certificate must chain to.
    #[serde(rename = "schema.registry.ssl.ca.location", default)]
    pub schema_registry_ca: Option<std::path::PathBuf>,
    /// `[kafka]`: extra librdkafka consumer/producer properties (security, timeouts, ...).
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
    /// `[dedup]`: a window of applied identities in front of the sink
    /// (see [`crate::runner::dedup`]). Unset: none (the HTTP sink defaults to a memory window).
    #[serde(default)]
    pub dedup: Option<DedupConfig>,
}

fn default_ignore_topics() -> Vec<String> {
    vec![
        DEFAULT_IGNORED_TOPIC.to_owned(),
        DEFAULT_IGNORED_SCHEMA_TOPIC.to_owned(),
    ]
}
fn default_ready_max_lag_ms() -> u64 {
    DEFAULT_READY_MAX_LAG_MS
}
fn default_heartbeat_prefix() -> String {
    DEFAULT_HEARTBEAT_PREFIX.to_owned()
}
fn default_batch_max_records() -> usize {
    DEFAULT_BATCH_MAX_RECORDS
}
fn default_batch_max_ms() -> u64 {
    DEFAULT_BATCH_MAX_MS
}
fn default_max_inflight_bytes() -> u64 {
    DEFAULT_MAX_INFLIGHT_BYTES
}
fn default_retry_backoff_ms() -> u64 {
    DEFAULT_RETRY_BACKOFF_MS
}
fn default_retry_backoff_max_ms() -> u64 {
    DEFAULT_RETRY_BACKOFF_MAX_MS
}
fn default_shutdown_timeout_ms() -> u64 {
    DEFAULT_SHUTDOWN_TIMEOUT_MS
}

impl RunnerConfig {
    /// A configuration with every default, consuming `topics` as `group_id`.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        group_id: impl Into<String>,
        topics: Vec<String>,
    ) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            group_id: group_id.into(),
            topics,
            topics_regex: None,
            ignore_topics: default_ignore_topics(),
            heartbeat_prefix: default_heartbeat_prefix(),
            batch_max_records: DEFAULT_BATCH_MAX_RECORDS,
            batch_max_ms: DEFAULT_BATCH_MAX_MS,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            retry_backoff_ms: DEFAULT_RETRY_BACKOFF_MS,
            retry_backoff_max_ms: DEFAULT_RETRY_BACKOFF_MAX_MS,
            dlq_topic: None,
            metrics_listen: None,
            ready_max_lag_ms: DEFAULT_READY_MAX_LAG_MS,
            auto_offset_reset: OffsetReset::Earliest,
            resume_after_gap: false,
            gap_recovery: GapRecovery::Stop,
            gap_capture_config: None,
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            debezium_schemaless_accept: false,
            schema_registry_url: None,
            schema_registry_user_info: None,
            basic_auth_credentials_source: None,
            schema_registry_ca: None,
            kafka: BTreeMap::new(),
            dedup: None,
        }
    }

    /// How to reach the schema registry (`None`: no `schema.registry.url`).
    pub fn registry_access(
        &self,
    ) -> Result<Option<oncely_core::avro::registry::RegistryAccess>, ConfigError> {
        let Some(url) = self.schema_registry_url.as_deref() else {
            return Ok(None);
        };
        oncely_core::avro::registry::RegistryAccess::from_settings(
            url,
            self.schema_registry_user_info.as_ref(),
            self.basic_auth_credentials_source.as_deref(),
            self.schema_registry_ca.as_deref(),
        )
        .map(Some)
    }

    /// Checks every value; the error names the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        non_blank("bootstrap.servers", &self.bootstrap_servers)?;
        non_blank("group.id", &self.group_id)?;
        self.registry_access()?;
        if self.topics.is_empty() && self.topics_regex.is_none() {
            return Err(ConfigError::new(
                "topics",
                "set `topics` or `topics.regex` (or both)",
            ));
        }
        for (i, t) in self.topics.iter().enumerate() {
            non_blank(&format!("topics[{i}]"), t)?;
        }
        if self.gap_recovery == GapRecovery::Snapshot && self.gap_capture_config.is_none() {
            return Err(ConfigError::new(
                "gap.recovery",
                "\"snapshot\" needs the capture to signal: set gap.capture.config = \"capture.toml\" (the configuration of the capture writing these topics, with signal.data.collection), or gap.recovery = \"stop\"",
            ));
        }
        if let Some(re) = &self.topics_regex {
            regex::Regex::new(re)
                .map_err(|e| ConfigError::new("topics.regex", format!("not a valid regex: {e}")))?;
        }
        for (i, re) in self.ignore_topics.iter().enumerate() {
            regex::Regex::new(&format!("^(?:{re})$")).map_err(|e| {
                ConfigError::new(
                    format!("ignore.topics[{i}]"),
                    format!("not a valid regex: {e}"),
                )
            })?;
        }
        in_range(
            "batch.max.records",
            self.batch_max_records as u64,
            1,
            1_000_000,
        )?;
        in_range("batch.max.ms", self.batch_max_ms, 1, 600_000)?;
        in_range(
            "max.inflight.bytes",
            self.max_inflight_bytes,
            1024,
            u64::from(u32::MAX),
        )?;
        in_range("retry.backoff.ms", self.retry_backoff_ms, 1, 3_600_000)?;
        in_range(
            "retry.backoff.max.ms",
            self.retry_backoff_max_ms,
            self.retry_backoff_ms,
            3_600_000,
        )
        .map_err(|e| {
            ConfigError::new(
                e.key,
                format!("{} (and not below `retry.backoff.ms`)", e.message),
            )
        })?;
        in_range(
            "health.ready.max.lag.ms",
            self.ready_max_lag_ms,
            100,
            86_400_000,
        )?;
        in_range(
            "shutdown.timeout.ms",
            self.shutdown_timeout_ms,
            0,
            3_600_000,
        )?;
        if let Some(dlq) = &self.dlq_topic {
            non_blank("errors.deadletterqueue.topic.name", dlq)?;
            if self.topics.contains(dlq) {
                return Err(ConfigError::new(
                    "errors.deadletterqueue.topic.name",
                    "the dead-letter topic must not be one of `topics`",
                ));
            }
        }
        if let Some(dedup) = &self.dedup {
            dedup.validate()?;
        }
        self.metrics_addr()?;
        for key in self.kafka.keys() {
            if RESERVED_KAFKA_KEYS.contains(&key.as_str()) {
                return Err(ConfigError::new(
                    format!("kafka.{key}"),
                    "set by the runner; use the top-level key if there is one",
                ));
            }
        }
        Ok(())
    }

    /// The parsed `metrics.listen` address.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.metrics_listen
            .as_deref()
            .map(|a| {
                a.parse::<SocketAddr>().map_err(|e| {
                    ConfigError::new(
                        "metrics.listen",
                        format!("expected ip:port, e.g. 127.0.0.1:9464 ({e})"),
                    )
                })
            })
            .transpose()
    }

    /// `batch.max.ms` as a duration.
    pub fn batch_max_wait(&self) -> Duration {
        Duration::from_millis(self.batch_max_ms)
    }

    /// `health.ready.max.lag.ms` as a duration.
    pub fn ready_max_lag(&self) -> Duration {
        Duration::from_millis(self.ready_max_lag_ms)
    }

    /// `shutdown.timeout.ms` as a duration.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }
}

fn non_blank(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        Err(ConfigError::new(field, "must not be empty"))
    } else {
        Ok(())
    }
}

/// Splits a configuration file into the runner's keys (dotted, flattened) and its
/// `[sink]` table, and deserializes the runner part. Tables other than `sink`
/// and `kafka` are flattened into dotted keys.
pub fn parse_runner_config(text: &str) -> Result<(RunnerConfig, Option<toml::Table>), ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let told = oncely_core::toml_error(&e, text);
        ConfigError::new("(file)", format!("not valid TOML: {told}"))
    })?;
    let mut flat = toml::Table::new();
    let mut sink = None;
    for (key, value) in table {
        match (key.as_str(), value) {
            ("sink", toml::Value::Table(t)) => sink = Some(t),
            ("sink", _) => return Err(ConfigError::new("sink", "must be a table: [sink]")),
            ("kafka", toml::Value::Table(t)) => {
                let props = flatten(t, Leaves::Strings { prefix: "kafka" })?;
                flat.insert("kafka".into(), toml::Value::Table(props));
            }
            ("dedup", toml::Value::Table(t)) => {
                let table = flatten(t, Leaves::Typed)?;
                // A nested struct: told by its nearest key like the others.
                check_keys(
                    "dedup",
                    table.keys().map(String::as_str),
                    keys::<DedupConfig>(),
                )?;
                flat.insert("dedup".into(), toml::Value::Table(table));
            }
            (_, value) => flatten_value(&mut flat, key, value, Leaves::Typed)?,
        }
    }
    let mut runner: RunnerConfig = from_flat(flat, "config")?;
    // `"sasl.password" = "${file:/run/secrets/kafka}"`, as in Kafka Connect.
    for (key, value) in runner.kafka.iter_mut() {
        *value = oncely_core::secret::resolve_reference(value)
            .map_err(|e| ConfigError::new(format!("kafka.{key}"), e.to_string()))?;
    }
    Ok((runner, sink))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
