//! The MariaDB side (`BENCH_SOURCE=mariadb`): a fresh database on the
//! services' MariaDB; a backlog every tool drains from the same binlog
//! position, or a table each snapshots.
//!
//! A binlog has no slot that holds a position for a tool not yet started,
//! and both tools' `snapshot.mode = no_data` starts at the server's current
//! position. So before the backlog, every tool of the round is started at
//! once on the empty table and **primed**: marker rows (negative ids) are
//! written until each has published one and stored its offset (Connect
//! flushing offsets every second while priming; oncely commits its offset
//! with the records), then all are stopped. The backlog is written next, and
//! each tool, started again alone, resumes from its stored position, just
//! before the backlog. A marker written after a tool's last stored one is
//! read again in its measured run (a few records, not counted).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::bench_support::{self, Offsets, Services};
use crate::run::{self, Db, Measured, Mode, Spec, Tool};
use crate::{ROUND, WENT};

const TABLE_SQL: &str = "CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL,
    status varchar(16) NOT NULL, total decimal(12,2) NOT NULL, created timestamp(6) NOT NULL)";

/// Rows per transaction while filling the snapshot's table.
const FILL: i64 = 100_000;

/// One database, one backlog (or table), each tool alone in `order`.
pub async fn run_round(s: &Services, mode: Mode, n: i64, order: &[Tool]) -> Result<Vec<Measured>> {
    let maria = s.mariadb()?;
    let tag = bench_support::tag();
    let db = format!("vs_dbz_{tag}");
    let mut conn = maria.connect(None).await?;
    conn.query_drop(format!("CREATE DATABASE {db}")).await?;
    conn.query_drop(format!("USE {db}")).await?;
    conn.query_drop(TABLE_SQL).await?;
    let result = measure(s, &mut conn, &db, &tag, mode, n, order).await;
    let dropped = conn.query_drop(format!("DROP DATABASE {db}")).await;
    let out = result?;
    dropped.with_context(|| format!("drop database {db}"))?;
    Ok(out)
}

async fn measure(
    s: &Services,
    conn: &mut Conn,
    db: &str,
    tag: &str,
    mode: Mode,
    n: i64,
    order: &[Tool],
) -> Result<Vec<Measured>> {
    let prefixes: Vec<String> = order
        .iter()
        .map(|t| format!("vs-{}-{tag}", t.short()))
        .collect();
    let specs: Vec<Spec> = order
        .iter()
        .zip(&prefixes)
        .map(|(_, prefix)| Spec {
            services: s,
            mode,
            db,
            // A replica id of its own (the server's is 1).
            source: Db::MariaDb {
                server_id: 100_000 + rand::random::<u32>() % 1_000_000_000,
            },
            prefix,
            changes: n,
            // Both tools send a tombstone after each delete by default.
            records: match mode {
                Mode::Stream => n + n / 10,
                Mode::Snapshot => n,
            },
        })
        .collect();
    match mode {
        Mode::Stream => {
            prime(conn, order, &specs).await?;
            write_changes(conn, n).await?;
        }
        Mode::Snapshot => fill(conn, n).await?,
    }
    let mut out = Vec::new();
    for ((&tool, spec), went) in order.iter().zip(&specs).zip(WENT) {
        let measured = run::run(tool, spec, went).await;
        bench_support::delete_topics(&s.brokers, spec.prefix).await?;
        let m = measured?;
        // The round's rows come at its end; this shows each run as it ends.
        eprintln!(
            "  {}: {:.0} events/s, {:.1} CPU µs/event, {:.0} MB",
            tool.name(),
            m.rate(),
            m.cpu_us_per_event(),
            m.peak_rss_kb as f64 / 1024.0
        );
        out.push(m);
    }
    Ok(out)
}

/// Starts every tool of the round on the empty table and stops each once its
/// offset is stored (the module's comment says why).
async fn prime(conn: &mut Conn, order: &[Tool], specs: &[Spec<'_>]) -> Result<()> {
    eprintln!("priming {} tools on the empty table ...", order.len());
    let offsets = Offsets::new(&specs[0].services.brokers)?;
    let mut running = Vec::new();
    for (&tool, spec) in order.iter().zip(specs) {
        let dir = run::dir(spec.prefix)?;
        running.push(run::start(
            tool,
            spec,
            &dir,
            &[("offset.flush.interval.ms", "1000")],
        )?);
    }
    let started = Instant::now();
    for marker in 1.. {
        conn.query_drop(format!(
            "INSERT INTO orders VALUES (-{marker}, 0, 'marker', 0, now(6))"
        ))
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        for r in &mut running {
            r.check()?;
        }
        let mut all = true;
        for spec in specs {
            let ends = tokio::task::block_in_place(|| offsets.ends(&spec.topic()))?;
            // A committed record (oncely's transactions: below the stable offset).
            all &= ends.stable > ends.low;
        }
        if all {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("priming: not every tool published a marker row within 600 s");
        }
    }
    // Connect stores its offsets every second now; oncely's are in the
    // transaction of its marker.
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(running);
    Ok(())
}

/// `n` changes in transactions of ROUND, as the PostgreSQL backlog: per
/// round 6,000 inserts, then 3,000 of them updated and 1,000 deleted.
async fn write_changes(conn: &mut Conn, n: i64) -> Result<()> {
    eprintln!("writing {n} changes ...");
    let t = Instant::now();
    for round in 0..n / ROUND {
        let base = round * 6_000;
        conn.query_drop(format!(
            "START TRANSACTION;
             INSERT INTO orders SELECT seq, seq % 997, 'new', (seq % 10000) / 100.0, now(6)
               FROM seq_{}_to_{};
             UPDATE orders SET status = 'paid', total = total + 1 WHERE id BETWEEN {} AND {};
             DELETE FROM orders WHERE id BETWEEN {} AND {};
             COMMIT",
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

/// `n` rows for the snapshot, in transactions of FILL.
async fn fill(conn: &mut Conn, n: i64) -> Result<()> {
    eprintln!("filling {n} rows ...");
    let t = Instant::now();
    for first in (1..=n).step_by(FILL as usize) {
        conn.query_drop(format!(
            "INSERT INTO orders SELECT seq, seq % 997, 'new', (seq % 10000) / 100.0, now(6)
             FROM seq_{first}_to_{}",
            (first + FILL - 1).min(n)
        ))
        .await?;
    }
    eprintln!("filled in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}
