//! `gap.recovery = "snapshot"` with a MySQL/MariaDB capture: a sink whose
//! next records Kafka deleted inserts an `execute-snapshot` signal into the
//! signal table in MariaDB, waits for capture's offset to pass the binlog's
//! end (its order key), and its target ends equal to the source.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::e2e::gap::{delete_all_but_last, wait_until, watermarks};
use crate::harness::common::unique;
use crate::harness::e2e::{summary, Pipeline};
use crate::mysql_binlog::admin;
use crate::mysql_capture::{capture_grantee, mysql_pipeline, SIGNAL_TABLE_COLUMNS};

/// The warehouse sink stopped while rows are deleted, updated and
/// inserted in MariaDB, the topic's oldest records deleted
/// (`delete_records`) past its position: started with
/// `gap.recovery = "snapshot"` and `gap.capture.config` naming the MySQL
/// capture, it removes the rows deleted inside the gap, capture snapshots
/// the table, `oncely verify` ends equal and the sink says the gap is
/// recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gap_is_recovered_by_a_snapshot_from_mariadb() -> Result<()> {
    let mut root = admin().await;
    let db = unique("oncely_mygap");
    root.query_drop(format!(
        "CREATE DATABASE {db}; \
         CREATE TABLE {db}.t (id bigint PRIMARY KEY, v varchar(20)); \
         CREATE TABLE {db}.signals {SIGNAL_TABLE_COLUMNS}"
    ))
    .await?;
    let grantee = capture_grantee().await?;
    root.query_drop(format!("GRANT INSERT ON {db}.signals TO {grantee}"))
        .await?;
    let mut p = mysql_pipeline(
        "mygap",
        &db,
        &["t"],
        &format!(
            "snapshot.mode = \"no_data\"\nsignal.data.collection = \"{db}.signals\"\nincremental.snapshot.chunk.size = 10\n"
        ),
    )
    .await?;
    // One sink: the warehouse.
    p.sinks.truncate(1);
    let result = recover(&mut root, &p, &db).await;
    let _ = root
        .query_drop(format!("REVOKE INSERT ON {db}.signals FROM {grantee}"))
        .await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    p.cleanup().await;
    result
}

async fn insert_rows(
    root: &mut Conn,
    db: &str,
    ids: std::ops::RangeInclusive<i64>,
    v: &str,
) -> Result<()> {
    let values: Vec<String> = ids.map(|i| format!("({i}, '{v}{i}')")).collect();
    root.query_drop(format!("INSERT INTO {db}.t VALUES {}", values.join(", ")))
        .await?;
    Ok(())
}

async fn recover(root: &mut Conn, p: &Pipeline, db: &str) -> Result<()> {
    let topic = p.topics()[0].clone();
    let capture_config = std::fs::canonicalize(&p.capture_config)?;
    p.prepend_sink_runner_keys(
        0,
        &format!(
            "gap.recovery = \"snapshot\"\ngap.capture.config = {:?}",
            capture_config.display().to_string()
        ),
    )?;
    let _capture = p.spawn_capture()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.env.capture_log().contains("binlog stream opening") {
        if Instant::now() > deadline {
            bail!("capture did not open its stream:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sink = p.spawn_sink(0)?;
    insert_rows(root, db, 1..=200, "a").await?;
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "{}", summary(&report));
    drop(sink);

    // Deletes and updates first, so that they are among the records lost.
    root.query_drop(format!(
        "DELETE FROM {db}.t WHERE id <= 20; UPDATE {db}.t SET v = CONCAT('u', id) WHERE id BETWEEN 21 AND 40"
    ))
    .await?;
    insert_rows(root, db, 201..=600, "b").await?;
    wait_until("capture published the 440 changes", || {
        Ok(watermarks(&topic)?.1 >= 640)
    })
    .await?;
    delete_all_but_last(&topic, 100).await?;

    let _sink = p.spawn_sink(0)?;
    let report = p
        .verify_until_equal(Duration::from_secs(180))
        .await
        .with_context(|| format!("sink log:\n{}", p.sink_log(0)))?;
    assert!(
        report.is_equal(),
        "{}\nsink log:\n{}",
        summary(&report),
        p.sink_log(0)
    );
    wait_until("the sink says the gap is recovered", || {
        Ok(p.sink_log(0).contains("gap recovered"))
    })
    .await
    .with_context(|| format!("sink log:\n{}", p.sink_log(0)))?;
    assert!(
        p.sink_log(0).contains("recovering by a snapshot"),
        "{}",
        p.sink_log(0)
    );
    Ok(())
}
