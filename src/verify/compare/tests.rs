use serde_json::json;

use super::*;
use crate::verify::source::{Column, SourceRow};

fn table() -> SourceTable {
    let col = |name: &str, kind: ValueKind| Column {
        name: name.into(),
        kind: ColumnKind::Postgres(kind),
        sql_type: "text".into(),
        mask: None,
        chars: oncely_capture::catalog::Characters::No,
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
        filter: None,
        mysql: None,
    }
}

fn row(v: Value) -> SourceRow {
    let row = v.as_object().cloned().unwrap_or_default();
    SourceRow {
        key_text: vec![row["id"].to_string()],
        key_wire: vec![row["id"].clone()],
        row,
        key_cells: Vec::new(),
    }
}

fn src() -> SourceRow {
    row(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": null}))
}

fn obj(v: Value) -> StoredRow {
    StoredRow::Json(v.as_object().cloned().unwrap_or_default())
}

#[test]
fn equal_json_rows_with_null_as_absent() {
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}"}));
    assert_eq!(compare_row(&table(), &src().row, &t), None);
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": null}));
    assert_eq!(compare_row(&table(), &src().row, &t), None);
}

#[test]
fn native_documents_compare_with_the_source_converted_as_the_sink_converts() {
    use oncely_sinks::kinds::elasticsearch::values::Format;
    use oncely_sinks::kinds::elasticsearch::JsonMode;
    use oncely_sinks::native::ValueFormat;
    use oncely_sinks::verify_reader::StoredForm;
    let mut t = table();
    t.columns.push(Column {
        name: "day".into(),
        kind: ColumnKind::Postgres(ValueKind::Date),
        sql_type: "date".into(),
        mask: None,
        chars: oncely_capture::catalog::Characters::No,
    });
    let native = Format {
        values: ValueFormat::Native,
        json: JsonMode::Flattened,
    };
    // The source row as the target stores it: what compare_table compares.
    let stored = |form: Format| {
        let s = row(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "day": 20454}));
        let verified = t.verified_table();
        let columns = form
            .stored_form()
            .columns(verified.columns.iter().map(|(n, s)| (n.as_str(), s)));
        StoredForm::convert(&s.row, &columns).into_owned()
    };
    let s = stored(native);
    let doc =
        |day: Value, meta: Value| obj(json!({"id": 7, "total": "12.5", "meta": meta, "day": day}));
    assert_eq!(
        compare_row(&t, &s, &doc(json!("2026-01-01"), json!({"a": 1}))),
        None
    );
    let diff = compare_row(&t, &s, &doc(json!("2026-01-02"), json!({"a": 1}))).expect("day");
    assert_eq!(diff.column, "day");
    let diff = compare_row(&t, &s, &doc(json!("2026-01-01"), json!({"a": 2}))).expect("meta");
    assert_eq!(diff.column, "meta");
    // The wire value in a native index is a difference.
    assert!(compare_row(&t, &s, &doc(json!(20454), json!({"a": 1}))).is_some());
    // JSON as text: the text, compared as JSON.
    let s = stored(Format {
        json: JsonMode::Text,
        ..native
    });
    let row_text =
        obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\":1}", "day": "2026-01-01"}));
    assert_eq!(compare_row(&t, &s, &row_text), None);
}

#[test]
fn decimals_compare_by_value_whatever_their_scale() {
    // `11.2500 = 11.25` in PostgreSQL: an index holding either is equal.
    let t = obj(json!({"id": 7, "total": "12.5", "meta": "{\"a\": 1}"}));
    assert_eq!(compare_row(&table(), &src().row, &t), None);
    let t = obj(json!({"id": 7, "total": "12.51", "meta": "{\"a\": 1}"}));
    let d = compare_row(&table(), &src().row, &t).expect("differs");
    assert_eq!(d.column, "total");
    assert_eq!(d.source, json!("12.50"));
    assert_eq!(d.target, json!("12.51"));
    let eq = |a: &str, b: &str| Rule::Decimal.texts_equal(a, b);
    assert!(eq("11.2500", "11.25"));
    assert!(eq("0.00", "-0"));
    assert!(eq("100", "1e2"));
    assert!(eq("0.00000000000000000001", "1E-20"));
    assert!(eq(
        "123456789012345678901234567890.123456789",
        "123456789012345678901234567890.1234567890"
    ));
    assert!(!eq(
        "123456789012345678901234567890.123456789",
        "123456789012345678901234567890.123456788"
    ));
    assert!(!eq("-1", "1"));
    assert!(!eq("10", "1"));
    assert!(eq("NaN", "nan"));
    assert!(eq("-Infinity", "-Infinity"));
    assert!(!eq("Infinity", "-Infinity"));
    assert!(!eq("NaN", "0"));
    assert!(!eq("12.5x", "12.5x0"));
    // A decimal written as a JSON number by a target compares by value too.
    assert!(Rule::Decimal.values_equal(&json!("11.2500"), &json!(11.25)));
}

#[test]
fn floats_compare_by_value_and_nan_equals_nan() {
    let f = Rule::of(&ValueKind::Float64, "double precision");
    let v = |s: &str| serde_json::from_str::<Value>(s).expect("json");
    assert!(f.values_equal(&v("1e308"), &v("1.0E308")));
    assert!(f.values_equal(&v("-2.5e-300"), &v("-2.50E-300")));
    assert!(!f.values_equal(&v("1e308"), &v("1e307")));
    assert!(f.values_equal(&json!("NaN"), &json!("NaN")));
    assert!(f.values_equal(&json!("-Infinity"), &json!("-Infinity")));
    assert!(!f.values_equal(&json!("Infinity"), &json!("-Infinity")));
    assert!(!f.values_equal(&json!("NaN"), &json!(1.5)));
    assert!(!f.values_equal(&json!(1.5), &Value::Null));
    // Redis hash text: the JSON number's text or the string.
    assert!(f.texts_equal("1e308", "1.0E308"));
    assert!(f.texts_equal("NaN", "NaN"));
    assert!(!f.texts_equal("NaN", "Infinity"));
    // Arrays item by item.
    let a = Rule::of(
        &ValueKind::Array {
            element: Box::new(ValueKind::Float64),
            delimiter: b',',
        },
        "double precision[]",
    );
    assert!(a.values_equal(
        &v(r#"[1e308, "NaN", null]"#),
        &v(r#"[1.0E308, "NaN", null]"#)
    ));
    assert!(!a.values_equal(&v("[1, 2]"), &v("[1]")));
    assert!(a.texts_equal("[1e308,\"NaN\"]", "[1.0E308, \"NaN\"]"));
}

#[test]
fn network_addresses_compare_by_address_and_prefix() {
    let inet = Rule::of(&ValueKind::Text, "inet");
    assert_eq!(inet, Rule::Inet);
    let eq = |a: &str, b: &str| inet.values_equal(&json!(a), &json!(b));
    assert!(eq("::1/128", "::1"));
    assert!(eq("0:0:0:0:0:0:0:1", "::1"));
    assert!(eq("10.1.2.3/32", "10.1.2.3"));
    assert!(!eq("10.1.2.3/8", "10.1.2.3"));
    assert!(!eq("2001:db8::1/64", "2001:db8::1"));
    assert!(!eq("::1", "::2"));
    assert!(inet.texts_equal("::1/128", "::1"));
    assert_eq!(Rule::of(&ValueKind::Text, "cidr"), Rule::Inet);
    // Plain text is compared as text, whatever it looks like.
    assert!(!Rule::of(&ValueKind::Text, "text").values_equal(&json!("::1/128"), &json!("::1")));
    let arr = Rule::of(
        &ValueKind::Array {
            element: Box::new(ValueKind::Text),
            delimiter: b',',
        },
        "inet[]",
    );
    assert!(arr.values_equal(
        &json!(["::1/128", "10.0.0.1"]),
        &json!(["::1", "10.0.0.1/32"])
    ));
}

#[test]
fn json_columns_compare_as_documents() {
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\":1}"}));
    assert_eq!(compare_row(&table(), &src().row, &t), None);
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\":2}"}));
    assert_eq!(
        compare_row(&table(), &src().row, &t)
            .expect("differs")
            .column,
        "meta"
    );
}

/// What jsonb does to a MySQL or MariaDB JSON text (kept as written at
/// the source): keys sorted and deduplicated (the last wins), whitespace
/// gone, numbers printed by value. Those compare equal; other values do not.
#[test]
fn json_compares_as_jsonb_normalises_it() {
    let rule = Rule::Json;
    let source = json!("{\"b\": 1e2, \"a\": [1.50, -0], \"a\": {\"x\": 1E-2}}");
    let jsonb = json!("{\"a\": {\"x\": 0.01}, \"b\": 100}");
    assert!(rule.values_equal(&source, &jsonb));
    assert!(rule.texts_equal(source.as_str().unwrap(), jsonb.as_str().unwrap()));
    assert!(!rule.values_equal(&source, &json!("{\"a\": {\"x\": 0.01}, \"b\": 101}")));
    assert!(!rule.values_equal(&json!("[1, 2]"), &json!("[2, 1]")));
    assert!(!rule.values_equal(&json!("{\"a\": 1}"), &json!("{\"a\": 1, \"b\": 1}")));
    assert!(!rule.values_equal(&json!("{\"a\": \"1\"}"), &json!("{\"a\": 1}")));
}

/// A Geometry compares by its extended WKB: the struct the source and an
/// index hold, its JSON text (a hash field, an old `jsonb` column) and the
/// warehouse's `bytea` (read back as base64); a null SRID is 0.
#[test]
fn geometries_compare_by_extended_wkb() {
    let rule = Rule::of_schema(&json!({"type": "struct",
        "name": "io.debezium.data.geometry.Geometry"}));
    assert_eq!(rule, Rule::Geometry);
    let point = "AQEAAAAAAAAAAADwPwAAAAAAAABA";
    let source = json!({"wkb": point, "srid": 0});
    for target in [
        json!({"wkb": point, "srid": null}),
        json!(format!("{{\"wkb\":\"{point}\",\"srid\":0}}")),
        json!(point),
    ] {
        assert!(rule.values_equal(&source, &target), "{target}");
    }
    assert!(rule.texts_equal(&source.to_string(), point));
    let srid = json!({"wkb": point, "srid": 4326});
    assert!(!rule.values_equal(&srid, &json!(point)));
    assert!(rule.values_equal(&srid, &json!("AQEAACDmEAAAAAAAAAAA8D8AAAAAAAAAQA==")));
    assert!(!rule.values_equal(&source, &json!("AQEAAAAAAAAAAADwPwAAAAAAAAhA")));
}

#[test]
fn text_columns_are_not_parsed_as_json() {
    let s = row(json!({"id": 1, "total": null, "meta": null, "note": "{\"a\": 1}"}));
    let t = obj(json!({"id": 1, "note": "{\"a\":1}"}));
    assert_eq!(
        compare_row(&table(), &s.row, &t).expect("differs").column,
        "note"
    );
}

#[test]
fn a_set_value_where_the_source_has_null_differs() {
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": "x"}));
    assert_eq!(
        compare_row(&table(), &src().row, &t)
            .expect("differs")
            .column,
        "note"
    );
}

#[test]
fn fields_the_source_lacks_differ() {
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "ghost": 1}));
    let d = compare_row(&table(), &src().row, &t).expect("differs");
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

/// A warehouse's interval, timestamptz and date text
/// maps to the very wire value of the source's, whatever the spelling
/// (IntervalStyle, era or sign of the year), so they compare by value.
#[test]
fn temporal_values_compare_by_value_not_spelling() {
    use oncely_capture::catalog::{IntervalHandlingMode, TypeRegistry};
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
        StoredRow::Hash(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let equal = hash(&[("id", "7"), ("total", "12.50"), ("meta", "{\"a\": 1}")]);
    assert_eq!(compare_row(&table(), &src().row, &equal), None);
    let missing_field = hash(&[("id", "7"), ("meta", "{\"a\": 1}")]);
    assert_eq!(
        compare_row(&table(), &src().row, &missing_field)
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
        compare_row(&table(), &src().row, &extra)
            .expect("differs")
            .column,
        "x"
    );
}

#[test]
fn only_selected_columns_compare_and_held_unselected_ones_are_told_not_differences() {
    let source = row(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "note": "MARKER"}));
    let selected = |c: &str| c != "note";
    // The cache left `note` out: equal without it.
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}"}));
    assert_eq!(
        compare_selected(&table(), &selected, &source.row, &t),
        Compared::default()
    );
    // Without the selection the missing `note` is a difference.
    assert_eq!(
        compare_row(&table(), &source.row, &t).map(|d| d.column),
        Some("note".to_owned())
    );
    // A target still holding it (any value): told, not a difference.
    let t = obj(json!({"id": 7, "total": "12.5", "meta": "{\"a\":1}", "note": "old"}));
    let c = compare_selected(&table(), &selected, &source.row, &t);
    assert_eq!(c.diff, None);
    assert_eq!(c.held_unselected, ["note"]);
    let mut hash = std::collections::BTreeMap::new();
    hash.insert("id".to_owned(), "7".to_owned());
    hash.insert("total".to_owned(), "12.50".to_owned());
    hash.insert("meta".to_owned(), "{\"a\": 1}".to_owned());
    hash.insert("note".to_owned(), "old".to_owned());
    let c = compare_selected(
        &table(),
        &selected,
        &source.row,
        &StoredRow::Hash(hash.clone()),
    );
    assert_eq!((c.diff, c.held_unselected), (None, vec!["note".to_owned()]));
    // Selected columns still differ, and unknown fields still count.
    hash.insert("total".to_owned(), "13".to_owned());
    hash.insert("stray".to_owned(), "x".to_owned());
    let c = compare_selected(&table(), &selected, &source.row, &StoredRow::Hash(hash));
    assert_eq!(c.diff.map(|d| d.column), Some("total".to_owned()));
    let t = obj(json!({"id": 7, "total": "12.50", "meta": "{\"a\": 1}", "stray": 1}));
    let c = compare_selected(&table(), &selected, &source.row, &t);
    assert_eq!(c.diff.map(|d| d.column), Some("stray".to_owned()));
}

/// MySQL columns: values as the sinks hold Debezium's MySQL encodings,
/// compared by the rules of their held schema.
#[test]
fn mysql_values_compare_as_the_sinks_hold_them() {
    use crate::verify::source::MysqlColumn;
    use mysql_async::consts::ColumnType;
    use oncely_capture::catalog::mysql::{Cell, ColumnShape, MappingConfig};
    let column = |name: &str, ty: ColumnType, meta: Vec<u8>| {
        let mut shape = ColumnShape::new(name, ty);
        shape.meta = meta;
        let my = MysqlColumn::new(shape, MappingConfig::default());
        let rule = Rule::of_schema(&my.held.schema);
        (my, rule)
    };
    let (amount, rule) = column("amount", ColumnType::MYSQL_TYPE_NEWDECIMAL, vec![12, 2]);
    let v = amount.to_json(&Cell::Decimal("163.38".into())).unwrap();
    assert_eq!(v, json!("163.38"));
    assert_eq!(rule, Rule::Decimal);
    assert!(rule.values_equal(&v, &json!("163.380")));
    assert!(!rule.values_equal(&v, &json!("163.39")));

    let (f, rule) = column("f", ColumnType::MYSQL_TYPE_FLOAT, vec![4]);
    let v = f.to_json(&Cell::Float(0.1)).unwrap();
    assert_eq!(rule, Rule::Float32);
    assert!(rule.values_equal(&v, &json!(0.1)));
    assert!(rule.texts_equal(&v.to_string(), "0.1"));
    assert!(!rule.values_equal(&v, &json!(0.1000001)));
    let (_, rule) = column("d", ColumnType::MYSQL_TYPE_DOUBLE, vec![8]);
    assert_eq!(rule, Rule::Float);

    let (bits, rule) = column("b", ColumnType::MYSQL_TYPE_BIT, vec![4, 1]);
    let v = bits.to_json(&Cell::Bit(vec![0x0a, 0xbc])).unwrap();
    assert_eq!((v, rule), (json!("101010111100"), Rule::Exact));

    // DATETIME(3): Debezium's ms Timestamp, held as µs.
    let (dt, _) = column("dt3", ColumnType::MYSQL_TYPE_DATETIME2, vec![3]);
    let v = dt
        .to_json(&Cell::DateTime {
            year: 1970,
            month: 1,
            day: 2,
            hour: 0,
            minute: 0,
            second: 0,
            micros: 789_000,
        })
        .unwrap();
    assert_eq!(v, json!(86_400_789_000i64));
    assert_eq!(
        dt.held.schema["name"],
        json!("io.debezium.time.MicroTimestamp")
    );

    let (js, rule) = column("js", ColumnType::MYSQL_TYPE_JSON, vec![]);
    let v = js.to_json(&Cell::Json(json!({"a": [1, 2.5]}))).unwrap();
    assert_eq!(rule, Rule::Json);
    assert!(rule.values_equal(&v, &json!("{ \"a\" : [1, 2.5] }")));
}
