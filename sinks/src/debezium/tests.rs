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
    recover_schemaless(row.as_object_mut().unwrap()).unwrap();
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
