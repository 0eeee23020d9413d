//! Capture under faults, against real PostgreSQL and Kafka: SIGKILL at
//! random moments, restarts at a transaction boundary, a recreated slot, a
//! second instance, an idle slot beside a busy database.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rand::Rng;

use crate::harness::capture::{kill9, read_committed, terminate, wait_for, CaptureEnv, Seen};

/// One source change as the writer committed it: (table, id, op, rev).
type Change = (String, i64, char, i64);

fn change_of(s: &Seen) -> Option<Change> {
    let p = s.payload()?;
    let table = p["source"]["table"].as_str()?.to_string();
    let op = p["op"].as_str()?.chars().next()?;
    let row = if op == 'd' { &p["before"] } else { &p["after"] };
    let id = row["id"].as_i64()?;
    let rev = if op == 'd' {
        0
    } else {
        row["rev"].as_i64().unwrap_or(0)
    };
    Some((table, id, op, rev))
}

/// Mixed workload: hot keys, multi-row and multi-table transactions, deletes,
/// TOAST-unchanged updates and one transaction larger than a batch. Returns
/// every change it committed.
async fn workload(c: tokio_postgres::Client, transactions: usize) -> anyhow::Result<Vec<Change>> {
    let mut log: Vec<Change> = Vec::new();
    let mut next_id: i64 = 100;
    let mut live: Vec<i64> = Vec::new();
    for n in 0..transactions {
        let pick: u32 = rand::rng().random_range(0..100);
        if n % 150 == 75 {
            // Larger than batch.max.events: spans several Kafka transactions,
            // so kills often land inside one.
            let rows = c
                .query(
                    "INSERT INTO audit (acct, rev) SELECT g, 0 FROM generate_series(1, 1200) g RETURNING id",
                    &[],
                )
                .await?;
            log.extend(
                rows.iter()
                    .map(|r| ("audit".to_string(), r.get::<_, i64>(0), 'c', 0)),
            );
            continue;
        }
        match pick {
            0..=24 => {
                let id = next_id;
                next_id += 1;
                c.execute(
                    "INSERT INTO acct (id, rev, note) VALUES ($1, 0, 'n')",
                    &[&id],
                )
                .await?;
                live.push(id);
                log.push(("acct".into(), id, 'c', 0));
            }
            25..=54 => {
                // Hot keys 1..=5.
                let id: i64 = rand::rng().random_range(1..=5);
                let row = c
                    .query_one(
                        "UPDATE acct SET rev = rev + 1 WHERE id = $1 RETURNING rev",
                        &[&id],
                    )
                    .await?;
                log.push(("acct".into(), id, 'u', row.get::<_, i64>(0)));
            }
            55..=69 => {
                // Multi-table transaction.
                let id: i64 = rand::rng().random_range(1..=5);
                let rows = c
                    .query(
                        "WITH u AS (UPDATE acct SET rev = rev + 1 WHERE id = $1 RETURNING id, rev)
                         INSERT INTO audit (acct, rev) SELECT id, rev FROM u RETURNING id, rev",
                        &[&id],
                    )
                    .await?;
                for r in rows {
                    log.push(("acct".into(), id, 'u', r.get::<_, i64>(1)));
                    log.push(("audit".into(), r.get::<_, i64>(0), 'c', r.get::<_, i64>(1)));
                }
            }
            70..=79 => {
                // Multi-row update.
                let rows = c
                    .query(
                        "UPDATE acct SET rev = rev + 1 WHERE id <= 5 RETURNING id, rev",
                        &[],
                    )
                    .await?;
                for r in rows {
                    log.push(("acct".into(), r.get::<_, i64>(0), 'u', r.get::<_, i64>(1)));
                }
            }
            80..=89 => {
                if let Some(id) = live.pop() {
                    c.execute("DELETE FROM acct WHERE id = $1", &[&id]).await?;
                    log.push(("acct".into(), id, 'd', 0));
                }
            }
            _ => {
                // The TOASTed body stays unchanged.
                let id: i64 = rand::rng().random_range(1..=3);
                let row = c
                    .query_one(
                        "UPDATE docs SET rev = rev + 1 WHERE id = $1 RETURNING rev",
                        &[&id],
                    )
                    .await?;
                log.push(("docs".into(), id, 'u', row.get::<_, i64>(0)));
            }
        }
        if n % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    Ok(log)
}

const SCHEMA: &str = "CREATE TABLE acct (id bigint PRIMARY KEY, rev bigint NOT NULL, note text);
     CREATE TABLE audit (id bigserial PRIMARY KEY, acct bigint, rev bigint);
     CREATE TABLE docs (id bigint PRIMARY KEY, rev bigint NOT NULL, body text);
     ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
     INSERT INTO acct SELECT g, 0, 'seed' FROM generate_series(1, 5) g;
     INSERT INTO docs SELECT g, 0, repeat(md5(g::text), 400) FROM generate_series(1, 3) g;";

/// Compares what Kafka holds with what the writer committed: the same
/// changes, each exactly once, in per-key order, and one tombstone per delete.
fn assert_exactly_once(seen: &[Seen], expected: &[Change]) {
    let mut want: BTreeMap<Change, usize> = BTreeMap::new();
    for c in expected {
        *want.entry(c.clone()).or_default() += 1;
    }
    let mut got: BTreeMap<Change, usize> = BTreeMap::new();
    let mut tombstones = 0;
    let mut last_rev: HashMap<(String, i64), i64> = HashMap::new();
    for s in seen {
        if s.value.is_none() {
            tombstones += 1;
            continue;
        }
        let Some(c) = change_of(s) else { continue };
        if c.2 == 'u' {
            let prev = last_rev.insert((c.0.clone(), c.1), c.3);
            assert!(
                prev.is_none_or(|p| p < c.3),
                "out of order for {c:?} after rev {prev:?}"
            );
        }
        *got.entry(c).or_default() += 1;
    }
    let dups: Vec<_> = got.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(dups.is_empty(), "duplicated events in Kafka: {dups:?}");
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "changes missing from Kafka: {missing:?}"
    );
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        extra.is_empty(),
        "events that were never committed: {extra:?}"
    );
    assert_eq!(got.len(), want.len());
    let deletes = expected.iter().filter(|c| c.2 == 'd').count();
    assert_eq!(tombstones, deletes, "one tombstone per delete");
}

fn topics(env: &CaptureEnv) -> Vec<String> {
    vec![env.topic("acct"), env.topic("audit"), env.topic("docs")]
}

fn count_changes(seen: &[Seen]) -> usize {
    seen.iter().filter(|s| s.value.is_some()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_crash").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = env.write_config(
        "capture.toml",
        &env.config("batch.max.events = 100\nbatch.max.ms = 50\ntable.include.list = \"public\\\\.(acct|audit|docs)\"\n"),
    )?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    let writer_client = env.connect().await?;
    let writer = tokio::spawn(async move { workload(writer_client, 1500).await });
    let mut kills = 0;
    while kills < 12 || !writer.is_finished() {
        let wait = rand::rng().random_range(300..2500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        kill9(&mut capture);
        kills += 1;
        capture = env.spawn_capture(&config)?;
        if kills > 60 {
            break;
        }
    }
    let expected = writer.await??;
    let want = expected.len();
    let seen = wait_for(&topics(&env), Duration::from_secs(120), |s| {
        count_changes(s) >= want
    })
    .await;
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    let seen = seen.map_err(|e| anyhow::anyhow!("{e}; log tail:\n{}", tail(&env.capture_log())))?;
    assert!(status.success(), "capture exit {status}");
    assert!(kills >= 10);
    assert_exactly_once(&seen, &expected);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_right_after_a_commit_loses_nothing() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_boundary").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = env.write_config("capture.toml", &env.config("batch.max.ms = 10\n"))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let mut expected = Vec::new();
    for round in 0..3i64 {
        let id = 1000 + round;
        env.client
            .execute("INSERT INTO acct VALUES ($1, 0, 'b')", &[&id])
            .await?;
        expected.push(("acct".to_string(), id, 'c', 0));
        let n = expected.len();
        wait_for(&topics(&env), Duration::from_secs(60), |s| {
            count_changes(s) >= n
        })
        .await?;
        // Killed right after the transaction committed to Kafka.
        kill9(&mut capture);
        let next = 2000 + round;
        env.client
            .execute("INSERT INTO acct VALUES ($1, 0, 'a')", &[&next])
            .await?;
        expected.push(("acct".to_string(), next, 'c', 0));
        capture = env.spawn_capture(&config)?;
    }
    let n = expected.len();
    let seen = wait_for(&topics(&env), Duration::from_secs(60), |s| {
        count_changes(s) >= n
    })
    .await?;
    terminate(&mut capture, Duration::from_secs(30))?;
    assert_exactly_once(&seen, &expected);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_recreated_behind_our_back_stops_start_up() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_gap").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = env.write_config("capture.toml", &env.config("batch.max.ms = 10\n"))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    env.client
        .execute("INSERT INTO acct VALUES (77, 0, 'x')", &[])
        .await?;
    wait_for(&topics(&env), Duration::from_secs(60), |s| {
        count_changes(s) >= 1
    })
    .await?;
    assert!(terminate(&mut capture, Duration::from_secs(30))?.success());

    // Someone drops and recreates the slot; changes in between are lost to it.
    // (Its walsender can outlive the stopped capture for a moment: wait for it.)
    env.drop_slot(&env.slot).await;
    let dropped = env
        .client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&env.slot],
        )
        .await?
        .is_none();
    assert!(dropped, "the slot could not be dropped");
    env.client
        .execute("INSERT INTO acct VALUES (78, 0, 'lost')", &[])
        .await?;
    env.client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&env.slot],
        )
        .await?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "--config"])
        .arg(&config)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "capture started over a gap");
    assert!(
        stderr.contains("never published") && stderr.contains(&env.slot),
        "{stderr}"
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_fences_the_first_and_nothing_is_duplicated() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_fence").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = env.write_config("capture.toml", &env.config("batch.max.ms = 10\n"))?;
    let mut first = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let writer_client = env.connect().await?;
    let writer = tokio::spawn(async move { workload(writer_client, 300).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut second = env.spawn_capture(&config)?;
    // The first instance is fenced and exits with a clear error.
    let mut first_status = None;
    for _ in 0..600 {
        if let Some(s) = first.try_wait()? {
            first_status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected = writer.await??;
    let status = first_status.ok_or_else(|| anyhow::anyhow!("first instance still running"))?;
    assert!(!status.success());
    assert!(
        env.capture_log().contains("fenced"),
        "{}",
        tail(&env.capture_log())
    );
    let want = expected.len();
    let seen = match wait_for(&topics(&env), Duration::from_secs(120), |s| {
        count_changes(s) >= want
    })
    .await
    {
        Ok(seen) => seen,
        Err(e) => {
            let seen = read_committed(&topics(&env))?;
            let mut missing: BTreeMap<Change, usize> = BTreeMap::new();
            for c in &expected {
                *missing.entry(c.clone()).or_default() += 1;
            }
            for c in seen.iter().filter_map(change_of) {
                if let Some(n) = missing.get_mut(&c) {
                    *n = n.saturating_sub(1);
                }
            }
            missing.retain(|_, n| *n > 0);
            let first: Vec<_> = missing.keys().take(10).collect();
            anyhow::bail!(
                "{e}: {} of {want} changes, {} missing (first: {first:?}); second instance exited: {:?}\n{}",
                count_changes(&seen),
                missing.len(),
                second.try_wait()?,
                tail(&env.capture_log())
            )
        }
    };
    assert!(terminate(&mut second, Duration::from_secs(30))?.success());
    assert_exactly_once(&seen, &expected);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_slot_keeps_advancing_while_another_database_is_busy() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_idle").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = env.write_config("capture.toml", &env.config("heartbeat.interval.ms = 200\n"))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let busy = CaptureEnv::new("cap_busy").await?;
    busy.client
        .batch_execute("CREATE TABLE noise (id bigserial PRIMARY KEY, v text)")
        .await?;
    let start = env.confirmed_flush().await?;
    let mut advanced = 0;
    let mut last = start;
    for _ in 0..30 {
        busy.client
            .batch_execute(
                "INSERT INTO noise (v) SELECT md5(g::text) FROM generate_series(1, 500) g",
            )
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = env.confirmed_flush().await?;
        if now > last {
            advanced += 1;
            last = now;
        }
    }
    assert!(terminate(&mut capture, Duration::from_secs(30))?.success());
    assert!(
        advanced >= 5,
        "confirmed_flush_lsn advanced only {advanced} times (from {start} to {last})"
    );
    // Nothing was captured: the offsets alone moved the slot.
    let seen = read_committed(&topics(&env))?;
    assert_eq!(count_changes(&seen), 0);
    busy.cleanup().await;
    env.cleanup().await;
    Ok(())
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
