use super::*;
use crate::kinds::postgres::compat::{canonical, compatible, retyped, widened, wider};
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
            json!({"type": "string", "name": "io.debezium.time.Interval"}),
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
            "date[]",
        ),
        (
            json!({"type": "array", "items": {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}}),
            "timestamp[]",
        ),
        (
            json!({"type": "array", "items": {"type": "int64", "name": "io.debezium.time.MicroTime"}}),
            "time[]",
        ),
        (
            json!({"type": "array", "items": {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}}),
            "timestamptz[]",
        ),
        (
            json!({"type": "array", "items": {"type": "bytes"}}),
            "jsonb",
        ),
        (
            json!({"type": "array", "items": {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}}),
            "timestamptz[]",
        ),
        (
            json!({"type": "array", "items": {"type": "string", "name": "io.debezium.time.Interval"}}),
            "interval[]",
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
    // Addresses are strings on the wire; a column typed for them takes them.
    let text = from_schema(&json!({"type": "string"}));
    for t in ["inet", "cidr", "macaddr", "macaddr8"] {
        assert!(compatible(&text, t).is_ok(), "{t}");
    }
    let texts = from_schema(&json!({"type": "array", "items": {"type": "string"}}));
    assert!(compatible(&texts, "inet[]").is_ok());
    assert!(compatible(&texts, "inet").is_err());
    assert!(compatible(&text, "integer").is_err());
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
        ("bit varying(8)", "bit varying(12)", Some("bit varying(12)")),
        ("bit varying(12)", "bit varying(8)", None),
        ("bit varying(8)", "bit varying", Some("bit varying")),
        ("bit varying", "bit varying(8)", None),
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
fn events_of_another_type_change_columns_only_to_a_type_taking_both() {
    let spec = |ty: &str| ColumnSpec::new(ty.to_owned(), Conv::Cast);
    let cases = [
        // (column now, event type, the type it changes to)
        ("integer", "text", Some("text")),
        (
            "bigint",
            "character varying(20)",
            Some("character varying(20)"),
        ),
        ("date", "timestamptz", Some("timestamptz")),
        ("date", "timestamp", Some("timestamp")),
        // Events written before the change fit the changed column: never back.
        ("text", "integer", None),
        ("timestamp with time zone", "date", None),
        // Neither takes the other: a type conflict, as before.
        ("integer", "boolean", None),
        ("boolean", "integer", None),
        // Widenings are `widened`'s, not this.
        ("integer", "bigint", None),
        ("integer", "integer", None),
    ];
    for (actual, event, want) in cases {
        assert_eq!(
            retyped(&spec(event), actual).as_deref(),
            want,
            "{actual} <- {event}"
        );
        if let Some(to) = want {
            let to = canonical(to);
            assert!(compatible(&spec(event), &to).is_ok(), "{event} into {to}");
            assert!(compatible(&spec(actual), &to).is_ok(), "{actual} into {to}");
        }
    }
    // Schemaless values never change a column.
    assert_eq!(retyped(&infer(&json!("x")).expect("spec"), "integer"), None);
    // One batch from before and after the change: the new type, either order.
    assert_eq!(wider(&spec("integer"), &spec("text")).ddl, "text");
    assert_eq!(wider(&spec("text"), &spec("integer")).ddl, "text");
    assert_eq!(
        wider(&spec("date"), &spec("timestamptz")).ddl,
        "timestamptz"
    );
    assert_eq!(
        wider(&spec("timestamptz"), &spec("date")).ddl,
        "timestamptz"
    );
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
fn sentinels_boundaries_and_signed_years_become_postgresql_text() {
    let t = |conv: Conv, s: &'static str| conv.pg_text(Cow::Borrowed(s), "x").into_owned();
    assert_eq!(t(Conv::EpochMicros, "9223372036854775807"), "infinity");
    assert_eq!(t(Conv::EpochMicros, "-9223372036854775808"), "-infinity");
    assert_eq!(t(Conv::EpochMicros, "-1"), "-1");
    assert_eq!(t(Conv::EpochDays, "2147483647"), "infinity");
    assert_eq!(t(Conv::EpochDays, "-2147483648"), "-infinity");
    assert_eq!(t(Conv::MicrosOfDay, "86400000000"), "24:00:00");
    assert_eq!(
        t(Conv::Zoned, "-0043-03-15T12:00:00.000000Z"),
        "0044-03-15T12:00:00.000000Z BC"
    );
    assert_eq!(
        t(Conv::Zoned, "0000-01-01T00:00:00.000000Z"),
        "0001-01-01T00:00:00.000000Z BC"
    );
    assert_eq!(
        t(Conv::Zoned, "+294276-12-31T23:59:59.999999Z"),
        "294276-12-31T23:59:59.999999Z"
    );
    assert_eq!(t(Conv::Zoned, "-infinity"), "-infinity");
    assert_eq!(
        t(Conv::Zoned, "2026-11-27T15:10:35.670111Z"),
        "2026-11-27T15:10:35.670111Z"
    );
    // A text column keeps the wire text.
    assert_eq!(
        Conv::EpochDays.pg_text(Cow::Borrowed("2147483647"), "text"),
        "2147483647"
    );
}

#[test]
fn temporal_array_items_become_postgres_text() {
    let dates = from_schema(
        &json!({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}),
    );
    assert_eq!(dates.conv, Conv::Each(Temporal::Days));
    assert!(compatible(&dates, "date[]").is_ok());
    // Columns typed `jsonb` by earlier versions keep taking them.
    assert!(compatible(&dates, "jsonb").is_ok());
    assert!(compatible(&dates, "integer[]").is_err());
    let value = json!([[20454, null], [10956, "infinity"], [-719528, -2440588]]);
    assert_eq!(
        to_text_as(&value, "date[]", Some(Temporal::Days)).as_deref(),
        Some(
            r#"{{"2026-01-01",NULL},{"1999-12-31","infinity"},{"0001-01-01 BC","4714-11-24 BC"}}"#
        )
    );
    let t = |kind: Temporal, v: Value| kind.text(&v).expect("text");
    assert_eq!(t(Temporal::Days, json!(0)), "1970-01-01");
    assert_eq!(t(Temporal::Days, json!(-1)), "1969-12-31");
    assert_eq!(t(Temporal::Days, json!(2_932_896)), "9999-12-31");
    assert_eq!(t(Temporal::Days, json!(2_932_897)), "10000-01-01");
    assert_eq!(t(Temporal::Micros, json!(-1)), "1969-12-31 23:59:59.999999");
    assert_eq!(
        t(Temporal::Micros, json!(-62_135_596_800_000_001_i64)),
        "0001-12-31 23:59:59.999999 BC"
    );
    assert_eq!(
        t(Temporal::Millis, json!(1_500)),
        "1970-01-01 00:00:01.500000"
    );
    assert_eq!(
        t(Temporal::Nanos, json!(1_999)),
        "1970-01-01 00:00:00.000001"
    );
    assert_eq!(
        t(Temporal::MicrosOfDay, json!(86_400_000_000_i64)),
        "24:00:00.000000"
    );
    assert_eq!(
        t(Temporal::MillisOfDay, json!(45_296_500)),
        "12:34:56.500000"
    );
    assert_eq!(Temporal::Days.text(&json!(true)), None);
    assert_eq!(t(Temporal::Days, json!(i32::MAX)), "infinity");
    assert_eq!(t(Temporal::Days, json!(i32::MIN)), "-infinity");
    assert_eq!(t(Temporal::Micros, json!(i64::MAX)), "infinity");
    assert_eq!(t(Temporal::Micros, json!(i64::MIN)), "-infinity");
    assert_eq!(canonical("timestamp[]"), "timestamp without time zone[]");
}

#[test]
fn millisecond_and_nanosecond_timestamps_are_converted_exactly() {
    let text = |conv: Conv, v: &str| conv.pg_text(Cow::Borrowed(v), "timestamp").into_owned();
    // 4714-11-24 BC, PostgreSQL's first day: SQL's `bigint * interval`
    // gave `.000992` here.
    assert_eq!(
        text(Conv::EpochMillis, "-210866803199999"),
        "4714-11-24 00:00:00.001000 BC"
    );
    assert_eq!(
        text(Conv::EpochMillis, "9224318015999999"),
        "294276-12-31 23:59:59.999000"
    );
    // Floored like the array items, not rounded up by `/`.
    assert_eq!(
        text(Conv::EpochNanos, "-9223372036854775808"),
        "1677-09-21 00:12:43.145224"
    );
    assert_eq!(text(Conv::EpochNanos, "-1"), "1969-12-31 23:59:59.999999");
    // Text columns and values that are no number keep the wire text.
    assert_eq!(
        Conv::EpochMillis
            .pg_text(Cow::Borrowed("1500"), "text")
            .into_owned(),
        "1500"
    );
    assert_eq!(text(Conv::EpochMillis, "infinity"), "infinity");
}

#[test]
fn values_become_text() {
    assert_eq!(to_text_as(&json!(null), "text", None), None);
    assert_eq!(
        to_text_as(&json!(12), "bigint", None).as_deref(),
        Some("12")
    );
    assert_eq!(
        to_text_as(&json!(["a,b", "x\"y", null]), "text[]", None).as_deref(),
        Some(r#"{"a,b","x\"y",NULL}"#)
    );
    assert_eq!(
        to_text_as(
            &json!(["-0043-03-15T12:00:00.000000Z", "infinity"]),
            "timestamp with time zone[]",
            None
        )
        .as_deref(),
        Some(r#"{"0044-03-15T12:00:00.000000Z BC","infinity"}"#)
    );
    assert_eq!(
        to_text_as(&json!([1, 2]), "jsonb", None).as_deref(),
        Some("[1,2]")
    );
    assert_eq!(
        to_text_as(&json!({"a": 1}), "jsonb", None).as_deref(),
        Some(r#"{"a":1}"#)
    );
    assert_eq!(base_type("numeric(12,2)"), "numeric");
    assert_eq!(base_type("character varying(5)[]"), "character varying[]");
    assert_eq!(canonical("timestamptz"), "timestamp with time zone");
    assert_eq!(canonical("timestamptz[]"), "timestamp with time zone[]");
    let tza = from_schema(&json!({"type": "array", "items": {"type": "string",
        "name": "io.debezium.time.ZonedTimestamp"}}));
    assert!(compatible(&tza, "timestamp with time zone[]").is_ok());
}

/// `column.propagate.source.type` adds Debezium's length and scale to every
/// field (`2147483647` for unbounded text, `131089` for a numeric without
/// precision, `MONEY` with a length): the warehouse creates the same column
/// types as without it (the two golden fixtures of one insert).
#[test]
fn propagated_source_types_give_the_same_warehouse_types() {
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/envelope");
    let fields = |file: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(dir.join(file)).expect("fixture");
        let doc: Value = serde_json::from_str(&text).expect("json");
        doc["value"]["schema"]["fields"][1]["fields"]
            .as_array()
            .expect("after fields")
            .clone()
    };
    let plain = fields("insert_all_types.json");
    let propagated = fields("insert_propagate_source_type.json");
    assert_eq!(plain.len(), propagated.len());
    for (p, q) in plain.iter().zip(&propagated) {
        assert!(
            q.pointer("/parameters/__debezium.source.column.name")
                .is_some(),
            "{q}"
        );
        assert_eq!(from_schema(p), from_schema(q), "{q}");
    }
}

/// Debezium's MySQL connector's field schemas (as its MariaDB connector
/// 3.5.0 wrote them, default modes but `bigint.unsigned.handling.mode =
/// precise`), read through the decoding every Debezium topic gets: each
/// gets the PostgreSQL type a user would choose.
#[test]
fn debezium_mysql_schemas_map_to_their_natural_types() {
    let cases = [
        // BIGINT UNSIGNED, precise: scale 0, no precision.
        (
            json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                "version": 1, "parameters": {"scale": "0"}}),
            "numeric(20,0)",
        ),
        // DECIMAL(12,2).
        (
            json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "12"}}),
            "numeric(12,2)",
        ),
        // DATETIME(3), DATETIME(6), TIMESTAMP(6), TIME(6), DATE.
        (
            json!({"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1}),
            "timestamp",
        ),
        (
            json!({"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}),
            "timestamp",
        ),
        (
            json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}),
            "timestamptz",
        ),
        (
            json!({"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1}),
            "time",
        ),
        (
            json!({"type": "int32", "name": "io.debezium.time.Date", "version": 1}),
            "date",
        ),
        (
            json!({"type": "int32", "name": "io.debezium.time.Year", "version": 1}),
            "smallint",
        ),
        (
            json!({"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": "small,medium,large"}}),
            "text",
        ),
        (
            json!({"type": "string", "name": "io.debezium.data.EnumSet", "version": 1,
                "parameters": {"allowed": "a,b,c"}}),
            "text",
        ),
        (
            json!({"type": "string", "name": "io.debezium.data.Json", "version": 1}),
            "jsonb",
        ),
        // BIT(1), BIT(12).
        (json!({"type": "boolean"}), "boolean"),
        (
            json!({"type": "bytes", "name": "io.debezium.data.Bits", "version": 1,
                "parameters": {"length": "12"}}),
            "bit varying(12)",
        ),
        (json!({"type": "bytes"}), "bytea"),
        (
            json!({"type": "struct", "name": "io.debezium.data.geometry.Geometry", "version": 1,
                "fields": [{"type": "bytes", "field": "wkb"}, {"type": "int32", "optional": true, "field": "srid"}]}),
            "bytea",
        ),
        // tinyint(1) under Debezium's default: int16.
        (json!({"type": "int16"}), "smallint"),
    ];
    for (field, ddl) in cases {
        let held = crate::debezium::DebeziumColumn::new(&field).schema;
        assert_eq!(from_schema(&held).ddl, ddl, "{field} as {held}");
    }
    // With `column.propagate.source.type`: the same types.
    let propagated = json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "0", "__debezium.source.column.type": "BIGINT UNSIGNED",
        "__debezium.source.column.length": "20"}});
    let held = crate::debezium::DebeziumColumn::new(&propagated).schema;
    assert_eq!(from_schema(&held).ddl, "numeric(20,0)", "{held}");
    // MySQL's type names carry their attributes (`DECIMAL UNSIGNED
    // ZEROFILL`, `BIGINT UNSIGNED ZEROFILL`): still numbers.
    let propagated = json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10",
        "__debezium.source.column.type": "DECIMAL UNSIGNED ZEROFILL",
        "__debezium.source.column.length": "10", "__debezium.source.column.scale": "2"}});
    let held = crate::debezium::DebeziumColumn::new(&propagated).schema;
    assert_eq!(from_schema(&held).ddl, "numeric(10,2)", "{held}");
    let propagated = json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "0", "connect.decimal.precision": "20",
        "__debezium.source.column.type": "BIGINT UNSIGNED ZEROFILL",
        "__debezium.source.column.length": "20"}});
    let held = crate::debezium::DebeziumColumn::new(&propagated).schema;
    assert_eq!(from_schema(&held).ddl, "numeric(20,0)", "{held}");
    let propagated = json!({"type": "bytes", "name": "io.debezium.data.Bits",
        "parameters": {"length": "12", "__debezium.source.column.type": "BIT",
        "__debezium.source.column.length": "12"}});
    let held = crate::debezium::DebeziumColumn::new(&propagated).schema;
    assert_eq!(from_schema(&held).ddl, "bit varying(12)", "{held}");
    // oncely's own capture sends bit strings as text, without `length`.
    let own = json!({"type": "string", "parameters": {"__debezium.source.column.type": "BIT",
        "__debezium.source.column.length": "12"}});
    assert_eq!(from_schema(&own).ddl, "text");
}

/// Warehouse columns created before these types were mapped keep taking
/// the values (no type change, no dead letter): BIT(n) and SET as `text`,
/// BIGINT UNSIGNED as unbounded `numeric`, YEAR as `integer`.
#[test]
fn columns_created_before_the_mysql_mapping_keep_taking_values() {
    let held = |field: Value| from_schema(&crate::debezium::DebeziumColumn::new(&field).schema);
    let bits = held(json!({"type": "bytes", "name": "io.debezium.data.Bits",
        "parameters": {"length": "12"}}));
    let unsigned = held(
        json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "0"}}),
    );
    let year = held(json!({"type": "int32", "name": "io.debezium.time.Year"}));
    let geometry = held(json!({"type": "struct", "name": "io.debezium.data.geometry.Geometry"}));
    for (spec, actual) in [
        (&bits, "text"),
        (&unsigned, "numeric"),
        (&year, "integer"),
        (&geometry, "jsonb"),
    ] {
        assert!(
            compatible(spec, actual).is_ok(),
            "{} into {actual}",
            spec.ddl
        );
        assert_eq!(widened(spec, actual), None, "{} into {actual}", spec.ddl);
        assert_eq!(retyped(spec, actual), None, "{} into {actual}", spec.ddl);
    }
}

/// MySQL's TIME holds -838:59:59..838:59:59: a value outside the day is
/// refused by the SQL (a data error, the record's dead letter), never
/// wrapped into another time of day.
#[test]
fn times_outside_the_day_are_refused_not_wrapped() {
    let time = from_schema(&json!({"type": "int64", "name": "io.debezium.time.MicroTime"}));
    let sql = time.select_expr("v", "time without time zone");
    assert!(
        sql.contains("v::bigint >= 0 AND v::bigint < 86400000000"),
        "{sql}"
    );
    assert!(
        sql.contains("is outside the day a time holds')::time"),
        "{sql}"
    );
}

/// A Geometry struct is stored as its extended WKB in a `bytea` column, and
/// as its JSON text in a `jsonb` column created before that mapping.
#[test]
fn geometries_become_extended_wkb_or_stay_json_in_old_columns() {
    let spec =
        from_schema(&json!({"type": "struct", "name": "io.debezium.data.geometry.Geometry"}));
    // POINT(1 2) with SRID 4326.
    let text = r#"{"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAABA","srid":4326}"#;
    let bytea = spec.conv.pg_text(Cow::Borrowed(text), "bytea");
    assert_eq!(bytea, "AQEAACDmEAAAAAAAAAAA8D8AAAAAAAAAQA==");
    assert_eq!(
        spec.select_expr("v", "bytea"),
        "(decode(v, 'base64'))::bytea"
    );
    assert_eq!(spec.conv.pg_text(Cow::Borrowed(text), "jsonb"), text);
    assert_eq!(spec.select_expr("v", "jsonb"), "(v)::jsonb");
    // Anything else is sent as it is, and `decode` refuses it.
    assert_eq!(spec.conv.pg_text(Cow::Borrowed("[1]"), "bytea"), "[1]");
}
