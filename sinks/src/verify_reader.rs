//! Reading a target back, for `oncely verify`: each sink that can be verified
//! implements [`VerifyReader`] next to its writer (`kinds/<kind>/verify_reader.rs`), with
//! the writer's own functions for names, ids, keys and layouts, so those have
//! one owner. Verify keeps only the comparison.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Map, Value};

use crate::config::RunnerConfig;
use crate::native::{Kind, ValueFormat};
use crate::sink::TopicPartition;

/// A page of target keys (each key's values as text, in key order) and the
/// cursor of the next page (`None` after the last).
pub type KeyPage = (Vec<Vec<String>>, Option<String>);

/// Rows fetched per target round trip, and keys per scanned page.
pub const PAGE: usize = 1000;

/// Why a target could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VerifyReadError {
    /// The sink's configuration does not let the target be opened.
    #[error("configuration: {0}")]
    Config(String),
    /// The target refused or failed a read.
    #[error("target: {0}")]
    Target(String),
    /// Kafka (where the sink keeps its positions) failed.
    #[error("kafka: {0}")]
    Kafka(String),
}

/// What the reader of a target is told when it opens.
pub struct VerifyContext<'a> {
    /// The runner's settings (consumer group, Kafka connection).
    pub runner: &'a RunnerConfig,
    /// The source database's name (the `{db}` of names and keys).
    pub db: &'a str,
    /// Whether the topics carry schemas: without them no sink can tell a
    /// date from a number, and values stay in the wire form.
    pub schemas: bool,
    /// Capture's mapping of PostgreSQL values to the wire form, for readers
    /// of PostgreSQL targets (the sinks do not depend on capture).
    pub types: Option<&'a dyn WireTypes>,
}

/// Capture's mapping of PostgreSQL types to the wire form, handed to readers
/// that read PostgreSQL values back.
#[async_trait]
pub trait WireTypes: Send + Sync {
    /// The mapping of the types of the database `client` is connected to,
    /// its enums and domains included.
    async fn load(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<Box<dyn WireMapping>, VerifyReadError>;
}

/// The wire JSON of PostgreSQL values, by type.
pub trait WireMapping: Send + Sync {
    /// `text`, the output form of a value of type `oid`, as capture writes it.
    fn to_json(&self, oid: u32, text: &str) -> Value;
}

/// One captured table, as a reader needs it.
#[derive(Debug, Clone)]
pub struct VerifiedTable {
    /// The Kafka topic capture writes it to.
    pub topic: String,
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Each column's name and Connect field schema (as capture writes it), in table order.
    pub columns: Vec<(String, Value)>,
    /// Indexes into `columns`, in key order.
    pub key: Vec<usize>,
}

impl VerifiedTable {
    /// The key columns' names, in key order.
    pub fn key_names(&self) -> Vec<&str> {
        self.key
            .iter()
            .map(|&i| self.columns[i].0.as_str())
            .collect()
    }
}

/// One source row's key: its values in PostgreSQL text form and as capture
/// writes them, in key order.
#[derive(Debug, Clone, Copy)]
pub struct RowKey<'a> {
    /// In the types' text output form.
    pub text: &'a [String],
    /// As capture writes them.
    pub wire: &'a [Value],
}

/// What a target holds for one key.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredRow {
    /// Columns as JSON values (a warehouse row mapped back, a document's
    /// `_source`, a Redis JSON row); absent means null.
    Json(Map<String, Value>),
    /// A Redis hash: one field per non-null column, strings as they are and
    /// other values as JSON text.
    Hash(BTreeMap<String, String>),
}

/// How a target stores values: which columns it converted from the wire
/// form ([`crate::native`]), so a source value is converted the same way
/// before it is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredForm {
    /// `value.format`.
    pub values: ValueFormat,
    /// Whether JSON columns hold the JSON value (else their text).
    pub nest_json: bool,
    /// Whether, when JSON columns hold their text, arrays of JSON do too
    /// (Elasticsearch); the Redis hash layout converts their items.
    pub json_arrays_as_text: bool,
}

impl StoredForm {
    /// Values as capture writes them.
    pub const WIRE: StoredForm = StoredForm {
        values: ValueFormat::Wire,
        nest_json: false,
        json_arrays_as_text: false,
    };

    /// How a column of Connect schema `field` is converted; `None`: not.
    pub fn kind(self, field: &Value) -> Option<Kind> {
        if self.values == ValueFormat::Wire {
            return None;
        }
        let kind = Kind::of_schema(field)?;
        let as_text = match &kind {
            Kind::Json => !self.nest_json,
            Kind::Array(_) if self.json_arrays_as_text => !self.nest_json && kind.is_json(),
            _ => false,
        };
        (!as_text).then_some(kind)
    }

    /// The columns of `fields` (name, Connect schema) this form converts.
    pub fn columns<'f>(
        self,
        fields: impl IntoIterator<Item = (&'f str, &'f Value)>,
    ) -> Vec<(String, Kind)> {
        fields
            .into_iter()
            .filter_map(|(name, f)| Some((name.to_owned(), self.kind(f)?)))
            .collect()
    }

    /// `row` as the target stores it: each column of `columns` converted
    /// ([`Kind::convert`]); borrowed when nothing changes.
    pub fn convert<'r>(
        row: &'r Map<String, Value>,
        columns: &[(String, Kind)],
    ) -> Cow<'r, Map<String, Value>> {
        let mut out: Option<Map<String, Value>> = None;
        for (column, kind) in columns {
            let Some(value) = row.get(column) else {
                continue;
            };
            if let Cow::Owned(v) = kind.convert(value) {
                out.get_or_insert_with(|| row.clone())
                    .insert(column.clone(), v);
            }
        }
        out.map_or(Cow::Borrowed(row), Cow::Owned)
    }
}

/// The rows a target holds for a page of keys, and the form of their values.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// One per key asked for, in order (`None`: absent or deleted).
    pub rows: Vec<Option<StoredRow>>,
    /// How the values were stored.
    pub form: StoredForm,
}

/// A sink's target read back the way that sink writes it. Reads only; one
/// reader may be used for many tables, one call at a time.
#[async_trait]
pub trait VerifyReader: Send + Sync {
    /// Where the target keeps `table` (a table, an index, a key pattern), for reports.
    fn location(&self, table: &VerifiedTable) -> String;

    /// What the target holds for each of `keys` of `table`.
    async fn fetch(
        &self,
        table: &VerifiedTable,
        keys: &[RowKey<'_>],
    ) -> Result<Fetched, VerifyReadError>;

    /// How many live rows the target holds for `table`.
    async fn count(&self, table: &VerifiedTable) -> Result<u64, VerifyReadError>;

    /// A page of the live keys the target holds for `table`, from `cursor`
    /// (`None`: the start).
    async fn scan_keys(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyReadError>;

    /// The next offset to apply per partition, where the sink keeps them;
    /// partitions without one are absent.
    async fn positions(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, VerifyReadError>;
}

/// A value as text: strings as they are, other values as JSON; `None` for null.
pub fn wire_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The consumer group's committed offsets: the positions of a sink that
/// leaves them to Kafka (committed once a batch is settled).
pub async fn committed_offsets(
    runner: &RunnerConfig,
    partitions: &[TopicPartition],
) -> Result<HashMap<TopicPartition, i64>, VerifyReadError> {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &runner.bootstrap_servers)
        .set("group.id", &runner.group_id)
        .set("enable.auto.commit", "false");
    // The runner's security settings, to get in.
    for (k, v) in &runner.kafka {
        if oncely_core::kafka::is_connection_property(k) {
            config.set(k, v);
        }
    }
    let partitions = partitions.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| VerifyReadError::Kafka(format!("create a consumer: {e}")))?;
        let mut tpl = TopicPartitionList::new();
        for tp in &partitions {
            tpl.add_partition(&tp.topic, tp.partition);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .map_err(|e| {
                VerifyReadError::Kafka(format!("read the group's committed offsets: {e}"))
            })?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((TopicPartition::new(e.topic(), e.partition()), o)),
                _ => None,
            })
            .collect())
    })
    .await
    .map_err(|e| VerifyReadError::Kafka(format!("offset reader task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forms_convert_what_their_target_converts() {
        let date = json!({"type": "int32", "name": "io.debezium.time.Date"});
        let json = json!({"type": "string", "name": "io.debezium.data.Json"});
        let jsons = json!({"type": "array", "items": json});
        assert_eq!(StoredForm::WIRE.kind(&date), None);
        let nested = StoredForm {
            values: ValueFormat::Native,
            nest_json: true,
            json_arrays_as_text: true,
        };
        assert_eq!(nested.kind(&date), Some(Kind::Date));
        assert_eq!(nested.kind(&json), Some(Kind::Json));
        let es_text = StoredForm {
            nest_json: false,
            ..nested
        };
        assert_eq!(es_text.kind(&json), None);
        assert_eq!(es_text.kind(&jsons), None);
        let redis_hash = StoredForm {
            json_arrays_as_text: false,
            ..es_text
        };
        assert_eq!(redis_hash.kind(&json), None);
        assert!(redis_hash.kind(&jsons).is_some());
    }
}
