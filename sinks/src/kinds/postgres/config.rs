//! `[sink] kind = "postgres"`: the warehouse sink's keys, defaults and checks.

use std::fmt;

use serde::Deserialize;

use crate::error::ConfigError;
use oncely_core::Secret;

/// Default `pool.max.size`: connections kept to the warehouse.
pub const DEFAULT_POOL_MAX_SIZE: usize = 4;
/// Default `target.schema`.
pub const DEFAULT_TARGET_SCHEMA: &str = "public";
/// Default `table.name.format`.
pub const DEFAULT_TABLE_NAME_FORMAT: &str = "${schema}_${table}";
/// Default `history.table.name.format`.
pub const DEFAULT_HISTORY_TABLE_NAME_FORMAT: &str = "${schema}_${table}_history";
/// Default `positions.table`.
pub const DEFAULT_POSITIONS_TABLE: &str = "oncely_positions";
/// Default `connect.timeout.ms`.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Default `meta.column.prefix`: the sink's own columns are `__oncely_lsn`, ...
pub const DEFAULT_META_COLUMN_PREFIX: &str = "__oncely_";
/// PostgreSQL's limit on identifier length, in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// `sslmode`: how the connection is secured, with libpq's meanings (one
/// definition for every PostgreSQL connection, in `oncely-core`).
use oncely_core::postgres::SslMode;

/// `delete.mode`: what a delete event does to the target row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeleteMode {
    /// Keep the row as a tombstone (`__oncely_deleted = true` plus the delete's version):
    /// a replayed older insert or update can never resurrect it. The default.
    #[default]
    Tombstone,
    /// Remove the row (only when the stored version is older). **Loses the protection:**
    /// replaying an older insert of that key afterwards brings the row back.
    Hard,
}

/// `truncate.mode`: what a truncate event (op `t`) does to the target table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TruncateMode {
    /// Mark every row older than the truncate as deleted (tombstones, version-guarded). The default.
    #[default]
    Delete,
    /// Delete every row older than the truncate, tombstones included (a
    /// version-guarded `DELETE`, not a `TRUNCATE` statement: the truncate
    /// arrives once per topic partition, and rows newer than it that another
    /// partition already applied must stay). Replays of older changes can
    /// resurrect rows (same limit as `delete.mode = "hard"`).
    Truncate,
    /// Do nothing.
    Ignore,
}

/// `schema.evolution.drop.columns`: what a column dropped in the source
/// does to its warehouse column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DropColumns {
    /// Keep it: rows keep their old values, new rows hold NULL. The default.
    #[default]
    Keep,
    /// Drop it (`ALTER TABLE ... DROP COLUMN`) once an event newer than the
    /// drop says the source dropped its attnum. Only columns whose source
    /// attnum the sink recorded; never with schemas off.
    Drop,
}

impl<'de> Deserialize<'de> for DropColumns {
    /// By hand, so that a wrong value's message names the whole key and
    /// the choices.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "keep" => Ok(Self::Keep),
            "drop" => Ok(Self::Drop),
            other => Err(serde::de::Error::custom(format!(
                "sink.schema.evolution.drop.columns = {other:?}: must be \"keep\" (the default) or \"drop\""
            ))),
        }
    }
}

/// `[sink] kind = "postgres"` (see `examples/sink-postgres.toml`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// `url`: the warehouse, `postgres://user@host:port/db` or `host=... dbname=...`;
    /// may be a `${env:NAME}` / `${file:/path}` reference.
    pub url: Secret,
    /// `password`: overrides the URL's password; may be a reference. Never logged.
    #[serde(default)]
    pub password: Option<Secret>,
    /// `sslmode`: `disable`, `prefer` (default, as capture's and libpq's), `require`, `verify-ca`, `verify-full`.
    #[serde(default = "default_sslmode")]
    pub sslmode: SslMode,
    /// `sslrootcert`: PEM file of the CAs to trust (needed by `verify-ca` and `verify-full`).
    #[serde(default)]
    pub sslrootcert: Option<String>,
    /// `sslcert`: client certificate (PEM) presented when the server asks for one.
    #[serde(default)]
    pub sslcert: Option<String>,
    /// `sslkey`: the client certificate's key file (PEM); the path may be a reference.
    #[serde(default)]
    pub sslkey: Option<Secret>,
    /// `pool.max.size`: pooled connections (each partition worker uses one per batch).
    #[serde(rename = "pool.max.size", default = "default_pool_max_size")]
    pub pool_max_size: usize,
    /// `connect.timeout.ms`: bound on opening one connection.
    #[serde(rename = "connect.timeout.ms", default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// `target.schema`: the warehouse schema holding target, history and positions tables.
    #[serde(rename = "target.schema", default = "default_target_schema")]
    pub target_schema: String,
    /// `table.name.format`: target table name; `${topic}`, `${schema}`, `${table}` are
    /// replaced by the record's topic (dots become `_`) and source schema/table.
    #[serde(rename = "table.name.format", default = "default_table_name_format")]
    pub table_name_format: String,
    /// `upsert.enabled`: mirror each source table (default true).
    #[serde(rename = "upsert.enabled", default = "yes")]
    pub upsert_enabled: bool,
    /// `history.enabled`: append every change to a history table (default false).
    #[serde(rename = "history.enabled", default)]
    pub history_enabled: bool,
    /// `history.table.name.format`: history table name, same placeholders.
    #[serde(
        rename = "history.table.name.format",
        default = "default_history_table_name_format"
    )]
    pub history_table_name_format: String,
    /// `positions.table`: where consumer positions are stored with the data.
    #[serde(rename = "positions.table", default = "default_positions_table")]
    pub positions_table: String,
    /// `delete.mode`: `tombstone` (default) or `hard`.
    #[serde(rename = "delete.mode", default)]
    pub delete_mode: DeleteMode,
    /// `truncate.mode`: `delete` (default), `truncate` or `ignore`.
    #[serde(rename = "truncate.mode", default)]
    pub truncate_mode: TruncateMode,
    /// `meta.column.prefix`: prefix of the sink's own columns (`<prefix>lsn`,
    /// `<prefix>seq`, `<prefix>deleted`, `<prefix>unavailable`); change it
    /// when a source column already has one of those names.
    #[serde(rename = "meta.column.prefix", default = "default_meta_column_prefix")]
    pub meta_column_prefix: String,
    /// `schema.evolution.drop.columns`: `keep` (default) or `drop`.
    #[serde(rename = "schema.evolution.drop.columns", default)]
    pub drop_columns: DropColumns,
    /// `fields.include`: the only columns stored, with the key fields
    /// ([`crate::fields`]); not with `fields.exclude`.
    #[serde(rename = "fields.include", default)]
    pub fields_include: Vec<String>,
    /// `fields.exclude`: columns never stored; key fields may not be listed
    /// ([`crate::fields`]).
    #[serde(rename = "fields.exclude", default)]
    pub fields_exclude: Vec<String>,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &"***")
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("target_schema", &self.target_schema)
            .field("table_name_format", &self.table_name_format)
            .field("upsert_enabled", &self.upsert_enabled)
            .field("history_enabled", &self.history_enabled)
            .field("delete_mode", &self.delete_mode)
            .field("truncate_mode", &self.truncate_mode)
            .field("drop_columns", &self.drop_columns)
            .finish_non_exhaustive()
    }
}

fn yes() -> bool {
    true
}
fn default_sslmode() -> SslMode {
    oncely_core::postgres::DEFAULT_SSLMODE
}
fn default_pool_max_size() -> usize {
    DEFAULT_POOL_MAX_SIZE
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_target_schema() -> String {
    DEFAULT_TARGET_SCHEMA.to_owned()
}
fn default_table_name_format() -> String {
    DEFAULT_TABLE_NAME_FORMAT.to_owned()
}
fn default_history_table_name_format() -> String {
    DEFAULT_HISTORY_TABLE_NAME_FORMAT.to_owned()
}
fn default_meta_column_prefix() -> String {
    DEFAULT_META_COLUMN_PREFIX.to_owned()
}

fn default_positions_table() -> String {
    DEFAULT_POSITIONS_TABLE.to_owned()
}

impl PostgresConfig {
    /// A configuration with every default, writing to `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: Secret::new(url),
            password: None,
            sslmode: default_sslmode(),
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            pool_max_size: DEFAULT_POOL_MAX_SIZE,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            target_schema: default_target_schema(),
            table_name_format: default_table_name_format(),
            upsert_enabled: true,
            history_enabled: false,
            history_table_name_format: default_history_table_name_format(),
            positions_table: default_positions_table(),
            delete_mode: DeleteMode::Tombstone,
            truncate_mode: TruncateMode::Delete,
            meta_column_prefix: default_meta_column_prefix(),
            drop_columns: DropColumns::Keep,
            fields_include: Vec::new(),
            fields_exclude: Vec::new(),
        }
    }

    /// The TLS settings of the warehouse connections (the key file's
    /// reference was resolved when the configuration was read).
    pub fn tls(&self) -> oncely_core::postgres::PgTls {
        oncely_core::postgres::PgTls {
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.as_ref().map(Into::into),
            sslcert: self.sslcert.as_ref().map(Into::into),
            sslkey: self.sslkey.as_ref().map(|k| k.expose().into()),
            keys: "sink",
        }
    }

    /// Checks the values (secrets were resolved when the configuration was read); errors name `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.url.expose().trim().is_empty() {
            return Err(ConfigError::new("sink.url", "must not be empty"));
        }
        if self.url.expose().contains("sslmode") {
            return Err(ConfigError::new(
                "sink.url",
                "set TLS with the sink's `sslmode` (and `sslrootcert`), not in the URL",
            ));
        }
        self.tls().check()?;
        if !(1..=256).contains(&self.pool_max_size) {
            return Err(ConfigError::new("sink.pool.max.size", "must be 1..=256"));
        }
        if self.connect_timeout_ms == 0 {
            return Err(ConfigError::new("sink.connect.timeout.ms", "must be > 0"));
        }
        if !self.upsert_enabled && !self.history_enabled {
            return Err(ConfigError::new(
                "sink.upsert.enabled",
                "with `history.enabled = false` nothing would be written; enable one",
            ));
        }
        identifier("sink.target.schema", &self.target_schema)?;
        // The longest of the sink's column names must fit an identifier.
        if self.meta_column_prefix.is_empty()
            || self.meta_column_prefix.len() + "unavailable".len() > MAX_IDENTIFIER_BYTES
        {
            return Err(ConfigError::new(
                "sink.meta.column.prefix",
                format!(
                    "must be 1..={} bytes",
                    MAX_IDENTIFIER_BYTES - "unavailable".len()
                ),
            ));
        }
        identifier("sink.positions.table", &self.positions_table)?;
        name_format("sink.table.name.format", &self.table_name_format)?;
        name_format(
            "sink.history.table.name.format",
            &self.history_table_name_format,
        )?;
        if self.upsert_enabled
            && self.history_enabled
            && self.table_name_format == self.history_table_name_format
        {
            return Err(ConfigError::new(
                "sink.history.table.name.format",
                "must differ from `table.name.format`",
            ));
        }
        Ok(())
    }
}

fn identifier(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_IDENTIFIER_BYTES {
        return Err(ConfigError::new(
            field,
            format!("must be 1..={MAX_IDENTIFIER_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn name_format(field: &str, format: &str) -> Result<(), ConfigError> {
    if format.trim().is_empty() {
        return Err(ConfigError::new(field, "must not be empty"));
    }
    let rest = ["${topic}", "${schema}", "${table}"]
        .iter()
        .fold(format.to_owned(), |s, p| s.replace(p, ""));
    if rest.contains("${") {
        return Err(ConfigError::new(
            field,
            "unknown placeholder; known: ${topic}, ${schema}, ${table}",
        ));
    }
    if !format.contains("${table}") && !format.contains("${topic}") {
        return Err(ConfigError::new(
            field,
            "must contain ${table} or ${topic}, or every source table would share one target",
        ));
    }
    Ok(())
}

/// Expands a name format for one record; `None` when the name would exceed PostgreSQL's limit.
pub fn expand_name(format: &str, topic: &str, schema: &str, table: &str) -> Option<String> {
    let name = format
        .replace("${topic}", &topic.replace(['.', '-'], "_"))
        .replace("${schema}", schema)
        .replace("${table}", table);
    (name.len() <= MAX_IDENTIFIER_BYTES).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        let mut c = PostgresConfig::new("postgres://x@h/db");
        assert!(c.validate().is_ok());
        c.sslmode = SslMode::VerifyCa;
        assert_eq!(c.validate().expect_err("tls").key, "sink.sslrootcert");
        c.sslrootcert = Some("/ca.pem".into());
        assert!(c.validate().is_ok());
        c.sslmode = SslMode::Disable;
        c.sslrootcert = None;
        c.table_name_format = "${nope}_${table}".into();
        assert_eq!(c.validate().expect_err("fmt").key, "sink.table.name.format");
        c.table_name_format = "fixed".into();
        assert_eq!(
            c.validate().expect_err("fixed").key,
            "sink.table.name.format"
        );
        c.table_name_format = DEFAULT_TABLE_NAME_FORMAT.into();
        c.upsert_enabled = false;
        assert_eq!(c.validate().expect_err("none").key, "sink.upsert.enabled");
    }

    #[test]
    fn a_sink_toml_with_bare_dotted_keys_parses() {
        std::env::set_var("ONCELY_SINKS_TEST_WAREHOUSE_URL", "postgres://w/db");
        let text = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n\
                    [sink]\nkind = \"postgres\"\nurl = \"${env:ONCELY_SINKS_TEST_WAREHOUSE_URL}\"\n\
                    history.enabled = true\n\"delete.mode\" = \"hard\"\ntruncate.mode = \"ignore\"\n";
        let (_, sink) = crate::kinds::parse_config(text).expect("valid");
        let crate::kinds::SinkConfig::Postgres(c) = sink else {
            panic!("not postgres");
        };
        assert!(c.history_enabled && c.upsert_enabled);
        assert_eq!(c.url.expose(), "postgres://w/db", "resolved when read");
        assert_eq!(c.delete_mode, DeleteMode::Hard);
        assert_eq!(c.truncate_mode, TruncateMode::Ignore);
        assert_eq!(c.drop_columns, DropColumns::Keep, "the default");
        let (_, sink) = crate::kinds::parse_config(&format!(
            "{text}schema.evolution.drop.columns = \"drop\"\n"
        ))
        .expect("drop");
        let crate::kinds::SinkConfig::Postgres(c) = sink else {
            panic!("not postgres");
        };
        assert_eq!(c.drop_columns, DropColumns::Drop);
        let e = crate::kinds::parse_config(&format!(
            "{text}schema.evolution.drop.columns = \"delete\"\n"
        ))
        .expect_err("unknown value");
        assert!(
            e.to_string().contains("schema.evolution.drop.columns"),
            "{e}"
        );
        let e = crate::kinds::parse_config(&text.replace("history.enabled", "history.enabeld"))
            .expect_err("typo");
        assert!(e.message.contains("history.enabeld"), "{e}");
    }

    #[test]
    fn the_annotated_example_is_valid() {
        let text = include_str!("../../../../examples/sink-postgres.toml");
        // Its `${env:..}` reference is resolved when read (left alone when set).
        if std::env::var_os("ONCELY_WAREHOUSE_URL").is_none() {
            std::env::set_var("ONCELY_WAREHOUSE_URL", "postgres://warehouse/w");
        }
        let (_, sink) = crate::kinds::parse_config(text).expect("examples/sink-postgres.toml");
        assert!(matches!(sink, crate::kinds::SinkConfig::Postgres(_)));
    }

    #[test]
    fn the_url_never_prints() {
        let c = PostgresConfig::new("postgres://u:pw@h/db");
        assert!(!format!("{c:?}").contains("pw"));
    }

    #[test]
    fn names_expand() {
        assert_eq!(
            expand_name("${schema}_${table}", "p.public.t", "public", "t").as_deref(),
            Some("public_t")
        );
        assert_eq!(
            expand_name("${topic}", "p.public.t", "public", "t").as_deref(),
            Some("p_public_t")
        );
        assert_eq!(expand_name("${table}", "x", "s", &"a".repeat(64)), None);
    }
}
