//! Change events as they travel in Kafka: the Debezium JSON envelope, decoded.
//!
//! Both layouts of Kafka Connect's JSON converter are accepted: with the
//! `{"schema": ..., "payload": ...}` wrapper (schemas enabled) and without it.
//! A record with a null value is a [`Payload::Tombstone`].
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
//! * Topics written by Debezium itself have no `commit_lsn`: the version falls
//!   back to `(source.lsn, 0)` ([`VersionOrigin::SourceLsn`]). **Limit:** the
//!   event's own WAL position is ordered per key for ordinary changes (row
//!   locks), but a change written before a snapshot chunk's high watermark and
//!   committed after it can lose to the older snapshot row, and two events of
//!   one key in one transaction may share an LSN. Prefer oncely's capture when
//!   snapshots and streaming overlap.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;
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
    /// `source.lsn` only (a Debezium-written topic): see the module-level limit.
    SourceLsn,
}

/// The kind of change (`op` in the envelope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `c`: a row was inserted.
    Create,
    /// `u`: a row was updated.
    Update,
    /// `d`: a row was deleted.
    Delete,
    /// `r`: a row read by a snapshot.
    Read,
    /// `t`: a table was truncated.
    Truncate,
    /// `m`: a logical decoding message.
    Message,
}

impl Op {
    /// Parses the one-letter code of the envelope.
    pub fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "c" => Self::Create,
            "u" => Self::Update,
            "d" => Self::Delete,
            "r" => Self::Read,
            "t" => Self::Truncate,
            "m" => Self::Message,
            _ => return None,
        })
    }

    /// The one-letter code of the envelope.
    pub fn code(self) -> &'static str {
        match self {
            Self::Create => "c",
            Self::Update => "u",
            Self::Delete => "d",
            Self::Read => "r",
            Self::Truncate => "t",
            Self::Message => "m",
        }
    }
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
    /// `source.schema`, if present.
    pub fn schema_name(&self) -> Option<&str> {
        self.source.get("schema").and_then(Value::as_str)
    }

    /// `source.table`, if present.
    pub fn table(&self) -> Option<&str> {
        self.source.get("table").and_then(Value::as_str)
    }

    /// `source.snapshot` is set to something other than `false`.
    pub fn is_snapshot(&self) -> bool {
        match self.source.get("snapshot") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::String(s)) => s != "false",
            Some(_) => true,
        }
    }
}

/// What a record's value holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// A change event.
    Change(Box<ChangeEvent>),
    /// A null value: the key's tombstone, following a delete (for log compaction).
    Tombstone,
}

/// A record that is not a valid change event; becomes a per-record failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {part}: {reason}")]
pub struct DecodeError {
    /// `key` or `value`.
    pub part: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl DecodeError {
    fn value(reason: impl Into<String>) -> Self {
        Self {
            part: "value",
            reason: reason.into(),
        }
    }
}

/// `{"schema": s, "payload": p}` with the schema left unparsed.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped<'a> {
    #[serde(borrow)]
    schema: &'a RawValue,
    payload: Value,
}

/// Splits `{"schema": s, "payload": p}` into `(p, Some(s))`; anything else is
/// its own payload. The wrapper is tried first without building the schema
/// (it is two thirds of a record and the same for a whole table); anything
/// that is not exactly the wrapper fails on its first other key and is then
/// parsed as a plain value.
fn parse(bytes: &[u8]) -> Result<(Value, Option<&RawValue>), serde_json::Error> {
    match serde_json::from_slice::<Wrapped<'_>>(bytes) {
        Ok(w) => {
            let schema = (w.schema.get() != "null").then_some(w.schema);
            Ok((w.payload, schema))
        }
        Err(_) => serde_json::from_slice(bytes).map(|v| (v, None)),
    }
}

/// Schemas recently seen on this thread, by their exact text.
const SCHEMA_CACHE: usize = 64;

thread_local! {
    static SCHEMAS: RefCell<Vec<(Box<str>, Arc<Value>)>> = const { RefCell::new(Vec::new()) };
}

/// The parsed schema for `raw`, shared with every earlier record that had the same text.
fn shared_schema(raw: &RawValue) -> Result<Arc<Value>, serde_json::Error> {
    let text = raw.get();
    SCHEMAS.with(|cell| {
        let mut cache = cell.borrow_mut();
        if let Some((_, schema)) = cache.iter().find(|(t, _)| **t == *text) {
            return Ok(schema.clone());
        }
        let schema = Arc::new(serde_json::from_str::<Value>(text)?);
        if cache.len() == SCHEMA_CACHE {
            cache.remove(0);
        }
        cache.push((text.into(), schema.clone()));
        Ok(schema)
    })
}

/// Decodes a record key: JSON, with or without the schema wrapper; `None` for a null key.
pub fn decode_key(raw: Option<&[u8]>) -> Result<Option<Value>, DecodeError> {
    let Some(bytes) = raw else { return Ok(None) };
    let (payload, _schema) = parse(bytes).map_err(|e| DecodeError {
        part: "key",
        reason: format!("not JSON: {e}"),
    })?;
    Ok(match payload {
        Value::Null => None,
        other => Some(other),
    })
}

/// Decodes a record value: a Debezium envelope or a tombstone.
pub fn decode_value(raw: Option<&[u8]>) -> Result<Payload, DecodeError> {
    let Some(bytes) = raw else {
        return Ok(Payload::Tombstone);
    };
    let (payload, schema) =
        parse(bytes).map_err(|e| DecodeError::value(format!("not JSON: {e}")))?;
    match payload {
        Value::Null => Ok(Payload::Tombstone),
        Value::Object(envelope) => {
            let schema = schema
                .map(shared_schema)
                .transpose()
                .map_err(|e| DecodeError::value(format!("schema not JSON: {e}")))?;
            decode_envelope(envelope, schema).map(|e| Payload::Change(Box::new(e)))
        }
        other => Err(DecodeError::value(format!(
            "expected an envelope object, got {}",
            json_kind(&other)
        ))),
    }
}

fn decode_envelope(
    mut env: Map<String, Value>,
    schema: Option<Arc<Value>>,
) -> Result<ChangeEvent, DecodeError> {
    let op_code = match env.get("op") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(DecodeError::value(format!(
                "`op` must be a string, got {}",
                json_kind(other)
            )))
        }
        None => return Err(DecodeError::value("missing `op`")),
    };
    let op = Op::from_code(&op_code)
        .ok_or_else(|| DecodeError::value(format!("unknown op `{op_code}`")))?;
    let source = match env.remove("source") {
        Some(Value::Object(s)) => s,
        Some(other) => {
            return Err(DecodeError::value(format!(
                "`source` must be an object, got {}",
                json_kind(&other)
            )))
        }
        None => return Err(DecodeError::value("missing `source`")),
    };
    let (version, version_origin) = version_of(&source)?;
    let before = row(&mut env, "before")?;
    let after = row(&mut env, "after")?;
    check_images(op, before.as_ref(), after.as_ref())?;
    Ok(ChangeEvent {
        op,
        before,
        after,
        ts_ms: env.get("ts_ms").and_then(Value::as_i64),
        message: env.remove("message").filter(|m| !m.is_null()),
        source,
        version,
        version_origin,
        schema,
    })
}

/// Creates and snapshot reads need `after`, deletes need `before` (at least the key columns).
fn check_images(
    op: Op,
    before: Option<&Map<String, Value>>,
    after: Option<&Map<String, Value>>,
) -> Result<(), DecodeError> {
    match op {
        Op::Create | Op::Read | Op::Update if after.is_none() => Err(DecodeError::value(format!(
            "op `{}` without `after`",
            op.code()
        ))),
        Op::Delete if before.is_none() => Err(DecodeError::value("op `d` without `before`")),
        _ => Ok(()),
    }
}

fn row(
    env: &mut Map<String, Value>,
    field: &str,
) -> Result<Option<Map<String, Value>>, DecodeError> {
    match env.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(row)) => Ok(Some(row)),
        Some(other) => Err(DecodeError::value(format!(
            "`{field}` must be an object or null, got {}",
            json_kind(&other)
        ))),
    }
}

/// The version rule of the module docs.
fn version_of(source: &Map<String, Value>) -> Result<(Version, VersionOrigin), DecodeError> {
    if let Some(commit_lsn) = unsigned(source, "commit_lsn")? {
        let seq = unsigned(source, "event_seq")?.unwrap_or(0);
        return Ok((Version::new(commit_lsn, seq), VersionOrigin::CommitLsn));
    }
    match unsigned(source, "lsn")? {
        Some(lsn) => Ok((Version::new(lsn, 0), VersionOrigin::SourceLsn)),
        None => Err(DecodeError::value(
            "no version: `source` has neither `commit_lsn` nor `lsn`",
        )),
    }
}

/// A non-negative integer field; numbers and decimal strings are accepted, null is absent.
fn unsigned(source: &Map<String, Value>, field: &str) -> Result<Option<u64>, DecodeError> {
    match source.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            DecodeError::value(format!(
                "`source.{field}` must be a non-negative integer, got {n}"
            ))
        }),
        Some(Value::String(s)) => s.parse::<u64>().map(Some).map_err(|_| {
            DecodeError::value(format!(
                "`source.{field}` must be a non-negative integer, got {s:?}"
            ))
        }),
        Some(other) => Err(DecodeError::value(format!(
            "`source.{field}` must be a number, got {}",
            json_kind(other)
        ))),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
