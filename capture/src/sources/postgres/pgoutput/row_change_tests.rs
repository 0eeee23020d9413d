//! The stream adapter's conversion of pgoutput's messages into the core's
//! stream events: rows moved (not copied) into the same table's change, the
//! old row's kind kept, a message in or outside a transaction positioned
//! as the stream loop needs, and nothing for what the core does not read.

use bytes::Bytes;

use super::{Begin, LogicalMessage, OldTuple, TypeMessage};
use crate::change::{Change, Datum, OldRow, RowChange, RowImage, StreamEvent};

fn row(v: &str) -> RowImage {
    RowImage(vec![Datum::Text(Bytes::copy_from_slice(v.as_bytes()))])
}

/// The change a message is, at position 0x20.
fn change(msg: LogicalMessage) -> Change {
    match msg.into_event(0x20) {
        StreamEvent::Change { at: 0x20, change } => change,
        other => panic!("not a change at 0x20: {other:?}"),
    }
}

#[test]
fn an_update_moves_its_rows_and_keeps_the_old_rows_kind() {
    let (old, new) = (row("a"), row("b"));
    let (old_values, new_values) = (old.0.as_ptr(), new.0.as_ptr());
    let msg = LogicalMessage::Update {
        relation_id: 7,
        old: Some(OldTuple::Full(old)),
        new,
    };
    let change = change(msg);
    match change.row_change() {
        Some(RowChange::Update {
            table: 7,
            old: Some(OldRow::Full(old)),
            new,
        }) => {
            assert!(
                std::ptr::eq(old.0.as_ptr(), old_values),
                "the old row moved"
            );
            assert!(
                std::ptr::eq(new.0.as_ptr(), new_values),
                "the new row moved"
            );
            assert_eq!((old, new), (&row("a"), &row("b")));
        }
        other => panic!("not the update: {other:?}"),
    }
    assert_eq!(change.tables(), [7]);
}

#[test]
fn inserts_deletes_and_truncates_name_their_tables() {
    let insert = change(LogicalMessage::Insert {
        relation_id: 1,
        new: row("a"),
    });
    assert!(matches!(
        insert.row_change(),
        Some(RowChange::Insert { table: 1, new }) if *new == row("a")
    ));
    let delete = change(LogicalMessage::Delete {
        relation_id: 2,
        old: OldTuple::Key(row("k")),
    });
    assert!(matches!(
        delete.row_change(),
        Some(RowChange::Delete { table: 2, old: OldRow::Key(old) }) if *old == row("k")
    ));
    let truncate = change(LogicalMessage::Truncate {
        options: 0,
        relation_ids: vec![3, 4],
    });
    assert!(matches!(
        truncate.row_change(),
        Some(RowChange::Truncate { tables: [3, 4] })
    ));
    assert_eq!(truncate.tables(), [3, 4]);
}

#[test]
fn a_message_is_a_change_in_a_transaction_and_stands_alone_outside_one() {
    let message = |transactional| LogicalMessage::Message {
        transactional,
        lsn: 0x30,
        prefix: "p".into(),
        content: Bytes::from_static(b"c"),
    };
    let inside = change(message(true));
    assert_eq!(
        inside,
        Change::Message {
            prefix: "p".into(),
            content: Bytes::from_static(b"c")
        }
    );
    assert!(inside.row_change().is_none() && inside.tables().is_empty());
    assert!(matches!(
        message(false).into_event(0x20),
        StreamEvent::Message { at: 0x30, prefix, .. } if prefix == "p"
    ));
}

#[test]
fn relations_and_types_describe_and_the_rest_says_nothing() {
    let begin = LogicalMessage::Begin(Begin {
        final_lsn: 0x10,
        commit_ts_us: 0,
        xid: 5,
    });
    assert!(matches!(begin.into_event(0x10), StreamEvent::Nothing));
    let origin = LogicalMessage::Origin {
        commit_lsn: 0x10,
        name: "o".into(),
    };
    assert!(matches!(origin.into_event(0x10), StreamEvent::Nothing));
    let mood = TypeMessage {
        oid: 90_001,
        namespace: "public".into(),
        name: "mood".into(),
    };
    let event = LogicalMessage::Type(mood.clone()).into_event(0x10);
    assert!(matches!(event, StreamEvent::Type(t) if t == mood));
}
