//! The MySQL/MariaDB source's foundations against the MariaDB of
//! `scripts/services` (`ONCELY_MARIADB_URL`, root; `ONCELY_MARIADB_CAPTURE_URL`,
//! the least-privileged capture user): the start-up checks, the binlog read
//! as a replica from a recorded position across a `FLUSH BINARY LOGS`, every
//! type decoded and mapped as Debezium's MySQL connector does, and a resume
//! from the middle of a multi-row event giving exactly the rest.
//! MySQL-only formats (its GTID sets and events) are unit tests with byte
//! fixtures in capture/src/sources/mysql (no MySQL server here).

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::mapping::{self, BigintUnsignedHandlingMode};
use oncely_capture::testing::mysql::{
    BinlogChange, BinlogReader, ChangeKind, Flavor, Gtids, MappingConfig, MappingError,
    MySqlOffset, MySqlSourceError, Position, ResumeBy, RowChange, ServerFacts, ServerIdentity,
    ShapeFacts,
};
use serde_json::{json, Value};

use crate::harness::common::{env_var, unique};

/// A replica id per reader, so parallel readers never share one.
/// A stream's captured tables: every table of `db` only, so a row change
/// another test logs as a statement on the shared server is passed over.
pub(crate) fn only(db: &str) -> oncely_capture::testing::TableFilter {
    oncely_capture::testing::TableFilter::new(&[], &[])
        .and_then(|f| f.with_databases(&[regex::escape(db)], &[]))
        .expect("a filter of one database")
}

pub(crate) fn server_id() -> u32 {
    1000 + rand::random::<u32>() % 1_000_000
}

pub(crate) async fn admin() -> Conn {
    let url = env_var("ONCELY_MARIADB_URL");
    Conn::new(Opts::from_url(&url).expect("ONCELY_MARIADB_URL"))
        .await
        .expect("connect as admin")
}

pub(crate) fn capture_opts() -> Opts {
    Opts::from_url(&env_var("ONCELY_MARIADB_CAPTURE_URL")).expect("ONCELY_MARIADB_CAPTURE_URL")
}

const TABLE: &str = "CREATE TABLE every_type (
    id int PRIMARY KEY,
    ti tinyint, tu tinyint unsigned, b1 tinyint(1), si smallint, su smallint unsigned,
    mi mediumint, iu int unsigned, bi bigint, bu bigint unsigned,
    f float, d double, dec1 decimal(10,2),
    dt date, dtt datetime, dt6 datetime(6), ts timestamp(3) NULL, tm time(6), yr year,
    ch char(5), vc varchar(20), tx text, vb varbinary(8), bl blob,
    en enum('small','medium','large'), st set('a','b','c'), js json,
    bit1 bit(1), bit12 bit(12), zd date NOT NULL
)";

const ROW1: &str = "INSERT INTO every_type VALUES (1,
    -128, 255, 1, -32768, 65535, -8388608, 4294967295, -9223372036854775808, 9223372036854775807,
    1.5, -2.25e10, -12345678.90,
    '2026-12-05', '2026-12-05 01:02:03', '1900-01-01 00:00:00.000001', '2026-12-05 01:02:03.456',
    '-01:02:03.500000', 2155,
    'héllo', '日本', 'long text', 0x0001feff, 0xdeadbeef,
    'medium', 'a,c', '{\"k\": [1, 2.5, \"x\", null, true]}',
    b'1', b'101010111100', '2000-01-01')";

/// Row 1 as Debezium's MySQL connector writes it with default modes.
fn row1_json() -> Value {
    json!({
        "id": 1, "ti": -128, "tu": 255, "b1": 1, "si": -32768, "su": 65535,
        "mi": -8_388_608, "iu": 4_294_967_295_u64, "bi": i64::MIN, "bu": i64::MAX,
        "f": 1.5, "d": -2.25e10, "dec1": "tmn9Lg==",
        "dt": 20_792, "dtt": 1_796_432_523_000_i64, "dt6": -2_208_988_799_999_999_i64,
        "ts": "2026-12-05T01:02:03.456Z", "tm": -3_723_500_000_i64, "yr": 2155,
        "ch": "héllo", "vc": "日本", "tx": "long text", "vb": "AAH+/w==", "bl": "3q2+7w==",
        "en": "medium", "st": "a,c", "js": "{\"k\": [1, 2.5, \"x\", null, true]}",
        "bit1": true, "bit12": "vAo=", "zd": 10_957
    })
}

pub(crate) fn image(
    cfg: &MappingConfig,
    change: &RowChange,
    after: bool,
) -> Result<Value, MappingError> {
    let cells = if after {
        change.after.as_ref()
    } else {
        change.before.as_ref()
    };
    let cells = cells.expect("image present");
    let mut out = serde_json::Map::new();
    for (col, cell) in change.table.columns.iter().zip(cells) {
        out.insert(col.name.clone(), mapping::to_json(cfg, col, cell)?);
    }
    Ok(Value::Object(out))
}

/// Reads changes of `db` until the commit after the row with id `last_id`
/// was inserted, or fails after 30 s. `mid_tx`: the reader starts inside
/// one of the test's transactions (so its commit is the test's).
pub(crate) async fn read_until(
    reader: &mut BinlogReader,
    db: &str,
    last_id: i64,
    mid_tx: bool,
) -> Vec<BinlogChange> {
    let mut out = Vec::new();
    let mut seen_last = false;
    let mut ours = mid_tx;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let next = tokio::time::timeout_at(deadline, reader.next())
            .await
            .unwrap_or_else(|_| panic!("no end of the test's changes within 30 s; got {out:#?}"))
            .unwrap_or_else(|e| panic!("binlog read after {:?}: {e}", out.last().map(position)))
            .expect("the dump ended");
        match &next {
            BinlogChange::Row(r) if r.table.database == db => {
                ours = true;
                if r.kind == ChangeKind::Insert
                    && r.after.as_ref().and_then(|a| a.first())
                        == Some(&oncely_capture::testing::mysql::Cell::Int(last_id))
                {
                    seen_last = true;
                }
                out.push(next);
            }
            BinlogChange::Ddl { database, .. } if database == db => {
                ours = true;
                out.push(next);
            }
            // Keep only the commits of the test's transactions.
            BinlogChange::Commit { .. } if std::mem::take(&mut ours) => {
                out.push(next);
                if seen_last {
                    return out;
                }
            }
            _ => {}
        }
    }
}

pub(crate) fn position(c: &BinlogChange) -> &Position {
    match c {
        BinlogChange::Row(r) => &r.position,
        BinlogChange::Ddl { position, .. } | BinlogChange::Commit { position, .. } => position,
    }
}

/// (kind, id) of a row change, "ddl", or "commit": what the resume
/// comparisons look at, with the position.
pub(crate) fn summary(c: &BinlogChange) -> (String, Position) {
    let what = match c {
        BinlogChange::Row(r) => {
            let img = r.after.as_ref().or(r.before.as_ref()).expect("an image");
            format!("{:?} {:?}", r.kind, img[0])
        }
        BinlogChange::Ddl { query, .. } => format!("ddl {query}"),
        BinlogChange::Commit { .. } => "commit".into(),
    };
    (what, position(c).clone())
}

#[tokio::test]
async fn start_up_checks_pass_for_the_capture_user_and_refuse_a_purged_position() {
    let mut conn = Conn::new(capture_opts())
        .await
        .expect("connect as the capture user");
    let facts = ServerFacts::read(&mut conn).await.expect("server facts");
    assert_eq!(facts.flavor, Flavor::MariaDb, "{}", facts.version);
    facts
        .check(None)
        .expect("the services' MariaDB is set up for capture");
    let oldest = facts.binlogs.first().expect("binlogs").0.clone();
    let (base, _) = oldest.rsplit_once('.').expect("numbered binlog");
    let purged = Position::at(format!("{base}.000000"), 4);
    let err = facts.check(Some(&purged)).expect_err("a purged position");
    assert!(
        matches!(err, MySqlSourceError::PositionPurged { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("oldest binlog: {oldest}")),
        "{err}"
    );

    // The server's identity, stored with an offset: this server's own
    // position passes, the same position of another server (a failover)
    // is refused before the binlogs are looked at.
    let id: Option<u32> = conn.query_first("SELECT @@server_id").await.unwrap();
    assert_eq!(
        facts.server,
        ServerIdentity {
            id: id.unwrap(),
            uuid: None
        }
    );
    let (last, size) = facts.binlogs.last().expect("binlogs").clone();
    let here = MySqlOffset::new(
        Position::at(last, size),
        facts.server.clone(),
        &ShapeFacts::default(),
        |_, _| true,
    );
    here.check(&facts, None)
        .expect("this server's own position");
    let other = MySqlOffset {
        server: ServerIdentity {
            id: facts.server.id + 1,
            uuid: None,
        },
        ..here
    };
    let err = other
        .check(&facts, None)
        .expect_err("another server's position, without GTIDs");
    assert!(matches!(err, MySqlSourceError::OtherServer { .. }), "{err}");

    // Without REPLICATION SLAVE: the grant is named.
    let mut root = admin().await;
    let user = unique("oncely_nogrant");
    root.query_drop(format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'"
    ))
    .await
    .unwrap();
    root.query_drop(format!("GRANT SELECT ON *.* TO '{user}'@'127.0.0.1'"))
        .await
        .unwrap();
    let url = env_var("ONCELY_MARIADB_URL");
    let opts = mysql_async::OptsBuilder::from_opts(Opts::from_url(&url).unwrap())
        .user(Some(user.clone()))
        .pass(Some("pw"));
    let mut weak = Conn::new(opts)
        .await
        .expect("connect as the user without grants");
    let err = ServerFacts::read(&mut weak)
        .await
        .unwrap()
        .check(None)
        .expect_err("missing privileges");
    assert_eq!(
        err.to_string(),
        format!("user {user}@127.0.0.1 lacks REPLICATION SLAVE, REPLICATION CLIENT: run GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}@127.0.0.1")
    );
    weak.disconnect().await.ok();
    root.query_drop(format!("DROP USER '{user}'@'127.0.0.1'"))
        .await
        .unwrap();
}

#[tokio::test]
async fn binlog_is_read_decoded_and_resumed_mid_event_across_a_rotation() {
    let mut root = admin().await;
    let db = unique("oncely_binlog");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!("USE {db}")).await.unwrap();
    root.query_drop("SET SESSION time_zone = '+00:00', SESSION sql_mode = ''")
        .await
        .unwrap();
    root.query_drop(TABLE).await.unwrap();

    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let facts = ServerFacts::read(&mut cap).await.unwrap();
    let start = current_position(&mut cap, facts.flavor, &facts.version)
        .await
        .expect("current position");
    assert!(matches!(start.gtids, Some(Gtids::MariaDb(_))), "{start:?}");

    // tx 1: one row with every type.
    root.query_drop(ROW1).await.unwrap();
    // tx 2: a multi-row insert (one rows event, three rows), an update and a delete.
    root.query_drop("BEGIN").await.unwrap();
    root.query_drop(
        "INSERT INTO every_type (id, bu, dt, ts, zd) VALUES \
         (2, 18446744073709551615, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00'), \
         (3, 0, NULL, NULL, '2000-01-02'), (5, 5, NULL, NULL, '2000-01-05')",
    )
    .await
    .unwrap();
    root.query_drop("UPDATE every_type SET vc = 'changed' WHERE id = 1")
        .await
        .unwrap();
    root.query_drop("DELETE FROM every_type WHERE id = 3")
        .await
        .unwrap();
    root.query_drop("COMMIT").await.unwrap();
    // A rotation, then DDL and a row after it.
    root.query_drop("FLUSH BINARY LOGS").await.unwrap();
    root.query_drop("ALTER TABLE every_type ADD COLUMN extra varchar(10)")
        .await
        .unwrap();
    root.query_drop("INSERT INTO every_type (id, zd, extra) VALUES (4, '2000-01-04', 'new')")
        .await
        .unwrap();

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
    let all = read_until(&mut reader, &db, 4, false).await;
    reader.close().await.ok();
    let got: Vec<String> = all.iter().map(|c| summary(c).0).collect();
    let ddl = "ddl ALTER TABLE every_type ADD COLUMN extra varchar(10)".to_string();
    assert_eq!(
        got,
        [
            "Insert Int(1)",
            "commit",
            "Insert Int(2)",
            "Insert Int(3)",
            "Insert Int(5)",
            "Update Int(1)",
            "Delete Int(3)",
            "commit",
            &ddl,
            "commit",
            "Insert Int(4)",
            "commit",
        ]
    );
    // Positions only grow, across the rotation too; the last two
    // transactions are in the next binlog file.
    for w in all.windows(2) {
        assert!(
            position(&w[0]) < position(&w[1]),
            "{:?} !< {:?}",
            position(&w[0]),
            position(&w[1])
        );
    }
    let last = position(all.last().unwrap());
    assert!(
        last.coordinates().file_sequence().0 == start.coordinates().file_sequence().0 + 1,
        "{last:?} vs {start:?}"
    );
    // The multi-row event: rows 1, 2, 3 of one event; then the next events.
    let tx2: Vec<&Position> = all[2..8].iter().map(position).collect();
    assert_eq!((tx2[0].event, tx2[0].row), (tx2[1].event, 1));
    assert_eq!((tx2[1].row, tx2[2].row), (2, 3));
    assert!(tx2[3].event > tx2[2].event && tx2[4].event > tx2[3].event);
    assert_eq!(
        (tx2[5].event, tx2[5].row),
        (0, 0),
        "a commit is the next transaction's start"
    );
    // A commit's GTID list holds its transaction's GTID (other sessions'
    // transactions may come in between).
    let gtid_of = |p: &Position| match &p.gtids {
        Some(Gtids::MariaDb(l)) => l.get(0).map(|g| g.seq).unwrap_or(0),
        other => panic!("{other:?}"),
    };
    let seq_of = |c: &BinlogChange| match c {
        BinlogChange::Row(r) => r
            .gtid
            .as_deref()
            .and_then(|g| g.rsplit('-').next())
            .and_then(|n| n.parse::<u64>().ok()),
        _ => None,
    };
    assert_eq!(Some(gtid_of(position(&all[1]))), seq_of(&all[0]));
    assert_eq!(Some(gtid_of(position(&all[7]))), seq_of(&all[2]));
    assert!(gtid_of(position(&all[7])) > gtid_of(position(&all[1])));

    // Every type, as Debezium maps it.
    let cfg = MappingConfig::default();
    let BinlogChange::Row(r1) = &all[0] else {
        panic!()
    };
    assert_eq!(image(&cfg, r1, true).unwrap(), row1_json());
    assert!(
        r1.gtid.as_deref().is_some_and(|g| g.starts_with("0-1-")),
        "{:?}",
        r1.gtid
    );
    assert_eq!(r1.table.primary_key, vec![0]);
    let BinlogChange::Row(update) = &all[5] else {
        panic!()
    };
    assert_eq!(
        image(&cfg, update, false).unwrap(),
        row1_json(),
        "FULL before image"
    );
    assert_eq!(image(&cfg, update, true).unwrap()["vc"], json!("changed"));
    // Row 2: BIGINT UNSIGNED max and zero dates.
    let BinlogChange::Row(r2) = &all[2] else {
        panic!()
    };
    assert_eq!(
        image(&cfg, r2, true).unwrap_err(),
        MappingError::UnsignedOverflow { value: u64::MAX }
    );
    let precise = MappingConfig {
        bigint_unsigned: BigintUnsignedHandlingMode::Precise,
        ..cfg
    };
    let v2 = image(&precise, r2, true).unwrap();
    assert_eq!(v2["bu"], json!("AP//////////"));
    assert_eq!(
        (&v2["dt"], &v2["ts"], &v2["zd"]),
        (&Value::Null, &Value::Null, &json!(0)),
        "zero dates: null if nullable, else the epoch"
    );

    // Resume from the middle of the multi-row event (after its first row):
    // exactly the rest, same positions.
    for from in [1usize, 2, 3, 6, 7] {
        let at = position(&all[from]).clone();
        let mut again = BinlogReader::open(
            capture_opts(),
            server_id(),
            facts.flavor,
            &at,
            ResumeBy::FilePosition,
            crate::mysql_binlog::only(&db),
        )
        .await
        .unwrap_or_else(|e| panic!("resume from #{from} {at:?}: {e}"));
        let rest = read_until(&mut again, &db, 4, at.event > 0 || at.row > 0).await;
        again.close().await.ok();
        let want: Vec<_> = all[from + 1..].iter().map(summary).collect();
        let got: Vec<_> = rest.iter().map(summary).collect();
        assert_eq!(got, want, "resume from #{from} {at:?}");
    }
    // After a commit, MariaDB's GTID list finds the same place.
    let at = position(&all[1]).clone();
    let mut by_gtid = BinlogReader::open(
        capture_opts(),
        server_id(),
        facts.flavor,
        &at,
        ResumeBy::MariaDbGtid,
        crate::mysql_binlog::only(&db),
    )
    .await
    .expect("resume by GTID");
    let rest = read_until(&mut by_gtid, &db, 4, false).await;
    by_gtid.close().await.ok();
    let got: Vec<String> = rest.iter().map(|c| summary(c).0).collect();
    let want: Vec<String> = all[2..].iter().map(|c| summary(c).0).collect();
    assert_eq!(got, want);

    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}

/// A restart inside a large transaction: 3000 rows in one statement span
/// several rows events; a resume from the middle of one of them (as after a
/// kill mid-publish) hands out exactly the rows after it, then the commit.
#[tokio::test]
async fn a_resume_inside_a_large_transaction_gives_exactly_the_rest() {
    let mut root = admin().await;
    let db = unique("oncely_large");
    root.query_drop(format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    root.query_drop(format!("USE {db}")).await.unwrap();
    root.query_drop("CREATE TABLE t (id int PRIMARY KEY, pad varchar(100))")
        .await
        .unwrap();
    let mut cap = Conn::new(capture_opts()).await.unwrap();
    let facts = ServerFacts::read(&mut cap).await.unwrap();
    let start = current_position(&mut cap, facts.flavor, &facts.version)
        .await
        .unwrap();
    // MariaDB's sequence engine: one INSERT, one transaction, 3000 rows.
    root.query_drop("INSERT INTO t SELECT seq, REPEAT('x', 100) FROM seq_1_to_3000")
        .await
        .unwrap();
    root.query_drop("INSERT INTO t VALUES (99999, 'last')")
        .await
        .unwrap();

    let mut reader = BinlogReader::open(
        capture_opts(),
        server_id(),
        facts.flavor,
        &start,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await
    .unwrap();
    let all = read_until(&mut reader, &db, 99_999, false).await;
    reader.close().await.ok();
    assert_eq!(
        all.len(),
        3000 + 1 + 2,
        "3000 rows, the marker row, two commits"
    );
    let events: std::collections::BTreeSet<u64> =
        all[..3000].iter().map(|c| position(c).event).collect();
    assert!(
        events.len() > 1,
        "the 3000 rows span several rows events: {events:?}"
    );
    // The middle of the second rows event.
    let second = *events.iter().nth(1).unwrap();
    let from = all
        .iter()
        .position(|c| position(c).event == second && position(c).row == 7)
        .unwrap();
    let at = position(&all[from]).clone();
    let mut again = BinlogReader::open(
        capture_opts(),
        server_id(),
        facts.flavor,
        &at,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await
    .unwrap();
    let rest = read_until(&mut again, &db, 99_999, true).await;
    again.close().await.ok();
    let want: Vec<_> = all[from + 1..].iter().map(summary).collect();
    let got: Vec<_> = rest.iter().map(summary).collect();
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
    root.query_drop(format!("DROP DATABASE {db}"))
        .await
        .unwrap();
}
