//! Debezium's encodings, normalized to oncely's wire form.
//!
//! A topic written by a real Debezium PostgreSQL connector carries some
//! columns in encodings oncely's capture never uses (`decimal.handling.mode`,
//! `time.precision.mode`, `binary.handling.mode` and the structs Debezium
//! builds). Each is turned here, field by field, into the form oncely's own
//! capture sends for the same PostgreSQL type (docs/design.md, "Wire
//! format"), schema included, so the sinks, their type mapping and `oncely
//! verify` need no per-encoding code:
//!
//! | Debezium sends | becomes |
//! | --- | --- |
//! | `org.apache.kafka.connect.data.Decimal` (base64 two's-complement unscaled value, `scale` parameter) | the exact decimal string, schema `string` with `__debezium.source.column.*` NUMERIC precision and scale |
//! | `io.debezium.data.VariableScaleDecimal` (struct `scale` + `value` bytes) | the exact decimal string (unbounded `numeric`) |
//! | `io.debezium.time.Time`, `org.apache.kafka.connect.data.Time` (ms), `io.debezium.time.NanoTime` | `io.debezium.time.MicroTime` (µs) |
//! | `io.debezium.time.Timestamp`, `org.apache.kafka.connect.data.Timestamp` (ms), `io.debezium.time.NanoTimestamp` | `io.debezium.time.MicroTimestamp` (µs) |
//! | `org.apache.kafka.connect.data.Date` | `io.debezium.time.Date` (same days) |
//! | `io.debezium.time.ZonedTimestamp`, `ZonedTime` with 0..9 fraction digits | exactly six fraction digits, as capture writes them |
//! | `org.apache.kafka.connect.data.Decimal` of scale 0 without a precision (MySQL's `BIGINT UNSIGNED`, `bigint.unsigned.handling.mode = precise`) | the decimal string, precision 20 (`numeric(20,0)`) |
//! | `io.debezium.data.Bits` (little-endian bytes, `length` parameter) | the bit string (`10101010`), schema `string` with `__debezium.source.column.type` `BIT`, `length` kept |
//! | `io.debezium.data.geometry.Point` (struct `x`, `y`, `wkb`, `srid`) | PostgreSQL's `point` text `(x,y)` |
//! | `__debezium_unavailable_value` as bytes, or as base64 or hex text in a `bytea` column | the marker itself |
//! | arrays of any of these | arrays of the normalized elements |
//!
//! Everything else (`Date`, `MicroTime`, `MicroTimestamp`, `MicroDuration`,
//! `Interval`, `Json`, `Xml`, `Uuid`, `Enum`, numbers, text, decimal strings
//! and doubles) is already oncely's form and passes untouched. So does a
//! `bytea` column under `binary.handling.mode=base64` or `hex`: a `string`
//! whose text is Debezium's encoding, and nothing in the record says which
//! of the two (`00ff` is both), so it stays text rather than risk wrong bytes.
//!
//! **Only Debezium-written events are looked at** (no `source.commit_lsn`:
//! [`crate::VersionOrigin::is_debezium`]), and with schemas on only the fields
//! whose schema needs it: the plan is built once per schema text and cached
//! with it, so oncely's own topics pay nothing and a Debezium topic pays one
//! pass over its few converted fields.
//!
//! **Bounded.** Scales, unscaled values and bit lengths are checked against
//! what PostgreSQL and the value's own bytes can hold, and a record's
//! converted values together against its [`Budget`], before anything is
//! built: a value beyond them is the record's dead letter (see `values`).
//!
//! **Schemas off.** What the value itself shows is recovered: the structs
//! (`VariableScaleDecimal`, `Point`, in arrays too) and the binary
//! unavailable marker. A base64 `Decimal` cannot be told from text without
//! its schema, so such events are dead letters ([`refuse_schemaless`]) until
//! the runner is told the connector sends string decimals
//! (`debezium.schemaless.accept`; docs/debezium.md).

use std::cell::RefCell;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{Map, Value};

use crate::event::{ChangeEvent, DecodeError};

use oncely_core::wire::UNAVAILABLE_VALUE as UNAVAILABLE;
/// [`UNAVAILABLE`] as Debezium writes it in a `bytes` column (base64 of its bytes).
const UNAVAILABLE_BASE64: &str = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==";
/// [`UNAVAILABLE`] in a `bytea` column under `binary.handling.mode=hex`.
const UNAVAILABLE_HEX: &str = "5f5f646562657a69756d5f756e617661696c61626c655f76616c7565";

/// Digits of the largest `BIGINT UNSIGNED` (18446744073709551615).
const UNSIGNED_BIGINT_DIGITS: &str = "20";

/// How one field's value is turned into oncely's form.
#[derive(Debug, Clone, PartialEq)]
enum Conv {
    /// Base64 two's-complement unscaled value with a fixed scale.
    Decimal { scale: i32 },
    /// `{"scale": s, "value": base64}`.
    VariableScaleDecimal,
    /// Integer times this factor (ms -> µs).
    Multiply(i64),
    /// Integer divided by this divisor, rounding down (ns -> µs).
    Divide(i64),
    /// ISO-8601 text whose fraction gets exactly six digits.
    SixDigitFraction,
    /// Little-endian bytes -> bit string of `length` bits (`None`: as many as needed).
    Bits { length: Option<u32> },
    /// `{"x", "y", ...}` -> `(x,y)`.
    Point,
    /// A `bytes` column, or a `bytea` one sent as base64 or hex text: only
    /// the marker's binary forms change.
    Bytes,
    /// Each element of an array.
    Array(Box<Conv>),
}

/// What a value schema needs: the converted fields and the schema the event
/// carries afterwards.
#[derive(Debug)]
pub(crate) struct Plan {
    /// `(field, conversion)` of the row struct's fields that need one.
    fields: Vec<(String, Conv)>,
    /// The envelope schema with those fields described as oncely describes them.
    pub(crate) schema: Arc<Value>,
}

/// Plans recently built on this thread, by the schema they were built from.
const PLAN_CACHE: usize = 64;

/// A schema and its plan (`None`: nothing to convert).
type CachedPlan = (Arc<Value>, Option<Arc<Plan>>);

thread_local! {
    static PLANS: RefCell<Vec<CachedPlan>> = const { RefCell::new(Vec::new()) };
}

/// Where a schema's columns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// A change-event envelope: the columns are the `before` and `after` structs.
    Envelope,
    /// A record key: the struct's own fields are the key columns.
    Key,
}

/// The plan of `schema` (`None` when no field needs converting), built once
/// per shared schema (a schema is always read with the same layout).
pub(crate) fn plan_for(schema: &Arc<Value>, layout: Layout) -> Option<Arc<Plan>> {
    PLANS.with(|cell| {
        let mut cache = cell.borrow_mut();
        if let Some((_, plan)) = cache.iter().find(|(s, _)| Arc::ptr_eq(s, schema)) {
            return plan.clone();
        }
        let plan = build_plan(schema, layout).map(Arc::new);
        if cache.len() == PLAN_CACHE {
            cache.remove(0);
        }
        cache.push((schema.clone(), plan.clone()));
        plan
    })
}

fn build_plan(schema: &Value, layout: Layout) -> Option<Plan> {
    let mut rewritten = schema.clone();
    let mut fields: Vec<(String, Conv)> = Vec::new();
    let structs: Vec<&mut Value> = match layout {
        Layout::Key => vec![&mut rewritten],
        Layout::Envelope => rewritten
            .get_mut("fields")?
            .as_array_mut()?
            .iter_mut()
            .filter(|f| {
                matches!(
                    f.get("field").and_then(Value::as_str),
                    Some("before" | "after")
                )
            })
            .collect(),
    };
    for image in structs {
        let Some(columns) = image.get_mut("fields").and_then(Value::as_array_mut) else {
            continue;
        };
        for column in columns {
            let Some(name) = column
                .get("field")
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                continue;
            };
            if let Some(conv) = rewrite(column) {
                if !fields.iter().any(|(f, _)| *f == name) {
                    fields.push((name, conv));
                }
            }
        }
    }
    (!fields.is_empty()).then(|| Plan {
        fields,
        schema: Arc::new(rewritten),
    })
}

/// The conversion a field schema needs, rewriting the schema to oncely's
/// description of the converted value; `None` when it needs none.
fn rewrite(field: &mut Value) -> Option<Conv> {
    let ty = field.get("type").and_then(Value::as_str).unwrap_or("");
    let name = field.get("name").and_then(Value::as_str).unwrap_or("");
    let param = |k: &str| {
        field
            .get("parameters")
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
    };
    let (conv, rename): (Conv, Option<(&str, Option<&str>)>) = match name {
        "org.apache.kafka.connect.data.Decimal" => {
            let scale = param("scale").and_then(|s| s.parse().ok()).unwrap_or(0);
            // Debezium's MySQL connector writes `BIGINT UNSIGNED` under
            // `bigint.unsigned.handling.mode = precise` as a Decimal of scale 0
            // without a precision (its DECIMAL columns always carry one): 20
            // digits hold every value up to 2^64-1.
            let precision = param("connect.decimal.precision")
                .map(str::to_owned)
                .or_else(|| (scale == 0).then(|| UNSIGNED_BIGINT_DIGITS.to_owned()));
            let params = field
                .as_object_mut()?
                .entry("parameters")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(p) = params.as_object_mut() {
                p.remove("scale");
                p.remove("connect.decimal.precision");
                p.entry("__debezium.source.column.type")
                    .or_insert_with(|| "NUMERIC".into());
                if let Some(precision) = precision {
                    p.entry("__debezium.source.column.length")
                        .or_insert(Value::String(precision));
                    p.entry("__debezium.source.column.scale")
                        .or_insert_with(|| Value::String(scale.to_string()));
                }
            }
            (Conv::Decimal { scale }, Some(("string", None)))
        }
        "io.debezium.data.VariableScaleDecimal" => {
            let params = field
                .as_object_mut()?
                .entry("parameters")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(p) = params.as_object_mut() {
                p.entry("__debezium.source.column.type")
                    .or_insert_with(|| "NUMERIC".into());
            }
            if let Some(f) = field.as_object_mut() {
                f.remove("fields");
                f.remove("doc");
            }
            (Conv::VariableScaleDecimal, Some(("string", None)))
        }
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => (
            Conv::Multiply(1000),
            Some(("int64", Some("io.debezium.time.MicroTime"))),
        ),
        "io.debezium.time.NanoTime" => (
            Conv::Divide(1000),
            Some(("int64", Some("io.debezium.time.MicroTime"))),
        ),
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => (
            Conv::Multiply(1000),
            Some(("int64", Some("io.debezium.time.MicroTimestamp"))),
        ),
        "io.debezium.time.NanoTimestamp" => (
            Conv::Divide(1000),
            Some(("int64", Some("io.debezium.time.MicroTimestamp"))),
        ),
        "org.apache.kafka.connect.data.Date" => {
            set_name(field, "int32", Some("io.debezium.time.Date"));
            return None;
        }
        "io.debezium.time.ZonedTimestamp" | "io.debezium.time.ZonedTime" => {
            (Conv::SixDigitFraction, None)
        }
        "io.debezium.data.Bits" => {
            let length = param("length")
                .and_then(|s| s.parse::<u32>().ok())
                .filter(|n| *n < i32::MAX as u32);
            // The bit string is text on the wire: the source type says what
            // it is, as for decimals (the warehouse makes it `bit varying(n)`).
            let params = field
                .as_object_mut()?
                .entry("parameters")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(p) = params.as_object_mut() {
                p.entry("__debezium.source.column.type")
                    .or_insert_with(|| "BIT".into());
            }
            (Conv::Bits { length }, Some(("string", None)))
        }
        "io.debezium.data.geometry.Point" => {
            if let Some(f) = field.as_object_mut() {
                f.remove("fields");
                f.remove("doc");
            }
            (Conv::Point, Some(("string", None)))
        }
        _ if ty == "bytes" => (Conv::Bytes, None),
        _ if ty == "string" && param("__debezium.source.column.type") == Some("BYTEA") => {
            (Conv::Bytes, None)
        }
        _ if ty == "array" => {
            let items = field.get_mut("items")?;
            let conv = rewrite(items)?;
            return Some(Conv::Array(Box::new(conv)));
        }
        _ => return None,
    };
    if let Some((ty, name)) = rename {
        set_name(field, ty, name);
    }
    Some(conv)
}

/// Sets a field schema's type and semantic name (`None`: no name).
fn set_name(field: &mut Value, ty: &str, name: Option<&str>) {
    let Some(f) = field.as_object_mut() else {
        return;
    };
    f.insert("type".into(), Value::String(ty.to_owned()));
    match name {
        Some(n) => {
            f.insert("name".into(), Value::String(n.to_owned()));
            f.insert("version".into(), Value::from(1));
        }
        None => {
            f.remove("name");
            f.remove("version");
        }
    }
}

/// Whether a key schema's text names an encoding [`plan_for`] converts: keys
/// are small and mostly plain integers or text, so they are only parsed
/// further when it does.
pub(crate) fn key_may_need_normalizing(schema: &str) -> bool {
    [
        "Decimal",
        "Time",
        "Bits",
        "geometry.Point",
        "\"bytes\"",
        "BYTEA",
    ]
    .iter()
    .any(|hint| schema.contains(hint))
}

/// One column of a Debezium connector's topic as the sinks hold it: its
/// Connect field schema and values turned into oncely's wire form by the
/// same rules the runner applies to each record (the table above).
/// `oncely verify` reads a MySQL source through Debezium's MySQL mapping
/// and compares through this, so that it compares what the sinks wrote.
#[derive(Debug, Clone)]
pub struct DebeziumColumn {
    conv: Option<Conv>,
    /// The field schema as the sinks hold it.
    pub schema: Value,
}

impl DebeziumColumn {
    /// The column of Connect field schema `field`.
    pub fn new(field: &Value) -> Self {
        let mut schema = field.clone();
        let conv = rewrite(&mut schema);
        Self { conv, schema }
    }

    /// `value` in the sinks' form; an error where the runner dead-letters it.
    pub fn convert(&self, value: &mut Value) -> Result<(), String> {
        match &self.conv {
            Some(conv) if !value.is_null() => {
                let bytes = value.to_string().len();
                values::convert(conv, value, &mut Budget::for_record(bytes))
            }
            _ => Ok(()),
        }
    }
}

/// The dead letter for a change a real Debezium connector wrote without
/// schemas, unless the runner accepts them (`debezium.schemaless.accept`):
/// under Debezium's default `decimal.handling.mode=precise` a `numeric`
/// column is base64 text, which no sink can tell from a text column, so it
/// would be stored as that text. The reason names the columns whose values
/// look like such decimals (short base64), and the settings to change.
pub fn refuse_schemaless(event: &ChangeEvent) -> Option<DecodeError> {
    if event.schema.is_some() || !event.version_origin.is_debezium() {
        return None;
    }
    let row = event.after.as_ref().or(event.before.as_ref());
    let suspects: Vec<&str> = row
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_str().is_some_and(looks_like_decimal_bytes))
        .map(|(c, _)| c.as_str())
        .collect();
    let columns = if suspects.is_empty() {
        String::new()
    } else {
        format!(
            " (columns that may hold such decimals: {})",
            suspects.join(", ")
        )
    };
    Some(DecodeError {
        part: "value",
        reason: format!(
            "a Debezium change event without its schema: under Debezium's default \
             decimal.handling.mode=precise a numeric column is base64 text that cannot be \
             told from text{columns}; set decimal.handling.mode=string on the connector and \
             debezium.schemaless.accept = true in the sink, or enable schemas \
             (value.converter.schemas.enable=true)"
        ),
    })
}

/// Short canonical base64, as a `Decimal`'s unscaled bytes are.
fn looks_like_decimal_bytes(s: &str) -> bool {
    (4..=24).contains(&s.len()) && s.len().is_multiple_of(4) && BASE64.decode(s).is_ok()
}

/// Applies `plan` to a row image, the converted values charged to `budget`.
pub(crate) fn apply(
    plan: &Plan,
    row: &mut Map<String, Value>,
    budget: &mut Budget,
) -> Result<(), DecodeError> {
    for (field, conv) in &plan.fields {
        if let Some(value) = row.get_mut(field) {
            convert(conv, value, budget).map_err(|reason| DecodeError {
                part: "value",
                reason: format!("column `{field}`: {reason}"),
            })?;
        }
    }
    Ok(())
}

/// Recovers what a Debezium row image written without schemas shows by
/// itself: `VariableScaleDecimal` and `Point` structs (also in arrays) and
/// the binary forms of the unavailable marker.
pub(crate) fn recover_schemaless(
    row: &mut Map<String, Value>,
    budget: &mut Budget,
) -> Result<(), DecodeError> {
    for (field, value) in row.iter_mut() {
        recover_value(value, budget).map_err(|reason| DecodeError {
            part: "value",
            reason: format!("column `{field}`: {reason}"),
        })?;
    }
    Ok(())
}

fn recover_value(value: &mut Value, budget: &mut Budget) -> Result<(), String> {
    match value {
        Value::String(s) if s == UNAVAILABLE_BASE64 || s == UNAVAILABLE_HEX => {
            *value = Value::String(UNAVAILABLE.to_owned());
        }
        Value::Object(o) if is_variable_scale_decimal(o) => {
            convert(&Conv::VariableScaleDecimal, value, budget)?
        }
        Value::Object(o) if is_point(o) => convert(&Conv::Point, value, budget)?,
        Value::Array(items) => {
            for item in items {
                recover_value(item, budget)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn is_variable_scale_decimal(o: &Map<String, Value>) -> bool {
    o.len() == 2
        && o.get("scale").is_some_and(Value::is_i64)
        && o.get("value").is_some_and(Value::is_string)
}

fn is_point(o: &Map<String, Value>) -> bool {
    o.len() == 4
        && o.get("x").is_some_and(Value::is_number)
        && o.get("y").is_some_and(Value::is_number)
        && o.contains_key("wkb")
        && o.contains_key("srid")
}

mod values;

use values::convert;
pub use values::{
    decimal_text, Budget, MAX_DECIMAL_BYTES, MAX_NUMERIC_DIGITS, MAX_NUMERIC_SCALE,
    MIN_NUMERIC_SCALE,
};

#[cfg(test)]
mod tests;
