//! MariaDB settings a hostile (or merely different) server may have, which
//! the shared `scripts/services` server must keep as they are: each set
//! GLOBAL on a second MariaDB of the test's own (`Replica::start`, not
//! replicating from anything), and the binlog read there as capture reads
//! it. Skipped, saying so, where `mariadbd` is absent.

use anyhow::{ensure, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder};
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::{BinlogChange, BinlogReader, Cell, ResumeBy, ServerFacts};

use crate::harness::common::unique;
use crate::mysql_binlog::{read_until, server_id, summary};
use crate::mysql_failover::Replica;

/// The cells of column `name` in a row change's after image (before, for
/// a delete).
fn cell<'a>(c: &'a BinlogChange, name: &str) -> Option<&'a Cell> {
    let BinlogChange::Row(r) = c else { return None };
    let img = r.after.as_ref().or(r.before.as_ref())?;
    let i = r.table.columns.iter().position(|col| col.name == name)?;
    img.get(i)
}

/// `log_bin_compress = ON` writes rows events whose row data, and query
/// events whose statement, reach `log_bin_compress_min_len` (256) bytes as
/// MariaDB's compressed event types, which mysql_common does not know:
/// each large insert, update and delete and each long DDL must decode as
/// the plain event would. Then `binlog_checksum = NONE` (events without
/// their CRC32), compressed and plain. On main the compressed events were
/// passed over: rows 2 and 3 and the update and delete never came out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_events_and_no_checksums_decode_as_plain_ones() -> Result<()> {
    let db = unique("oncely_mycompress");
    let server = Replica::start(&db).await?;
    let mut root = server.root().await?;
    root.query_drop("SET GLOBAL log_bin_compress = ON").await?;
    let facts = ServerFacts::read(&mut root).await?;
    let start = current_position(&mut root, facts.flavor, &facts.version).await?;

    let mut w = server.root().await?;
    w.query_drop(format!("CREATE DATABASE {db}")).await?;
    w.query_drop(format!("USE {db}")).await?;
    w.query_drop("CREATE TABLE t (id int PRIMARY KEY, body longtext, note varchar(40))")
        .await?;
    let big = |c: char, n: usize| c.to_string().repeat(n);
    w.exec_drop("INSERT INTO t VALUES (1, 'small', 'a')", ())
        .await?;
    w.exec_drop("INSERT INTO t VALUES (2, ?, 'b')", (big('x', 5000),))
        .await?;
    w.exec_drop("UPDATE t SET body = ? WHERE id = 2", (big('y', 4000),))
        .await?;
    w.query_drop("DELETE FROM t WHERE id = 2").await?;
    let ddl = format!(
        "ALTER TABLE t ADD COLUMN extra varchar(10) COMMENT '{}'",
        big('c', 300)
    );
    w.query_drop(&ddl).await?;
    w.exec_drop("INSERT INTO t VALUES (3, ?, 'c', 'e')", (big('z', 3000),))
        .await?;
    // The server only writes compressed events with the setting on: the
    // test proves nothing without them.
    let file = start.file.clone();
    let kinds: Vec<String> = w
        .exec_map(
            format!("SHOW BINLOG EVENTS IN '{file}' FROM {}", start.pos),
            (),
            |row: mysql_async::Row| row.get::<String, _>("Event_type").unwrap_or_default(),
        )
        .await?;
    for kind in [
        "Query_compressed",
        "Write_rows_compressed_v1",
        "Update_rows_compressed_v1",
        "Delete_rows_compressed_v1",
    ] {
        ensure!(kinds.iter().any(|k| k == kind), "no {kind} in {kinds:?}");
    }
    // Events without checksums from here (the server starts a new binlog).
    root.query_drop("SET GLOBAL binlog_checksum = NONE").await?;
    w.exec_drop("INSERT INTO t VALUES (4, ?, 'd', 'f')", (big('w', 3000),))
        .await?;
    w.query_drop("INSERT INTO t VALUES (5, 'tiny', 'e', 'g')")
        .await?;

    let opts = OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(server.port)
        .user(Some("root"));
    let mut reader = BinlogReader::open(
        Opts::from(opts),
        server_id(),
        facts.flavor,
        &start,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await?;
    let all = read_until(&mut reader, &db, 5, false).await;
    reader.close().await.ok();
    let got: Vec<String> = all.iter().map(|c| summary(c).0).collect();
    let create = "ddl CREATE TABLE t (id int PRIMARY KEY, body longtext, note varchar(40))";
    assert_eq!(
        got,
        [
            &format!("ddl CREATE DATABASE {db}"),
            "commit",
            create,
            "commit",
            "Insert Int(1)",
            "commit",
            "Insert Int(2)",
            "commit",
            "Update Int(2)",
            "commit",
            "Delete Int(2)",
            "commit",
            &format!("ddl {ddl}"),
            "commit",
            "Insert Int(3)",
            "commit",
            "Insert Int(4)",
            "commit",
            "Insert Int(5)",
            "commit",
        ],
        "{}",
        server.error_log()
    );
    let text = |i: usize, col: &str| match cell(&all[i], col) {
        Some(Cell::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    assert_eq!(text(6, "body"), big('x', 5000));
    assert_eq!(text(8, "body"), big('y', 4000));
    let BinlogChange::Row(update) = &all[8] else {
        unreachable!()
    };
    let before = update.before.as_ref().expect("a before image");
    assert_eq!(before[1], Cell::Bytes(big('x', 5000).into_bytes()));
    assert_eq!(text(10, "body"), big('y', 4000));
    assert_eq!(
        (text(14, "body"), text(14, "extra")),
        (big('z', 3000), "e".into())
    );
    assert_eq!(
        (text(16, "body"), text(16, "extra")),
        (big('w', 3000), "f".into())
    );
    assert_eq!(text(18, "body"), "tiny");
    // Positions only grow: each compressed event holds its own place.
    for pair in all.windows(2) {
        assert!(summary(&pair[0]).1 < summary(&pair[1]).1, "{pair:?}");
    }
    Ok(())
}

/// A session that sets `binlog_format = STATEMENT` (a privileged
/// application can) writes its changes as statements, not rows: capture
/// stops naming `binlog_format` and the fix, and never passes over them.
/// On the shared server: the setting is the session's only. On main the
/// statement was handed out as DDL and its rows were lost.
#[tokio::test]
async fn a_session_with_statement_binlog_format_stops_the_stream() -> Result<()> {
    let mut root = crate::mysql_binlog::admin().await;
    let db = unique("oncely_mystmt");
    root.query_drop(format!(
        "CREATE DATABASE {db}; CREATE TABLE {db}.t (id int PRIMARY KEY, v int)"
    ))
    .await?;
    let mut cap = mysql_async::Conn::new(crate::mysql_binlog::capture_opts()).await?;
    let facts = ServerFacts::read(&mut cap).await?;
    let start = current_position(&mut cap, facts.flavor, &facts.version).await?;
    root.query_drop(format!("INSERT INTO {db}.t VALUES (1, 1)"))
        .await?;
    root.query_drop("SET SESSION binlog_format = 'STATEMENT'")
        .await?;
    root.query_drop(format!("UPDATE {db}.t SET v = 2 WHERE id = 1"))
        .await?;
    root.query_drop("SET SESSION binlog_format = 'ROW'").await?;
    let mut reader = BinlogReader::open(
        crate::mysql_binlog::capture_opts(),
        server_id(),
        facts.flavor,
        &start,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(&db),
    )
    .await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let err = loop {
        ensure!(std::time::Instant::now() < deadline, "no stop within 30 s");
        match tokio::time::timeout(std::time::Duration::from_secs(30), reader.next()).await? {
            Ok(Some(BinlogChange::Ddl { query, .. })) if query.contains("UPDATE") => {
                anyhow::bail!("the statement was handed out as DDL: {query}")
            }
            Ok(Some(_)) => continue,
            Ok(None) => anyhow::bail!("the dump ended"),
            Err(e) => break e,
        }
    };
    reader.close().await.ok();
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    let text = err.to_string();
    ensure!(
        text.contains("binlog_format") && text.contains("UPDATE") && text.contains("new snapshot"),
        "{text}"
    );
    Ok(())
}
