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
//! One database per round; the rounds rotate who goes first (RUNS rounds
//! with each tool first: with two tools, pairs alternating). Per run: events/s from the first
//! record seen in Kafka to the last (the start-up before the first record is
//! shown apart), CPU µs per event (`/proc/<pid>/stat` user + system of the
//! whole process, start-up included, over the changes), peak RSS (`VmHWM`).
//! Completion is read off Kafka: Debezium's topic end offsets; for oncely
//! (transactional: commit markers take offsets too) its published-events
//! counter, then the topic's last stable offset catching up with its end.
//!
//! `BENCH_SOURCE=mariadb` reads the services' MariaDB instead (module
//! `mariadb`: oncely's MySQL source against Debezium's MariaDB connector
//! 3.5.0.Final, a Connect plugin), the same changes and rows. `BENCH_TOOLS`
//! picks the tools (comma separated: `oncely`, `debezium`, `debezium-tuned`
//! = Debezium with bigger batches, [`run::TUNED_CONNECTOR`] and
//! [`run::TUNED_WORKER`]); default `oncely,debezium` on PostgreSQL, all
//! three on MariaDB.
//!
//! ```sh
//! scripts/services up && scripts/services connect && eval "$(scripts/services env)"
//! cargo build --release --bin oncely --example bench_vs_debezium
//! target/release/examples/bench_vs_debezium 1000000        # N changes and N snapshot rows
//! BENCH_RUNS=1 BENCH_MODES=stream target/release/examples/bench_vs_debezium 100000
//! BENCH_DBZ_WORKER='producer.compression.type=lz4' ...     # extra Connect worker settings
//! BENCH_SOURCE=mariadb target/release/examples/bench_vs_debezium 1000000
//! ```
#[path = "../bench_support/mod.rs"]
mod bench_support;
mod mariadb;
mod run;

use anyhow::{bail, Result};
use bench_support::Services;
use run::{Measured, Mode, Tool};

/// Changes per source transaction: 6,000 inserts, 3,000 updates, 1,000 deletes.
const ROUND: i64 = 10_000;

/// A tool's place in its round.
const WENT: [&str; 3] = ["1st", "2nd", "3rd"];
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
    let mariadb = match std::env::var("BENCH_SOURCE").as_deref() {
        Err(_) | Ok("postgres") => false,
        Ok("mariadb") => true,
        Ok(other) => bail!("BENCH_SOURCE: unknown source {other:?} (postgres, mariadb)"),
    };
    let tools = tools(mariadb)?;
    let services = Services::from_env()?;
    oncely_testkit::connect::connect_lib()?;
    if mariadb {
        oncely_testkit::connect::connect_plugins()?;
        services.mariadb()?;
    }
    let modes = modes
        .split(',')
        .map(|m| match m.trim() {
            "stream" => Ok(Mode::Stream),
            "snapshot" => Ok(Mode::Snapshot),
            other => bail!("BENCH_MODES: unknown mode {other:?} (stream, snapshot)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut results: Vec<(Mode, usize, Measured)> = Vec::new();
    // Modes inside rounds, so that a run cut short still has every mode.
    for round in 0..tools.len() * runs {
        // Rounds rotate who goes first: oncely, then Debezium, ...
        let mut order = tools.clone();
        order.rotate_left(round % tools.len());
        for &mode in &modes {
            let measured = if mariadb {
                mariadb::run_round(&services, mode, n, &order).await?
            } else {
                run_round(&services, mode, n, &order).await?
            };
            for m in measured {
                eprintln!("{}", row(mode, round, &m));
                results.push((mode, round, m));
            }
        }
    }
    print_table(n, &results);
    Ok(())
}

/// `BENCH_TOOLS`, in the order of the first round.
fn tools(mariadb: bool) -> Result<Vec<Tool>> {
    let default = if mariadb {
        "oncely,debezium,debezium-tuned"
    } else {
        "oncely,debezium"
    };
    let list = std::env::var("BENCH_TOOLS").unwrap_or_else(|_| default.into());
    let tools = list
        .split(',')
        .map(
            |t| match Tool::ALL.into_iter().find(|a| a.key() == t.trim()) {
                Some(tool) => Ok(tool),
                None => bail!("BENCH_TOOLS: unknown tool {t:?} (oncely, debezium, debezium-tuned)"),
            },
        )
        .collect::<Result<Vec<_>>>()?;
    if tools.is_empty() || tools.len() > WENT.len() {
        bail!("BENCH_TOOLS: one to {} tools", WENT.len());
    }
    Ok(tools)
}

/// One database, one backlog (or table), each tool alone in `order`.
async fn run_round(s: &Services, mode: Mode, n: i64, order: &[Tool]) -> Result<Vec<Measured>> {
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
            for &tool in order {
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
    for (&tool, position) in order.iter().zip(WENT) {
        let prefix = format!("vs-{}-{tag}", tool.short());
        let slot_name = slot(tool);
        let spec = run::Spec {
            services: s,
            mode,
            db: &db,
            source: run::Db::Postgres {
                slot: &slot_name,
                publication: "vs_pub",
            },
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

fn row(mode: Mode, round: usize, m: &Measured) -> String {
    format!(
        "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
        mode.name(),
        round + 1,
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
    let source = std::env::var("BENCH_SOURCE").unwrap_or_else(|_| "postgres".into());
    println!("\n{n} changes (stream) / rows (snapshot) per run from {source}; each tool alone, same Kafka\n");
    println!("| mode | round | went | tool | events/s | CPU µs/event | of which drain | peak RSS MB | start-up s | drain s | load 1m before → after |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (mode, pair, m) in results {
        println!("{}", row(*mode, *pair, m));
    }
    println!("\n| mode | tool | median events/s | median CPU µs/event | of which drain | median peak RSS MB | runs |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for mode in [Mode::Stream, Mode::Snapshot] {
        for tool in Tool::ALL {
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
