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
//! Debezium's own encodings (Connect `Decimal`, millisecond times, ...) never
//! reach this module: decoding turns them into oncely's (`crate::debezium`).
//! **Limit:** arrays of semantic types (e.g. dates) go to `jsonb`.
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
        // PostgreSQL rounds a value to a `numeric(p,s)` column's scale without
        // a word; a value that does not fit exactly must be refused instead
        // (a data error, so the record is dead-lettered with this text).
        if conv == Conv::Cast && matches!(Exact::parse(actual), Some(Exact::Decimal(..))) {
            return format!(
                "(CASE WHEN ({value})::numeric = (({value})::numeric)::{actual} \
                 THEN ({value})::{actual} \
                 ELSE ('oncely: ' || ({value}) || ' does not fit {actual} without rounding')::{actual} END)"
            );
        }
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

/// A type of the exact-number family, by what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exact {
    /// `smallint`, `integer`, `bigint`: bits.
    Int(u32),
    /// `numeric(precision, scale)`.
    Decimal(u32, u32),
    /// `numeric` without modifiers: any value.
    Unbounded,
}

impl Exact {
    fn parse(t: &str) -> Option<Self> {
        Some(match t {
            "smallint" => Exact::Int(16),
            "integer" => Exact::Int(32),
            "bigint" => Exact::Int(64),
            "numeric" => Exact::Unbounded,
            _ => {
                let inner = t.strip_prefix("numeric(")?.strip_suffix(')')?;
                let (p, s) = inner.split_once(',').unwrap_or((inner, "0"));
                Exact::Decimal(p.trim().parse().ok()?, s.trim().parse().ok()?)
            }
        })
    }

    /// (digits before the point, digits after it) it holds in full.
    fn digits(self) -> Option<(u32, u32)> {
        match self {
            Exact::Int(16) => Some((5, 0)),
            Exact::Int(32) => Some((10, 0)),
            Exact::Int(_) => Some((19, 0)),
            Exact::Decimal(p, s) => Some((p.saturating_sub(s), s)),
            Exact::Unbounded => None,
        }
    }
}

/// PostgreSQL's largest `numeric` precision.
const NUMERIC_MAX_PRECISION: u32 = 1000;

/// The type an existing column of type `actual` must be altered to so that it
/// holds every value `spec` describes exactly, when `actual` is narrower in
/// the same family: integer widths, `numeric` precision and scale (an integer
/// column becomes a `numeric` wide enough for both), `varchar` length and
/// `varchar` to `text`. `None` when `actual` already holds them, or when the
/// types are of different families (then [`compatible`] decides). Inferred
/// specs (schemas off) never widen: a JSON value says nothing of its type.
pub fn widened(spec: &ColumnSpec, actual: &str) -> Option<String> {
    if spec.inferred || spec.ddl == actual {
        return None;
    }
    if let (Some(have), Some(want)) = (Exact::parse(actual), Exact::parse(&spec.ddl)) {
        return match (have, want) {
            (Exact::Unbounded, _) => None,
            (Exact::Int(a), Exact::Int(b)) => (b > a).then(|| spec.ddl.to_string()),
            (_, Exact::Unbounded) => Some("numeric".to_owned()),
            _ => {
                let (have_int, have_scale) = have.digits()?;
                let (want_int, want_scale) = want.digits()?;
                let (int, scale) = (have_int.max(want_int), have_scale.max(want_scale));
                if int == have_int && scale == have_scale {
                    None
                } else if int + scale > NUMERIC_MAX_PRECISION {
                    Some("numeric".to_owned())
                } else {
                    Some(format!("numeric({},{scale})", int + scale))
                }
            }
        };
    }
    let varchar_length = |t: &str| -> Option<u32> {
        t.strip_prefix("character varying(")?
            .strip_suffix(')')?
            .parse()
            .ok()
    };
    // `character(n)` is left alone: its cast to text drops trailing blanks.
    let have = varchar_length(actual)?;
    match varchar_length(&spec.ddl) {
        Some(want) => (want > have).then(|| spec.ddl.to_string()),
        None if matches!(spec.ddl.as_ref(), "text" | "character varying") => {
            Some("text".to_owned())
        }
        None => None,
    }
}

/// The spec holding the values of both `a` and `b` (rows of one batch may
/// come from before and after a type change): the wider one, or `a` when
/// neither widens the other.
pub fn wider(a: &ColumnSpec, b: &ColumnSpec) -> ColumnSpec {
    match widened(b, &a.ddl) {
        Some(ddl) => ColumnSpec {
            ddl: ddl.into(),
            conv: b.conv,
            inferred: false,
        },
        None => a.clone(),
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
    if ty == "string" && source_type == "VARCHAR" {
        let length = param("__debezium.source.column.length").and_then(|s| s.parse::<u32>().ok());
        return match length {
            Some(n) if (1..=10_485_760).contains(&n) => {
                ColumnSpec::new(format!("character varying({n})"), Conv::Cast)
            }
            _ => ColumnSpec::new("text", Conv::Cast),
        };
    }
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
    fn wider_events_widen_columns_of_their_family() {
        let spec = |ty: &str| ColumnSpec::new(ty.to_owned(), Conv::Cast);
        let cases = [
            ("integer", "bigint", Some("bigint")),
            ("smallint", "integer", Some("integer")),
            ("bigint", "integer", None),
            ("integer", "integer", None),
            ("numeric(10,2)", "numeric(12,4)", Some("numeric(12,4)")),
            // More digits before the point and more after it than either.
            ("numeric(10,2)", "numeric(9,4)", Some("numeric(12,4)")),
            ("numeric(12,4)", "numeric(10,2)", None),
            ("numeric(10,2)", "numeric", Some("numeric")),
            ("numeric", "numeric(10,2)", None),
            ("integer", "numeric(12,4)", Some("numeric(14,4)")),
            ("numeric(5,2)", "bigint", Some("numeric(21,2)")),
            ("numeric(30,0)", "bigint", None),
            (
                "character varying(10)",
                "character varying(20)",
                Some("character varying(20)"),
            ),
            ("character varying(20)", "character varying(10)", None),
            ("character varying(10)", "text", Some("text")),
            ("character(5)", "text", None),
            ("text", "character varying(5)", None),
            ("integer", "text", None),
            ("timestamp with time zone", "date", None),
        ];
        for (actual, event, want) in cases {
            assert_eq!(
                widened(&spec(event), actual).as_deref(),
                want,
                "{actual} <- {event}"
            );
            if let Some(to) = want {
                // What it widens to takes both.
                assert!(compatible(&spec(event), to).is_ok(), "{event} into {to}");
                assert!(widened(&spec(event), to).is_none(), "{event} into {to}");
            }
        }
        // Schemaless integers never widen: their width is unknown.
        assert_eq!(widened(&infer(&json!(1)).expect("spec"), "integer"), None);
        // Rows before and after a change in one batch: the spec holding both.
        assert_eq!(
            wider(&spec("numeric(10,2)"), &spec("numeric(9,4)")).ddl,
            "numeric(12,4)"
        );
        assert_eq!(wider(&spec("bigint"), &spec("integer")).ddl, "bigint");
        let varchar = from_schema(&json!({"type": "string", "parameters": {
            "__debezium.source.column.type": "VARCHAR", "__debezium.source.column.length": "20"}}));
        assert_eq!(varchar.ddl, "character varying(20)");
    }

    #[test]
    fn numeric_columns_refuse_values_they_would_round() {
        let spec = ColumnSpec::new("numeric(10,2)", Conv::Cast);
        let expr = spec.select_expr("u.c0", "numeric(10,2)");
        assert!(
            expr.contains("does not fit numeric(10,2) without rounding"),
            "{expr}"
        );
        assert_eq!(
            ColumnSpec::new("numeric", Conv::Cast).select_expr("u.c0", "numeric"),
            "(u.c0)::numeric"
        );
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
