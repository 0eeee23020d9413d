//! The pure change → records mapping: primary-key changes, TOAST fill,
//! tombstones, truncates, and ordinals that agree with the records.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::record::Record;
use super::router::{
    create_needs_source, fill_unchanged_toast, ordinals, records, Mapping, Resolved, Route, Routes,
};
use crate::envelope::{EnvelopeConfig, SnapshotMarker, SourcePosition, TableEncoder};
use crate::pgoutput::{
    Column, LogicalMessage, OldTuple, Relation, ReplicaIdentity, TupleData, TupleValue,
};
use crate::value::{TypeRegistry, UNAVAILABLE_VALUE};

const INT: u32 = 23;
const TEXT: u32 = 25;

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(values: &[TupleValue]) -> TupleData {
    TupleData(values.to_vec())
}

fn envelope() -> EnvelopeConfig {
    EnvelopeConfig {
        topic_prefix: "app".into(),
        topic_mapping: Default::default(),
        database: "db".into(),
        schemas_enable: false,
    }
}

/// Table `public.docs<id>` (`id int` key, `big text`), routed to its topic.
fn table(id: u32) -> (u32, Option<Route>) {
    let rel = Relation {
        id,
        namespace: "public".into(),
        name: format!("docs{id}"),
        replica_identity: ReplicaIdentity::Default,
        columns: [("id", INT), ("big", TEXT)]
            .iter()
            .map(|(name, type_oid)| Column {
                is_key: *name == "id",
                name: (*name).into(),
                type_oid: *type_oid,
                type_modifier: -1,
            })
            .collect(),
    };
    let enc = TableEncoder::new(&rel, &TypeRegistry::builtin(), None, &envelope()).unwrap();
    let topic: Arc<str> = enc.topic().into();
    (id, Some(Route::Table(enc, topic)))
}

fn routes() -> Routes {
    [table(1), table(2), (3, None)].into_iter().collect()
}

fn at(event_seq: u64) -> SourcePosition {
    SourcePosition {
        tx_id: 7,
        lsn: 90,
        commit_lsn: 100,
        event_seq,
        commit_ts_ms: 1,
        snapshot: SnapshotMarker::False,
    }
}

fn map(change: LogicalMessage, resolved: Resolved, tombstones: bool) -> (Vec<Record>, u64) {
    let env = envelope();
    let m = Mapping {
        envelope: &env,
        tombstones,
        now_ms: 2,
    };
    let routes = routes();
    let expected = ordinals(&routes, &change).unwrap();
    let (records, used) = records(&routes, change, &at(4), resolved, &m).unwrap();
    assert_eq!(used, expected, "ordinals agree with the records");
    (records, used)
}

/// A record's value as JSON (`Null` for a tombstone).
fn value(r: &Record) -> serde_json::Value {
    r.value.as_deref().map_or(serde_json::Value::Null, |v| {
        serde_json::from_slice(v).unwrap()
    })
}

fn pk_change(old: OldTuple, new: TupleData) -> LogicalMessage {
    LogicalMessage::Update {
        relation_id: 1,
        old: Some(old),
        new,
    }
}

#[test]
fn a_primary_key_change_is_a_delete_and_a_create_with_the_next_ordinal() {
    let change = pk_change(
        OldTuple::Key(row(&[text("1"), TupleValue::Null])),
        row(&[text("2"), text("b")]),
    );
    let (out, used) = map(change, Resolved::default(), true);
    assert_eq!(used, 2);
    assert_eq!(out.len(), 3, "delete, tombstone, create");
    assert_eq!(value(&out[0])["op"], "d");
    assert_eq!(value(&out[0])["source"]["event_seq"], 4);
    assert!(out[1].value.is_none(), "the tombstone");
    assert_eq!(out[1].key, out[0].key);
    assert_eq!(value(&out[2])["op"], "c");
    assert_eq!(value(&out[2])["source"]["event_seq"], 5);
    assert_ne!(out[2].key, out[0].key);

    let change = pk_change(
        OldTuple::Key(row(&[text("1"), TupleValue::Null])),
        row(&[text("2"), text("b")]),
    );
    let (out, _) = map(change, Resolved::default(), false);
    assert_eq!(
        out.len(),
        2,
        "no tombstone when tombstones.on.delete is off"
    );
}

#[test]
fn a_primary_key_change_carries_unchanged_toast_from_the_old_row_or_the_source() {
    let unchanged = row(&[text("2"), TupleValue::UnchangedToast]);
    // REPLICA IDENTITY FULL: the old row has the value; nothing to read.
    let full = OldTuple::Full(row(&[text("1"), text("big")]));
    assert!(create_needs_source(&enc(), Some(&full), &unchanged).is_none());
    let (out, _) = map(
        pk_change(full, unchanged.clone()),
        Resolved::default(),
        false,
    );
    assert_eq!(value(&out[1])["after"]["big"], "big");

    // Only the key in the old row: the create's row is read from the source.
    let key_only = OldTuple::Key(row(&[text("1"), TupleValue::Null]));
    let (columns, wanted) = create_needs_source(&enc(), Some(&key_only), &unchanged).unwrap();
    assert_eq!(
        (columns, wanted.clone()),
        (vec!["id".to_owned()], unchanged.clone())
    );
    let resolved = Resolved {
        created: Some(row(&[text("2"), text("read")])),
        ..Resolved::default()
    };
    let (out, _) = map(
        pk_change(key_only.clone(), unchanged.clone()),
        resolved,
        false,
    );
    assert_eq!(value(&out[1])["after"]["big"], "read");
    // The row gone from the source: the value stays marked unavailable.
    let (out, _) = map(pk_change(key_only, unchanged), Resolved::default(), false);
    assert_eq!(value(&out[1])["after"]["big"], UNAVAILABLE_VALUE);
}

fn enc() -> TableEncoder {
    match table(1).1 {
        Some(Route::Table(enc, _)) => enc,
        _ => unreachable!("table() routes to a table"),
    }
}

#[test]
fn an_update_keeping_its_key_is_one_event_and_reads_nothing() {
    let old = OldTuple::Full(row(&[text("1"), text("big")]));
    let new = row(&[text("1"), TupleValue::UnchangedToast]);
    assert!(create_needs_source(&enc(), Some(&old), &new).is_none());
    let (out, used) = map(pk_change(old, new), Resolved::default(), true);
    assert_eq!((out.len(), used), (1, 1));
    assert_eq!(value(&out[0])["op"], "u");
    assert_eq!(
        value(&out[0])["after"]["big"],
        "big",
        "filled from the old row"
    );
}

#[test]
fn a_truncate_is_one_event_per_captured_table_on_every_partition() {
    let change = LogicalMessage::Truncate {
        options: 0,
        relation_ids: vec![1, 3, 2],
    };
    let resolved = Resolved {
        partitions: HashMap::from([(1, 3), (2, 1)]),
        ..Resolved::default()
    };
    let (out, used) = map(change, resolved, true);
    assert_eq!(used, 2, "table 3 is not captured");
    let parts: Vec<(Option<i32>, serde_json::Value)> = out
        .iter()
        .map(|r| (r.partition, value(r)["source"]["event_seq"].clone()))
        .collect();
    assert_eq!(
        parts,
        [
            (Some(0), 4.into()),
            (Some(1), 4.into()),
            (Some(2), 4.into()),
            (Some(0), 5.into())
        ]
    );
}

#[test]
fn changes_of_tables_not_captured_publish_nothing_and_take_one_ordinal() {
    let change = LogicalMessage::Insert {
        relation_id: 3,
        new: row(&[text("1")]),
    };
    let (out, used) = map(change, Resolved::default(), true);
    assert!(out.is_empty());
    assert_eq!(used, 1);
    let unknown = LogicalMessage::Insert {
        relation_id: 9,
        new: row(&[text("1")]),
    };
    assert!(ordinals(&routes(), &unknown).is_ok());
    let env = envelope();
    let m = Mapping {
        envelope: &env,
        tombstones: true,
        now_ms: 0,
    };
    assert!(records(&routes(), unknown, &at(1), Resolved::default(), &m).is_err());
}

#[test]
fn full_identity_fills_unchanged_toast() {
    let old = row(&[text("1"), text("big")]);
    let new = row(&[text("1"), TupleValue::UnchangedToast]);
    assert_eq!(fill_unchanged_toast(&new, &old).unwrap(), old);
    // The old row itself unavailable: stays marked.
    let old = row(&[text("1"), TupleValue::UnchangedToast]);
    assert_eq!(
        fill_unchanged_toast(&new, &old).unwrap().0[1],
        TupleValue::UnchangedToast
    );
    // Nothing unchanged: no copy.
    assert!(fill_unchanged_toast(&row(&[text("1")]), &row(&[text("1")])).is_none());
}
