//! Capture throughput benchmark.
//!
//! Writes N row changes (inserts in transactions of 10,000 rows) into a fresh
//! database, then measures in the same run:
//! 1. the ceiling: how fast the server streams that WAL through pgoutput to a
//!    client that only reads it (pgwire-replication, counting Insert messages);
//! 2. `oncely capture` (the release binary) publishing the same changes to
//!    Kafka in transactions, from its first event to the last, read off its
//!    Prometheus counter; plus its resident memory.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo build --release && cargo run --release --example bench_capture -- 1000000
//! ```
mod bench_support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};

const ROWS_PER_TX: i64 = 10_000;

#[tokio::main]
async fn main() -> Result<()> {
    let total: i64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    // Extra top-level capture settings, e.g. BENCH_EXTRA='batch.max.events = 100000'.
    let extra = std::env::var("BENCH_EXTRA").unwrap_or_default();
    // Extra librdkafka producer lines, e.g. BENCH_PRODUCER='"linger.ms" = "20"'.
    let producer = std::env::var("BENCH_PRODUCER").unwrap_or_default();
    let compression = std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "lz4".into());
    let schemas = std::env::var("BENCH_SCHEMAS")
        .map(|v| v != "false")
        .unwrap_or(true);
    let services = bench_support::Services::from_env()?;
    let (host, port, user) = (&services.host, services.port, &services.user);
    let brokers = &services.brokers;
    let tag = bench_support::tag();
    let db = format!("bench_{tag}");
    let admin = services.admin().await?;
    let client = services.create_database(&admin, &db).await?;
    client
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, status text NOT NULL,
                                  total numeric(12,2) NOT NULL, created timestamptz NOT NULL);
             CREATE PUBLICATION bench_pub FOR TABLE orders;",
        )
        .await?;
    let raw_slot = format!("bench_raw_{tag}");
    let cap_slot = format!("bench_cap_{tag}");
    for slot in [&raw_slot, &cap_slot] {
        client
            .query_one(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[slot],
            )
            .await?;
    }
    eprintln!("writing {total} inserts in transactions of {ROWS_PER_TX} ...");
    let t = Instant::now();
    let mut start = 1;
    while start <= total {
        let end = (start + ROWS_PER_TX - 1).min(total);
        client
            .execute(
                "INSERT INTO orders SELECT g, g % 997, 'new', (g % 10000) / 100.0, now() FROM generate_series($1::bigint, $2::bigint) g",
                &[&start, &end],
            )
            .await?;
        start = end + 1;
    }
    eprintln!("written in {:.1}s", t.elapsed().as_secs_f64());

    // 1. Ceiling: a client that only reads the stream.
    let repl = ReplicationConfig::new(
        host.clone(),
        user.clone(),
        "",
        db.clone(),
        raw_slot.clone(),
        "bench_pub",
    )
    .with_port(port)
    .with_tls(TlsConfig::disabled())
    .with_start_lsn(Lsn::ZERO);
    let mut stream = ReplicationClient::connect(repl).await?;
    let mut seen = 0i64;
    let mut first: Option<Instant> = None;
    while seen < total {
        match stream.recv().await? {
            Some(ReplicationEvent::XLogData { data, wal_end, .. }) => {
                if data.first() == Some(&b'I') {
                    first.get_or_insert_with(Instant::now);
                    seen += 1;
                }
                stream.update_applied_lsn(wal_end);
            }
            Some(_) => {}
            None => bail!("stream ended after {seen} inserts"),
        }
    }
    let raw_secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    stream.stop();
    let raw_rate = total as f64 / raw_secs;
    eprintln!("raw pgoutput read: {total} inserts in {raw_secs:.2}s = {raw_rate:.0}/s");

    // 2. oncely capture.
    let dir = std::env::temp_dir().join(&db);
    std::fs::create_dir_all(&dir)?;
    let metrics_port = 20000 + (rand::random::<u16>() % 20000);
    // Streaming only: the rows are already in the table when capture starts, and
    // the default snapshot.mode (initial) would snapshot them too (see bench_snapshot).
    let config = dir.join("capture.toml");
    std::fs::write(
        &config,
        format!(
            "topic.prefix = \"bench-{tag}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{cap_slot}\"\n\
             publication.name = \"bench_pub\"\npublication.autocreate.mode = \"disabled\"\n\
             snapshot.mode = \"no_data\"\n\
             schemas.enable = {schemas}\nkafka.bootstrap.servers = \"{brokers}\"\n\
             offset.storage.topic = \"bench-{tag}-offsets\"\nmetrics.listen = \"127.0.0.1:{metrics_port}\"\n{extra}\n\
             [kafka.producer]\n\"compression.type\" = \"{compression}\"\n{producer}\n"
        ),
    )?;
    let bin = bench_support::oncely_binary()?;
    // BENCH_PERF=<file> profiles capture with `perf record`.
    let command = match std::env::var("BENCH_PERF") {
        Ok(out) => {
            let mut c = Command::new("perf");
            c.args(["record", "-F", "499", "-g", "-o", &out, "--"])
                .arg(&bin);
            c
        }
        Err(_) => Command::new(&bin),
    };
    let mut child = bench_support::spawn_capture(command, &config)?;
    let pid = child.id();
    let mut first: Option<Instant> = None;
    let mut rss_samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let events = bench_support::scrape(metrics_port, "oncely_capture_events_total")
            .await
            .unwrap_or(0.0) as i64;
        if events > 0 {
            first.get_or_insert_with(Instant::now);
            rss_samples.push(bench_support::rss_kb(pid, "VmRSS:"));
        }
        if events >= total {
            break;
        }
        if Instant::now() > deadline {
            bail!("capture published only {events} of {total}");
        }
    }
    let cap_secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    let commit_sum = bench_support::scrape(metrics_port, "oncely_capture_batch_commit_seconds_sum")
        .await
        .unwrap_or(0.0);
    let commits = bench_support::scrape(metrics_port, "oncely_capture_batch_commit_seconds_count")
        .await
        .unwrap_or(0.0);
    let peak_kb = bench_support::rss_kb(pid, "VmHWM:");
    let cpu_secs = bench_support::cpu_seconds(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    let cap_rate = total as f64 / cap_secs;
    rss_samples.sort_unstable();
    let median_kb = rss_samples.get(rss_samples.len() / 2).copied().unwrap_or(0);
    println!("events={total} schemas.enable={schemas} compression.type={compression}");
    println!("raw pgoutput read   : {raw_secs:8.2}s {raw_rate:10.0} events/s");
    println!(
        "oncely capture      : {cap_secs:8.2}s {cap_rate:10.0} events/s  ({:.0}% of the ceiling)",
        100.0 * cap_rate / raw_rate
    );
    println!(
        "capture RSS         : median {:.1} MB, peak {:.1} MB",
        median_kb as f64 / 1024.0,
        peak_kb as f64 / 1024.0
    );
    println!("capture CPU         : {cpu_secs:.2}s user+sys for the whole run");
    println!("kafka commits       : {commits:.0}, {commit_sum:.2}s in commit_transaction");

    for slot in [&raw_slot, &cap_slot] {
        let _ = admin
            .query_one("SELECT pg_drop_replication_slot($1)", &[slot])
            .await;
    }
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await;
    Ok(())
}
