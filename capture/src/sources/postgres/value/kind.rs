//! [`ValueKind`]: how one column's text values become JSON, resolved once
//! per column so the per-event path is a `match` and a parse, with no map
//! lookups.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use super::array::{parse_array, ArrayNode};
use super::scalar::{bytea_to_base64, normalize_money, parse_bool, parse_float, FloatText};
use super::temporal::{
    parse_date, parse_interval, parse_interval_parts, parse_time, parse_timestamp,
    parse_timestamptz, parse_timetz, write_zoned_time, write_zoned_timestamp, Interval,
    IntervalParts, ZonedTimestamp,
};
use crate::envelope::Characters;
use crate::json::{is_json_integer, write_i64, write_str};

pub(crate) const BOX_OID: u32 = 603;

/// The JSON mapping of one PostgreSQL type (docs/design.md, "Wire format").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueKind {
    Bool,
    /// `int2`.
    Int16,
    /// `int4`.
    Int32,
    /// `int8`, and `oid` (unsigned 32-bit, so it needs 64).
    Int64,
    /// `float4`.
    Float32,
    /// `float8`.
    Float64,
    /// `numeric`: the exact text as a JSON string.
    Decimal,
    /// `money`: exact digits as a JSON string, currency formatting removed.
    Money,
    /// Character types and anything without a specific mapping.
    Text,
    /// `varchar`: text whose schema carries the declared length (as
    /// Debezium's `column.propagate.source.type` does), so the warehouse can
    /// create and widen `character varying(n)` columns.
    Varchar,
    Json,
    Xml,
    Uuid,
    Enum {
        labels: Vec<String>,
    },
    Bytea,
    /// `timestamptz` -> ISO-8601 UTC string.
    ZonedTimestamp,
    /// `timestamp` -> µs since epoch.
    MicroTimestamp,
    /// `date` -> days since epoch.
    Date,
    /// `time` -> µs since midnight.
    MicroTime,
    /// `timetz` -> `HH:MM:SS.ffffffZ`.
    ZonedTime,
    /// `interval` -> µs (`interval.handling.mode = "numeric"`: lossy, a
    /// month is 30.4375 days).
    MicroDuration,
    /// `interval` -> Debezium's ISO-8601 string, months, days and time kept
    /// apart (`interval.handling.mode = "string"`, the default).
    Interval,
    Array {
        element: Box<ValueKind>,
        /// `typdelim` of the element type.
        delimiter: u8,
    },
}

/// Mapping of the built-in OIDs that are not plain text.
pub(crate) fn builtin_kind(oid: u32) -> Option<ValueKind> {
    Some(match oid {
        16 => ValueKind::Bool,
        17 => ValueKind::Bytea,
        21 => ValueKind::Int16,
        23 => ValueKind::Int32,
        20 | 26 => ValueKind::Int64,
        700 => ValueKind::Float32,
        701 => ValueKind::Float64,
        1700 => ValueKind::Decimal,
        790 => ValueKind::Money,
        114 | 3802 => ValueKind::Json,
        142 => ValueKind::Xml,
        2950 => ValueKind::Uuid,
        1184 => ValueKind::ZonedTimestamp,
        1114 => ValueKind::MicroTimestamp,
        1082 => ValueKind::Date,
        1083 => ValueKind::MicroTime,
        1266 => ValueKind::ZonedTime,
        1186 => ValueKind::MicroDuration,
        18 | 19 | 25 | 1042 => ValueKind::Text,
        1043 => ValueKind::Varchar,
        _ => return None,
    })
}

/// A value an integer-typed field cannot hold: a `timestamp` beyond 64-bit
/// µs since 1970, an `interval` beyond 64-bit µs under
/// `interval.handling.mode = "numeric"`. Never sent as anything else (a
/// string in an `int64` field is refused by every typed consumer): the
/// caller refuses the change, naming table, column and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrepresentable;

/// A value after parsing, before writing: shared by the byte writer and the
/// `serde_json::Value` builder so both always agree.
enum Mapped<'a> {
    Null,
    Bool(bool),
    Int(i64),
    /// Text already checked to be a JSON number literal.
    Number(Cow<'a, str>),
    Str(Cow<'a, str>),
    ZonedTimestamp(ZonedTimestamp),
    ZonedTime(i64),
    Interval(IntervalParts),
    Array(Vec<Mapped<'a>>),
}

impl ValueKind {
    /// Parses `text` per this kind. A value of an integer-typed temporal kind
    /// that does not parse (it is out of the field's range: the session
    /// settings make every other value parse) is [`Unrepresentable`];
    /// anything else unparseable (`NaN`/`Infinity` floats, which JSON numbers
    /// cannot hold, a type we do not know) becomes the text itself as a
    /// string.
    fn map<'a>(&self, text: &'a str) -> Result<Mapped<'a>, Unrepresentable> {
        let parsed = match self {
            ValueKind::Bool => parse_bool(text).map(Mapped::Bool),
            ValueKind::Int16 | ValueKind::Int32 | ValueKind::Int64 => (is_json_integer(text)
                && text.parse::<i64>().is_ok())
            .then_some(Mapped::Number(Cow::Borrowed(text))),
            ValueKind::Float32 | ValueKind::Float64 => parse_float(text).map(|f| match f {
                FloatText::Number(n) => Mapped::Number(n),
                FloatText::NonFinite(s) => Mapped::Str(Cow::Borrowed(s)),
            }),
            ValueKind::Money => normalize_money(text).map(|s| Mapped::Str(Cow::Owned(s))),
            ValueKind::Bytea => bytea_to_base64(text).map(|s| Mapped::Str(Cow::Owned(s))),
            ValueKind::ZonedTimestamp => parse_timestamptz(text).map(Mapped::ZonedTimestamp),
            ValueKind::MicroTimestamp => {
                return parse_timestamp(text)
                    .map(Mapped::Int)
                    .ok_or(Unrepresentable)
            }
            ValueKind::Date => {
                return parse_date(text)
                    .map(|d| Mapped::Int(i64::from(d)))
                    .ok_or(Unrepresentable)
            }
            ValueKind::MicroTime => {
                return parse_time(text).map(Mapped::Int).ok_or(Unrepresentable)
            }
            ValueKind::MicroDuration => {
                return parse_interval(text).map(Mapped::Int).ok_or(Unrepresentable)
            }
            ValueKind::ZonedTime => parse_timetz(text).map(Mapped::ZonedTime),
            ValueKind::Interval => match parse_interval_parts(text) {
                Some(Interval::Finite(parts)) => Some(Mapped::Interval(parts)),
                // `infinity`, `-infinity` (PostgreSQL 17) as they are.
                _ => None,
            },
            ValueKind::Array { element, delimiter } => match parse_array(text, *delimiter) {
                Some(nodes) => return map_nodes(element, nodes).map(Mapped::Array),
                None => None,
            },
            ValueKind::Decimal
            | ValueKind::Text
            | ValueKind::Varchar
            | ValueKind::Json
            | ValueKind::Xml
            | ValueKind::Uuid
            | ValueKind::Enum { .. } => None,
        };
        Ok(parsed.unwrap_or(Mapped::Str(Cow::Borrowed(text))))
    }

    /// Appends the JSON for `text` to `out`; nothing when the value is
    /// [`Unrepresentable`] in this kind's field.
    pub fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        self.map(text)?.write(out);
        Ok(())
    }

    /// The JSON for `text` as a `serde_json::Value`. An [`Unrepresentable`]
    /// value comes back as its text (for `oncely verify`, which compares
    /// both sides through this and must not fail on them; capture never
    /// sends it).
    pub fn to_json(&self, text: &str) -> Value {
        match self.map(text) {
            Ok(mapped) => mapped.into_value(),
            Err(Unrepresentable) => Value::String(text.to_owned()),
        }
    }

    /// Whether a column of this kind holds character data, and its declared
    /// length (`varchar(n)`, `char(n)`: `type_modifier` is n + 4), for masks.
    /// Types without a mapping of their own are written as text, so they are
    /// character data too.
    pub fn characters(&self, type_modifier: i32) -> Characters {
        match self {
            ValueKind::Text | ValueKind::Varchar => match usize::try_from(type_modifier - 4) {
                Ok(n) if type_modifier >= 4 => Characters::UpTo(n),
                _ => Characters::Unbounded,
            },
            _ => Characters::No,
        }
    }

    /// The Kafka Connect schema of a field of this kind; see
    /// [`super::field_schema`].
    pub fn field_schema(&self, type_modifier: i32, field: &str, optional: bool) -> Value {
        let mut schema = self.schema(type_modifier);
        schema.insert("optional".into(), Value::Bool(optional));
        // Connect's order: type, optional, name, version, parameters, field.
        let mut ordered = Map::new();
        for key in ["type", "items", "optional", "name", "version", "parameters"] {
            if let Some(v) = schema.remove(key) {
                ordered.insert(key.into(), v);
            }
        }
        ordered.insert("field".into(), Value::String(field.to_owned()));
        Value::Object(ordered)
    }

    fn schema(&self, type_modifier: i32) -> Map<String, Value> {
        let v = match self {
            ValueKind::Bool => json!({"type": "boolean"}),
            ValueKind::Int16 => json!({"type": "int16"}),
            ValueKind::Int32 => json!({"type": "int32"}),
            ValueKind::Int64 => json!({"type": "int64"}),
            ValueKind::Float32 => json!({"type": "float"}),
            ValueKind::Float64 => json!({"type": "double"}),
            ValueKind::Decimal => {
                let mut params = json!({"__debezium.source.column.type": "NUMERIC"});
                // atttypmod of numeric(p,s) is ((p << 16) | s) + 4.
                if type_modifier >= 4 {
                    let m = type_modifier - 4;
                    params["__debezium.source.column.length"] =
                        Value::String((m >> 16).to_string());
                    params["__debezium.source.column.scale"] =
                        Value::String((m & 0xFFFF).to_string());
                }
                json!({"type": "string", "parameters": params})
            }
            ValueKind::Money => json!({
                "type": "string",
                "parameters": {"__debezium.source.column.type": "MONEY"}
            }),
            ValueKind::Text => json!({"type": "string"}),
            // atttypmod of varchar(n) is n + 4; -1 for plain varchar.
            ValueKind::Varchar if type_modifier >= 4 => json!({
                "type": "string",
                "parameters": {
                    "__debezium.source.column.type": "VARCHAR",
                    "__debezium.source.column.length": (type_modifier - 4).to_string()
                }
            }),
            ValueKind::Varchar => json!({"type": "string"}),
            ValueKind::Json => semantic("string", "io.debezium.data.Json"),
            ValueKind::Xml => semantic("string", "io.debezium.data.Xml"),
            ValueKind::Uuid => semantic("string", "io.debezium.data.Uuid"),
            ValueKind::Enum { labels } => json!({
                "type": "string",
                "name": "io.debezium.data.Enum",
                "version": 1,
                "parameters": {"allowed": labels.join(",")}
            }),
            ValueKind::Bytea => json!({"type": "bytes"}),
            ValueKind::ZonedTimestamp => semantic("string", "io.debezium.time.ZonedTimestamp"),
            ValueKind::MicroTimestamp => semantic("int64", "io.debezium.time.MicroTimestamp"),
            ValueKind::Date => semantic("int32", "io.debezium.time.Date"),
            ValueKind::MicroTime => semantic("int64", "io.debezium.time.MicroTime"),
            ValueKind::ZonedTime => semantic("string", "io.debezium.time.ZonedTime"),
            ValueKind::MicroDuration => semantic("int64", "io.debezium.time.MicroDuration"),
            ValueKind::Interval => semantic("string", "io.debezium.time.Interval"),
            ValueKind::Array { element, .. } => {
                let mut items = element.schema(-1);
                items.insert("optional".into(), Value::Bool(true));
                json!({"type": "array", "items": Value::Object(items)})
            }
        };
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }
}

fn semantic(ty: &str, name: &str) -> Value {
    json!({"type": ty, "name": name, "version": 1})
}

fn map_nodes<'a>(
    element: &ValueKind,
    nodes: Vec<ArrayNode<'a>>,
) -> Result<Vec<Mapped<'a>>, Unrepresentable> {
    nodes
        .into_iter()
        .map(|node| match node {
            ArrayNode::Null => Ok(Mapped::Null),
            ArrayNode::Nested(inner) => map_nodes(element, inner).map(Mapped::Array),
            ArrayNode::Item(Cow::Borrowed(s)) => element.map(s),
            // Unescaped elements own their text; map and then detach.
            ArrayNode::Item(Cow::Owned(s)) => element.map(&s).map(Mapped::into_owned),
        })
        .collect()
}

impl<'a> Mapped<'a> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Mapped::Null => out.extend_from_slice(b"null"),
            Mapped::Bool(true) => out.extend_from_slice(b"true"),
            Mapped::Bool(false) => out.extend_from_slice(b"false"),
            Mapped::Int(n) => write_i64(out, *n),
            Mapped::Number(text) => out.extend_from_slice(text.as_bytes()),
            Mapped::Str(s) => write_str(out, s),
            Mapped::ZonedTimestamp(value) => {
                out.push(b'"');
                write_zoned_timestamp(out, *value);
                out.push(b'"');
            }
            Mapped::Interval(parts) => {
                out.push(b'"');
                parts.write_iso(out);
                out.push(b'"');
            }
            Mapped::ZonedTime(micros) => {
                out.push(b'"');
                write_zoned_time(out, *micros);
                out.push(b'"');
            }
            Mapped::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
        }
    }

    fn into_value(self) -> Value {
        match self {
            Mapped::Null => Value::Null,
            Mapped::Bool(b) => Value::Bool(b),
            Mapped::Int(n) => Value::from(n),
            Mapped::Number(text) => number_value(&text),
            Mapped::Str(s) => Value::String(s.into_owned()),
            Mapped::Array(items) => Value::Array(items.into_iter().map(Self::into_value).collect()),
            zoned @ (Mapped::ZonedTimestamp(_) | Mapped::ZonedTime(_) | Mapped::Interval(_)) => {
                let mut out = Vec::with_capacity(32);
                zoned.write(&mut out);
                serde_json::from_slice(&out).unwrap_or(Value::Null)
            }
        }
    }

    fn into_owned(self) -> Mapped<'static> {
        match self {
            Mapped::Null => Mapped::Null,
            Mapped::Bool(b) => Mapped::Bool(b),
            Mapped::Int(n) => Mapped::Int(n),
            Mapped::Number(text) => Mapped::Number(Cow::Owned(text.into_owned())),
            Mapped::Str(s) => Mapped::Str(Cow::Owned(s.into_owned())),
            Mapped::ZonedTimestamp(m) => Mapped::ZonedTimestamp(m),
            Mapped::ZonedTime(m) => Mapped::ZonedTime(m),
            Mapped::Interval(p) => Mapped::Interval(p),
            Mapped::Array(items) => {
                Mapped::Array(items.into_iter().map(Self::into_owned).collect())
            }
        }
    }
}

/// A validated JSON number literal as a `Value`: integers exactly, others
/// through f64.
fn number_value(text: &str) -> Value {
    if let Ok(n) = text.parse::<i64>() {
        return Value::from(n);
    }
    text.parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or_else(|| Value::String(text.to_owned()), Value::Number)
}
