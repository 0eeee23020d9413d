use super::values::*;
use super::*;
use serde_json::json;

#[test]
fn decimals_keep_every_digit_and_their_scale() {
    // Values as Debezium 3.6.1 wrote them for numeric(12,2) and numeric.
    assert_eq!(decimal_text("P9I=", 2).unwrap(), "163.38");
    assert_eq!(decimal_text("AA==", 2).unwrap(), "0.00");
    assert_eq!(decimal_text("/xcrWvAB", 2).unwrap(), "-9999999999.99");
    assert_eq!(decimal_text("AQ==", 20).unwrap(), "0.00000000000000000001");
    assert_eq!(decimal_text("+Q==", 0).unwrap(), "-7");
    assert_eq!(
        decimal_text("XODppWAV/sWq36MorjmBFQ==", 9).unwrap(),
        "123456789012345678901234567890.123456789"
    );
    assert_eq!(decimal_text("BNI=", 2).unwrap(), "12.34");
    assert_eq!(decimal_text("gA==", 0).unwrap(), "-128");
    assert_eq!(decimal_text("/w==", 3).unwrap(), "-0.001");
    assert_eq!(decimal_text("", 0).unwrap(), "0");
    assert_eq!(decimal_text("Bw==", -2).unwrap(), "700");
    assert!(decimal_text("not base64!", 2).is_err());
}

#[test]
fn fractions_get_six_digits_as_capture_writes_them() {
    assert_eq!(
        six_digit_fraction("2026-11-27T13:10:35.670Z"),
        "2026-11-27T13:10:35.670000Z"
    );
    assert_eq!(
        six_digit_fraction("2026-11-27T13:10:35.670111Z"),
        "2026-11-27T13:10:35.670111Z"
    );
    assert_eq!(
        six_digit_fraction("1970-01-01T00:00:00Z"),
        "1970-01-01T00:00:00.000000Z"
    );
    assert_eq!(
        six_digit_fraction("-0043-03-15T12:00:00.5Z"),
        "-0043-03-15T12:00:00.500000Z"
    );
    assert_eq!(six_digit_fraction("06:30:00Z"), "06:30:00.000000Z");
    assert_eq!(
        six_digit_fraction("06:30:00.1-05:00"),
        "06:30:00.100000-05:00"
    );
    assert_eq!(
        six_digit_fraction("2026-01-01T00:00:00.123456789Z"),
        "2026-01-01T00:00:00.123456Z"
    );
}

#[test]
fn bits_become_bit_strings_of_their_length() {
    assert_eq!(bit_string(&[0xAA], Some(8)), "10101010");
    assert_eq!(bit_string(&[0x01], Some(8)), "00000001");
    assert_eq!(bit_string(&[0x01], Some(16)), "0000000000000001");
    assert_eq!(bit_string(&[0x02, 0x01], Some(12)), "000100000010");
    // varbit: Debezium sends no length, so leading zeros are gone.
    assert_eq!(bit_string(&[0x06], None), "110");
    assert_eq!(bit_string(&[], None), "0");
}

#[test]
fn oncely_schemas_need_no_plan() {
    let schema = Arc::new(json!({"type": "struct", "fields": [
        {"type": "struct", "field": "after", "fields": [
            {"type": "int64", "field": "id"},
            {"type": "string", "field": "n", "parameters": {"__debezium.source.column.type": "NUMERIC"}},
            {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "ts"},
            {"type": "int32", "name": "io.debezium.time.Date", "version": 1, "field": "d"},
            {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}, "field": "da"}
        ]},
        {"type": "struct", "field": "source", "fields": []}
    ]}));
    assert!(plan_for(&schema, Layout::Envelope).is_none());
}

#[test]
fn schemaless_structs_and_binary_markers_are_recovered() {
    let mut row = json!({
        "n": {"scale": 20, "value": "AQ=="},
        "pt": {"x": 1.5, "y": -2.0, "wkb": "AQEAAAAAAAAAAAD4PwAAAAAAAADA", "srid": null},
        "na": [{"scale": 1, "value": "Cw=="}],
        "by": UNAVAILABLE_BASE64,
        "t": "P9I=",
        "jb": "{\"scale\": 1}"
    });
    recover_schemaless(row.as_object_mut().unwrap(), &mut Budget::for_record(256)).unwrap();
    assert_eq!(
        row,
        json!({
            "n": "0.00000000000000000001",
            "pt": "(1.5,-2)",
            "na": ["1.1"],
            "by": UNAVAILABLE,
            // Without its schema a base64 Decimal is text: nothing tells them apart.
            "t": "P9I=",
            "jb": "{\"scale\": 1}"
        })
    );
}

fn schemaless_debezium_event(after: Value) -> ChangeEvent {
    let bytes = serde_json::to_vec(&json!({
        "before": null, "after": after, "op": "c",
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "lsn": 24023128}
    }))
    .unwrap();
    match crate::event::decode_value(Some(&bytes)) {
        Ok(crate::Payload::Change(e)) => *e,
        other => panic!("expected a change, got {other:?}"),
    }
}

#[test]
fn schemaless_debezium_events_are_refused_naming_the_setting_and_columns() {
    let e = schemaless_debezium_event(json!({"id": 1, "name": "Anne B.", "n122": "P9I="}));
    let err = refuse_schemaless(&e).expect("refused");
    assert!(err.reason.contains("decimal.handling.mode=string"), "{err}");
    assert!(err.reason.contains("debezium.schemaless.accept"), "{err}");
    assert!(err.reason.contains("such decimals: n122)"), "{err}");
}

#[test]
fn events_with_schemas_or_from_capture_are_never_refused() {
    let e = change_with_schema();
    assert!(refuse_schemaless(&e).is_none());
    let bytes = serde_json::to_vec(&json!({
        "after": {"id": 1, "n": "P9I="}, "op": "c",
        "source": {"commit_lsn": 5, "event_seq": 1, "lsn": 5}
    }))
    .unwrap();
    match crate::event::decode_value(Some(&bytes)) {
        Ok(crate::Payload::Change(e)) => assert!(refuse_schemaless(&e).is_none()),
        other => panic!("expected a change, got {other:?}"),
    }
}

fn change_with_schema() -> ChangeEvent {
    let bytes = serde_json::to_vec(&json!({
        "schema": {"type": "struct", "fields": [
            {"type": "struct", "optional": true, "field": "after", "fields": [
                {"type": "int64", "optional": false, "field": "id"}]}]},
        "payload": {"after": {"id": 1}, "op": "c", "source": {"lsn": 5}}
    }))
    .unwrap();
    match crate::event::decode_value(Some(&bytes)) {
        Ok(crate::Payload::Change(e)) => *e,
        other => panic!("expected a change, got {other:?}"),
    }
}

/// The schoolbook conversion one byte at a time: what the digits must equal.
fn reference_digits(bytes: &[u8]) -> String {
    let mut limbs: Vec<u32> = Vec::new();
    for &byte in bytes {
        let mut carry = u64::from(byte);
        for limb in limbs.iter_mut() {
            let v = u64::from(*limb) * 256 + carry;
            *limb = (v % 1_000_000_000) as u32;
            carry = v / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push((carry % 1_000_000_000) as u32);
            carry /= 1_000_000_000;
        }
    }
    let Some((top, rest)) = limbs.split_last() else {
        return "0".to_owned();
    };
    let mut out = top.to_string();
    for limb in rest.iter().rev() {
        out.push_str(&format!("{limb:09}"));
    }
    out
}

#[test]
fn a_decimal_scale_beyond_postgresql_numeric_is_refused_before_allocating() {
    // 2,000,000,000 zeros would be written before this returned.
    let mut v = json!({"scale": 2_000_000_000, "value": "AQ=="});
    let e = convert(
        &Conv::VariableScaleDecimal,
        &mut v,
        &mut Budget::for_record(64),
    )
    .expect_err("refused");
    assert!(e.contains("scale 2000000000"), "{e}");
    assert!(decimal_text("AQ==", 2_000_000_000).is_err());
    assert!(decimal_text("AQ==", -2_000_000_000).is_err());
    // PostgreSQL's own extremes still convert.
    let smallest = decimal_text("AQ==", 16383).expect("dscale 16383");
    assert_eq!(smallest.len(), 16385);
    assert!(smallest.starts_with("0.000") && smallest.ends_with("01"));
    assert_eq!(
        decimal_text("Bw==", -1000).expect("scale -1000").len(),
        1001
    );
}

#[test]
fn bits_longer_than_their_bytes_hold_are_refused_before_allocating() {
    // A 2 GiB bit string would be built from one byte.
    let mut v = json!("AQ==");
    let e = convert(
        &Conv::Bits {
            length: Some(i32::MAX as u32 - 1),
        },
        &mut v,
        &mut Budget::for_record(64),
    )
    .expect_err("refused");
    assert!(e.contains("2147483646 bits"), "{e}");
    // Debezium pads bit(n) to whole bytes: every real length still converts.
    let mut v = json!("AQI=");
    convert(
        &Conv::Bits { length: Some(12) },
        &mut v,
        &mut Budget::for_record(64),
    )
    .expect("bit(12)");
    assert_eq!(v, json!("001000000001"));
}

#[test]
fn a_decimal_larger_than_postgresql_numeric_is_refused_quickly() {
    // 700 KB of unscaled value: about 10^11 steps of the quadratic conversion.
    let huge = BASE64.encode(vec![0x5a; 700 * 1024]);
    let started = std::time::Instant::now();
    let e = decimal_text(&huge, 2).expect_err("refused");
    assert!(e.contains("716800 bytes"), "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn decimal_digits_match_the_schoolbook_conversion_up_to_postgresql_numeric() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for len in [1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 1000, 4099] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        assert_eq!(
            magnitude_digits(&bytes),
            reference_digits(&bytes),
            "{len} bytes"
        );
    }
    assert_eq!(magnitude_digits(&[0, 0, 0, 0, 1]), "1");
    assert_eq!(magnitude_digits(&[0; 9]), "0");
    // The largest numeric PostgreSQL holds (147,455 digits) converts.
    let too_large = BASE64.encode(vec![0x7f; MAX_DECIMAL_BYTES]);
    let e = decimal_text(&too_large, MAX_NUMERIC_SCALE).expect_err("147,457 digits");
    assert!(e.contains("131074 digits before the point"), "{e}");
    let largest = vec![0x7f; MAX_DECIMAL_BYTES - 1];
    let started = std::time::Instant::now();
    let digits = magnitude_digits(&largest);
    assert!(digits.len() <= MAX_NUMERIC_DIGITS, "{}", digits.len());
    assert_eq!(
        decimal_text(&BASE64.encode(&largest), MAX_NUMERIC_SCALE)
            .expect("the largest numeric")
            .len(),
        digits.len() + 1
    );
    eprintln!("{} digits in {:?}", digits.len(), started.elapsed());
}

/// A Debezium event with `n` VariableScaleDecimal columns, each `value` at `scale`.
fn many_decimals(n: usize, scale: i64) -> Vec<u8> {
    let columns: Vec<Value> = (0..n)
        .map(|i| {
            json!({"type": "struct", "optional": true, "field": format!("n{i}"),
            "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
            "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]})
        })
        .collect();
    let after: Map<String, Value> = (0..n)
        .map(|i| (format!("n{i}"), json!({"scale": scale, "value": "AQ=="})))
        .collect();
    serde_json::to_vec(&json!({
        "schema": {"type": "struct", "fields": [
            {"type": "struct", "optional": true, "field": "after", "fields": columns},
            {"type": "struct", "field": "source", "fields": []}]},
        "payload": {"after": after, "op": "c", "source": {"lsn": 7}}
    }))
    .unwrap()
}

#[test]
fn normalized_values_stay_within_the_record_budget() {
    // 200 columns of 16,383-digit fractions from a record of about 20 KB: 3.3 MB.
    let record = many_decimals(200, 16383);
    match crate::event::decode_value(Some(&record)) {
        Err(e) => assert!(e.reason.contains("budget"), "{e}"),
        Ok(_) => panic!("a record growing 160-fold was accepted"),
    }
    // The same columns with ordinary scales convert.
    let record = many_decimals(200, 2);
    assert!(crate::event::decode_value(Some(&record)).is_ok());
}

#[test]
fn one_column_is_held_as_the_runner_holds_it() {
    // Debezium's MySQL decimal(12,2): text, its schema a NUMERIC string.
    let decimal = DebeziumColumn::new(&json!({
        "type": "bytes", "optional": true, "field": "amount",
        "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "12"}
    }));
    let mut v = json!("/xcrWvAB");
    decimal.convert(&mut v).unwrap();
    assert_eq!(v, json!("-9999999999.99"));
    assert_eq!(decimal.schema["type"], json!("string"));
    assert_eq!(
        decimal.schema["parameters"]["__debezium.source.column.scale"],
        json!("2")
    );
    let mut null = Value::Null;
    decimal.convert(&mut null).unwrap();
    assert_eq!(null, Value::Null);
    assert!(decimal.convert(&mut json!("not base64!")).is_err());
    // A DATETIME(3)'s ms become µs; an int64 passes untouched.
    let ms = DebeziumColumn::new(&json!({"type": "int64", "name": "io.debezium.time.Timestamp"}));
    let mut v = json!(1_500);
    ms.convert(&mut v).unwrap();
    assert_eq!(v, json!(1_500_000));
    let plain = DebeziumColumn::new(&json!({"type": "int64", "field": "id"}));
    let mut v = json!(7);
    plain.convert(&mut v).unwrap();
    assert_eq!(
        (v, plain.schema),
        (json!(7), json!({"type": "int64", "field": "id"}))
    );
}
