//! Filtered snapshots on a MySQL source against the MariaDB of
//! `scripts/services`: an `execute-snapshot` signal with
//! `additional-conditions` re-reads exactly the rows its filter matches
//! (rows changed out of the binlog's sight included), filters the server
//! or the MySQL rules refuse are refused in the log while capture goes on
//! streaming, and a capture killed with the filtered snapshot queued
//! (its filter stored with its progress in the offset) resumes it
//! filtered, each matching row read once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde_json::{json, Value};

use crate::harness::capture::{kill9, read_committed, wait_for, Seen};
use crate::mysql_binlog::admin;
use crate::mysql_capture::MySqlCapture;

const ROWS: i64 = 1000;

/// The test's filter, and the rows it matches (`grp` = `id % 4`, `region`
/// `eu` for multiples of 3, `qty` negated out of the binlog's sight for
/// multiples of 5). The OR inside needs its parentheses kept apart from
/// the composite key's paging (`grp > ? OR (grp = ? AND id > ?)`).
const FILTER: &str = "id > 30 AND (region = 'eu' OR qty < 0)";

fn matches(id: i64) -> bool {
    id > 30 && (id % 3 == 0 || id % 5 == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_snapshot_signal_reads_only_matching_rows_and_resumes_filtered_after_a_kill(
) -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::with_signals(
        "oncely_myfilter",
        &mut root,
        "snapshot.mode = \"no_data\"\nincremental.snapshot.chunk.size = 4\n",
    )
    .await?;
    let db = env.db.clone();
    let result = filtered(&mut root, &env).await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    result
}

async fn filtered(root: &mut Conn, env: &MySqlCapture) -> Result<()> {
    let db = &env.db;
    root.query_drop(format!(
        "CREATE TABLE {db}.stock (grp int, id int, qty int, region varchar(8), PRIMARY KEY (grp, id)); \
         SET SESSION max_recursive_iterations = 100000; \
         INSERT INTO {db}.stock WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) \
         SELECT i % 4, i, i, IF(i % 3 = 0, 'eu', 'us') FROM n"
    ))
    .await?;
    let mut capture = env.start().await?;
    // Out of the binlog's sight: only a snapshot can carry these.
    let mut quiet = admin().await;
    quiet
        .query_drop(format!(
            "SET SESSION sql_log_bin = 0; UPDATE {db}.stock SET qty = -qty WHERE id % 5 = 0"
        ))
        .await?;
    drop(quiet);

    // Refused: a column the server does not know, and a double-quoted
    // name, which MySQL reads as a string (every row would compare false).
    signal(root, db, "bad-column", "no_such_column > 1").await?;
    signal(root, db, "quoted", "\"region\" = 'eu'").await?;
    root.query_drop(format!(
        "INSERT INTO {db}.stock VALUES (0, {new}, 1, 'us')",
        new = ROWS + 4
    ))
    .await?;
    let created = wait_for(&[env.topic("stock")], Duration::from_secs(60), |s| {
        s.iter().any(|r| r.op() == Some("c"))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    ensure!(
        created.iter().all(|r| r.op() == Some("c")),
        "a refused filter snapshotted rows"
    );
    let log = env.log();
    ensure!(
        log.matches("execute-snapshot signal ignored").count() == 2
            && log.contains("Unknown column 'no_such_column'")
            && log.contains("double quote"),
        "both refusals, with their reasons, in the log:\n{log}"
    );

    // The CLI holds its --filter to MySQL's rules before it inserts one.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(&env.config)
        .args([
            "--table",
            &format!("{db}.stock"),
            "--filter",
            "region = 'eu' || qty < 0",
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("'||'"),
        "the CLI refuses MySQL's OR written ||: {stderr}"
    );

    // Queued and paused in one transaction: no chunk is read before the
    // kill, so the filter the restart reads by is the one stored with the
    // snapshot's progress in the offset.
    root.query_drop("BEGIN").await?;
    signal(root, db, "filtered", FILTER).await?;
    root.exec_drop(
        format!("INSERT INTO {db}.signals VALUES ('hold', 'pause-snapshot', NULL)"),
        (),
    )
    .await?;
    root.query_drop("COMMIT").await?;
    wait_log(env, "snapshot paused").await?;
    wait_for(
        std::slice::from_ref(&env.offsets_topic),
        Duration::from_secs(60),
        |s| {
            s.iter().any(|r| {
                let offset = r.value.as_ref().map(Value::to_string).unwrap_or_default();
                offset.contains("\"paused\":true") && offset.contains(FILTER)
            })
        },
    )
    .await?;
    kill9(&mut capture);
    let reads = |s: &[Seen]| s.iter().filter(|r| r.op() == Some("r")).count();
    ensure!(
        reads(&read_committed(&[env.topic("stock")])?) == 0,
        "a paused snapshot read rows"
    );
    let mut capture = env.start().await?;
    root.query_drop(format!(
        "INSERT INTO {db}.signals VALUES ('go', 'resume-snapshot', NULL)"
    ))
    .await?;
    // Killed again once chunks land: mid-snapshot when chunks remain (the
    // next start goes on after the stored last key), else after its end.
    // On an idle server the last chunk usually lands first: the stored
    // key's resume with a filter is the chunk SQL's unit test.
    wait_for(&[env.topic("stock")], Duration::from_secs(60), |s| {
        reads(s) >= 1
    })
    .await?;
    kill9(&mut capture);
    let want: BTreeMap<i64, i64> = (1..=ROWS)
        .filter(|&id| matches(id))
        .map(|id| (id, if id % 5 == 0 { -id } else { id }))
        .collect();

    let _capture = env.start().await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let seen = loop {
        let seen = read_committed(&[env.topic("stock")])?;
        let read = snapshot_rows(&seen);
        if read.len() >= want.len() || Instant::now() > deadline {
            break read;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let ids: BTreeMap<i64, i64> = seen.iter().copied().collect();
    ensure!(
        seen.len() == want.len() && ids == want,
        "{} snapshot rows ({} distinct), {} wanted; unmatched read: {:?}; capture log:\n{}",
        seen.len(),
        ids.len(),
        want.len(),
        ids.keys()
            .filter(|id| !matches(**id))
            .take(5)
            .collect::<Vec<_>>(),
        env.log()
    );
    Ok(())
}

/// Waits until `line` is in the capture log.
async fn wait_log(env: &MySqlCapture, line: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !env.log().contains(line) {
        ensure!(
            Instant::now() < deadline,
            "no {line:?} in the capture log:\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// An incremental `execute-snapshot` signal of `stock` filtered by `filter`.
async fn signal(root: &mut Conn, db: &str, id: &str, filter: &str) -> Result<()> {
    let data = json!({
        "data-collections": [format!("{db}.stock")],
        "type": "incremental",
        "additional-conditions": [{"data-collection": format!("{db}.stock"), "filter": filter}],
    })
    .to_string();
    root.exec_drop(
        format!("INSERT INTO {db}.signals VALUES (?, 'execute-snapshot', ?)"),
        (id, data),
    )
    .await?;
    Ok(())
}

/// `(id, qty)` of every snapshot record, in topic order.
fn snapshot_rows(seen: &[Seen]) -> Vec<(i64, i64)> {
    seen.iter()
        .filter(|r| r.op() == Some("r"))
        .filter_map(|r| {
            let after: &Value = &r.payload()?["after"];
            Some((after["id"].as_i64()?, after["qty"].as_i64()?))
        })
        .collect()
}
