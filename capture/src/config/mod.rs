//! Capture configuration: TOML with Debezium-familiar names, read by the one
//! loader of `oncely_core::config`.
//!
//! Keys are dotted as in Debezium (`topic.prefix`, `slot.name`); bare and
//! quoted dotted keys mean the same, since the file is flattened once and
//! [`CaptureConfig`] names each key once. Three tables are collected by their
//! prefix after flattening: `kafka.producer.*` (librdkafka string
//! properties), `topic.name.mapping.*` (whose keys, `schema.table`, hold dots
//! themselves) and `outbox.*`. `${env:..}`/`${file:..}` references are
//! resolved while the file is read. [`CaptureConfig::validate`] checks the
//! values and names the offending key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use oncely_core::config::{check_keys, flatten, flatten_value, from_flat, keys, Leaves};
use oncely_core::postgres::{PgTls, SslMode};

pub use crate::outbox::OutboxConfig;
pub use oncely_core::config::ConfigError;

use crate::secret::{resolve_reference, Secret};

pub mod mysql;
mod validate;
mod values;

use mysql::{
    BigintUnsignedHandlingMode, DecimalHandlingMode, MappingConfig, SnapshotLockingMode,
    TimePrecisionMode,
};

pub use values::{
    AutocreateMode, Converter, IntervalHandlingMode, ReplicaIdentityCheck, SchemaChangeBackfill,
    SkippedOperations, SnapshotMode, SourceKind, StringList,
};

pub const DEFAULT_PORT: u16 = 5432;
/// `database.port` when unset and `source = "mysql"`.
pub const DEFAULT_MYSQL_PORT: u16 = 3306;
pub const DEFAULT_SLOT: &str = "oncely";
pub const DEFAULT_PUBLICATION: &str = "oncely_publication";
/// The default `offset.storage.topic` is this prefix and the connector name
/// (see [`CaptureConfig::offsets_topic`]).
pub const DEFAULT_OFFSETS_TOPIC_PREFIX: &str = "oncely-offsets-";
/// Default `topic.creation.default.max.message.bytes` (and the producer's
/// `message.max.bytes`): room for rows with large TOASTed values.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// librdkafka's upper bound for `message.max.bytes`.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 1_000_000_000;
/// Default `topic.creation.default.partitions` and `.replication.factor`.
pub const DEFAULT_TOPIC_PARTITIONS: i32 = 1;
pub const DEFAULT_REPLICATION_FACTOR: i32 = 1;
pub const DEFAULT_BATCH_MAX_EVENTS: usize = 20_000;
pub const DEFAULT_BATCH_MAX_BYTES: usize = 64 * 1024 * 1024;
pub const DEFAULT_BATCH_MAX_MS: u64 = 25;
/// Default `[kafka.producer] "transaction.timeout.ms"` (Kafka's own): how
/// long the broker keeps a killed instance's transaction open, holding back
/// `read_committed` readers of its topics, unless a new instance of the
/// connector aborts it first (it does on start).
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_HEARTBEAT_MS: u64 = 10_000;
/// Default `health.ready.max.lag.ms`: how long changes read may wait for a
/// Kafka commit before `/readyz` answers 503.
pub const DEFAULT_READY_MAX_LAG_MS: u64 = 60_000;
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_SNAPSHOT_CHUNK_SIZE: usize = 1024;
/// Snapshot rows of a chunk share one commit LSN and are told apart by
/// `event_seq`; sinks pack that into 20 bits (Elasticsearch external versions).
pub const MAX_SNAPSHOT_CHUNK_SIZE: usize = 1 << 20;
/// `database.sslmode` when unset: libpq's default, as the warehouse sink's.
pub const DEFAULT_SSLMODE: SslMode = oncely_core::postgres::DEFAULT_SSLMODE;

/// The whole `capture.toml`, one field per dotted key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// `name`: the connector name; identifies the offsets and the Kafka
    /// `transactional.id`. Defaults to `topic.prefix`.
    #[serde(default)]
    pub name: Option<String>,

    /// `topic.prefix`: topics are `<prefix>.<schema>.<table>`.
    #[serde(rename = "topic.prefix")]
    pub topic_prefix: String,
    /// `topic.creation.default.partitions` of topics the connector creates.
    #[serde(
        rename = "topic.creation.default.partitions",
        default = "default_partitions"
    )]
    pub topic_partitions: i32,
    /// `topic.creation.default.replication.factor` of topics the connector creates.
    #[serde(
        rename = "topic.creation.default.replication.factor",
        default = "default_replication"
    )]
    pub topic_replication_factor: i32,
    /// `topic.creation.default.max.message.bytes`: the topic config
    /// `max.message.bytes` of created topics (see [`Self::max_message_bytes`]).
    #[serde(rename = "topic.creation.default.max.message.bytes", default)]
    pub topic_max_message_bytes: Option<usize>,
    /// `topic.name.mapping = { "<schema>.<table>" = "<topic>" }`: the topic of
    /// a table instead of `<prefix>.<schema>.<table>`, to separate tables
    /// whose default names would merge (see [`crate::naming`]).
    #[serde(rename = "topic.name.mapping", default)]
    pub topic_name_mapping: BTreeMap<String, String>,
    /// `table.filter = { "<schema>.<table>" = "<SQL boolean expression>" }`:
    /// the rows of a table capture publishes, in the stream (a PostgreSQL 15+
    /// publication row filter), in snapshots and in `oncely verify`; held to
    /// the snapshot filter's rules ([`crate::snapshot::filter`]).
    #[serde(rename = "table.filter", default)]
    pub table_filter: BTreeMap<String, String>,

    /// `source`: the kind of database read, `postgres` (the default) or
    /// `mysql` (MySQL and MariaDB: capture streams its binlog, `oncely
    /// verify` reads its tables; docs/mysql.md).
    #[serde(default)]
    pub source: SourceKind,

    /// `database.hostname`.
    #[serde(rename = "database.hostname")]
    pub database_hostname: String,
    /// `database.port`: 5432 for PostgreSQL, 3306 for MySQL when unset (see
    /// [`Self::port`]).
    #[serde(rename = "database.port", default)]
    pub database_port: Option<u16>,
    /// `database.user`.
    #[serde(rename = "database.user")]
    pub database_user: String,
    /// `database.password`: a literal, `${env:NAME}` or `${file:/path}`
    /// (resolved when the file is read).
    #[serde(rename = "database.password", default)]
    pub database_password: Secret,
    /// `database.dbname`: the captured PostgreSQL database (required there;
    /// a MySQL source names its databases in `database.include.list`).
    #[serde(rename = "database.dbname", default)]
    pub database_dbname: String,
    /// `database.include.list` (MySQL): regular expressions matched against
    /// the whole database name; empty: every database but the server's own.
    #[serde(rename = "database.include.list", default)]
    pub database_include_list: StringList,
    /// `database.sslmode`: `disable`, `prefer` (the default, as libpq's),
    /// `require`, `verify-ca` or `verify-full`, with libpq's meanings.
    #[serde(rename = "database.sslmode", default = "default_sslmode")]
    pub database_sslmode: SslMode,
    /// `database.sslrootcert`: PEM file of the CAs to trust (needed by
    /// `verify-ca` and `verify-full`; makes `require` check the chain).
    #[serde(rename = "database.sslrootcert", default)]
    pub database_sslrootcert: Option<PathBuf>,
    /// `database.sslcert`: a client certificate (PEM), for servers that ask
    /// for one (`clientcert=verify-full`, `cert` authentication).
    #[serde(rename = "database.sslcert", default)]
    pub database_sslcert: Option<PathBuf>,
    /// `database.sslkey`: the client certificate's key file; the path may be
    /// a `${env:NAME}` reference, resolved when the file is read.
    #[serde(rename = "database.sslkey", default)]
    pub database_sslkey: Option<Secret>,

    /// `slot.name`: the logical replication slot.
    #[serde(rename = "slot.name", default = "default_slot")]
    pub slot_name: String,
    /// `slot.create`: create the slot when it does not exist (default true).
    #[serde(rename = "slot.create", default = "yes")]
    pub slot_create: bool,
    /// `slot.failover`: a failover slot (PostgreSQL 17+), synchronized to
    /// physical standbys (`sync_replication_slots`), so capture resumes on a
    /// promoted standby.
    #[serde(rename = "slot.failover", default)]
    pub slot_failover: bool,
    /// `slot.max.retained.bytes`: WAL the slot may keep on the server before
    /// capture reports it (an error log, a metric, `/readyz` 503). Unset: no limit.
    #[serde(rename = "slot.max.retained.bytes", default)]
    pub slot_max_retained_bytes: Option<u64>,

    /// `publication.name`.
    #[serde(rename = "publication.name", default = "default_publication")]
    pub publication_name: String,
    /// `publication.autocreate.mode`.
    #[serde(rename = "publication.autocreate.mode", default)]
    pub publication_autocreate_mode: AutocreateMode,

    /// `table.include.list`: regular expressions matched against the whole
    /// `schema.table` name.
    #[serde(rename = "table.include.list", default)]
    pub table_include_list: StringList,
    /// `table.exclude.list`: as `table.include.list`, for tables to leave out.
    #[serde(rename = "table.exclude.list", default)]
    pub table_exclude_list: StringList,

    /// `column.include.list`: regular expressions matched (whole name, any
    /// case) against `schema.table.column`; only matching columns are
    /// published.
    #[serde(rename = "column.include.list", default)]
    pub column_include_list: StringList,
    /// `column.exclude.list`: as `column.include.list`, for columns never
    /// published (not with `column.include.list`).
    #[serde(rename = "column.exclude.list", default)]
    pub column_exclude_list: StringList,
    /// `column.mask.*`: `with.<N>.chars` and
    /// `hash[.v2].<algorithm>.with.salt.<salt>`, each the comma-separated
    /// column regular expressions it masks.
    #[serde(rename = "column.mask", default)]
    pub column_mask: BTreeMap<String, String>,
    /// `column.truncate.*`: `to.<N>.chars`, each the column regular
    /// expressions it truncates.
    #[serde(rename = "column.truncate", default)]
    pub column_truncate: BTreeMap<String, String>,
    /// `column.propagate.source.type`: column regular expressions (as
    /// `column.include.list`) whose field schemas carry the source type.
    #[serde(rename = "column.propagate.source.type", default)]
    pub column_propagate_source_type: StringList,
    /// `datatype.propagate.source.type`: as `column.propagate.source.type`,
    /// matched against the column's type name (`varchar`, `numeric`, ...).
    #[serde(rename = "datatype.propagate.source.type", default)]
    pub datatype_propagate_source_type: StringList,

    /// `message.key.columns`: `schema.table:col1,col2;schema.table2:col` as in Debezium.
    #[serde(rename = "message.key.columns", default)]
    pub message_key_columns: Option<String>,

    /// `heartbeat.interval.ms` (default [`DEFAULT_HEARTBEAT_MS`]).
    #[serde(rename = "heartbeat.interval.ms", default)]
    pub heartbeat_interval_ms: Option<u64>,
    /// `heartbeat.action.query`: run before each heartbeat.
    #[serde(rename = "heartbeat.action.query", default)]
    pub heartbeat_action_query: Option<String>,

    /// `tombstones.on.delete` (default true).
    #[serde(rename = "tombstones.on.delete", default = "yes")]
    pub tombstones_on_delete: bool,
    /// `skipped.operations` (default `none`: every change is published;
    /// Debezium's default is `t`).
    #[serde(rename = "skipped.operations", default)]
    pub skipped_operations: SkippedOperations,
    /// `schemas.enable`: wrap keys and values in `{schema, payload}` (default
    /// true, as Kafka Connect's JSON converter does).
    #[serde(rename = "schemas.enable", default = "yes")]
    pub schemas_enable: bool,
    /// `key.converter`: `json` (the default, Kafka Connect's JSON
    /// converter) or `avro` (Confluent's wire format through
    /// `schema.registry.url`).
    #[serde(rename = "key.converter", default)]
    pub key_converter: Converter,
    /// `value.converter`: as `key.converter`, for values.
    #[serde(rename = "value.converter", default)]
    pub value_converter: Converter,
    /// `schema.registry.url`: the schema registry's Confluent-compatible API
    /// (Apicurio's is under `/apis/ccompat/v7`), needed by `avro`.
    #[serde(rename = "schema.registry.url", default)]
    pub schema_registry_url: Option<String>,
    /// `schema.registry.basic.auth.user.info`: `user:password` of the
    /// registry's HTTP basic authentication (a secret: `${env:..}` /
    /// `${file:..}` accepted), sent with `basic.auth.credentials.source =
    /// "USER_INFO"`.
    #[serde(rename = "schema.registry.basic.auth.user.info", default)]
    pub schema_registry_user_info: Option<Secret>,
    /// `basic.auth.credentials.source`: `USER_INFO`, Confluent's name for
    /// "send the user info above".
    #[serde(rename = "basic.auth.credentials.source", default)]
    pub basic_auth_credentials_source: Option<String>,
    /// `schema.registry.ssl.ca.location`: PEM CA certificates an https
    /// registry's certificate must chain to (host name checked).
    #[serde(rename = "schema.registry.ssl.ca.location", default)]
    pub schema_registry_ca: Option<PathBuf>,
    /// `key.subject.name.strategy`: Confluent's subject name strategy of
    /// keys (`TopicNameStrategy`, `RecordNameStrategy`,
    /// `TopicRecordNameStrategy`, short or with their package).
    #[serde(rename = "key.subject.name.strategy", default)]
    pub key_subject_name_strategy: oncely_core::avro::registry::SubjectStrategy,
    /// `value.subject.name.strategy`: as `key.subject.name.strategy`, for values.
    #[serde(rename = "value.subject.name.strategy", default)]
    pub value_subject_name_strategy: oncely_core::avro::registry::SubjectStrategy,
    /// `schema.name.adjustment.mode`: Debezium's `none`, `avro`,
    /// `avro_unicode`, for the Avro record names of `avro` converters.
    #[serde(rename = "schema.name.adjustment.mode", default)]
    pub schema_name_adjustment_mode: oncely_core::avro::NameMode,
    /// `field.name.adjustment.mode`: as `schema.name.adjustment.mode`, for
    /// field (column) names; under `none` a name Avro refuses stops capture
    /// naming the column.
    #[serde(rename = "field.name.adjustment.mode", default)]
    pub field_name_adjustment_mode: oncely_core::avro::NameMode,

    /// `batch.max.events`: one Kafka transaction closes at this many events.
    #[serde(rename = "batch.max.events", default = "default_batch_events")]
    pub batch_max_events: usize,
    /// `batch.max.bytes`: ... or at this many bytes.
    #[serde(rename = "batch.max.bytes", default = "default_batch_bytes")]
    pub batch_max_bytes: usize,
    /// `batch.max.ms`: ... or this long after it opened.
    #[serde(rename = "batch.max.ms", default = "default_batch_ms")]
    pub batch_max_ms: u64,

    /// `kafka.bootstrap.servers`.
    #[serde(rename = "kafka.bootstrap.servers")]
    pub kafka_bootstrap_servers: String,
    /// `kafka.producer.*`: librdkafka properties, e.g. `"compression.type" =
    /// "lz4"`, as strings; `${env:..}`/`${file:..}` references resolved.
    /// `transactional.id`, `enable.idempotence` and `isolation.level` are
    /// owned by oncely.
    #[serde(rename = "kafka.producer", default)]
    pub kafka_producer: BTreeMap<String, String>,

    /// `offset.storage.topic`: the compacted topic of offset records; by
    /// default one per connector (see [`CaptureConfig::offsets_topic`]).
    #[serde(rename = "offset.storage.topic", default)]
    pub offset_storage_topic: Option<String>,

    /// `metrics.listen`: address of the Prometheus endpoint (`/metrics`); off when absent.
    #[serde(rename = "metrics.listen", default)]
    pub metrics_listen: Option<String>,
    /// `health.ready.max.lag.ms`: `/readyz` answers 503 while changes read
    /// have waited longer than this for a Kafka commit (default
    /// [`DEFAULT_READY_MAX_LAG_MS`]).
    #[serde(rename = "health.ready.max.lag.ms", default)]
    pub health_ready_max_lag_ms: Option<u64>,

    /// `outbox.*`: route an outbox table's inserts as domain events; any
    /// `outbox.` key present makes it `Some`.
    #[serde(default)]
    pub outbox: Option<OutboxConfig>,

    /// `snapshot.mode`.
    #[serde(rename = "snapshot.mode", default)]
    pub snapshot_mode: SnapshotMode,
    /// `snapshot.new.tables`: snapshot, on start, captured tables that the
    /// stored offset does not list yet (added to `table.include.list` since).
    #[serde(rename = "snapshot.new.tables", default)]
    pub snapshot_new_tables: bool,
    /// `incremental.snapshot.chunk.size`, as Debezium names it: rows per chunk.
    #[serde(
        rename = "incremental.snapshot.chunk.size",
        default = "default_chunk_size"
    )]
    pub incremental_snapshot_chunk_size: usize,

    /// `signal.data.collection`: the `schema.table` whose inserted rows are
    /// signals (columns `id`, `type`, `data`), as in Debezium.
    #[serde(rename = "signal.data.collection", default)]
    pub signal_data_collection: Option<String>,

    /// `replica.identity.check`: what start-up (and a Relation message in the
    /// stream) does about a captured table whose replica identity does not
    /// carry its event key.
    #[serde(rename = "replica.identity.check", default)]
    pub replica_identity_check: ReplicaIdentityCheck,

    /// `schema.change.backfill`: whether a schema change that alters existing
    /// rows without row events (ADD COLUMN with a default, RENAME COLUMN,
    /// ALTER COLUMN TYPE) snapshots the table again so the targets converge.
    #[serde(rename = "schema.change.backfill", default)]
    pub schema_change_backfill: SchemaChangeBackfill,

    /// `interval.handling.mode`: `"string"` (default: Debezium's
    /// `io.debezium.time.Interval`, exact) or `"numeric"` (Debezium's default
    /// `io.debezium.time.MicroDuration`: µs, a month as 30.4375 days, lossy).
    #[serde(rename = "interval.handling.mode", default)]
    pub interval_handling_mode: IntervalHandlingMode,

    /// `decimal.handling.mode` (MySQL): `precise` (Connect `Decimal`, the
    /// default), `double` or `string`, as Debezium's MySQL connector.
    #[serde(rename = "decimal.handling.mode", default)]
    pub decimal_handling_mode: DecimalHandlingMode,
    /// `time.precision.mode` (MySQL): `adaptive_time_microseconds` (the
    /// default) or `connect`.
    #[serde(rename = "time.precision.mode", default)]
    pub time_precision_mode: TimePrecisionMode,
    /// `bigint.unsigned.handling.mode` (MySQL): `long` (the default) or `precise`.
    #[serde(rename = "bigint.unsigned.handling.mode", default)]
    pub bigint_unsigned_handling_mode: BigintUnsignedHandlingMode,
    /// `tinyint.one.as.boolean` (MySQL): `tinyint(1)` as boolean, as
    /// Debezium's `TinyIntOneToBooleanConverter` (default false: int16).
    #[serde(rename = "tinyint.one.as.boolean", default)]
    pub tinyint_one_as_boolean: bool,
    /// `database.server.id` (MySQL, required there): the replica server id
    /// capture registers with, unique among the server and its replicas
    /// (Debezium's key).
    #[serde(rename = "database.server.id", default)]
    pub database_server_id: Option<u32>,
    /// `snapshot.locking.mode` (MySQL): `minimal` (the default) or `none`.
    #[serde(rename = "snapshot.locking.mode", default)]
    pub snapshot_locking_mode: SnapshotLockingMode,
    /// `include.query` (MySQL): a streamed change's `source.query` is the
    /// statement that made it (default false: null), as Debezium's key.
    #[serde(rename = "include.query", default)]
    pub include_query: bool,
}

fn default_partitions() -> i32 {
    DEFAULT_TOPIC_PARTITIONS
}
fn default_replication() -> i32 {
    DEFAULT_REPLICATION_FACTOR
}
fn default_sslmode() -> SslMode {
    DEFAULT_SSLMODE
}
fn default_slot() -> String {
    DEFAULT_SLOT.into()
}
fn default_publication() -> String {
    DEFAULT_PUBLICATION.into()
}
fn yes() -> bool {
    true
}
fn default_batch_events() -> usize {
    DEFAULT_BATCH_MAX_EVENTS
}
fn default_batch_bytes() -> usize {
    DEFAULT_BATCH_MAX_BYTES
}
fn default_batch_ms() -> u64 {
    DEFAULT_BATCH_MAX_MS
}
fn default_chunk_size() -> usize {
    DEFAULT_SNAPSHOT_CHUNK_SIZE
}

/// Tables whose keys are collected by prefix after flattening: their own
/// keys may hold dots (`"public.orders"`, `"compression.type"`).
const KAFKA_PRODUCER: &str = "kafka.producer";
const TOPIC_NAME_MAPPING: &str = "topic.name.mapping";
const TABLE_FILTER: &str = "table.filter";
const OUTBOX: &str = "outbox";
/// `column.mask.with.<N>.chars`, `column.mask.hash...`: the setting is in the key.
const COLUMN_MASK: &str = "column.mask";
const COLUMN_TRUNCATE: &str = "column.truncate";

/// `table` flattened into dotted keys, with the keys under
/// [`KAFKA_PRODUCER`] (as librdkafka strings), [`TOPIC_NAME_MAPPING`],
/// [`TABLE_FILTER`], [`OUTBOX`], [`COLUMN_MASK`] and [`COLUMN_TRUNCATE`]
/// gathered back into one table each.
fn flatten_capture(table: toml::Table) -> Result<toml::Table, ConfigError> {
    let mut flat = toml::Table::new();
    let mut gathered: [(&str, toml::Table); 6] = [
        (KAFKA_PRODUCER, toml::Table::new()),
        (TOPIC_NAME_MAPPING, toml::Table::new()),
        (TABLE_FILTER, toml::Table::new()),
        (OUTBOX, toml::Table::new()),
        (COLUMN_MASK, toml::Table::new()),
        (COLUMN_TRUNCATE, toml::Table::new()),
    ];
    for (key, value) in flatten(table, Leaves::Typed)? {
        let under = gathered.iter_mut().find_map(|(prefix, table)| {
            let rest = key.strip_prefix(*prefix)?.strip_prefix('.')?;
            Some((*prefix, table, rest.to_owned()))
        });
        match under {
            Some((KAFKA_PRODUCER, table, rest)) => {
                let leaves = Leaves::Strings {
                    prefix: KAFKA_PRODUCER,
                };
                flatten_value(table, rest, value, leaves)?;
            }
            Some((_, table, rest)) => {
                table.insert(rest, value);
            }
            None => flatten_value(&mut flat, key, value, Leaves::Typed)?,
        }
    }
    for (prefix, table) in gathered {
        if prefix == OUTBOX {
            // A nested struct: serde would name a misspelt key of it with a
            // list of every key, not the nearest.
            check_keys(
                OUTBOX,
                table.keys().map(String::as_str),
                keys::<OutboxConfig>(),
            )?;
        }
        if !table.is_empty() {
            if flat.contains_key(prefix) {
                return Err(ConfigError::new(
                    prefix,
                    "set both as a table and as a value",
                ));
            }
            flat.insert(prefix.to_owned(), toml::Value::Table(table));
        }
    }
    Ok(flat)
}

impl CaptureConfig {
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

    /// Reads, parses, resolves secrets and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("(file)", format!("cannot read config file {origin}: {e}"))
        })?;
        Self::parse(&text, &origin)
    }

    /// Parses, resolves secrets and validates config text; `origin` names it
    /// in errors about the whole text.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let told = oncely_core::toml_error(&e, text);
            ConfigError::new("(file)", format!("{origin} is not valid TOML: {told}"))
        })?;
        let mut cfg: CaptureConfig = from_flat(flatten_capture(table)?, "config")?;
        // `"sasl.password" = "${file:/run/secrets/kafka}"`, as in Kafka Connect.
        for (key, value) in cfg.kafka_producer.iter_mut() {
            *value = resolve_reference(value)
                .map_err(|e| ConfigError::new(format!("{KAFKA_PRODUCER}.{key}"), e.to_string()))?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The TLS settings of every connection to the captured database (the
    /// control, snapshot and signal connections, the replication stream and
    /// `oncely verify`'s reader), for `oncely-core`'s connection builder.
    pub fn tls(&self) -> PgTls {
        PgTls {
            sslmode: self.database_sslmode,
            sslrootcert: self.database_sslrootcert.clone(),
            sslcert: self.database_sslcert.clone(),
            sslkey: self
                .database_sslkey
                .as_ref()
                .map(|k| PathBuf::from(k.expose())),
            keys: "database",
        }
    }

    /// The largest record capture publishes, in bytes: the topics it creates
    /// get it as `max.message.bytes` and its producer as `message.max.bytes`.
    /// `topic.creation.default.max.message.bytes`, else the producer's
    /// `message.max.bytes` when `[kafka.producer]` sets it, else
    /// [`DEFAULT_MAX_MESSAGE_BYTES`].
    pub fn max_message_bytes(&self) -> usize {
        self.topic_max_message_bytes
            .or_else(|| self.producer_message_max_bytes())
            .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES)
    }

    /// `[kafka.producer] "message.max.bytes"`, when set (and a number).
    pub fn producer_message_max_bytes(&self) -> Option<usize> {
        self.kafka_producer
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok())
    }

    /// `[kafka.producer] "transaction.timeout.ms"`, else
    /// [`DEFAULT_TRANSACTION_TIMEOUT_MS`]; `None` when it is not a number.
    pub fn transaction_timeout_ms(&self) -> Option<u64> {
        match self.kafka_producer.get("transaction.timeout.ms") {
            Some(v) => v.trim().parse().ok(),
            None => Some(DEFAULT_TRANSACTION_TIMEOUT_MS),
        }
    }

    /// The topic of this connector's offset records: `offset.storage.topic`,
    /// or `oncely-offsets-<name>`. One topic per connector by default: an
    /// open transaction of one connector holds back what `read_committed`
    /// readers see of the topic, so a shared topic would hide one
    /// connector's newest offset behind another's unfinished transaction.
    pub fn offsets_topic(&self) -> String {
        match &self.offset_storage_topic {
            Some(topic) => topic.clone(),
            None => format!("{DEFAULT_OFFSETS_TOPIC_PREFIX}{}", self.connector_name()),
        }
    }

    /// The connector's name: `name`, or `topic.prefix` when unset.
    pub fn connector_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.topic_prefix)
    }

    /// The stable Kafka `transactional.id` of this connector: a second
    /// instance with the same name fences the first.
    pub fn transactional_id(&self) -> String {
        format!("oncely-capture-{}", self.connector_name())
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms.unwrap_or(DEFAULT_HEARTBEAT_MS))
    }

    /// `health.ready.max.lag.ms` as a duration.
    pub fn ready_max_lag(&self) -> Duration {
        Duration::from_millis(
            self.health_ready_max_lag_ms
                .unwrap_or(DEFAULT_READY_MAX_LAG_MS),
        )
    }

    /// `database.port`, else the source's default port.
    pub fn port(&self) -> u16 {
        self.database_port.unwrap_or(match self.source {
            SourceKind::Postgres => DEFAULT_PORT,
            SourceKind::Mysql => DEFAULT_MYSQL_PORT,
        })
    }

    /// The tables capture selects by name: `table.include.list` and
    /// `table.exclude.list`, and for a MySQL source `database.include.list`
    /// without the server's own databases.
    pub fn captured_tables_filter(&self) -> Result<crate::filter::TableFilter, ConfigError> {
        let bad = |key: &str, e: regex::Error| ConfigError::new(key, e.to_string());
        let filter =
            crate::filter::TableFilter::new(&self.table_include_list.0, &self.table_exclude_list.0)
                .map_err(|e| bad("table.include.list", e))?;
        match self.source {
            SourceKind::Postgres => Ok(filter),
            SourceKind::Mysql => filter
                .with_databases(&self.database_include_list.0, mysql::SYSTEM_DATABASES)
                .map_err(|e| bad("database.include.list", e)),
        }
    }

    /// The MySQL source's value mapping: its four Debezium keys.
    pub fn mysql_mapping(&self) -> MappingConfig {
        MappingConfig {
            decimal: self.decimal_handling_mode,
            time: self.time_precision_mode,
            bigint_unsigned: self.bigint_unsigned_handling_mode,
            tinyint_one_as_boolean: self.tinyint_one_as_boolean,
        }
    }

    pub fn batch_max_time(&self) -> Duration {
        Duration::from_millis(self.batch_max_ms)
    }

    pub fn chunk_size(&self) -> usize {
        self.incremental_snapshot_chunk_size
    }

    /// The topic of table `schema.table` (see [`crate::naming::table_topic`]).
    pub fn table_topic(&self, schema: &str, table: &str) -> String {
        crate::naming::table_topic(&self.topic_prefix, &self.topic_name_mapping, schema, table)
    }

    /// The row filter of table `schema.table` (`table.filter`), if any.
    pub fn row_filter(&self, schema: &str, table: &str) -> Option<&str> {
        self.table_filter
            .get(&format!("{schema}.{table}"))
            .map(String::as_str)
    }

    /// The column settings (`column.*`) compiled: which columns are
    /// published and how masked, as capture's encoders and `oncely verify`
    /// apply them. Hash salts are resolved here, never shown.
    pub fn column_policy(&self) -> Result<crate::catalog::ColumnPolicy, ConfigError> {
        crate::catalog::ColumnPolicy::new(crate::envelope::ColumnSettings {
            include: &self.column_include_list.0,
            exclude: &self.column_exclude_list.0,
            mask: &self.column_mask,
            truncate: &self.column_truncate,
            propagate_columns: &self.column_propagate_source_type.0,
            propagate_types: &self.datatype_propagate_source_type.0,
        })
        .map_err(|e| ConfigError::new(e.key, e.message))
    }

    /// The signal table, `schema.table`, when configured.
    pub fn signal_table(&self) -> Option<&str> {
        self.signal_data_collection.as_deref()
    }
}

#[cfg(test)]
mod tests;
