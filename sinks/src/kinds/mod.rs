//! Sinks selectable by name in a configuration file's `[sink]` table.
//!
//! ```toml
//! [sink]
//! kind = "file"          # which sink; the other keys belong to it
//! path = "/tmp/out.jsonl"
//! ```
//!
//! Adding a sink is one variant of [`SinkConfig`] plus one module folder with
//! its config struct (serde, `deny_unknown_fields`, a `validate()`) and its
//! [`Sink`] implementation; the runner, batching, retries, dead letters and
//! metrics are shared and need no change.

pub mod elasticsearch;
pub mod file;
pub mod http;
pub mod journal;
mod json;
pub mod postgres;
pub mod redis;

use std::sync::Arc;

use serde::Deserialize;

use crate::config::{parse_runner_config, RunnerConfig};
use crate::error::{ConfigError, SinkError};
use crate::sink::Sink;

/// The `[sink]` table: `kind` selects the variant.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SinkConfig {
    /// JSON lines appended to a file, one per record; Kafka holds the positions.
    File(file::FileConfig),
    /// JSON lines on standard output, one per record; Kafka holds the positions.
    Stdout(file::StdoutConfig),
    /// A file holding each batch and its position in one fsynced append: owns its positions.
    Journal(journal::JournalConfig),
    /// One Elasticsearch index per table, versioned bulk writes; Kafka holds the positions.
    Elasticsearch(elasticsearch::ElasticsearchConfig),
    /// A PostgreSQL warehouse: one table per source table, versioned upserts, positions in the same transaction.
    Postgres(postgres::PostgresConfig),
    /// A Redis cache of the current row per key: versioned writes and positions in one Lua script call.
    Redis(redis::RedisConfig),
    /// Webhooks: each change POSTed as JSON with an `Idempotency-Key`; Kafka holds the positions.
    Http(http::HttpConfig),
}

impl SinkConfig {
    /// Checks the sink's values; errors name the key as `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::File(c) => c.validate(),
            Self::Stdout(_) => Ok(()),
            Self::Journal(c) => c.validate(),
            Self::Elasticsearch(c) => c.validate(),
            Self::Postgres(c) => c.validate(),
            Self::Redis(c) => c.validate(),
            Self::Http(c) => c.validate(),
        }
    }

    /// Builds the configured sink (opens files, connects to the target).
    pub async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(match self {
            Self::File(c) => Arc::new(file::FileSink::open(c)?),
            Self::Stdout(c) => Arc::new(file::FileSink::stdout(c)),
            Self::Journal(c) => Arc::new(journal::JournalSink::open(c)?),
            Self::Elasticsearch(c) => Arc::new(elasticsearch::ElasticsearchSink::connect(c).await?),
            Self::Postgres(c) => Arc::new(postgres::PostgresSink::connect(c).await?),
            Self::Redis(c) => Arc::new(redis::RedisSink::connect(c).await?),
            Self::Http(c) => Arc::new(http::HttpSink::connect(c)?),
        })
    }
}

/// Parses a whole `sink.toml`: the runner's keys and the `[sink]` table, both validated.
pub fn parse_config(text: &str) -> Result<(RunnerConfig, SinkConfig), ConfigError> {
    let (mut runner, sink) = parse_runner_config(text)?;
    runner.validate()?;
    let sink =
        sink.ok_or_else(|| ConfigError::new("sink", "missing [sink] table (with `kind = ...`)"))?;
    let sink = crate::config::flatten_sink_table(sink)?;
    let text = toml::to_string(&sink).map_err(|e| ConfigError::new("sink", e.to_string()))?;
    let sink: SinkConfig = toml::from_str(&text).map_err(|e| {
        let msg = e.message().to_owned();
        ConfigError::new(
            "sink",
            format!(
                "{msg} (known kinds: file, stdout, journal, elasticsearch, postgres, redis, http)"
            ),
        )
    })?;
    sink.validate()?;
    // A webhook cannot compare versions: a dedup window in front of it unless `[dedup]` says otherwise.
    if matches!(sink, SinkConfig::Http(_)) && runner.dedup.is_none() {
        runner.dedup = Some(Default::default());
    }
    Ok((runner, sink))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n";

    #[test]
    fn each_kind_parses() {
        let (_, s) = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"file\"\npath = \"/tmp/x\"\n"
        ))
        .expect("file");
        assert!(matches!(s, SinkConfig::File(_)));
        let (_, s) = parse_config(&format!("{HEAD}[sink]\nkind = \"stdout\"\n")).expect("stdout");
        assert!(matches!(s, SinkConfig::Stdout(_)));
        let (_, s) = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"journal\"\npath = \"/tmp/j\"\n"
        ))
        .expect("journal");
        assert!(matches!(s, SinkConfig::Journal(_)));
    }

    #[test]
    fn the_annotated_example_is_valid() {
        let text = include_str!("../../../examples/sink.toml");
        let (runner, sink) = parse_config(text).expect("examples/sink.toml is valid");
        assert_eq!(runner.dlq_topic.as_deref(), Some("oncely-dlq"));
        assert!(matches!(sink, SinkConfig::File(_)));
        // The example spells out the default list.
        assert_eq!(
            runner.ignore_topics,
            [
                crate::config::DEFAULT_IGNORED_TOPIC,
                crate::config::DEFAULT_IGNORED_SCHEMA_TOPIC
            ]
        );
    }

    #[test]
    fn bad_sink_tables_are_explained() {
        let e = parse_config(HEAD).expect_err("no sink");
        assert_eq!(e.field, "sink");
        let e =
            parse_config(&format!("{HEAD}[sink]\nkind = \"carrier-pigeon\"\n")).expect_err("kind");
        assert!(
            e.message.contains("carrier-pigeon") && e.message.contains("journal"),
            "{e}"
        );
        let e = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"file\"\npath = \"/x\"\npaht = 1\n"
        ))
        .expect_err("key");
        assert!(e.message.contains("paht"), "{e}");
        let e = parse_config(&format!("{HEAD}[sink]\nkind = \"file\"\npath = \"\"\n"))
            .expect_err("path");
        assert_eq!(e.field, "sink.path");
    }
}
