//! The targets verify reads: each sink's own reader ([`VerifyReader`], in the
//! sink's folder beside its writer, found through the sink registry), and
//! the consumer positions that sink keeps. Verify hands the readers
//! capture's type mapping ([`CaptureTypes`]) and keeps only the comparison.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;
use oncely_capture::catalog::{IntervalHandlingMode, TypeRegistry};
use oncely_capture::config::CaptureConfig;
use oncely_sinks::fields::FieldSelection;
use oncely_sinks::verify_reader::{
    Fetched, RowKey, VerifiedTable, VerifyContext, VerifyReadError, VerifyReader, WireMapping,
    WireTypes,
};
use oncely_sinks::{RunnerConfig, TopicPartition};
use regex::Regex;
use serde_json::Value;

use super::source::{SourceRow, SourceTable};
use super::VerifyError;

pub use oncely_sinks::verify_reader::{KeyPage, PAGE};

/// One sink's target, opened from its `oncely sink` configuration file.
pub struct Target {
    /// What the report calls it, e.g. `postgres (examples/sink-postgres.toml)`.
    pub label: String,
    runner: RunnerConfig,
    subscription: Option<Regex>,
    ignore: Vec<Regex>,
    reader: Box<dyn VerifyReader>,
    /// The sink's `fields.include` / `fields.exclude`: the columns it stores.
    fields: Option<FieldSelection>,
}

/// Capture's type mapping, for readers of PostgreSQL targets: intervals in
/// capture's `interval.handling.mode`, so they compare by value.
struct CaptureTypes(IntervalHandlingMode);

#[async_trait]
impl WireTypes for CaptureTypes {
    async fn load(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<Box<dyn WireMapping>, VerifyReadError> {
        let mut types = TypeRegistry::builtin().with_interval_mode(self.0);
        types.load_user_types(client).await.map_err(|e| {
            VerifyReadError::Target(format!("read the warehouse's user types: {e}"))
        })?;
        Ok(Box::new(Mapping(types)))
    }
}

struct Mapping(TypeRegistry);

impl WireMapping for Mapping {
    fn to_json(&self, oid: u32, text: &str) -> Value {
        oncely_capture::catalog::to_json(&self.0, oid, text)
    }
}

impl From<VerifyReadError> for VerifyError {
    fn from(e: VerifyReadError) -> Self {
        match e {
            VerifyReadError::Config(m) => VerifyError::Config(m),
            VerifyReadError::Target(m) => VerifyError::Target(m),
            VerifyReadError::Kafka(m) => VerifyError::Kafka(m),
        }
    }
}

impl Target {
    /// Reads a sink configuration and connects to its store. `capture`
    /// describes the topics: the database's name, `interval.handling.mode`
    /// (the warehouse maps its interval columns back to that form) and
    /// `schemas.enable` (without schemas the cache stores the wire form).
    pub async fn open(path: &Path, capture: &CaptureConfig) -> Result<Self, VerifyError> {
        let db = super::source_db(capture);
        let db = db.as_str();
        let text = std::fs::read_to_string(path)
            .map_err(|e| VerifyError::Config(format!("cannot read {}: {e}", path.display())))?;
        let (runner, sink) = oncely_sinks::kinds::parse_config(&text)
            .map_err(|e| VerifyError::Config(format!("{}: {e}", path.display())))?;
        let fields = sink
            .field_selection()
            .map_err(|e| VerifyError::Config(format!("{}: {e}", path.display())))?;
        let types = CaptureTypes(capture.interval_handling_mode);
        let ctx = VerifyContext {
            runner: &runner,
            db,
            schemas: capture.schemas_enable,
            types: Some(&types),
        };
        let reader = match sink.spec().verify_reader(&ctx).await {
            Some(reader) => reader?,
            None => {
                return Err(VerifyError::Config(format!(
                    "{}: verify cannot read a `{}` sink's target",
                    path.display(),
                    sink.kind()
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
            label: format!(
                "{} ({}, group {})",
                sink.kind(),
                path.display(),
                runner.group_id
            ),
            runner,
            subscription,
            ignore,
            reader,
            fields,
        })
    }

    /// Whether the sink stores `column` of `table`: its field selection
    /// (key columns always).
    pub fn stores(&self, table: &SourceTable, column: &str) -> bool {
        self.fields.as_ref().is_none_or(|f| {
            f.keeps(
                &table.schema,
                &table.name,
                column,
                table.key_names().contains(&column),
            )
        })
    }

    /// `table` as the sink holds it: only the columns it stores, so the
    /// reader reads no other. An excluded key column is the sink's refusal
    /// too, as a configuration error.
    pub fn verified_table(&self, table: &SourceTable) -> Result<VerifiedTable, VerifyError> {
        let mut verified = table.verified_table();
        let Some(fields) = &self.fields else {
            return Ok(verified);
        };
        if let Some(why) = fields.refuse_key(&table.schema, &table.name, table.key_names()) {
            return Err(VerifyError::Config(format!("{}: {why}", self.label)));
        }
        let keys = table.key_names();
        let kept: Vec<usize> = (0..verified.columns.len())
            .filter(|&i| self.stores(table, &verified.columns[i].0))
            .collect();
        verified.key = keys
            .iter()
            .filter_map(|k| kept.iter().position(|&i| verified.columns[i].0 == *k))
            .collect();
        verified.columns = kept.iter().map(|&i| verified.columns[i].clone()).collect();
        Ok(verified)
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

    /// Where the sink serves `/readyz` (`metrics.listen`), when it does.
    pub fn health_addr(&self) -> Option<std::net::SocketAddr> {
        self.runner.metrics_addr().ok().flatten()
    }

    /// The runner's consumer group.
    pub fn group(&self) -> &str {
        &self.runner.group_id
    }

    /// Whether a partition it never applied starts at the log's start
    /// (`auto.offset.reset = earliest`), so it needs offset 0.
    pub fn reads_from_earliest(&self) -> bool {
        self.runner.auto_offset_reset == oncely_sinks::OffsetReset::Earliest
    }

    /// `errors.deadletterqueue.topic.name`, when set.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.runner.dlq_topic.as_deref()
    }

    /// The next offset to apply per partition, where the sink keeps them (in
    /// its target, or Kafka's committed offsets); partitions without one are absent.
    pub async fn positions(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, VerifyError> {
        Ok(self.reader.positions(partitions).await?)
    }

    /// What the target holds for each of `rows`' keys, and the form of its values.
    pub async fn fetch(
        &self,
        table: &VerifiedTable,
        rows: &[SourceRow],
    ) -> Result<Fetched, VerifyError> {
        let keys: Vec<RowKey<'_>> = rows
            .iter()
            .map(|r| RowKey {
                text: &r.key_text,
                wire: &r.key_wire,
            })
            .collect();
        Ok(self.reader.fetch(table, &keys).await?)
    }

    /// How many live rows the target holds for `table`.
    pub async fn count(&self, table: &VerifiedTable) -> Result<u64, VerifyError> {
        Ok(self.reader.count(table).await?)
    }

    /// A page of the live keys the target holds for `table`, from `cursor`
    /// (`None`: the start), to find rows the source does not have.
    pub async fn scan_keys(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyError> {
        Ok(self.reader.scan_keys(table, cursor).await?)
    }

    /// Where the target keeps `table` (a table, an index, a key pattern), for the report.
    pub fn location(&self, table: &VerifiedTable) -> String {
        self.reader.location(table)
    }
}

impl SourceTable {
    /// The table as a target's reader needs it: names, and each column's
    /// Connect schema as capture writes it.
    pub fn verified_table(&self) -> VerifiedTable {
        VerifiedTable {
            topic: self.topic.clone(),
            schema: self.schema.clone(),
            name: self.name.clone(),
            columns: self
                .columns
                .iter()
                .map(|c| (c.name.clone(), c.kind.field_schema(&c.name)))
                .collect(),
            key: self.key.clone(),
        }
    }
}
