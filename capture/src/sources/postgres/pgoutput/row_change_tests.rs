//! The stream adapter's conversion of pgoutput's row messages into the
//! core's `RowChange`: same table, same rows (borrowed, not copied), the
//! old row's kind kept, and no row change for any other message.

use bytes::Bytes;

use super::{Begin, LogicalMessage, OldTuple};
use crate::change::{Datum, OldRow, RowChange, RowImage};

fn row(v: &str) -> RowImage {
    RowImage(vec![Datum::Text(Bytes::copy_from_slice(v.as_bytes()))])
}

#[test]
fn an_update_borrows_its_rows_and_keeps_the_old_rows_kind() {
    let msg = LogicalMessage::Update {
        relation_id: 7,
        old: Some(OldTuple::Full(row("a"))),
        new: row("b"),
    };
    let LogicalMessage::Update {
        old: Some(OldTuple::Full(old_row)),
        new: new_row,
        ..
    } = &msg
    else {
        unreachable!("built above")
    };
    match msg.row_change() {
        Some(RowChange::Update {
            table: 7,
            old: Some(OldRow::Full(old)),
            new,
        }) => {
            assert!(std::ptr::eq(old, old_row), "the old row is borrowed");
            assert!(std::ptr::eq(new, new_row), "the new row is borrowed");
        }
        other => panic!("not the update: {other:?}"),
    }
}

#[test]
fn inserts_deletes_and_truncates_name_their_tables() {
    let insert = LogicalMessage::Insert {
        relation_id: 1,
        new: row("a"),
    };
    assert!(matches!(
        insert.row_change(),
        Some(RowChange::Insert { table: 1, new }) if *new == row("a")
    ));
    let delete = LogicalMessage::Delete {
        relation_id: 2,
        old: OldTuple::Key(row("k")),
    };
    assert!(matches!(
        delete.row_change(),
        Some(RowChange::Delete { table: 2, old: OldRow::Key(old) }) if *old == row("k")
    ));
    let truncate = LogicalMessage::Truncate {
        options: 0,
        relation_ids: vec![3, 4],
    };
    assert!(matches!(
        truncate.row_change(),
        Some(RowChange::Truncate { tables: [3, 4] })
    ));
}

#[test]
fn other_messages_change_no_rows() {
    let begin = LogicalMessage::Begin(Begin {
        final_lsn: 0x10,
        commit_ts_us: 0,
        xid: 5,
    });
    assert!(begin.row_change().is_none());
}
