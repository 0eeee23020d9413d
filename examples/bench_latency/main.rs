//! End-to-end latency and sustainable rate: source commit -> visible in each target.
//!
//! Starts `oncely capture` and the three prebuilt sinks (PostgreSQL warehouse,
//! Elasticsearch, Redis) as separate release processes on a fresh database,
//! then a writer commits upserts of a 200-row table at a fixed rate (one
//! transaction every 10 ms) while one observer per target polls every 5 ms
//! for the highest change number it can read. A transaction counts as visible
//! in a target when the target shows its change number or a later one; the
//! topic has one partition and the sinks apply in order, so a later number
//! implies the earlier ones landed. Latency runs from just before the
//! writer sends the transaction to the poll that saw it, so it includes the
//! source write and up to one poll interval.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo build --release && cargo run --release --example bench_latency -- --rate 5000 --seconds 180 \
//!     --ramp 10000,15000,20000,30000 --step-seconds 30
//! ```
//!
//! A ramp step counts as sustained when the writer reached 95 % of the rate and
//! the p99 of the step's second half stayed under one second (lag bounded).
//!
//! Elasticsearch is read by search (searchable after a refresh) unless
//! `BENCH_ES_GET` is set (real-time get by id). The index refreshes every
//! `BENCH_ES_REFRESH` (default `1s`, set explicitly; `unset` leaves it to
//! Elasticsearch, whose unsearched shards then go search-idle).
#[path = "../bench_support/mod.rs"]
mod bench_support;
mod probe;
mod report;
mod setup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use elasticsearch::http::transport::Transport;
use elasticsearch::Elasticsearch;

/// Rows the writer cycles through by default (`--keys`): a hot set, so every
/// row is updated many times per second.
const KEYS: i64 = 200;
const TICK: Duration = Duration::from_millis(10);
/// Observers poll this often unless `BENCH_POLL_MS` says otherwise.
const POLL_MS: u64 = 5;
/// "kafka" is not a target but a waypoint: committed in the topic (read_committed),
/// which splits capture's share of the latency from the sinks'.
const TARGETS: [&str; 4] = ["kafka", "postgres", "elasticsearch", "redis"];

struct Args {
    rate: u64,
    seconds: u64,
    warmup: u64,
    ramp: Vec<u64>,
    step_seconds: u64,
    keys: i64,
}

fn args() -> Result<Args> {
    let mut a = Args {
        rate: 5000,
        seconds: 180,
        warmup: 10,
        ramp: Vec::new(),
        step_seconds: 30,
        keys: KEYS,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rate" => a.rate = value.parse()?,
            "--seconds" => a.seconds = value.parse()?,
            "--warmup" => a.warmup = value.parse()?,
            "--step-seconds" => a.step_seconds = value.parse()?,
            "--keys" => a.keys = value.parse()?,
            "--ramp" => {
                a.ramp = value
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            other => {
                bail!("unknown flag {other}; use --rate --seconds --warmup --ramp --step-seconds --keys")
            }
        }
    }
    if a.rate < 100 {
        bail!("--rate must be at least 100 changes/s (one transaction per 10 ms)");
    }
    Ok(a)
}

/// One committed source transaction: its highest change number and when it was sent.
struct Sent {
    n: i64,
    /// The row that carries `n` (the transaction's last).
    key: i64,
    at: Instant,
    phase: usize,
}

/// The writer's log, read by the observers.
#[derive(Default)]
struct Log {
    sent: Vec<Sent>,
}

/// Per target: latencies (seconds) per phase, tagged with the send time.
type Seen = Arc<Mutex<Vec<(usize, Instant, f64)>>>;
/// Per observer: when each poll was sent and how long its answer took (a slow
/// answer delays what the poll sees, so it tells a slow target from a slow reader).
type ProbeTimes = Arc<Mutex<Vec<(Instant, f64)>>>;
/// Per target: the highest change number its observer saw.
type Visible = BTreeMap<&'static str, Arc<std::sync::atomic::AtomicI64>>;

struct Processes {
    children: Vec<(String, Child)>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for (_, c) in &mut self.children {
            let _ = c.wait();
        }
    }
}

fn spawn(bin: &Path, what: &str, config: &Path, log: &Path) -> Result<Child> {
    let log = std::fs::File::create(log)?;
    Command::new(bin)
        .args([what, "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {} {what}", bin.display()))
}

/// What [`prepare`] made: the databases, the config files, the topic and the
/// index of one run, and the connections the later steps use.
struct Bench {
    services: bench_support::Services,
    redis_url: String,
    admin: tokio_postgres::Client,
    src: tokio_postgres::Client,
    db: String,
    dw: String,
    dir: PathBuf,
    slot: String,
    prefix: String,
    capture: PathBuf,
    sinks: [(&'static str, PathBuf); 3],
    targets: Vec<&'static str>,
    dw_cfg: tokio_postgres::Config,
    index: String,
    es: Elasticsearch,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    let bench = prepare().await?;
    let mut procs = start_processes(&bench)?;
    let observers = probe::start_observers(&bench).await?;
    warm_up(&bench, &mut procs, &observers.visible).await?;
    let (phases, achieved, n) = run_phases(&args, &bench, &mut procs, &observers.log).await?;
    drain(&bench.targets, &observers.visible, n).await?;
    let (targets, seen, probe_time) = observers.stop().await?;
    drop(procs);
    clean_up(bench).await?;
    let sustained = report::latencies(&phases, &achieved, &targets, &seen);
    report::probe_times(&probe_time);
    match sustained {
        Some(r) => {
            println!("highest rate with bounded lag (p99 of the second half < 1 s): {r} changes/s")
        }
        None => println!("no phase kept lag bounded"),
    }
    Ok(())
}

/// The source and warehouse databases, the config files, the topic and the index.
async fn prepare() -> Result<Bench> {
    let services = bench_support::Services::from_env()?;
    let es_url = bench_support::env("ONCELY_ES_URL")?;
    let redis_url = bench_support::env("ONCELY_REDIS_URL")?;

    let tag = bench_support::tag();
    let db = format!("lat_{tag}");
    let dw = format!("lat_{tag}_dw");
    let admin = services.admin().await?;
    let src = services.create_database(&admin, &db).await?;
    services.create_database(&admin, &dw).await?;
    src.batch_execute(
        "CREATE TABLE ticks (id bigint PRIMARY KEY, n bigint NOT NULL, note text NOT NULL)",
    )
    .await?;

    let dir = std::env::temp_dir().join(&db);
    std::fs::create_dir_all(&dir)?;
    let slot = format!("lat_{tag}");
    let prefix = format!("lat-{tag}");
    let (capture, sinks) = setup::write_configs(
        &services,
        &dir,
        (&db, &dw, &slot, &prefix),
        &es_url,
        &redis_url,
    )?;
    // BENCH_TARGETS=kafka,postgres runs only those sinks (kafka is always observed).
    let targets: Vec<&str> = match std::env::var("BENCH_TARGETS") {
        Ok(list) => TARGETS
            .into_iter()
            .filter(|t| *t == "kafka" || list.split(',').any(|l| l.trim() == *t))
            .collect(),
        Err(_) => TARGETS.to_vec(),
    };
    let mut dw_cfg = services.pg.clone();
    dw_cfg.dbname(&dw);

    // The sinks subscribe before capture's first event would create the topic.
    setup::create_topic(&services.brokers, &format!("{prefix}.public.ticks")).await?;
    let index = format!("{prefix}.public.ticks");
    let es = Elasticsearch::new(Transport::single_node(&es_url)?);
    setup::create_index(&es, &index).await?;
    Ok(Bench {
        services,
        redis_url,
        admin,
        src,
        db,
        dw,
        dir,
        slot,
        prefix,
        capture,
        sinks,
        targets,
        dw_cfg,
        index,
        es,
    })
}

/// Capture and the sinks of the chosen targets, as release processes.
fn start_processes(bench: &Bench) -> Result<Processes> {
    let dir = &bench.dir;
    let bin = bench_support::oncely_binary()?;
    let mut procs = Processes {
        children: vec![(
            "capture".into(),
            spawn(&bin, "capture", &bench.capture, &dir.join("capture.log"))?,
        )],
    };
    for (name, config) in bench
        .sinks
        .iter()
        .filter(|(n, _)| bench.targets.contains(n))
    {
        let log = dir.join(format!("sink-{name}.log"));
        procs
            .children
            .push((name.to_string(), spawn(&bin, "sink", config, &log)?));
    }
    eprintln!("processes and logs in {}", dir.display());
    Ok(procs)
}

/// Bails out when one of the processes exited.
fn check_running(procs: &mut Processes, dir: &Path) -> Result<()> {
    for (name, c) in &mut procs.children {
        if let Some(status) = c.try_wait()? {
            bail!("{name} exited with {status}; log in {}", dir.display());
        }
    }
    Ok(())
}

/// Warm-up row, rewritten each second until every target shows it (a write
/// made before capture created its slot is not streamed).
async fn warm_up(bench: &Bench, procs: &mut Processes, visible: &Visible) -> Result<()> {
    let (src, dir) = (&bench.src, &bench.dir);
    let t = Instant::now();
    let mut last_write: Option<Instant> = None;
    while bench
        .targets
        .iter()
        .any(|t| visible[t].load(std::sync::atomic::Ordering::SeqCst) < 0)
    {
        if t.elapsed() > Duration::from_secs(180) {
            bail!(
                "the pipeline did not deliver the first row within 180 s; logs in {}",
                dir.display()
            );
        }
        check_running(procs, dir)?;
        if last_write.is_none_or(|w| w.elapsed() > Duration::from_secs(1)) {
            src.execute(
                "INSERT INTO ticks VALUES (0, 0, 'warm-up') ON CONFLICT (id) DO UPDATE SET note = now()::text",
                &[],
            )
            .await?;
            last_write = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("pipeline ready after {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// Phases: [warm-up, main rate, ramp steps...] as (rate, seconds); runs them
/// and returns them, the rate the writer achieved in each and the last change number.
async fn run_phases(
    args: &Args,
    bench: &Bench,
    procs: &mut Processes,
    log: &Mutex<Log>,
) -> Result<(Vec<(u64, u64)>, Vec<f64>, i64)> {
    let mut phases = vec![(args.rate, args.warmup), (args.rate, args.seconds)];
    phases.extend(args.ramp.iter().map(|r| (*r, args.step_seconds)));
    let mut achieved = Vec::new();
    let mut cursor = 0i64;
    let mut n: i64 = 0;
    for (phase, (rate, seconds)) in phases.iter().enumerate() {
        eprintln!("phase {phase}: {rate} changes/s for {seconds}s");
        let mut interval = tokio::time::interval(TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let started = Instant::now();
        let cpu_before: Vec<f64> = procs
            .children
            .iter()
            .map(|(_, c)| bench_support::cpu_seconds(c.id()))
            .collect();
        let mut changes = 0i64;
        loop {
            interval.tick().await;
            let elapsed = started.elapsed().as_secs_f64();
            if elapsed >= *seconds as f64 {
                break;
            }
            // Send what the rate says is due by now, in transactions of at most
            // KEYS distinct rows, so a slow tick is made up by the next one.
            let mut due = (*rate as f64 * elapsed) as i64 - changes;
            while due > 0 {
                let take = due.min(args.keys);
                // Distinct ids per transaction (ON CONFLICT may touch a row once).
                let ids: Vec<i64> = (0..take).map(|i| (cursor + i) % args.keys).collect();
                cursor = (cursor + take) % args.keys;
                let ns: Vec<i64> = (1..=take).map(|i| n + i).collect();
                let at = Instant::now();
                bench.src.execute(
                    "INSERT INTO ticks (id, n, note) SELECT id, n, 'tick ' || n FROM unnest($1::bigint[], $2::bigint[]) AS u(id, n)
                     ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n, note = EXCLUDED.note",
                    &[&ids, &ns],
                )
                .await?;
                n += take;
                changes += take;
                due -= take;
                let key = ids[ids.len() - 1];
                log.lock().unwrap().sent.push(Sent { n, key, at, phase });
            }
        }
        let rate_done = changes as f64 / started.elapsed().as_secs_f64();
        achieved.push(rate_done);
        eprintln!("  writer achieved {rate_done:.0} changes/s");
        // What each oncely process cost (cores = CPU seconds per second).
        let secs = started.elapsed().as_secs_f64();
        let cpu: Vec<String> = procs
            .children
            .iter()
            .zip(&cpu_before)
            .map(|((name, c), before)| {
                let cores = (bench_support::cpu_seconds(c.id()) - before) / secs;
                format!("{name} {cores:.2}")
            })
            .collect();
        eprintln!("  cores used: {}", cpu.join(", "));
        check_running(procs, &bench.dir)?;
    }
    Ok((phases, achieved, n))
}

/// Drain: every target shows the last change `n`.
async fn drain(targets: &[&'static str], visible: &Visible, n: i64) -> Result<()> {
    let t = Instant::now();
    while targets
        .iter()
        .any(|t| visible[t].load(std::sync::atomic::Ordering::SeqCst) < n)
    {
        if t.elapsed() > Duration::from_secs(300) {
            bail!("targets did not catch up within 300 s after the writer stopped");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Drops the slot, the index, the databases and the topics of the run.
async fn clean_up(bench: Bench) -> Result<()> {
    let Bench {
        services,
        admin,
        src,
        db,
        dw,
        slot,
        prefix,
        targets,
        index,
        es,
        ..
    } = bench;
    src.query_one("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .context("drop the benchmark's slot")?;
    if targets.contains(&"elasticsearch") {
        report::print_index_stats(&es, &index).await;
    }
    // Clean up: an index left with an explicit refresh_interval is refreshed
    // forever (never search-idle), which skews every later run on this cluster.
    es.indices()
        .delete(elasticsearch::indices::IndicesDeleteParts::Index(&[&index]))
        .send()
        .await
        .context("delete the benchmark's index")?;
    drop(src);
    for name in [&db, &dw] {
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .with_context(|| format!("drop database {name}"))?;
    }
    setup::delete_topics(
        &services.brokers,
        &[
            &format!("{prefix}.public.ticks"),
            &format!("{prefix}-offsets"),
            &format!("{prefix}-dlq"),
        ],
    )
    .await;
    Ok(())
}
