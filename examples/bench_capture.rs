//! Capture throughput benchmark.
//!
//! Writes N row changes (inserts in transactions of 10,000 rows) into a fresh
//! database, then measures in the same run, for each record format
//! (`BENCH_FORMATS`: Avro through the registry, JSON with schemas, JSON
//! without; all three by default) one after the other, and all of it
//! `BENCH_ROUNDS` times (default 1), interleaved (each on a slot of its own,
//! made before the writes):
//! 1. the ceiling: how fast the server streams that WAL through pgoutput to a
//!    client that only reads it (pgwire-replication, counting Insert
//!    messages; once per round);
//! 2. `oncely capture` (the release binary) publishing the same changes to
//!    Kafka in transactions, from its first event to the last, read off its
//!    Prometheus counter; plus its resident memory and CPU;
//! 3. the Kafka floor: capture's records re-sent by a bare transactional
//!    producer with its settings (nothing read or encoded), and their mean
//!    size.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo build --release && cargo run --release --example bench_capture -- 1000000
//! BENCH_FORMATS=avro,json BENCH_ROUNDS=2 cargo run --release --example bench_capture -- 1000000
//! ```
mod bench_support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bench_support::{Format, Services};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};

const ROWS_PER_TX: i64 = 10_000;

/// What one run needs beyond its format and slot.
struct Setup {
    services: Services,
    db: String,
    total: i64,
    /// Extra top-level capture lines and `[kafka.producer]` lines.
    extra: String,
    producer: String,
    compression: String,
}

/// One format's streaming run and floor.
struct Run {
    format: Format,
    raw_rate: f64,
    cap_rate: f64,
    floor_rate: f64,
    record_bytes: f64,
    cpu_us: f64,
    floor_cpu_us: f64,
    peak_mb: f64,
    commit_secs: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let total: i64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let formats = Format::from_env()?;
    let rounds = bench_support::rounds()?;
    let services = Services::from_env()?;
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
    // Every slot before the writes: each reads the same WAL.
    let mut slots = Vec::new();
    for round in 0..rounds {
        let raw = format!("bench_raw_{tag}_{round}");
        let caps: Vec<String> = formats
            .iter()
            .map(|f| format!("bench_cap_{tag}_{round}_{}", f.name().replace('-', "_")))
            .collect();
        for slot in std::iter::once(&raw).chain(&caps) {
            client
                .query_one(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[slot],
                )
                .await?;
        }
        slots.push((raw, caps));
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

    let setup = Setup {
        services,
        db,
        total,
        // Extra top-level capture settings, e.g. BENCH_EXTRA='batch.max.events = 100000'.
        extra: std::env::var("BENCH_EXTRA").unwrap_or_default(),
        // Extra librdkafka producer lines, e.g. BENCH_PRODUCER='"linger.ms" = "20"'.
        producer: std::env::var("BENCH_PRODUCER").unwrap_or_default(),
        compression: std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "lz4".into()),
    };
    println!(
        "events={total} compression.type={} rounds={rounds}",
        setup.compression
    );
    let mut runs = Vec::new();
    for (round, (raw, caps)) in slots.iter().enumerate() {
        let raw_rate = raw_read(&setup, raw).await?;
        println!("round {round}: raw pgoutput read {raw_rate:10.0} events/s");
        for (&format, slot) in formats.iter().zip(caps) {
            let run = stream(&setup, format, slot, raw_rate).await?;
            print_run(&run);
            runs.push(run);
        }
    }
    print_summary(&runs, &formats);

    for (raw, caps) in &slots {
        for slot in std::iter::once(raw).chain(caps) {
            let _ = admin
                .query_one("SELECT pg_drop_replication_slot($1)", &[slot])
                .await;
        }
    }
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", setup.db))
        .await;
    Ok(())
}

/// The ceiling: inserts per second a client that only reads the stream
/// of `slot` sees.
async fn raw_read(s: &Setup, slot: &str) -> Result<f64> {
    let repl = ReplicationConfig::new(
        s.services.host.clone(),
        s.services.user.clone(),
        "",
        s.db.clone(),
        slot.to_owned(),
        "bench_pub",
    )
    .with_port(s.services.port)
    .with_tls(TlsConfig::disabled())
    .with_start_lsn(Lsn::ZERO);
    let mut stream = ReplicationClient::connect(repl).await?;
    let mut seen = 0i64;
    let mut first: Option<Instant> = None;
    while seen < s.total {
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
    let secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    stream.stop();
    Ok(s.total as f64 / secs)
}

/// Capture streaming the changes of `slot` in `format`, then the Kafka
/// floor of its records.
async fn stream(s: &Setup, format: Format, slot: &str, raw_rate: f64) -> Result<Run> {
    let (host, port, user) = (&s.services.host, s.services.port, &s.services.user);
    let (brokers, db, total) = (&s.services.brokers, &s.db, s.total);
    // `<tag>-<round>-<format>`: the slot's name without its prefix.
    let name = slot.trim_start_matches("bench_cap_").replace('_', "-");
    let dir = std::env::temp_dir().join(slot);
    std::fs::create_dir_all(&dir)?;
    let metrics_port = bench_support::free_port()?;
    // Streaming only: the rows are already in the table when capture starts, and
    // the default snapshot.mode (initial) would snapshot them too (see bench_snapshot).
    let config = dir.join("capture.toml");
    std::fs::write(
        &config,
        format!(
            "topic.prefix = \"bench-{name}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             publication.name = \"bench_pub\"\npublication.autocreate.mode = \"disabled\"\n\
             snapshot.mode = \"no_data\"\n{}\
             kafka.bootstrap.servers = \"{brokers}\"\n\
             offset.storage.topic = \"bench-{name}-offsets\"\nmetrics.listen = \"127.0.0.1:{metrics_port}\"\n{}\n\
             [kafka.producer]\n\"compression.type\" = \"{}\"\n{}\n",
            format.capture_config()?,
            s.extra,
            s.compression,
            s.producer
        ),
    )?;
    let (cap_secs, cpu_secs, peak_kb, commit_secs) =
        run_capture(&config, metrics_port, total).await?;
    let topic = format!("bench-{name}.public.orders");
    let per_tx = (total as usize).div_ceil(10);
    let floor_brokers = brokers.clone();
    let overrides = vec![("compression.type".to_owned(), s.compression.clone())];
    let floor = tokio::task::spawn_blocking(move || {
        bench_support::floor::kafka_floor(
            &floor_brokers,
            &topic,
            total as usize,
            per_tx,
            &overrides,
        )
    })
    .await??;
    let _ = bench_support::delete_topics(brokers, &format!("bench-{name}")).await;
    Ok(Run {
        format,
        raw_rate,
        cap_rate: total as f64 / cap_secs,
        floor_rate: total as f64 / floor.secs,
        record_bytes: floor.key_bytes + floor.value_bytes,
        cpu_us: cpu_secs * 1e6 / total as f64,
        floor_cpu_us: floor.cpu * 1e6 / total as f64,
        peak_mb: peak_kb as f64 / 1024.0,
        commit_secs,
    })
}

/// Runs capture until it published `total` events, then stops it: the
/// seconds from its first event, its CPU seconds, peak RSS and seconds in
/// commit_transaction.
async fn run_capture(
    config: &std::path::Path,
    metrics_port: u16,
    total: i64,
) -> Result<(f64, f64, u64, f64)> {
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
    let mut child = bench_support::spawn_capture(command, config)?;
    let pid = child.id();
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let events = bench_support::scrape(metrics_port, "oncely_capture_events_total")
            .await
            .unwrap_or(0.0) as i64;
        if events > 0 {
            first.get_or_insert_with(Instant::now);
        }
        if events >= total {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("capture published only {events} of {total}");
        }
    }
    let secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    let commit_secs =
        bench_support::scrape(metrics_port, "oncely_capture_batch_commit_seconds_sum")
            .await
            .unwrap_or(0.0);
    let peak_kb = bench_support::rss_kb(pid, "VmHWM:");
    let cpu_secs = bench_support::cpu_seconds(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    Ok((secs, cpu_secs, peak_kb, commit_secs))
}

fn print_run(r: &Run) {
    println!(
        "  {:<13} capture {:8.0} events/s ({:4.0}% of the raw read, {:5.1}% of its floor) | floor {:8.0} records/s | {:6.0} B/record | CPU {:5.1} µs/event capture, {:4.1} µs/record floor producer | {:.2}s in commits | RSS peak {:.0} MB",
        r.format.name(),
        r.cap_rate,
        100.0 * r.cap_rate / r.raw_rate,
        100.0 * r.cap_rate / r.floor_rate,
        r.floor_rate,
        r.record_bytes,
        r.cpu_us,
        r.floor_cpu_us,
        r.commit_secs,
        r.peak_mb
    );
}

/// Each format's median over the rounds, and its rate over JSON with
/// schemas' in the same round.
fn print_summary(runs: &[Run], formats: &[Format]) {
    println!("median over rounds     events/s   × json   floor/s   B/record   capture µs/event");
    let json: Vec<f64> = runs
        .iter()
        .filter(|r| r.format == Format::Json)
        .map(|r| r.cap_rate)
        .collect();
    for &f in formats {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.format == f).collect();
        let median = |v: &dyn Fn(usize, &Run) -> f64| {
            let mut x: Vec<f64> = mine.iter().enumerate().map(|(i, r)| v(i, r)).collect();
            x.sort_by(f64::total_cmp);
            x.get(x.len() / 2).copied().unwrap_or(0.0)
        };
        println!(
            "  {:<13}      {:9.0}   {:6.2}   {:7.0}   {:8.0}   {:16.1}",
            f.name(),
            median(&|_, r| r.cap_rate),
            median(&|i, r| json.get(i).map_or(f64::NAN, |j| r.cap_rate / j)),
            median(&|_, r| r.floor_rate),
            median(&|_, r| r.record_bytes),
            median(&|_, r| r.cpu_us)
        );
    }
}
