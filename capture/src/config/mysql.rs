//! The MySQL/MariaDB source's settings, Debezium's keys and values. They
//! live with the configuration (which the sources read), not in the
//! source, so the configuration depends on no source.

/// The server's own databases, never captured (as Debezium).
pub const SYSTEM_DATABASES: &[&str] = &["mysql", "information_schema", "performance_schema", "sys"];

/// `decimal.handling.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecimalHandlingMode {
    /// Connect `Decimal`: the unscaled value's two's-complement bytes
    /// (base64 in JSON), scale and precision in the schema. Debezium's default.
    #[default]
    Precise,
    /// double (rounds).
    Double,
    /// The exact decimal text.
    String,
}

/// `time.precision.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimePrecisionMode {
    /// Debezium's MySQL default: DATETIME in ms or µs by its precision,
    /// TIME always in µs.
    #[default]
    AdaptiveTimeMicroseconds,
    /// Kafka Connect's own Date, Time (ms, int32) and Timestamp (ms).
    Connect,
}

/// `bigint.unsigned.handling.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BigintUnsignedHandlingMode {
    /// int64. Debezium's default; a value above 2^63-1 is refused (a dead
    /// letter naming `precise`), never wrapped to a negative number.
    #[default]
    Long,
    /// Connect `Decimal` with scale 0: every value exact.
    Precise,
}

/// The mapping's settings, Debezium's keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MappingConfig {
    #[serde(rename = "decimal.handling.mode", default)]
    pub decimal: DecimalHandlingMode,
    #[serde(rename = "time.precision.mode", default)]
    pub time: TimePrecisionMode,
    #[serde(rename = "bigint.unsigned.handling.mode", default)]
    pub bigint_unsigned: BigintUnsignedHandlingMode,
    /// `tinyint(1)` as boolean (what Debezium's `TinyIntOneToBooleanConverter`
    /// does); false keeps Debezium's default int16.
    #[serde(rename = "tinyint.one.as.boolean", default)]
    pub tinyint_one_as_boolean: bool,
}

/// `snapshot.locking.mode`, Debezium's name and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotLockingMode {
    /// A global read lock only while the position is read (table locks
    /// for the whole snapshot when the user lacks RELOAD). Debezium's default.
    #[default]
    Minimal,
    /// No lock (servers that refuse them, such as some managed ones): a
    /// transaction that commits between the snapshot's read view and the
    /// reading of the position is in neither, and DDL during the
    /// snapshot is not seen.
    None,
}
