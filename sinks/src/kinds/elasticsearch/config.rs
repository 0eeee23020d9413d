//! `[sink] kind = "elasticsearch"`: keys, defaults and checks.
//!
//! Keys are dotted like Kafka Connect's; inside `[sink]` they may be written
//! bare (`bulk.max.actions = 500`) or quoted (`"bulk.max.actions" = 500`).
//! Secrets (`password`, `api.key`) accept `${env:NAME}` and `${file:PATH}`
//! and are never logged.

use std::path::PathBuf;
use std::time::Duration;

use oncely_core::config::in_range;
use serde::Deserialize;

use super::version::{MAX_SEQ_BITS, MIN_SEQ_BITS};
use crate::error::ConfigError;
use crate::native::ValueFormat;
use oncely_core::Secret;

/// Default `url`.
pub const DEFAULT_URL: &str = "http://127.0.0.1:9200";
/// Default `index.pattern`: one index per topic, i.e. per captured table.
pub const DEFAULT_INDEX_PATTERN: &str = "{topic}";
/// Default `bulk.max.actions`: documents per bulk request.
pub const DEFAULT_BULK_MAX_ACTIONS: usize = 1000;
/// Default `bulk.max.bytes`: bytes of NDJSON per bulk request (a larger single document goes alone).
pub const DEFAULT_BULK_MAX_BYTES: usize = 5 * 1024 * 1024;
/// Default `request.timeout.ms`.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Default `soft.delete.field`.
pub const DEFAULT_SOFT_DELETE_FIELD: &str = "__deleted";
/// Default `version.field`: the `long` field documents written by earlier
/// sink versions carry their packed version in (read by truncates; no
/// longer written).
pub const DEFAULT_VERSION_FIELD: &str = "__oncely_version";
/// Default `version.lsn.field`: the document field holding the LSN of its
/// version (see [`super::version`]).
pub const DEFAULT_VERSION_LSN_FIELD: &str = "__oncely_lsn";
/// Default `version.seq.field`: the document field holding the event ordinal
/// of its version.
pub const DEFAULT_VERSION_SEQ_FIELD: &str = "__oncely_seq";
/// Default `version.seq.bits` (see [`super::version`]).
pub const DEFAULT_SEQ_BITS: u32 = 20;
/// Default `template.name`.
pub const DEFAULT_TEMPLATE_NAME: &str = "oncely";
/// Placeholders `index.pattern` may use.
pub const INDEX_PLACEHOLDERS: &[&str] = &["{topic}", "{db}", "{schema}", "{table}"];

/// What a source delete does to the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeleteMode {
    /// A versioned delete: Elasticsearch keeps its tombstone for `index.gc_deletes` only.
    #[default]
    Delete,
    /// The document stays, with `soft.delete.field = true`: safe to replay from any point.
    Soft,
}

/// `json.handling.mode`: how a `json`/`jsonb` column is written and mapped
/// under `value.format = "native"` (see [`super::mapping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JsonMode {
    /// The JSON value, mapped `flattened`: every leaf searchable as a
    /// keyword (`column.path.to.leaf`), whatever its type in other rows.
    /// Holds objects (and arrays of them) only.
    Flattened,
    /// The JSON value, mapped `object`: sub-fields mapped dynamically
    /// (numbers as numbers); a leaf whose type differs from the first
    /// row's is refused. Holds objects (and arrays of them) only.
    Object,
    /// The JSON text as a string (the wire form), mapped as text: holds
    /// every JSON value, scalars and arrays of scalars included. The
    /// default: a `jsonb` column of tags (`["a", "b"]`) is common, and
    /// neither `flattened` nor `object` can hold it (each such row would be
    /// a dead letter); it is also what Debezium users' sinks index.
    #[default]
    Text,
}

impl JsonMode {
    /// The setting's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            JsonMode::Flattened => "flattened",
            JsonMode::Object => "object",
            JsonMode::Text => "text",
        }
    }
}

/// When written documents become searchable (`refresh`, Elasticsearch's bulk
/// `refresh` parameter): `false`, `true` (booleans or strings) or `"wait_for"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefreshPolicy {
    /// At the index's next periodic refresh (`index.refresh_interval`, 1 s by
    /// default); documents are readable by id at once. The cheapest.
    #[default]
    False,
    /// Each bulk request refreshes the shards it wrote: searchable as soon as
    /// the batch is applied, at the cost of one refresh per bulk request.
    True,
    /// Each bulk request waits for the next periodic refresh, so a committed
    /// position means searchable documents; adds up to `refresh_interval` per batch.
    WaitFor,
}

impl<'de> Deserialize<'de> for RefreshPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Flag(bool),
            Word(String),
        }
        match Written::deserialize(d)? {
            Written::Flag(false) => Ok(Self::False),
            Written::Flag(true) => Ok(Self::True),
            Written::Word(w) => match w.as_str() {
                "false" => Ok(Self::False),
                "true" => Ok(Self::True),
                "wait_for" => Ok(Self::WaitFor),
                other => Err(serde::de::Error::custom(format!(
                    "refresh = \"{other}\": expected false, true or \"wait_for\""
                ))),
            },
        }
    }
}

/// `[sink] kind = "elasticsearch"` (see the module docs of [`super`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticsearchConfig {
    /// `url`: the node, e.g. `https://es.example:9200`.
    #[serde(default = "default_url")]
    pub url: String,
    /// `index.pattern`: index name from `{topic}`, `{db}`, `{schema}`, `{table}`; lower-cased.
    #[serde(rename = "index.pattern", default = "default_pattern")]
    pub index_pattern: String,
    /// `bulk.max.actions`: documents per bulk request.
    #[serde(rename = "bulk.max.actions", default = "default_actions")]
    pub bulk_max_actions: usize,
    /// `bulk.max.bytes`: NDJSON bytes per bulk request.
    #[serde(rename = "bulk.max.bytes", default = "default_bytes")]
    pub bulk_max_bytes: usize,
    /// `request.timeout.ms`: per HTTP request.
    #[serde(rename = "request.timeout.ms", default = "default_timeout")]
    pub request_timeout_ms: u64,
    /// `delete.mode`: `delete` (default) or `soft`.
    #[serde(rename = "delete.mode", default)]
    pub delete_mode: DeleteMode,
    /// `refresh`: `false` (default), `true` or `wait_for`.
    #[serde(default)]
    pub refresh: RefreshPolicy,
    /// `soft.delete.field`: the flag written in `soft` mode (`false` on live documents).
    #[serde(rename = "soft.delete.field", default = "default_soft_field")]
    pub soft_delete_field: String,
    /// `version.seq.bits`: the ordinal bits of the old packing
    /// `lsn << bits | seq` that the external versions of LSNs below
    /// 2^(62 - bits) still follow (see [`super::version`]); must stay what
    /// the index was written with.
    #[serde(rename = "version.seq.bits", default = "default_seq_bits")]
    pub seq_bits: u32,
    /// `version.field`: the `long` field documents written by earlier sink
    /// versions carry their packed version in; read by truncates, no longer
    /// written. Empty: no such documents are told apart.
    #[serde(rename = "version.field", default = "default_version_field")]
    pub version_field: String,
    /// `version.lsn.field`: the `long` field every document carries the LSN
    /// of its version in (top bit flipped, see [`super::version::flip`]).
    #[serde(rename = "version.lsn.field", default = "default_version_lsn_field")]
    pub version_lsn_field: String,
    /// `version.seq.field`: the `long` field every document carries the
    /// event ordinal of its version in (top bit flipped).
    #[serde(rename = "version.seq.field", default = "default_version_seq_field")]
    pub version_seq_field: String,
    /// `template.file`: a JSON composable index template body, installed at start.
    #[serde(rename = "template.file", default)]
    pub template_file: Option<PathBuf>,
    /// `template.name`: the name it is installed under.
    #[serde(rename = "template.name", default = "default_template_name")]
    pub template_name: String,
    /// `username`: basic authentication (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// `password`: basic authentication.
    #[serde(default)]
    pub password: Option<Secret>,
    /// `api.key`: the base64 `id:key` API key (the `encoded` value Elasticsearch returns).
    #[serde(rename = "api.key", default)]
    pub api_key: Option<Secret>,
    /// `tls.ca.file`: PEM CA certificate(s) to trust for `https://` URLs.
    #[serde(rename = "tls.ca.file", default)]
    pub tls_ca_file: Option<PathBuf>,
    /// `tls.verify`: verify the server certificate (default true; false only for diagnosis).
    #[serde(rename = "tls.verify", default = "yes")]
    pub tls_verify: bool,
    /// `value.format`: `native` (default: dates as ISO-8601 text, JSON as
    /// JSON, typed mappings) or `wire` (values as capture writes them).
    #[serde(rename = "value.format", default)]
    pub value_format: ValueFormat,
    /// `json.handling.mode`: `text` (default), `flattened` or `object`.
    #[serde(rename = "json.handling.mode", default)]
    pub json_mode: JsonMode,
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
fn default_pattern() -> String {
    DEFAULT_INDEX_PATTERN.into()
}
fn default_actions() -> usize {
    DEFAULT_BULK_MAX_ACTIONS
}
fn default_bytes() -> usize {
    DEFAULT_BULK_MAX_BYTES
}
fn default_timeout() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}
fn default_soft_field() -> String {
    DEFAULT_SOFT_DELETE_FIELD.into()
}
fn default_seq_bits() -> u32 {
    DEFAULT_SEQ_BITS
}
fn default_version_field() -> String {
    DEFAULT_VERSION_FIELD.into()
}
fn default_version_lsn_field() -> String {
    DEFAULT_VERSION_LSN_FIELD.into()
}
fn default_version_seq_field() -> String {
    DEFAULT_VERSION_SEQ_FIELD.into()
}
fn default_template_name() -> String {
    DEFAULT_TEMPLATE_NAME.into()
}
fn yes() -> bool {
    true
}

impl ElasticsearchConfig {
    /// The version fields of documents (the ones the sink writes and the one
    /// earlier versions wrote), which no column may be named like and readers
    /// of rows leave out.
    pub fn bookkeeping_fields(&self) -> impl Iterator<Item = &str> {
        [
            self.version_field.as_str(),
            self.version_lsn_field.as_str(),
            self.version_seq_field.as_str(),
        ]
        .into_iter()
        .filter(|f| !f.is_empty())
    }

    /// Checks the values; errors name `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError::new(
                "sink.url",
                "must start with http:// or https://",
            ));
        }
        if self.index_pattern.trim().is_empty() {
            return Err(ConfigError::new("sink.index.pattern", "must not be empty"));
        }
        let mut rest = self.index_pattern.clone();
        for p in INDEX_PLACEHOLDERS {
            rest = rest.replace(p, "");
        }
        if rest.contains(['{', '}']) {
            return Err(ConfigError::new(
                "sink.index.pattern",
                format!(
                    "unknown placeholder; known: {}",
                    INDEX_PLACEHOLDERS.join(", ")
                ),
            ));
        }
        if self.bulk_max_actions == 0 {
            return Err(ConfigError::new(
                "sink.bulk.max.actions",
                "must be at least 1",
            ));
        }
        if self.bulk_max_bytes < 1024 {
            return Err(ConfigError::new(
                "sink.bulk.max.bytes",
                "must be at least 1024",
            ));
        }
        if self.request_timeout_ms == 0 {
            return Err(ConfigError::new(
                "sink.request.timeout.ms",
                "must be at least 1",
            ));
        }
        in_range(
            "sink.version.seq.bits",
            self.seq_bits,
            MIN_SEQ_BITS,
            MAX_SEQ_BITS,
        )?;
        if self.delete_mode == DeleteMode::Soft && self.soft_delete_field.trim().is_empty() {
            return Err(ConfigError::new(
                "sink.soft.delete.field",
                "must not be empty",
            ));
        }
        // Empty: documents without the field and truncates dead-lettered, as
        // before the field existed (for indexes whose strict mapping lacks it).
        let field = self.version_field.as_str();
        if field.trim() != field || (field.starts_with('_') && !field.starts_with("__")) {
            return Err(ConfigError::new(
                "sink.version.field",
                "must be a field name (no surrounding spaces; one leading `_` is reserved for \
                 Elasticsearch's metadata fields), or empty",
            ));
        }
        for (key, field) in [
            ("sink.version.lsn.field", &self.version_lsn_field),
            ("sink.version.seq.field", &self.version_seq_field),
        ] {
            if field.trim().is_empty()
                || field.trim() != field
                || (field.starts_with('_') && !field.starts_with("__"))
            {
                return Err(ConfigError::new(
                    key,
                    "must be a field name (every document carries its version there; no \
                     surrounding spaces; one leading `_` is reserved for Elasticsearch's \
                     metadata fields)",
                ));
            }
        }
        let mut fields = self.bookkeeping_fields().collect::<Vec<_>>();
        if self.delete_mode == DeleteMode::Soft {
            fields.push(&self.soft_delete_field);
        }
        if (1..fields.len()).any(|i| fields[..i].contains(&fields[i])) {
            return Err(ConfigError::new(
                "sink.version.lsn.field",
                "`version.field`, `version.lsn.field`, `version.seq.field` and (soft deletes) \
                 `soft.delete.field` must differ",
            ));
        }
        if self.template_name.trim().is_empty() {
            return Err(ConfigError::new("sink.template.name", "must not be empty"));
        }
        if self.password.is_some() != self.username.is_some() {
            let key = if self.username.is_some() {
                "sink.password"
            } else {
                "sink.username"
            };
            return Err(ConfigError::new(key, "username and password go together"));
        }
        if self.api_key.is_some() && self.username.is_some() {
            return Err(ConfigError::new(
                "sink.api.key",
                "set either api.key or username/password, not both",
            ));
        }
        Ok(())
    }

    /// `request.timeout.ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ElasticsearchConfig, String> {
        let c: ElasticsearchConfig =
            oncely_core::config::from_str(text, "sink").map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn defaults_and_dotted_keys_bare_or_quoted() {
        let c = parse("").expect("defaults");
        assert_eq!(c.url, DEFAULT_URL);
        assert_eq!(c.bulk_max_actions, DEFAULT_BULK_MAX_ACTIONS);
        assert_eq!(c.seq_bits, DEFAULT_SEQ_BITS);
        assert_eq!(c.delete_mode, DeleteMode::Delete);
        let c = parse("bulk.max.actions = 7\n\"bulk.max.bytes\" = 4096\ndelete.mode = \"soft\"\n")
            .expect("dotted");
        assert_eq!((c.bulk_max_actions, c.bulk_max_bytes), (7, 4096));
        assert_eq!(c.delete_mode, DeleteMode::Soft);
        assert_eq!(c.refresh, RefreshPolicy::False);
        let c = parse("refresh = \"wait_for\"\n").expect("refresh");
        assert_eq!(c.refresh, RefreshPolicy::WaitFor);
        let c = parse("refresh = true\n").expect("refresh flag");
        assert_eq!(c.refresh, RefreshPolicy::True);
        let e = parse("refresh = \"now\"\n").expect_err("bad refresh");
        assert!(e.contains("wait_for"), "{e}");
        assert_eq!(c.value_format, ValueFormat::Native);
        assert_eq!(c.json_mode, JsonMode::Text);
        let c = parse("value.format = \"wire\"\njson.handling.mode = \"flattened\"\n")
            .expect("formats");
        assert_eq!(
            (c.value_format, c.json_mode),
            (ValueFormat::Wire, JsonMode::Flattened)
        );
        let e = parse("value.format = \"raw\"\n").expect_err("bad format");
        assert!(e.contains("native") && e.contains("wire"), "{e}");
        let e = parse("json.handling.mode = \"nested\"\n").expect_err("bad json mode");
        assert!(e.contains("flattened"), "{e}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = parse("bulk.max.actoins = 1\n").expect_err("typo");
        assert!(e.contains("bulk.max.actoins"), "{e}");
        let e = parse("url = \"es:9200\"\n").expect_err("url");
        assert!(e.contains("sink.url"), "{e}");
        let e = parse("index.pattern = \"{tabel}\"\n").expect_err("pattern");
        assert!(e.contains("sink.index.pattern"), "{e}");
        let e = parse("version.seq.bits = 40\n").expect_err("bits");
        assert!(e.contains("sink.version.seq.bits"), "{e}");
        let e = parse("username = \"u\"\n").expect_err("password");
        assert!(e.contains("sink.password"), "{e}");
        let e = parse("version.lsn.field = \"\"\n").expect_err("no lsn field");
        assert!(e.contains("sink.version.lsn.field"), "{e}");
        let e = parse("version.seq.field = \"_seq\"\n").expect_err("metadata name");
        assert!(e.contains("sink.version.seq.field"), "{e}");
        let e = parse("version.seq.field = \"__oncely_lsn\"\n").expect_err("same field");
        assert!(e.contains("must differ"), "{e}");
        let e = parse("delete.mode = \"soft\"\nsoft.delete.field = \"__oncely_seq\"\n")
            .expect_err("flag on a version field");
        assert!(e.contains("must differ"), "{e}");
        // Empty: no documents of the old packing are told apart.
        let c = parse("version.field = \"\"\n").expect("no old field");
        let fields: Vec<&str> = c.bookkeeping_fields().collect();
        assert_eq!(fields, ["__oncely_lsn", "__oncely_seq"]);
    }

    #[test]
    fn the_annotated_example_is_valid() {
        let text = include_str!("../../../../examples/sink-elasticsearch.toml");
        let (_, sink) = crate::kinds::parse_config(text).expect("example is valid");
        let crate::kinds::SinkConfig::Elasticsearch(c) = sink else {
            panic!("not an elasticsearch config");
        };
        assert_eq!(c.index_pattern, "{topic}");
        assert_eq!(c.bulk_max_bytes, 5_242_880);
    }

    #[test]
    fn secrets_never_print() {
        let c = parse("username = \"u\"\npassword = \"hunter2\"\n").expect("basic");
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
