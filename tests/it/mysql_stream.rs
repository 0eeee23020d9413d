//! The MySQL source's change stream against the MariaDB of
//! `scripts/services`: the binlog as the core's events (a transaction's
//! Begin, table description, changes in order with their row images,
//! Commit at the order keys of its start and the next one's), the offset
//! record's MySQL part for a complete and a partial transaction, and a
//! stream reopened from a partial record's part handing out that
//! transaction again from its start (the core's tracker skips what was
//! published); a binlog rotation before that transaction. The server is shared with other tests, so only the test's
//! own database's events are asserted on.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::{
    EventView, MappingConfig, MySqlOffset, MySqlStream, Position, ResumeBy, ServerFacts,
    ShapeFacts, StreamStart,
};
use oncely_capture::testing::SourceOffset;

use crate::harness::common::unique;
use crate::mysql_binlog::{admin, capture_opts, server_id};

/// An event of the test's table, or a transaction boundary.
#[derive(Debug, Clone)]
struct Seen {
    event: EventView,
    /// The transaction it is in (counted by Begin), if any.
    tx: Option<usize>,
}

/// Reads until `changes` changes of table `db.items` and the commit after
/// the last were seen, or fails after 30 s. Transactions of other
/// databases are dropped.
async fn read_ours(stream: &mut MySqlStream, db: &str, changes: usize) -> Vec<Seen> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut ours = None;
    let mut tx = 0;
    let mut open: Vec<Seen> = Vec::new();
    let mut out: Vec<Seen> = Vec::new();
    loop {
        let event = tokio::time::timeout_at(deadline, stream.next_view())
            .await
            .unwrap_or_else(|_| panic!("not all changes within 30 s; got {out:#?}"))
            .expect("stream event");
        match &event {
            EventView::Begin { .. } => {
                tx += 1;
                open = vec![Seen {
                    event,
                    tx: Some(tx),
                }];
            }
            EventView::Table {
                id,
                database,
                table,
            } => {
                if database == db && table == "items" {
                    ours = Some(*id);
                }
            }
            EventView::Change { table, .. } => {
                if Some(*table) == ours {
                    open.push(Seen {
                        event,
                        tx: Some(tx),
                    });
                }
            }
            EventView::Commit { .. } => {
                if open.len() > 1 {
                    out.append(&mut open);
                    out.push(Seen {
                        event,
                        tx: Some(tx),
                    });
                }
                open.clear();
                let seen = out
                    .iter()
                    .filter(|s| matches!(s.event, EventView::Change { .. }))
                    .count();
                if seen >= changes {
                    return out;
                }
            }
            EventView::KeepAlive { .. } | EventView::Watermark { .. } => {}
        }
    }
}

fn row(values: &[&str]) -> Image {
    Some(values.iter().map(|v| Some(v.to_string())).collect())
}

/// A row image as text (`None`: NULL).
type Image = Option<Vec<Option<String>>>;

/// `(op, before, after)` of each change seen, in order.
fn ops(seen: &[Seen]) -> Vec<(char, Image, Image)> {
    seen.iter()
        .filter_map(|s| match &s.event {
            EventView::Change {
                op, before, after, ..
            } => Some((*op, before.clone(), after.clone())),
            _ => None,
        })
        .collect()
}

async fn open(start: &StreamStart, from: Position, facts: ShapeFacts) -> MySqlStream {
    MySqlStream::open(StreamStart {
        from,
        facts,
        ..start.clone()
    })
    .await
    .expect("open the stream")
}

#[tokio::test]
async fn the_binlog_streams_as_core_events_with_offset_parts_and_resumes_mid_transaction() {
    let mut root = admin().await;
    let db = unique("oncely_stream");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!("USE {db}")).await.unwrap();
    root.query_drop("CREATE TABLE items (id int PRIMARY KEY, qty int, note varchar(20))")
        .await
        .unwrap();

    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let facts = ServerFacts::read(&mut cap).await.unwrap();
    let from = current_position(&mut cap, facts.flavor, &facts.version)
        .await
        .expect("current position");
    let start = StreamStart {
        opts: capture_opts(),
        replica_id: server_id(),
        flavor: facts.flavor,
        server: facts.server.clone(),
        from: from.clone(),
        resume: ResumeBy::FilePosition,
        mapping: MappingConfig::default(),
        include_query: false,
        facts: ShapeFacts::default(),
        takeover: None,
        captured: crate::mysql_binlog::only(&db),
    };
    let mut stream = open(&start, from, ShapeFacts::default()).await;

    // A table whose shape facts (a tinyint(1) column) the binlog lacks:
    // read from the catalog at its first TABLE_MAP and stored with every
    // offset record from the next transaction's start on.
    root.query_drop("CREATE TABLE flags (id int PRIMARY KEY, flag tinyint(1))")
        .await
        .unwrap();
    root.query_drop("INSERT INTO flags VALUES (1, 1)")
        .await
        .unwrap();

    root.query_drop("INSERT INTO items VALUES (1, 5, 'a')")
        .await
        .unwrap();
    root.query_drop("UPDATE items SET qty = 6 WHERE id = 1")
        .await
        .unwrap();
    root.query_drop("DELETE FROM items WHERE id = 1")
        .await
        .unwrap();
    // A rotation before the multi-row transaction: its keys are above
    // every key of the file before.
    root.query_drop("FLUSH BINARY LOGS").await.unwrap();
    root.query_drop("BEGIN").await.unwrap();
    root.query_drop("INSERT INTO items VALUES (2, 1, 'b'), (3, 1, 'c'), (4, 1, NULL)")
        .await
        .unwrap();
    root.query_drop("UPDATE items SET note = 'bb' WHERE id = 2")
        .await
        .unwrap();
    root.query_drop("COMMIT").await.unwrap();

    let seen = read_ours(&mut stream, &db, 7).await;
    assert_eq!(
        ops(&seen),
        vec![
            ('c', None, row(&["1", "5", "a"])),
            ('u', row(&["1", "5", "a"]), row(&["1", "6", "a"])),
            ('d', row(&["1", "6", "a"]), None),
            ('c', None, row(&["2", "1", "b"])),
            ('c', None, row(&["3", "1", "c"])),
            (
                'c',
                None,
                Some(vec![Some("4".into()), Some("1".into()), None])
            ),
            ('u', row(&["2", "1", "b"]), row(&["2", "1", "bb"])),
        ],
        "{seen:#?}"
    );
    // One transaction per autocommit statement, one for the explicit one.
    let txs: Vec<usize> = seen
        .iter()
        .filter(|s| matches!(s.event, EventView::Change { .. }))
        .filter_map(|s| s.tx)
        .collect();
    assert!(
        txs[0] < txs[1] && txs[1] < txs[2] && txs[2] < txs[3],
        "{txs:?}"
    );
    assert!(txs[3..].iter().all(|t| *t == txs[3]), "{txs:?}");

    let begins: Vec<u64> = seen
        .iter()
        .filter_map(|s| match s.event {
            EventView::Begin { commit } => Some(commit),
            _ => None,
        })
        .collect();
    assert!(begins.windows(2).all(|w| w[0] < w[1]), "{begins:?}");
    // Order keys: a Begin's and its Commit's `commit` are the start's key;
    // `end` is the next start's; every key grows along the stream.
    let last: Vec<Seen> = seen
        .iter()
        .filter(|s| s.tx == Some(txs[3]))
        .cloned()
        .collect();
    assert_eq!(last.len(), 6, "Begin, 4 changes, Commit: {last:#?}");
    let EventView::Begin { commit: begin } = last[0].event else {
        panic!("{last:#?}");
    };
    let EventView::Commit { commit, end } = last[last.len() - 1].event else {
        panic!("{last:#?}");
    };
    assert_eq!(begin, commit);
    assert!(end > commit);
    let ats: Vec<u64> = last
        .iter()
        .filter_map(|s| match s.event {
            EventView::Change { at, .. } => Some(at),
            _ => None,
        })
        .collect();
    assert!(
        ats.windows(2).all(|w| w[0] <= w[1]) && ats[0] > commit && ats[3] < end,
        "{ats:?}"
    );

    // The offset record of the complete transaction resumes after it.
    let complete = SourceOffset {
        commit_lsn: commit,
        events: 4,
        complete: true,
        ..SourceOffset::start(end)
    };
    let mut stored = complete.clone();
    stored.source = stream.part_of(&complete).expect("part");
    let part = MySqlOffset::read(&stored).expect("the part agrees with its keys");
    assert_eq!(part.server, facts.server);
    assert_eq!((part.position.event, part.position.row), (0, 0));
    assert_ne!(part.position.file, start.from.file, "after the rotation");
    let facts = serde_json::to_string(&part.facts).unwrap();
    assert!(
        facts.contains(&db) && facts.contains("flag"),
        "the facts of {db}.flags: {facts}"
    );

    // A partial record of it (as a batch boundary inside the transaction
    // writes) names its start; a stream reopened there hands it out again
    // whole, at the same keys.
    let partial = SourceOffset {
        commit_lsn: commit,
        events: 2,
        complete: false,
        ..SourceOffset::start(begin)
    };
    let mut stored = partial.clone();
    stored.source = stream.part_of(&partial).expect("part");
    let part = MySqlOffset::read(&stored).expect("the part agrees with its keys");
    assert!(part.position.event > 0 || part.position.row > 0, "{part:?}");
    stream.stop();

    assert_eq!(
        part.facts,
        MySqlOffset::read(&{
            let mut s = complete.clone();
            s.source = stream.part_of(&complete).unwrap();
            s
        })
        .unwrap()
        .facts,
        "no DDL between the two starts"
    );
    let mut again = open(&start, part.resume_from(), part.facts.clone()).await;
    let replay = read_ours(&mut again, &db, 4).await;
    assert_eq!(ops(&replay), ops(&seen)[3..].to_vec(), "{replay:#?}");
    let EventView::Begin {
        commit: again_begin,
    } = replay[0].event
    else {
        panic!("{replay:#?}");
    };
    assert_eq!(again_begin, begin, "the same transaction at the same key");
    let again_ats: Vec<u64> = replay
        .iter()
        .filter_map(|s| match s.event {
            EventView::Change { at, .. } => Some(at),
            _ => None,
        })
        .collect();
    assert_eq!(again_ats, ats);
    again.stop();
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}
