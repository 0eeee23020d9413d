//! Row comparison: a source row (as capture writes it) against what a target
//! holds for its key, in the shape that target stores it.

use std::collections::BTreeMap;

use oncely_capture::value::ValueKind;
use serde_json::{Map, Value};

use super::source::{wire_text, SourceRow, SourceTable};

/// What a target holds for one key.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetRow {
    /// Columns as wire JSON values (a warehouse row mapped back, an
    /// Elasticsearch `_source`, a Redis JSON row); absent means null.
    Json(Map<String, Value>),
    /// A Redis hash: one field per non-null column, strings as they are and
    /// other values as JSON text.
    Hash(BTreeMap<String, String>),
}

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
/// then target fields the source does not have.
pub fn compare_row(
    table: &SourceTable,
    source: &SourceRow,
    target: &TargetRow,
) -> Option<ColumnDiff> {
    for column in &table.columns {
        let s = source.row.get(&column.name).unwrap_or(&Value::Null);
        let (equal, t) = match target {
            TargetRow::Json(map) => {
                let t = map.get(&column.name).unwrap_or(&Value::Null);
                (values_equal(&column.kind, s, t), t.clone())
            }
            TargetRow::Hash(hash) => {
                let t = hash.get(&column.name);
                let equal = match (wire_text(s), t) {
                    (None, None) => true,
                    (Some(a), Some(b)) => {
                        a == *b || (is_json(&column.kind) && json_texts_equal(&a, b))
                    }
                    _ => false,
                };
                (equal, t.map_or(Value::Null, |t| Value::String(t.clone())))
            }
        };
        if !equal {
            return Some(ColumnDiff {
                column: column.name.clone(),
                source: s.clone(),
                target: t,
            });
        }
    }
    let known = |f: &str| table.columns.iter().any(|c| c.name == f);
    let extra = match target {
        TargetRow::Json(map) => map
            .iter()
            .find(|(f, v)| !v.is_null() && !known(f))
            .map(|(f, v)| (f.clone(), v.clone())),
        TargetRow::Hash(hash) => hash
            .iter()
            .find(|(f, _)| !known(f))
            .map(|(f, v)| (f.clone(), Value::String(v.clone()))),
    };
    extra.map(|(column, target)| ColumnDiff {
        column,
        source: Value::Null,
        target,
    })
}

/// Whether a target value equals the source's, for a column of `kind`: equal
/// JSON, or the same number written differently (`1.0` and `1`), or — for
/// JSON columns — texts that parse to the same document (a `json` source
/// column keeps its whitespace; a `jsonb` warehouse column does not).
pub fn values_equal(kind: &ValueKind, source: &Value, target: &Value) -> bool {
    if source == target {
        return true;
    }
    match (source, target) {
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => a.as_f64().is_some() && a.as_f64() == b.as_f64(),
        },
        (Value::String(a), Value::String(b)) if is_json(kind) => json_texts_equal(a, b),
        _ => false,
    }
}

fn is_json(kind: &ValueKind) -> bool {
    matches!(kind, ValueKind::Json)
}

fn json_texts_equal(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::verify::source::Column;

    fn table() -> SourceTable {
        let col = |name: &str, kind: ValueKind| Column {
            name: name.into(),
            kind,
            sql_type: "text".into(),
        };
        SourceTable {
            schema: "public".into(),
            name: "orders".into(),
            columns: vec![
                col("id", ValueKind::Int64),
                col("total", ValueKind::Decimal),
                col("meta", ValueKind::Json),
                col("note", ValueKind::Text),
            ],
            key: vec![0],
            topic: "shop.public.orders".into(),
        }
    }

    fn row(v: Value) -> SourceRow {
        let row = v.as_object().cloned().unwrap_or_default();
        SourceRow {
            key_text: vec![row["id"].to_string()],
            key_wire: vec![row["id"].clone()],
            row,
        }
    }

    fn src() -> SourceRow {
        row(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": null}))
    }

    fn obj(v: Value) -> TargetRow {
        TargetRow::Json(v.as_object().cloned().unwrap_or_default())
    }

    #[test]
    fn equal_json_rows_with_null_as_absent() {
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}"}));
        assert_eq!(compare_row(&table(), &src(), &t), None);
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": null}));
        assert_eq!(compare_row(&table(), &src(), &t), None);
    }

    #[test]
    fn decimals_are_compared_exactly() {
        let t = obj(json!({"id": 7, "total": "12.5", "meta": "{\"a\": 1}"}));
        let d = compare_row(&table(), &src(), &t).expect("differs");
        assert_eq!(d.column, "total");
        assert_eq!(d.source, json!("12.50"));
        assert_eq!(d.target, json!("12.5"));
    }

    #[test]
    fn json_columns_compare_as_documents() {
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\":1}"}));
        assert_eq!(compare_row(&table(), &src(), &t), None);
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\":2}"}));
        assert_eq!(
            compare_row(&table(), &src(), &t).expect("differs").column,
            "meta"
        );
    }

    #[test]
    fn text_columns_are_not_parsed_as_json() {
        let s = row(json!({"id": 1, "total": null, "meta": null, "note": "{\"a\": 1}"}));
        let t = obj(json!({"id": 1, "note": "{\"a\":1}"}));
        assert_eq!(
            compare_row(&table(), &s, &t).expect("differs").column,
            "note"
        );
    }

    #[test]
    fn a_set_value_where_the_source_has_null_differs() {
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": "x"}));
        assert_eq!(
            compare_row(&table(), &src(), &t).expect("differs").column,
            "note"
        );
    }

    #[test]
    fn fields_the_source_lacks_differ() {
        let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "ghost": 1}));
        let d = compare_row(&table(), &src(), &t).expect("differs");
        assert_eq!(
            (d.column.as_str(), d.source, d.target),
            ("ghost", Value::Null, json!(1))
        );
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(values_equal(&ValueKind::Float64, &json!(1), &json!(1.0)));
        assert!(!values_equal(&ValueKind::Float64, &json!(1), &json!(1.5)));
        assert!(!values_equal(&ValueKind::Int64, &json!(1), &json!("1")));
    }

    /// Issue 23 item 5: a warehouse's interval, timestamptz and date text
    /// maps to the very wire value of the source's, whatever the spelling
    /// (IntervalStyle, era or sign of the year), so they compare by value.
    #[test]
    fn temporal_values_compare_by_value_not_spelling() {
        use oncely_capture::value::{IntervalHandlingMode, TypeRegistry};
        let reg = TypeRegistry::builtin();
        let same = |oid: u32, a: &str, b: &str| {
            let kind = reg.value_kind(oid);
            values_equal(&kind, &kind.to_json(a), &kind.to_json(b))
        };
        assert!(same(
            1186,
            "1 year 2 mons 3 days 04:05:06.789",
            "P1Y2M3DT4H5M6.789S"
        ));
        assert!(same(
            1186,
            "-1 years -2 mons +3 days -04:05:06.789",
            "@ 1 year 2 mons -3 days 4 hours 5 mins 6.789 secs ago"
        ));
        // Different values that PostgreSQL's `=` calls equal are different
        // intervals here: '1 mon' is not '30 days' (what the sink stored
        // before: '10303:05:06.789' for the first one).
        assert!(!same(1186, "1 mon", "30 days"));
        assert!(!same(
            1186,
            "1 year 2 mons 3 days 04:05:06.789",
            "10303:05:06.789"
        ));
        assert!(same(
            1184,
            "0044-03-15 12:00:00+00 BC",
            "0044-03-15 13:00:00+01 BC"
        ));
        assert!(same(1082, "infinity", "infinity"));
        assert!(!same(1082, "infinity", "5874897-12-31"));
        let numeric = TypeRegistry::builtin().with_interval_mode(IntervalHandlingMode::Numeric);
        let kind = numeric.value_kind(1186);
        assert_eq!(kind.to_json("1 mon"), json!(2_629_800_000_000_i64));
    }

    #[test]
    fn hash_rows_hold_text_of_non_null_columns() {
        let hash = |pairs: &[(&str, &str)]| {
            TargetRow::Hash(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        let equal = hash(&[("id", "7"), ("total", "12.50"), ("meta", "{\"a\": 1}")]);
        assert_eq!(compare_row(&table(), &src(), &equal), None);
        let missing_field = hash(&[("id", "7"), ("meta", "{\"a\": 1}")]);
        assert_eq!(
            compare_row(&table(), &src(), &missing_field)
                .expect("differs")
                .column,
            "total"
        );
        let extra = hash(&[
            ("id", "7"),
            ("total", "12.50"),
            ("meta", "{\"a\": 1}"),
            ("x", "1"),
        ]);
        assert_eq!(
            compare_row(&table(), &src(), &extra)
                .expect("differs")
                .column,
            "x"
        );
    }
}
