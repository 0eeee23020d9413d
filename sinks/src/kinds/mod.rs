//! Sinks selectable by name in a configuration file's `[sink]` table.
//!
//! ```toml
//! [sink]
//! kind = "file"          # which sink; the other keys belong to it
//! path = "/tmp/out.jsonl"
//! ```
//!
//! Adding a sink is one module folder — its config struct (serde,
//! `deny_unknown_fields`, a `validate()`), its [`Sink`] and its
//! [`SinkKind`] implementation — plus one line in the `registry!` below,
//! which makes the `kind` name, the [`SinkConfig`] variant and the list of
//! known kinds the CLI names. The runner, batching, retries, dead letters and
//! metrics are shared and need no change.

pub mod elasticsearch;
pub mod file;
pub mod http;
pub mod journal;
mod json;
pub mod postgres;
pub mod redis;

use std::sync::Arc;

use async_trait::async_trait;

use oncely_core::config::{flatten, from_flat, Leaves};

use crate::config::{parse_runner_config, RunnerConfig};
use crate::error::{ConfigError, SinkError};
use crate::fields::FieldSelection;
use crate::sink::Sink;
use crate::verify_reader::{VerifyContext, VerifyReadError, VerifyReader};

/// What a sink's configuration does once `[sink] kind = "..."` selected it.
/// Implemented by each sink's config struct, in the sink's own folder.
#[async_trait]
pub trait SinkKind: Send + Sync {
    /// Checks the values; errors name the key as `sink.<key>`.
    fn validate(&self) -> Result<(), ConfigError>;

    /// Builds the sink (opens files, connects to the target).
    async fn build(&self) -> Result<Arc<dyn Sink>, SinkError>;

    /// Which columns the sink stores (`fields.include` / `fields.exclude`,
    /// [`crate::fields`]); `None`: every column, or a kind without the keys.
    fn field_selection(&self) -> Result<Option<FieldSelection>, ConfigError> {
        Ok(None)
    }

    /// Whether the runner puts a dedup window in front of the sink when
    /// `[dedup]` is not set: a sink that cannot compare versions (a webhook).
    fn wants_dedup_window(&self) -> bool {
        false
    }

    /// The reader `oncely verify` compares the source with, in the sink's
    /// folder beside its writer; `None`: verify cannot read this kind.
    async fn verify_reader(
        &self,
        _ctx: &VerifyContext<'_>,
    ) -> Option<Result<Box<dyn VerifyReader>, VerifyReadError>> {
        None
    }
}

/// The registry: each line is `kind name => Variant(config type)`. It makes
/// the [`SinkConfig`] enum (read by `SinkConfig::from_flat`), [`KINDS`] and
/// [`SinkConfig::kind`], so the list of known kinds cannot drift from the sinks.
macro_rules! registry {
    ($($(#[$doc:meta])* $name:literal => $variant:ident($config:ty),)+) => {
        /// The `[sink]` table: `kind` selects the variant.
        #[derive(Debug, Clone)]
        pub enum SinkConfig {
            $($(#[$doc])* $variant($config),)+
        }

        /// Every `kind` a `[sink]` table may name, in registry order.
        pub const KINDS: &[&str] = &[$($name),+];

        impl SinkConfig {
            /// The `kind` this configuration was selected by.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)+
                }
            }

            /// The selected sink's configuration, as its [`SinkKind`].
            pub fn spec(&self) -> &dyn SinkKind {
                match self {
                    $(Self::$variant(c) => c,)+
                }
            }

            /// The configuration of sink `kind` from its flattened keys
            /// (without `kind`), deserialized as that kind's own struct, so
            /// an error says which key (serde's tagged enum would not).
            fn from_flat(kind: &str, flat: toml::Table) -> Result<Self, ConfigError> {
                match kind {
                    $($name => from_flat::<$config>(flat, "sink").map(Self::$variant),)+
                    other => Err(ConfigError::new(
                        "sink.kind",
                        format!("unknown kind `{other}` (known kinds: {})", KINDS.join(", ")),
                    )),
                }
            }
        }
    };
}

registry! {
    /// JSON lines appended to a file, one per record; Kafka holds the positions.
    "file" => File(file::FileConfig),
    /// JSON lines on standard output, one per record; Kafka holds the positions.
    "stdout" => Stdout(file::StdoutConfig),
    /// A file holding each batch and its position in one fsynced append: owns its positions.
    "journal" => Journal(journal::JournalConfig),
    /// One Elasticsearch index per table, versioned bulk writes; Kafka holds the positions.
    "elasticsearch" => Elasticsearch(elasticsearch::ElasticsearchConfig),
    /// A PostgreSQL warehouse: one table per source table, versioned upserts, positions in the same transaction.
    "postgres" => Postgres(postgres::PostgresConfig),
    /// A Redis cache of the current row per key: versioned writes and positions in one Lua script call.
    "redis" => Redis(redis::RedisConfig),
    /// Webhooks: each change POSTed as JSON with an `Idempotency-Key`; Kafka holds the positions.
    "http" => Http(http::HttpConfig),
}

impl SinkConfig {
    /// Checks the sink's values; errors name the key as `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.spec().validate()?;
        self.spec().field_selection().map(drop)
    }

    /// Builds the configured sink (opens files, connects to the target),
    /// behind its field selection, so no write path of it sees a column
    /// left out.
    pub async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        let selection = self
            .spec()
            .field_selection()
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        Ok(crate::fields::select(self.spec().build().await?, selection))
    }

    /// Which columns the sink stores ([`SinkKind::field_selection`]).
    pub fn field_selection(&self) -> Result<Option<FieldSelection>, ConfigError> {
        self.spec().field_selection()
    }
}

/// Parses a whole `sink.toml`: the runner's keys and the `[sink]` table, both validated.
pub fn parse_config(text: &str) -> Result<(RunnerConfig, SinkConfig), ConfigError> {
    let (mut runner, sink) = parse_runner_config(text)?;
    runner.validate()?;
    let sink =
        sink.ok_or_else(|| ConfigError::new("sink", "missing [sink] table (with `kind = ...`)"))?;
    let mut flat = flatten(sink, Leaves::Typed)?;
    let kind = match flat.remove("kind") {
        Some(toml::Value::String(kind)) => kind,
        Some(_) => return Err(ConfigError::new("sink.kind", "must be a string")),
        None => {
            return Err(ConfigError::new(
                "sink.kind",
                format!("missing (known kinds: {})", KINDS.join(", ")),
            ))
        }
    };
    let sink = SinkConfig::from_flat(&kind, flat)?;
    sink.validate()?;
    // A webhook cannot compare versions: a dedup window in front of it unless `[dedup]` says otherwise.
    if sink.spec().wants_dedup_window() && runner.dedup.is_none() {
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
    fn every_row_storing_kind_takes_one_field_list() {
        let tables = [
            "kind = \"postgres\"\nurl = \"postgres://x@h/db\"\n",
            "kind = \"elasticsearch\"\n",
            "kind = \"redis\"\n",
            "kind = \"http\"\nurl = \"http://h/x\"\n",
        ];
        for table in tables {
            let (_, s) = parse_config(&format!(
                "{HEAD}[sink]\n{table}fields.exclude = [\"ssn\", \"public.users.email\"]\n"
            ))
            .expect(table);
            let fields = s.field_selection().expect("valid").expect("set");
            assert_eq!(fields.mode(), crate::fields::Mode::Exclude, "{table}");
            assert!(!fields.keeps("public", "users", "email", false), "{table}");
            assert!(fields.keeps("public", "orders", "email", false), "{table}");
            let (_, s) = parse_config(&format!(
                "{HEAD}[sink]\n{table}fields.include = [\"name\"]\n"
            ))
            .expect(table);
            assert_eq!(
                s.field_selection().expect("valid").map(|f| f.mode()),
                Some(crate::fields::Mode::Include)
            );
            let e = parse_config(&format!(
                "{HEAD}[sink]\n{table}fields.include = [\"a\"]\nfields.exclude = [\"b\"]\n"
            ))
            .expect_err("both lists");
            assert_eq!(e.key, "sink.fields.include", "{table}: {e}");
            let e = parse_config(&format!(
                "{HEAD}[sink]\n{table}fields.exclude = [\"users.email\"]\n"
            ))
            .expect_err("a half-qualified name");
            assert_eq!(e.key, "sink.fields.exclude", "{table}: {e}");
            let (_, s) = parse_config(&format!("{HEAD}[sink]\n{table}")).expect(table);
            assert_eq!(s.field_selection().expect("valid"), None);
        }
        // Kinds that store no rows take no list.
        let e = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"file\"\npath = \"/x\"\nfields.exclude = [\"a\"]\n"
        ))
        .expect_err("file");
        assert!(e.message.contains("fields.exclude"), "{e}");
    }

    #[test]
    fn the_warehouse_defaults_to_capture_s_sslmode() {
        let (_, s) = parse_config(&format!(
            "{HEAD}[sink]\nkind = \"postgres\"\nurl = \"postgres://x@h/db\"\n"
        ))
        .expect("postgres");
        let SinkConfig::Postgres(c) = s else {
            panic!("not the warehouse: {s:?}")
        };
        assert_eq!(c.sslmode, oncely_core::postgres::SslMode::Prefer);
        assert_eq!(c.sslmode, oncely_core::postgres::DEFAULT_SSLMODE);
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
        assert_eq!(e.key, "sink");
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
        assert_eq!(e.key, "sink.path");
    }
}
