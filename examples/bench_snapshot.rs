//! Snapshot throughput benchmark.
//!
//! Fills a fresh database's table with N rows, then measures in the same run,
//! for each record format (`BENCH_FORMATS`: Avro through the registry, JSON
//! with schemas, JSON without; all three by default) one after the other,
//! and all of it `BENCH_ROUNDS` times (default 1), interleaved:
//! 1. the ceiling: `COPY orders TO STDOUT` of the whole table, read by a client
//!    that only counts the bytes (once per round);
//! 2. `oncely capture` (the release binary) with `snapshot.mode =
//!    "initial_only"`: from the moment its snapshot starts (its
//!    `oncely_capture_snapshot_running` gauge) until it exits once every row
//!    is committed to Kafka as an op `r` event; plus its memory and CPU;
//! 3. the Kafka floor: the same records (a sample of what capture wrote,
//!    cycled) sent by a bare transactional producer with capture's producer
//!    settings. No row is read or encoded, so no snapshot can be faster than
//!    this on the same machine and broker; plus the records' mean size.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo build --release && cargo run --release --example bench_snapshot -- 1000000
//! BENCH_CHUNK=8192 cargo run --release --example bench_snapshot -- 1000000   # incremental.snapshot.chunk.size
//! BENCH_COLUMNS=10 cargo run --release --example bench_snapshot -- 1000000   # five more column kinds, as a real table mixes
//! BENCH_FORMATS=avro,json BENCH_ROUNDS=2 cargo run ...                       # formats compared, rounds
//! BENCH_PRODUCER=compression.type=zstd,linger.ms=20 cargo run ...             # [kafka.producer] settings
//! BENCH_CAPTURE_LOG=info,oncely_capture=debug cargo run ...                   # capture's RUST_LOG (default warn)
//! ```
mod bench_support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench_support::{Format, Services};
use futures::StreamExt;
use tokio_postgres::Client;

/// What one run needs beyond its format.
struct Setup {
    services: Services,
    db: String,
    tag: String,
    total: i64,
    chunk: usize,
    /// `[kafka.producer]` lines, and the same as pairs for the floor.
    producer: String,
    overrides: Vec<(String, String)>,
}

/// One format's snapshot and floor.
struct Run {
    format: Format,
    copy_rate: f64,
    snap_rate: f64,
    floor_rate: f64,
    record_bytes: f64,
    cpu_us: f64,
    floor_cpu_us: f64,
    peak_mb: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let total: i64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let chunk: usize = std::env::var("BENCH_CHUNK")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(1024);
    let formats = Format::from_env()?;
    let rounds = bench_support::rounds()?;
    let columns: usize = std::env::var("BENCH_COLUMNS")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(5);
    let (extra_columns, extra_values) = match columns {
        5 => ("", ""),
        // Five more of the kinds a real table mixes: an int, free text, a
        // flag, a timestamp without zone and a uuid.
        10 => (
            ", quantity int NOT NULL, note text NOT NULL, paid boolean NOT NULL,
             shipped timestamp NOT NULL, reference uuid NOT NULL",
            ", g % 50, 'note for order ' || g, g % 2 = 0, now()::timestamp, md5(g::text)::uuid",
        ),
        other => bail!("BENCH_COLUMNS must be 5 or 10, not {other}"),
    };
    // `[kafka.producer]` settings, `key=value` comma separated; the Kafka
    // floor's producer takes them too.
    let overrides: Vec<(String, String)> = std::env::var("BENCH_PRODUCER")
        .unwrap_or_default()
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => bail!("BENCH_PRODUCER: {kv:?} is not key=value"),
        })
        .collect::<Result<_>>()?;
    let producer: String = overrides
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}\n"))
        .collect();
    let services = Services::from_env()?;
    let tag = bench_support::tag();
    let db = format!("bench_snap_{tag}");
    let admin = services.admin().await?;
    let client = services.create_database(&admin, &db).await?;
    eprintln!("writing {total} rows ...");
    let t = Instant::now();
    client
        .batch_execute(&format!(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer int NOT NULL, status text NOT NULL,
                                  total numeric(12,2) NOT NULL, created timestamptz NOT NULL{extra_columns});
             INSERT INTO orders SELECT g, g % 997, 'new', (g % 10000) / 100.0, now(){extra_values} FROM generate_series(1, {total}) g;"
        ))
        .await?;
    // Its own statement: VACUUM cannot run in the implicit transaction of a batch.
    client.batch_execute("VACUUM ANALYZE orders").await?;
    eprintln!("written in {:.1}s", t.elapsed().as_secs_f64());
    println!(
        "rows={total} columns={columns} incremental.snapshot.chunk.size={chunk} rounds={rounds} producer={producer:?}"
    );

    let setup = Setup {
        services,
        db,
        tag,
        total,
        chunk,
        producer,
        overrides,
    };
    let mut runs = Vec::new();
    for round in 0..rounds {
        let copy_rate = copy_rate(&client, total).await?;
        println!("round {round}: COPY orders TO STDOUT {copy_rate:10.0} rows/s");
        for &format in &formats {
            let run = snapshot(&setup, format, round, copy_rate).await?;
            print_run(&run);
            runs.push(run);
        }
    }
    print_summary(&runs, &formats);

    let _ = admin
        .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", setup.db))
        .await;
    Ok(())
}

/// Rows per second of `COPY orders TO STDOUT`, read by a client that only
/// counts them.
async fn copy_rate(client: &Client, total: i64) -> Result<f64> {
    let t = Instant::now();
    let copy = client.copy_out("COPY orders TO STDOUT").await?;
    futures::pin_mut!(copy);
    let mut lines = 0usize;
    while let Some(buf) = copy.next().await {
        lines += buf?.iter().filter(|b| **b == b'\n').count();
    }
    let secs = t.elapsed().as_secs_f64();
    if lines as i64 != total {
        bail!("COPY returned {lines} rows, expected {total}");
    }
    Ok(total as f64 / secs)
}

/// Capture's snapshot of the table in `format`, then the Kafka floor of
/// its records.
async fn snapshot(s: &Setup, format: Format, round: usize, copy_rate: f64) -> Result<Run> {
    let (host, port, user) = (&s.services.host, s.services.port, &s.services.user);
    let brokers = &s.services.brokers;
    let (db, chunk, producer) = (&s.db, s.chunk, &s.producer);
    let name = format!("{}-{}-{round}", s.tag, format.name());
    let dir = std::env::temp_dir().join(format!("{db}-{}-{round}", format.name()));
    std::fs::create_dir_all(&dir)?;
    let metrics_port = bench_support::free_port()?;
    let slot = format!("bench_snap_{}", name.replace('-', "_"));
    let config = dir.join("capture.toml");
    std::fs::write(
        &config,
        format!(
            "topic.prefix = \"bench-snap-{name}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             publication.name = \"bench_snap_pub\"\npublication.autocreate.mode = \"filtered\"\n\
             table.include.list = \"public.orders\"\nsnapshot.mode = \"initial_only\"\n\
             incremental.snapshot.chunk.size = {chunk}\n{}\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"bench-snap-{name}-offsets\"\n\
             metrics.listen = \"127.0.0.1:{metrics_port}\"\n[kafka.producer]\n{producer}",
            format.capture_config()?
        ),
    )?;
    let (snap_secs, cpu_secs, peak_kb) = run_capture(&config, metrics_port).await?;
    let total = s.total;
    let snap_rate = total as f64 / snap_secs;

    let topic = format!("bench-snap-{name}.public.orders");
    // Ten transactions: fewer and larger than capture's, so commits cost
    // the floor less than they cost capture.
    let per_tx = (total as usize).div_ceil(10);
    let (floor_brokers, overrides) = (brokers.clone(), s.overrides.clone());
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
    let _ = bench_support::delete_topics(brokers, &format!("bench-snap-{name}")).await;
    let admin = s.services.admin().await?;
    let _ = admin
        .query_one("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await;
    Ok(Run {
        format,
        copy_rate,
        snap_rate,
        floor_rate: total as f64 / floor.secs,
        record_bytes: floor.key_bytes + floor.value_bytes,
        cpu_us: cpu_secs * 1e6 / total as f64,
        floor_cpu_us: floor.cpu * 1e6 / total as f64,
        peak_mb: peak_kb as f64 / 1024.0,
    })
}

/// Runs capture until it exits; the snapshot's seconds (from its
/// `oncely_capture_snapshot_running` gauge), its CPU seconds and peak RSS.
async fn run_capture(config: &std::path::Path, metrics_port: u16) -> Result<(f64, f64, u64)> {
    let bin = bench_support::oncely_binary()?;
    let mut child = bench_support::spawn_capture(Command::new(&bin), config)?;
    let pid = child.id();
    let mut started: Option<Instant> = None;
    let (mut peak_kb, mut cpu_secs) = (0, 0.0);
    let deadline = Instant::now() + Duration::from_secs(1800);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the snapshot did not finish in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let running = bench_support::scrape(metrics_port, "oncely_capture_snapshot_running").await;
        if running == Some(1.0) {
            started.get_or_insert_with(Instant::now);
        }
        if started.is_some() {
            // The process exits when done: keep the last values seen.
            peak_kb = peak_kb.max(bench_support::rss_kb(pid, "VmHWM:"));
            cpu_secs = f64::max(cpu_secs, bench_support::cpu_seconds(pid));
        }
    };
    let secs = started
        .map(|s| s.elapsed().as_secs_f64())
        .context("the snapshot never reported running")?;
    if !status.success() {
        bail!("capture exited with {status}; see its stderr above");
    }
    Ok((secs, cpu_secs, peak_kb))
}

fn print_run(r: &Run) {
    println!(
        "  {:<13} snapshot {:8.0} rows/s ({:5.1}% of COPY, {:5.1}% of its floor) | floor {:8.0} records/s ({:5.1}% of COPY) | {:6.0} B/record | CPU {:5.1} µs/row capture, {:4.1} µs/record floor producer | RSS peak {:.0} MB",
        r.format.name(),
        r.snap_rate,
        100.0 * r.snap_rate / r.copy_rate,
        100.0 * r.snap_rate / r.floor_rate,
        r.floor_rate,
        100.0 * r.floor_rate / r.copy_rate,
        r.record_bytes,
        r.cpu_us,
        r.floor_cpu_us,
        r.peak_mb
    );
}

/// Each format's median over the rounds, as % of its round's COPY.
fn print_summary(runs: &[Run], formats: &[Format]) {
    println!("median over rounds     snapshot %COPY   floor %COPY   B/record   capture µs/row");
    for &f in formats {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.format == f).collect();
        let median = |v: &dyn Fn(&Run) -> f64| {
            let mut x: Vec<f64> = mine.iter().map(|r| v(r)).collect();
            x.sort_by(f64::total_cmp);
            x.get(x.len() / 2).copied().unwrap_or(0.0)
        };
        println!(
            "  {:<13}        {:10.1}   {:11.1}   {:8.0}   {:14.1}",
            f.name(),
            median(&|r| 100.0 * r.snap_rate / r.copy_rate),
            median(&|r| 100.0 * r.floor_rate / r.copy_rate),
            median(&|r| r.record_bytes),
            median(&|r| r.cpu_us)
        );
    }
}
