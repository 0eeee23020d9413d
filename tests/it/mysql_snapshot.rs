//! The MySQL/MariaDB source's initial snapshot against the MariaDB of
//! `scripts/services`: rows read by SELECT come out as the cells the binlog
//! decoder gives for the same rows (byte-identical Debezium JSON for every
//! type), and the stream from the snapshot's position gives exactly the
//! changes the snapshot does not hold, under each lock the snapshot takes.

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use oncely_capture::catalog::SourceOffset;
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::mapping::{
    self, BigintUnsignedHandlingMode, DecimalHandlingMode, TimePrecisionMode,
};
use oncely_capture::testing::mysql::{
    order_key, BinlogChange, BinlogReader, Cell, ChangeKind, MappingConfig, MySqlOffset,
    MySqlSourceError, ResumeBy, ServerFacts, ShapeFacts, SnapshotLock, SnapshotLockingMode,
    SnapshotReader, SnapshotSettings, TableFacts, TableShape,
};
use serde_json::Value;

use crate::harness::common::{env_var, unique};
use crate::mysql_binlog::{admin, capture_opts, position as position_of, read_until, server_id};

/// Every type the mapping's golden fixture covers, spatial ones included.
pub(crate) const EVERY_TYPE: &str = "CREATE TABLE every_type (
    id int PRIMARY KEY,
    ti tinyint, tu tinyint unsigned, b1 tinyint(1), si smallint, su smallint unsigned,
    mi mediumint, mu mediumint unsigned, i int, iu int unsigned, bi bigint, bu bigint unsigned,
    f float, d double, dec1 decimal(10,2), dec65 decimal(65,30),
    dt date, dtt datetime, dt3 datetime(3), dt6 datetime(6), dtz datetime NOT NULL,
    ts timestamp NULL, ts3 timestamp(3) NULL, ts6 timestamp(6) NULL, tm time(6), tm0 time, yr year,
    ch char(5), vc varchar(20), tx text, bn binary(4), vb varbinary(8), bl blob, lb longblob,
    en enum('small','medium','large'), st set('a','b','c'), js json,
    bit1 bit(1), bit12 bit(12), bit64 bit(64),
    g geometry, pt point, poly polygon,
    zd date NOT NULL
)";

pub(crate) const EVERY_ROW: &str = "INSERT INTO every_type VALUES
 (1, -128, 255, 1, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
  -9223372036854775808, 9223372036854775807, 1.5, -2.25e10, -12345678.90,
  '-12345678901234567890123456789012345.123456789012345678901234567891',
  '2026-12-05', '2026-12-05 01:02:03', '2026-12-05 01:02:03.456', '1900-01-01 00:00:00.000001',
  '2000-01-01 00:00:00', '2038-01-19 03:14:07', '2026-12-05 01:02:03.456',
  '1970-01-01 00:00:01.000001', '-838:59:59.000000', '838:59:59', 2155,
  'ab', '日本', 'long text', 0x00ff, 0x0001feff, 0xdeadbeef, 0x00,
  'medium', 'a,c', '{\"k\": [1, 2.5, \"x\", null, true], \"u\": \"\\\\u00e9\"}',
  b'1', b'101010111100', b'1000000000000000000000000000000000000000000000000000000000000001',
  ST_GeomFromText('LINESTRING(0 0, 1 1.5)', 4326), ST_GeomFromText('POINT(1 2)'),
  ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))'), '2000-01-01'),
 (2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 18446744073709551615, 0, 0, 0, 0,
  '0000-00-00', '0000-00-00 00:00:00', NULL, NULL, '0000-00-00 00:00:00',
  '0000-00-00 00:00:00', NULL, NULL, '00:00:00', '-00:00:01', 0,
  '', '', '', NULL, '', '', '', '', '', '[]', b'0', b'0', b'0', NULL, NULL, NULL, '0000-00-00'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, '1999-12-31 23:59:59', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '1970-01-01')";

fn root_opts() -> Opts {
    Opts::from_url(&env_var("ONCELY_MARIADB_URL")).expect("ONCELY_MARIADB_URL")
}

/// A database of its own, in UTC with zero dates allowed.
async fn database(prefix: &str) -> (Conn, String) {
    let mut root = admin().await;
    let db = unique(prefix);
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!("USE {db}")).await.unwrap();
    root.query_drop("SET SESSION time_zone = '+00:00', SESSION sql_mode = ''")
        .await
        .unwrap();
    (root, db)
}

/// Every row of a table through the snapshot, chunk by chunk.
async fn read_all(
    snap: &mut SnapshotReader,
    db: &str,
    table: &str,
    limit: usize,
) -> Vec<Vec<Cell>> {
    let mut rows = Vec::new();
    let mut after: Option<Vec<Cell>> = None;
    loop {
        let chunk = snap
            .read_chunk(db, table, after.as_deref(), limit)
            .await
            .expect("chunk");
        assert!(chunk.rows.len() <= limit);
        rows.extend(chunk.rows);
        match chunk.next {
            Some(k) => after = Some(k),
            None => return rows,
        }
    }
}

/// Each column's Connect schema and JSON value (or the mapping's refusal).
fn mapped(cfg: &MappingConfig, shape: &TableShape, row: &[Cell]) -> Vec<(Value, Value)> {
    shape
        .columns
        .iter()
        .zip(row)
        .map(|(col, cell)| {
            let schema = mapping::field_schema(cfg, col, col.nullable);
            let value = match mapping::to_json(cfg, col, cell) {
                Ok(v) => v,
                Err(e) => Value::String(format!("refused: {e}")),
            };
            (schema, value)
        })
        .collect()
}

#[tokio::test]
async fn a_row_read_by_snapshot_maps_to_the_same_json_as_from_the_binlog() {
    let (mut root, db) = database("oncely_snaptypes").await;
    root.query_drop(EVERY_TYPE).await.unwrap();
    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let facts = ServerFacts::read(&mut cap).await.unwrap();
    let start = current_position(&mut cap, facts.flavor, &facts.version)
        .await
        .unwrap();
    root.query_drop(EVERY_ROW).await.unwrap();

    let mut reader = BinlogReader::open(
        capture_opts(),
        server_id(),
        facts.flavor,
        &start,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await
    .expect("binlog dump");
    let streamed = read_until(&mut reader, &db, 3, false).await;
    reader.close().await.ok();
    let streamed: Vec<_> = streamed
        .into_iter()
        .filter_map(|c| match c {
            BinlogChange::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(streamed.len(), 3);

    let tables = [(db.clone(), "every_type".to_string())];
    let mut snap = SnapshotReader::begin(root_opts(), &SnapshotSettings::default(), &tables)
        .await
        .expect("snapshot");
    let rows = read_all(&mut snap, &db, "every_type", 2).await;
    let shape = snap.shape(&db, "every_type").unwrap();
    snap.finish().await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(shape.primary_key, vec![0]);

    let modes = [
        MappingConfig::default(),
        MappingConfig {
            decimal: DecimalHandlingMode::String,
            time: TimePrecisionMode::Connect,
            bigint_unsigned: BigintUnsignedHandlingMode::Precise,
            tinyint_one_as_boolean: true,
        },
        MappingConfig {
            decimal: DecimalHandlingMode::Double,
            ..MappingConfig::default()
        },
    ];
    for (row, change) in rows.iter().zip(&streamed) {
        assert_eq!(change.kind, ChangeKind::Insert);
        let from_binlog = change.after.as_ref().unwrap();
        assert_eq!(row, from_binlog, "the same cells");
        for cfg in &modes {
            let a = serde_json::to_string(&mapped(cfg, &shape, row)).unwrap();
            let b = serde_json::to_string(&mapped(cfg, &change.table, from_binlog)).unwrap();
            assert_eq!(a, b, "{cfg:?}");
        }
    }
    // The refusal of BIGINT UNSIGNED max in `long` mode, and the mapped
    // values really are Debezium's (spot checks; the golden fixture has all).
    let json = mapped(&MappingConfig::default(), &shape, &rows[1]);
    assert_eq!(json[11].1, Value::String("refused: 18446744073709551615 does not fit int64: set bigint.unsigned.handling.mode = \"precise\"".into()));
    let json = mapped(&MappingConfig::default(), &shape, &rows[0]);
    assert_eq!(json[3].1, serde_json::json!(1), "tinyint(1) as int16");
    assert_eq!(json[27].1, serde_json::json!("ab"), "CHAR without padding");
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

/// `(id, v)` of a table's rows.
type Table = BTreeMap<i64, String>;

fn int(c: &Cell) -> i64 {
    match c {
        Cell::Int(i) => *i,
        other => panic!("{other:?}"),
    }
}

fn text(c: &Cell) -> String {
    match c {
        Cell::Bytes(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// The changes a writer makes while a snapshot reads: to rows already read
/// and not yet read, a delete, inserts, an update of an inserted row, and
/// the marker row 999 last.
const WRITES: [&str; 7] = [
    "UPDATE t SET v = 'u5' WHERE id = 5",
    "UPDATE t SET v = 'u50' WHERE id = 50",
    "DELETE FROM t WHERE id = 60",
    "INSERT INTO t VALUES (101, 'i101')",
    "INSERT INTO t VALUES (102, 'i102')",
    "UPDATE t SET v = 'u101' WHERE id = 101",
    "INSERT INTO t VALUES (999, 'marker')",
];

async fn write_all(db: String) -> u32 {
    let mut w = admin().await;
    let id = w.id();
    w.query_drop(format!("USE {db}")).await.unwrap();
    for sql in WRITES {
        w.query_drop(sql).await.unwrap();
    }
    w.disconnect().await.ok();
    id
}

/// Snapshot rows, then the stream's changes from the snapshot's position,
/// applied in order: must be the table as it ends, with each write of
/// [`WRITES`] streamed exactly once and nothing before the position.
async fn snapshot_then_stream(opts: Opts, mode: SnapshotLockingMode, expect: SnapshotLock) {
    let (mut root, db) = database("oncely_snapcc").await;
    root.query_drop("CREATE TABLE t (id int PRIMARY KEY, v varchar(20))")
        .await
        .unwrap();
    root.query_drop("INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_100")
        .await
        .unwrap();
    let initial: Table = (1..=100).map(|i| (i, format!("v{i}"))).collect();

    let settings = SnapshotSettings { locking_mode: mode };
    let tables = [(db.clone(), "t".to_string())];
    let mut snap = SnapshotReader::begin(opts, &settings, &tables)
        .await
        .expect("snapshot");
    assert_eq!(snap.lock(), expect);
    let position = snap.position().clone();
    let first = snap.read_chunk(&db, "t", None, 10).await.unwrap();
    let mut writer = Some(tokio::spawn(write_all(db.clone())));
    if expect == SnapshotLock::Tables {
        // Table locks keep writers out until the snapshot ends: the
        // writer waits on the table's lock meanwhile.
        wait_for_lock_wait(&mut root).await;
        assert!(writer.as_ref().is_some_and(|w| !w.is_finished()));
    } else if let Some(w) = writer.take() {
        w.await.unwrap();
    }
    let mut rows = first.rows;
    let mut after = first.next;
    while let Some(k) = after {
        let c = snap.read_chunk(&db, "t", Some(&k), 10).await.unwrap();
        rows.extend(c.rows);
        after = c.next;
    }
    snap.finish().await.unwrap();
    if let Some(w) = writer {
        w.await.unwrap();
    }
    let snapshot: Table = rows.iter().map(|r| (int(&r[0]), text(&r[1]))).collect();
    assert_eq!(rows.len(), 100, "no row twice");
    assert_eq!(
        snapshot, initial,
        "the snapshot holds the table as of its position"
    );

    let mut reader = BinlogReader::open(
        capture_opts(),
        server_id(),
        oncely_capture::testing::mysql::Flavor::MariaDb,
        &position,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await
    .unwrap();
    let changes = read_until(&mut reader, &db, 999, false).await;
    reader.close().await.ok();
    let mut table = snapshot;
    let mut seen = Vec::new();
    for c in changes {
        let BinlogChange::Row(r) = c else { continue };
        let id = int(&r.after.as_ref().or(r.before.as_ref()).unwrap()[0]);
        seen.push(format!("{:?} {id}", r.kind));
        match r.kind {
            ChangeKind::Delete => assert!(table.remove(&id).is_some(), "delete of a missing row"),
            ChangeKind::Insert => assert!(
                table.insert(id, text(&r.after.unwrap()[1])).is_none(),
                "insert of a row the snapshot holds: {id}"
            ),
            ChangeKind::Update => {
                assert!(table.insert(id, text(&r.after.unwrap()[1])).is_some())
            }
        }
    }
    assert_eq!(
        seen,
        [
            "Update 5",
            "Update 50",
            "Delete 60",
            "Insert 101",
            "Insert 102",
            "Update 101",
            "Insert 999"
        ]
    );
    let now: Vec<(i64, String)> = root.query("SELECT id, v FROM t ORDER BY id").await.unwrap();
    assert_eq!(table, now.into_iter().collect::<Table>());
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

/// Waits until some session waits on a table lock (the test's writer).
async fn wait_for_lock_wait(root: &mut Conn) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n: Option<i64> = root
            .query_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE STATE LIKE 'Waiting for table%lock'",
            )
            .await
            .unwrap();
        if n.unwrap_or(0) > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn changes_during_a_snapshot_under_the_global_lock_stream_exactly_once() {
    snapshot_then_stream(
        root_opts(),
        SnapshotLockingMode::Minimal,
        SnapshotLock::Global,
    )
    .await;
}

#[tokio::test]
async fn without_a_lock_the_snapshot_still_meets_the_stream_when_no_write_races_its_start() {
    snapshot_then_stream(root_opts(), SnapshotLockingMode::None, SnapshotLock::None).await;
}

/// A user with LOCK TABLES but not RELOAD: table locks, held to the end
/// (writers wait); a user with neither (the least-privileged capture
/// user): refused, naming the grants and `snapshot.locking.mode`.
#[tokio::test]
async fn without_reload_the_snapshot_locks_the_tables_or_names_the_grant() {
    let mut root = admin().await;
    let user = unique("oncely_locktables");
    root.query_drop(format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'"
    ))
    .await
    .unwrap();
    root.query_drop(format!(
        "GRANT SELECT, LOCK TABLES, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'"
    ))
    .await
    .unwrap();
    let opts = mysql_async::OptsBuilder::from_opts(root_opts())
        .user(Some(user.clone()))
        .pass(Some("pw"));
    snapshot_then_stream(
        opts.into(),
        SnapshotLockingMode::Minimal,
        SnapshotLock::Tables,
    )
    .await;
    root.query_drop(format!("DROP USER '{user}'@'127.0.0.1'"))
        .await
        .unwrap();

    let (mut root, db) = database("oncely_snapdeny").await;
    root.query_drop("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let tables = [(db.clone(), "t".to_string())];
    let err = SnapshotReader::begin(capture_opts(), &SnapshotSettings::default(), &tables)
        .await
        .err()
        .expect("the capture user may take no lock");
    assert!(
        matches!(err, MySqlSourceError::SnapshotLockRefused { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("GRANT RELOAD") && msg.contains("snapshot.locking.mode = \"none\""),
        "{msg}"
    );
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

/// Changes of `db` with the reader's shape facts right after each and as
/// of its transaction's start, until the commit after the insert of row
/// `last_id`.
async fn read_with_facts(
    reader: &mut BinlogReader,
    db: &str,
    last_id: i64,
) -> Vec<(BinlogChange, ShapeFacts, ShapeFacts)> {
    let mut out = Vec::new();
    let mut seen_last = false;
    let mut ours = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let next = tokio::time::timeout_at(deadline, reader.next())
            .await
            .expect("the test's changes within 30 s")
            .expect("binlog read")
            .expect("the dump ended");
        let keep = match &next {
            BinlogChange::Row(r) if r.table.database == db => {
                seen_last |= r.after.as_ref().map(|a| &a[0]) == Some(&Cell::Int(last_id));
                true
            }
            BinlogChange::Ddl { database, .. } => database == db,
            BinlogChange::Commit { .. } => std::mem::take(&mut ours),
            _ => false,
        };
        if keep {
            ours |= !matches!(next, BinlogChange::Commit { .. });
            let done = seen_last && matches!(next, BinlogChange::Commit { .. });
            out.push((
                next,
                reader.facts().clone(),
                reader.facts_at_transaction_start().clone(),
            ));
            if done {
                return out;
            }
        }
    }
}

/// `(flag, doc)` of a row change as Debezium's JSON with `tinyint(1)` as
/// boolean, and doc's Connect schema name.
fn flag_and_doc(change: &BinlogChange) -> (Value, Value, Value) {
    let BinlogChange::Row(r) = change else {
        panic!("{change:?}")
    };
    let cfg = MappingConfig {
        tinyint_one_as_boolean: true,
        ..MappingConfig::default()
    };
    let after = r.after.as_ref().unwrap();
    let (flag, doc) = (&r.table.columns[1], &r.table.columns[2]);
    (
        mapping::to_json(&cfg, flag, &after[1]).unwrap(),
        mapping::to_json(&cfg, doc, &after[2]).unwrap(),
        mapping::field_schema(&cfg, doc, true)["name"].clone(),
    )
}

/// DDL turns a `tinyint(1)` into `int` and a JSON column into text between
/// two rows. Read again from before the DDL with the facts stored there,
/// the old row keeps the old shape (boolean, JSON) although the catalog
/// has moved on; resumed right after the DDL (as after a kill between it
/// and the next row) with the facts stored with it, the new row has the new.
#[tokio::test]
async fn rows_before_a_ddl_decode_with_the_shape_they_were_written_with() {
    let (mut root, db) = database("oncely_shapes").await;
    root.query_drop("CREATE TABLE h (id int PRIMARY KEY, flag tinyint(1), doc json)")
        .await
        .unwrap();
    let tables = [(db.clone(), "h".to_string())];
    let snap = SnapshotReader::begin(root_opts(), &SnapshotSettings::default(), &tables)
        .await
        .unwrap();
    let (start, start_facts) = (snap.position().clone(), snap.facts());
    snap.finish().await.unwrap();
    // Every column numbered, in declaration order (kept by the MODIFYs).
    let ids = start_facts.ids(&db, "h").cloned();
    assert_eq!(
        ids.as_ref().map(|i| i.columns.clone()),
        Some([("id".to_string(), 1), ("flag".into(), 2), ("doc".into(), 3)].into())
    );
    let t = |a: &[&str], j: &[&str]| TableFacts {
        database: db.clone(),
        table: "h".into(),
        tinyint1: a.iter().map(|s| s.to_string()).collect(),
        json: j.iter().map(|s| s.to_string()).collect(),
        ids: ids.clone(),
    };
    assert_eq!(
        serde_json::to_value(&start_facts).unwrap(),
        serde_json::json!([t(&["flag"], &["doc"])])
    );
    root.query_drop("INSERT INTO h VALUES (1, 1, '{\"a\": 1}')")
        .await
        .unwrap();
    root.query_drop("ALTER TABLE h MODIFY flag int, MODIFY doc text")
        .await
        .unwrap();
    root.query_drop("INSERT INTO h VALUES (2, 2, 'not json')")
        .await
        .unwrap();

    let captured = crate::mysql_binlog::only(&db);
    let captured = &captured;
    let open = |from: oncely_capture::testing::mysql::Position, facts: ShapeFacts| async move {
        let mut r = BinlogReader::open(
            capture_opts(),
            server_id(),
            oncely_capture::testing::mysql::Flavor::MariaDb,
            &from,
            ResumeBy::FilePosition,
            captured.clone(),
        )
        .await
        .unwrap();
        r.set_facts(facts);
        r
    };
    let mut reader = open(start.clone(), start_facts.clone()).await;
    let all = read_with_facts(&mut reader, &db, 2).await;
    reader.close().await.ok();
    let kinds: Vec<&str> = all
        .iter()
        .map(|(c, _, _)| match c {
            BinlogChange::Row(_) => "row",
            BinlogChange::Ddl { .. } => "ddl",
            BinlogChange::Commit { .. } => "commit",
        })
        .collect();
    assert_eq!(kinds, ["row", "commit", "ddl", "commit", "row", "commit"]);
    let json_name = serde_json::json!("io.debezium.data.Json");
    assert_eq!(
        flag_and_doc(&all[0].0),
        (
            serde_json::json!(true),
            // MariaDB's JSON text as stored, as Debezium publishes it.
            serde_json::json!("{\"a\": 1}"),
            json_name
        ),
        "the old row with the old shape"
    );
    assert_eq!(
        flag_and_doc(&all[4].0),
        (
            serde_json::json!(2),
            serde_json::json!("not json"),
            Value::Null
        ),
        "the new row with the new shape"
    );
    // The facts derived from the DDL's text are what the catalog says now.
    let after_ddl = all[2].1.clone();
    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let cat = oncely_capture::testing::mysql::shape::load_catalog(
        &mut cap,
        oncely_capture::testing::mysql::Flavor::MariaDb,
        &db,
        "h",
    )
    .await
    .unwrap();
    let mut from_catalog = ShapeFacts::default();
    from_catalog.set_from_catalog(&db, "h", &cat);
    // (The reader also met other tests' tables: compare the test's only.)
    let of_h = |f: &ShapeFacts| {
        let all: Vec<TableFacts> = f.clone().into();
        all.into_iter()
            .filter(|x| x.database == db && x.table == "h")
            .collect::<Vec<_>>()
    };
    assert_eq!(of_h(&after_ddl), of_h(&from_catalog));
    assert_eq!(of_h(&after_ddl), [t(&[], &[])]);

    // A restart from each stored place with the facts stored with it: the
    // commit before the DDL (the DDL is derived again) and the DDL itself
    // (a kill before the next row): the same rows, the same shapes.
    for at in [1usize, 2] {
        let position = match &all[at].0 {
            BinlogChange::Ddl { position, .. } | BinlogChange::Commit { position, .. } => {
                position.clone()
            }
            BinlogChange::Row(r) => r.position.clone(),
        };
        let mut again = open(position, all[at].1.clone()).await;
        let rest = read_with_facts(&mut again, &db, 2).await;
        again.close().await.ok();
        let row = rest
            .iter()
            .find(|(c, _, _)| matches!(c, BinlogChange::Row(_)))
            .expect("row 2");
        assert_eq!(flag_and_doc(&row.0), flag_and_doc(&all[4].0), "from #{at}");
        assert_eq!(
            of_h(&rest.last().unwrap().1),
            of_h(&after_ddl),
            "from #{at}"
        );
    }
    // Through the offset record, as capture stores it: a kill right after
    // the DDL's change was published (inside its transaction) stores the
    // DDL's position and the facts from before it; the reader opens at
    // the transaction's start, derives the DDL again (the core skips it,
    // 1 change published) and decodes row 2 with the new shape.
    let (ddl, _, before_ddl) = &all[2];
    let BinlogChange::Ddl { position, .. } = ddl else {
        panic!("{ddl:?}")
    };
    assert_eq!(of_h(before_ddl), [t(&["flag"], &["doc"])]);
    let server = ServerFacts::read(&mut cap).await.unwrap().server;
    let part = MySqlOffset::new(position.clone(), server, before_ddl, |d, _| d == db);
    let mut record = SourceOffset {
        commit_lsn: order_key(position).unwrap(),
        events: 1,
        complete: false,
        ..SourceOffset::start(order_key(position_of(&all[1].0)).unwrap())
    };
    part.store(&mut record).unwrap();
    let stored: SourceOffset = serde_json::from_slice(&record.to_bytes()).unwrap();
    let part = MySqlOffset::read(&stored).unwrap();
    assert_eq!(of_h(&part.facts), [t(&["flag"], &["doc"])]);
    let mut again = open(part.resume_from(), part.facts.clone()).await;
    let rest = read_with_facts(&mut again, &db, 2).await;
    again.close().await.ok();
    assert!(
        matches!(rest[0].0, BinlogChange::Ddl { .. }),
        "{:?}",
        rest[0].0
    );
    assert_eq!(flag_and_doc(&rest[2].0), flag_and_doc(&all[4].0));

    // And the old row read again from the start is still the old shape.
    let mut again = open(start, start_facts).await;
    let rest = read_with_facts(&mut again, &db, 2).await;
    again.close().await.ok();
    assert_eq!(flag_and_doc(&rest[0].0), flag_and_doc(&all[0].0));
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

/// A composite key of a DECIMAL(65,30) whose values differ only past a
/// double's precision, a case-insensitive text and a BIT: chunks of one
/// row page through each row exactly once, in key order, and a new
/// snapshot resumes from a key stored as JSON.
#[tokio::test]
async fn chunks_page_exactly_through_decimal_and_composite_keys_and_resume_from_a_stored_key() {
    let (mut root, db) = database("oncely_snapkeys").await;
    root.query_drop(
        "CREATE TABLE k (d decimal(65,30), s varchar(10), b bit(12), v int, PRIMARY KEY (d, s, b))",
    )
    .await
    .unwrap();
    root.query_drop(
        "INSERT INTO k VALUES \
         (1.000000000000000000000000000001, 'a', b'1', 1), \
         (1.000000000000000000000000000001, 'B', b'1', 2), \
         (1.000000000000000000000000000001, 'B', b'101010111100', 3), \
         (1.000000000000000000000000000002, 'a', b'0', 4), \
         (1.000000000000000000000000000003, 'a', b'0', 5), \
         (-7, 'z', b'0', 6)",
    )
    .await
    .unwrap();
    let tables = [(db.clone(), "k".to_string())];
    let mut snap = SnapshotReader::begin(root_opts(), &SnapshotSettings::default(), &tables)
        .await
        .unwrap();
    let rows = read_all(&mut snap, &db, "k", 1).await;
    let v: Vec<i64> = rows.iter().map(|r| int(&r[3])).collect();
    assert_eq!(v, [6, 1, 2, 3, 4, 5], "key order, each row once");
    // A key stored (as JSON) after the third row, resumed by a new snapshot.
    let first = snap.read_chunk(&db, "k", None, 3).await.unwrap();
    snap.finish().await.unwrap();
    let stored = serde_json::to_string(&first.next.expect("more rows")).unwrap();
    let key: Vec<Cell> = serde_json::from_str(&stored).unwrap();
    let mut again = SnapshotReader::begin(root_opts(), &SnapshotSettings::default(), &tables)
        .await
        .unwrap();
    let rest = again.read_chunk(&db, "k", Some(&key), 10).await.unwrap();
    again.finish().await.unwrap();
    let v: Vec<i64> = rest.rows.iter().map(|r| int(&r[3])).collect();
    assert_eq!(v, [3, 4, 5]);
    assert_eq!(rest.next, None);
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}
