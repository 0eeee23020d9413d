//! Shared by the end-to-end sink tests: a captured database with a mixed
//! workload, and the source rows each target must end up equal to.
//!
//! It builds on [`crate::harness::capture::CaptureEnv`]. Rows are compared as the JSON
//! objects `row_to_json` gives, which for these tables (bigint, text) is what
//! the capture writes in `after`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use rand::Rng;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::harness::capture::{wait_for, CaptureEnv, Spawned};
use crate::harness::runner::{sigkill, spawn_runner};

/// Tables of the mixed workload; `docs.body` is stored out of line (TOAST).
pub const TABLES: &[&str] = &["acct", "audit", "docs"];

/// Creates the tables, empty: seed them with [`seed`] once capture runs, so
/// that every row reaches Kafka (there is no initial snapshot here).
pub const SCHEMA: &str =
    "CREATE TABLE acct (id bigint PRIMARY KEY, rev bigint NOT NULL, note text);
     CREATE TABLE audit (id bigserial PRIMARY KEY, acct bigint, rev bigint);
     CREATE TABLE docs (id bigint PRIMARY KEY, rev bigint NOT NULL, body text);
     ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;";

/// Hot rows: acct 1..=5 and docs 1..=3 (with a TOASTed body), one audit row.
pub async fn seed(c: &tokio_postgres::Client) -> Result<()> {
    c.batch_execute(
        "INSERT INTO acct SELECT g, 0, 'seed' FROM generate_series(1, 5) g;
         INSERT INTO docs SELECT g, 0, repeat(md5(g::text), 400) FROM generate_series(1, 3) g;
         INSERT INTO audit (acct, rev) VALUES (0, 0);",
    )
    .await?;
    Ok(())
}

/// A captured database for a sink test: the schema, a running capture
/// (small Kafka transactions), seeded tables, and the change topics, which
/// exist when this returns so a sink can subscribe to them.
pub async fn captured_source(name: &str) -> Result<(CaptureEnv, Spawned, Vec<String>)> {
    let env = CaptureEnv::new(name).await?;
    env.client.batch_execute(SCHEMA).await?;
    let capture_config = env.write_config(
        "capture.toml",
        &env.config("batch.max.events = 200\nbatch.max.ms = 20\n"),
    )?;
    let capture = env.spawn_capture(&capture_config)?;
    env.wait_slot_active().await?;
    seed(&env.client).await?;
    let topics: Vec<String> = TABLES.iter().map(|t| env.topic(t)).collect();
    wait_for(&topics, Duration::from_secs(60), |s| {
        TABLES
            .iter()
            .all(|t| s.iter().any(|r| r.topic == env.topic(t)))
    })
    .await?;
    Ok((env, capture, topics))
}

/// The runner's part of a sink config for a crash test: `group` consuming
/// `topics` in batches of `max_records`, with static membership so a
/// restarted runner gets its partitions back at once. Append `extra` runner
/// keys, then the `[sink]` table.
pub fn runner_config(group: &str, topics: &[String], max_records: usize, extra: &str) -> String {
    let topic_list = topics
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{group}\"\ntopics = [{topic_list}]\n\
         batch.max.records = {max_records}\nbatch.max.ms = 20\nshutdown.timeout.ms = 10000\n{extra}\
         [kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n",
        brokers = crate::harness::common::kafka_brokers(),
    )
}

/// A mixed workload of `transactions` transactions: inserts, hot-key updates,
/// multi-row and multi-table transactions, deletes, re-inserts of deleted keys,
/// TOAST-unchanged updates and a large transaction every 150.
pub async fn workload(c: tokio_postgres::Client, transactions: usize) -> Result<()> {
    let mut next_id: i64 = 100;
    let mut live: Vec<i64> = Vec::new();
    let mut dead: Vec<i64> = Vec::new();
    for n in 0..transactions {
        if n % 150 == 75 {
            c.execute(
                "INSERT INTO audit (acct, rev) SELECT g, 0 FROM generate_series(1, 500) g",
                &[],
            )
            .await?;
            continue;
        }
        let pick: u32 = rand::rng().random_range(0..100);
        match pick {
            0..=19 => {
                let id = next_id;
                next_id += 1;
                c.execute("INSERT INTO acct VALUES ($1, 0, 'n')", &[&id])
                    .await?;
                live.push(id);
            }
            20..=24 => {
                if let Some(id) = dead.pop() {
                    c.execute("INSERT INTO acct VALUES ($1, 100, 'again')", &[&id])
                        .await?;
                    live.push(id);
                }
            }
            25..=54 => {
                let id: i64 = rand::rng().random_range(1..=5);
                c.execute(
                    "UPDATE acct SET rev = rev + 1, note = 'u' || rev WHERE id = $1",
                    &[&id],
                )
                .await?;
            }
            55..=64 => {
                let id: i64 = rand::rng().random_range(1..=5);
                c.execute(
                    "WITH u AS (UPDATE acct SET rev = rev + 1 WHERE id = $1 RETURNING id, rev)
                     INSERT INTO audit (acct, rev) SELECT id, rev FROM u",
                    &[&id],
                )
                .await?;
            }
            65..=74 => {
                c.execute("UPDATE acct SET rev = rev + 1 WHERE id <= 5", &[])
                    .await?;
            }
            75..=86 => {
                if !live.is_empty() {
                    let i = rand::rng().random_range(0..live.len());
                    let id = live.swap_remove(i);
                    c.execute("DELETE FROM acct WHERE id = $1", &[&id]).await?;
                    dead.push(id);
                }
            }
            87..=89 => {
                // A row changed and deleted in one transaction.
                let id = next_id;
                next_id += 1;
                c.batch_execute(&format!(
                    "BEGIN; INSERT INTO acct VALUES ({id}, 0, 'brief');
                     UPDATE acct SET rev = 1 WHERE id = {id}; DELETE FROM acct WHERE id = {id}; COMMIT;"
                ))
                .await?;
                dead.push(id);
            }
            _ => {
                // The TOASTed body stays unchanged.
                let id: i64 = rand::rng().random_range(1..=3);
                c.execute("UPDATE docs SET rev = rev + 1 WHERE id = $1", &[&id])
                    .await?;
            }
        }
        if n % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    Ok(())
}

/// Every row of `table`: primary key `id` as text -> the row as a JSON object.
pub async fn source_rows(
    c: &tokio_postgres::Client,
    table: &str,
) -> Result<BTreeMap<String, Value>> {
    let rows = c
        .query(
            &format!("SELECT id::text, row_to_json(t)::text FROM {table} t"),
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.get::<_, String>(0),
                serde_json::from_str(r.get::<_, &str>(1))?,
            ))
        })
        .collect()
}

/// SIGKILLs runners started from `config` (logging to `log`), each 0.5 to 3 s
/// after its start, until `min_kills` kills happened and `writer` finished;
/// the number of kills (an error when the writer outlasts 80).
pub async fn kill_runners_while<T>(
    config: &Path,
    log: &Path,
    writer: &JoinHandle<T>,
    min_kills: usize,
) -> Result<usize> {
    let mut kills = 0;
    while kills < min_kills || !writer.is_finished() {
        let mut sink = spawn_runner(config, log);
        let wait = rand::rng().random_range(500..3000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        sigkill(&mut sink).await;
        kills += 1;
        anyhow::ensure!(kills < 80, "the workload did not finish");
    }
    Ok(kills)
}

/// How a target's rows `got` differ from the source's `want` (`None` when
/// equal), for a failure message: counts, a few extra keys and a few rows
/// that differ.
pub fn row_differences<V: PartialEq + Debug>(
    table: &str,
    target: &str,
    want: &BTreeMap<String, V>,
    got: &BTreeMap<String, V>,
) -> Option<String> {
    if want == got {
        return None;
    }
    let missing = want.keys().filter(|k| !got.contains_key(*k)).count();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .take(3)
        .map(|(k, v)| format!("{k}: source {v:?} {target} {:?}", got[k]))
        .collect();
    Some(format!(
        "{table}: {} source rows, {} {target} rows, {missing} missing, {} extra (e.g. {:?}), \
         differing e.g. {differ:?}",
        want.len(),
        got.len(),
        extra.len(),
        &extra[..extra.len().min(3)]
    ))
}
