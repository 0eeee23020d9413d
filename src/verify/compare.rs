//! Row comparison: a source row (as capture writes it) against what a target
//! holds for its key, in the shape that target stores it.

use oncely_capture::catalog::ValueKind;
use oncely_sinks::verify_reader::{wire_text, StoredRow};
use serde_json::{Map, Value};

use super::source::{Column, ColumnKind, SourceTable};

/// The first column where a target row differs from its source row.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDiff {
    pub column: String,
    /// The source's value (`null` for a column the source does not have).
    pub source: Value,
    /// The target's value (`null` when absent).
    pub target: Value,
}

/// Compares one row; `None` when equal. Columns are visited in table order,
/// then target fields the source does not have. Values compare by their
/// column's type ([`Rule`]), not by spelling.
pub fn compare_row(
    table: &SourceTable,
    source: &Map<String, Value>,
    target: &StoredRow,
) -> Option<ColumnDiff> {
    compare_selected(table, &|_| true, source, target).diff
}

/// What [`compare_selected`] found in one row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Compared {
    /// The first selected column that differs, or an unknown target field.
    pub diff: Option<ColumnDiff>,
    /// Source columns the target holds though its field selection leaves
    /// them out (`fields.include` / `fields.exclude`): told, not a difference.
    pub held_unselected: Vec<String>,
}

/// Compares the columns `selected` keeps (a sink's field selection) of one
/// row; a field the target holds for a source column left out is reported
/// in [`Compared::held_unselected`], not as a difference: a warehouse table
/// created before the column was excluded still has it, and its values
/// stop changing (what verify can promise is that the selected columns are
/// equal).
pub fn compare_selected(
    table: &SourceTable,
    selected: &dyn Fn(&str) -> bool,
    source: &Map<String, Value>,
    target: &StoredRow,
) -> Compared {
    let mut out = Compared::default();
    for column in table.columns.iter().filter(|c| selected(&c.name)) {
        let rule = Rule::of_column(column);
        let s = source.get(&column.name).unwrap_or(&Value::Null);
        let (equal, t) = match target {
            StoredRow::Json(map) => {
                let t = map.get(&column.name).unwrap_or(&Value::Null);
                (rule.values_equal(s, t), t.clone())
            }
            StoredRow::Hash(hash) => {
                let t = hash.get(&column.name);
                let equal = match (wire_text(s), t) {
                    (None, None) => true,
                    (Some(a), Some(b)) => rule.texts_equal(&a, b),
                    _ => false,
                };
                (equal, t.map_or(Value::Null, |t| Value::String(t.clone())))
            }
        };
        if !equal {
            out.diff = Some(ColumnDiff {
                column: column.name.clone(),
                source: s.clone(),
                target: t,
            });
            return out;
        }
    }
    let known = |f: &str| table.columns.iter().any(|c| c.name == f);
    let held: Vec<(&String, Value)> = match target {
        StoredRow::Json(map) => map
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(f, v)| (f, v.clone()))
            .collect(),
        StoredRow::Hash(hash) => hash
            .iter()
            .map(|(f, v)| (f, Value::String(v.clone())))
            .collect(),
    };
    for (field, value) in held {
        if !known(field) {
            out.diff.get_or_insert(ColumnDiff {
                column: field.clone(),
                source: Value::Null,
                target: value,
            });
        } else if !selected(field) {
            out.held_unselected.push(field.clone());
        }
    }
    out
}

/// Whether a target value equals the source's, for a column of `kind`; see
/// [`Rule`] (`sql_type` unknown: network addresses compare as text).
pub fn values_equal(kind: &ValueKind, source: &Value, target: &Value) -> bool {
    Rule::of(kind, "").values_equal(source, target)
}

/// How two values of a column compare: by what they mean to PostgreSQL, so
/// a target that spells a value otherwise (a JSON number re-serialized,
/// `11.25` for `11.2500`, `::1/128` for `::1`) is not a difference.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// Equal JSON; numbers by value (`1` and `1.0`).
    Exact,
    /// `numeric`, `money`: by decimal value, scale ignored (PostgreSQL's
    /// `=`: `11.2500 = 11.25`); `NaN` equals `NaN`, infinities by sign.
    Decimal,
    /// `real`, `double precision`: by value (`1e308` and `1.0E308`), `NaN`
    /// equals `NaN` (as PostgreSQL orders it), infinities by sign.
    Float,
    /// MySQL's `FLOAT` (Connect `float`, FLOAT32): as [`Rule::Float`], each side
    /// first rounded to single precision, the precision the column keeps (a
    /// value widened to double, `0.10000000149011612`, equals `0.1`).
    Float32,
    /// `inet`, `cidr`: by address and prefix length, a missing length being
    /// the full one (`::1/128` equals `::1`).
    Inet,
    /// `json`, `jsonb`: texts that parse to the same document, numbers by
    /// value (`1e2` and the `100` jsonb prints).
    Json,
    /// Debezium's `Geometry` (MySQL's spatial types): by extended WKB, so
    /// the struct, its JSON text and the warehouse's `bytea` compare, and a
    /// null SRID equals 0 ([`oncely_sinks::native::stored_geometry`]).
    Geometry,
    /// Arrays: item by item, by the element's rule.
    Array(Box<Rule>),
}

impl Rule {
    /// The rule of a column of `kind` whose type is `sql_type` (`format_type`).
    pub fn of(kind: &ValueKind, sql_type: &str) -> Self {
        match kind {
            ValueKind::Decimal | ValueKind::Money => Rule::Decimal,
            ValueKind::Float32 | ValueKind::Float64 => Rule::Float,
            ValueKind::Json => Rule::Json,
            ValueKind::Array { element, .. } => Rule::Array(Box::new(Rule::of(
                element,
                sql_type.strip_suffix("[]").unwrap_or(""),
            ))),
            _ if matches!(sql_type, "inet" | "cidr") => Rule::Inet,
            _ => Rule::Exact,
        }
    }

    /// The rule of a source column, by its source's mapping.
    pub fn of_column(column: &Column) -> Self {
        match &column.kind {
            ColumnKind::Postgres(kind) => Rule::of(kind, &column.sql_type),
            ColumnKind::Mysql(..) => Rule::of_schema(&column.kind.field_schema(&column.name)),
        }
    }

    /// The rule of a column by its Connect field schema as the sinks hold
    /// it (the MySQL mapping's, decimals turned into text): the same value
    /// rules as PostgreSQL's for decimals, floating point numbers and JSON,
    /// everything else exact.
    pub fn of_schema(field: &Value) -> Self {
        let name = field.get("name").and_then(Value::as_str);
        let numeric = field
            .pointer("/parameters/__debezium.source.column.type")
            .and_then(Value::as_str)
            == Some("NUMERIC");
        match (field.get("type").and_then(Value::as_str), name) {
            _ if numeric => Rule::Decimal,
            (_, Some("org.apache.kafka.connect.data.Decimal")) => Rule::Decimal,
            (_, Some("io.debezium.data.Json")) => Rule::Json,
            (_, Some("io.debezium.data.geometry.Geometry")) => Rule::Geometry,
            (Some("float"), _) => Rule::Float32,
            (Some("double"), _) => Rule::Float,
            _ => Rule::Exact,
        }
    }

    /// Whether two wire JSON values are equal under this rule.
    pub fn values_equal(&self, source: &Value, target: &Value) -> bool {
        if source == target {
            return true;
        }
        match (self, source, target) {
            (_, Value::Null, _) | (_, _, Value::Null) => false,
            (Rule::Array(item), Value::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| item.values_equal(x, y))
            }
            (Rule::Array(_), _, _) => false,
            (Rule::Json, Value::String(a), Value::String(b)) => json_texts_equal(a, b),
            (Rule::Geometry, a, b) => geometries_equal(a, b),
            (Rule::Decimal | Rule::Float | Rule::Float32 | Rule::Inet, a, b) => {
                match (scalar_text(a), scalar_text(b)) {
                    (Some(a), Some(b)) => self.texts_equal(&a, &b),
                    _ => false,
                }
            }
            (_, Value::Number(a), Value::Number(b)) => numbers_equal(a, b),
            _ => false,
        }
    }

    /// Whether two values in text form (a Redis hash field: strings as
    /// they are, other values as JSON) are equal under this rule.
    pub fn texts_equal(&self, a: &str, b: &str) -> bool {
        if a == b {
            return true;
        }
        match self {
            Rule::Decimal => match (Decimal::parse(a), Decimal::parse(b)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            },
            Rule::Float => match (float(a), float(b)) {
                (Some(x), Some(y)) => x == y || (x.is_nan() && y.is_nan()),
                _ => false,
            },
            Rule::Float32 => match (float(a), float(b)) {
                (Some(x), Some(y)) => x as f32 == y as f32 || (x.is_nan() && y.is_nan()),
                _ => false,
            },
            Rule::Inet => match (inet(a), inet(b)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            },
            Rule::Geometry => geometries_equal(&Value::from(a), &Value::from(b)),
            Rule::Json | Rule::Array(_) => match (
                serde_json::from_str::<Value>(a),
                serde_json::from_str::<Value>(b),
            ) {
                (Ok(x), Ok(y)) if matches!(self, Rule::Json) => json_equal(&x, &y),
                (Ok(x), Ok(y)) => self.values_equal(&x, &y),
                _ => false,
            },
            Rule::Exact => false,
        }
    }
}

/// A number or a string as text; `None` for other JSON.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn numbers_equal(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x == y,
        _ => a.as_f64().is_some() && a.as_f64() == b.as_f64(),
    }
}

/// A float's text: a number, or `NaN`/`Infinity`/`-Infinity` in any spelling.
fn float(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok()
}

/// An exact decimal, by value: scale, leading and trailing zeros and the
/// spelling of the special values do not matter.
#[derive(Debug, PartialEq, Eq)]
enum Decimal {
    NaN,
    Infinity {
        negative: bool,
    },
    /// `digits` × 10^`exponent`, `digits` without leading or trailing
    /// zeros (empty for zero, which has no sign).
    Finite {
        negative: bool,
        digits: String,
        exponent: i64,
    },
}

impl Decimal {
    fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        match s.to_ascii_lowercase().as_str() {
            "nan" => return Some(Decimal::NaN),
            "infinity" | "+infinity" | "inf" | "+inf" => {
                return Some(Decimal::Infinity { negative: false })
            }
            "-infinity" | "-inf" => return Some(Decimal::Infinity { negative: true }),
            _ => {}
        }
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
            None => (rest, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if int.is_empty() && frac.is_empty()
            || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let all = format!("{int}{frac}");
        let trimmed = all.trim_start_matches('0');
        let kept = trimmed.trim_end_matches('0');
        if kept.is_empty() {
            return Some(Decimal::Finite {
                negative: false,
                digits: String::new(),
                exponent: 0,
            });
        }
        let exponent = exponent
            .checked_sub(i64::try_from(frac.len()).ok()?)?
            .checked_add(i64::try_from(trimmed.len() - kept.len()).ok()?)?;
        Some(Decimal::Finite {
            negative,
            digits: kept.to_owned(),
            exponent,
        })
    }
}

/// An `inet`/`cidr` value: the address and its prefix length (the full
/// length when the text has none).
fn inet(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, len) = match s.trim().split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (s.trim(), None),
    };
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(full);
    (len <= full).then_some((addr, len))
}

fn json_texts_equal(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => json_equal(&x, &y),
        _ => false,
    }
}

/// JSON documents equal as `jsonb` keeps them: objects by keys (their order
/// and duplicates gone when parsed), numbers by value, since jsonb prints
/// `1e2` as `100` and MySQL's or MariaDB's JSON keeps the text written.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => numbers_equal(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_equal(p, q)))
        }
        _ => a == b,
    }
}

fn geometries_equal(a: &Value, b: &Value) -> bool {
    use oncely_sinks::native::stored_geometry;
    matches!((stored_geometry(a), stored_geometry(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests;
