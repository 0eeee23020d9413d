use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::offset::Replay;
use crate::sources::mysql::history::TableFacts;
use crate::sources::mysql::position::{Gtids, MariaGtid, MariaGtidList, MySqlGtidSet};

const MARIADB: ServerIdentity = ServerIdentity { id: 1, uuid: None };

fn pos(file: &str, at: u64, event: u64, row: u64) -> Position {
    Position {
        event,
        row,
        ..Position::at(file, at)
    }
}

fn key(p: &Position) -> u64 {
    order_key(p).unwrap()
}

/// The core's fields for a part at `p`: inside a transaction the order
/// key is its commit key, else the flush key (`earlier`: the transaction
/// before, complete).
fn core_for(p: &Position, earlier: u64, events: u64) -> SourceOffset {
    if p.event > 0 || p.row > 0 {
        SourceOffset {
            commit_lsn: key(p),
            events,
            complete: false,
            ..SourceOffset::start(earlier)
        }
    } else {
        SourceOffset {
            commit_lsn: earlier,
            events,
            ..SourceOffset::start(key(p))
        }
    }
}

fn facts(tables: &[(&str, &str, &[&str], &[&str])]) -> ShapeFacts {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    tables
        .iter()
        .map(|(db, t, tiny, json)| TableFacts {
            database: db.to_string(),
            table: t.to_string(),
            tinyint1: names(tiny),
            json: names(json),
            ids: None,
        })
        .collect::<Vec<_>>()
        .into()
}

#[test]
fn the_key_grows_across_a_rotation_and_is_the_transaction_s() {
    let before = pos("binlog.000003", 900, 0, 0);
    let after = pos("binlog.000004", 4, 0, 0);
    assert_eq!(key(&before), (3 << 32) | 900);
    assert!(key(&before) < key(&after));
    // A file past six digits (MySQL keeps counting) still sorts after.
    assert!(key(&pos("binlog.999999", 4, 0, 0)) < key(&pos("binlog.1000000", 4, 0, 0)));
    // Changes inside one transaction share its key; the core's `events`
    // tells them apart.
    assert_eq!(key(&pos("binlog.000003", 900, 7, 2)), key(&before));
}

#[test]
fn positions_the_key_cannot_hold_are_refused_not_wrapped() {
    let e = order_key(&Position::at("binlog.000003", 1 << 32)).unwrap_err();
    assert!(
        matches!(e, MySqlSourceError::PositionOutOfRange { pos, .. } if pos == 1 << 32),
        "{e}"
    );
    assert!(e.to_string().contains("max_binlog_cache_size"), "{e}");
    assert!(order_key(&Position::at("binlog.4294967296", 4)).is_err());
    assert!(order_key(&Position::at("binlog.8388608", 4)).is_err());
    assert!(order_key(&Position::at("binlog.8388607", u64::from(u32::MAX))).is_ok());
}

/// The core's replay decisions on MySQL keys: a partly published
/// transaction resumes after its published changes, one after it (also in
/// the next binlog file) is new, one before it was published.
#[test]
fn the_core_s_replay_rule_works_on_mysql_keys() {
    let tx = pos("binlog.000003", 900, 4, 2);
    let stored = core_for(&tx, key(&pos("binlog.000003", 500, 0, 0)), 5);
    assert_eq!(stored.replay(key(&tx)), Replay::SkipFirst(5));
    assert_eq!(
        stored.replay(key(&pos("binlog.000004", 4, 0, 0))),
        Replay::PublishAll
    );
    assert_eq!(
        stored.replay(key(&pos("binlog.000003", 120, 0, 0))),
        Replay::SkipAll
    );
    // After its commit, the flush key is the next transaction's start.
    let next = pos("binlog.000004", 4, 0, 0);
    let done = SourceOffset {
        commit_lsn: key(&tx),
        events: 9,
        ..SourceOffset::start(key(&next))
    };
    assert_eq!(done.replay(key(&tx)), Replay::SkipAll);
    assert_eq!(done.replay(key(&next)), Replay::PublishAll);
}

/// The stored form, field by field: what `oncely status` and an operator
/// read in the offsets topic.
#[test]
fn a_record_s_stored_form() {
    let mut p = pos("binlog.000002", 385, 3, 1);
    p.gtids = Some("0-1-42".parse().unwrap());
    let mut part = MySqlOffset::new(
        p.clone(),
        MARIADB,
        &facts(&[("shop", "orders", &["flag"], &["doc"])]),
        |_, _| true,
    );
    part.snapshot.insert(
        "shop.orders".into(),
        vec![Cell::Int(42), Cell::Bytes(b"eu".to_vec())],
    );
    let mut offset = core_for(&p, 0, 4);
    part.store(&mut offset).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&offset.to_bytes()).unwrap(),
        json!({
            "commit_lsn": (2u64 << 32) | 385, "events": 4, "complete": false, "flush_lsn": 0,
            "tx_id": 0, "ts_ms": 0,
            "source": {"mysql": {
                "position": {"file": "binlog.000002", "pos": 385, "gtids": "0-1-42", "event": 3, "row": 1},
                "server": {"id": 1},
                "facts": [{"database": "shop", "table": "orders", "tinyint1": ["flag"], "json": ["doc"]}],
                "snapshot": {"shop.orders": [{"Int": 42}, {"Bytes": [101, 117]}]}
            }}
        })
    );
    // The reader opens at the transaction's start; the core skips its
    // first 4 changes.
    assert_eq!(
        part.resume_from(),
        Position {
            event: 0,
            row: 0,
            ..p
        }
    );
}

/// Only the captured tables' facts are stored: the record is read at
/// every start and written with every Kafka transaction.
#[test]
fn only_captured_tables_facts_are_stored() {
    let all = facts(&[
        ("shop", "orders", &["flag"], &[]),
        ("shop", "plain", &[], &[]),
        ("scratch", "tmp", &["b"], &["j"]),
    ]);
    let part = MySqlOffset::new(Position::at("binlog.000001", 4), MARIADB, &all, |db, _| {
        db == "shop"
    });
    assert!(part.facts.knows("shop", "orders"));
    // Known without facts is kept: it is not the same as unknown (which
    // reads the catalog as it is now).
    assert!(part.facts.knows("shop", "plain"));
    assert!(!part.facts.knows("scratch", "tmp"));
}

#[test]
fn a_record_of_another_source_or_position_is_refused() {
    let golden = std::fs::read(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/offsets/postgres.json"),
    )
    .unwrap();
    let pg: SourceOffset = serde_json::from_slice(&golden).unwrap();
    let e = MySqlOffset::read(&pg).unwrap_err();
    assert!(e.to_string().contains("no MySQL part"), "{e}");

    let mut other = pg.clone();
    other.source = Some(SourcePart::new(json!({"postgres": {"lsn": 1}})));
    let e = MySqlOffset::read(&other).unwrap_err();
    assert!(e.to_string().contains("not MySQL's"), "{e}");

    // A part whose position's key is not the record's.
    let p = pos("binlog.000003", 900, 2, 1);
    let part = MySqlOffset::new(p.clone(), MARIADB, &ShapeFacts::default(), |_, _| true);
    let mut offset = core_for(&p, 0, 2);
    part.store(&mut offset).unwrap();
    assert_eq!(MySqlOffset::read(&offset).unwrap(), part);
    let mut moved = offset.clone();
    moved.commit_lsn += 1;
    let e = MySqlOffset::read(&moved).unwrap_err();
    assert!(e.to_string().contains("binlog.000003:900"), "{e}");
    let mut complete = offset.clone();
    complete.complete = true;
    assert!(MySqlOffset::read(&complete).is_err());
    assert!(part.store(&mut moved).is_err());
}

fn server(identity: ServerIdentity) -> ServerFacts {
    ServerFacts {
        flavor: crate::sources::mysql::Flavor::MariaDb,
        version: "10.11.19-MariaDB".into(),
        log_bin: true,
        binlog_format: "ROW".into(),
        binlog_row_image: "FULL".into(),
        binlog_row_metadata: Some("FULL".into()),
        user: "oncely@%".into(),
        privileges: vec![
            "SELECT".into(),
            "REPLICATION SLAVE".into(),
            "BINLOG MONITOR".into(),
        ],
        binlogs: vec![("binlog.000003".into(), 900), ("binlog.000004".into(), 120)],
        server: identity,
    }
}

/// After a failover the new primary may well have a file of the stored
/// name, holding other transactions: the server's identity tells.
#[test]
fn another_server_s_position_is_refused_naming_the_fix() {
    let part = MySqlOffset::new(
        pos("binlog.000004", 120, 0, 0),
        MARIADB,
        &ShapeFacts::default(),
        |_, _| true,
    );
    assert_eq!(part.check(&server(MARIADB), None).unwrap(), Resume::Same);
    // Without stored GTIDs (a server with GTIDs off) nothing tells which
    // of the other server's transactions Kafka holds.
    let e = part
        .check(
            &server(ServerIdentity { id: 2, uuid: None }),
            Some(&"0-1-99".parse().unwrap()),
        )
        .unwrap_err();
    assert!(matches!(e, MySqlSourceError::OtherServer { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("binlog of server_id 1") && text.contains("this server is server_id 2"),
        "{text}"
    );
    assert!(
        text.contains("database.hostname") && text.contains("new snapshot"),
        "{text}"
    );
    assert!(!e.is_retriable());
    // MySQL: the same server_id on another machine, told by its UUID.
    let a = ServerIdentity {
        id: 1,
        uuid: Some("3e11fa47-71ca-11e1-9e33-c80aa9429562".into()),
    };
    let b = ServerIdentity {
        uuid: Some("3e11fa47-71ca-11e1-9e33-c80aa9429563".into()),
        ..a.clone()
    };
    let mysql = MySqlOffset {
        server: a,
        ..part.clone()
    };
    assert!(mysql.check(&server(b), None).is_err());
    // The same server: its own checks still run (a purged binlog).
    let purged = MySqlOffset {
        position: Position::at("binlog.000002", 4),
        ..part
    };
    assert!(matches!(
        purged.check(&server(MARIADB), None),
        Err(MySqlSourceError::PositionPurged { .. })
    ));
}

/// The failover rule: another server holding every stored GTID (a
/// promoted replica) is taken over by GTIDs; one behind, or of the other
/// GTID style, is refused naming why and the fix; an empty stored set is
/// the refusal without GTIDs.
#[test]
fn another_server_holding_the_stored_gtids_is_taken_over() {
    let mut p = pos("binlog.000004", 120, 2, 1);
    p.gtids = Some("0-1-42,1-3-7".parse().unwrap());
    let part = MySqlOffset::new(p, MARIADB, &ShapeFacts::default(), |_, _| true);
    let replica = server(ServerIdentity { id: 2, uuid: None });
    let caught_up: Gtids = "0-1-50,1-3-7,2-2-1".parse().unwrap();
    assert_eq!(
        part.check(&replica, Some(&caught_up)).unwrap(),
        Resume::Failover
    );
    // Its files are not looked at (they are the new primary's own).
    let mut other_files = replica.clone();
    other_files.binlogs = vec![("mariadb-bin.000001".into(), 400)];
    assert_eq!(
        part.check(&other_files, Some(&caught_up)).unwrap(),
        Resume::Failover
    );
    let behind: Gtids = "0-1-41,1-3-7".parse().unwrap();
    let e = part.check(&replica, Some(&behind)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, MySqlSourceError::FailoverBehind { .. }), "{e}");
    assert!(
        text.contains("0-1-41,1-3-7")
            && text.contains("0-1-42,1-3-7")
            && text.contains("caught up")
            && text.contains("database.hostname"),
        "{text}"
    );
    let missing_domain: Gtids = "0-1-50".parse().unwrap();
    assert!(part.check(&replica, Some(&missing_domain)).is_err());
    assert!(matches!(
        part.check(&replica, None),
        Err(MySqlSourceError::OtherServer { .. })
    ));
    // Settings are still checked on the new server.
    let mut unset = replica.clone();
    unset.binlog_format = "MIXED".into();
    assert!(matches!(
        part.check(&unset, Some(&caught_up)),
        Err(MySqlSourceError::Prerequisite { .. })
    ));
    // The epoch is bounded: past 255 failovers the key cannot hold it.
    let mut last = part.clone();
    last.position.epoch = MAX_EPOCH;
    assert!(matches!(
        last.check(&replica, Some(&caught_up)),
        Err(MySqlSourceError::PositionOutOfRange { .. })
    ));
}

/// MySQL-only (no MySQL server here): uuid sets, contained or not, and
/// never a MariaDB list for a MySQL set.
#[test]
fn mysql_gtid_sets_decide_a_takeover_too() {
    let a = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    let b = "3e11fa47-71ca-11e1-9e33-c80aa9429563";
    let mut p = pos("binlog.000004", 120, 0, 0);
    p.gtids = Some(format!("{a}:1-100,{b}:1-5").parse().unwrap());
    let mysql = |uuid: &str| ServerIdentity {
        id: 1,
        uuid: Some(uuid.into()),
    };
    let part = MySqlOffset::new(p, mysql(a), &ShapeFacts::default(), |_, _| true);
    let mut replica = server(mysql(b));
    replica.flavor = crate::sources::mysql::Flavor::MySql;
    replica.privileges = vec![
        "SELECT".into(),
        "REPLICATION SLAVE".into(),
        "REPLICATION CLIENT".into(),
    ];
    let executed: Gtids = format!("{a}:1-120,\n{b}:1-5:9").parse().unwrap();
    assert_eq!(
        part.check(&replica, Some(&executed)).unwrap(),
        Resume::Failover
    );
    let gap: Gtids = format!("{a}:1-50:52-120,{b}:1-5").parse().unwrap();
    assert!(matches!(
        part.check(&replica, Some(&gap)),
        Err(MySqlSourceError::FailoverBehind { .. })
    ));
    let maria: Gtids = "0-1-1000".parse().unwrap();
    assert!(part.check(&replica, Some(&maria)).is_err());
}

/// Keys after a failover: every key of epoch n + 1 is above every key of
/// epoch n, whatever its file; epoch 0 is the key of today's records.
#[test]
fn keys_of_the_next_epoch_are_above_every_key_before_it() {
    let mut old = pos("binlog.000900", 4_000_000, 0, 0);
    assert_eq!(key(&old), (900 << 32) | 4_000_000, "epoch 0: unchanged");
    let mut new = pos("binlog.000001", 4, 0, 0);
    new.epoch = 1;
    assert!(key(&new) > key(&old));
    assert_eq!(key(&new), (1 << 55) | (1 << 32) | 4);
    old.epoch = 1;
    assert!(key(&old) > key(&new));
    let top = Position {
        epoch: MAX_EPOCH,
        ..pos("binlog.8388607", u64::from(u32::MAX), 0, 0)
    };
    assert!(
        i64::try_from(key(&top)).is_ok(),
        "sinks keep versions as i64"
    );
    assert_eq!(key_coordinates(key(&top)), (8_388_607, u64::from(u32::MAX)));
    assert!(order_key(&pos("binlog.8388608", 4, 0, 0)).is_err());
    let over = Position {
        epoch: MAX_EPOCH + 1,
        ..pos("binlog.000001", 4, 0, 0)
    };
    assert!(order_key(&over).is_err());
    // The stored form names the epoch only once there is one.
    let v = serde_json::to_value(&new).unwrap();
    assert_eq!(v["epoch"], 1);
    assert!(serde_json::to_value(pos("b.1", 4, 0, 0))
        .unwrap()
        .get("epoch")
        .is_none());
    let read: Position = serde_json::from_value(json!({"file": "b.1", "pos": 4})).unwrap();
    assert_eq!(read.epoch, 0);
}

fn arb_history_position() -> impl Strategy<Value = Position> {
    // Small ranges too, so equal files and offsets (ties) come up.
    let seq = prop_oneof![1u64..4, 1u64..(1 << 23)];
    let at = prop_oneof![4u64..8, 4u64..(1 << 32)];
    (seq, at, 0u64..4, 0u64..4)
        .prop_map(|(s, at, event, row)| pos(&format!("mysql-bin.{s:06}"), at, event, row))
}

fn arb_cell() -> impl Strategy<Value = Cell> {
    prop_oneof![
        Just(Cell::Null),
        any::<i64>().prop_map(Cell::Int),
        any::<u64>().prop_map(Cell::UInt),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Cell::Double),
        "-?[0-9]{1,30}\\.[0-9]{0,30}".prop_map(Cell::Decimal),
        prop::collection::vec(any::<u8>(), 0..24).prop_map(Cell::Bytes),
        (0u16..10_000, 0u8..13, 0u8..32).prop_map(|(year, month, day)| Cell::Date {
            year,
            month,
            day
        }),
        any::<u16>().prop_map(Cell::Enum),
    ]
}

fn arb_facts() -> impl Strategy<Value = ShapeFacts> {
    let name = "[a-z][a-z0-9_]{0,8}";
    prop::collection::vec(
        (
            name,
            name,
            prop::collection::vec(name, 0..3),
            prop::collection::vec(name, 0..3),
        ),
        0..5,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(database, table, tinyint1, json)| TableFacts {
                database,
                table,
                tinyint1,
                json,
                ids: None,
            })
            .collect::<Vec<_>>()
            .into()
    })
}

fn arb_gtids() -> impl Strategy<Value = Option<Gtids>> {
    prop_oneof![
        Just(None),
        prop::collection::vec((0u32..4, any::<u32>(), any::<u64>()), 1..4).prop_map(|v| {
            let mut l = MariaGtidList::default();
            for (domain, server, seq) in v {
                l.advance(MariaGtid {
                    domain,
                    server,
                    seq,
                });
            }
            Some(Gtids::MariaDb(l))
        }),
        prop::collection::vec((any::<[u8; 16]>(), 1u64..1000), 1..4).prop_map(|v| {
            let mut s = MySqlGtidSet::default();
            for (uuid, n) in v {
                s.add(uuid, n);
            }
            Some(Gtids::MySql(s))
        }),
    ]
}

proptest! {
    /// Within one server's binlog, the order key with the changes
    /// published (`event`, `row`) orders exactly as `Position` does; the
    /// key alone never contradicts it.
    #[test]
    fn the_order_key_orders_like_positions(a in arb_history_position(), b in arb_history_position()) {
        let (ka, kb) = (key(&a), key(&b));
        prop_assert_eq!((ka, a.event, a.row).cmp(&(kb, b.event, b.row)), a.cmp(&b));
        if ka < kb {
            prop_assert!(a < b);
        }
        if a <= b {
            prop_assert!(ka <= kb);
        }
    }

    /// A record with a MySQL part goes to bytes and back unchanged, core
    /// fields and part.
    #[test]
    fn a_record_round_trips(
        p in arb_history_position(),
        gtids in arb_gtids(),
        uuid in prop::option::of("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
        id in any::<u32>(),
        facts in arb_facts(),
        keys in prop::collection::btree_map("[a-z]{1,6}\\.[a-z]{1,6}", prop::collection::vec(arb_cell(), 1..4), 0..3),
        events in 0u64..100,
    ) {
        let p = Position { gtids, ..p };
        let mut part = MySqlOffset::new(p.clone(), ServerIdentity { id, uuid }, &facts, |_, _| true);
        part.snapshot = keys;
        let mut offset = core_for(&p, 0, events);
        part.store(&mut offset).unwrap();
        let back: SourceOffset = serde_json::from_slice(&offset.to_bytes()).unwrap();
        prop_assert_eq!(&back, &offset);
        prop_assert_eq!(MySqlOffset::read(&back).unwrap(), part);
    }
}
