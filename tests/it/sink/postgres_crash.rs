//! SIGKILL `oncely sink` (postgres) again and again while a real `oncely capture`
//! streams a mixed workload: every target table must end up equal to its source
//! table row for row, and each history table must hold exactly one row per change
//! that Kafka holds for its table.
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;
use tokio_postgres::Client;

use crate::harness::capture::{connect, db_url, kill9, read_committed, terminate, CaptureEnv};
use crate::harness::common;
use crate::harness::runner::{sigkill, sigterm, spawn_runner, wait_exit, write_config};
use crate::harness::sink::{
    captured_source, row_differences, runner_config, source_rows, workload, TABLES,
};

const KILLS: usize = 12;
/// Source transactions: far more than the kills need; the writer is stopped once they are done.
const WORKLOAD: usize = 1_000_000;

/// Live rows of a target table: `id` -> the row without the sink's columns.
async fn target_rows(wh: &Client, table: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let exists: bool = wh
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    if !exists {
        return Ok(BTreeMap::new());
    }
    let rows = wh
        .query(
            &format!(
                "SELECT id::text, (to_jsonb(t) - '__oncely_lsn' - '__oncely_seq' - '__oncely_deleted' \
                 - '__oncely_unavailable')::text FROM {table} t WHERE NOT __oncely_deleted"
            ),
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.get(0), serde_json::from_str(r.get::<_, &str>(1))?)))
        .collect()
}

/// (commit_lsn, event_seq) of every history row of `table`.
async fn history(wh: &Client, table: &str) -> anyhow::Result<Vec<(i64, i64)>> {
    let exists: bool = wh
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    let rows = wh
        .query(
            &format!("SELECT lsn, seq FROM {table} ORDER BY lsn, seq"),
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The sum of the stored positions (0 before the first batch).
async fn stored_positions(wh: &Client) -> anyhow::Result<i64> {
    let exists: bool = wh
        .query_one("SELECT to_regclass('oncely_positions') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let row = wh
        .query_one(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM oncely_positions",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Differences between source and warehouse, empty when they agree.
async fn differences(
    env: &CaptureEnv,
    wh: &Client,
    topics: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let t = topics.to_vec();
    let seen = tokio::task::spawn_blocking(move || read_committed(&t)).await??;
    for table in TABLES {
        let want = source_rows(&env.client, table).await?;
        let got = target_rows(wh, &format!("public_{table}")).await?;
        out.extend(row_differences(table, "target", &want, &got));
        let changes: BTreeSet<(i64, i64)> = seen
            .iter()
            .filter(|s| s.topic == env.topic(table))
            .filter_map(|s| {
                let source = &s.payload()?["source"];
                Some((
                    source["commit_lsn"].as_i64()?,
                    source["event_seq"].as_i64()?,
                ))
            })
            .collect();
        let events = seen
            .iter()
            .filter(|s| s.topic == env.topic(table) && s.value.is_some())
            .count();
        let rows = history(wh, &format!("public_{table}_history")).await?;
        let distinct: BTreeSet<(i64, i64)> = rows.iter().copied().collect();
        if rows.len() != events || distinct != changes {
            out.push(format!(
                "{table}_history: {} rows ({} distinct) for {events} changes in Kafka ({} distinct)",
                rows.len(),
                distinct.len(),
                changes.len()
            ));
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_sink_leaves_every_target_equal_to_its_table() -> anyhow::Result<()> {
    let (env, mut capture, topics) = captured_source("pg_crash").await?;

    let warehouse = format!("{}_wh", env.dbname);
    env.client
        .batch_execute(&format!("CREATE DATABASE {warehouse}"))
        .await?;
    let wh = connect(&db_url(&warehouse)).await?;
    let group = common::unique("pg_crash_g");
    let sink_config = write_config(
        &env.dir,
        "sink",
        &format!(
            "{runner}[sink]\nkind = \"postgres\"\nurl = \"{url}\"\nhistory.enabled = true\n",
            runner = runner_config(&group, &topics, 100, ""),
            url = db_url(&warehouse),
        ),
    );
    let log = env.dir.join("sink.log");

    // Kill only while the source is changing and after the killed runner stored new
    // positions, so that every counted kill lands mid-stream; then stop the writer
    // (an aborted transaction rolls back; the comparison below waits for whatever
    // committed).
    let writer = tokio::spawn(workload(env.connect().await?, WORKLOAD));
    let (mut kills, mut last) = (0, stored_positions(&wh).await?);
    while kills < KILLS {
        let mut sink = spawn_runner(&sink_config, &log);
        let wait = rand::rng().random_range(800..2500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let busy = !writer.is_finished();
        sigkill(&mut sink).await;
        let now = stored_positions(&wh).await?;
        if busy && now > last {
            kills += 1;
        }
        last = now;
        anyhow::ensure!(
            busy,
            "the workload ended after only {kills} mid-stream kills: raise WORKLOAD"
        );
    }
    writer.abort();
    match writer.await {
        Ok(result) => result?,
        Err(e) if e.is_cancelled() => {}
        Err(e) => return Err(e.into()),
    }

    let mut sink = spawn_runner(&sink_config, &log);
    let deadline = Instant::now() + Duration::from_secs(180);
    // No early return until the last runner is reaped.
    let diff = loop {
        let diff = differences(&env, &wh, &topics)
            .await
            .unwrap_or_else(|e| vec![format!("cannot compare: {e:#}")]);
        if diff.is_empty() || Instant::now() > deadline {
            break diff;
        }
        if let Ok(Some(status)) = sink.try_wait() {
            break vec![format!("the last sink exited with {status}")];
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    };
    sigterm(&sink);
    let status = wait_exit(&mut sink, Duration::from_secs(30)).await;
    if terminate(&mut capture, Duration::from_secs(30)).is_err() {
        kill9(&mut capture);
    }
    assert!(
        diff.is_empty(),
        "the warehouse differs from the source after {kills} kills: {diff:#?}\nlog: {}",
        log.display()
    );
    assert!(status.success(), "graceful stop exits 0, got {status}");
    assert!(kills >= KILLS);
    drop(wh);
    env.client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {warehouse} WITH (FORCE)"))
        .await?;
    env.cleanup().await;
    Ok(())
}
