//! Golden records in `tests/fixtures/envelope/`, the wire-format contract
//! shared with the sinks (which read the same files).
//!
//! Each file is `{"description", "topic", "key", "value"}` with key and
//! value as parsed JSON (null for none). `UPDATE_GOLDEN=1 cargo test -p
//! oncely-capture --lib golden` rewrites them; otherwise the generated
//! records must equal the files exactly (compared as JSON). Every input,
//! `ts_ms` included, is fixed so the files are stable; `source.version`
//! follows the crate version, so a release bump needs a regeneration.

use std::path::PathBuf;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::envelope::*;
use crate::sources::postgres::pgoutput::{
    Column, Relation, ReplicaIdentity, TupleData, TupleValue,
};
use crate::sources::postgres::value::{PgType, PgTypeKind, TypeRegistry};

const PREFIX: &str = "shop";
/// 2026-11-27T15:10:35.670Z.
const COMMIT_TS_MS: i64 = 1_795_792_235_670;
const NOW_MS: i64 = 1_795_792_236_012;
const TX_ID: u32 = 754;
/// 0/16B5A30.
const COMMIT_LSN: u64 = 0x016B_5A30;
const MOOD_OID: u32 = 16_400;

fn cfg(schemas_enable: bool) -> EnvelopeConfig {
    EnvelopeConfig {
        topic_prefix: PREFIX.into(),
        topic_mapping: Default::default(),
        database: "shopdb".into(),
        schemas_enable,
        columns: Default::default(),
    }
}

fn registry() -> TypeRegistry {
    let mut reg = TypeRegistry::builtin();
    reg.insert(
        MOOD_OID,
        PgType {
            name: "public.mood".into(),
            kind: PgTypeKind::Enum {
                labels: vec!["sad".into(), "ok".into(), "happy".into()],
            },
        },
    );
    reg
}

fn col(name: &str, type_oid: u32, type_modifier: i32, is_key: bool) -> Column {
    Column {
        is_key,
        name: name.into(),
        type_oid,
        type_modifier,
    }
}

fn t(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn pos(lsn: u64, event_seq: u64, snapshot: SnapshotMarker) -> SourcePosition {
    SourcePosition {
        tx_id: TX_ID,
        lsn,
        commit_lsn: COMMIT_LSN,
        event_seq,
        commit_ts_ms: COMMIT_TS_MS,
        snapshot,
    }
}

/// `public.customers`: the table most fixtures use.
fn customers(identity: ReplicaIdentity) -> Relation {
    let full = identity == ReplicaIdentity::Full;
    Relation {
        id: 16_385,
        namespace: "public".into(),
        name: "customers".into(),
        replica_identity: identity,
        columns: vec![
            col("id", 23, -1, true),
            col("name", 1043, 64 + 4, full),
            col("balance", 1700, (12 << 16 | 2) + 4, full),
            col("notes", 25, -1, full),
            col("updated_at", 1184, -1, full),
        ],
    }
}

fn customers_encoder(identity: ReplicaIdentity, schemas: bool, apart: HeadsApart) -> TableEncoder {
    let key = ["id".to_owned()];
    let key = (identity == ReplicaIdentity::Full).then_some(&key[..]);
    TableEncoder::new(&customers(identity), &registry(), key, &cfg(schemas))
        .expect("customers encoder")
        .with_heads_apart(apart)
}

fn customer_row(id: &str, balance: &str, notes: TupleValue, at: &str) -> TupleData {
    TupleData(vec![t(id), t("Ann O'Neil"), t(balance), notes, t(at)])
}

/// `public.all_types`: one column per mapping in the value mapping of
/// capture/src/sources/postgres/value/mod.rs.
fn all_types() -> (Relation, TupleData) {
    let cols: Vec<(&str, u32, i32, &str)> = vec![
        ("id", 20, -1, "9007199254740993"),
        ("c_bool", 16, -1, "t"),
        ("c_int2", 21, -1, "-32768"),
        ("c_int4", 23, -1, "2147483647"),
        ("c_float4", 700, -1, "1.5"),
        ("c_float8", 701, -1, "-2.25e-05"),
        ("c_float8_nan", 701, -1, "NaN"),
        ("c_numeric", 1700, (12 << 16 | 2) + 4, "12345678.90"),
        ("c_money", 790, -1, "-$1,234.56"),
        ("c_char", 1042, 4 + 4, "ab  "),
        ("c_varchar", 1043, 32 + 4, "héllo \"quoted\"\n"),
        ("c_text", 25, -1, "plain text"),
        ("c_timestamptz", 1184, -1, "2026-11-27 15:10:35.670111+00"),
        ("c_timestamp", 1114, -1, "2026-11-27 15:10:35.670111"),
        ("c_timestamp_inf", 1114, -1, "infinity"),
        ("c_date", 1082, -1, "2026-11-27"),
        ("c_time", 1083, -1, "15:10:35.670111"),
        ("c_timetz", 1266, -1, "15:10:35.670111+05:30"),
        ("c_interval", 1186, -1, "1 year 2 mons 3 days 04:05:06.789"),
        // PostgreSQL's extremes: infinities, negative parts, the widest years.
        (
            "c_interval_neg",
            1186,
            -1,
            "-1 years -2 mons +3 days -04:05:06.789",
        ),
        ("c_interval_huge", 1186, -1, "-178000000 years"),
        ("c_timestamptz_bc", 1184, -1, "0044-03-15 12:00:00+00 BC"),
        (
            "c_timestamptz_max",
            1184,
            -1,
            "294276-12-31 23:59:59.999999+00",
        ),
        ("c_timestamptz_neg_inf", 1184, -1, "-infinity"),
        ("c_timestamp_bc", 1114, -1, "4713-01-01 00:00:00 BC"),
        ("c_timestamp_neg_inf", 1114, -1, "-infinity"),
        ("c_date_bc", 1082, -1, "4713-01-01 BC"),
        ("c_date_max", 1082, -1, "5874897-12-31"),
        ("c_date_inf", 1082, -1, "infinity"),
        ("c_time_24", 1083, -1, "24:00:00"),
        ("c_timetz_24", 1266, -1, "24:00:00+00"),
        ("c_bytea", 17, -1, "\\x0001feff"),
        ("c_json", 114, -1, "{\"a\": [1, 2]}"),
        ("c_jsonb", 3802, -1, "{\"b\": {\"c\": null}}"),
        ("c_uuid", 2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("c_enum", MOOD_OID, -1, "happy"),
        ("c_int4_array", 1007, -1, "{1,2,NULL}"),
        ("c_text_array", 1009, -1, "{plain,\"a,b\",\"x\\\"y\",NULL}"),
        ("c_inet", 869, -1, "192.168.0.1/24"),
    ];
    let mut columns: Vec<Column> = cols
        .iter()
        .map(|&(name, oid, typmod, _)| col(name, oid, typmod, name == "id"))
        .collect();
    let mut values: Vec<TupleValue> = cols.iter().map(|&(_, _, _, text)| t(text)).collect();
    columns.push(col("c_null", 25, -1, false));
    values.push(TupleValue::Null);
    let rel = Relation {
        id: 16_390,
        namespace: "public".into(),
        name: "all_types".into(),
        replica_identity: ReplicaIdentity::Default,
        columns,
    };
    (rel, TupleData(values))
}

struct Case {
    file: &'static str,
    description: &'static str,
    topic: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    /// The heads the key and value were written without.
    heads: Heads,
}

fn case(
    file: &'static str,
    description: &'static str,
    enc: &TableEncoder,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
) -> Case {
    Case {
        file,
        description,
        topic: enc.topic().to_owned(),
        key,
        value,
        heads: enc.heads(),
    }
}

fn cases() -> Vec<Case> {
    cases_with(HeadsApart::default())
}

/// The golden records, the parts `apart` names written apart from their
/// schema heads (as for the Avro converters).
fn cases_with(apart: HeadsApart) -> Vec<Case> {
    let mut out = Vec::new();
    let at = "2026-11-27 15:10:35.670111+00";

    let (rel, row) = all_types();
    let enc = TableEncoder::new(&rel, &registry(), None, &cfg(true))
        .expect("all_types")
        .with_heads_apart(apart);
    out.push(case(
        "insert_all_types.json",
        "Insert (op c) into a table with one column per mapped type, schemas enabled. \
         Shows NaN kept as a string, timestamp/date infinity as PostgreSQL's sentinels \
         (i64::MAX/MIN µs, i32::MAX/MIN days), BC and far-future values, 24:00:00, \
         intervals as exact ISO-8601 strings, numeric/money as exact strings, \
         the numeric's precision and scale in the schema parameters.",
        &enc,
        Some(enc.key(&row).expect("key")),
        Some(
            enc.value(
                Op::Create,
                None,
                Some(&row),
                &pos(COMMIT_LSN - 0x200, 1, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));

    let propagate = EnvelopeConfig {
        columns: ColumnPolicy::new(ColumnSettings {
            include: &[],
            exclude: &[],
            mask: &Default::default(),
            truncate: &Default::default(),
            propagate_columns: &["public\\.all_types\\..*".into()],
            propagate_types: &[],
        })
        .expect("policy"),
        ..cfg(true)
    };
    let enc = TableEncoder::new(&rel, &registry(), None, &propagate)
        .expect("all_types")
        .with_heads_apart(apart);
    out.push(case(
        "insert_propagate_source_type.json",
        "The insert of insert_all_types.json with column.propagate.source.type naming every \
         column: each key and value field schema carries Debezium's \
         __debezium.source.column.type (upper case; _INT4 for int4[], the enum's own name), \
         .length and .scale where the declaration gives them, then .name.",
        &enc,
        Some(enc.key(&row).expect("key")),
        Some(
            enc.value(
                Op::Create,
                None,
                Some(&row),
                &pos(COMMIT_LSN - 0x200, 1, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));

    let enc = customers_encoder(ReplicaIdentity::Default, false, apart);
    let row = customer_row("1", "100.00", t("first order"), at);
    out.push(case(
        "insert_schemas_off.json",
        "Insert (op c) with schemas disabled: key and value are bare payloads.",
        &enc,
        Some(enc.key(&row).expect("key")),
        Some(
            enc.value(
                Op::Create,
                None,
                Some(&row),
                &pos(COMMIT_LSN - 0x180, 1, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));

    let enc = customers_encoder(ReplicaIdentity::Full, true, apart);
    let before = customer_row("1", "100.00", t("first order"), at);
    let after = customer_row("1", "250.50", t("second order"), "2026-11-27 15:12:00+00");
    out.push(case(
        "update_full_before.json",
        "Update (op u) of a REPLICA IDENTITY FULL table: before holds the whole old row. \
         Key is the primary key, passed explicitly since FULL flags every column.",
        &enc,
        Some(enc.key(&after).expect("key")),
        Some(
            enc.value(
                Op::Update,
                Some(&before),
                Some(&after),
                &pos(COMMIT_LSN - 0x100, 2, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));

    let enc = customers_encoder(ReplicaIdentity::Default, true, apart);
    out.push(case(
        "update_default_identity.json",
        "Update (op u) under the default replica identity: no old tuple, before is null.",
        &enc,
        Some(enc.key(&after).expect("key")),
        Some(
            enc.value(
                Op::Update,
                None,
                Some(&after),
                &pos(COMMIT_LSN - 0xF0, 3, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));

    let old_key = TupleData(vec![
        t("1"),
        TupleValue::Null,
        TupleValue::Null,
        TupleValue::Null,
        TupleValue::Null,
    ]);
    let delete_key = enc.key(&old_key).expect("key");
    out.push(case(
        "delete_key_only.json",
        "Delete (op d) under the default replica identity: before carries only the key; \
         the other columns are null because PostgreSQL did not send them.",
        &enc,
        Some(delete_key.clone()),
        Some(
            enc.value(
                Op::Delete,
                Some(&old_key),
                None,
                &pos(COMMIT_LSN - 0xE0, 4, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));
    out.push(case(
        "tombstone.json",
        "Tombstone following a delete: same key, null value, so compaction can drop the key.",
        &enc,
        Some(delete_key),
        None,
    ));

    out.push(Case {
        // A truncate's value is always whole.
        heads: Heads::default(),
        ..case(
            "truncate.json",
            "Truncate (op t): no key, no row images.",
            &enc,
            None,
            Some(enc.truncate_value(&pos(COMMIT_LSN - 0xD0, 5, SnapshotMarker::False), NOW_MS)),
        )
    });

    let (topic, key, value) = message_record(
        &cfg(true),
        true,
        "oncely.marker",
        b"{\"batch\":17}",
        &pos(COMMIT_LSN - 0xC0, 6, SnapshotMarker::False),
        NOW_MS,
    );
    out.push(Case {
        file: "message.json",
        description: "Transactional logical decoding message (op m) from \
                      pg_logical_emit_message; content is base64.",
        topic,
        key: Some(key),
        value: Some(value),
        heads: Heads::default(),
    });

    let enc = customers_encoder(ReplicaIdentity::Default, false, apart);
    let row = customer_row("2", "0.00", TupleValue::Null, at);
    let mut snap = pos(COMMIT_LSN + 0x1000, 1, SnapshotMarker::True);
    snap.commit_lsn = COMMIT_LSN + 0x1000;
    out.push(case(
        "snapshot_read.json",
        "Snapshot row (op r, snapshot \"true\"), schemas disabled. lsn and commit_lsn are \
         the chunk's high watermark.",
        &enc,
        Some(enc.key(&row).expect("key")),
        Some(
            enc.value(Op::Read, None, Some(&row), &snap, NOW_MS)
                .expect("value"),
        ),
    ));

    let enc = customers_encoder(ReplicaIdentity::Default, true, apart);
    let after = customer_row("1", "300.00", TupleValue::Unchanged, at);
    out.push(case(
        "update_unchanged_toast.json",
        "Update (op u) that left a TOASTed column unchanged: notes is the placeholder \
         __debezium_unavailable_value (never null); sinks keep the stored value.",
        &enc,
        Some(enc.key(&after).expect("key")),
        Some(
            enc.value(
                Op::Update,
                None,
                Some(&after),
                &pos(COMMIT_LSN - 0xB0, 7, SnapshotMarker::False),
                NOW_MS,
            )
            .expect("value"),
        ),
    ));
    out
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/envelope")
}

fn to_json(bytes: Option<&Vec<u8>>) -> Value {
    bytes.map_or(Value::Null, |b| {
        serde_json::from_slice(b).expect("record is valid JSON")
    })
}

#[test]
fn golden_fixtures() {
    let dir = fixture_dir();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let cases = cases();
    if update {
        std::fs::create_dir_all(&dir).expect("create fixture dir");
    }
    for c in &cases {
        let doc = json!({
            "description": c.description,
            "topic": c.topic,
            "key": to_json(c.key.as_ref()),
            "value": to_json(c.value.as_ref()),
        });
        let path = dir.join(c.file);
        if update {
            let mut text = serde_json::to_string_pretty(&doc).expect("serialize");
            text.push('\n');
            std::fs::write(&path, text).expect("write fixture");
            continue;
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
                path.display()
            )
        });
        let stored: Value = serde_json::from_str(&stored).expect("fixture is JSON");
        assert_eq!(
            stored,
            doc,
            "{} differs from what the encoder writes; if the change is intended, \
             rerun with UPDATE_GOLDEN=1 and tell the sink side",
            path.display()
        );
    }
    // Every fixture file is produced here: none is stale.
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = cases.iter().map(|c| c.file.to_owned()).collect();
    expected.sort();
    assert_eq!(on_disk, expected, "fixture files and golden cases differ");
}

/// Every golden record with a schema converts to Avro without its schema
/// parsed, hashed or registered again once its shape is known, to the
/// bytes the parsing path gives; a record of another shape (a DDL) or one
/// with more after its payload is not taken for a known one.
#[tokio::test]
async fn a_known_schema_converts_as_the_parsed_record_does() {
    use oncely_core::avro::{wire, AvroCodec};
    let mut checked = 0;
    for c in cases() {
        for (bytes, is_key) in [(&c.key, true), (&c.value, false)] {
            let Some(bytes) = bytes else { continue };
            let doc: Value = serde_json::from_slice(bytes).expect("json");
            if doc.get("schema").is_none_or(Value::is_null) {
                continue;
            }
            let codec =
                std::sync::Arc::new(AvroCodec::from_connect(&doc["schema"]).expect("codec"));
            let parsed = wire::frame(9, &codec.encode(&doc["payload"]).expect("encode"));
            let w = crate::avro::unreachable_writer(true, true);
            let known = crate::avro::Known::new(&doc["schema"], 9, codec);
            assert!(w.remember(&c.topic, is_key, known, bytes), "{}", c.file);
            // The registry is never asked: a wait for it would end in an error.
            w.stop_now();
            let (key, value) = if is_key {
                w.convert(&c.topic, Some(bytes), None).await
            } else {
                w.convert(&c.topic, None, Some(bytes)).await
            }
            .unwrap_or_else(|e| panic!("{}: {e}", c.file));
            assert_eq!(if is_key { key } else { value }, Some(parsed), "{}", c.file);
            // Another shape, or a record with more than schema and payload,
            // is parsed whole: here the registry it then needs fails.
            let mut other = bytes.clone();
            other.truncate(other.len() - 1);
            other.extend_from_slice(b",\"extra\":1}");
            let out = w.convert(&c.topic, None, Some(&other)).await;
            assert_eq!(out.unwrap(), (None, None), "{}", c.file);
            let ddl = String::from_utf8(bytes.clone()).expect("utf-8").replacen(
                "{\"schema\":{",
                "{\"schema\":{\"doc\":\"v2\",",
                1,
            );
            let out = w.convert(&c.topic, None, Some(ddl.as_bytes())).await;
            let e = out.expect_err(c.file);
            assert!(e.is_retriable(), "{}: {e}", c.file);
            checked += 1;
        }
    }
    assert!(checked >= 14, "only {checked} records checked");
}

/// With the Avro converters' parts written apart from their schema heads
/// (the ~3 kB head neither written nor compared per record), every golden
/// record made whole again is the record written whole, and its payload
/// alone converts to the bytes the parsing path gives the whole record: the
/// guard that the direct path changes nothing on the wire. A head of
/// another shape (a DDL) is never taken for the known one.
#[tokio::test]
async fn records_written_apart_from_their_heads_convert_as_whole_ones() {
    use oncely_core::avro::{wire, AvroCodec};
    let apart = HeadsApart {
        key: true,
        value: true,
    };
    let (whole, parts) = (cases(), cases_with(apart));
    assert_eq!(whole.len(), parts.len());
    let mut checked = 0;
    for (w, c) in whole.iter().zip(&parts) {
        let sides = [
            (&w.key, &c.key, &c.heads.key, true),
            (&w.value, &c.value, &c.heads.value, false),
        ];
        for (whole_bytes, bytes, head, is_key) in sides {
            let (Some(whole_bytes), Some(bytes), Some(head)) = (whole_bytes, bytes, head) else {
                // Nothing apart: the same bytes.
                assert_eq!(whole_bytes, bytes, "{}", c.file);
                continue;
            };
            assert_eq!(&Heads::whole(head, bytes), whole_bytes, "{}", c.file);
            let doc: Value = serde_json::from_slice(whole_bytes).expect("json");
            let codec =
                std::sync::Arc::new(AvroCodec::from_connect(&doc["schema"]).expect("codec"));
            let parsed = wire::frame(9, &codec.encode(&doc["payload"]).expect("encode"));
            let writer = crate::avro::unreachable_writer(true, true);
            let known = crate::avro::Known::new(&doc["schema"], 9, codec);
            assert!(writer.remember(&c.topic, is_key, known, whole_bytes));
            // The registry is never asked: a wait for it would end in an error.
            writer.stop_now();
            let one = |head: std::sync::Arc<[u8]>| match is_key {
                true => Heads {
                    key: Some(head),
                    value: None,
                },
                false => Heads {
                    key: None,
                    value: Some(head),
                },
            };
            let heads = one(head.clone());
            let (k, v) = if is_key {
                writer.convert_apart(&c.topic, Some(bytes), None, &heads)
            } else {
                writer.convert_apart(&c.topic, None, Some(bytes), &heads)
            }
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.file));
            assert_eq!(if is_key { k } else { v }, Some(parsed), "{}", c.file);
            // Another shape's head: parsed whole, which needs the registry.
            let ddl = String::from_utf8(head.to_vec()).expect("utf-8").replacen(
                "{\"schema\":{",
                "{\"schema\":{\"doc\":\"v2\",",
                1,
            );
            let ddl = one(ddl.into_bytes().into());
            let out = if is_key {
                writer.convert_apart(&c.topic, Some(bytes), None, &ddl)
            } else {
                writer.convert_apart(&c.topic, None, Some(bytes), &ddl)
            };
            let e = out.await.expect_err(c.file);
            assert!(e.is_retriable(), "{}: {e}", c.file);
            checked += 1;
        }
    }
    // Every key and value with a schema but the truncate's and the message's.
    assert!(checked >= 13, "only {checked} records checked");
}
