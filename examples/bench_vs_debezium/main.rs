//! oncely capture side by side with Debezium: the headline comparison (BENCHMARKS.md).
//!
//! Each tool runs alone, one after the other, into the same Kafka, on the same
//! data, with its default settings:
//! - **stream**: a fresh database gets a publication and two slots (one per
//!   tool) *before* N mixed changes are written (per transaction of 10,000:
//!   6,000 inserts, 3,000 updates, 1,000 deletes), so both drain the very
//!   same WAL (`snapshot.mode = no_data` for both);
//! - **snapshot**: a fresh database gets a table of N rows, and each tool
//!   takes its initial snapshot of it (`snapshot.mode = initial`, each tool
//!   making its own slot).
//!
//! One database per pair; the pairs alternate who goes first (RUNS pairs with
//! oncely first, RUNS with Debezium first). Per run: events/s from the first
//! record seen in Kafka to the last (the start-up before the first record is
//! shown apart), CPU µs per event (`/proc/<pid>/stat` user + system of the
//! whole process, start-up included, over the changes), peak RSS (`VmHWM`).
//! Completion is read off Kafka: Debezium's topic end offsets; for oncely
//! (transactional: commit markers take offsets too) its published-events
//! counter, then the topic's last stable offset catching up with its end.
//!
//! ```sh
//! scripts/services up && scripts/services connect && eval "$(scripts/services env)"
//! cargo build --release --bin oncely --example bench_vs_debezium
//! target/release/examples/bench_vs_debezium 1000000        # N changes and N snapshot rows
//! BENCH_RUNS=1 BENCH_MODES=stream target/release/examples/bench_vs_debezium 100000
//! BENCH_DBZ_WORKER='producer.compression.type=lz4' ...     # extra Connect worker settings
//! ```
#[path = "../bench_support/mod.rs"]
mod bench_support;
mod run;

use anyhow::{bail, Result};
use bench_support::Services;
use run::{Measured, Mode, Tool};

/// Changes per source transaction: 6,000 inserts, 3,000 updates, 1,000 deletes.
const ROUND: i64 = 10_000;
const TABLE_SQL: &str = "CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL,
    status text NOT NULL, total numeric(12,2) NOT NULL, created timestamptz NOT NULL)";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n: i64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let n = (n + ROUND - 1) / ROUND * ROUND;
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(3);
    let modes = std::env::var("BENCH_MODES").unwrap_or_else(|_| "stream,snapshot".into());
    let services = Services::from_env()?;
    oncely_testkit::connect::connect_lib()?;
    let modes = modes
        .split(',')
        .map(|m| match m.trim() {
            "stream" => Ok(Mode::Stream),
            "snapshot" => Ok(Mode::Snapshot),
            other => bail!("BENCH_MODES: unknown mode {other:?} (stream, snapshot)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut results: Vec<(Mode, usize, Measured)> = Vec::new();
    // Modes inside pairs, so that a run cut short still has every mode.
    for pair in 0..2 * runs {
        // Pairs alternate: oncely first, Debezium first, ...
        let order = if pair % 2 == 0 {
            [Tool::Oncely, Tool::Debezium]
        } else {
            [Tool::Debezium, Tool::Oncely]
        };
        for &mode in &modes {
            for m in run_pair(&services, mode, n, order).await? {
                eprintln!("{}", row(mode, pair, &m));
                results.push((mode, pair, m));
            }
        }
    }
    print_table(n, &results);
    Ok(())
}

/// One database, one backlog (or table), each tool alone in `order`.
async fn run_pair(s: &Services, mode: Mode, n: i64, order: [Tool; 2]) -> Result<Vec<Measured>> {
    let tag = bench_support::tag();
    let db = format!("vs_dbz_{tag}");
    let admin = s.admin().await?;
    let client = s.create_database(&admin, &db).await?;
    client.batch_execute(TABLE_SQL).await?;
    let slot = |tool: Tool| format!("vs_{}_{tag}", tool.short());
    match mode {
        Mode::Stream => {
            // Publication and slots before the changes: both decode the same WAL.
            client
                .batch_execute("CREATE PUBLICATION vs_pub FOR TABLE orders")
                .await?;
            for tool in order {
                client
                    .query_one(
                        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                        &[&slot(tool)],
                    )
                    .await?;
            }
            write_changes(&client, n).await?;
        }
        Mode::Snapshot => {
            client
                .batch_execute(&format!(
                    "INSERT INTO orders SELECT g, g % 997, 'new', (g % 10000) / 100.0, now()
                     FROM generate_series(1, {n}) g;
                     CREATE PUBLICATION vs_pub FOR TABLE orders;"
                ))
                .await?;
            client.batch_execute("VACUUM ANALYZE orders").await?;
        }
    }
    let mut out = Vec::new();
    for (tool, position) in order.into_iter().zip(["1st", "2nd"]) {
        let prefix = format!("vs-{}-{tag}", tool.short());
        let spec = run::Spec {
            services: s,
            mode,
            db: &db,
            slot: &slot(tool),
            publication: "vs_pub",
            prefix: &prefix,
            changes: n,
            // Both tools send a tombstone after each delete by default.
            records: match mode {
                Mode::Stream => n + n / 10,
                Mode::Snapshot => n,
            },
        };
        let measured = run::run(tool, &spec, position).await;
        // Topics of a million records each: gone before the next run.
        bench_support::delete_topics(&s.brokers, &prefix).await?;
        out.push(measured?);
        // The tool has stopped; its slot is free a moment later.
        drop_slot(&admin, &slot(tool)).await;
    }
    drop(client);
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await?;
    Ok(out)
}

/// `n` changes in transactions of ROUND: per round 6,000 inserts, then 3,000
/// of them updated and 1,000 deleted.
async fn write_changes(client: &tokio_postgres::Client, n: i64) -> Result<()> {
    eprintln!("writing {n} changes ...");
    let t = std::time::Instant::now();
    for round in 0..n / ROUND {
        let base = round * 6_000;
        client
            .batch_execute(&format!(
                "BEGIN;
                 INSERT INTO orders SELECT g, g % 997, 'new', (g % 10000) / 100.0, now()
                   FROM generate_series({}, {}) g;
                 UPDATE orders SET status = 'paid', total = total + 1
                   WHERE id BETWEEN {} AND {};
                 DELETE FROM orders WHERE id BETWEEN {} AND {};
                 COMMIT;",
                base + 1,
                base + 6_000,
                base + 1,
                base + 3_000,
                base + 3_001,
                base + 4_000,
            ))
            .await?;
    }
    eprintln!("written in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

async fn drop_slot(admin: &tokio_postgres::Client, slot: &str) {
    for _ in 0..100 {
        let dropped = admin
            .query_opt(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = $1",
                &[&slot],
            )
            .await;
        if dropped.is_ok() {
            return;
        }
        // Still active: the walsender of the stopped tool is going away.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!("warning: slot {slot} not dropped");
}

fn row(mode: Mode, pair: usize, m: &Measured) -> String {
    format!(
        "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
        mode.name(),
        pair + 1,
        m.position,
        m.tool.name(),
        m.rate(),
        m.cpu_us_per_event(),
        m.drain_cpu_us_per_event(),
        m.peak_rss_kb as f64 / 1024.0,
        m.startup_secs,
        m.drain_secs,
        m.load,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

fn print_table(n: i64, results: &[(Mode, usize, Measured)]) {
    println!("\n{n} changes (stream) / rows (snapshot) per run; each tool alone, same Kafka\n");
    println!("| mode | pair | went | tool | events/s | CPU µs/event | of which drain | peak RSS MB | start-up s | drain s | load 1m before → after |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (mode, pair, m) in results {
        println!("{}", row(*mode, *pair, m));
    }
    println!("\n| mode | tool | median events/s | median CPU µs/event | of which drain | median peak RSS MB | runs |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for mode in [Mode::Stream, Mode::Snapshot] {
        for tool in [Tool::Oncely, Tool::Debezium] {
            let of: Vec<&Measured> = results
                .iter()
                .filter(|(md, _, m)| *md == mode && m.tool == tool)
                .map(|(_, _, m)| m)
                .collect();
            if of.is_empty() {
                continue;
            }
            println!(
                "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
                mode.name(),
                tool.name(),
                median(of.iter().map(|m| m.rate()).collect()),
                median(of.iter().map(|m| m.cpu_us_per_event()).collect()),
                median(of.iter().map(|m| m.drain_cpu_us_per_event()).collect()),
                median(of.iter().map(|m| m.peak_rss_kb as f64 / 1024.0).collect()),
                of.len()
            );
        }
    }
}
