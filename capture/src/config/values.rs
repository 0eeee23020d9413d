//! The enumerated values of capture's keys, and [`StringList`] (moved
//! unchanged from `mod.rs`).

use serde::Deserialize;

/// `source` values: which kind of database capture reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// PostgreSQL, through a logical replication slot.
    #[default]
    Postgres,
    /// MySQL or MariaDB (capture streams it; no snapshots yet).
    Mysql,
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

/// `key.converter` / `value.converter`: how keys and values are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Converter {
    /// Kafka Connect's JSON converter (`schemas.enable` says whether with schemas).
    #[default]
    Json,
    /// Avro in Confluent's wire format, schemas in `schema.registry.url`.
    Avro,
}

/// `interval.handling.mode` (Debezium's key and values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalHandlingMode {
    /// `io.debezium.time.Interval`: ISO-8601 text, months, days and time
    /// kept apart, so every interval round-trips. Our default; Debezium's
    /// is `numeric`.
    #[default]
    String,
    /// `io.debezium.time.MicroDuration`: µs, a month counted as 30.4375
    /// days (lossy); an interval beyond 64-bit µs is refused.
    Numeric,
}

/// `skipped.operations`: the kinds of streamed change not published, as
/// Debezium names them (`c` inserts, `u` updates, `d` deletes, `t`
/// truncates; `none`). A primary-key change is a delete and a create, each
/// skipped by its own letter. Snapshot rows are never skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct SkippedOperations {
    pub create: bool,
    pub update: bool,
    pub delete: bool,
    pub truncate: bool,
}

impl TryFrom<String> for SkippedOperations {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let mut skipped = SkippedOperations::default();
        let letters: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if letters == ["none"] {
            return Ok(skipped);
        }
        for letter in letters {
            match letter {
                "c" => skipped.create = true,
                "u" => skipped.update = true,
                "d" => skipped.delete = true,
                "t" => skipped.truncate = true,
                other => {
                    return Err(format!(
                        "skipped.operations: {other:?} is not an operation; list any of c (inserts), u (updates), d (deletes), t (truncates), comma-separated, or \"none\""
                    ))
                }
            }
        }
        Ok(skipped)
    }
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
