//! Column values (pgoutput text format) -> JSON, following Debezium's
//! default PostgreSQL type mapping so that Debezium consumers read oncely
//! topics unchanged (docs/design.md, "Wire format"). Deliberate choices:
//!
//! - `numeric`/`decimal` are exact strings (Debezium's
//!   `decimal.handling.mode=string`); their schema carries the source type,
//!   precision and scale as `__debezium.source.column.*` parameters, as
//!   Debezium's `column.propagate.source.type` would, so a sink can still
//!   create a `numeric(p,s)` column.
//! - `money` is an exact digit string with the currency formatting removed
//!   (see [`scalar::normalize_money`] for how locales are read).
//! - `float4`/`float8` values are JSON numbers, except the non-finite ones,
//!   which JSON numbers cannot hold: they are exactly the strings `"NaN"`,
//!   `"Infinity"` and `"-Infinity"` (what Kafka Connect's JSON converter
//!   writes for them), and a float field carries no other string
//!   ([`scalar::parse_float`]). Sinks accept these three in float fields.
//! - Dates and times cover PostgreSQL's whole range ([`temporal`]):
//!   `infinity`/`-infinity` of `timestamp` and `date` are PostgreSQL's own
//!   sentinels (`i64::MAX`/`i64::MIN` µs, `i32::MAX`/`i32::MIN` days); a
//!   `timestamp` the 64 bits cannot hold otherwise is refused
//!   ([`Unrepresentable`]), never sent as a string in an integer field.
//! - `timestamptz` is always written with six fraction digits, years as
//!   java.time writes them (`-0043` is 44 BC, `+10000`).
//! - `interval` is Debezium's `interval.handling.mode`: `string` (our
//!   default, exact: `P1Y2M3DT4H5M6.789S`) or `numeric` (µs, a month of
//!   30.4375 days, [`temporal::MICROS_PER_MONTH`]).
//!
//! A value of another type that does not parse as its type expects (a type
//! we do not know) is emitted as its text, in a string field.

mod array;
mod interval;
mod kind;
mod registry;
mod scalar;
mod temporal;

use serde_json::Value;

pub use kind::ValueKind;
#[cfg(test)]
pub use registry::PgType;
#[cfg(any(test, feature = "testing"))]
pub use registry::PgTypeKind;
pub use registry::TypeRegistry;

pub use crate::config::IntervalHandlingMode;

#[cfg(test)]
pub use oncely_core::wire::UNAVAILABLE_VALUE;

/// The JSON for one column value in PostgreSQL text format.
pub fn to_json(reg: &TypeRegistry, type_oid: u32, text: &str) -> Value {
    reg.value_kind(type_oid).to_json(text)
}

/// The Kafka Connect JSON schema of one field, e.g.
/// `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"created"}`.
/// `type_modifier` is the column's `atttypmod` (-1 when none).
#[cfg(test)]
pub fn field_schema(
    reg: &TypeRegistry,
    type_oid: u32,
    type_modifier: i32,
    field: &str,
    optional: bool,
) -> Value {
    reg.value_kind(type_oid)
        .field_schema(type_modifier, field, optional)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn j(oid: u32, text: &str) -> Value {
        let reg = TypeRegistry::builtin();
        let value = to_json(&reg, oid, text);
        // The byte writer must agree with the Value builder.
        let mut out = Vec::new();
        if reg.value_kind(oid).write_json(text, &mut out).is_err() {
            assert!(out.is_empty(), "nothing written for a refused value");
            assert_eq!(value, json!(text));
            return value;
        }
        let written: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            written, value,
            "writer and builder differ for {oid} {text:?}"
        );
        value
    }

    #[test]
    fn booleans() {
        assert_eq!(j(16, "t"), json!(true));
        assert_eq!(j(16, "f"), json!(false));
    }

    #[test]
    fn integers() {
        assert_eq!(j(21, "-32768"), json!(-32768));
        assert_eq!(j(23, "2147483647"), json!(2_147_483_647));
        assert_eq!(j(20, "-9223372036854775808"), json!(i64::MIN));
        assert_eq!(j(26, "4294967295"), json!(4_294_967_295_u32));
        assert_eq!(j(20, "99999999999999999999"), json!("99999999999999999999"));
    }

    #[test]
    fn floats() {
        assert_eq!(j(701, "1.5"), json!(1.5));
        assert_eq!(j(701, "-1.25e+20"), json!(-1.25e20));
        assert_eq!(j(700, "0.1"), json!(0.1));
        assert_eq!(j(701, "NaN"), json!("NaN"));
        assert_eq!(j(701, "Infinity"), json!("Infinity"));
        assert_eq!(j(700, "-Infinity"), json!("-Infinity"));
        // Beyond a `float` (what Elasticsearch maps a JSON double to) and
        // at the edge of a double: JSON numbers, exactly.
        assert_eq!(j(701, "1e+308"), json!(1e308));
        assert_eq!(j(701, "-2.5e-300"), json!(-2.5e-300));
        assert_eq!(j(700, "3.4028235e+38"), json!(3.402_823_5e38));
    }

    #[test]
    fn non_finite_floats_are_the_three_connect_strings_and_nothing_else() {
        for (text, wire) in [
            ("nan", "NaN"),
            ("inf", "Infinity"),
            ("+Infinity", "Infinity"),
            ("-inf", "-Infinity"),
            ("-INFINITY", "-Infinity"),
        ] {
            assert_eq!(j(701, text), json!(wire), "{text}");
            assert_eq!(j(700, text), json!(wire), "{text}");
        }
        // Finite text that is not a JSON literal is respelled as one.
        assert_eq!(j(701, ".5"), json!(0.5));
        assert_eq!(j(701, "+1"), json!(1.0));
        let mut out = Vec::new();
        ValueKind::Float64
            .write_json("1.", &mut out)
            .expect("a finite float");
        assert_eq!(out, b"1.0");
        // In arrays too.
        assert_eq!(
            j(1022, "{1e+308,NaN,-Infinity,NULL}"),
            json!([1e308, "NaN", "-Infinity", null])
        );
    }

    #[test]
    fn float_text_is_written_verbatim() {
        let mut out = Vec::new();
        ValueKind::Float32.write_json("0.1", &mut out).unwrap();
        assert_eq!(out, b"0.1");
    }

    #[test]
    fn numerics_are_exact_strings() {
        assert_eq!(
            j(1700, "12345678901234567890.123456789"),
            json!("12345678901234567890.123456789")
        );
        assert_eq!(j(1700, "NaN"), json!("NaN"));
        assert_eq!(j(1700, "-Infinity"), json!("-Infinity"));
        assert_eq!(j(790, "-$1,234.56"), json!("-1234.56"));
    }

    #[test]
    fn text_types() {
        for oid in [18, 19, 25, 1042, 1043] {
            assert_eq!(j(oid, "héllo \"x\"\n"), json!("héllo \"x\"\n"));
        }
        assert_eq!(j(1042, "ab   "), json!("ab   "));
    }

    #[test]
    fn temporal_types() {
        assert_eq!(
            j(1184, "2026-11-27 15:10:35.670111+00"),
            json!("2026-11-27T15:10:35.670111Z")
        );
        assert_eq!(
            j(1184, "2026-11-27 17:10:35+02"),
            json!("2026-11-27T15:10:35.000000Z")
        );
        assert_eq!(j(1184, "infinity"), json!("infinity"));
        assert_eq!(
            j(1184, "0044-03-15 12:00:00+00 BC"),
            json!("-0043-03-15T12:00:00.000000Z")
        );
        assert_eq!(j(1114, "1970-01-01 00:00:01.5"), json!(1_500_000));
        assert_eq!(j(1114, "-infinity"), json!(i64::MIN));
        assert_eq!(j(1114, "infinity"), json!(i64::MAX));
        assert_eq!(j(1082, "1970-01-02"), json!(1));
        assert_eq!(j(1082, "infinity"), json!(i32::MAX));
        assert_eq!(j(1082, "-infinity"), json!(i32::MIN));
        assert_eq!(j(1083, "00:00:01"), json!(1_000_000));
        assert_eq!(j(1083, "24:00:00"), json!(86_400_000_000_i64));
        assert_eq!(j(1266, "10:00:00+01"), json!("09:00:00.000000Z"));
        assert_eq!(j(1186, "1 day 00:00:01"), json!("P0Y0M1DT0H0M1S"));
        assert_eq!(
            j(1186, "1 year 2 mons 3 days 04:05:06.789"),
            json!("P1Y2M3DT4H5M6.789S")
        );
        let numeric = TypeRegistry::builtin().with_interval_mode(IntervalHandlingMode::Numeric);
        assert_eq!(
            numeric.value_kind(1186).to_json("1 day 00:00:01"),
            json!(86_401_000_000_i64)
        );
        // Another DateStyle is not guessed at: the text passes through.
        assert_eq!(
            j(1184, "Fri Nov 27 15:10:35 2026 UTC"),
            json!("Fri Nov 27 15:10:35 2026 UTC")
        );
    }

    /// A value an integer field cannot hold is refused, never written as a
    /// string in that field: a field's type is the schema's promise.
    #[test]
    fn values_integer_fields_cannot_hold_are_refused() {
        let reg = TypeRegistry::builtin();
        let numeric = TypeRegistry::builtin().with_interval_mode(IntervalHandlingMode::Numeric);
        let refused = |reg: &TypeRegistry, oid: u32, text: &str| {
            let mut out = Vec::new();
            let result = reg.value_kind(oid).write_json(text, &mut out);
            result.is_err() && out.is_empty()
        };
        assert!(refused(&reg, 1114, "294276-12-31 23:59:59.999999"));
        assert!(refused(&reg, 1115, "{\"294276-12-31 23:59:59\"}"));
        assert!(refused(&numeric, 1186, "-178000000 years"));
        assert!(!refused(&reg, 1186, "-178000000 years"));
        assert_eq!(
            reg.value_kind(1186).to_json("-178000000 years"),
            json!("P-178000000Y0M0DT0H0M0S")
        );
        // Arrays follow their elements.
        assert_eq!(
            j(1182, "{infinity,4713-01-01 BC,NULL}"),
            json!([i32::MAX, -2_440_550, null])
        );
        assert_eq!(
            j(1187, "{\"1 mon\",-00:00:01}"),
            json!(["P0Y1M0DT0H0M0S", "P0Y0M0DT0H0M-1S"])
        );
    }

    #[test]
    fn binary_json_uuid_xml() {
        assert_eq!(j(17, "\\x68656c6c6f"), json!("aGVsbG8="));
        assert_eq!(j(114, r#"{"a": [1, 2]}"#), json!(r#"{"a": [1, 2]}"#));
        assert_eq!(j(3802, r#"{"a": 1}"#), json!(r#"{"a": 1}"#));
        assert_eq!(
            j(2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            json!("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
        );
        assert_eq!(j(142, "<a/>"), json!("<a/>"));
    }

    #[test]
    fn other_types_are_text() {
        assert_eq!(j(869, "192.168.0.1/24"), json!("192.168.0.1/24"));
        assert_eq!(j(1560, "101"), json!("101"));
        assert_eq!(j(600, "(1,2)"), json!("(1,2)"));
        assert_eq!(j(123_456, "whatever"), json!("whatever"));
    }

    #[test]
    fn arrays() {
        assert_eq!(j(1007, "{1,2,NULL}"), json!([1, 2, null]));
        assert_eq!(j(1007, "{{1,2},{3,4}}"), json!([[1, 2], [3, 4]]));
        assert_eq!(
            j(1009, r#"{a,"b,c","x\"y",NULL,"NULL"}"#),
            json!(["a", "b,c", "x\"y", null, "NULL"])
        );
        assert_eq!(j(1000, "{t,f}"), json!([true, false]));
        assert_eq!(
            j(1185, r#"{"2026-11-27 15:10:35+00"}"#),
            json!(["2026-11-27T15:10:35.000000Z"])
        );
        assert_eq!(j(1231, "{1.50,NaN}"), json!(["1.50", "NaN"]));
        assert_eq!(j(1022, "{1.5,NaN}"), json!([1.5, "NaN"]));
        assert_eq!(j(1001, r#"{"\\x00ff"}"#), json!(["AP8="]));
        assert_eq!(
            j(1020, "{(1,1),(0,0);(2,2),(1,1)}"),
            json!(["(1,1),(0,0)", "(2,2),(1,1)"])
        );
        assert_eq!(j(1007, "[0:1]={5,6}"), json!([5, 6]));
        assert_eq!(j(1007, "{}"), json!([]));
        assert_eq!(j(1007, "{1,2"), json!("{1,2"));
    }

    #[test]
    fn enums_and_domains() {
        let mut reg = TypeRegistry::builtin();
        reg.insert(
            16_400,
            PgType {
                name: "public.mood".into(),
                kind: PgTypeKind::Enum {
                    labels: vec!["sad".into(), "happy".into()],
                },
            },
        );
        reg.insert(
            16_401,
            PgType {
                name: "public.ts".into(),
                kind: PgTypeKind::Domain { base_oid: 1114 },
            },
        );
        assert_eq!(to_json(&reg, 16_400, "happy"), json!("happy"));
        assert_eq!(
            to_json(&reg, 16_401, "1970-01-01 00:00:00.000001"),
            json!(1)
        );
        assert_eq!(
            field_schema(&reg, 16_400, -1, "m", true),
            json!({"type": "string", "optional": true, "name": "io.debezium.data.Enum",
                   "version": 1, "parameters": {"allowed": "sad,happy"}, "field": "m"})
        );
    }

    #[test]
    fn schemas() {
        let reg = TypeRegistry::builtin();
        let s = |oid, typmod| field_schema(&reg, oid, typmod, "f", true);
        assert_eq!(
            s(1114, -1).to_string(),
            r#"{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"f"}"#
        );
        assert_eq!(
            s(16, -1),
            json!({"type": "boolean", "optional": true, "field": "f"})
        );
        assert_eq!(s(21, -1)["type"], "int16");
        assert_eq!(s(26, -1)["type"], "int64");
        assert_eq!(s(700, -1)["type"], "float");
        assert_eq!(s(701, -1)["type"], "double");
        assert_eq!(s(17, -1)["type"], "bytes");
        assert_eq!(s(1184, -1)["name"], "io.debezium.time.ZonedTimestamp");
        assert_eq!(s(1082, -1)["type"], "int32");
        assert_eq!(s(1083, -1)["name"], "io.debezium.time.MicroTime");
        assert_eq!(s(1266, -1)["name"], "io.debezium.time.ZonedTime");
        assert_eq!(
            s(1186, -1),
            json!({"type": "string", "optional": true, "name": "io.debezium.time.Interval",
                   "version": 1, "field": "f"})
        );
        let numeric = TypeRegistry::builtin().with_interval_mode(IntervalHandlingMode::Numeric);
        assert_eq!(
            field_schema(&numeric, 1186, -1, "f", true)["name"],
            "io.debezium.time.MicroDuration"
        );
        assert_eq!(s(3802, -1)["name"], "io.debezium.data.Json");
        assert_eq!(s(2950, -1)["name"], "io.debezium.data.Uuid");
        assert_eq!(
            s(1700, (12 << 16 | 2) + 4),
            json!({"type": "string", "optional": true, "parameters": {
                "__debezium.source.column.type": "NUMERIC",
                "__debezium.source.column.length": "12",
                "__debezium.source.column.scale": "2"}, "field": "f"})
        );
        assert_eq!(
            s(1043, 20 + 4),
            json!({"type": "string", "optional": true, "parameters": {
                "__debezium.source.column.type": "VARCHAR",
                "__debezium.source.column.length": "20"}, "field": "f"})
        );
        assert_eq!(
            s(1043, -1),
            json!({"type": "string", "optional": true, "field": "f"})
        );
        assert_eq!(
            s(1700, -1)["parameters"],
            json!({"__debezium.source.column.type": "NUMERIC"})
        );
        assert_eq!(
            field_schema(&reg, 1016, -1, "a", false),
            json!({"type": "array", "items": {"type": "int64", "optional": true},
                   "optional": false, "field": "a"})
        );
    }

    proptest! {
        #[test]
        fn integers_round_trip(n in any::<i64>()) {
            prop_assert_eq!(j(20, &n.to_string()), json!(n));
        }

        #[test]
        fn int4_round_trip(n in any::<i32>()) {
            prop_assert_eq!(j(23, &n.to_string()), json!(n));
        }

        #[test]
        fn int_arrays_round_trip(v in proptest::collection::vec(proptest::option::of(any::<i64>()), 0..8)) {
            let text = format!(
                "{{{}}}",
                v.iter()
                    .map(|x| x.map_or_else(|| "NULL".to_owned(), |n| n.to_string()))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            prop_assert_eq!(j(1016, &text), json!(v));
        }

        #[test]
        fn arbitrary_text_never_fails(oid in prop::sample::select(vec![
            16u32, 17, 20, 21, 23, 700, 701, 790, 1082, 1083, 1114, 1184, 1186, 1266, 1007, 1009, 1185,
        ]), text in "\\PC{0,24}") {
            let _ = j(oid, &text);
        }
    }
}
