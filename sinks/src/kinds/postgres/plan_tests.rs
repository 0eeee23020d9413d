use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::event::decode_value;

fn record(offset: i64, key: Option<Value>, value: Option<Value>) -> Record {
    let bytes = value.map(|v| v.to_string().into_bytes());
    let payload = decode_value(bytes.as_deref()).expect("decodes");
    Record::new(offset, key, payload)
}

fn change(offset: i64, id: i64, op: &str, after: Value, lsn: u64, seq: u64) -> Record {
    let before = if op == "d" {
        json!({"id": id})
    } else {
        Value::Null
    };
    let after = if op == "d" { Value::Null } else { after };
    let value = json!({"before": before, "after": after, "op": op,
        "source": {"schema": "public", "table": "t", "commit_lsn": lsn, "event_seq": seq}});
    record(offset, Some(json!({"id": id})), Some(value))
}

fn batch(records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from("p.public.t"), 0), records, next)
}

fn rows<'a>(plan: &Plan<'a>, step: usize) -> Vec<Row<'a>> {
    match &plan.steps[step] {
        Step::Rows(tables) => {
            let mut rows: Vec<Row> = tables["public_t"].rows.values().cloned().collect();
            rows.sort_by_key(|r| r.offset);
            rows
        }
        other => panic!("expected rows, got {other:?}"),
    }
}

#[test]
fn several_changes_of_a_key_collapse_to_the_newest() {
    let config = PostgresConfig::new("postgres://x@h/db");
    let b = batch(vec![
        change(0, 1, "c", json!({"id": 1, "v": "a"}), 10, 1),
        change(1, 2, "c", json!({"id": 2, "v": "b"}), 10, 2),
        change(2, 1, "u", json!({"id": 1, "v": "c"}), 20, 1),
        change(3, 2, "d", Value::Null, 30, 1),
        record(4, Some(json!({"id": 2})), None),
    ]);
    let p = plan(&config, &b);
    assert!(p.rejected.is_empty());
    let rows = rows(&p, 0);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].offset, 2);
    assert_eq!(
        rows[0].values.as_ref().map(|v| v["v"].clone()),
        Some(json!("c"))
    );
    assert_eq!(rows[0].version, Version::new(20, 1));
    assert_eq!(rows[1].offset, 3);
    assert!(rows[1].values.is_none(), "the delete wins");
}

#[test]
fn an_unavailable_value_is_taken_from_an_older_change_of_the_batch() {
    let config = PostgresConfig::new("postgres://x@h/db");
    let b = batch(vec![
        change(
            0,
            1,
            "u",
            json!({"id": 1, "big": "x".repeat(10), "n": 1}),
            10,
            1,
        ),
        change(
            1,
            1,
            "u",
            json!({"id": 1, "big": UNAVAILABLE, "n": 2}),
            20,
            1,
        ),
        change(
            2,
            3,
            "u",
            json!({"id": 3, "big": UNAVAILABLE, "n": 2}),
            20,
            2,
        ),
    ]);
    let p = plan(&config, &b);
    let rows = rows(&p, 0);
    let one = rows[0].values.as_ref().expect("values");
    assert_eq!(one["big"], &json!("x".repeat(10)));
    assert_eq!(one["n"], &json!(2));
    assert!(rows[0].unavailable.is_empty());
    assert_eq!(rows[1].unavailable, vec!["big".to_string()]);
    assert!(!rows[1].values.as_ref().expect("values").contains_key("big"));
}

#[test]
fn a_truncate_splits_the_batch_and_keyless_records_are_rejected() {
    let mut config = PostgresConfig::new("postgres://x@h/db");
    config.history_enabled = true;
    let truncate = json!({"before": null, "after": null, "op": "t",
        "source": {"schema": "public", "table": "t", "commit_lsn": 15, "event_seq": 1}});
    let keyless = json!({"before": null, "after": {"v": 1}, "op": "c",
        "source": {"schema": "public", "table": "t", "commit_lsn": 16, "event_seq": 1}});
    let b = batch(vec![
        change(0, 1, "c", json!({"id": 1}), 10, 1),
        record(1, None, Some(truncate)),
        change(2, 1, "c", json!({"id": 1}), 20, 1),
        record(3, None, Some(keyless)),
    ]);
    let p = plan(&config, &b);
    assert_eq!(p.steps.len(), 3);
    assert!(
        matches!(&p.steps[1], Step::Truncate { table, version } if table == "public_t" && *version == Version::new(15, 1))
    );
    assert_eq!(rows(&p, 2)[0].offset, 2);
    assert_eq!(p.rejected.len(), 1);
    assert_eq!(p.rejected[0].offset, 3);
    let history = &p.history["public_t_history"];
    assert_eq!(
        history.iter().map(|h| h.offset).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
}

#[test]
fn key_identities_never_collide() {
    use serde_json::json;
    let id = |values: &[serde_json::Value]| {
        let mut out = String::new();
        for v in values {
            super::push_key_part(&mut out, v);
        }
        out
    };
    let pairs = [
        (vec![json!("a;"), json!("b")], vec![json!("a"), json!(";b")]),
        (vec![json!(1)], vec![json!("1")]),
        (vec![json!("s1:x;")], vec![json!("x")]),
        (vec![json!(1.5)], vec![json!("1.5")]),
    ];
    for (a, b) in pairs {
        assert_ne!(id(&a), id(&b), "{a:?} vs {b:?}");
    }
    assert_eq!(id(&[json!(7), json!("x")]), id(&[json!(7), json!("x")]));
}
