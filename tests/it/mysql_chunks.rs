//! The core's snapshot chunks on the MariaDB of `scripts/services`: a
//! chunk read while another connection writes comes back as the table
//! exactly as of the binlog position of its read view, and the stream
//! hands out its low and high watermark between the transactions before
//! that position and those after it, outside any transaction, with no
//! transaction between them; on a server nobody writes to (after a
//! binlog rotation, too) the watermarks still come at once. The server is
//! shared with other tests, so only the test's own table is followed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use oncely_capture::testing::chunk::ChunkRequest;
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::chunks::{ChunkView, MySqlChunks};
use oncely_capture::testing::mysql::{
    EventView, MappingConfig, MySqlStream, ResumeBy, ServerFacts, ShapeFacts, SnapshotLockingMode,
    StreamStart,
};

use crate::harness::common::unique;
use crate::mysql_binlog::{admin, capture_opts, server_id};

/// Rows of the test table: key text to the row's text.
type Table = BTreeMap<String, Vec<Option<String>>>;

/// The binlog from its end, capturing the tables of `db`.
async fn open_stream(db: &str) -> MySqlStream {
    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let facts = ServerFacts::read(&mut cap).await.unwrap();
    let from = current_position(&mut cap, facts.flavor, &facts.version)
        .await
        .expect("current position");
    MySqlStream::open(StreamStart {
        opts: capture_opts(),
        replica_id: server_id(),
        flavor: facts.flavor,
        server: facts.server.clone(),
        from,
        resume: ResumeBy::FilePosition,
        mapping: MappingConfig::default(),
        include_query: false,
        facts: ShapeFacts::default(),
        takeover: None,
        captured: crate::mysql_binlog::only(db),
    })
    .await
    .expect("open the stream")
}

fn request(id: &str, db: &str) -> ChunkRequest {
    ChunkRequest {
        id: id.into(),
        schema: db.into(),
        table: "items".into(),
        key_columns: vec!["id".into()],
        after: None,
        filter: None,
        size: 1000,
    }
}

/// What the stream showed of the test: the table as its changes made it
/// up to each point, and where the chunk's watermarks were.
#[derive(Default)]
struct Followed {
    table: Table,
    ours: Option<u32>,
    in_tx: bool,
    /// Changes of the test table so far.
    changes: usize,
    /// The table and the changes before the low watermark.
    at_low: Option<(Table, usize)>,
    high: bool,
    /// Transactions of any table begun between the two watermarks.
    between: usize,
}

impl Followed {
    fn see(&mut self, event: EventView, db: &str, chunk: &str) {
        match event {
            EventView::Begin { .. } => {
                assert!(!self.in_tx, "nested Begin");
                self.in_tx = true;
                if self.at_low.is_some() && !self.high {
                    self.between += 1;
                }
            }
            EventView::Commit { .. } => self.in_tx = false,
            EventView::Table {
                id,
                database,
                table,
            } if database == db && table == "items" => self.ours = Some(id),
            EventView::Change {
                table,
                before,
                after,
                ..
            } if Some(table) == self.ours => {
                if let Some(b) = before.and_then(|b| b[0].clone()) {
                    self.table.remove(&b);
                }
                if let Some(a) = after {
                    self.table.insert(a[0].clone().unwrap_or_default(), a);
                }
                self.changes += 1;
            }
            EventView::Watermark { content, .. } => {
                assert!(!self.in_tx, "a watermark inside a transaction");
                if content == format!("{chunk}:low") {
                    self.at_low = Some((self.table.clone(), self.changes));
                } else if content == format!("{chunk}:high") {
                    assert!(self.at_low.is_some(), "high before low");
                    self.high = true;
                }
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_chunk_is_the_table_as_of_its_position_and_its_watermarks_stand_there() {
    let mut root = admin().await;
    let db = unique("oncely_chunks");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!("USE {db}")).await.unwrap();
    root.query_drop("CREATE TABLE items (id int PRIMARY KEY, qty int)")
        .await
        .unwrap();
    let mut stream = open_stream(&db).await;
    let mut chunks = MySqlChunks::new(
        capture_opts(),
        SnapshotLockingMode::Minimal,
        MappingConfig::default(),
        stream.watermarks(),
    );
    root.query_drop("INSERT INTO items VALUES (1, 0), (2, 0), (3, 0), (4, 0)")
        .await
        .unwrap();

    // One transaction after another, each changing the table (one row
    // changes per transaction, so each transaction's table is another).
    const WRITES: usize = 400;
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let written = Arc::clone(&written);
        let mut conn = admin().await;
        let db = db.clone();
        tokio::spawn(async move {
            conn.query_drop(format!("USE {db}")).await.unwrap();
            for i in 0..WRITES {
                conn.query_drop(format!(
                    "UPDATE items SET qty = qty + 1 WHERE id = {}",
                    i % 4 + 1
                ))
                .await
                .unwrap();
                written.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    while written.load(Ordering::SeqCst) < WRITES / 4 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let read = chunks.start_view(request("c1", &db)).await.expect("start");
    let at_start = written.load(Ordering::SeqCst);
    let chunk: ChunkView = read.await.unwrap().expect("the chunk's rows");
    writer.await.unwrap();
    assert!(!chunk.more);

    let mut followed = Followed::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // The 4 inserts, then each update.
    while followed.changes < 4 + WRITES {
        let event = tokio::time::timeout_at(deadline, stream.next_view())
            .await
            .unwrap_or_else(|_| panic!("the stream did not bring every write within 60 s"))
            .expect("stream event");
        followed.see(event, &db, "c1");
    }
    let (at_low, before) = followed.at_low.expect("the low watermark");
    assert!(followed.high, "the high watermark");
    assert_eq!(followed.between, 0, "no transaction between the watermarks");
    let rows: Table = chunk
        .rows
        .iter()
        .map(|r| (r[0].clone().unwrap_or_default(), r.clone()))
        .collect();
    assert_eq!(
        rows, at_low,
        "the chunk is the table as the transactions before its watermarks made it"
    );
    // Writes ran on both sides of the read view, so the test can fail.
    assert!(
        (4 + WRITES / 4..4 + WRITES).contains(&before),
        "{before} changes before the watermarks, {at_start} updates written when the read view was open"
    );
    assert_ne!(rows, followed.table);
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn on_an_idle_server_the_watermarks_come_at_once_also_after_a_rotation() {
    let mut root = admin().await;
    let db = unique("oncely_chunks_idle");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!(
        "CREATE TABLE {db}.items (id int PRIMARY KEY, qty int)"
    ))
    .await
    .unwrap();
    root.query_drop(format!("INSERT INTO {db}.items VALUES (1, 1), (2, 2)"))
        .await
        .unwrap();
    let mut stream = open_stream(&db).await;
    let mut chunks = MySqlChunks::new(
        capture_opts(),
        SnapshotLockingMode::Minimal,
        MappingConfig::default(),
        stream.watermarks(),
    );
    for (chunk, rotate) in [("idle", false), ("rotated", true)] {
        if rotate {
            // The read view's position is then past the new file's header.
            root.query_drop("FLUSH BINARY LOGS").await.unwrap();
        }
        let read = chunks.start_view(request(chunk, &db)).await.unwrap();
        let view = read.await.unwrap().expect("the chunk's rows");
        assert_eq!(view.rows.len(), 2);
        let mut followed = Followed::default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !followed.high {
            let event = tokio::time::timeout_at(deadline, stream.next_view())
                .await
                .unwrap_or_else(|_| panic!("{chunk}: no watermarks within 5 s"))
                .expect("stream event");
            followed.see(event, &db, chunk);
        }
    }
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn chunks_page_by_the_key_also_from_a_stored_last_key_after_a_restart() {
    let mut root = admin().await;
    let db = unique("oncely_chunks_pages");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!(
        "CREATE TABLE {db}.items (id int PRIMARY KEY, qty int)"
    ))
    .await
    .unwrap();
    let values: Vec<String> = (1..=10).map(|i| format!("({}, {i})", i * 10)).collect();
    root.query_drop(format!(
        "INSERT INTO {db}.items VALUES {}",
        values.join(", ")
    ))
    .await
    .unwrap();
    let stream = open_stream(&db).await;
    let reads = || {
        MySqlChunks::new(
            capture_opts(),
            SnapshotLockingMode::Minimal,
            MappingConfig::default(),
            stream.watermarks(),
        )
    };
    let mut chunks = reads();
    let mut seen = Vec::new();
    let mut after: Option<Vec<Option<String>>> = None;
    for n in 0.. {
        // Every other chunk on fresh reads, as after a restart: the last
        // key comes back from its stored text.
        if n % 2 == 1 {
            chunks = reads();
        }
        let req = ChunkRequest {
            size: 3,
            after: after.clone(),
            ..request(&format!("p{n}"), &db)
        };
        let view = chunks.start_view(req).await.unwrap().await.unwrap();
        let view = view.expect("the chunk's rows");
        assert!(view.rows.len() <= 3);
        seen.extend(view.rows.iter().map(|r| r[0].clone().unwrap()));
        if !view.more {
            break;
        }
        after = Some(vec![view.rows.last().unwrap()[0].clone()]);
    }
    let all: Vec<String> = (1..=10).map(|i| (i * 10).to_string()).collect();
    assert_eq!(seen, all, "every row once, in key order");
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}
