use bytes::Bytes;
use serde_json::{json, Value};

use crate::envelope::*;
use crate::sources::postgres::pgoutput::{
    Column, Relation, ReplicaIdentity, TupleData, TupleValue,
};
use crate::sources::postgres::value::{TypeRegistry, UNAVAILABLE_VALUE};

fn col(name: &str, type_oid: u32, is_key: bool) -> Column {
    Column {
        is_key,
        name: name.into(),
        type_oid,
        type_modifier: -1,
    }
}

fn rel(identity: ReplicaIdentity) -> Relation {
    Relation {
        id: 16_384,
        namespace: "public".into(),
        name: "customers".into(),
        replica_identity: identity,
        columns: vec![
            col("id", 23, true),
            col("name", 25, false),
            col("seen", 1184, false),
        ],
    }
}

fn cfg(schemas_enable: bool) -> EnvelopeConfig {
    EnvelopeConfig {
        topic_prefix: "shop".into(),
        topic_mapping: Default::default(),
        database: "shopdb".into(),
        schemas_enable,
        columns: Default::default(),
    }
}

fn t(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(vals: Vec<TupleValue>) -> TupleData {
    TupleData(vals)
}

fn src() -> SourcePosition {
    SourcePosition {
        tx_id: 754,
        lsn: 1_000,
        commit_lsn: 2_000,
        event_seq: 1,
        commit_ts_ms: 1_795_792_235_670,
        snapshot: SnapshotMarker::False,
    }
}

fn enc(schemas: bool) -> TableEncoder {
    TableEncoder::new(
        &rel(ReplicaIdentity::Default),
        &TypeRegistry::builtin(),
        None,
        &cfg(schemas),
    )
    .unwrap()
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[test]
fn topic_and_key_columns() {
    let e = enc(false);
    assert_eq!(e.topic(), "shop.public.customers");
    assert_eq!(e.key_column_names().collect::<Vec<_>>(), ["id"]);
    assert_eq!(
        crate::naming::sanitize_topic("p.my schema.tåble"),
        "p.my_schema.t_ble"
    );
}

#[test]
fn no_key_columns_is_an_error_naming_the_table() {
    let mut r = rel(ReplicaIdentity::Nothing);
    for c in &mut r.columns {
        c.is_key = false;
    }
    let err = TableEncoder::new(&r, &TypeRegistry::builtin(), None, &cfg(false)).unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::NoKeyColumns {
            table: "public.customers".into()
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("public.customers") && msg.contains("message.key.columns"));
    let empty: &[String] = &[];
    assert!(TableEncoder::new(&r, &TypeRegistry::builtin(), Some(empty), &cfg(false)).is_err());
}

#[test]
fn key_override() {
    let r = rel(ReplicaIdentity::Default);
    let keys = ["name".to_owned(), "id".to_owned()];
    let e = TableEncoder::new(&r, &TypeRegistry::builtin(), Some(&keys), &cfg(false)).unwrap();
    let k = e
        .key(&row(vec![t("1"), t("ann"), TupleValue::Null]))
        .unwrap();
    assert_eq!(k, br#"{"name":"ann","id":1}"#);
    let bad = ["nope".to_owned()];
    assert_eq!(
        TableEncoder::new(&r, &TypeRegistry::builtin(), Some(&bad), &cfg(false)).unwrap_err(),
        EnvelopeError::UnknownKeyColumn {
            table: "public.customers".into(),
            column: "nope".into()
        }
    );
}

#[test]
fn full_identity_needs_explicit_key() {
    let mut r = rel(ReplicaIdentity::Full);
    for c in &mut r.columns {
        c.is_key = true; // what pgoutput sends under FULL
    }
    let err = TableEncoder::new(&r, &TypeRegistry::builtin(), None, &cfg(false)).unwrap_err();
    assert!(matches!(
        err,
        EnvelopeError::FullIdentityNeedsKeyColumns { .. }
    ));
    let keys = ["id".to_owned()];
    let e = TableEncoder::new(&r, &TypeRegistry::builtin(), Some(&keys), &cfg(true)).unwrap();
    let k = parse(&e.key(&row(vec![t("5"), t("x"), TupleValue::Null])).unwrap());
    assert_eq!(k["payload"], json!({"id": 5}));
    assert_eq!(k["schema"]["fields"].as_array().unwrap().len(), 1);
}

#[test]
fn key_without_and_with_schema() {
    let r = row(vec![t("42"), t("ann"), TupleValue::Null]);
    assert_eq!(enc(false).key(&r).unwrap(), br#"{"id":42}"#);
    let k = parse(&enc(true).key(&r).unwrap());
    assert_eq!(
        k,
        json!({
            "schema": {
                "type": "struct",
                "fields": [{"type": "int32", "optional": false, "field": "id"}],
                "optional": false,
                "name": "shop.public.customers.Key"
            },
            "payload": {"id": 42}
        })
    );
}

#[test]
fn key_errors() {
    let e = enc(false);
    assert!(matches!(
        e.key(&row(vec![TupleValue::Unchanged, t("a"), t("b")])),
        Err(EnvelopeError::KeyValueUnavailable { .. })
    ));
    assert_eq!(
        e.key(&row(vec![t("1")])).unwrap_err(),
        EnvelopeError::ColumnCount {
            table: "public.customers".into(),
            expected: 3,
            got: 1
        }
    );
}

#[test]
fn insert_value_payload() {
    let v = enc(false)
        .value(
            Op::Create,
            None,
            Some(&row(vec![
                t("1"),
                t("ann \"a\""),
                t("2026-11-27 15:10:35.670111+00"),
            ])),
            &src(),
            1_795_792_236_000,
        )
        .unwrap();
    assert_eq!(
        parse(&v),
        json!({
            "before": null,
            "after": {"id": 1, "name": "ann \"a\"", "seen": "2026-11-27T15:10:35.670111Z"},
            "source": {
                "version": SOURCE_VERSION, "connector": "postgresql", "name": "shop",
                "ts_ms": 1_795_792_235_670_i64, "snapshot": "false", "db": "shopdb",
                "sequence": "[\"2000\",\"1000\"]", "schema": "public", "table": "customers",
                "txId": 754, "lsn": 1000, "xmin": null, "commit_lsn": 2000, "event_seq": 1
            },
            "transaction": null,
            "op": "c",
            "ts_ms": 1_795_792_236_000_i64
        })
    );
}

#[test]
fn unchanged_toast_key_tuple_nulls_and_binary() {
    let before = row(vec![t("1"), TupleValue::Null, TupleValue::Null]);
    let after = row(vec![
        t("1"),
        TupleValue::Unchanged,
        TupleValue::Binary(Bytes::from_static(&[0, 1, 2])),
    ]);
    let v = parse(
        &enc(false)
            .value(Op::Update, Some(&before), Some(&after), &src(), 0)
            .unwrap(),
    );
    assert_eq!(v["before"], json!({"id": 1, "name": null, "seen": null}));
    assert_eq!(
        v["after"],
        json!({"id": 1, "name": UNAVAILABLE_VALUE, "seen": "AAEC"})
    );
    assert_eq!(v["op"], "u");
}

#[test]
fn invalid_utf8_is_an_error_and_leaves_the_buffer_as_it_was() {
    let e = enc(false);
    let bad = row(vec![
        t("1"),
        TupleValue::Text(Bytes::from_static(&[0xFF])),
        TupleValue::Null,
    ]);
    let mut out = b"prefix".to_vec();
    let err = e
        .value_into(Op::Create, None, Some(&bad), &src(), 0, &mut out)
        .unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::InvalidUtf8 {
            table: "public.customers".into(),
            column: "name".into()
        }
    );
    assert_eq!(out, b"prefix");
}

#[test]
fn schema_fields_match_payload_fields() {
    let e = enc(true);
    let r = row(vec![t("1"), t("a"), TupleValue::Null]);
    let v = parse(&e.value(Op::Create, None, Some(&r), &src(), 0).unwrap());
    let schema_fields: Vec<&str> = v["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    let payload_fields: Vec<&str> = v["payload"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(schema_fields, payload_fields);
    let after = &v["schema"]["fields"][1];
    assert_eq!(after["name"], "shop.public.customers.Value");
    let source = &v["schema"]["fields"][2]["fields"];
    let source_fields: Vec<&str> = source
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    let payload_source: Vec<&str> = v["payload"]["source"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(source_fields, payload_source);
    assert_eq!(v["schema"]["name"], "shop.public.customers.Envelope");
    // Key column required, others optional.
    let row_fields = after["fields"].as_array().unwrap();
    assert_eq!(row_fields[0]["optional"], false);
    assert_eq!(row_fields[1]["optional"], true);
}

#[test]
fn the_schema_names_each_fields_source_column() {
    let identity = SourceIdentity {
        table_oid: 16_384,
        attnums: vec![Some(1), Some(3), None],
        dropped: vec![2, 5],
    };
    let e = TableEncoder::identified(
        &rel(ReplicaIdentity::Default),
        &TypeRegistry::builtin(),
        None,
        &cfg(true),
        Some(&identity),
    )
    .unwrap();
    let r = row(vec![t("1"), t("a"), TupleValue::Null]);
    let v = parse(&e.value(Op::Create, None, Some(&r), &src(), 0).unwrap());
    for image in [0, 1] {
        let row_struct = &v["schema"]["fields"][image];
        assert_eq!(
            row_struct["parameters"],
            json!({PARAM_TABLE_OID: "16384", PARAM_DROPPED_ATTNUMS: "2,5"})
        );
        let fields = row_struct["fields"].as_array().unwrap();
        assert_eq!(fields[0]["parameters"], json!({PARAM_ATTNUM: "1"}));
        assert_eq!(fields[1]["parameters"], json!({PARAM_ATTNUM: "3"}));
        assert!(fields[2]["parameters"].is_null(), "{}", fields[2]);
        // Connect's key order: `field` last.
        assert_eq!(
            fields[1]
                .as_object()
                .unwrap()
                .keys()
                .next_back()
                .map(String::as_str),
            Some("field")
        );
    }
    // Without an identity the schema is exactly Debezium's.
    let plain = parse(
        &enc(true)
            .value(Op::Create, None, Some(&r), &src(), 0)
            .unwrap(),
    );
    assert!(plain["schema"]["fields"][1]["parameters"].is_null());
}

#[test]
fn truncate_value_has_no_rows() {
    let v = parse(&enc(false).truncate_value(&src(), 9));
    assert_eq!(v["before"], Value::Null);
    assert_eq!(v["after"], Value::Null);
    assert_eq!(v["op"], "t");
    assert_eq!(v["ts_ms"], 9);
}

#[test]
fn message_records() {
    let (topic, key, value) = message_record(&cfg(false), false, "hb", b"\x00hi", &src(), 5);
    assert_eq!(topic, "shop.message");
    assert_eq!(parse(&key), json!({"prefix": "hb"}));
    let v = parse(&value);
    assert_eq!(v["op"], "m");
    assert_eq!(v["message"], json!({"prefix": "hb", "content": "AGhp"}));
    assert_eq!(v["source"]["txId"], Value::Null);
    assert_eq!(v["source"]["table"], "");

    let (_, key, value) = message_record(&cfg(true), true, "hb", b"", &src(), 5);
    let k = parse(&key);
    assert_eq!(
        k["schema"]["name"],
        "io.debezium.connector.postgresql.MessageKey"
    );
    let v = parse(&value);
    assert_eq!(v["payload"]["source"]["txId"], 754);
    assert_eq!(
        v["schema"]["name"],
        "io.debezium.connector.postgresql.MessageValue"
    );
}

/// Rough throughput check: `cargo test --release -p oncely-capture --lib
/// sources::postgres::envelope::tests::throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let e = enc(false);
    let r = row(vec![
        t("123456"),
        t("a customer name of some length"),
        t("2026-11-27 15:10:35.670111+00"),
    ]);
    let n = 1_000_000;
    let start = std::time::Instant::now();
    let mut out = Vec::with_capacity(1024);
    let mut bytes = 0;
    for i in 0..n {
        out.clear();
        let mut s = src();
        s.event_seq = i;
        e.value_into(Op::Create, None, Some(&r), &s, 0, &mut out)
            .unwrap();
        e.key_into(&r, &mut out).unwrap();
        bytes += out.len();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{:.0} events/s, {} bytes/event",
        f64::from(u32::try_from(n).unwrap()) / secs,
        bytes / usize::try_from(n).unwrap()
    );
}

/// A value its integer field cannot hold is an error naming table, column,
/// value and the fix, and nothing is written — never the text as a string in
/// an `int64` field.
#[test]
fn values_an_integer_field_cannot_hold_are_refused_by_name() {
    let r = Relation {
        id: 16_384,
        namespace: "public".into(),
        name: "events".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            col("id", 23, true),
            col("at", 1114, false),
            col("span", 1186, false),
        ],
    };
    let numeric = TypeRegistry::builtin()
        .with_interval_mode(crate::sources::postgres::value::IntervalHandlingMode::Numeric);
    let e = TableEncoder::new(&r, &numeric, None, &cfg(true)).unwrap();
    let huge = row(vec![t("1"), TupleValue::Null, t("-178000000 years")]);
    let mut out = b"prefix".to_vec();
    let err = e
        .value_into(Op::Create, None, Some(&huge), &src(), 0, &mut out)
        .unwrap_err();
    assert!(err.is_unrepresentable());
    let text = err.to_string();
    for part in [
        "public.events",
        "span",
        "-178000000 years",
        "interval.handling.mode = \"string\"",
    ] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    assert_eq!(out, b"prefix");
    let far = row(vec![
        t("1"),
        t("294276-12-31 23:59:59.999999"),
        TupleValue::Null,
    ]);
    let err = e
        .value(Op::Create, None, Some(&far), &src(), 0)
        .unwrap_err();
    assert!(err.to_string().contains("MicroTimestamp"), "{err}");
    // The default string mode carries the huge interval exactly.
    let e = TableEncoder::new(&r, &TypeRegistry::builtin(), None, &cfg(false)).unwrap();
    let v = parse(&e.value(Op::Create, None, Some(&huge), &src(), 0).unwrap());
    assert_eq!(v["after"]["span"], json!("P-178000000Y0M0DT0H0M0S"));
}

fn masked_cfg(exclude: &[&str], mask: &[(&str, &str)]) -> EnvelopeConfig {
    let exclude: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
    let mask = mask
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    EnvelopeConfig {
        columns: ColumnPolicy::new(ColumnSettings {
            include: &[],
            exclude: &exclude,
            mask: &mask,
            truncate: &Default::default(),
            propagate_columns: &[],
            propagate_types: &[],
        })
        .unwrap(),
        ..cfg(true)
    }
}

/// An excluded column is not in the record nor its schema, a masked one is
/// written masked and its field says so (Debezium's `masked` parameter), in
/// every row image; the row still has all the table's cells.
#[test]
fn excluded_columns_are_left_out_and_masked_ones_masked_in_every_image() {
    let mut r = rel(ReplicaIdentity::Full);
    r.columns.push(col("email", 1043, false));
    r.columns[3].type_modifier = 10 + 4;
    let cfg = masked_cfg(
        &["public.customers.seen"],
        &[
            ("hash.v2.SHA-256.with.salt.pepper", "public.customers.email"),
            ("with.3.chars", "public.customers.name"),
        ],
    );
    let keys = ["id".to_string()];
    let e = TableEncoder::new(&r, &TypeRegistry::builtin(), Some(&keys), &cfg).unwrap();
    let old = row(vec![
        t("1"),
        t("Ann"),
        t("2025-01-01 00:00:00+00"),
        t("ann@x.org"),
    ]);
    let new = row(vec![
        t("1"),
        TupleValue::Null,
        t("2025-01-02 00:00:00+00"),
        TupleValue::Unchanged,
    ]);
    let v = parse(
        &e.value(Op::Update, Some(&old), Some(&new), &src(), 0)
            .unwrap(),
    );
    let ColumnAction::Mask(hash) = cfg.columns.action("public", "customers", "email") else {
        panic!("email is masked");
    };
    let pseudonym = &hash.apply("ann@x.org", Characters::UpTo(10)).into_owned();
    assert_eq!(pseudonym.len(), 10);
    assert_eq!(
        v["payload"]["before"],
        json!({"id": 1, "name": "***", "email": pseudonym})
    );
    assert_eq!(
        v["payload"]["after"],
        json!({"id": 1, "name": null, "email": UNAVAILABLE_VALUE})
    );
    let fields = &v["schema"]["fields"][0]["fields"];
    let names: Vec<&str> = fields
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["id", "name", "email"]);
    assert_eq!(fields[1]["parameters"]["masked"], "true");
    let text =
        String::from_utf8(e.value(Op::Create, None, Some(&old), &src(), 0).unwrap()).unwrap();
    assert!(
        !text.contains("ann@x.org") && !text.contains("Ann") && !text.contains("2025"),
        "{text}"
    );
    assert_eq!(parse(&e.key(&old).unwrap())["payload"], json!({"id": 1}));
}

#[test]
fn a_key_column_excluded_or_masked_or_a_mask_on_a_number_is_refused_naming_it() {
    let r = rel(ReplicaIdentity::Default);
    let reg = TypeRegistry::builtin();
    let refused = |cfg: EnvelopeConfig| {
        TableEncoder::new(&r, &reg, None, &cfg)
            .unwrap_err()
            .to_string()
    };
    let e = refused(masked_cfg(&["public.customers.id"], &[]));
    assert!(
        e.contains("key column id of table public.customers is excluded"),
        "{e}"
    );
    let e = refused(masked_cfg(&[], &[("with.2.chars", "public.customers.id")]));
    assert!(
        e.contains("key column id of table public.customers is masked"),
        "{e}"
    );
    let e = refused(masked_cfg(
        &[],
        &[("with.2.chars", "public.customers.seen")],
    ));
    assert!(e.contains("column seen of table public.customers is masked by column.mask.with.2.chars, but it does not hold character data"), "{e}");
}

fn propagate_cfg(columns: &[&str], types: &[&str]) -> EnvelopeConfig {
    EnvelopeConfig {
        columns: ColumnPolicy::propagating(columns, types),
        ..cfg(true)
    }
}

/// `public.typed`: a varchar(20), a numeric(12,2), an enum, an int4[], a
/// text and a plain numeric.
fn typed() -> (Relation, TypeRegistry) {
    let mut reg = TypeRegistry::builtin();
    reg.insert(
        16_400,
        crate::sources::postgres::value::PgType {
            name: "public.mood".into(),
            kind: crate::sources::postgres::value::PgTypeKind::Enum {
                labels: vec!["sad".into(), "happy".into()],
            },
        },
    );
    let with_mod = |name: &str, oid, typmod, key| Column {
        type_modifier: typmod,
        ..col(name, oid, key)
    };
    let rel = Relation {
        id: 16_401,
        namespace: "public".into(),
        name: "typed".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            with_mod("id", 23, -1, true),
            with_mod("v", 1043, 20 + 4, false),
            with_mod("n", 1700, (12 << 16 | 2) + 4, false),
            with_mod("m", 16_400, -1, false),
            with_mod("a", 1007, -1, false),
            with_mod("t", 25, -1, false),
            with_mod("plain", 1700, -1, false),
        ],
    };
    (rel, reg)
}

/// The `parameters` of each value field, by field name.
fn field_parameters(enc: &TableEncoder) -> serde_json::Map<String, Value> {
    let mut cells: Vec<TupleValue> = (0..7).map(|_| TupleValue::Null).collect();
    cells[0] = t("1");
    let cells = row(cells);
    let key = parse(&enc.key(&cells).unwrap());
    let v = parse(
        &enc.value(Op::Create, None, Some(&cells), &src(), 0)
            .unwrap(),
    );
    let mut out = serde_json::Map::new();
    for f in v["schema"]["fields"][1]["fields"].as_array().unwrap() {
        out.insert(
            f["field"].as_str().unwrap().into(),
            f.get("parameters").cloned().unwrap_or(Value::Null),
        );
    }
    out.insert(
        "key.id".into(),
        key["schema"]["fields"][0]
            .get("parameters")
            .cloned()
            .unwrap_or(Value::Null),
    );
    out
}

/// Debezium's `PropagateSourceMetadataToSchemaParameter`: the upper-case
/// type name, the length and scale its JDBC driver gives the declaration
/// (unbounded: `2147483647`), then the column's name, on key and value
/// fields the setting names, and only those.
#[test]
fn column_propagate_source_type_names_the_declared_type() {
    let (rel, reg) = typed();
    let cfg = propagate_cfg(&["public\\.typed\\.(id|v|n|m|a|plain)"], &[]);
    let enc = TableEncoder::new(&rel, &reg, None, &cfg).unwrap();
    let p = field_parameters(&enc);
    let source = |ty: &str, length: &str, scale: &str, name: &str| {
        json!({"__debezium.source.column.type": ty,
               "__debezium.source.column.length": length,
               "__debezium.source.column.scale": scale,
               "__debezium.source.column.name": name})
    };
    assert_eq!(p["key.id"], source("INT4", "10", "0", "id"));
    assert_eq!(p["id"], source("INT4", "10", "0", "id"));
    // Byte for byte: the order is Debezium's.
    assert_eq!(
        serde_json::to_string(&p["v"]).unwrap(),
        r#"{"__debezium.source.column.type":"VARCHAR","__debezium.source.column.length":"20","__debezium.source.column.scale":"0","__debezium.source.column.name":"v"}"#
    );
    assert_eq!(
        serde_json::to_string(&p["n"]).unwrap(),
        r#"{"__debezium.source.column.type":"NUMERIC","__debezium.source.column.length":"12","__debezium.source.column.scale":"2","__debezium.source.column.name":"n"}"#
    );
    // The enum keeps its `allowed` first, as Debezium's converter writes it.
    assert_eq!(
        serde_json::to_string(&p["m"]).unwrap(),
        r#"{"allowed":"sad,happy","__debezium.source.column.type":"MOOD","__debezium.source.column.length":"2147483647","__debezium.source.column.scale":"0","__debezium.source.column.name":"m"}"#
    );
    assert_eq!(p["a"], source("_INT4", "10", "0", "a"));
    assert_eq!(p["plain"], source("NUMERIC", "131089", "0", "plain"));
    // Not named: as without the setting.
    assert_eq!(p["t"], Value::Null);
}

#[test]
fn datatype_propagate_source_type_matches_the_type_name() {
    let (rel, reg) = typed();
    let enc =
        TableEncoder::new(&rel, &reg, None, &propagate_cfg(&[], &["varchar", "MOOD"])).unwrap();
    let p = field_parameters(&enc);
    assert_eq!(p["v"]["__debezium.source.column.name"], json!("v"));
    assert_eq!(p["m"]["__debezium.source.column.type"], json!("MOOD"));
    // numeric's own parameters stay, without the propagated name.
    assert_eq!(p["n"].get("__debezium.source.column.name"), None);
    assert_eq!(p["n"]["__debezium.source.column.length"], json!("12"));
    assert_eq!(p["id"], Value::Null);
    assert_eq!(p["t"], Value::Null);
}

/// Without either setting the schema is the mapping's alone (the golden
/// fixtures hold it byte for byte).
#[test]
fn no_propagation_without_the_settings() {
    let (rel, reg) = typed();
    let plain = TableEncoder::new(&rel, &reg, None, &cfg(true)).unwrap();
    let empty = TableEncoder::new(&rel, &reg, None, &propagate_cfg(&[], &[])).unwrap();
    let (p, e) = (field_parameters(&plain), field_parameters(&empty));
    assert_eq!(p, e);
    assert_eq!(p["m"], json!({"allowed": "sad,happy"}));
    assert_eq!(p["v"].get("__debezium.source.column.name"), None);
}
