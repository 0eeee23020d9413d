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

use crate::debezium;

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
struct Wrapped<'a, P> {
    #[serde(borrow)]
    schema: &'a RawValue,
    payload: P,
}

/// Splits `{"schema": s, "payload": p}` into `(p, Some(s))`; anything else is
/// its own payload. The wrapper is tried first without building the schema
/// (it is two thirds of a record and the same for a whole table), but only
/// when the document may be one (see [`may_be_wrapped`]): a failed attempt
/// costs a formatted error message. Anything that is not exactly the wrapper
/// is then parsed as a plain value.
fn parse<'a, P: serde::Deserialize<'a>>(
    bytes: &'a [u8],
) -> Result<(P, Option<&'a RawValue>), serde_json::Error> {
    if may_be_wrapped(bytes) {
        if let Ok(w) = serde_json::from_slice::<Wrapped<'_, P>>(bytes) {
            let schema = (w.schema.get() != "null").then_some(w.schema);
            return Ok((w.payload, schema));
        }
    }
    serde_json::from_slice(bytes).map(|v| (v, None))
}

/// False when `bytes` is certainly not the schema wrapper: not an object, or
/// an object whose first key is plainly (without escapes) neither `schema`
/// nor `payload`. True otherwise (the wrapper is then tried).
fn may_be_wrapped(bytes: &[u8]) -> bool {
    let skip = |b: &[u8]| -> usize {
        b.iter()
            .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(b.len())
    };
    let rest = &bytes[skip(bytes)..];
    let Some(rest) = rest.strip_prefix(b"{") else {
        return false;
    };
    let rest = &rest[skip(rest)..];
    let Some(rest) = rest.strip_prefix(b"\"") else {
        return true;
    };
    match rest.iter().position(|&c| c == b'"' || c == b'\\') {
        Some(end) if rest[end] == b'"' => matches!(&rest[..end], b"schema" | b"payload"),
        _ => true,
    }
}

/// A record value read as a change-event envelope: the top-level fields are
/// taken as they come (the last of a repeated key wins, as in a map) without
/// building a map of them; unknown fields are skipped.
// One short-lived value per record, moved once: boxing the large variant
// would cost an allocation per record for nothing.
#[allow(clippy::large_enum_variant)]
enum Doc {
    /// JSON `null`.
    Null,
    /// An object.
    Envelope(Fields),
    /// Anything else, by its kind (see [`json_kind`]).
    Other(&'static str),
}

/// The envelope fields a change event is made of, as JSON values.
#[derive(Default)]
struct Fields {
    op: Option<Value>,
    before: Option<Value>,
    after: Option<Value>,
    source: Option<Value>,
    ts_ms: Option<Value>,
    message: Option<Value>,
    /// `status` of a Debezium transaction-metadata record.
    status: Option<Value>,
    /// Whether the object had keys other than the envelope's.
    other: bool,
}

/// A top-level envelope key.
enum Key {
    Op,
    Before,
    After,
    Source,
    TsMs,
    Message,
    Status,
    Other,
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "op" => Key::Op,
                    "before" => Key::Before,
                    "after" => Key::After,
                    "source" => Key::Source,
                    "ts_ms" => Key::TsMs,
                    "message" => Key::Message,
                    "status" => Key::Status,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for Doc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess};
        struct DocVisitor;
        impl<'de> serde::de::Visitor<'de> for DocVisitor {
            type Value = Doc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON document")
            }
            fn visit_unit<E>(self) -> Result<Doc, E> {
                Ok(Doc::Null)
            }
            fn visit_none<E>(self) -> Result<Doc, E> {
                Ok(Doc::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Doc, E> {
                Ok(Doc::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Doc, E> {
                Ok(Doc::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Doc, E> {
                Ok(Doc::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Doc, E> {
                Ok(Doc::Other("a number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Doc, E> {
                Ok(Doc::Other("a string"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Doc::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
                let mut f = Fields::default();
                while let Some(key) = map.next_key::<Key>()? {
                    let slot = match key {
                        Key::Op => &mut f.op,
                        Key::Before => &mut f.before,
                        Key::After => &mut f.after,
                        Key::Source => &mut f.source,
                        Key::TsMs => &mut f.ts_ms,
                        Key::Message => &mut f.message,
                        Key::Status => &mut f.status,
                        Key::Other => {
                            f.other = true;
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value::<Value>()?);
                }
                Ok(Doc::Envelope(f))
            }
        }
        d.deserialize_any(DocVisitor)
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
    let (mut payload, schema) = parse::<Value>(bytes).map_err(|e| DecodeError {
        part: "key",
        reason: format!("not JSON: {e}"),
    })?;
    // A key column in one of Debezium's encodings (a `numeric` or temporal
    // primary key) is normalized as the row's column is, so the key matches
    // the row and the key oncely's capture would send.
    if let (Some(schema), Value::Object(columns)) = (schema, &mut payload) {
        if debezium::key_may_need_normalizing(schema.get()) {
            let schema = shared_schema(schema).map_err(|e| DecodeError {
                part: "key",
                reason: format!("schema not JSON: {e}"),
            })?;
            if let Some(plan) = debezium::plan_for(&schema, debezium::Layout::Key) {
                debezium::apply(&plan, columns).map_err(|e| DecodeError {
                    part: "key",
                    reason: e.reason,
                })?;
            }
        }
    }
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
    let (doc, schema) =
        parse::<Doc>(bytes).map_err(|e| DecodeError::value(format!("not JSON: {e}")))?;
    match doc {
        Doc::Null => Ok(Payload::Tombstone),
        Doc::Envelope(fields) => {
            let schema = schema
                .map(shared_schema)
                .transpose()
                .map_err(|e| DecodeError::value(format!("schema not JSON: {e}")))?;
            decode_envelope(fields, schema)
        }
        Doc::Other(kind) => Err(DecodeError::value(format!(
            "expected an envelope object, got {kind}"
        ))),
    }
}

fn decode_envelope(env: Fields, schema: Option<Arc<Value>>) -> Result<Payload, DecodeError> {
    if env.op.is_none() {
        if let Some(kind) = bookkeeping(&env) {
            return Ok(Payload::Bookkeeping(kind));
        }
    }
    let op = match env.op {
        Some(Value::String(s)) => {
            Op::from_code(&s).ok_or_else(|| DecodeError::value(format!("unknown op `{s}`")))?
        }
        Some(other) => {
            return Err(DecodeError::value(format!(
                "`op` must be a string, got {}",
                json_kind(&other)
            )))
        }
        None => return Err(DecodeError::value("missing `op`")),
    };
    let source = match env.source {
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
    let mut before = row(env.before, "before")?;
    let mut after = row(env.after, "after")?;
    check_images(op, before.as_ref(), after.as_ref())?;
    let mut schema = schema;
    // Only topics a real Debezium wrote (no `commit_lsn`) carry encodings
    // oncely's capture never uses.
    if version_origin == VersionOrigin::SourceLsn {
        match &schema {
            Some(s) => {
                if let Some(plan) = debezium::plan_for(s, debezium::Layout::Envelope) {
                    for image in [before.as_mut(), after.as_mut()].into_iter().flatten() {
                        debezium::apply(&plan, image)?;
                    }
                    schema = Some(plan.schema.clone());
                }
            }
            None => {
                for image in [before.as_mut(), after.as_mut()].into_iter().flatten() {
                    debezium::recover_schemaless(image)?;
                }
            }
        }
    }
    Ok(Payload::Change(Box::new(ChangeEvent {
        op,
        before,
        after,
        ts_ms: env.ts_ms.as_ref().and_then(Value::as_i64),
        message: env.message.filter(|m| !m.is_null()),
        source,
        version,
        version_origin,
        schema,
    })))
}

/// A record of Debezium's transaction-metadata or heartbeat topic, told by
/// its fields: `status` `BEGIN`/`END` (with `id`), or nothing but `ts_ms`.
fn bookkeeping(env: &Fields) -> Option<Bookkeeping> {
    let no_change = env.before.is_none() && env.after.is_none() && env.source.is_none();
    if !no_change || env.message.is_some() {
        return None;
    }
    match env.status.as_ref().and_then(Value::as_str) {
        Some("BEGIN" | "END") => Some(Bookkeeping::TransactionMetadata),
        None if env.ts_ms.is_some() && !env.other => Some(Bookkeeping::Heartbeat),
        _ => None,
    }
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

fn row(image: Option<Value>, field: &str) -> Result<Option<Map<String, Value>>, DecodeError> {
    match image {
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
