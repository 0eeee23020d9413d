//! Chunked snapshots against real PostgreSQL and Kafka: a snapshot under a
//! concurrent writer folds to the table; SIGKILLs during a snapshot resume at
//! the next chunk without publishing a committed chunk twice; each
//! `snapshot.mode` with and without a stored offset; signals; a column
//! dropped and added again between two passes is numbered anew.
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rand::Rng;
use serde_json::Value;

use crate::harness::capture;
use crate::harness::capture::{
    kill9, read_committed, terminate, wait_for, CaptureEnv, Seen, Spawned,
};

/// `(commit_lsn, event_seq)` of an event: the version sinks order rows by.
fn version(s: &Seen) -> Option<(u64, u64)> {
    let src = &s.payload()?["source"];
    Some((src["commit_lsn"].as_u64()?, src["event_seq"].as_u64()?))
}

/// The latest event per key by version (tombstones carry no version and are
/// skipped): `Some(after)` for a live row, `None` for a deleted one.
fn fold(seen: &[Seen]) -> HashMap<String, Option<Value>> {
    let mut latest: HashMap<String, ((u64, u64), Option<Value>)> = HashMap::new();
    for s in seen {
        let (Some(key), Some(v)) = (s.key_payload(), version(s)) else {
            continue;
        };
        let after = s
            .payload()
            .map(|p| p["after"].clone())
            .filter(|a| !a.is_null());
        let entry = latest.entry(key.to_string()).or_insert((v, after.clone()));
        if v >= entry.0 {
            *entry = (v, after);
        }
    }
    latest.into_iter().map(|(k, (_, a))| (k, a)).collect()
}

fn snapshot_reads(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.op() == Some("r")).collect()
}

/// Waits until Kafka holds every change committed so far: the slot is
/// confirmed (only ever up to committed offsets) past the current WAL end.
async fn wait_caught_up(env: &CaptureEnv) -> Result<()> {
    let row = env
        .client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?;
    let target = row.get::<_, i64>(0) as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while env.confirmed_flush().await? < target {
        if Instant::now() > deadline {
            bail!("capture did not catch up; log:\n{}", env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn wait_log(env: &CaptureEnv, needle: &str, times: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while env.capture_log().matches(needle).count() < times {
        if Instant::now() > deadline {
            bail!(
                "log never said {needle:?} {times} time(s); log:\n{}",
                env.capture_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_under_a_concurrent_writer_folds_to_the_table() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_writer").await?;
    // Clean up whatever the outcome: leaked slots pin WAL and use up max_replication_slots.
    let result = snapshot_under_a_concurrent_writer_folds_to_the_table_body(&env).await;
    env.cleanup().await;
    result
}

async fn snapshot_under_a_concurrent_writer_folds_to_the_table_body(
    env: &CaptureEnv,
) -> Result<()> {
    const ROWS: i32 = 200_000;
    // A composite, partly non-integer key: chunks page by row comparison.
    env.client
        .batch_execute(&format!(
            "CREATE TABLE items (tenant text, id int, val int NOT NULL, note text, PRIMARY KEY (tenant, id));
             INSERT INTO items SELECT 't' || (g % 7), g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g;
             ANALYZE items;"
        ))
        .await?;
    let config = env.write_config(
        "capture.toml",
        &env.config(
            "snapshot.mode = \"initial\"\nschemas.enable = false\nincremental.snapshot.chunk.size = 4000\n\
             batch.max.ms = 50\nheartbeat.interval.ms = 300\n",
        ),
    )?;
    let _capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let client = env.connect().await?;
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut next_id = ROWS + 1;
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (a, b, c) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(1..=ROWS),
                        rng.random_range(1..=ROWS),
                        rng.random_range(0..3),
                    )
                };
                let sql = match c {
                    0 => format!("UPDATE items SET val = val + 1, note = 'w{ops}' WHERE tenant = 't' || ({a} % 7) AND id = {a}; UPDATE items SET val = val + 10 WHERE tenant = 't' || ({b} % 7) AND id = {b}"),
                    1 => format!("DELETE FROM items WHERE tenant = 't' || ({a} % 7) AND id = {a}"),
                    _ => {
                        next_id += 1;
                        format!("INSERT INTO items VALUES ('t' || ({a} % 7), {next_id}, 1, 'new')")
                    }
                };
                client
                    .batch_execute(&format!("BEGIN; {sql}; COMMIT"))
                    .await?;
                ops += 1;
                if ops.is_multiple_of(20) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            anyhow::Ok(ops)
        })
    };
    let snapshot_done = wait_log(env, "snapshot complete", 1, Duration::from_secs(600)).await;
    stop.store(true, Ordering::Relaxed);
    let ops = writer.await??;
    snapshot_done?;
    ensure!(ops > 100, "the writer ran only {ops} transactions");
    wait_caught_up(env).await?;

    let topic = env.topic("items");
    let seen = tokio::task::spawn_blocking(move || read_committed(&[topic])).await??;
    let reads = snapshot_reads(&seen);
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for r in &reads {
        *per_key
            .entry(r.key_payload().map(Value::to_string).unwrap_or_default())
            .or_default() += 1;
        let marker = r.payload().unwrap()["source"]["snapshot"]
            .as_str()
            .unwrap_or_default();
        ensure!(
            marker == "true" || marker == "last",
            "snapshot marker {marker:?}"
        );
    }
    ensure!(per_key.values().all(|n| *n == 1), "a row was read twice");
    // Rows the writer inserts during the snapshot land in later chunks too, so the
    // snapshot may read more rows than the table started with.
    eprintln!(
        "{} snapshot rows of {ROWS} at the start, {ops} writer transactions",
        reads.len()
    );

    let folded: BTreeMap<String, Value> = fold(&seen)
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let rows = env
        .client
        .query("SELECT tenant, id, val, note FROM items", &[])
        .await?;
    let table: BTreeMap<String, Value> = rows
        .iter()
        .map(|r| {
            let (tenant, id): (String, i32) = (r.get(0), r.get(1));
            let key = serde_json::json!({"tenant": tenant, "id": id}).to_string();
            let row = serde_json::json!({"tenant": tenant, "id": id, "val": r.get::<_, i32>(2), "note": r.get::<_, Option<String>>(3)});
            (key, row)
        })
        .collect();
    ensure!(
        folded.len() == table.len(),
        "folded topic has {} rows, the table {}",
        folded.len(),
        table.len()
    );
    for (key, row) in &table {
        ensure!(
            folded.get(key) == Some(row),
            "row {key}: table {row}, topic {:?}",
            folded.get(key)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_snapshot_resumes_at_the_next_chunk() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_kill").await?;
    // Clean up whatever the outcome: leaked slots pin WAL and use up max_replication_slots.
    let result = sigkill_during_a_snapshot_resumes_at_the_next_chunk_body(&env).await;
    env.cleanup().await;
    result
}

async fn sigkill_during_a_snapshot_resumes_at_the_next_chunk_body(env: &CaptureEnv) -> Result<()> {
    const ROWS: usize = 100_000;
    const KILLS: usize = 6;
    env.client
        .batch_execute(&format!(
            "CREATE TABLE docs (k text PRIMARY KEY, body text);
             INSERT INTO docs SELECT md5(g::text), repeat('x', g % 50) FROM generate_series(1, {ROWS}) g;"
        ))
        .await?;
    let config = env.write_config(
        "capture.toml",
        &env.config(
            "snapshot.mode = \"initial\"\nschemas.enable = false\nincremental.snapshot.chunk.size = 10\n\
             batch.max.ms = 50\n",
        ),
    )?;
    // A read_committed reader cannot see to the end of a topic while
    // capture keeps a transaction open, so kills come at random moments and
    // progress is read from what each start says it resumes from.
    for _ in 0..KILLS {
        // No slot before the first start.
        let confirmed = env.confirmed_flush().await.unwrap_or(0);
        let mut capture = env.spawn_capture(&config)?;
        env.wait_slot_active().await?;
        // The slot is confirmed only after a Kafka commit. The first one of
        // a life may be the start-up heartbeat; the second carries a chunk.
        // Then let it run a little more, and kill it.
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut last = confirmed;
        let mut commits = 0;
        while commits < 2 {
            ensure!(
                Instant::now() < deadline,
                "no chunk committed after a restart; log:\n{}",
                env.capture_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = env.confirmed_flush().await?;
            if now > last {
                commits += 1;
                last = now;
            }
        }
        let pause = rand::rng().random_range(200..700);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        kill9(&mut capture);
    }
    ensure!(
        !env.capture_log().contains("snapshot complete"),
        "the snapshot finished before the last kill: make it slower"
    );
    let _capture: Spawned = env.spawn_capture(&config)?;
    wait_log(env, "snapshot complete", 1, Duration::from_secs(300)).await?;
    // Each life committed chunks, and the next resumed after them.
    let resumed: Vec<u64> = env
        .capture_log()
        .lines()
        .filter(|l| l.contains("capture starting"))
        .map(|l| {
            l.split("snapshot_rows_done=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    eprintln!("snapshot rows done at each start: {resumed:?}");
    ensure!(
        resumed.len() == KILLS + 1,
        "{} starts logged",
        resumed.len()
    );
    ensure!(
        resumed.windows(2).all(|w| w[0] < w[1]),
        "a life committed no chunk, or a start went back: {resumed:?}"
    );
    let seen = wait_for(&[env.topic("docs")], Duration::from_secs(240), |s| {
        snapshot_reads(s).len() >= ROWS
    })
    .await?;
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for r in snapshot_reads(&seen) {
        *per_key
            .entry(r.key_payload().map(Value::to_string).unwrap_or_default())
            .or_default() += 1;
    }
    let twice = per_key.values().filter(|n| **n > 1).count();
    ensure!(
        twice == 0,
        "{twice} rows were published by more than one committed chunk"
    );
    ensure!(
        per_key.len() == ROWS,
        "{} of {ROWS} rows published",
        per_key.len()
    );
    Ok(())
}

/// Another connector on the test database.
struct Connector {
    prefix: String,
    slot: String,
    offsets: String,
}

impl Connector {
    fn new(env: &CaptureEnv, tag: &str) -> Self {
        Connector {
            prefix: format!("{}-{tag}", env.prefix),
            slot: format!("{}_{tag}", env.slot),
            offsets: format!("{}-{tag}-offsets", env.prefix),
        }
    }

    fn topic(&self) -> String {
        format!("{}.public.t", self.prefix)
    }

    fn config(&self, env: &CaptureEnv, mode: &str) -> Result<std::path::PathBuf> {
        let text = env.config_as(
            &self.prefix,
            &self.slot,
            &self.offsets,
            &format!(
                "snapshot.mode = \"{mode}\"\nschemas.enable = false\nbatch.max.ms = 20\nheartbeat.interval.ms = 300\ntable.include.list = \"public.t\"\n"
            ),
        );
        env.write_config(&format!("{}-{mode}.toml", self.prefix), &text)
    }

    fn reads(&self) -> Result<Vec<i64>> {
        let seen = read_committed(&[self.topic()])?;
        let mut ids: Vec<i64> = snapshot_reads(&seen)
            .iter()
            .filter_map(|s| s.key_payload()?["id"].as_i64())
            .collect();
        ids.sort();
        Ok(ids)
    }
}

/// Starts capture, waits until the topic's snapshot rows are `reads`,
/// inserts row `id` and waits for its create event, stops capture with
/// SIGTERM, and checks no other snapshot row appeared.
async fn stream_one(
    env: &CaptureEnv,
    c: &Connector,
    mode: &str,
    id: i64,
    reads: Vec<i64>,
) -> Result<()> {
    let mut capture = env.spawn_capture(&c.config(env, mode)?)?;
    wait_active(env, &c.slot).await?;
    wait_reads(c, reads.clone()).await?;
    env.client
        .execute("INSERT INTO t VALUES ($1, 'streamed')", &[&id])
        .await?;
    // Generous: every walsender decodes the whole cluster's WAL, and the
    // other snapshot tests write a lot of it.
    wait_for(&[c.topic()], Duration::from_secs(240), |s| {
        s.iter()
            .any(|r| r.op() == Some("c") && r.key_payload().is_some_and(|k| k["id"] == id))
    })
    .await?;
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    ensure!(status.success(), "capture ({mode}) exited with {status}");
    ensure!(
        c.reads()? == reads,
        "{mode}: snapshot rows {:?}, expected {reads:?}",
        c.reads()?
    );
    Ok(())
}

/// Runs a capture that is expected to exit by itself, returning its status.
async fn run_to_exit(
    env: &CaptureEnv,
    c: &Connector,
    mode: &str,
) -> Result<std::process::ExitStatus> {
    let mut capture = env.spawn_capture(&c.config(env, mode)?)?;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(status) = capture.try_wait()? {
            return Ok(status);
        }
        ensure!(
            Instant::now() < deadline,
            "capture ({mode}) did not exit; log:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_active(env: &CaptureEnv, slot: &str) -> Result<()> {
    for _ in 0..300 {
        let row = env.client.query_opt(capture::ACTIVE_SLOT, &[&slot]).await?;
        if row.map(|r| r.get::<_, bool>(0)).unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "slot {slot} never became active; log:\n{}",
        env.capture_log()
    )
}

async fn wait_reads(c: &Connector, want: Vec<i64>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let got = c.reads()?;
        if got == want {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "snapshot rows {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_snapshot_mode_with_and_without_a_stored_offset() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_modes").await?;
    // Clean up whatever the outcome: leaked slots pin WAL and use up max_replication_slots.
    let result = each_snapshot_mode_with_and_without_a_stored_offset_body(&env).await;
    env.cleanup().await;
    result
}

async fn each_snapshot_mode_with_and_without_a_stored_offset_body(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, v text); INSERT INTO t SELECT g, 'seed' FROM generate_series(1, 3) g;")
        .await?;
    let ids = |n: i64| (1..=n).collect::<Vec<_>>();

    // One connector through the modes, with a stored offset after its first run.
    let a = Connector::new(env, "a");
    stream_one(env, &a, "no_data", 4, vec![]).await?;
    stream_one(env, &a, "initial", 5, vec![]).await?;
    let status = run_to_exit(env, &a, "initial_only").await?;
    ensure!(
        status.success(),
        "initial_only with nothing to do exited with {status}"
    );
    ensure!(
        a.reads()?.is_empty(),
        "initial_only snapshotted despite a stored offset"
    );
    stream_one(env, &a, "always", 6, ids(5)).await?;
    stream_one(env, &a, "when_needed", 7, ids(5)).await?;

    // The stored position is gone: the slot is recreated ahead of it.
    env.drop_slot(&a.slot).await;
    let status = run_to_exit(env, &a, "initial").await?;
    ensure!(!status.success(), "initial started across a gap");
    ensure!(
        env.capture_log().contains("start once with snapshot.mode"),
        "the gap error does not point at when_needed; log:\n{}",
        env.capture_log()
    );
    let mut twice = ids(5);
    twice.extend(ids(7));
    twice.sort();
    stream_one(env, &a, "when_needed", 8, twice).await?;

    // Fresh connectors: no stored offset.
    let b = Connector::new(env, "b");
    stream_one(env, &b, "initial", 9, ids(8)).await?;
    env.drop_slot(&b.slot).await;
    let c = Connector::new(env, "c");
    let status = run_to_exit(env, &c, "initial_only").await?;
    ensure!(status.success(), "initial_only exited with {status}");
    ensure!(c.reads()? == ids(9), "initial_only read {:?}", c.reads()?);
    env.drop_slot(&c.slot).await;
    let d = Connector::new(env, "d");
    stream_one(env, &d, "when_needed", 10, ids(9)).await?;
    env.drop_slot(&d.slot).await;
    let e = Connector::new(env, "e");
    stream_one(env, &e, "always", 11, ids(10)).await?;
    env.drop_slot(&e.slot).await;
    let f = Connector::new(env, "f");
    stream_one(env, &f, "no_data", 12, vec![]).await?;
    env.drop_slot(&f.slot).await;
    Ok(())
}

fn cli_signal(config: &std::path::Path, args: &[&str]) -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(config)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "oncely capture snapshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_snapshot_tables_added_later() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_signal").await?;
    // Clean up whatever the outcome: leaked slots pin WAL and use up max_replication_slots.
    let result = signals_snapshot_tables_added_later_body(&env).await;
    env.cleanup().await;
    result
}

async fn signals_snapshot_tables_added_later_body(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a SELECT generate_series(1, 10);
             CREATE TABLE b (id int PRIMARY KEY, v text); INSERT INTO b SELECT g, 'b' FROM generate_series(1, 30) g;
             CREATE TABLE c (id int PRIMARY KEY); INSERT INTO c SELECT generate_series(1, 50);
             CREATE TABLE signals (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));",
        )
        .await?;
    let config_for = |include: &str, extra: &str| {
        env.config(&format!(
            "snapshot.mode = \"initial\"\nschemas.enable = false\nbatch.max.ms = 20\nincremental.snapshot.chunk.size = 10\n\
             signal.data.collection = \"public.signals\"\ntable.include.list = \"{include}\"\n{extra}"
        ))
    };
    let reads = |table: &str| -> Result<Vec<Seen>> {
        let seen = read_committed(&[env.topic(table)])?;
        Ok(seen.into_iter().filter(|s| s.op() == Some("r")).collect())
    };
    let wait_count = |table: &'static str, n: usize| {
        let topic = env.topic(table);
        async move {
            wait_for(&[topic], Duration::from_secs(240), |s| {
                s.iter().filter(|r| r.op() == Some("r")).count() == n
            })
            .await
        }
    };

    // First run captures only `a`: its initial snapshot.
    let first = env.write_config("first.toml", &config_for("public\\\\.a", ""))?;
    let mut capture = env.spawn_capture(&first)?;
    env.wait_slot_active().await?;
    wait_count("a", 10).await?;
    terminate(&mut capture, Duration::from_secs(30))?;

    // `b` joins the include list; a stored offset exists, so no snapshot
    // until a signal asks for one.
    let second = env.write_config("second.toml", &config_for("public\\\\.(a|b|keyless)", ""))?;
    let mut capture = env.spawn_capture(&second)?;
    env.wait_slot_active().await?;
    // Created after start (start-up refuses captured tables without a key).
    env.client
        .batch_execute(
            "CREATE TABLE keyless (v int);
             INSERT INTO signals VALUES ('bad-json', 'execute-snapshot', '{nope');
             INSERT INTO signals VALUES ('unknown', 'execute-snapshot', '{\"data-collections\": [\"public.nope\"]}');
             INSERT INTO signals VALUES ('not-captured', 'execute-snapshot', '{\"data-collections\": [\"public.c\"]}');
             INSERT INTO signals VALUES ('no-key', 'execute-snapshot', '{\"data-collections\": [\"public.keyless\"]}');
             INSERT INTO signals VALUES ('bad-filter', 'execute-snapshot', '{\"data-collections\": [\"public.b\"], \"additional-conditions\": [{\"data-collection\": \"public.b\", \"filter\": \"no_such_column > 1\"}]}');",
        )
        .await?;
    wait_log(env, "signal ignored", 5, Duration::from_secs(240)).await?;
    let log = env.capture_log();
    for why in [
        "not JSON",
        "does not exist",
        "not captured",
        "no primary key",
        "does not work",
    ] {
        ensure!(log.contains(why), "no reason {why:?} in the log:\n{log}");
    }
    ensure!(reads("b")?.is_empty(), "an ignored signal snapshotted b");
    cli_signal(&second, &["--table", "public.b"])?;
    wait_count("b", 30).await?;
    ensure!(
        reads("b")?
            .iter()
            .all(|r| r.payload().unwrap()["source"]["snapshot"] == "incremental"),
        "signal snapshot rows are not marked incremental"
    );
    // A filtered snapshot of b, then pause right behind it in the same
    // transaction: the chunks in flight (read ahead) are abandoned, so no
    // row lands until resumed.
    env.client
        .batch_execute(
            "BEGIN;
             INSERT INTO signals VALUES ('again', 'execute-snapshot', '{\"data-collections\": [\"public.b\"], \"additional-conditions\": [{\"data-collection\": \"public.b\", \"filter\": \"id > 5\"}]}');
             INSERT INTO signals VALUES ('hold', 'pause-snapshot', NULL);
             COMMIT;",
        )
        .await?;
    wait_log(env, "snapshot paused", 1, Duration::from_secs(240)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during_pause = reads("b")?.len();
    ensure!(
        during_pause == 30,
        "{during_pause} rows of b while paused (30 before it)"
    );
    cli_signal(&second, &["--resume"])?;
    wait_count("b", 30 + 25).await?;
    terminate(&mut capture, Duration::from_secs(30))?;

    // `c` joins with snapshot.new.tables: snapshotted on start.
    let third = env.write_config(
        "third.toml",
        &config_for("public\\\\.(a|b|c)", "snapshot.new.tables = true\n"),
    )?;
    let _capture = env.spawn_capture(&third)?;
    env.wait_slot_active().await?;
    wait_count("c", 50).await?;
    ensure!(reads("a")?.len() == 10, "a was snapshotted again");
    Ok(())
}

/// A column dropped and added again under its name and type between two
/// snapshot passes of a table in one capture process: the second pass's
/// chunks have the first's shape, but their `c` is another column (attnum
/// 3, not the dropped 2), which sinks match columns by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_dropped_and_added_again_between_two_snapshot_passes_is_numbered_anew(
) -> Result<()> {
    let env = CaptureEnv::new("cap_snap_readd").await?;
    let result = column_added_again_body(&env).await;
    env.cleanup().await;
    result
}

async fn column_added_again_body(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, c int); INSERT INTO t VALUES (1, 1), (2, 2), (3, 3);
             CREATE TABLE signals (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));",
        )
        .await?;
    let config = env.write_config(
        "capture.toml",
        &env.config(
            "snapshot.mode = \"initial\"\nbatch.max.ms = 20\nincremental.snapshot.chunk.size = 2\n\
             signal.data.collection = \"public.signals\"\ntable.include.list = \"public\\\\.t\"\n\
             schema.change.backfill = \"off\"\nheartbeat.interval.ms = 300\n",
        ),
    )?;
    let _capture = env.spawn_capture(&config)?;
    let reads = |n: usize| {
        let topic = env.topic("t");
        async move {
            wait_for(&[topic], Duration::from_secs(120), |s| {
                s.iter().filter(|r| r.op() == Some("r")).count() >= n
            })
            .await
        }
    };
    let first = reads(3).await?;
    let numbers: Vec<_> = first.iter().map(|r| r.after_attnum("c")).collect();
    ensure!(
        numbers == vec![Some("2".to_owned()); 3],
        "the first pass: {numbers:?}"
    );
    env.client
        .batch_execute("ALTER TABLE t DROP c; ALTER TABLE t ADD c int")
        .await?;
    // The schema watch has published the change (at a heartbeat): the
    // columns last published, which the catalog's numbers are matched
    // against by name, are the new ones.
    wait_log(
        env,
        "schema change table=public.t",
        1,
        Duration::from_secs(60),
    )
    .await?;
    env.client
        .batch_execute(
            "INSERT INTO signals VALUES ('again', 'execute-snapshot', '{\"data-collections\": [\"public.t\"]}')",
        )
        .await?;
    // A row's records are in one partition, in order.
    let mut numbers: BTreeMap<i64, Vec<(i64, Option<String>)>> = BTreeMap::new();
    for r in snapshot_reads(&reads(6).await?) {
        let id = r
            .payload()
            .and_then(|p| p["after"]["id"].as_i64())
            .unwrap_or(0);
        numbers
            .entry(id)
            .or_default()
            .push((r.offset, r.after_attnum("c")));
    }
    let both = vec![Some("2".to_owned()), Some("3".to_owned())];
    for (id, mut seen) in numbers.clone() {
        seen.sort();
        let seen: Vec<_> = seen.into_iter().map(|(_, n)| n).collect();
        ensure!(
            seen == both,
            "row {id}'s second read names the column added again (3), not the dropped one (2): \
             {seen:?}; capture log:\n{}",
            env.capture_log()
        );
    }
    ensure!(numbers.len() == 3, "rows read: {numbers:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signalled_filters_that_call_server_functions_are_refused() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_filter_fn").await?;
    let result = signalled_filters_that_call_server_functions_are_refused_body(&env).await;
    env.cleanup().await;
    result
}

async fn signalled_filters_that_call_server_functions_are_refused_body(
    env: &CaptureEnv,
) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g;
             CREATE TABLE signals (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
             -- Objects anyone with CREATE on a schema of capture's search_path
             -- can make: an allowlisted function name and an operator that
             -- match a filter's arguments better than the built-in ones.
             CREATE FUNCTION public.length(integer) RETURNS integer LANGUAGE sql AS 'SELECT 100';
             CREATE FUNCTION public.int_eq_numeric(integer, numeric) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR public.= (LEFTARG = integer, RIGHTARG = numeric, FUNCTION = public.int_eq_numeric);",
        )
        .await?;
    let config = env.write_config(
        "c.toml",
        &env.config(
            "snapshot.mode = \"no_data\"\nschemas.enable = false\nbatch.max.ms = 20\n\
             signal.data.collection = \"public.signals\"\ntable.include.list = \"public\\\\.t\"\n",
        ),
    )?;
    let _capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let signal = |id: &'static str, filter: &'static str| async move {
        let data = serde_json::json!({
            "data-collections": ["public.t"],
            "additional-conditions": [{"data-collection": "public.t", "filter": filter}],
        })
        .to_string();
        env.client
            .execute(
                "INSERT INTO signals VALUES ($1, 'execute-snapshot', $2)",
                &[&id, &data],
            )
            .await
    };
    // Both are boolean expressions of the table's rows that the server
    // prepares without complaint; running them would sleep per row and read a
    // server file as the capture role.
    signal("sleep", "pg_sleep(0.01)::text = ''").await?;
    signal("read", "length(pg_read_file('postmaster.pid')) > 0").await?;
    // Allowed constructs that the default search_path would resolve to the
    // objects above (every row would match): resolved among the built-in
    // ones only, the first has no function to call and the second matches
    // no row.
    signal("shadowed-function", "length(id) = 100").await?;
    signal("shadowed-operator", "id = 1.5").await?;
    wait_log(env, "signal ignored", 3, Duration::from_secs(60)).await?;
    // A table is snapshotted once at a time: the next signal's must not
    // find this one's still running.
    wait_log(env, "snapshot complete", 1, Duration::from_secs(60)).await?;
    // An ordinary filter still snapshots, and only its rows land: no chunk
    // of the refused signals ran.
    signal("ok", "id > 7").await?;
    let topic = env.topic("t");
    wait_for(
        std::slice::from_ref(&topic),
        Duration::from_secs(120),
        |s| s.iter().filter(|r| r.op() == Some("r")).count() >= 3,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reads = read_committed(&[topic])?
        .into_iter()
        .filter(|s| s.op() == Some("r"))
        .count();
    ensure!(
        reads == 3,
        "{reads} snapshot rows of t (3 from `id > 7`, none from a filter resolved to a user's function or operator)"
    );
    let log = env.capture_log();
    for construct in ["pg_sleep", "pg_read_file"] {
        ensure!(
            log.contains(construct),
            "the log does not name {construct}:\n{log}"
        );
    }
    ensure!(
        !log.contains("postmaster.pid"),
        "the log holds a refused filter's values:\n{log}"
    );
    Ok(())
}
