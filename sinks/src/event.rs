//! Change events as they travel in Kafka: the Debezium JSON envelope, decoded.
//!
//! Both layouts of Kafka Connect's JSON converter are accepted: with the
//! `{"schema": ..., "payload": ...}` wrapper (schemas enabled) and without it.
//! A record with a null value is a [`Payload::Tombstone`]; Debezium's
//! transaction-metadata and heartbeat records are [`Payload::Bookkeeping`].
//!
//! Events of topics a real Debezium connector wrote are normalized to
//! oncely's wire form while decoding (decimals, temporal precision modes,
//! bits, points, the binary unavailable marker): see [`crate::debezium`].
//!
//! # Versions
//!
//! Every event carries a [`Version`] that only grows, per key, in source commit
//! order. Sinks compare it with the version stored beside a row to apply only
//! newer changes.
//!
//! * Topics written by oncely carry `source.commit_lsn` (the commit LSN of the
//!   event's transaction) and `source.event_seq` (its ordinal inside the
//!   transaction): the version is `(commit_lsn, event_seq)`. Snapshot rows
//!   (`op = r`) carry the high-watermark LSN of their chunk in `commit_lsn`, so
//!   the same rule orders them correctly against streamed changes.
//! * Topics written by Debezium itself have no `commit_lsn`: the version is
//!   the event's own `source.lsn` ([`VersionOrigin::SourceLsn`]), with `seq`
//!   0 for a snapshot row (`op = r`, or `snapshot` other than `false`) and 1
//!   for a streamed change. Per key that order is right for streamed changes:
//!   a row's next change waits for the lock of the transaction that changed
//!   it last, so it is written after that one committed. The first WAL record
//!   after the snapshot point starts *at* the snapshot's `source.lsn`, hence
//!   the `seq`: a streamed change there replaces the snapshot row, never the
//!   reverse. Debezium's `source.sequence` (`[previous commit LSN, LSN]`)
//!   orders whole transactions, but taking its first element into the
//!   version would give two changes of one key in one transaction the same
//!   version whenever another transaction committed after both were written.
//!
//!   Versions of Debezium events are not unique: every row of one snapshot
//!   has the same one, so do the rows of one multi-row WAL record. What must
//!   tell events apart takes the record's Kafka partition and offset too: the
//!   dedup window's identity (`runner::dedup`) and the warehouse history's key
//!   ([`ChangeEvent::unique_position`]); a redelivery of the same record keeps
//!   both.
//!
//!   **Limit:** a change written before the snapshot point by a transaction
//!   that committed after it has a smaller LSN than the snapshot row it is
//!   newer than, and loses to it. Prefer oncely's capture when snapshots and
//!   streaming overlap.
//! * Topics written by Debezium's MySQL or MariaDB connector carry neither:
//!   their `source` names the binlog file, the offset of the row's event in
//!   it (`pos`) and the row inside that event (`row`)
//!   ([`VersionOrigin::Binlog`]). The version is `(n << 32 | pos, seq)` with
//!   `n` the file's sequence number (the digits after the last `.` of
//!   `binlog.000042`, which grow by one at each rotation) and `seq` 0 for a
//!   snapshot row, `1 + row` for a streamed change. The binlog is written in
//!   commit order and every row event has its own offset, so this order is
//!   the commit order, across rotations, with no limit like the one above; a
//!   snapshot row carries the binlog position it was read at, before every
//!   change it does not hold. Offsets fit 32 bits (a binlog event header
//!   stores them in 4 bytes).
//!
//!   **Limit:** positions belong to one server's binlog. After a failover to
//!   a replica (whose binlog has its own files and offsets), or after
//!   `log_bin`'s base name changed (numbering starts again at 1), versions
//!   are no longer comparable with the stored ones: snapshot the tables again
//!   into fresh targets. oncely's MySQL capture follows a failover by GTIDs
//!   and then writes `source.failover_epoch` (absent: 0), the failovers it
//!   followed; the version is then `(epoch << 55 | n << 32 | pos, seq)`, so
//!   every change read from the new primary is newer than every change
//!   before it (`n` must stay below 2^23 when the epoch is above 0).

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

/// The position of a change in the source's commit order; compared lexicographically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// Commit LSN of the event's transaction (or its own LSN, see [`VersionOrigin`]).
    pub lsn: u64,
    /// Ordinal of the event inside its transaction (0 when unknown).
    pub seq: u64,
}

impl Version {
    /// A version from its parts.
    pub const fn new(lsn: u64, seq: u64) -> Self {
        Self { lsn, seq }
    }
}

/// Whether a change at version `next` replaces what a change at version
/// `held` wrote (or would write) for the same key: only when strictly
/// newer. The one tie rule of every sink: the in-batch folds (warehouse
/// `collapse`, Elasticsearch `fold`) and the guards at the target
/// (warehouse `(lsn, seq) <`, Elasticsearch external versions and its merge
/// and truncate checks, the Redis script's `stored >= ver` skip) all keep what is there on
/// an equal version, so a batch and its replay end the same way.
pub fn replaces<V: PartialOrd>(next: V, held: V) -> bool {
    next > held
}

impl fmt::Display for Version {
    /// `lsn/seq` in decimal, e.g. `23911352/3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.lsn, self.seq)
    }
}

/// Where an event's [`Version`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionOrigin {
    /// `source.commit_lsn` and `source.event_seq` (oncely capture): safe ordering.
    CommitLsn,
    /// `source.lsn` only (a topic Debezium's PostgreSQL connector wrote):
    /// see the module-level limit.
    SourceLsn,
    /// `source.file`, `pos` and `row` (a topic Debezium's MySQL or MariaDB
    /// connector wrote): see the module docs.
    Binlog,
}

impl VersionOrigin {
    /// The topic was written by a real Debezium connector, not by oncely's
    /// capture: its versions are not unique per event (every row of a
    /// snapshot shares one), and its values may use encodings oncely never
    /// writes.
    pub fn is_debezium(self) -> bool {
        matches!(self, VersionOrigin::SourceLsn | VersionOrigin::Binlog)
    }
}

pub use oncely_core::wire::Op;

/// The `after` (or `before`) row struct of a value schema.
pub fn row_struct(schema: Option<&Value>) -> Option<&Value> {
    let fields = schema?.get("fields")?.as_array()?;
    let named = |name: &str| {
        fields
            .iter()
            .find(|f| f.get("field").and_then(Value::as_str) == Some(name))
    };
    named("after").or_else(|| named("before"))
}

/// The fields of the `after` (or `before`) row struct in a value schema, by
/// column name: what each sink reads a column's Connect type from.
pub fn row_fields(schema: Option<&Value>) -> Option<std::collections::HashMap<&str, &Value>> {
    Some(
        row_struct(schema)?
            .get("fields")?
            .as_array()?
            .iter()
            .filter_map(|f| Some((f.get("field")?.as_str()?, f)))
            .collect(),
    )
}

/// A decoded change event (the value of a non-tombstone record).
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeEvent {
    /// The kind of change.
    pub op: Op,
    /// The row before the change (updates and deletes, per REPLICA IDENTITY), if any.
    pub before: Option<Map<String, Value>>,
    /// The row after the change (creates, updates, snapshot reads), if any.
    pub after: Option<Map<String, Value>>,
    /// The `source` block: connector, db, schema, table, txId, lsn, ... as sent.
    pub source: Map<String, Value>,
    /// `ts_ms` of the envelope, if present.
    pub ts_ms: Option<i64>,
    /// The `message` block of an `m` event, if any.
    pub message: Option<Value>,
    /// The version that orders this event against others of the same key.
    pub version: Version,
    /// Where [`ChangeEvent::version`] came from.
    pub version_origin: VersionOrigin,
    /// The value's Connect schema, when the producer enabled schemas. Shared:
    /// every record of a table carries the same schema, decoded once.
    pub schema: Option<Arc<Value>>,
}

impl ChangeEvent {
    /// `source.schema`, if present; else, for a MySQL or MariaDB source
    /// (whose `source` names no schema: a database is MySQL's schema),
    /// `source.db`. So a MySQL table is named by its database and table
    /// wherever a PostgreSQL one is by its schema and table.
    pub fn schema_name(&self) -> Option<&str> {
        match self.source.get("schema") {
            Some(schema) => schema.as_str(),
            None if self.source.contains_key("file") => {
                self.source.get("db").and_then(Value::as_str)
            }
            None => None,
        }
    }

    /// `source.table`, if present.
    pub fn table(&self) -> Option<&str> {
        self.source.get("table").and_then(Value::as_str)
    }

    /// `source.snapshot` is set to something other than `false`.
    pub fn is_snapshot(&self) -> bool {
        snapshot_flag(&self.source)
    }

    /// The event's place among all events of its topic, for what keeps one
    /// entry per event (the warehouse history's `(lsn, seq)` key): its
    /// version for oncely's events, unique per event; for Debezium's, which
    /// share versions (see the module docs), `source.lsn` with the record's
    /// Kafka `partition` and `offset` as `seq = partition << 40 | offset`
    /// (unique below 2^40 offsets per partition), so that a redelivery of
    /// the same record has the same place and no two records share one.
    pub fn unique_position(&self, partition: i32, offset: i64) -> Version {
        match self.version_origin {
            VersionOrigin::CommitLsn => self.version,
            VersionOrigin::SourceLsn | VersionOrigin::Binlog => {
                let partition = u64::from(partition.unsigned_abs());
                let offset = offset.unsigned_abs() & ((1 << 40) - 1);
                Version::new(self.version.lsn, partition << 40 | offset)
            }
        }
    }
}

/// `seq` of a Debezium snapshot row's version (see the module docs).
pub const DEBEZIUM_SNAPSHOT_SEQ: u64 = 0;
/// `seq` of a Debezium streamed change's version: after the snapshot rows of its LSN.
pub const DEBEZIUM_STREAMED_SEQ: u64 = 1;

/// `snapshot` of a `source` block is set to something other than `false`
/// (Debezium: `true`, `first`, `last`, `incremental`, ...).
fn snapshot_flag(source: &Map<String, Value>) -> bool {
    match source.get("snapshot") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => s != "false",
        Some(_) => true,
    }
}

/// What a record's value holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// A change event.
    Change(Box<ChangeEvent>),
    /// A null value: the key's tombstone, following a delete (for log compaction).
    Tombstone,
    /// A Debezium record that is no change: sinks skip it.
    Bookkeeping(Bookkeeping),
}

/// Records of Debezium's own topics, which carry no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bookkeeping {
    /// A `BEGIN` or `END` record of the transaction-metadata topic
    /// (`provide.transaction.metadata`).
    TransactionMetadata,
    /// A record of the heartbeat topic (`heartbeat.interval.ms`): only `ts_ms`.
    Heartbeat,
}

/// Kafka header on every record oncely's capture writes for a table, tombstones
/// included: the event's source position as `<commit_lsn>/<event_seq>` in
/// decimal (the [`Version`] of its envelope). A tombstone's position is that of
/// the delete it follows.
pub const HEADER_POSITION: &str = "oncely.position";
/// Kafka header on a tombstone: the source schema of the deleted row's table.
pub const HEADER_SCHEMA: &str = "oncely.schema";
/// Kafka header on a tombstone: the source table of the deleted row.
pub const HEADER_TABLE: &str = "oncely.table";

/// Where a tombstone comes from, read from its headers ([`HEADER_POSITION`],
/// [`HEADER_SCHEMA`], [`HEADER_TABLE`]). With it a sink applies the tombstone
/// as a versioned delete, so a sink that lags behind log compaction (which
/// keeps only a deleted key's tombstone) still deletes the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TombstoneOrigin {
    /// The position of the delete the tombstone follows.
    pub version: Version,
    /// Source schema.
    pub schema: String,
    /// Source table.
    pub table: String,
}

impl TombstoneOrigin {
    /// Reads the three headers; `None` unless all are present and valid
    /// (tombstones of Debezium and older oncely versions carry none).
    pub fn from_headers<'a>(mut header: impl FnMut(&str) -> Option<&'a [u8]>) -> Option<Self> {
        let text = |v: &'a [u8]| std::str::from_utf8(v).ok();
        let version = parse_position(header(HEADER_POSITION).and_then(text)?)?;
        let schema = header(HEADER_SCHEMA).and_then(text)?.to_owned();
        let table = header(HEADER_TABLE).and_then(text)?.to_owned();
        Some(Self {
            version,
            schema,
            table,
        })
    }

    /// The delete this tombstone stands for: no row images, the version and
    /// table of the delete it follows.
    pub fn to_delete(&self) -> ChangeEvent {
        let mut source = Map::new();
        source.insert("schema".into(), Value::String(self.schema.clone()));
        source.insert("table".into(), Value::String(self.table.clone()));
        source.insert("commit_lsn".into(), Value::from(self.version.lsn));
        source.insert("event_seq".into(), Value::from(self.version.seq));
        ChangeEvent {
            op: Op::Delete,
            before: None,
            after: None,
            source,
            ts_ms: None,
            message: None,
            version: self.version,
            version_origin: VersionOrigin::CommitLsn,
            schema: None,
        }
    }
}

/// Parses `<lsn>/<seq>` (decimal), the text of [`HEADER_POSITION`].
pub fn parse_position(text: &str) -> Option<Version> {
    let (lsn, seq) = text.split_once('/')?;
    Some(Version::new(lsn.parse().ok()?, seq.parse().ok()?))
}

mod decode;

pub(crate) use decode::excerpt;
pub use decode::{decode_key, decode_value, DecodeError};

#[cfg(test)]
mod tests;
