//! The targets verify reads: each prebuilt sink's store, read the way that
//! sink writes it (names, layout, delete mode), and the consumer positions
//! that sink keeps.

mod elasticsearch;
mod postgres;
mod redis;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use oncely_capture::config::CaptureConfig;
use oncely_sinks::kinds::SinkConfig;
use oncely_sinks::RunnerConfig;
use regex::Regex;

use super::compare::TargetRow;
use super::source::{SourceRow, SourceTable};
use super::VerifyError;

/// A partition of a change topic: `(topic, partition)`.
pub type Partition = (String, i32);

/// A page of target keys (each key's values as text, in key order) and the
/// cursor of the next page (`None` after the last).
pub type KeyPage = (Vec<Vec<String>>, Option<String>);

/// One sink's target, opened from its `oncely sink` configuration file.
pub struct Target {
    /// What the report calls it, e.g. `postgres (examples/sink-postgres.toml)`.
    pub label: String,
    runner: RunnerConfig,
    subscription: Option<Regex>,
    ignore: Vec<Regex>,
    store: Store,
}

enum Store {
    Postgres(Box<postgres::PgTarget>),
    Elasticsearch(Box<elasticsearch::EsTarget>),
    Redis(Box<redis::RedisTarget>),
}

impl Target {
    /// Reads a sink configuration and connects to its store. `capture`
    /// describes the topics: the database's name, `interval.handling.mode`
    /// (the warehouse maps its interval columns back to that form) and
    /// `schemas.enable` (without schemas the cache stores the wire form).
    pub async fn open(path: &Path, capture: &CaptureConfig) -> Result<Self, VerifyError> {
        let db = capture.database.dbname.as_str();
        let intervals = capture.interval.handling.mode;
        let text = std::fs::read_to_string(path)
            .map_err(|e| VerifyError::Config(format!("cannot read {}: {e}", path.display())))?;
        let (runner, sink) = oncely_sinks::kinds::parse_config(&text)
            .map_err(|e| VerifyError::Config(format!("{}: {e}", path.display())))?;
        let (kind, store) = match &sink {
            SinkConfig::Postgres(c) => ("postgres", Store::Postgres(Box::new(postgres::PgTarget::connect(c, &runner.group_id, intervals).await?))),
            SinkConfig::Elasticsearch(c) => (
                "elasticsearch",
                Store::Elasticsearch(Box::new(elasticsearch::EsTarget::connect(c, &runner, db).await?)),
            ),
            SinkConfig::Redis(c) => ("redis", Store::Redis(Box::new(redis::RedisTarget::connect(c, &runner.group_id, db, capture.schemas.enable).await?))),
            _ => {
                return Err(VerifyError::Config(format!(
                    "{}: verify reads postgres, elasticsearch and redis sinks; this one is another kind",
                    path.display()
                )))
            }
        };
        let subscription = match &runner.topics_regex {
            Some(re) => {
                let anchored = if re.starts_with('^') {
                    re.clone()
                } else {
                    format!("^{re}")
                };
                Some(Regex::new(&anchored).map_err(|e| {
                    VerifyError::Config(format!("{}: topics.regex: {e}", path.display()))
                })?)
            }
            None => None,
        };
        let ignore = runner
            .ignore_topics
            .iter()
            .map(|p| Regex::new(&format!("^(?:{p})$")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| VerifyError::Config(format!("{}: ignore.topics: {e}", path.display())))?;
        Ok(Self {
            label: format!("{kind} ({}, group {})", path.display(), runner.group_id),
            runner,
            subscription,
            ignore,
            store,
        })
    }

    /// Whether this sink consumes `topic` (its `topics`, `topics.regex` and `ignore.topics`).
    pub fn covers(&self, topic: &str) -> bool {
        let subscribed = self.runner.topics.iter().any(|t| t == topic)
            || self
                .subscription
                .as_ref()
                .is_some_and(|r| r.is_match(topic));
        subscribed && !self.ignore.iter().any(|r| r.is_match(topic))
    }

    /// The runner's consumer group.
    pub fn group(&self) -> &str {
        &self.runner.group_id
    }

    /// `errors.deadletterqueue.topic.name`, when set.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.runner.dlq_topic.as_deref()
    }

    /// The next offset to apply per partition, where the sink keeps them (in
    /// its target, or Kafka's committed offsets); partitions without one are absent.
    pub async fn positions(
        &self,
        partitions: &[Partition],
    ) -> Result<HashMap<Partition, i64>, VerifyError> {
        match &self.store {
            Store::Postgres(t) => t.positions().await,
            Store::Elasticsearch(t) => t.positions(partitions).await,
            Store::Redis(t) => t.positions().await,
        }
    }

    /// What the target holds for each of `rows`' keys (`None`: absent or deleted).
    pub async fn fetch(
        &self,
        table: &SourceTable,
        rows: &[SourceRow],
    ) -> Result<Vec<Option<TargetRow>>, VerifyError> {
        match &self.store {
            Store::Postgres(t) => t.fetch(table, rows).await,
            Store::Elasticsearch(t) => t.fetch(table, rows).await,
            Store::Redis(t) => t.fetch(table, rows).await,
        }
    }

    /// `rows` in the form the target stores their values, to compare with
    /// what it holds: the cache's native form ([`oncely_sinks::native`]);
    /// the other targets are read back into the wire form.
    pub fn as_stored<'r>(
        &self,
        table: &SourceTable,
        rows: &'r [SourceRow],
    ) -> Cow<'r, [SourceRow]> {
        match &self.store {
            Store::Redis(t) => t.as_stored(table, rows),
            Store::Postgres(_) | Store::Elasticsearch(_) => Cow::Borrowed(rows),
        }
    }

    /// How many live rows the target holds for `table`.
    pub async fn count(&self, table: &SourceTable) -> Result<u64, VerifyError> {
        match &self.store {
            Store::Postgres(t) => t.count(table).await,
            Store::Elasticsearch(t) => t.count(table).await,
            Store::Redis(t) => t.count(table).await,
        }
    }

    /// A page of the live keys the target holds for `table`, from `cursor`
    /// (`None`: the start), to find rows the source does not have.
    pub async fn scan_keys(
        &self,
        table: &SourceTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyError> {
        match &self.store {
            Store::Postgres(t) => t.scan_keys(table, cursor).await,
            Store::Elasticsearch(t) => t.scan_keys(table, cursor).await,
            Store::Redis(t) => t.scan_keys(table, cursor).await,
        }
    }

    /// Where the target keeps `table` (a table, an index, a key pattern), for the report.
    pub fn location(&self, table: &SourceTable) -> String {
        match &self.store {
            Store::Postgres(t) => t.location(table),
            Store::Elasticsearch(t) => match t.index(table) {
                Ok(index) => format!("index {index}"),
                Err(e) => e.to_string(),
            },
            Store::Redis(t) => format!("keys {}", t.glob(table)),
        }
    }
}

/// Rows fetched per target round trip, and source rows per page.
pub const PAGE: usize = 1000;
