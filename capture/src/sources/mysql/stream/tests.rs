use std::sync::Arc;

use mysql_async::consts::ColumnType;

use super::*;
use crate::change::{Datum, RowImage};
use crate::sources::mysql::cell::Cell;
use crate::sources::mysql::shape::ColumnShape;
use crate::sources::mysql::ShapeFacts;

fn shape(columns: &[&str]) -> Arc<TableShape> {
    Arc::new(TableShape {
        database: "inventory".into(),
        table: "items".into(),
        columns: columns
            .iter()
            .map(|c| ColumnShape::new(c, ColumnType::MYSQL_TYPE_LONG))
            .collect(),
        primary_key: vec![0],
        identity: None,
    })
}

fn at(file: &str, pos: u64, event: u64, row: u64) -> Position {
    Position {
        event,
        row,
        ..Position::at(file, pos)
    }
}

fn row(
    table: &Arc<TableShape>,
    kind: ChangeKind,
    position: Position,
    event_pos: u64,
    before: Option<Vec<Cell>>,
    after: Option<Vec<Cell>>,
) -> BinlogChange {
    BinlogChange::Row(RowChange {
        table: Arc::clone(table),
        kind,
        before,
        after,
        position,
        gtid: Some("0-1-7".into()),
        ts_ms: 1_700_000_000_000,
        event_pos,
        server_id: 1,
        thread: None,
        query: None,
    })
}

fn ints(values: &[i64]) -> Option<Vec<Cell>> {
    Some(values.iter().map(|v| Cell::Int(*v)).collect())
}

fn text(values: &[&str]) -> RowImage {
    RowImage(
        values
            .iter()
            .map(|v| Datum::Text(bytes::Bytes::copy_from_slice(v.as_bytes())))
            .collect(),
    )
}

fn adapter() -> StreamAdapter {
    let server = crate::sources::mysql::ServerIdentity { id: 1, uuid: None };
    let book = PositionBook::new(
        server,
        &Position::at("b.000001", 4),
        crate::sources::mysql::ShapeFacts::default(),
    )
    .expect("book");
    StreamAdapter::new(MappingConfig::default(), book)
}

fn run(changes: Vec<BinlogChange>) -> Vec<MySqlEvent> {
    let mut adapter = adapter();
    for change in changes {
        adapter.push(change).expect("moved");
    }
    std::iter::from_fn(|| adapter.next()).collect()
}

const KEY_4: u64 = 4 << 32;

#[test]
fn a_transaction_is_begin_table_changes_commit_at_its_start_key() {
    let t = shape(&["id", "qty"]);
    let events = run(vec![
        row(
            &t,
            ChangeKind::Insert,
            at("mariadb-bin.000004", 300, 2, 1),
            400,
            None,
            ints(&[1, 5]),
        ),
        row(
            &t,
            ChangeKind::Update,
            at("mariadb-bin.000004", 300, 3, 1),
            500,
            ints(&[1, 5]),
            ints(&[1, 6]),
        ),
        row(
            &t,
            ChangeKind::Delete,
            at("mariadb-bin.000004", 300, 4, 1),
            600,
            ints(&[1, 6]),
            None,
        ),
        BinlogChange::Commit {
            position: Position::at("mariadb-bin.000004", 700),
            xid: Some(9),
        },
    ]);
    assert_eq!(events.len(), 6, "{events:?}");
    match &events[0] {
        StreamEvent::Begin {
            commit,
            xid,
            commit_ts_us,
        } => {
            assert_eq!(*commit, KEY_4 | 300);
            assert_eq!(*xid, 1);
            assert_eq!(*commit_ts_us, 1_700_000_000_000_000 - CORE_EPOCH_OFFSET_US);
        }
        other => panic!("{other:?}"),
    }
    let StreamEvent::Table(table) = &events[1] else {
        panic!("{:?}", events[1]);
    };
    assert_eq!(
        (table.namespace(), table.name(), table.width()),
        ("inventory", "items", 2)
    );
    assert_eq!(table.column_name(1), "qty");
    match &events[2] {
        StreamEvent::Change {
            at,
            change: Change::Insert { table: id, new },
        } => {
            assert_eq!(*at, KEY_4 | 400);
            assert_eq!(*id, table.id);
            assert_eq!(new, &text(&["1", "5"]));
        }
        other => panic!("{other:?}"),
    }
    match &events[3] {
        StreamEvent::Change {
            at,
            change:
                Change::Update {
                    old: Some(OldImage::Full(old)),
                    new,
                    ..
                },
        } => {
            assert_eq!(*at, KEY_4 | 500);
            assert_eq!((old, new), (&text(&["1", "5"]), &text(&["1", "6"])));
        }
        other => panic!("{other:?}"),
    }
    match &events[4] {
        StreamEvent::Change {
            change:
                Change::Delete {
                    old: OldImage::Full(old),
                    ..
                },
            ..
        } => {
            assert_eq!(old, &text(&["1", "6"]));
        }
        other => panic!("{other:?}"),
    }
    match &events[5] {
        StreamEvent::Commit { commit, end } => {
            assert_eq!((*commit, *end), (KEY_4 | 300, KEY_4 | 700))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_table_is_described_again_only_when_its_shape_changes() {
    let t = shape(&["id", "qty"]);
    let same = shape(&["id", "qty"]);
    let wider = shape(&["id", "qty", "price"]);
    let events = run(vec![
        row(
            &t,
            ChangeKind::Insert,
            at("b.000001", 4, 2, 1),
            10,
            None,
            ints(&[1, 5]),
        ),
        BinlogChange::Commit {
            position: Position::at("b.000001", 50),
            xid: None,
        },
        row(
            &same,
            ChangeKind::Insert,
            at("b.000001", 50, 2, 1),
            60,
            None,
            ints(&[2, 5]),
        ),
        BinlogChange::Commit {
            position: Position::at("b.000001", 90),
            xid: None,
        },
        row(
            &wider,
            ChangeKind::Insert,
            at("b.000001", 90, 2, 1),
            100,
            None,
            ints(&[3, 5, 7]),
        ),
        BinlogChange::Commit {
            position: Position::at("b.000001", 150),
            xid: None,
        },
    ]);
    let tables: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Table(t) => Some((t.id, t.width())),
            _ => None,
        })
        .collect();
    assert_eq!(tables, vec![(1, 2), (1, 3)], "same id, described twice");
    let xids: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Begin { xid, .. } => Some(*xid),
            _ => None,
        })
        .collect();
    assert_eq!(xids, vec![1, 2, 3]);
}

#[test]
fn a_transaction_without_rows_and_ddl_only_move_the_position() {
    let events = run(vec![
        BinlogChange::Ddl {
            database: "inventory".into(),
            query: "ALTER TABLE items ADD price INT".into(),
            position: at("b.000002", 4, 0, 1),
            gtid: None,
        },
        BinlogChange::Commit {
            position: Position::at("b.000002", 120),
            xid: None,
        },
    ]);
    match events.as_slice() {
        [StreamEvent::KeepAlive { position }] => assert_eq!(*position, (2 << 32) | 120),
        other => panic!("{other:?}"),
    }
}

#[test]
fn order_keys_grow_across_a_rotation() {
    let t = shape(&["id"]);
    let events = run(vec![
        row(
            &t,
            ChangeKind::Insert,
            at("b.000001", 900, 2, 1),
            950,
            None,
            ints(&[1]),
        ),
        BinlogChange::Commit {
            position: Position::at("b.000002", 4),
            xid: None,
        },
        row(
            &t,
            ChangeKind::Insert,
            at("b.000002", 4, 2, 1),
            40,
            None,
            ints(&[2]),
        ),
    ]);
    let keys: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Begin { commit, .. } => Some(*commit),
            StreamEvent::Commit { end, .. } => Some(*end),
            StreamEvent::Change { at, .. } => Some(*at),
            _ => None,
        })
        .collect();
    // A commit's end is the next transaction's start: equal, never less.
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
    assert!(keys[0] < keys[keys.len() - 1], "{keys:?}");
}

#[test]
fn a_row_change_without_its_image_is_a_protocol_error() {
    let t = shape(&["id"]);
    let mut adapter = adapter();
    let err = adapter
        .push(row(
            &t,
            ChangeKind::Delete,
            at("b.000001", 4, 2, 1),
            10,
            None,
            None,
        ))
        .expect_err("a delete needs its before image");
    assert!(err.to_string().contains("inventory.items"), "{err}");
}

fn envelope_cfg() -> crate::envelope::EnvelopeConfig {
    crate::envelope::EnvelopeConfig {
        topic_prefix: "shop".into(),
        topic_mapping: Default::default(),
        database: String::new(),
        schemas_enable: true,
        columns: Default::default(),
    }
}

/// The core's encoder of a streamed table writes, from the row images and
/// the core's position, the records the MySQL envelope (golden-tested
/// against Debezium) writes from the decoded change itself.
#[test]
fn the_core_encoder_writes_the_envelopes_records() {
    use crate::envelope::{Op, SnapshotMarker, SourcePosition};
    use crate::sources::mysql::envelope::{MySqlSource, MySqlTableEncoder};

    let t = shape(&["id", "qty"]);
    let mut change = match row(
        &t,
        ChangeKind::Update,
        at("mariadb-bin.000004", 300, 3, 2),
        500,
        ints(&[1, 5]),
        ints(&[1, 6]),
    ) {
        BinlogChange::Row(r) => r,
        _ => unreachable!(),
    };
    change.thread = Some(42);
    // include.query: the block writes the change's own statement.
    change.query = Some(Arc::from("UPDATE items SET qty = 6 WHERE id = 1"));
    let mut adapter = adapter();
    adapter
        .push(BinlogChange::Row(change.clone()))
        .expect("moved");
    // A second change moved, not handed out yet, must not be the facts.
    let mut later = change.clone();
    later.gtid = Some("0-1-8".into());
    later.position.row = 3;
    later.query = Some(Arc::from("UPDATE items SET qty = 7"));
    adapter.push(BinlogChange::Row(later)).expect("moved");
    let events: Vec<_> = std::iter::from_fn(|| adapter.next()).take(3).collect();
    let (
        StreamEvent::Table(table),
        StreamEvent::Change {
            at,
            change:
                Change::Update {
                    old: Some(old),
                    new,
                    ..
                },
        },
    ) = (&events[1], &events[2])
    else {
        panic!("{events:?}");
    };
    let enc = table
        .encoder(&(), None, &envelope_cfg(), None)
        .expect("encoder");
    let src = SourcePosition {
        tx_id: 1,
        lsn: *at,
        commit_lsn: KEY_4 | 300,
        event_seq: 2,
        commit_ts_ms: change.ts_ms,
        snapshot: SnapshotMarker::False,
    };
    let value = enc
        .value(Op::Update, Some(old.row()), Some(new), &src, 77)
        .expect("value");
    let key = enc.key(new).expect("key");

    let expected =
        MySqlTableEncoder::new(Arc::clone(&t), MappingConfig::default(), &envelope_cfg())
            .expect("envelope")
            .change_record(
                &change,
                &MySqlSource::of_change(&change, change.query.as_deref()),
                77,
            )
            .expect("record");
    assert_eq!(enc.topic(), "shop.inventory.items");
    let written: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        written["payload"]["source"]["query"],
        "UPDATE items SET qty = 6 WHERE id = 1"
    );
    assert_eq!(Some(key), expected.key);
    assert_eq!(
        String::from_utf8(value).unwrap(),
        String::from_utf8(expected.value).unwrap()
    );
}

#[test]
fn a_table_tells_the_router_its_key_and_refuses_an_encoder_without_one() {
    let t = shape(&["id", "qty"]);
    let events = run(vec![row(
        &t,
        ChangeKind::Insert,
        at("b.000001", 4, 2, 1),
        10,
        None,
        ints(&[1, 5]),
    )]);
    let StreamEvent::Table(mut table) = events.into_iter().nth(1).expect("table") else {
        panic!("no table event");
    };
    assert_eq!(table.stream_key(), ["id"]);
    assert_eq!(
        table.identity_lacks("inventory.items", &["qty".into()]),
        None
    );
    let by_qty = table
        .encoder(&(), Some(&["qty".into()]), &envelope_cfg(), None)
        .expect("message.key.columns");
    assert_eq!(by_qty.key_column_names().collect::<Vec<_>>(), ["qty"]);
    let unknown = table.encoder(&(), Some(&["nope".into()]), &envelope_cfg(), None);
    assert!(unknown.is_err());
    table.publish_as("inventory".into(), "renamed".into());
    assert_eq!(table.name(), "renamed");
    let mut keyless = (*t).clone();
    keyless.primary_key.clear();
    table.shape = Arc::new(keyless);
    table.images = MySqlRowImages::new(Arc::clone(&table.shape), MappingConfig::default());
    assert!(table.stream_key().is_empty());
    let err = table
        .encoder(&(), None, &envelope_cfg(), None)
        .expect_err("no key");
    assert!(err.to_string().contains("inventory.items"), "{err}");
    assert!(MySqlTable::keyless_reason("inventory.items").contains("message.key.columns"));
}

#[test]
fn the_book_names_the_positions_the_stream_moved() {
    use crate::offset::SourceOffset;
    use crate::sources::mysql::MySqlOffset;

    let t = shape(&["id"]);
    let mut adapter = adapter();
    for change in [
        row(
            &t,
            ChangeKind::Insert,
            at("b.000004", 300, 2, 1),
            400,
            None,
            ints(&[1]),
        ),
        row(
            &t,
            ChangeKind::Insert,
            at("b.000004", 300, 2, 2),
            400,
            None,
            ints(&[2]),
        ),
    ] {
        adapter.push(change).expect("moved");
    }
    let partial = SourceOffset {
        commit_lsn: KEY_4 | 300,
        events: 2,
        complete: false,
        ..SourceOffset::start(4)
    };
    let mut stored = partial.clone();
    stored.source = Some(adapter.book().part(&partial).expect("part"));
    let read = MySqlOffset::read(&stored).expect("agrees");
    assert_eq!(read.position, at("b.000004", 300, 2, 2));

    adapter
        .push(BinlogChange::Commit {
            position: Position::at("b.000004", 700),
            xid: None,
        })
        .expect("moved");
    let complete = SourceOffset {
        complete: true,
        ..SourceOffset::start(KEY_4 | 700)
    };
    let mut stored = complete.clone();
    stored.source = Some(adapter.book().part(&complete).expect("part"));
    assert_eq!(
        MySqlOffset::read(&stored).expect("agrees").position,
        Position::at("b.000004", 700)
    );
}

/// A value the mapping refuses reaches the core's encoder raw, which
/// refuses the change (a dead letter) with the envelope's help, instead
/// of the stream failing.
#[test]
fn a_refused_value_is_the_encoders_refusal_not_the_streams() {
    use crate::envelope::{EnvelopeError, Op, SnapshotMarker, SourcePosition};

    let mut dec = ColumnShape::new("price", ColumnType::MYSQL_TYPE_NEWDECIMAL);
    dec.meta = vec![10, 2];
    let mut big = ColumnShape::new("big", ColumnType::MYSQL_TYPE_LONGLONG);
    big.unsigned = true;
    let t = Arc::new(TableShape {
        database: "inventory".into(),
        table: "items".into(),
        columns: vec![
            ColumnShape::new("id", ColumnType::MYSQL_TYPE_LONG),
            big,
            dec,
        ],
        primary_key: vec![0],
        identity: None,
    });
    let src = SourcePosition {
        tx_id: 1,
        lsn: KEY_4 | 10,
        commit_lsn: KEY_4 | 4,
        event_seq: 1,
        commit_ts_ms: 0,
        snapshot: SnapshotMarker::False,
    };
    let cases = [
        (
            Cell::UInt(u64::MAX),
            Cell::Decimal("1.50".into()),
            "bigint.unsigned.handling.mode = \"precise\"",
        ),
        (
            Cell::UInt(7),
            Cell::Decimal("not a number".into()),
            "decimal.handling.mode = \"string\"",
        ),
    ];
    for (big, price, fix) in cases {
        let events = run(vec![row(
            &t,
            ChangeKind::Insert,
            at("b.000004", 4, 2, 1),
            10,
            None,
            Some(vec![Cell::Int(1), big, price]),
        )]);
        let (
            StreamEvent::Table(table),
            StreamEvent::Change {
                change: Change::Insert { new, .. },
                ..
            },
        ) = (&events[1], &events[2])
        else {
            panic!("{events:?}");
        };
        let enc = table
            .encoder(&(), None, &envelope_cfg(), None)
            .expect("encoder");
        let err = enc
            .value(Op::Create, None, Some(new), &src, 0)
            .expect_err("refused");
        assert!(err.is_unrepresentable(), "{err}");
        assert!(err.to_string().contains(fix), "{err}");
        let EnvelopeError::Unrepresentable { value, .. } = err else {
            unreachable!()
        };
        assert!(!value.is_empty());
    }
    // In range, the same columns encode.
    let events = run(vec![row(
        &t,
        ChangeKind::Insert,
        at("b.000004", 4, 2, 1),
        10,
        None,
        Some(vec![
            Cell::Int(1),
            Cell::UInt(7),
            Cell::Decimal("1.50".into()),
        ]),
    )]);
    let (
        StreamEvent::Table(table),
        StreamEvent::Change {
            change: Change::Insert { new, .. },
            ..
        },
    ) = (&events[1], &events[2])
    else {
        panic!("{events:?}");
    };
    let enc = table
        .encoder(&(), None, &envelope_cfg(), None)
        .expect("encoder");
    let value = enc
        .value(Op::Create, None, Some(new), &src, 0)
        .expect("encoded");
    let text = String::from_utf8(value).unwrap();
    assert!(
        text.contains("\"big\":7") && text.contains("\"price\":\"AJY=\""),
        "{text}"
    );
}

/// The failover rule (`offset.rs`): after a takeover by GTIDs, the new
/// server's first transaction keeps the stored key (so the core skips what
/// of it was published), positions before it are not handed out (their
/// keys would pass over it), and from its commit on every key is of the
/// next epoch, above every key of the old server. Records naming the
/// stored key still name the old server's position.
#[test]
fn a_takeover_keeps_the_stored_key_for_its_first_transaction() {
    use crate::offset::SourceOffset;
    use crate::sources::mysql::{MySqlOffset, ServerIdentity, ShapeFacts};

    let old = ServerIdentity { id: 1, uuid: None };
    let new = ServerIdentity { id: 2, uuid: None };
    let stored = at("old-bin.000900", 5000, 0, 0);
    let stored_key = key(&stored).unwrap();
    let book = PositionBook::taking_over(new.clone(), old.clone(), &stored, ShapeFacts::default())
        .unwrap();
    let mut adapter = StreamAdapter::new(MappingConfig::default(), book).adopting(stored_key);
    let epoch1 = |file: &str, pos, event, row| Position {
        epoch: 1,
        ..at(file, pos, event, row)
    };
    let t = shape(&["id"]);
    for change in [
        // The dump's file header: a position of the new server, dropped.
        BinlogChange::Commit {
            position: epoch1("new-bin.000001", 300, 0, 0),
            xid: None,
        },
        row(
            &t,
            ChangeKind::Insert,
            epoch1("new-bin.000001", 300, 2, 1),
            400,
            None,
            ints(&[1]),
        ),
        row(
            &t,
            ChangeKind::Insert,
            epoch1("new-bin.000001", 300, 2, 2),
            400,
            None,
            ints(&[2]),
        ),
    ] {
        adapter.push(change).expect("moved");
    }
    let partial = SourceOffset {
        commit_lsn: stored_key,
        events: 2,
        complete: false,
        ..SourceOffset::start(4)
    };
    let mut record = partial.clone();
    record.source = Some(adapter.book().part(&partial).expect("part"));
    let read = MySqlOffset::read(&record).expect("agrees");
    assert_eq!(read.server, old, "a restart now takes over again");
    assert_eq!(read.resume_from(), stored);
    adapter
        .push(BinlogChange::Commit {
            position: epoch1("new-bin.000001", 700, 0, 0),
            xid: Some(1),
        })
        .expect("moved");
    let events: Vec<MySqlEvent> = std::iter::from_fn(|| adapter.next()).collect();
    let keys: Vec<(char, u64)> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Begin { commit, .. } => Some(('b', *commit)),
            StreamEvent::Commit { commit, end } => {
                assert_eq!(*commit, stored_key);
                Some(('e', *end))
            }
            StreamEvent::KeepAlive { position } => Some(('k', *position)),
            StreamEvent::Change { at, .. } => Some(('c', *at)),
            _ => None,
        })
        .collect();
    let next = key(&epoch1("new-bin.000001", 700, 0, 0)).unwrap();
    let row_at = key(&epoch1("new-bin.000001", 400, 0, 0)).unwrap();
    assert_eq!(
        keys,
        vec![('b', stored_key), ('c', row_at), ('c', row_at), ('e', next)]
    );
    assert!(next > stored_key && row_at > stored_key);
    let complete = SourceOffset {
        complete: true,
        ..SourceOffset::start(next)
    };
    let mut record = complete.clone();
    record.source = Some(adapter.book().part(&complete).expect("part"));
    let read = MySqlOffset::read(&record).expect("agrees");
    assert_eq!(read.server, new);
    assert_eq!(read.position, epoch1("new-bin.000001", 700, 0, 0));
}

/// A chunk's rows go out when its watermark is handed out, numbered by
/// the shape facts then: a DDL's facts count from its commit's event on,
/// never for a watermark handed out before it.
#[test]
fn chunks_are_numbered_by_a_commits_facts_once_its_event_is_handed_out() {
    let mut adapter = adapter();
    let numbering = adapter.numbering();
    let mut before = ShapeFacts::default();
    before.apply_ddl(
        "inventory",
        "CREATE TABLE items (id int PRIMARY KEY, `old name` int)",
    );
    *numbering.lock().unwrap() = Arc::new(before.clone());
    let query = "ALTER TABLE items RENAME COLUMN `old name` TO `new name`";
    let mut after = before.clone();
    after.apply_ddl("inventory", query);
    adapter
        .push(BinlogChange::Ddl {
            database: "inventory".into(),
            query: query.into(),
            position: at("mariadb-bin.000004", 700, 1, 0),
            gtid: None,
        })
        .expect("moved");
    adapter
        .push_with_facts(
            BinlogChange::Commit {
                position: at("mariadb-bin.000004", 900, 0, 0),
                xid: None,
            },
            Some(Arc::new(after.clone())),
        )
        .expect("moved");
    assert_eq!(
        **numbering.lock().unwrap(),
        before,
        "the commit is not handed out yet: a watermark now stands before the DDL"
    );
    assert!(matches!(
        adapter.next(),
        Some(StreamEvent::KeepAlive { position }) if position == (4 << 32 | 900)
    ));
    assert_eq!(**numbering.lock().unwrap(), after);
    let ids = after.ids("inventory", "items").expect("numbered");
    assert_eq!(
        ids.identity(["id", "new name"].into_iter()).attnums,
        vec![Some(1), Some(2)]
    );
}
