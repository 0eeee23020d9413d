use super::decode::{decode_envelope, may_be_wrapped, Fields};
use super::*;
use serde_json::json;

/// The shape of a Debezium PostgreSQL connector create event, schemas enabled (abridged schema).
fn debezium_create() -> Value {
    json!({
        "schema": {
            "type": "struct", "optional": false, "name": "dbserver1.inventory.customers.Envelope",
            "fields": [
                {"type": "struct", "optional": true, "field": "before", "fields": [
                    {"type": "int32", "optional": false, "field": "id"},
                    {"type": "string", "optional": false, "field": "email"}]},
                {"type": "struct", "optional": true, "field": "after", "fields": [
                    {"type": "int32", "optional": false, "field": "id"},
                    {"type": "string", "optional": false, "field": "email"}]},
                {"type": "struct", "optional": false, "field": "source", "fields": []},
                {"type": "string", "optional": false, "field": "op"},
                {"type": "int64", "optional": true, "field": "ts_ms"}
            ]
        },
        "payload": {
            "before": null,
            "after": {"id": 1, "email": "annek@noanswer.org"},
            "source": {
                "version": "2.7.0.Final", "connector": "postgresql", "name": "dbserver1",
                "ts_ms": 1559033904863i64, "snapshot": "false", "db": "postgres",
                "sequence": "[\"24023119\",\"24023128\"]", "schema": "inventory",
                "table": "customers", "txId": 555, "lsn": 24023128, "xmin": null
            },
            "op": "c",
            "ts_ms": 1559033904863i64
        }
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn change(v: &Value) -> ChangeEvent {
    match decode_value(Some(&bytes(v))) {
        Ok(Payload::Change(e)) => *e,
        other => panic!("expected a change event, got {other:?}"),
    }
}

#[test]
fn debezium_event_with_schema_falls_back_to_source_lsn() {
    let e = change(&debezium_create());
    assert_eq!(e.op, Op::Create);
    assert_eq!(
        e.version,
        Version::new(24023128, DEBEZIUM_STREAMED_SEQ),
        "a streamed change"
    );
    assert_eq!(e.version_origin, VersionOrigin::SourceLsn);
    assert!(e.schema.is_some());
    assert_eq!(e.after.as_ref().and_then(|a| a.get("id")), Some(&json!(1)));
    assert_eq!(e.table(), Some("customers"));
    assert_eq!(e.schema_name(), Some("inventory"));
    assert!(!e.is_snapshot());
}

/// A change as Debezium's MariaDB connector wrote it (3.5.0, seen on the
/// services' MariaDB): no `lsn`, the binlog file, the row event's offset and
/// the row inside it.
fn mariadb_change(op: &str, snapshot: &str, file: &str, pos: u64, row: u64) -> ChangeEvent {
    change(&json!({
        "before": null, "after": {"id": 1, "v": 10},
        "source": {
            "version": "3.5.0.Final", "connector": "mariadb", "name": "dbzt1",
            "ts_ms": 1796505777000i64, "snapshot": snapshot, "db": "dbzt", "table": "t",
            "server_id": 1, "gtid": "0-1-9", "file": file, "pos": pos, "row": row,
            "thread": 7, "query": null
        },
        "op": op, "ts_ms": 1796505777001i64
    }))
}

#[test]
fn debezium_binlog_changes_are_versioned_by_file_offset_and_row() {
    let e = mariadb_change("c", "false", "binlog.000001", 2072, 1);
    assert_eq!(e.version_origin, VersionOrigin::Binlog);
    // A MySQL database is the table's schema.
    assert_eq!((e.schema_name(), e.table()), (Some("dbzt"), Some("t")));
    assert_eq!(e.version, Version::new(1 << 32 | 2072, 2));
    assert!(e.version_origin.is_debezium());
    // In one transaction: a later row event of the same key is newer, and so
    // is a later row of one event.
    let first = mariadb_change("u", "false", "binlog.000001", 1902, 0).version;
    let same_event = mariadb_change("c", "false", "binlog.000001", 2072, 0).version;
    let later = mariadb_change("u", "false", "binlog.000001", 2237, 0).version;
    assert!(first < same_event && same_event < e.version && e.version < later);
    // Across a rotation: the next file's first events are newer than the
    // previous file's last, though their offsets are smaller.
    let rotated = mariadb_change("c", "false", "binlog.000002", 493, 0).version;
    assert!(rotated > later);
    let far = mariadb_change("c", "false", "mysql-bin.1000000", 4, 0).version;
    assert!(far > rotated);
    // A snapshot row read at a position loses to a change streamed there.
    let snapshot = mariadb_change("r", "last", "binlog.000001", 1746, 0);
    assert_eq!(
        snapshot.version,
        Version::new(1 << 32 | 1746, DEBEZIUM_SNAPSHOT_SEQ)
    );
    let streamed = mariadb_change("c", "false", "binlog.000001", 1746, 0);
    assert!(snapshot.version < streamed.version);
}

#[test]
fn a_binlog_position_that_cannot_order_changes_is_refused_with_the_reason() {
    for (file, pos, want) in [
        ("binlog", 4_u64, "ending in its sequence number"),
        ("binlog.", 4, "ending in its sequence number"),
        ("binlog.00x1", 4, "ending in its sequence number"),
        (
            "binlog.000001",
            1_u64 << 32,
            "beyond a binlog offset's 32 bits",
        ),
    ] {
        let v = json!({
            "before": null, "after": {"id": 1},
            "source": {"connector": "mysql", "file": file, "pos": pos, "row": 0, "snapshot": "false"},
            "op": "c"
        });
        match decode_value(Some(&bytes(&v))) {
            Err(e) => assert!(e.to_string().contains(want), "{file}/{pos}: {e}"),
            other => panic!("{file}/{pos}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn oncely_event_without_schema_uses_commit_lsn_and_seq() {
    let v = json!({
        "before": {"id": 7, "name": "a"}, "after": {"id": 7, "name": "b"},
        "source": {"connector": "oncely", "lsn": 900, "commit_lsn": 1000, "event_seq": 3, "snapshot": false},
        "op": "u", "ts_ms": 5
    });
    let e = change(&v);
    assert_eq!(e.op, Op::Update);
    assert_eq!(e.version, Version::new(1000, 3));
    assert_eq!(e.version_origin, VersionOrigin::CommitLsn);
    assert!(e.schema.is_none());
    assert_eq!(e.ts_ms, Some(5));
}

#[test]
fn snapshot_row_takes_the_chunk_high_watermark() {
    let v = json!({
        "before": null, "after": {"id": 1},
        "source": {"lsn": 10, "commit_lsn": 5000, "event_seq": 0, "snapshot": "true"},
        "op": "r"
    });
    let e = change(&v);
    assert_eq!(e.op, Op::Read);
    assert!(e.is_snapshot());
    // A streamed change committed after the chunk's high watermark wins against it.
    assert!(Version::new(5001, 0) > e.version);
    assert!(Version::new(4999, 9) < e.version);
}

#[test]
fn delete_tombstone_truncate_and_message() {
    let d = change(&json!({"before": {"id": 1}, "after": null, "source": {"lsn": 1}, "op": "d"}));
    assert_eq!(d.op, Op::Delete);
    assert!(d.after.is_none());
    assert_eq!(decode_value(None), Ok(Payload::Tombstone));
    assert_eq!(decode_value(Some(b"null")), Ok(Payload::Tombstone));
    let wrapped_null = bytes(&json!({"schema": null, "payload": null}));
    assert_eq!(decode_value(Some(&wrapped_null)), Ok(Payload::Tombstone));
    let t = change(&json!({"before": null, "after": null, "source": {"lsn": 2}, "op": "t"}));
    assert_eq!(t.op, Op::Truncate);
    let m = change(&json!({"source": {"lsn": 3}, "op": "m",
        "message": {"prefix": "audit", "content": "aGk="}}));
    assert_eq!(m.op, Op::Message);
    assert_eq!(
        m.message,
        Some(json!({"prefix": "audit", "content": "aGk="}))
    );
}

#[test]
fn keys_with_and_without_schema() {
    let with = bytes(&json!({"schema": {"type": "struct"}, "payload": {"id": 1}}));
    assert_eq!(decode_key(Some(&with)), Ok(Some(json!({"id": 1}))));
    assert_eq!(decode_key(Some(br#"{"id":2}"#)), Ok(Some(json!({"id": 2}))));
    assert_eq!(decode_key(None), Ok(None));
    assert!(decode_key(Some(b"not json")).is_err());
}

#[test]
fn malformed_values_are_decode_errors_not_panics() {
    let cases: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        b"42".to_vec(),
        bytes(&json!({"after": {"id": 1}, "source": {"lsn": 1}})),
        bytes(&json!({"after": {"id": 1}, "source": {"lsn": 1}, "op": "x"})),
        bytes(&json!({"after": {"id": 1}, "op": "c"})),
        bytes(&json!({"after": {"id": 1}, "source": {"db": "x"}, "op": "c"})),
        bytes(&json!({"after": {"id": 1}, "source": {"lsn": -4}, "op": "c"})),
        bytes(&json!({"after": {"id": 1}, "source": {"commit_lsn": "x1"}, "op": "c"})),
        bytes(&json!({"after": [1], "source": {"lsn": 1}, "op": "c"})),
        bytes(&json!({"after": null, "source": {"lsn": 1}, "op": "c"})),
        bytes(&json!({"before": null, "source": {"lsn": 1}, "op": "d"})),
    ];
    for raw in cases {
        let result = decode_value(Some(&raw));
        assert!(
            result.is_err(),
            "{} decoded as {result:?}",
            String::from_utf8_lossy(&raw)
        );
    }
}

#[test]
fn versions_order_lexicographically() {
    assert!(Version::new(1, 9) < Version::new(2, 0));
    assert!(Version::new(2, 0) < Version::new(2, 1));
    assert_eq!(Version::new(3, 4).to_string(), "3/4");
}

#[test]
fn the_schema_wrapper_is_recognised_in_any_key_order_and_parsed_once_per_text() {
    let wrapped = debezium_create();
    let first = change(&wrapped);
    let again = change(&wrapped);
    let (Some(a), Some(b)) = (&first.schema, &again.schema) else {
        panic!("both records carry the schema");
    };
    assert!(Arc::ptr_eq(a, b), "one parsed schema shared by equal texts");
    assert_eq!(**a, wrapped["schema"]);

    // `payload` before `schema`: still the wrapper.
    let swapped = format!(
        "{{\"payload\": {}, \"schema\": {}}}",
        wrapped["payload"], wrapped["schema"]
    );
    match decode_value(Some(swapped.as_bytes())) {
        Ok(Payload::Change(e)) => assert_eq!(e.schema.as_deref(), Some(&wrapped["schema"])),
        other => panic!("expected a change event, got {other:?}"),
    }

    // A null schema is no schema; a null payload is a tombstone.
    let null_schema = json!({"schema": null, "payload": wrapped["payload"].clone()});
    assert!(change(&null_schema).schema.is_none());
    let tombstone = json!({"schema": wrapped["schema"].clone(), "payload": null});
    assert_eq!(
        decode_value(Some(&bytes(&tombstone))),
        Ok(Payload::Tombstone)
    );

    // A third key makes it a plain envelope: decoded as one (and refused for its missing op).
    let three = json!({"schema": {}, "payload": {}, "op": "c"});
    assert!(decode_value(Some(&bytes(&three))).is_err());
}

#[test]
fn the_wrapper_is_only_skipped_when_the_first_key_rules_it_out() {
    assert!(!may_be_wrapped(br#"{"before": null}"#));
    assert!(!may_be_wrapped(b"42"));
    assert!(!may_be_wrapped(b"  [1]"));
    assert!(may_be_wrapped(br#" { "schema": 1}"#));
    assert!(may_be_wrapped(br#"{"payload": 1}"#));
    assert!(
        may_be_wrapped(br#"{"sch\u0065ma": 1}"#),
        "escaped: serde decides"
    );
    assert!(may_be_wrapped(b"{}"));
    assert!(may_be_wrapped(b"{"));
    // An escaped `schema` key is still the wrapper.
    let escaped = br#"{"sch\u0065ma": null, "payload": {"op": "c", "after": {"id": 1}, "source": {"lsn": 7}}}"#;
    assert_eq!(change_of(escaped).version, Version::new(7, 1));
}

fn change_of(bytes: &[u8]) -> ChangeEvent {
    match decode_value(Some(bytes)) {
        Ok(Payload::Change(e)) => *e,
        other => panic!("expected a change event, got {other:?}"),
    }
}

/// What `decode_value` did before it read envelopes field by field: the whole
/// document as a `Value`, the wrapper recognised as an object of exactly
/// `schema` and `payload`, the envelope's fields taken from the map.
fn reference(bytes: &[u8]) -> Result<Payload, ()> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|_| ())?;
    let (payload, schema) = match doc {
        Value::Object(mut m)
            if m.len() == 2 && m.contains_key("schema") && m.contains_key("payload") =>
        {
            let schema = m.remove("schema").filter(|s| !s.is_null()).map(Arc::new);
            (m.remove("payload").unwrap_or_default(), schema)
        }
        other => (other, None),
    };
    match payload {
        Value::Null => Ok(Payload::Tombstone),
        Value::Object(mut env) => {
            let fields = Fields {
                op: env.remove("op"),
                before: env.remove("before"),
                after: env.remove("after"),
                source: env.remove("source"),
                ts_ms: env.remove("ts_ms"),
                message: env.remove("message"),
                status: env.remove("status"),
                other: !env.is_empty(),
            };
            decode_envelope(fields, schema, bytes.len()).map_err(|_| ())
        }
        _ => Err(()),
    }
}

fn envelope_field() -> impl proptest::strategy::Strategy<Value = (String, Value)> {
    use proptest::prelude::*;
    let image = prop_oneof![
        Just(Value::Null),
        Just(json!({"id": 1, "name": "a"})),
        Just(json!({"id": 2, "note": "__debezium_unavailable_value"})),
        Just(json!([1])),
        Just(json!(3)),
    ];
    let source = prop_oneof![
        Just(json!({"schema": "public", "table": "t", "commit_lsn": 100, "event_seq": 2})),
        Just(json!({"lsn": "55", "snapshot": "true"})),
        Just(json!({"commit_lsn": -1})),
        Just(json!({"db": "x"})),
        Just(json!("source")),
    ];
    let op = prop_oneof![
        Just(json!("c")),
        Just(json!("u")),
        Just(json!("d")),
        Just(json!("r")),
        Just(json!("t")),
        Just(json!("m")),
        Just(json!("x")),
        Just(json!(1)),
        Just(Value::Null),
    ];
    prop_oneof![
        op.prop_map(|v| ("op".to_owned(), v)),
        image.clone().prop_map(|v| ("before".to_owned(), v)),
        image.prop_map(|v| ("after".to_owned(), v)),
        source.prop_map(|v| ("source".to_owned(), v)),
        prop_oneof![Just(json!(5)), Just(json!("5")), Just(Value::Null)]
            .prop_map(|v| ("ts_ms".to_owned(), v)),
        prop_oneof![Just(json!({"prefix": "p"})), Just(Value::Null)]
            .prop_map(|v| ("message".to_owned(), v)),
        prop_oneof![
            Just(json!({"id": "tx"})),
            Just(json!([{"a": [1, {}]}])),
            Just(json!("s"))
        ]
        .prop_map(|v| ("transaction".to_owned(), v)),
    ]
}

/// Writes an object with `fields` in the given order (repeats kept).
fn object_text(fields: &[(String, Value)], space: &str) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{space}{}:{space}{v}", Value::from(k.as_str())))
        .collect();
    format!("{space}{{{}}}", parts.join(","))
}

proptest::proptest! {
    /// Field-by-field decoding gives what decoding the whole document as a
    /// `Value` gave: any key order, repeated keys, unknown fields, whitespace,
    /// with and without the schema wrapper (either order), valid or not.
    #[test]
    fn envelopes_decode_as_whole_documents_did(
        fields in proptest::collection::vec(envelope_field(), 0..9),
        wrap in 0u8..5,
        space in proptest::sample::select(vec!["", " ", "\n\t"]),
    ) {
        let env = object_text(&fields, space);
        let text = match wrap {
            0 => format!(r#"{{"schema": null, "payload": {env}}}"#),
            1 => format!(r#"{{"payload": {env}, "schema": {{"type": "struct"}}}}"#),
            2 => format!(r#"{{"schema": {{}}, "payload": {env}, "extra": 1}}"#),
            3 => r#"{"schema": {}, "payload": null}"#.to_string(),
            _ => env,
        };
        let got = decode_value(Some(text.as_bytes())).map_err(|_| ());
        proptest::prop_assert_eq!(got, reference(text.as_bytes()), "{}", text);
    }
}

/// Any JSON document, nested a few levels, with the envelope's field names
/// likely, so the decoder's deeper paths are reached too.
fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    let name = prop_oneof![
        proptest::sample::select(vec![
            "schema",
            "payload",
            "before",
            "after",
            "source",
            "op",
            "ts_ms",
            "commit_lsn",
            "event_seq",
            "lsn",
            "snapshot",
            "table",
            "schema",
            "fields",
            "field",
            "type",
            "optional",
            "name",
            "message",
            "transaction",
            "prefix",
            "content",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,6}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((name.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// A poison record is a typed error (a dead letter),
    /// never a panic that would crash-loop the sink on the same offset.
    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
        let _ = decode_value(Some(&raw));
        let _ = decode_key(Some(&raw));
    }

    #[test]
    fn arbitrary_json_never_panics_the_decoders(doc in any_json(), wrap in 0u8..3) {
        let text = match wrap {
            0 => doc.to_string(),
            1 => serde_json::json!({"schema": {"type": "struct"}, "payload": doc}).to_string(),
            _ => serde_json::json!({"payload": {"op": "u", "after": doc, "source": {"lsn": 1}}}).to_string(),
        };
        let _ = decode_value(Some(text.as_bytes()));
        let _ = decode_key(Some(text.as_bytes()));
    }
}

#[test]
fn a_tombstone_with_position_headers_stands_for_its_delete() {
    let headers = [
        (HEADER_POSITION, "23911352/3"),
        (HEADER_SCHEMA, "Sales"),
        (HEADER_TABLE, "Order Items"),
    ];
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_bytes())
    };
    let origin = TombstoneOrigin::from_headers(find).expect("all three headers");
    assert_eq!(origin.version, Version::new(23_911_352, 3));
    let delete = origin.to_delete();
    assert_eq!(delete.op, Op::Delete);
    assert_eq!(delete.version, Version::new(23_911_352, 3));
    assert_eq!(delete.version_origin, VersionOrigin::CommitLsn);
    assert_eq!(delete.schema_name(), Some("Sales"));
    assert_eq!(delete.table(), Some("Order Items"));
    assert!(delete.before.is_none() && delete.after.is_none());

    // Debezium's tombstones carry no headers; a missing or malformed one
    // leaves the tombstone a plain tombstone.
    assert_eq!(TombstoneOrigin::from_headers(|_| None), None);
    for (missing, bad) in [
        (HEADER_TABLE, None),
        (HEADER_POSITION, Some("12")),
        (HEADER_POSITION, Some("a/1")),
    ] {
        let got = TombstoneOrigin::from_headers(|name| {
            if name == missing {
                bad.map(str::as_bytes)
            } else {
                find(name)
            }
        });
        assert_eq!(got, None, "{missing} = {bad:?}");
    }
    assert_eq!(parse_position("7/0"), Some(Version::new(7, 0)));
}

/// A Debezium snapshot row of `customers` at `lsn` (Debezium 3.6.1's `source`).
fn debezium_snapshot_row(id: u64, lsn: u64, snapshot: &str) -> ChangeEvent {
    change(&json!({
        "before": null, "after": {"id": id}, "op": "r", "ts_ms": 1,
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz",
            "snapshot": snapshot, "db": "d", "sequence": format!("[null,\"{lsn}\"]"),
            "schema": "inventory", "table": "customers", "txId": 7, "lsn": lsn}
    }))
}

#[test]
fn debezium_snapshot_rows_sharing_an_lsn_have_distinct_positions_and_a_redelivery_the_same() {
    let rows = [
        debezium_snapshot_row(1, 500, "first"),
        debezium_snapshot_row(2, 500, "true"),
        debezium_snapshot_row(3, 500, "last"),
    ];
    for row in &rows {
        assert_eq!(row.version, Version::new(500, DEBEZIUM_SNAPSHOT_SEQ));
        assert!(row.is_snapshot());
    }
    // Records 0, 1, 2 of partition 0 and record 0 of partition 1.
    let places = [
        rows[0].unique_position(0, 0),
        rows[1].unique_position(0, 1),
        rows[2].unique_position(0, 2),
        rows[0].unique_position(1, 0),
    ];
    let distinct: std::collections::HashSet<_> = places.iter().collect();
    assert_eq!(distinct.len(), 4, "{places:?}");
    assert!(places.iter().all(|p| p.lsn == 500));
    // The same record read again has the same place.
    assert_eq!(
        debezium_snapshot_row(2, 500, "true").unique_position(0, 1),
        places[1]
    );
    // oncely's own events are unique by their version already.
    let own = change(&json!({"op": "c", "after": {"id": 1},
        "source": {"commit_lsn": 900, "event_seq": 4, "lsn": 880}}));
    assert_eq!(own.unique_position(3, 77), Version::new(900, 4));
}

#[test]
fn a_debezium_snapshot_row_never_replaces_a_streamed_change_at_its_lsn() {
    let row = debezium_snapshot_row(1, 500, "last");
    let mut streamed = debezium_create();
    streamed["payload"]["source"]["lsn"] = json!(500);
    let streamed = change(&streamed);
    assert!(replaces(streamed.version, row.version));
    assert!(!replaces(row.version, streamed.version));
    // Any earlier streamed change is older than the snapshot row.
    let mut earlier = debezium_create();
    earlier["payload"]["source"]["lsn"] = json!(499);
    assert!(replaces(row.version, change(&earlier).version));
}

/// After oncely's MySQL capture followed a failover, the new primary's
/// files start over (here at binlog.000001, offset 300): its changes carry
/// `source.failover_epoch` and must still be newer than every change of
/// the old primary, else the sinks drop them as stale.
#[test]
fn a_failover_epoch_puts_the_new_primary_s_changes_after_the_old_one_s() {
    let with_epoch = |file: &str, pos: u64, row: u64, epoch: Option<u64>| {
        let mut v = json!({
            "before": null, "after": {"id": 1, "v": 10},
            "source": {
                "version": "0.1.0", "connector": "mysql", "name": "p",
                "ts_ms": 1796505777000i64, "snapshot": "false", "db": "d", "table": "t",
                "server_id": 2, "gtid": "0-1-9", "file": file, "pos": pos, "row": row,
                "thread": null, "query": null
            },
            "op": "u", "ts_ms": 1796505777001i64
        });
        if let Some(e) = epoch {
            v["source"]["failover_epoch"] = json!(e);
        }
        change(&v).version
    };
    let old = with_epoch("binlog.000042", 9_000_000, 3, None);
    assert_eq!(old, with_epoch("binlog.000042", 9_000_000, 3, Some(0)));
    assert_eq!(
        old,
        Version::new(42 << 32 | 9_000_000, 4),
        "epoch 0 keeps today's version"
    );
    let new = with_epoch("binlog.000001", 300, 0, Some(1));
    assert!(new > old, "{new:?} after {old:?}");
    assert!(with_epoch("binlog.000001", 400, 0, Some(1)) > new);
    assert!(
        with_epoch("binlog.000001", 4, 0, Some(2)) > with_epoch("binlog.000009", 4, 0, Some(1))
    );
    assert!(
        i64::try_from(with_epoch("binlog.8388607", u64::from(u32::MAX), 0, Some(255)).lsn).is_ok()
    );
    for (file, epoch) in [("binlog.8388608", 1), ("binlog.000001", 256)] {
        let v = json!({
            "before": null, "after": {"id": 1},
            "source": {"connector": "mysql", "file": file, "pos": 4, "row": 0, "snapshot": "false", "failover_epoch": epoch},
            "op": "c", "ts_ms": 1
        });
        match decode_value(Some(&bytes(&v))) {
            Err(e) => assert!(
                e.to_string().contains("failover_epoch"),
                "{file} {epoch}: {e}"
            ),
            other => panic!("{file}/{epoch}: expected a refusal, got {other:?}"),
        }
    }
}
