//! From event columns to PostgreSQL columns: the type a new column gets, whether an
//! existing column accepts a value, and how a JSON value becomes SQL.
//!
//! With schemas on, the Connect type and Debezium semantic name decide
//! (`io.debezium.time.ZonedTimestamp` -> `timestamptz`, `MicroTimestamp` ->
//! `timestamp`, `Date` -> `date`, decimal strings with
//! `__debezium.source.column.*` parameters -> `numeric(p,s)`, ...). With schemas
//! off the type is inferred from the JSON value (integer -> `bigint`, other
//! numbers -> `double precision`, string -> `text`, array/object -> `jsonb`),
//! so an epoch-micros timestamp lands as `bigint`: enable schemas for typed targets.
//!
//! **Limits:** Connect `Decimal` as base64 bytes (Debezium's default
//! `decimal.handling.mode=precise`) is stored as `bytea`, not `numeric`; use
//! string decimals (oncely's default). Arrays of semantic types (e.g. dates) go to `jsonb`.
//!
//! Every value travels as text in one `text[]` parameter per column and is
//! converted in SQL ([`ColumnSpec::select_expr`]), so a batch is one statement
//! whatever the column types.

use std::borrow::Cow;

use std::collections::HashMap;

use serde_json::Value;

/// How a text value is turned into the column's value in SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Conv {
    /// A plain cast from the text form.
    Cast,
    /// Integer microseconds since the epoch (or `infinity`) -> timestamp.
    EpochMicros,
    /// Integer milliseconds since the epoch -> timestamp.
    EpochMillis,
    /// Integer nanoseconds since the epoch -> timestamp.
    EpochNanos,
    /// Integer days since the epoch (or `infinity`) -> date.
    EpochDays,
    /// Integer microseconds since midnight -> time.
    MicrosOfDay,
    /// Integer milliseconds since midnight -> time.
    MillisOfDay,
    /// Integer microseconds -> interval.
    Micros,
    /// Base64 text -> bytea.
    Base64,
}

/// A column as the events describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    /// The type a new column is created with, e.g. `numeric(12,2)`.
    pub ddl: Cow<'static, str>,
    /// How values are converted.
    pub conv: Conv,
    /// True when inferred from a JSON value (schemas off): compatibility is lenient.
    pub inferred: bool,
}

impl ColumnSpec {
    fn new(ddl: impl Into<Cow<'static, str>>, conv: Conv) -> Self {
        Self {
            ddl: ddl.into(),
            conv,
            inferred: false,
        }
    }

    /// The SQL expression turning text `v` into a value of the existing column type `actual`.
    pub fn select_expr(&self, v: &str, actual: &str) -> String {
        let conv = if is_text(actual) {
            Conv::Cast
        } else {
            self.conv
        };
        let int = format!("{v} ~ '^-?[0-9]+$'");
        let value = match conv {
            Conv::Cast => v.to_owned(),
            Conv::EpochMicros => format!("CASE WHEN {int} THEN 'epoch'::timestamp + {v}::bigint * interval '1 microsecond' ELSE {v}::timestamp END"),
            Conv::EpochMillis => format!("CASE WHEN {int} THEN 'epoch'::timestamp + {v}::bigint * interval '1 millisecond' ELSE {v}::timestamp END"),
            Conv::EpochNanos => format!("CASE WHEN {int} THEN 'epoch'::timestamp + ({v}::bigint / 1000) * interval '1 microsecond' ELSE {v}::timestamp END"),
            Conv::EpochDays => format!("CASE WHEN {int} THEN 'epoch'::date + {v}::integer ELSE {v}::date END"),
            Conv::MicrosOfDay => format!("'00:00'::time + {v}::bigint * interval '1 microsecond'"),
            Conv::MillisOfDay => format!("'00:00'::time + {v}::bigint * interval '1 millisecond'"),
            Conv::Micros => format!("{v}::bigint * interval '1 microsecond'"),
            Conv::Base64 => format!("decode({v}, 'base64')"),
        };
        format!("({value})::{actual}")
    }
}

/// The base name of a type as `format_type` prints it, without modifiers: `numeric(12,2)` -> `numeric`.
pub fn base_type(t: &str) -> String {
    match t.find('(') {
        Some(i) => {
            let tail = t[i..].find(')').map_or("", |j| &t[i + j + 1..]);
            format!("{}{}", t[..i].trim_end(), tail)
        }
        None => t.to_owned(),
    }
}

fn is_text(actual: &str) -> bool {
    matches!(
        base_type(actual).as_str(),
        "text" | "character varying" | "character"
    )
}

/// Canonical `format_type` spelling of the DDL names this module produces.
pub fn canonical(ddl: &str) -> String {
    let base = base_type(ddl);
    let mapped = match base.as_str() {
        "timestamptz" => "timestamp with time zone",
        "timestamp" => "timestamp without time zone",
        "timetz" => "time with time zone",
        "time" => "time without time zone",
        other => other,
    };
    mapped.to_owned()
}

/// Whether an existing column of type `actual` accepts values described by `spec`;
/// `Err` explains the conflict.
pub fn compatible(spec: &ColumnSpec, actual: &str) -> Result<(), String> {
    if spec.ddl == actual {
        return Ok(());
    }
    let want = canonical(&spec.ddl);
    let have = base_type(actual);
    let numeric = |t: &str| {
        matches!(
            t,
            "smallint" | "integer" | "bigint" | "real" | "double precision" | "numeric"
        )
    };
    let ok = want == have
        || is_text(actual)
        || (spec.inferred && want == "text")
        || (spec.inferred && want == "jsonb" && (have == "json" || have.ends_with("[]")))
        // A JSON integer says nothing of its width: inferred, it fits any
        // integer column (a value out of range is an error, never rounded).
        || (spec.inferred && want == "bigint" && matches!(have.as_str(), "smallint" | "integer"))
        || match have.as_str() {
            "bigint" => matches!(want.as_str(), "smallint" | "integer"),
            "integer" => want == "smallint",
            "real" | "double precision" | "numeric" => numeric(&want),
            _ => false,
        };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "type conflict: the target column is {actual} but the event carries {}",
            spec.ddl
        ))
    }
}

/// The spec of one field of a Connect `struct` schema.
pub fn from_schema(field: &Value) -> ColumnSpec {
    let ty = field.get("type").and_then(Value::as_str).unwrap_or("");
    let name = field.get("name").and_then(Value::as_str).unwrap_or("");
    let param = |k: &str| {
        field
            .get("parameters")
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
    };
    match name {
        "io.debezium.time.ZonedTimestamp" => return ColumnSpec::new("timestamptz", Conv::Cast),
        "io.debezium.time.MicroTimestamp" => {
            return ColumnSpec::new("timestamp", Conv::EpochMicros)
        }
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            return ColumnSpec::new("timestamp", Conv::EpochMillis)
        }
        "io.debezium.time.NanoTimestamp" => return ColumnSpec::new("timestamp", Conv::EpochNanos),
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            return ColumnSpec::new("date", Conv::EpochDays)
        }
        "io.debezium.time.MicroTime" => return ColumnSpec::new("time", Conv::MicrosOfDay),
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => {
            return ColumnSpec::new("time", Conv::MillisOfDay)
        }
        "io.debezium.time.ZonedTime" => return ColumnSpec::new("timetz", Conv::Cast),
        "io.debezium.time.MicroDuration" => return ColumnSpec::new("interval", Conv::Micros),
        "io.debezium.data.Json" => return ColumnSpec::new("jsonb", Conv::Cast),
        "io.debezium.data.Uuid" => return ColumnSpec::new("uuid", Conv::Cast),
        _ => {}
    }
    let source_type = param("__debezium.source.column.type").unwrap_or("");
    if ty == "string" && matches!(source_type, "NUMERIC" | "DECIMAL" | "MONEY") {
        let precision =
            param("__debezium.source.column.length").and_then(|s| s.parse::<u32>().ok());
        let scale = param("__debezium.source.column.scale").and_then(|s| s.parse::<u32>().ok());
        return match (precision, scale) {
            (Some(p), Some(s)) if (1..=1000).contains(&p) && s <= p => {
                ColumnSpec::new(format!("numeric({p},{s})"), Conv::Cast)
            }
            _ => ColumnSpec::new("numeric", Conv::Cast),
        };
    }
    match ty {
        "boolean" => ColumnSpec::new("boolean", Conv::Cast),
        "int8" | "int16" => ColumnSpec::new("smallint", Conv::Cast),
        "int32" => ColumnSpec::new("integer", Conv::Cast),
        "int64" => ColumnSpec::new("bigint", Conv::Cast),
        "float" | "float32" => ColumnSpec::new("real", Conv::Cast),
        "double" | "float64" => ColumnSpec::new("double precision", Conv::Cast),
        "bytes" => ColumnSpec::new("bytea", Conv::Base64),
        "array" => match field.get("items").map(from_schema) {
            Some(item) if item.conv == Conv::Cast && !item.ddl.ends_with("[]") => {
                ColumnSpec::new(format!("{}[]", item.ddl), Conv::Cast)
            }
            _ => ColumnSpec::new("jsonb", Conv::Cast),
        },
        "struct" | "map" => ColumnSpec::new("jsonb", Conv::Cast),
        _ => ColumnSpec::new("text", Conv::Cast),
    }
}

/// The spec inferred from a JSON value (schemas off); `None` for null (type unknown yet).
pub fn infer(value: &Value) -> Option<ColumnSpec> {
    let ddl: &'static str = match value {
        Value::Null => return None,
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "bigint",
        Value::Number(_) => "double precision",
        Value::String(_) => "text",
        Value::Array(_) | Value::Object(_) => "jsonb",
    };
    Some(ColumnSpec {
        ddl: Cow::Borrowed(ddl),
        conv: Conv::Cast,
        inferred: true,
    })
}

/// The fields of the `after` (or `before`) row struct in a value schema, by column name.
pub fn row_fields(schema: Option<&Value>) -> Option<HashMap<&str, &Value>> {
    let fields = schema?.get("fields")?.as_array()?;
    let named = |name: &str| {
        fields
            .iter()
            .find(|f| f.get("field").and_then(Value::as_str) == Some(name))
    };
    let row = named("after").or_else(|| named("before"))?;
    Some(
        row.get("fields")?
            .as_array()?
            .iter()
            .filter_map(|f| Some((f.get("field")?.as_str()?, f)))
            .collect(),
    )
}

/// The text a JSON value is sent as, for a column of type `actual`; `None` for SQL NULL.
pub fn to_text<'v>(value: &'v Value, actual: &str) -> Option<Cow<'v, str>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        Value::Array(items) if actual.ends_with("[]") => {
            let mut out = String::from("{");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match item {
                    Value::Null => out.push_str("NULL"),
                    Value::Array(_) => out.push_str(&to_text(item, actual).unwrap_or_default()),
                    other => {
                        let text = match other {
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        };
                        out.push('"');
                        out.push_str(&text.replace('\\', "\\\\").replace('"', "\\\""));
                        out.push('"');
                    }
                }
            }
            out.push('}');
            Some(Cow::Owned(out))
        }
        other => Some(Cow::Owned(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn connect_schemas_map_to_warehouse_types() {
        let cases = [
            (
                json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}),
                "timestamptz",
            ),
            (
                json!({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}),
                "timestamp",
            ),
            (
                json!({"type": "int32", "name": "io.debezium.time.Date"}),
                "date",
            ),
            (
                json!({"type": "int64", "name": "io.debezium.time.MicroDuration"}),
                "interval",
            ),
            (
                json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC",
                "__debezium.source.column.length": "12", "__debezium.source.column.scale": "2"}}),
                "numeric(12,2)",
            ),
            (
                json!({"type": "string", "parameters": {"__debezium.source.column.type": "MONEY"}}),
                "numeric",
            ),
            (json!({"type": "int64"}), "bigint"),
            (json!({"type": "int16"}), "smallint"),
            (json!({"type": "double"}), "double precision"),
            (json!({"type": "bytes"}), "bytea"),
            (
                json!({"type": "string", "name": "io.debezium.data.Json"}),
                "jsonb",
            ),
            (
                json!({"type": "array", "items": {"type": "int32"}}),
                "integer[]",
            ),
            (
                json!({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}),
                "jsonb",
            ),
            (json!({"type": "string"}), "text"),
        ];
        for (schema, ddl) in cases {
            assert_eq!(from_schema(&schema).ddl, ddl, "{schema}");
        }
    }

    #[test]
    fn compatibility_widens_but_never_narrows() {
        let bigint = from_schema(&json!({"type": "int64"}));
        assert!(compatible(&bigint, "bigint").is_ok());
        assert!(compatible(&bigint, "numeric(20,0)").is_ok());
        assert!(compatible(&bigint, "text").is_ok());
        let e = compatible(&bigint, "integer").expect_err("narrowing");
        assert!(e.contains("integer") && e.contains("bigint"), "{e}");
        let ts = from_schema(&json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}));
        assert!(compatible(&ts, "timestamp with time zone").is_ok());
        assert!(compatible(&ts, "date").is_err());
        let dec = from_schema(
            &json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC",
            "__debezium.source.column.length": "12", "__debezium.source.column.scale": "2"}}),
        );
        assert!(compatible(&dec, "numeric(10,2)").is_ok());
        let inferred_text = infer(&json!("x")).expect("spec");
        assert!(compatible(&inferred_text, "timestamp with time zone").is_ok());
        assert!(compatible(&infer(&json!(1.5)).expect("spec"), "bigint").is_err());
        // A JSON integer without a schema fits any integer column; a JSON
        // fraction never goes into one.
        let inferred_int = infer(&json!(7)).expect("spec");
        assert!(compatible(&inferred_int, "integer").is_ok());
        assert!(compatible(&inferred_int, "smallint").is_ok());
        assert!(compatible(&infer(&json!(1.5)).expect("spec"), "integer").is_err());
    }

    #[test]
    fn values_become_text() {
        assert_eq!(to_text(&json!(null), "text"), None);
        assert_eq!(to_text(&json!(12), "bigint").as_deref(), Some("12"));
        assert_eq!(
            to_text(&json!(["a,b", "x\"y", null]), "text[]").as_deref(),
            Some(r#"{"a,b","x\"y",NULL}"#)
        );
        assert_eq!(to_text(&json!([1, 2]), "jsonb").as_deref(), Some("[1,2]"));
        assert_eq!(
            to_text(&json!({"a": 1}), "jsonb").as_deref(),
            Some(r#"{"a":1}"#)
        );
        assert_eq!(base_type("numeric(12,2)"), "numeric");
        assert_eq!(base_type("character varying(5)[]"), "character varying[]");
        assert_eq!(canonical("timestamptz"), "timestamp with time zone");
    }
}
