//! Decoding a record's key and value bytes: the Connect JSON wrapper or
//! bare payloads, schemas shared across records, images and versions checked.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Bookkeeping, ChangeEvent, Op, Payload, Version, VersionOrigin};
use crate::debezium;

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
pub(super) fn may_be_wrapped(bytes: &[u8]) -> bool {
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
pub(super) struct Fields {
    pub(super) op: Option<Value>,
    pub(super) before: Option<Value>,
    pub(super) after: Option<Value>,
    pub(super) source: Option<Value>,
    pub(super) ts_ms: Option<Value>,
    pub(super) message: Option<Value>,
    /// `status` of a Debezium transaction-metadata record.
    pub(super) status: Option<Value>,
    /// Whether the object had keys other than the envelope's.
    pub(super) other: bool,
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
                let mut budget = debezium::Budget::for_record(bytes.len());
                debezium::apply(&plan, columns, &mut budget).map_err(|e| DecodeError {
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
            decode_envelope(fields, schema, bytes.len())
        }
        Doc::Other(kind) => Err(DecodeError::value(format!(
            "expected an envelope object, got {kind}"
        ))),
    }
}

/// `record_bytes`: the value's size, which bounds what normalizing a
/// Debezium event may add ([`debezium::Budget`]).
pub(super) fn decode_envelope(
    env: Fields,
    schema: Option<Arc<Value>>,
    record_bytes: usize,
) -> Result<Payload, DecodeError> {
    if env.op.is_none() {
        if let Some(kind) = bookkeeping(&env) {
            return Ok(Payload::Bookkeeping(kind));
        }
    }
    let op = match env.op {
        Some(Value::String(s)) => Op::from_code(&s)
            .ok_or_else(|| DecodeError::value(format!("unknown op {}", quoted(&s))))?,
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
    let (version, version_origin) = version_of(op, &source)?;
    let mut before = row(env.before, "before")?;
    let mut after = row(env.after, "after")?;
    check_images(op, before.as_ref(), after.as_ref())?;
    let mut schema = schema;
    // Only topics a real Debezium wrote (no `commit_lsn`) carry encodings
    // oncely's capture never uses.
    if version_origin.is_debezium() {
        let budget = &mut debezium::Budget::for_record(record_bytes);
        match &schema {
            Some(s) => {
                if let Some(plan) = debezium::plan_for(s, debezium::Layout::Envelope) {
                    for image in [before.as_mut(), after.as_mut()].into_iter().flatten() {
                        debezium::apply(&plan, image, budget)?;
                    }
                    schema = Some(plan.schema.clone());
                }
            }
            None => {
                for image in [before.as_mut(), after.as_mut()].into_iter().flatten() {
                    debezium::recover_schemaless(image, budget)?;
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
fn version_of(
    op: Op,
    source: &Map<String, Value>,
) -> Result<(Version, VersionOrigin), DecodeError> {
    if let Some(commit_lsn) = unsigned(source, "commit_lsn")? {
        let seq = unsigned(source, "event_seq")?.unwrap_or(0);
        return Ok((Version::new(commit_lsn, seq), VersionOrigin::CommitLsn));
    }
    match unsigned(source, "lsn")? {
        Some(lsn) => {
            let seq = if op == Op::Read || super::snapshot_flag(source) {
                super::DEBEZIUM_SNAPSHOT_SEQ
            } else {
                super::DEBEZIUM_STREAMED_SEQ
            };
            Ok((Version::new(lsn, seq), VersionOrigin::SourceLsn))
        }
        None if source.contains_key("file") => binlog_version(op, source),
        None => Err(DecodeError::value(
            "no version: `source` has neither `commit_lsn`, `lsn` nor `file` and `pos`",
        )),
    }
}

/// The version of a change Debezium's MySQL or MariaDB connector wrote
/// (the module docs of [`crate::event`]): `(n << 32 | pos, seq)`.
fn binlog_version(
    op: Op,
    source: &Map<String, Value>,
) -> Result<(Version, VersionOrigin), DecodeError> {
    let file = match source.get("file") {
        Some(Value::String(file)) => file,
        _ => {
            return Err(DecodeError::value(
                "`source.file` must be a binlog file name",
            ))
        }
    };
    let number = file
        .rsplit_once('.')
        .map(|(_, n)| n)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| {
            DecodeError::value(format!(
                "`source.file` {} is not a binlog file name ending in its sequence number",
                quoted(file)
            ))
        })?;
    let pos = unsigned(source, "pos")?
        .ok_or_else(|| DecodeError::value("`source.file` without `source.pos`"))?;
    let pos = u32::try_from(pos).map_err(|_| {
        DecodeError::value(format!(
            "`source.pos` {pos} is beyond a binlog offset's 32 bits"
        ))
    })?;
    let seq = if op == Op::Read || super::snapshot_flag(source) {
        super::DEBEZIUM_SNAPSHOT_SEQ
    } else {
        // `row` counts from 0 inside the row's event.
        1 + unsigned(source, "row")?.unwrap_or(0)
    };
    let lsn = u64::from(number) << 32 | u64::from(pos);
    Ok((
        Version::new(failover_epoch(source, number)? | lsn, seq),
        VersionOrigin::Binlog,
    ))
}

/// The top bits of a binlog version after oncely's capture followed a
/// failover (`source.failover_epoch`, absent on every record before one
/// and on Debezium's): every change of the new primary is newer than
/// every change of the old one, whose files and offsets it restarts.
fn failover_epoch(source: &Map<String, Value>, number: u32) -> Result<u64, DecodeError> {
    const EPOCH_SHIFT: u32 = 55;
    let epoch = unsigned(source, "failover_epoch")?.unwrap_or(0);
    if epoch == 0 {
        return Ok(0);
    }
    if epoch > 255 || u64::from(number) >= 1 << (EPOCH_SHIFT - 32) {
        return Err(DecodeError::value(format!(
            "`source.failover_epoch` {epoch} with binlog number {number}: a version holds epochs up to 255 and binlog numbers below 2^23"
        )));
    }
    Ok(epoch << EPOCH_SHIFT)
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
                "`source.{field}` must be a non-negative integer, got {}",
                quoted(s)
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

/// Longest excerpt of a record's own text put in a reason: a reason names
/// what is wrong, it does not carry the record (which the dead letter does).
const EXCERPT_CHARS: usize = 64;

/// `text` in backquotes for a reason, cut after [`EXCERPT_CHARS`]
/// characters with its full size said.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        None => format!("`{text}`"),
        Some((end, _)) => format!("`{}`... ({} bytes)", &text[..end], text.len()),
    }
}

/// A JSON value for a reason: its text, cut as [`quoted`] cuts.
pub(crate) fn excerpt(value: &Value) -> String {
    match value {
        Value::String(s) => quoted(s),
        Value::Array(_) | Value::Object(_) => {
            let text = value.to_string();
            quoted(&text)
        }
        other => other.to_string(),
    }
}
