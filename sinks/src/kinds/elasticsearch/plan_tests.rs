use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::event::{decode_value, Payload};
use oncely_core::wire::UNAVAILABLE_VALUE;

fn config(extra: &str) -> ElasticsearchConfig {
    oncely_core::config::from_str(extra, "sink").expect("config")
}

fn record(offset: i64, id: i64, op: &str, lsn: u64, seq: u64, row: Value) -> Record {
    let (before, after) = if op == "d" {
        (row, Value::Null)
    } else {
        (Value::Null, row)
    };
    let v = json!({"before": before, "after": after, "op": op,
        "source": {"commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "T", "db": "d"}});
    let payload = decode_value(Some(v.to_string().as_bytes())).expect("envelope");
    Record::new(offset, Some(json!({ "id": id })), payload)
}

fn batch(records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from("p.public.t"), 0), records, next)
}

#[test]
fn events_of_a_key_fold_into_the_last_version_with_toast_filled_from_the_batch() {
    let b = batch(vec![
        record(0, 1, "c", 100, 0, json!({"id": 1, "body": "big", "n": 0})),
        record(1, 2, "c", 100, 1, json!({"id": 2, "body": "x", "n": 0})),
        record(
            2,
            1,
            "u",
            200,
            0,
            json!({"id": 1, "body": UNAVAILABLE_VALUE, "n": 1}),
        ),
    ]);
    let p = plan(&b, &config(""));
    assert!(p.rejected.is_empty());
    assert_eq!(p.writes.len(), 2);
    let w = &p.writes[0];
    assert_eq!(
        (w.index.as_str(), w.id.as_str(), w.offset),
        ("p.public.t", "1", 2)
    );
    assert_eq!(w.version, crate::event::Version::new(200, 0));
    assert_eq!(
        w.action,
        Action::Index {
            doc: Cow::Owned(
                json!({"id": 1, "n": 1, "body": "big"})
                    .as_object()
                    .cloned()
                    .expect("obj")
            ),
            missing: vec![]
        }
    );
    assert!(!w.needs_stored());
}

#[test]
fn unavailable_values_without_an_earlier_event_are_read_from_the_store() {
    let b = batch(vec![record(
        5,
        1,
        "u",
        300,
        2,
        json!({"id": 1, "body": UNAVAILABLE_VALUE}),
    )]);
    let p = plan(&b, &config(""));
    let w = &p.writes[0];
    assert!(w.needs_stored());
    assert!(
        matches!(&w.action, Action::Index { missing, doc } if missing == &["body"] && !doc.contains_key("body"))
    );
}

#[test]
fn deletes_and_soft_deletes() {
    let b = batch(vec![
        record(0, 1, "c", 100, 0, json!({"id": 1, "n": 0})),
        record(1, 1, "d", 200, 0, json!({"id": 1})),
        Record::new(2, Some(json!({"id": 1})), Payload::Tombstone),
    ]);
    let p = plan(&b, &config(""));
    assert_eq!(p.writes.len(), 1);
    assert_eq!(p.writes[0].action, Action::Delete);
    assert_eq!(p.writes[0].offset, 1);
    let p = plan(&b, &config("delete.mode = \"soft\""));
    let doc = json!({"id": 1, "n": 0, "__deleted": true});
    assert_eq!(
        p.writes[0].action,
        Action::Index {
            doc: Cow::Owned(doc.as_object().cloned().expect("obj")),
            missing: vec![]
        }
    );
    let b = batch(vec![record(1, 1, "d", 200, 0, json!({"id": 1}))]);
    let p = plan(&b, &config("delete.mode = \"soft\""));
    assert!(p.writes[0].needs_stored());
}

#[test]
fn unappliable_records_are_rejected_before_any_write() {
    let mut no_key = record(0, 1, "c", 1, 0, json!({"id": 1}));
    no_key.key = None;
    // Beyond the old packing `lsn << 20 | seq`: applied like any other.
    let high = record(1, 2, "c", u64::MAX, u64::MAX, json!({"id": 2}));
    let b = batch(vec![
        no_key,
        high,
        record(2, 3, "c", 1, 1, json!({"id": 3})),
    ]);
    let p = plan(&b, &config(""));
    let offsets: Vec<i64> = p.rejected.iter().map(|f| f.offset).collect();
    assert_eq!(offsets, vec![0]);
    assert_eq!(p.writes.len(), 2);
}

#[test]
fn ids_and_index_names() {
    assert_eq!(document_id(&json!({"id": 42})).as_deref(), Ok("42"));
    assert_eq!(document_id(&json!({"k": "a/b"})).as_deref(), Ok("a/b"));
    assert_eq!(
        document_id(&json!({"a": 1, "b": "x"})).as_deref(),
        Ok("[1,\"x\"]")
    );
    assert!(document_id(&json!({"k": null})).is_err());
    assert!(document_id(&json!({"k": "x".repeat(513)})).is_err());
    assert!(document_id(&json!(5)).is_err());
    let b = batch(vec![record(0, 1, "c", 1, 0, json!({"id": 1}))]);
    let e = b.records()[0].event().expect("event");
    assert_eq!(
        event_index("cdc-{db}-{schema}-{table}", "x", e).as_deref(),
        Ok("cdc-d-public-t")
    );
    assert_eq!(
        index_name(
            "{topic}",
            "p.Sales.Order_Items",
            "d",
            "Sales",
            "Order Items"
        )
        .as_deref(),
        Ok("p.sales.order_items")
    );
    // Refused, never shortened: a shortened name could be another table's.
    let long = "t".repeat(250);
    let err = index_name("{topic}", &format!("p.public.{long}"), "d", "public", &long)
        .expect_err("too long");
    assert!(
        err.contains("255") && err.contains("sink.index.pattern"),
        "{err}"
    );
    assert!(index_name("{schema}.{table}", "x", "d", "Sales", "Order Items").is_err());
    assert!(index_name("{table}", "x", "d", "public", "_t").is_err());
}

#[test]
fn an_older_or_repeated_version_in_the_batch_never_wins() {
    let b = batch(vec![
        record(0, 1, "u", 300, 0, json!({"id": 1, "n": 3})),
        record(1, 1, "u", 100, 0, json!({"id": 1, "n": 1})),
        record(2, 1, "u", 300, 0, json!({"id": 1, "n": 3})),
        record(3, 1, "d", 200, 0, json!({"id": 1})),
    ]);
    let p = plan(&b, &config(""));
    assert_eq!(p.writes.len(), 1);
    let w = &p.writes[0];
    assert_eq!(
        (w.offset, w.version),
        (0, crate::event::Version::new(300, 0))
    );
    assert!(matches!(&w.action, Action::Index { doc, .. } if doc.get("n") == Some(&json!(3))));
}

#[test]
fn a_tombstone_standing_for_its_delete_soft_deletes_by_key() {
    let origin = crate::event::TombstoneOrigin {
        version: crate::event::Version::new(200, 1),
        schema: "public".into(),
        table: "t".into(),
    };
    let b = batch(vec![Record::new(
        3,
        Some(json!({"id": 1})),
        Payload::Change(Box::new(origin.to_delete())),
    )]);
    let p = plan(&b, &config("delete.mode = \"soft\""));
    assert!(p.rejected.is_empty(), "{:?}", p.rejected);
    assert!(p.writes[0].needs_stored());
    let p = plan(&b, &config(""));
    assert_eq!(p.writes[0].action, Action::Delete);
}

fn truncate_record(offset: i64, lsn: u64, seq: u64) -> Record {
    let v = json!({"before": null, "after": null, "op": "t",
        "source": {"commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "T", "db": "d"}});
    Record::new(
        offset,
        None,
        decode_value(Some(v.to_string().as_bytes())).expect("envelope"),
    )
}

#[test]
fn truncates_are_planned_after_the_writes_and_columns_never_shadow_the_version_fields() {
    let b = batch(vec![
        record(0, 1, "c", 5, 1, json!({"id": 1})),
        truncate_record(1, 6, 1),
        record(2, 2, "c", 6, 2, json!({"id": 2})),
    ]);
    let p = plan(&b, &config(""));
    assert!(p.rejected.is_empty(), "{:?}", p.rejected);
    assert_eq!(p.writes.len(), 2);
    assert_eq!(
        p.truncates,
        vec![Truncate {
            index: "p.public.t".into(),
            version: crate::event::Version::new(6, 1),
            offset: 1
        }]
    );
    // A column named like a version field cannot be stored beside it.
    for column in ["__oncely_version", "__oncely_lsn", "__oncely_seq"] {
        let b = batch(vec![record(0, 1, "c", 5, 1, json!({"id": 1, column: 3}))]);
        let p = plan(&b, &config(""));
        assert_eq!(p.rejected.len(), 1, "{column}");
        assert!(p.rejected[0].reason.contains(column), "{:?}", p.rejected);
    }
}
