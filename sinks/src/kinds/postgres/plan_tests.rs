use std::sync::Arc;

use serde_json::{json, Value};

use super::super::rows::column_values;
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

fn rows(plan: &Plan, step: usize) -> Vec<Row> {
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
    assert_eq!(rows[0].value(b.records(), "v"), Some(&json!("c")));
    assert_eq!(rows[0].version, Version::new(20, 1));
    assert_eq!(rows[1].offset, 3);
    assert!(rows[1].is_delete(), "the delete wins");
    assert_eq!(rows[1].value(b.records(), "id"), Some(&json!(2)));
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
    let records = b.records();
    assert_eq!(rows[0].value(records, "big"), Some(&json!("x".repeat(10))));
    assert_eq!(rows[0].value(records, "n"), Some(&json!(2)));
    assert!(rows[0].shape.unavailable.is_empty());
    assert!(rows[0].shape.has_value("big"));
    assert_eq!(rows[1].shape.unavailable, vec!["big".to_string()]);
    assert!(!rows[1].shape.has_value("big"));
    assert_eq!(rows[1].value(records, "big"), None);
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
        let mut out = Vec::new();
        for v in values {
            super::push_key_part(&mut out, v);
        }
        out
    };
    let pairs = [
        (vec![json!("a;"), json!("b")], vec![json!("a"), json!(";b")]),
        (vec![json!(1)], vec![json!("1")]),
        (vec![json!(1), json!(2)], vec![json!(258)]),
        (vec![json!(""), json!("")], vec![json!("")]),
        (vec![json!("s1:x;")], vec![json!("x")]),
        (vec![json!(1.5)], vec![json!("1.5")]),
    ];
    for (a, b) in pairs {
        assert_ne!(id(&a), id(&b), "{a:?} vs {b:?}");
    }
    assert_eq!(id(&[json!(7), json!("x")]), id(&[json!(7), json!("x")]));
}

#[test]
fn rows_of_one_shape_share_it_and_a_new_shape_is_not_confused_with_it() {
    let config = PostgresConfig::new("postgres://x@h/db");
    let b = batch(vec![
        change(0, 1, "u", json!({"id": 1, "v": "a", "n": 1}), 10, 1),
        change(1, 2, "u", json!({"id": 2, "v": "b", "n": 2}), 10, 2),
        change(2, 3, "u", json!({"id": 3, "v": "c", "n": 2.5}), 10, 3),
        change(3, 4, "u", json!({"id": 4, "v": "d", "n": 3}), 10, 4),
        change(4, 5, "u", json!({"id": 5, "n": 3, "v": "e"}), 10, 5),
        change(5, 6, "d", Value::Null, 10, 6),
        change(6, 7, "d", Value::Null, 10, 7),
    ]);
    let p = plan(&config, &b);
    let rows = rows(&p, 0);
    assert_eq!(rows.len(), 7);
    assert!(Arc::ptr_eq(&rows[0].shape, &rows[1].shape));
    assert_eq!(rows[2].shape.specs["n"].ddl, "double precision");
    assert_eq!(rows[3].shape.specs["n"].ddl, "bigint");
    assert!(
        !Arc::ptr_eq(&rows[1].shape, &rows[3].shape),
        "after a different one"
    );
    assert_eq!(rows[3].shape.values, rows[4].shape.values, "sorted columns");
    assert!(rows[5].is_delete() && Arc::ptr_eq(&rows[5].shape, &rows[6].shape));
    assert_eq!(rows[5].shape.key, vec!["id".to_string()]);
}

#[test]
fn a_prepared_plan_is_dropped_when_records_are_removed() {
    let mut b = batch(vec![
        change(0, 1, "c", json!({"id": 1}), 10, 1),
        change(1, 2, "c", json!({"id": 2}), 10, 2),
    ]);
    let config = PostgresConfig::new("postgres://x@h/db");
    b.set_prepared(plan(&config, &b));
    assert!(b.prepared::<Plan>().is_some());
    assert!(b.prepared::<String>().is_none(), "another type");
    assert!(b.clone().prepared::<Plan>().is_some());
    b.remove_offsets(&[0]);
    assert!(b.prepared::<Plan>().is_none());
}

proptest::proptest! {
    /// `column_values` (positional, per shape) gives exactly what `Row::value`
    /// gives by name, for rows of mixed shapes: other column orders, unavailable
    /// values (filled from older changes or not), deletes, nulls, missing columns.
    #[test]
    fn column_values_match_lookups_by_name(
        changes in proptest::collection::vec(
            (0i64..6, 0u8..4, proptest::collection::vec((0usize..5, 0u8..5), 0..6)),
            1..40,
        )
    ) {
        let names = ["id", "a", "b", "c", "d"];
        let mut records = Vec::new();
        for (i, (id, op, cols)) in changes.iter().enumerate() {
            let mut after = serde_json::Map::new();
            for (c, kind) in cols {
                let value = match kind {
                    0 => Value::Null,
                    1 => json!(UNAVAILABLE),
                    2 => json!(i),
                    3 => json!(format!("v{i}")),
                    _ => json!(i % 2 == 0),
                };
                after.insert(names[*c].to_owned(), value);
            }
            after.insert("id".to_owned(), json!(id));
            let op = ["c", "u", "r", "d"][*op as usize];
            records.push(change(i as i64, *id, op, Value::Object(after), 10 + i as u64, 0));
        }
        let b = batch(records);
        let p = plan(&PostgresConfig::new("postgres://x@h/db"), &b);
        proptest::prop_assert!(p.rejected.is_empty());
        let rows = rows(&p, 0);
        let refs: Vec<&Row> = rows.iter().collect();
        let columns = ["id", "a", "b", "c", "d", "zz"];
        let got = column_values(&columns, &refs, b.records());
        for (c, column) in columns.iter().enumerate() {
            let want: Vec<Option<&Value>> = refs
                .iter()
                .map(|r| r.value(b.records(), column).filter(|v| !v.is_null()))
                .collect();
            proptest::prop_assert_eq!(&got[c], &want, "column {}", column);
        }
    }
}

#[test]
fn an_equal_version_keeps_the_first_change_like_the_targets_guard() {
    // A replayed duplicate (same commit LSN and ordinal) in one batch: the
    // upsert's guard `(stored lsn, seq) < (incoming lsn, seq)` would keep the
    // first across batches, and the fold keeps it within one (`replaces`).
    let config = PostgresConfig::new("postgres://x@h/db");
    let b = batch(vec![
        change(0, 1, "c", json!({"id": 1, "v": "first"}), 10, 1),
        change(1, 1, "c", json!({"id": 1, "v": "again"}), 10, 1),
    ]);
    let rows = rows(&plan(&config, &b), 0);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].offset, 0);
    assert_eq!(rows[0].value(b.records(), "v"), Some(&json!("first")));
}

/// A field name over PostgreSQL's 63 bytes (a MySQL column may have 64
/// characters) is the column PostgreSQL cuts it to: the row names that
/// column and reads its value under the field's name, key included; two
/// fields cut to one name are the record's failure.
#[test]
fn field_names_over_63_bytes_name_the_column_postgresql_cuts_them_to() {
    let config = PostgresConfig::new("postgres://x@h/db");
    let long = format!("c{}", "y".repeat(63));
    let wide = "日".repeat(22);
    let b = batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, long.clone(): 5, wide.clone(): "w"}),
        10,
        1,
    )]);
    let p = plan(&config, &b);
    assert!(p.rejected.is_empty(), "{:?}", p.rejected);
    let rows = rows(&p, 0);
    let values = rows[0].shape.values.clone().unwrap_or_default();
    assert_eq!(
        values,
        [long[..63].to_string(), "id".to_string(), "日".repeat(21)]
    );
    assert_eq!(rows[0].value(b.records(), &long[..63]), Some(&json!(5)));
    assert_eq!(
        rows[0].value(b.records(), &"日".repeat(21)),
        Some(&json!("w"))
    );
    let cols: Vec<&str> = values.iter().map(String::as_str).collect();
    let found = column_values(&cols, &[&rows[0]], b.records());
    assert_eq!(found[0], [Some(&json!(5))]);

    let twin = format!("{}z", &long[..63]);
    let b = batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, long.clone(): 5, twin: 6}),
        10,
        1,
    )]);
    let p = plan(&config, &b);
    assert_eq!(p.rejected.len(), 1, "{:?}", p.rejected);
    assert!(
        format!("{:?}", p.rejected[0]).contains("cuts names to 63 bytes"),
        "{:?}",
        p.rejected
    );
}
