//! A table rewrite racing a snapshot chunk. A table-rewriting `ALTER TABLE`
//! is not MVCC-safe: a REPEATABLE READ snapshot taken before it commits sees
//! the rewritten table as empty, and an empty chunk ends that table's
//! snapshot, so every row it had not read yet would be missing from the
//! targets. Here the chunk's snapshot is taken while an `ALTER COLUMN ...
//! TYPE` holds its lock, and the rewrite commits while the chunk's SELECT
//! waits for it: capture must notice (the table's storage file changed
//! under the chunk) and read the chunk again. The schema-change backfill is
//! off, so only the signalled snapshot can bring the rows.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::harness::capture::{wait_for, CaptureEnv};

const ROWS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_committed_under_a_chunk_does_not_end_the_snapshot_early() -> Result<()> {
    let env = CaptureEnv::new("cap_rewrite").await?;
    let result = drive(&env).await;
    if result.is_err() {
        eprintln!("logs in {}", env.dir.display());
    }
    env.cleanup().await;
    result
}

async fn drive(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(&format!(
            "CREATE TABLE rw (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO rw SELECT g, g FROM generate_series(1, {ROWS}) g;
             CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));"
        ))
        .await?;
    let config = env.write_config(
        "capture.toml",
        &env.config(
            "table.include.list = \"public\\\\.rw\"\n\
             signal.data.collection = \"public.oncely_signal\"\n\
             schema.change.backfill = \"off\"\n",
        ),
    )?;
    let _capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    // The rewrite, done but not committed: it holds ACCESS EXCLUSIVE on rw.
    let ddl = env.connect().await?;
    ddl.batch_execute("BEGIN; ALTER TABLE rw ALTER COLUMN v TYPE bigint")
        .await
        .context("rewrite")?;
    env.client
        .batch_execute(
            "INSERT INTO oncely_signal VALUES ('rewrite-1', 'execute-snapshot', '{\"data-collections\": [\"public.rw\"]}')",
        )
        .await?;
    // The chunk's SELECT, its snapshot taken, waits for the rewrite's lock.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let waiting: i64 = env
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'oncely-capture-snapshot'
                   AND wait_event_type = 'Lock'",
                &[],
            )
            .await?
            .get(0);
        if waiting > 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the chunk never waited for the rewrite:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ddl.batch_execute("COMMIT")
        .await
        .context("commit the rewrite")?;

    let topic = env.topic("rw");
    let seen = wait_for(
        std::slice::from_ref(&topic),
        Duration::from_secs(90),
        |seen| {
            seen.iter()
                .filter(|r| {
                    r.value
                        .as_ref()
                        .is_some_and(|v| v["payload"]["op"] == "r" || v["op"] == "r")
                })
                .count()
                >= ROWS
        },
    )
    .await
    .with_context(|| {
        format!(
            "the snapshot did not publish all {ROWS} rows of the rewritten table:\n{}",
            env.capture_log()
        )
    })?;
    let mut ids: Vec<i64> = seen
        .iter()
        .filter_map(|r| r.value.as_ref())
        .filter(|v| v["payload"]["op"] == "r" || v["op"] == "r")
        .filter_map(|v| {
            let after = if v["payload"].is_object() {
                &v["payload"]["after"]
            } else {
                &v["after"]
            };
            after["id"].as_i64()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ensure!(ids.len() == ROWS, "snapshot rows: {ids:?}");
    ensure!(
        env.capture_log().contains("reading the chunk again"),
        "the rewrite went unnoticed:\n{}",
        env.capture_log()
    );
    Ok(())
}
