//! Capture configuration: TOML with Debezium-familiar names.
//!
//! TOML dotted keys map onto nested tables, so `topic.prefix = "shop"` and
//! `slot.name = "oncely"` are written exactly as a Debezium user would, and
//! each nested struct rejects unknown keys. [`CaptureConfig::validate`] checks
//! the values and names the offending key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use oncely_core::postgres::{PgTls, SettingError, SslMode};

use crate::secret::{resolve_reference, Secret, SecretError};

pub const DEFAULT_PORT: u16 = 5432;
pub const DEFAULT_SLOT: &str = "oncely";
pub const DEFAULT_PUBLICATION: &str = "oncely_publication";
/// The offsets topic every connector shared before 0.2: read once, on the
/// first start of a connector whose own default topic holds nothing yet.
pub const LEGACY_OFFSETS_TOPIC: &str = "oncely-offsets";
/// The default `offset.storage.topic` is this prefix and the connector name
/// (see [`CaptureConfig::offsets_topic`]).
pub const DEFAULT_OFFSETS_TOPIC_PREFIX: &str = "oncely-offsets-";
/// Default `topic.creation.default.max.message.bytes` (and the producer's
/// `message.max.bytes`): room for rows with large TOASTed values.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// librdkafka's upper bound for `message.max.bytes`.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 1_000_000_000;
pub const DEFAULT_BATCH_MAX_EVENTS: usize = 20_000;
pub const DEFAULT_BATCH_MAX_BYTES: usize = 64 * 1024 * 1024;
pub const DEFAULT_BATCH_MAX_MS: u64 = 25;
pub const DEFAULT_HEARTBEAT_MS: u64 = 10_000;
/// Default `health.ready.max.lag.ms`: how long changes read may wait for a
/// Kafka commit before `/readyz` answers 503.
pub const DEFAULT_READY_MAX_LAG_MS: u64 = 60_000;
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_SNAPSHOT_CHUNK_SIZE: usize = 1024;
/// Snapshot rows of a chunk share one commit LSN and are told apart by
/// `event_seq`; sinks pack that into 20 bits (Elasticsearch external versions).
pub const MAX_SNAPSHOT_CHUNK_SIZE: usize = 1 << 20;

/// A bad configuration: which key, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
    #[error("config key `{key}`: {source}")]
    Secret {
        key: &'static str,
        source: SecretError,
    },
    /// `database.sslmode` and the files it needs do not fit together.
    #[error(transparent)]
    Tls(#[from] SettingError),
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// The whole `capture.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Connector name: identifies the offsets and the Kafka `transactional.id`.
    /// Defaults to `topic.prefix`.
    pub name: Option<String>,
    pub topic: TopicConfig,
    pub database: DatabaseConfig,
    #[serde(default)]
    pub slot: SlotConfig,
    #[serde(default)]
    pub publication: PublicationConfig,
    #[serde(default)]
    pub table: TableFilterConfig,
    #[serde(default)]
    pub message: MessageConfig,
    #[serde(default)]
    pub heartbeat: HeartbeatConfig,
    #[serde(default)]
    pub tombstones: TombstonesConfig,
    #[serde(default)]
    pub schemas: SchemasConfig,
    #[serde(default)]
    pub batch: BatchConfig,
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub offset: OffsetConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// `health.ready.max.lag.ms`.
    #[serde(default)]
    pub health: HealthConfig,
    /// `[outbox]`: route an outbox table's inserts as domain events.
    pub outbox: Option<crate::outbox::OutboxConfig>,
    /// `snapshot.mode`, `snapshot.new.tables`.
    #[serde(default)]
    pub snapshot: SnapshotConfig,
    /// `incremental.snapshot.chunk.size`.
    #[serde(default)]
    pub incremental: IncrementalConfig,
    /// `signal.data.collection`.
    #[serde(default)]
    pub signal: SignalConfig,
    /// `replica.identity.check`.
    #[serde(default)]
    pub replica: ReplicaConfig,
    /// `schema.change.backfill`.
    #[serde(default)]
    pub schema: SchemaConfig,
    /// `interval.handling.mode`.
    #[serde(default)]
    pub interval: IntervalConfig,
}

/// `interval.handling.mode`: `"string"` (default: Debezium's
/// `io.debezium.time.Interval`, exact) or `"numeric"` (Debezium's default
/// `io.debezium.time.MicroDuration`: µs, a month as 30.4375 days, lossy).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntervalConfig {
    #[serde(default)]
    pub handling: IntervalHandlingConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntervalHandlingConfig {
    #[serde(default)]
    pub mode: crate::value::IntervalHandlingMode,
}

/// `schema.change.backfill`: whether a schema change that alters existing
/// rows without row events (ADD COLUMN with a default, RENAME COLUMN, ALTER
/// COLUMN TYPE) snapshots the table again so the targets converge.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaConfig {
    #[serde(default)]
    pub change: SchemaChangeConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaChangeConfig {
    #[serde(default)]
    pub backfill: SchemaChangeBackfill,
}

/// `schema.change.backfill` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaChangeBackfill {
    /// Snapshot the table (an incremental, watermarked snapshot).
    #[default]
    Auto,
    /// Publish the schema-change record only; the operator snapshots.
    Off,
}

/// `replica.identity.check`: what start-up (and a Relation message in the
/// stream) does about a captured table whose replica identity does not
/// carry its event key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    #[serde(default)]
    pub identity: ReplicaIdentityConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaIdentityConfig {
    #[serde(default)]
    pub check: ReplicaIdentityCheck,
}

/// `replica.identity.check` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaIdentityCheck {
    /// Refuse to start; in the stream, publish nothing of the table.
    #[default]
    Fail,
    /// Log a warning and publish as the identity allows.
    Warn,
}

/// `snapshot.mode` and `snapshot.new.tables`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    #[serde(default)]
    pub mode: SnapshotMode,
    #[serde(default)]
    pub new: SnapshotNewConfig,
}

/// `snapshot.new.tables`: snapshot, on start, captured tables that the stored
/// offset does not list yet (added to `table.include.list` since). Default false.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotNewConfig {
    #[serde(default)]
    pub tables: bool,
}

/// Debezium's `snapshot.mode` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Snapshot the captured tables when no offset is stored, then stream.
    #[default]
    Initial,
    /// Never snapshot on start; stream from the slot.
    NoData,
    /// Like `initial`, then exit 0 once the snapshot is complete.
    InitialOnly,
    /// Like `initial`, and also when the stored position is no longer in the
    /// slot (the gap that otherwise stops start-up).
    WhenNeeded,
    /// Snapshot on every start of the process.
    Always,
}

/// `incremental.snapshot.chunk.size`, as Debezium names it: rows per chunk.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementalConfig {
    #[serde(default)]
    pub snapshot: IncrementalSnapshot,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementalSnapshot {
    #[serde(default)]
    pub chunk: ChunkConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkConfig {
    #[serde(default = "default_chunk_size")]
    pub size: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig {
            size: DEFAULT_SNAPSHOT_CHUNK_SIZE,
        }
    }
}

fn default_chunk_size() -> usize {
    DEFAULT_SNAPSHOT_CHUNK_SIZE
}

/// `signal.data.collection`: the `schema.table` whose inserted rows are
/// signals (columns `id`, `type`, `data`), as in Debezium.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalConfig {
    #[serde(default)]
    pub data: SignalData,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalData {
    pub collection: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// `topic.prefix`: topics are `<prefix>.<schema>.<table>`.
    pub prefix: String,
    #[serde(default)]
    pub creation: TopicCreationConfig,
    #[serde(default)]
    pub name: TopicNameConfig,
}

/// `topic.name.mapping = { "<schema>.<table>" = "<topic>" }`: the topic of a
/// table instead of `<prefix>.<schema>.<table>`, to separate tables whose
/// default names would merge (see [`crate::naming`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicNameConfig {
    #[serde(default)]
    pub mapping: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicCreationConfig {
    #[serde(default)]
    pub default: TopicCreationDefaults,
}

/// `topic.creation.default.partitions` / `.replication.factor` /
/// `.max.message.bytes` for topics the connector creates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicCreationDefaults {
    #[serde(default = "one_i32")]
    pub partitions: i32,
    #[serde(default)]
    pub replication: ReplicationFactor,
    /// `max.message.bytes`: the topic config of that name on created topics.
    #[serde(default)]
    pub max: TopicMaxConfig,
}

impl Default for TopicCreationDefaults {
    fn default() -> Self {
        TopicCreationDefaults {
            partitions: 1,
            replication: ReplicationFactor::default(),
            max: TopicMaxConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMaxConfig {
    #[serde(default)]
    pub message: TopicMaxMessage,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicMaxMessage {
    pub bytes: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationFactor {
    #[serde(default = "one_i32")]
    pub factor: i32,
}

impl Default for ReplicationFactor {
    fn default() -> Self {
        ReplicationFactor { factor: 1 }
    }
}

fn one_i32() -> i32 {
    1
}

/// `database.*`: where to read changes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub hostname: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub user: String,
    /// Literal, `${env:NAME}` or `${file:/path}`.
    #[serde(default)]
    pub password: Secret,
    pub dbname: String,
    /// `database.sslmode`: `disable`, `prefer` (the default, as libpq's),
    /// `require`, `verify-ca` or `verify-full`, with libpq's meanings.
    #[serde(default = "default_sslmode")]
    pub sslmode: SslMode,
    /// `database.sslrootcert`: PEM file of the CAs to trust (needed by
    /// `verify-ca` and `verify-full`; makes `require` check the chain).
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// `database.sslcert`: a client certificate (PEM), for servers that ask
    /// for one (`clientcert=verify-full`, `cert` authentication).
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// `database.sslkey`: the client certificate's key file; the path may be
    /// a `${env:NAME}` reference, resolved at start.
    #[serde(default)]
    pub sslkey: Option<Secret>,
}

/// `database.sslmode` when unset: libpq's default.
pub const DEFAULT_SSLMODE: SslMode = SslMode::Prefer;

fn default_sslmode() -> SslMode {
    DEFAULT_SSLMODE
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

impl DatabaseConfig {
    /// The TLS settings of every connection to the captured database (the
    /// control, snapshot and signal connections, the replication stream and
    /// `oncely verify`'s reader), for `oncely-core`'s connection builder.
    pub fn tls(&self) -> PgTls {
        PgTls {
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.clone(),
            sslcert: self.sslcert.clone(),
            sslkey: self.sslkey.as_ref().map(|k| PathBuf::from(k.expose())),
            keys: "database",
        }
    }
}

/// `slot.name` and whether to create it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotConfig {
    #[serde(default = "default_slot")]
    pub name: String,
    /// Create the slot when it does not exist (default true).
    #[serde(default = "yes")]
    pub create: bool,
    /// A failover slot (PostgreSQL 17+): synchronized to physical standbys
    /// (`sync_replication_slots`), so capture resumes on a promoted standby.
    #[serde(default)]
    pub failover: bool,
    /// `slot.max.retained.bytes`.
    #[serde(default)]
    pub max: SlotMax,
}

impl Default for SlotConfig {
    fn default() -> Self {
        SlotConfig {
            name: DEFAULT_SLOT.into(),
            create: true,
            failover: false,
            max: SlotMax::default(),
        }
    }
}

/// `slot.max.retained.bytes`: WAL the slot may keep on the server before
/// capture reports it (an error log, a metric, `/readyz` 503). Unset: no limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotMax {
    #[serde(default)]
    pub retained: SlotRetained,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRetained {
    pub bytes: Option<u64>,
}

fn default_slot() -> String {
    DEFAULT_SLOT.into()
}

fn yes() -> bool {
    true
}

/// `publication.name` and `publication.autocreate.mode`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicationConfig {
    #[serde(default = "default_publication")]
    pub name: String,
    #[serde(default)]
    pub autocreate: AutocreateConfig,
}

impl Default for PublicationConfig {
    fn default() -> Self {
        PublicationConfig {
            name: DEFAULT_PUBLICATION.into(),
            autocreate: AutocreateConfig::default(),
        }
    }
}

fn default_publication() -> String {
    DEFAULT_PUBLICATION.into()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutocreateConfig {
    #[serde(default)]
    pub mode: AutocreateMode,
}

/// Debezium's `publication.autocreate.mode` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutocreateMode {
    /// The publication must exist and hold every captured table.
    Disabled,
    /// Create it `FOR ALL TABLES` when missing (needs superuser).
    #[default]
    AllTables,
    /// Create it for exactly the captured tables, and add captured tables it lacks.
    Filtered,
}

/// `table.include.list` / `table.exclude.list`: regular expressions matched
/// against the whole `schema.table` name.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableFilterConfig {
    #[serde(default)]
    pub include: ListConfig,
    #[serde(default)]
    pub exclude: ListConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListConfig {
    #[serde(default)]
    pub list: StringList,
}

/// A list given either as a TOML array or, as in Debezium, one comma-separated string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StringList(pub Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let items = match Raw::deserialize(d)? {
            Raw::One(s) => s.split(',').map(str::to_string).collect(),
            Raw::Many(v) => v,
        };
        Ok(StringList(
            items
                .into_iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        ))
    }
}

/// `message.key.columns`: `schema.table:col1,col2;schema.table2:col` as in Debezium.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageConfig {
    #[serde(default)]
    pub key: MessageKeyConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageKeyConfig {
    #[serde(default)]
    pub columns: Option<String>,
}

/// `heartbeat.interval.ms` and `heartbeat.action.query`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatConfig {
    #[serde(default)]
    pub interval: MillisConfig,
    #[serde(default)]
    pub action: HeartbeatActionConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MillisConfig {
    pub ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatActionConfig {
    pub query: Option<String>,
}

/// `tombstones.on.delete` (default true).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TombstonesConfig {
    #[serde(default)]
    pub on: TombstonesOn,
}

impl Default for TombstonesConfig {
    fn default() -> Self {
        TombstonesConfig {
            on: TombstonesOn { delete: true },
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TombstonesOn {
    #[serde(default = "yes")]
    pub delete: bool,
}

impl Default for TombstonesOn {
    fn default() -> Self {
        TombstonesOn { delete: true }
    }
}

/// `schemas.enable`: wrap keys and values in `{schema, payload}` (default true,
/// as Kafka Connect's JSON converter does).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemasConfig {
    #[serde(default = "yes")]
    pub enable: bool,
}

impl Default for SchemasConfig {
    fn default() -> Self {
        SchemasConfig { enable: true }
    }
}

/// When one Kafka transaction closes: `batch.max.events`, `batch.max.bytes`, `batch.max.ms`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    #[serde(default)]
    pub max: BatchMax,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchMax {
    #[serde(default = "default_batch_events")]
    pub events: usize,
    #[serde(default = "default_batch_bytes")]
    pub bytes: usize,
    #[serde(default = "default_batch_ms")]
    pub ms: u64,
}

impl Default for BatchMax {
    fn default() -> Self {
        BatchMax {
            events: DEFAULT_BATCH_MAX_EVENTS,
            bytes: DEFAULT_BATCH_MAX_BYTES,
            ms: DEFAULT_BATCH_MAX_MS,
        }
    }
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

/// `kafka.bootstrap.servers` and raw librdkafka producer overrides under `[kafka.producer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub bootstrap: BootstrapConfig,
    /// librdkafka properties, e.g. `"compression.type" = "lz4"`. Values may be
    /// `${env:..}`/`${file:..}` references. `transactional.id`,
    /// `enable.idempotence` and `isolation.level` are owned by oncely.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapConfig {
    pub servers: String,
}

/// `offset.storage.topic`: the compacted topic of offset records; by default
/// one per connector (see [`CaptureConfig::offsets_topic`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffsetConfig {
    #[serde(default)]
    pub storage: OffsetStorage,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffsetStorage {
    pub topic: Option<String>,
}

/// `metrics.listen`: address of the Prometheus endpoint (`/metrics`); off when absent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: Option<String>,
}

/// `health.ready.max.lag.ms`: `/readyz` answers 503 while changes read have
/// waited longer than this for a Kafka commit (default
/// [`DEFAULT_READY_MAX_LAG_MS`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    #[serde(default)]
    pub ready: HealthReady,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthReady {
    #[serde(default)]
    pub max: HealthReadyMax,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthReadyMax {
    #[serde(default)]
    pub lag: MillisConfig,
}

/// Librdkafka properties a user may not override: they carry the exactly-once guarantee.
const RESERVED_PRODUCER_KEYS: &[&str] = &[
    "transactional.id",
    "enable.idempotence",
    "isolation.level",
    "bootstrap.servers",
];

impl CaptureConfig {
    /// Reads, parses, resolves secrets and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses, resolves secrets and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let mut cfg: CaptureConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: oncely_core::toml_error(&e, text),
        })?;
        cfg.database.password =
            cfg.database
                .password
                .resolve()
                .map_err(|source| ConfigError::Secret {
                    key: "database.password",
                    source,
                })?;
        if let Some(key) = &cfg.database.sslkey {
            cfg.database.sslkey = Some(key.resolve().map_err(|source| ConfigError::Secret {
                key: "database.sslkey",
                source,
            })?);
        }
        for value in cfg.kafka.producer.values_mut() {
            *value = resolve_reference(value).map_err(|source| ConfigError::Secret {
                key: "kafka.producer",
                source,
            })?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let prefix = &self.topic.prefix;
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(invalid(
                "topic.prefix",
                format!("{prefix:?} must be non-empty and use only letters, digits, '.', '_' and '-' (Kafka topic characters)"),
            ));
        }
        if !is_identifier(&self.slot.name) {
            return Err(invalid(
                "slot.name",
                format!(
                    "{:?} must be lower-case letters, digits and '_' (PostgreSQL slot name rules)",
                    self.slot.name
                ),
            ));
        }
        if self.publication.name.is_empty() {
            return Err(invalid("publication.name", "must not be empty"));
        }
        self.database.tls().check()?;
        if self.batch.max.events == 0 {
            return Err(invalid("batch.max.events", "must be at least 1"));
        }
        if self.batch.max.bytes < 1024 {
            return Err(invalid("batch.max.bytes", "must be at least 1024"));
        }
        if self.batch.max.ms == 0 {
            return Err(invalid("batch.max.ms", "must be at least 1"));
        }
        if self.heartbeat.interval.ms == Some(0) {
            return Err(invalid(
                "heartbeat.interval.ms",
                "must be positive (omit it for the default of 10000)",
            ));
        }
        if self.kafka.bootstrap.servers.trim().is_empty() {
            return Err(invalid(
                "kafka.bootstrap.servers",
                "must name at least one broker",
            ));
        }
        if let Some(key) = self
            .kafka
            .producer
            .keys()
            .find(|k| RESERVED_PRODUCER_KEYS.contains(&k.as_str()))
        {
            return Err(invalid(
                "kafka.producer",
                format!("`{key}` is set by oncely itself (it carries the exactly-once guarantee); remove it"),
            ));
        }
        if self.topic.creation.default.partitions < 1 {
            return Err(invalid(
                "topic.creation.default.partitions",
                "must be at least 1",
            ));
        }
        match &self.offset.storage.topic {
            Some(topic) if !is_topic_name(topic) => {
                return Err(invalid(
                    "offset.storage.topic",
                    format!("{topic:?} must be 1 to 249 letters, digits, '.', '_' and '-' (Kafka topic characters)"),
                ));
            }
            Some(_) => {}
            None if !is_topic_name(&self.offsets_topic()) => {
                return Err(invalid(
                    "name",
                    format!(
                        "{:?} cannot name the default offsets topic {DEFAULT_OFFSETS_TOPIC_PREFIX}<name>: use letters, digits, '.', '_' and '-', or set offset.storage.topic",
                        self.connector_name()
                    ),
                ));
            }
            None => {}
        }
        for (table, topic) in &self.topic.name.mapping {
            if crate::snapshot::split_table(table).is_none() {
                return Err(invalid(
                    "topic.name.mapping",
                    format!("key {table:?} must be <schema>.<table>, spelled as the catalog spells them"),
                ));
            }
            if !is_topic_name(topic) {
                return Err(invalid(
                    "topic.name.mapping",
                    format!("topic {topic:?} of {table} must be 1 to 249 letters, digits, '.', '_' and '-' (Kafka topic characters)"),
                ));
            }
        }
        self.validate_message_size()?;
        crate::filter::TableFilter::new(&self.table.include.list.0, &self.table.exclude.list.0)
            .map_err(|e| invalid("table.include.list", e.to_string()))?;
        crate::filter::parse_key_columns(self.message.key.columns.as_deref())
            .map_err(|e| invalid("message.key.columns", e))?;
        if let Some(outbox) = &self.outbox {
            outbox
                .validate()
                .map_err(|(key, message)| invalid(key, message))?;
        }
        let chunk = self.incremental.snapshot.chunk.size;
        if chunk == 0 || chunk > MAX_SNAPSHOT_CHUNK_SIZE {
            return Err(invalid(
                "incremental.snapshot.chunk.size",
                format!("{chunk} must be between 1 and {MAX_SNAPSHOT_CHUNK_SIZE} (default {DEFAULT_SNAPSHOT_CHUNK_SIZE})"),
            ));
        }
        if let Some(signal) = &self.signal.data.collection {
            if signal.split('.').count() != 2 || signal.split('.').any(str::is_empty) {
                return Err(invalid(
                    "signal.data.collection",
                    format!("{signal:?} must be a schema-qualified table, e.g. \"public.oncely_signal\""),
                ));
            }
            if self.outbox.as_ref().is_some_and(|o| &o.table == signal) {
                return Err(invalid(
                    "signal.data.collection",
                    format!("{signal} is also outbox.table; give signals a table of their own"),
                ));
            }
        }
        if self.slot.max.retained.bytes == Some(0) {
            return Err(invalid(
                "slot.max.retained.bytes",
                "0 would report every slot; leave it unset for no limit".to_owned(),
            ));
        }
        if let Some(ms) = self.health.ready.max.lag.ms {
            if !(100..=86_400_000).contains(&ms) {
                return Err(invalid(
                    "health.ready.max.lag.ms",
                    format!("{ms} must be between 100 and 86400000 (default {DEFAULT_READY_MAX_LAG_MS})"),
                ));
            }
        }
        if let Some(listen) = &self.metrics.listen {
            listen.parse::<std::net::SocketAddr>().map_err(|e| {
                invalid(
                    "metrics.listen",
                    format!("{listen:?} is not host:port ({e})"),
                )
            })?;
        }
        Ok(())
    }

    /// The largest record capture publishes, in bytes: the topics it creates
    /// get it as `max.message.bytes` and its producer as `message.max.bytes`.
    /// `topic.creation.default.max.message.bytes`, else the producer's
    /// `message.max.bytes` when `[kafka.producer]` sets it, else
    /// [`DEFAULT_MAX_MESSAGE_BYTES`].
    pub fn max_message_bytes(&self) -> usize {
        self.topic
            .creation
            .default
            .max
            .message
            .bytes
            .or_else(|| self.producer_message_max_bytes())
            .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES)
    }

    /// `[kafka.producer] "message.max.bytes"`, when set (and a number).
    pub fn producer_message_max_bytes(&self) -> Option<usize> {
        self.kafka
            .producer
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok())
    }

    fn validate_message_size(&self) -> Result<(), ConfigError> {
        if let Some(raw) = self.kafka.producer.get("message.max.bytes") {
            if self.producer_message_max_bytes().is_none() {
                return Err(invalid(
                    "kafka.producer",
                    format!("`message.max.bytes` = {raw:?} is not a number of bytes"),
                ));
            }
        }
        let (key, bytes) = match self.topic.creation.default.max.message.bytes {
            Some(b) => ("topic.creation.default.max.message.bytes", b),
            None => ("kafka.producer", self.max_message_bytes()),
        };
        if !(1024..=MAX_MESSAGE_BYTES_LIMIT).contains(&bytes) {
            return Err(invalid(
                key,
                format!("{bytes} bytes: the record size limit must be between 1024 and {MAX_MESSAGE_BYTES_LIMIT}"),
            ));
        }
        if let Some(producer) = self.producer_message_max_bytes() {
            if producer > bytes {
                return Err(invalid(
                    "kafka.producer",
                    format!("`message.max.bytes` = {producer} is larger than topic.creation.default.max.message.bytes = {bytes}: the topics would refuse what the producer sends; set both to the same value"),
                ));
            }
        }
        Ok(())
    }

    /// The topic of this connector's offset records: `offset.storage.topic`,
    /// or `oncely-offsets-<name>`. One topic per connector by default: an
    /// open transaction of one connector holds back what `read_committed`
    /// readers see of the topic, so a shared topic would hide one
    /// connector's newest offset behind another's unfinished transaction.
    pub fn offsets_topic(&self) -> String {
        match &self.offset.storage.topic {
            Some(topic) => topic.clone(),
            None => format!("{DEFAULT_OFFSETS_TOPIC_PREFIX}{}", self.connector_name()),
        }
    }

    /// Whether the offsets topic is the default one (a connector upgraded
    /// from the shared [`LEGACY_OFFSETS_TOPIC`] may find its offset there).
    pub fn offsets_topic_is_default(&self) -> bool {
        self.offset.storage.topic.is_none()
    }

    /// The connector's name: `name`, or `topic.prefix` when unset.
    pub fn connector_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.topic.prefix)
    }

    /// The stable Kafka `transactional.id` of this connector: a second
    /// instance with the same name fences the first.
    pub fn transactional_id(&self) -> String {
        format!("oncely-capture-{}", self.connector_name())
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat.interval.ms.unwrap_or(DEFAULT_HEARTBEAT_MS))
    }

    /// `health.ready.max.lag.ms` as a duration.
    pub fn ready_max_lag(&self) -> Duration {
        Duration::from_millis(
            self.health
                .ready
                .max
                .lag
                .ms
                .unwrap_or(DEFAULT_READY_MAX_LAG_MS),
        )
    }

    pub fn batch_max_time(&self) -> Duration {
        Duration::from_millis(self.batch.max.ms)
    }

    pub fn chunk_size(&self) -> usize {
        self.incremental.snapshot.chunk.size
    }

    /// The topic of table `schema.table` (see [`crate::naming::table_topic`]).
    pub fn table_topic(&self, schema: &str, table: &str) -> String {
        crate::naming::table_topic(&self.topic.prefix, &self.topic.name.mapping, schema, table)
    }

    /// The signal table, `schema.table`, when configured.
    pub fn signal_table(&self) -> Option<&str> {
        self.signal.data.collection.as_deref()
    }
}

fn is_topic_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 249
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
topic.prefix = "shop"
database.hostname = "127.0.0.1"
database.user = "postgres"
database.dbname = "shop"
kafka.bootstrap.servers = "127.0.0.1:9092"
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
        assert_eq!(cfg.connector_name(), "shop");
        assert_eq!(cfg.transactional_id(), "oncely-capture-shop");
        assert_eq!(cfg.slot.name, DEFAULT_SLOT);
        assert_eq!(cfg.publication.name, DEFAULT_PUBLICATION);
        assert_eq!(cfg.publication.autocreate.mode, AutocreateMode::AllTables);
        assert!(cfg.tombstones.on.delete);
        assert!(cfg.schemas.enable);
        assert_eq!(cfg.database.port, 5432);
        assert_eq!(cfg.batch.max.events, DEFAULT_BATCH_MAX_EVENTS);
        assert_eq!(cfg.offsets_topic(), "oncely-offsets-shop");
        assert!(cfg.offsets_topic_is_default());
        assert_eq!(cfg.max_message_bytes(), DEFAULT_MAX_MESSAGE_BYTES);
        assert_eq!(cfg.snapshot.mode, SnapshotMode::Initial);
        assert!(!cfg.snapshot.new.tables);
        assert_eq!(cfg.chunk_size(), DEFAULT_SNAPSHOT_CHUNK_SIZE);
        assert_eq!(cfg.signal_table(), None);
        assert_eq!(cfg.replica.identity.check, ReplicaIdentityCheck::Fail);
        assert_eq!(
            cfg.heartbeat_interval(),
            Duration::from_millis(DEFAULT_HEARTBEAT_MS)
        );
    }

    #[test]
    fn debezium_names_parse() {
        let text = format!(
            "{MINIMAL}\nslot.name = \"s1\"\npublication.autocreate.mode = \"filtered\"\n\
             table.include.list = \"public.orders, public.customers\"\n\
             message.key.columns = \"public.orders:id\"\nheartbeat.interval.ms = 500\n\
             tombstones.on.delete = false\nbatch.max.events = 10\n"
        );
        let cfg = CaptureConfig::parse(&text, "test").unwrap();
        assert_eq!(cfg.slot.name, "s1");
        assert_eq!(cfg.publication.autocreate.mode, AutocreateMode::Filtered);
        assert_eq!(
            cfg.table.include.list.0,
            vec!["public.orders".to_string(), "public.customers".to_string()]
        );
        assert!(!cfg.tombstones.on.delete);
        assert_eq!(cfg.heartbeat_interval(), Duration::from_millis(500));
    }

    #[test]
    fn unknown_key_is_rejected_with_its_name() {
        let err = CaptureConfig::parse(&format!("{MINIMAL}\nslot.nmae = \"x\"\n"), "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nmae"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("slot.name = \"Bad-Name\"", "slot.name"),
            ("batch.max.events = 0", "batch.max.events"),
            ("table.include.list = \"public.(\"", "table.include.list"),
            (
                "kafka.producer.\"transactional.id\" = \"x\"",
                "kafka.producer",
            ),
            ("metrics.listen = \"nope\"", "metrics.listen"),
            ("health.ready.max.lag.ms = 5", "health.ready.max.lag.ms"),
            ("slot.max.retained.bytes = 0", "slot.max.retained.bytes"),
            ("message.key.columns = \"orders\"", "message.key.columns"),
            ("snapshot.mode = \"sometimes\"", "snapshot.mode"),
            (
                "incremental.snapshot.chunk.size = 0",
                "incremental.snapshot.chunk.size",
            ),
            (
                "signal.data.collection = \"signals\"",
                "signal.data.collection",
            ),
        ];
        for (line, key) in cases {
            let err = CaptureConfig::parse(&format!("{MINIMAL}\n{line}\n"), "test")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn offsets_topic_is_per_connector_unless_configured() {
        let named =
            CaptureConfig::parse(&format!("name = \"orders-cdc\"\n{MINIMAL}"), "test").unwrap();
        assert_eq!(named.offsets_topic(), "oncely-offsets-orders-cdc");
        let set = CaptureConfig::parse(
            &format!("{MINIMAL}\noffset.storage.topic = \"shared\"\n"),
            "test",
        )
        .unwrap();
        assert_eq!(set.offsets_topic(), "shared");
        assert!(!set.offsets_topic_is_default());
        let err = CaptureConfig::parse(&format!("name = \"a b\"\n{MINIMAL}"), "test")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`name`") && err.contains("offset.storage.topic"),
            "{err}"
        );
        // A name that cannot make a topic is fine with an explicit topic.
        CaptureConfig::parse(
            &format!("name = \"a b\"\n{MINIMAL}\noffset.storage.topic = \"t\"\n"),
            "test",
        )
        .unwrap();
    }

    #[test]
    fn tls_keys_parse_with_libpq_defaults_and_are_checked_together() {
        let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
        assert_eq!(cfg.database.sslmode, SslMode::Prefer);
        assert_eq!(cfg.database.tls().sslrootcert, None);
        std::env::set_var("ONCELY_TEST_PG_SSLKEY", "/keys/client.key");
        let full = CaptureConfig::parse(
            &format!(
                "{MINIMAL}database.sslmode = \"verify-full\"\ndatabase.sslrootcert = \"/ca.crt\"\n\
                 database.sslcert = \"/client.crt\"\ndatabase.sslkey = \"${{env:ONCELY_TEST_PG_SSLKEY}}\"\n"
            ),
            "test",
        )
        .unwrap();
        let tls = full.database.tls();
        assert_eq!(tls.sslmode, SslMode::VerifyFull);
        assert_eq!(tls.sslrootcert, Some(PathBuf::from("/ca.crt")));
        assert_eq!(tls.sslcert, Some(PathBuf::from("/client.crt")));
        assert_eq!(tls.sslkey, Some(PathBuf::from("/keys/client.key")));
        for (mode, expected) in [
            ("disable", SslMode::Disable),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
        ] {
            let text = format!(
                "{MINIMAL}database.sslmode = \"{mode}\"\ndatabase.sslrootcert = \"/ca.crt\"\n"
            );
            match CaptureConfig::parse(&text, "test") {
                Ok(cfg) => assert_eq!(cfg.database.sslmode, expected),
                // A CA under `disable` would be ignored: refused, naming the key.
                Err(e) => {
                    assert_eq!(expected, SslMode::Disable);
                    assert!(e.to_string().contains("database.sslrootcert"), "{e}");
                }
            }
        }
        let cases = [
            ("database.sslmode = \"verify-full\"", "database.sslrootcert"),
            ("database.sslmode = \"verify-ca\"", "database.sslrootcert"),
            ("database.sslcert = \"/c.crt\"", "database.sslkey"),
            ("database.sslkey = \"/c.key\"", "database.sslcert"),
            ("database.sslmode = \"allow\"", "database.sslmode"),
            ("database.sslmode = \"disable\"\ndatabase.sslcert = \"/c\"\ndatabase.sslkey = \"/k\"", "database.sslcert"),
            ("database.sslkey = \"${env:ONCELY_TEST_UNSET_SSLKEY}\"\ndatabase.sslcert = \"/c\"", "database.sslkey"),
            ("database.sslpassword = \"x\"", "sslpassword"),
        ];
        for (line, key) in cases {
            let err = CaptureConfig::parse(&format!("{MINIMAL}{line}\n"), "test")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn message_size_limit_comes_from_the_topic_setting_or_the_producer() {
        let topic = CaptureConfig::parse(
            &format!("{MINIMAL}\ntopic.creation.default.max.message.bytes = 1048576\n"),
            "test",
        )
        .unwrap();
        assert_eq!(topic.max_message_bytes(), 1_048_576);
        let producer = CaptureConfig::parse(
            &format!("{MINIMAL}\n[kafka.producer]\n\"message.max.bytes\" = \"2000000\"\n"),
            "test",
        )
        .unwrap();
        assert_eq!(producer.max_message_bytes(), 2_000_000);
        let cases = [
            ("topic.creation.default.max.message.bytes = 10", "topic.creation.default.max.message.bytes"),
            ("[kafka.producer]\n\"message.max.bytes\" = \"big\"", "kafka.producer"),
            (
                "topic.creation.default.max.message.bytes = 1048576\n[kafka.producer]\n\"message.max.bytes\" = \"2000000\"",
                "kafka.producer",
            ),
        ];
        for (line, key) in cases {
            let err = CaptureConfig::parse(&format!("{MINIMAL}\n{line}\n"), "test")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn missing_required_key_is_named() {
        let err = CaptureConfig::parse("topic.prefix = \"x\"", "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains("database"), "{err}");
    }

    #[test]
    fn password_from_env_reference() {
        std::env::set_var("ONCELY_TEST_PG_PASSWORD", "pw");
        let text = format!("{MINIMAL}\ndatabase.password = \"${{env:ONCELY_TEST_PG_PASSWORD}}\"\n");
        let cfg = CaptureConfig::parse(&text, "test").unwrap();
        assert_eq!(cfg.database.password.expose(), "pw");
        assert!(!format!("{cfg:?}").contains("\"pw\""));
    }

    #[test]
    fn interval_handling_mode_defaults_to_string_and_parses() {
        use crate::value::IntervalHandlingMode;
        let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
        assert_eq!(cfg.interval.handling.mode, IntervalHandlingMode::String);
        let numeric = format!("{MINIMAL}\ninterval.handling.mode = \"numeric\"\n");
        let cfg = CaptureConfig::parse(&numeric, "test").unwrap();
        assert_eq!(cfg.interval.handling.mode, IntervalHandlingMode::Numeric);
        let bad = format!("{MINIMAL}\ninterval.handling.mode = \"iso\"\n");
        let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
        assert!(
            err.contains("interval.handling.mode") && err.contains("numeric"),
            "{err}"
        );
    }

    #[test]
    fn replica_identity_check_parses() {
        let warn = format!("{MINIMAL}\nreplica.identity.check = \"warn\"\n");
        let cfg = CaptureConfig::parse(&warn, "test").unwrap();
        assert_eq!(cfg.replica.identity.check, ReplicaIdentityCheck::Warn);
        let bad = format!("{MINIMAL}\nreplica.identity.check = \"ignore\"\n");
        let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
        assert!(
            err.contains("replica.identity.check") && err.contains("warn"),
            "{err}"
        );
    }

    #[test]
    fn schema_change_backfill_parses() {
        let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
        assert_eq!(cfg.schema.change.backfill, SchemaChangeBackfill::Auto);
        let off = format!("{MINIMAL}\nschema.change.backfill = \"off\"\n");
        let cfg = CaptureConfig::parse(&off, "test").unwrap();
        assert_eq!(cfg.schema.change.backfill, SchemaChangeBackfill::Off);
        let bad = format!("{MINIMAL}\nschema.change.backfill = \"always\"\n");
        let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
        assert!(
            err.contains("schema.change.backfill") || err.contains("auto"),
            "{err}"
        );
    }

    #[test]
    fn the_annotated_example_config_is_valid() {
        std::env::set_var("PGPASSWORD", "example");
        let text = include_str!("../../examples/capture.toml");
        let cfg = CaptureConfig::parse(text, "examples/capture.toml").unwrap();
        assert_eq!(cfg.connector_name(), "shop");
        assert_eq!(cfg.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
    }
}
