//! The `redis` sink end to end, against a real `oncely capture` streaming a
//! mixed workload: SIGKILL the sink again and again, and restart Redis during
//! a run. The cache must end up equal to the source tables — same keys, same
//! values, deleted keys gone — and the positions stored in Redis must be
//! exactly the end of what was applied.
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use oncely_sinks::kinds::redis::config::DEFAULT_VERSION_FIELD;
use redis::aio::MultiplexedConnection;
use serde_json::{Map, Value};

use crate::harness::capture;
use crate::harness::capture::{kill9, read_committed, terminate, CaptureEnv};
use crate::harness::common;
use crate::harness::runner::{sigterm, spawn_runner, wait_exit, write_config};
use crate::harness::sink::{
    captured_source, kill_runners_while, row_differences, runner_config, source_rows, workload,
    TABLES,
};

const KILLS: usize = 12;

/// A sink process that is killed and reaped if a test step fails before it stops.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn redis_conn() -> anyhow::Result<MultiplexedConnection> {
    Ok(redis::Client::open(common::redis_url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// A column as the hash layout stores it: strings as is, other values as JSON.
fn field_text(v: &Value) -> String {
    v.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v.to_string())
}

/// Every cached row of `table` under `prefix`, as id -> JSON object (nulls left out).
async fn cached_rows(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    table: &str,
    json_layout: bool,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    let pattern = format!("{prefix}:{table}:*");
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut out = BTreeMap::new();
    for key in keys {
        let id = key.rsplit(':').next().unwrap_or_default().to_owned();
        let row: BTreeMap<String, String> = if json_layout {
            let text: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
            let Some(text) = text else { continue };
            let map: Map<String, Value> = serde_json::from_str(&text)?;
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), field_text(v)))
                .collect()
        } else {
            let mut row: BTreeMap<String, String> =
                redis::cmd("HGETALL").arg(&key).query_async(conn).await?;
            // The row's version lives beside its columns.
            anyhow::ensure!(
                row.remove(DEFAULT_VERSION_FIELD).is_some() || row.is_empty(),
                "{key} has no version field"
            );
            if row.is_empty() {
                continue;
            }
            row
        };
        out.insert(id, row);
    }
    Ok(out)
}

/// Differences between each table and the cache, empty when they are equal.
async fn differences(
    env: &CaptureEnv,
    conn: &mut MultiplexedConnection,
    prefix: &str,
    json_layout: bool,
) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for table in TABLES {
        let want: BTreeMap<String, BTreeMap<String, String>> = source_rows(&env.client, table)
            .await?
            .into_iter()
            .map(|(id, row)| {
                let row = row
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter(|(_, v)| !v.is_null())
                            .map(|(k, v)| (k.clone(), field_text(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                (id, row)
            })
            .collect();
        let got = cached_rows(conn, prefix, table, json_layout).await?;
        out.extend(row_differences(table, "cache", &want, &got));
    }
    Ok(out)
}

/// Positions stored in Redis for `group`, and the end of each topic as a
/// `read_committed` reader sees it (last record + 1: what was applied).
async fn positions_and_ends(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    group: &str,
    topics: &[String],
) -> anyhow::Result<(HashMap<String, i64>, HashMap<String, i64>)> {
    let stored: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(format!("{prefix}:pos:{group}"))
        .query_async(conn)
        .await?;
    let t = topics.to_vec();
    let seen = tokio::task::spawn_blocking(move || read_committed(&t)).await??;
    let mut ends = HashMap::new();
    for s in seen {
        let end = ends
            .entry(format!("{}:{}", s.topic, s.partition))
            .or_insert(0);
        *end = (*end).max(s.offset + 1);
    }
    Ok((stored, ends))
}

/// A captured database with the schema, a running capture, seeded tables whose topics exist.
struct Pipeline {
    env: CaptureEnv,
    capture: capture::Spawned,
    topics: Vec<String>,
    group: String,
    prefix: String,
    sink_config: PathBuf,
    log: PathBuf,
}

async fn pipeline(name: &str, layout: &str) -> anyhow::Result<Pipeline> {
    let (env, capture, topics) = captured_source(name).await?;
    let group = common::unique(&format!("{name}_g"));
    let prefix = common::unique(name);
    let sink_config = write_config(
        &env.dir,
        "sink",
        &format!(
            "{runner}[sink]\nkind = \"redis\"\nurl = \"{url}\"\nlayout = \"{layout}\"\n\
             key.pattern = \"{prefix}:{{table}}:{{key}}\"\nversion.key.prefix = \"{prefix}:v:\"\n\
             positions.key.prefix = \"{prefix}:pos:\"\nkeyset.key.prefix = \"{prefix}:ks:\"\nfence.key.prefix = \"{prefix}:fence:\"\n",
            runner = runner_config(
                &group,
                &topics,
                50,
                "retry.backoff.ms = 50\nretry.backoff.max.ms = 1000\n"
            ),
            url = common::redis_url(),
        ),
    );
    let log = env.dir.join("sink.log");
    Ok(Pipeline {
        env,
        capture,
        topics,
        group,
        prefix,
        sink_config,
        log,
    })
}

/// Starts a last sink, waits until the cache equals the source, stops it
/// gracefully, and checks the stored positions against the topics' ends.
async fn converge_and_check(p: &mut Pipeline, json_layout: bool, what: &str) -> anyhow::Result<()> {
    let mut conn = redis_conn().await?;
    let mut sink = Reaped(spawn_runner(&p.sink_config, &p.log));
    let deadline = Instant::now() + Duration::from_secs(180);
    let diff = loop {
        let diff = differences(&p.env, &mut conn, &p.prefix, json_layout).await?;
        if diff.is_empty() || Instant::now() > deadline {
            break diff;
        }
        if let Some(status) = sink.0.try_wait()? {
            anyhow::bail!(
                "the last sink exited with {status}; log: {}",
                p.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Positions are stored with each batch: wait for the last one to land.
    let mut positions = positions_and_ends(&mut conn, &p.prefix, &p.group, &p.topics).await?;
    while positions.0 != positions.1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        positions = positions_and_ends(&mut conn, &p.prefix, &p.group, &p.topics).await?;
    }
    sigterm(&sink.0);
    let status = wait_exit(&mut sink.0, Duration::from_secs(30)).await;
    if terminate(&mut p.capture, Duration::from_secs(30)).is_err() {
        kill9(&mut p.capture);
    }
    assert!(
        diff.is_empty(),
        "cache differs from the source {what}: {diff:#?}"
    );
    assert_eq!(
        positions.0, positions.1,
        "stored positions vs the end of what was applied"
    );
    assert_eq!(
        positions.0.len(),
        TABLES.len(),
        "one position per partition"
    );
    assert!(status.success(), "graceful stop exits 0, got {status}");
    // Nothing of this test stays in Redis.
    let _ = delete_prefix(&mut conn, &p.prefix).await;
    Ok(())
}

async fn delete_prefix(conn: &mut MultiplexedConnection, prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(conn)
        .await?;
    for chunk in keys.chunks(500) {
        redis::cmd("UNLINK")
            .arg(chunk)
            .query_async::<()>(conn)
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_redis_sink_leaves_the_cache_equal_to_the_source() -> anyhow::Result<()> {
    let mut p = pipeline("redis_crash", "hash").await?;
    let writer_client = p.env.connect().await?;
    let writer = tokio::spawn(async move { workload(writer_client, 3000).await });
    let kills = kill_runners_while(&p.sink_config, &p.log, &writer, KILLS).await?;
    writer.await??;
    converge_and_check(&mut p, false, &format!("after {kills} SIGKILLs")).await?;
    assert!(kills >= KILLS);
    p.env.cleanup().await;
    Ok(())
}

fn uptime_seconds(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|v| v.trim().parse().ok())
}

// Restarting a service would break whatever other test of this process runs
// meanwhile: `scripts/test` runs it alone, `-- --ignored --test-threads=1`.
#[ignore = "restarts shared services: run alone (scripts/test does)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_during_the_run_loses_nothing() -> anyhow::Result<()> {
    let mut conn = redis_conn().await?;
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut conn)
        .await?;
    assert_eq!(
        aof.get(1).map(String::as_str),
        Some("yes"),
        "Redis must persist (appendonly yes) for the sink's positions to survive a restart: \
         restart it with `scripts/services restart redis`"
    );
    let mut p = pipeline("redis_restart", "json").await?;
    let mut sink = Reaped(spawn_runner(&p.sink_config, &p.log));
    let writer_client = p.env.connect().await?;
    let writer = tokio::spawn(async move { workload(writer_client, 3000).await });
    // Restart Redis while changes stream through the running sink.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !writer.is_finished(),
        "the workload ended before the restart"
    );
    let restarted_at = Instant::now();
    tokio::task::spawn_blocking(|| common::restart_service("redis")).await??;
    let mut conn = redis_conn().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let uptime = uptime_seconds(&info).unwrap_or(u64::MAX);
    assert!(
        uptime <= restarted_at.elapsed().as_secs() + 1,
        "Redis was not restarted (uptime {uptime}s)"
    );
    writer.await??;
    assert!(
        sink.0.try_wait()?.is_none(),
        "the sink survived the restart: log {}",
        p.log.display()
    );
    sigterm(&sink.0);
    let status = wait_exit(&mut sink.0, Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "the sink that lived through the restart stops with 0, got {status}"
    );
    converge_and_check(&mut p, true, "after a Redis restart").await?;
    p.env.cleanup().await;
    Ok(())
}
