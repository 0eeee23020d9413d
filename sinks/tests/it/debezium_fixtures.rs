//! Records a real Debezium 3.6.1.Final PostgreSQL connector wrote (Kafka
//! Connect standalone on the test servers; `sinks/tests/fixtures/debezium/`,
//! each `{"description", "connector" (settings other than the defaults),
//! "key", "value"}`) decode into oncely's wire form: the values and schema
//! oncely's capture sends for the same PostgreSQL types.
use std::path::PathBuf;

use oncely_sinks::event::{decode_key, decode_value, Bookkeeping};
use oncely_sinks::{ChangeEvent, Op, Payload, VersionOrigin};
use serde_json::{json, Map, Value};

fn fixture(name: &str) -> (Option<Value>, Payload) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/debezium")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let f: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let bytes = |v: &Value| (!v.is_null()).then(|| serde_json::to_vec(v).expect("JSON"));
    let key = decode_key(bytes(&f["key"]).as_deref()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let value =
        decode_value(bytes(&f["value"]).as_deref()).unwrap_or_else(|e| panic!("{name}: {e}"));
    (key, value)
}

fn change(name: &str) -> ChangeEvent {
    match fixture(name).1 {
        Payload::Change(e) => *e,
        other => panic!("{name}: expected a change, got {other:?}"),
    }
}

fn after(e: &ChangeEvent) -> &Map<String, Value> {
    e.after.as_ref().expect("after")
}

/// The schema of column `c` in the event's `after` struct.
fn column_schema<'a>(e: &'a ChangeEvent, c: &str) -> &'a Value {
    let schema = e.schema.as_deref().expect("schema");
    let after = schema["fields"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["field"] == "after"))
        .expect("after struct");
    after["fields"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["field"] == c))
        .unwrap_or_else(|| panic!("no schema for {c}"))
}

fn assert_columns(e: &ChangeEvent, expected: Value) {
    let row = after(e);
    for (column, want) in expected.as_object().expect("object") {
        assert_eq!(row.get(column), Some(want), "column {column}");
    }
}

#[test]
fn defaults_decode_into_oncely_values_and_schema() {
    let e = change("defaults_snapshot_all_types.json");
    assert_eq!(e.op, Op::Read);
    assert_eq!(e.version_origin, VersionOrigin::SourceLsn);
    assert_columns(
        &e,
        json!({
            "n122": "163.38",
            "n": "0.00000000000000000001",
            "m": "12.34",
            "by": "AP8Q",
            "tz": "2026-11-27T13:10:35.670111Z",
            "tz3": "2026-11-27T13:10:35.670000Z",
            "ts": -1,
            "ts3": 946_684_800_123_000i64,
            "d": -25509,
            "tm": 86_399_999_999i64,
            "tm3": 45_296_500_000i64,
            "ttz": "06:30:00.000000Z",
            "iv": 273_906_789_000i64,
            "bits": "10101010",
            "vb": "110",
            "pt": "(1.5,-2)",
            "na": ["1.1", "2.5"],
            "ua": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
            "ea": ["sad", "happy"],
            "da": [20454, 10956],
            "j": "{\"a\": [1, 2.50, null], \"b\": \"x\"}",
            "e": "sad",
        }),
    );
    let n122 = column_schema(&e, "n122");
    assert_eq!(n122["type"], "string");
    assert!(n122.get("name").is_none());
    assert_eq!(
        n122["parameters"],
        json!({"__debezium.source.column.type": "NUMERIC",
               "__debezium.source.column.length": "12",
               "__debezium.source.column.scale": "2"})
    );
    assert_eq!(column_schema(&e, "n")["type"], "string");
    assert!(column_schema(&e, "n").get("fields").is_none());
    assert_eq!(
        column_schema(&e, "ts3")["name"],
        "io.debezium.time.MicroTimestamp"
    );
    assert_eq!(
        column_schema(&e, "tm3")["name"],
        "io.debezium.time.MicroTime"
    );
    assert_eq!(column_schema(&e, "tm3")["type"], "int64");
    assert_eq!(column_schema(&e, "bits")["type"], "string");
    assert_eq!(column_schema(&e, "pt")["type"], "string");
    assert_eq!(column_schema(&e, "na")["items"]["type"], "string");
}

#[test]
fn numeric_and_time_edges_keep_every_digit() {
    let e = change("defaults_snapshot_numeric_edges.json");
    assert_columns(
        &e,
        json!({"n122": "-9999999999.99", "n": "123456789012345678901234567890.123456789"}),
    );
    let e = change("defaults_snapshot_time_edges.json");
    assert_columns(
        &e,
        json!({"n122": "0.00", "n": "-7", "d": -719162, "tm": 0, "ts": 9_223_372_036_000_000i64}),
    );
    // numeric NaN: Debezium's precise mode sends null; time(3) and timestamp(3) in ms.
    let e = change("defaults_insert_time3.json");
    assert_columns(
        &e,
        json!({"n": null, "tm3": 3_723_456_000i64, "ts3": -315_619_199_999_000i64}),
    );
}

#[test]
fn unchanged_toast_deletes_and_tombstones() {
    let e = change("defaults_update_unchanged_toast.json");
    assert_eq!(e.op, Op::Update);
    assert_columns(&e, json!({"big": "__debezium_unavailable_value", "i4": 43}));
    let e = change("defaults_delete.json");
    assert_eq!(e.op, Op::Delete);
    assert_eq!(e.before.as_ref().and_then(|b| b.get("id")), Some(&json!(2)));
    let (key, value) = fixture("defaults_tombstone.json");
    assert_eq!(key, Some(json!({"id": 2})));
    assert_eq!(value, Payload::Tombstone);
}

#[test]
fn decimal_string_time_connect_binary_hex() {
    let e = change("string_connect_hex_snapshot_all_types.json");
    assert_columns(
        &e,
        json!({
            "n122": "163.38",
            "na": ["1.10", "2.5"],
            "ts3": 946_684_800_123_000i64,
            // time.precision.mode=connect has milliseconds only: Debezium drops the rest.
            "tm": 86_399_999_000i64,
            "tm3": 45_296_500_000i64,
            "d": -25509,
            "da": [20454, 10956],
            "iv": "P0Y0M3DT4H5M6.789S",
            "tz3": "2026-11-27T13:10:35.670000Z",
        }),
    );
    assert_eq!(
        column_schema(&e, "ts")["name"],
        "io.debezium.time.MicroTimestamp"
    );
    assert_eq!(
        column_schema(&e, "tm")["name"],
        "io.debezium.time.MicroTime"
    );
    assert_eq!(column_schema(&e, "d")["name"], "io.debezium.time.Date");
    assert_eq!(
        column_schema(&e, "da")["items"]["name"],
        "io.debezium.time.Date"
    );
    let e = change("string_connect_hex_insert_bytes.json");
    assert_columns(&e, json!({"by": "", "iv": "P1Y2M3DT4H5M6.789S"}));
}

#[test]
fn decimal_double_micro_time_binary_base64_with_source_types() {
    let e = change("double_micro_base64_snapshot_all_types.json");
    assert_columns(
        &e,
        json!({"n122": 163.38, "tm3": 45_296_500_000i64, "bits": "10101010", "vb": "110"}),
    );
    // base64 (or hex) text stays text: nothing says which encoding it is.
    assert_eq!(column_schema(&e, "by")["type"], "string");
    let e = change("double_micro_base64_update_bytes.json");
    assert_columns(&e, json!({"by": "AQI="}));
}

#[test]
fn schemas_off_recovers_what_the_values_show() {
    let e = change("schemaless_snapshot_all_types.json");
    assert!(e.schema.is_none());
    assert_columns(
        &e,
        json!({"n": "0.00000000000000000001", "pt": "(1.5,-2)", "na": ["1.1", "2.5"]}),
    );
    let e = change("schemaless_update_unchanged_toast.json");
    assert_columns(&e, json!({"big": "__debezium_unavailable_value"}));
}

#[test]
fn transaction_metadata_and_heartbeats_are_bookkeeping() {
    assert_eq!(
        fixture("transaction_begin.json").1,
        Payload::Bookkeeping(Bookkeeping::TransactionMetadata)
    );
    assert_eq!(
        fixture("transaction_end.json").1,
        Payload::Bookkeeping(Bookkeeping::TransactionMetadata)
    );
    assert_eq!(
        fixture("heartbeat.json").1,
        Payload::Bookkeeping(Bookkeeping::Heartbeat)
    );
    // Schemas off: the same records without the wrapper.
    let begin = br#"{"status":"BEGIN","id":"571:53195829","event_count":null,"data_collections":null,"ts_ms":1}"#;
    assert_eq!(
        decode_value(Some(begin)),
        Ok(Payload::Bookkeeping(Bookkeeping::TransactionMetadata))
    );
    assert_eq!(
        decode_value(Some(br#"{"ts_ms":1}"#)),
        Ok(Payload::Bookkeeping(Bookkeeping::Heartbeat))
    );
    // Anything else without `op` is still an error.
    assert!(decode_value(Some(br#"{"ts_ms":1,"x":2}"#)).is_err());
}

#[test]
fn decimal_and_temporal_keys_are_normalized_like_their_columns() {
    let key = br#"{"schema":{"type":"struct","fields":[{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"at"}],"optional":false,"name":"p.public.t.Key"},"payload":{"amount":"P9I=","at":"2026-11-27T13:10:35.67Z"}}"#;
    assert_eq!(
        decode_key(Some(key)),
        Ok(Some(
            json!({"amount": "163.38", "at": "2026-11-27T13:10:35.670000Z"})
        ))
    );
}

#[test]
fn a_broken_decimal_names_its_column() {
    let value = json!({
        "schema": {"type": "struct", "fields": [
            {"type": "struct", "optional": true, "field": "after", "fields": [
                {"type": "int64", "optional": false, "field": "id"},
                {"type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
                 "version": 1, "parameters": {"scale": "2"}, "field": "amount"}]},
            {"type": "struct", "optional": false, "field": "source", "fields": []},
            {"type": "string", "optional": false, "field": "op"}]},
        "payload": {"after": {"id": 1, "amount": "%%%"}, "op": "c",
                    "source": {"connector": "postgresql", "lsn": 5}}
    });
    let err = decode_value(Some(&serde_json::to_vec(&value).unwrap())).unwrap_err();
    assert!(err.reason.contains("column `amount`"), "{err}");
}
