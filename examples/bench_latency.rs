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
mod bench_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use elasticsearch::http::transport::Transport;
use elasticsearch::indices::IndicesCreateParts;
use elasticsearch::{Elasticsearch, SearchParts};
use serde_json::{json, Value};
use tokio_postgres::NoTls;

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

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    let services = bench_support::Services::from_env()?;
    let (host, port, user) = (&services.host, services.port, &services.user);
    let (pg, brokers) = (&services.pg, &services.brokers);
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
    // Unset: the product's defaults.
    let capture_batch = std::env::var("BENCH_CAPTURE_BATCH_MS")
        .map(|ms| format!("batch.max.ms = {ms}\n"))
        .unwrap_or_default();
    // Extra capture settings, e.g. 'schemas.enable = false'.
    let capture_extra = std::env::var("BENCH_CAPTURE_EXTRA").unwrap_or_default();
    let sink_batch = std::env::var("BENCH_SINK_BATCH_MS")
        .map(|ms| format!("batch.max.ms = {ms}\n"))
        .unwrap_or_default();
    // Extra Elasticsearch sink settings, e.g. 'refresh = true'.
    let es_extra = std::env::var("BENCH_ES_EXTRA").unwrap_or_default();
    let write = |name: &str, body: String| -> Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, body)?;
        Ok(p)
    };
    let capture = write(
        "capture.toml",
        format!(
            "topic.prefix = \"{prefix}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             publication.name = \"{slot}\"\npublication.autocreate.mode = \"filtered\"\n\
             table.include.list = \"public\\\\.ticks\"\n{capture_batch}\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"{prefix}-offsets\"\n\
             {capture_extra}\n"
        ),
    )?;
    // Extra librdkafka consumer properties for the sinks, e.g. '"fetch.wait.max.ms" = "20"'.
    let sink_kafka = std::env::var("BENCH_SINK_KAFKA").unwrap_or_default();
    // Extra runner settings for every sink, e.g. 'metrics.listen = "127.0.0.1:9464"'.
    let sink_extra = std::env::var("BENCH_SINK_EXTRA").unwrap_or_default();
    // BENCH_TARGETS=kafka,postgres runs only those sinks (kafka is always observed).
    let targets: Vec<&str> = match std::env::var("BENCH_TARGETS") {
        Ok(list) => TARGETS
            .into_iter()
            .filter(|t| *t == "kafka" || list.split(',').any(|l| l.trim() == *t))
            .collect(),
        Err(_) => TARGETS.to_vec(),
    };
    let runner = |group: &str| {
        format!(
            "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{prefix}-{group}\"\n\
             topics = [\"{prefix}.public.ticks\"]\n{sink_batch}\
             errors.deadletterqueue.topic.name = \"{prefix}-dlq\"\n{sink_extra}\n[kafka]\n{sink_kafka}\n"
        )
    };
    let mut dw_cfg = pg.clone();
    dw_cfg.dbname(&dw);
    let dw_url = format!("postgres://{user}@{host}:{port}/{dw}");
    let sinks = [
        (
            "postgres",
            write(
                "sink-postgres.toml",
                format!("{}[sink]\nkind = \"postgres\"\nurl = \"{dw_url}\"\n", runner("pg")),
            )?,
        ),
        (
            "elasticsearch",
            write(
                "sink-elasticsearch.toml",
                format!(
                    "{}[sink]\nkind = \"elasticsearch\"\nurl = \"{es_url}\"\n{es_extra}\n",
                    runner("es")
                ),
            )?,
        ),
        (
            "redis",
            write(
                "sink-redis.toml",
                format!(
                    "{}[sink]\nkind = \"redis\"\nurl = \"{redis_url}\"\nkey.pattern = \"{prefix}:{{table}}:{{key}}\"\n",
                    runner("redis")
                ),
            )?,
        ),
    ];

    // The sinks subscribe before capture's first event would create the topic.
    create_topic(brokers, &format!("{prefix}.public.ticks")).await?;
    let index = format!("{prefix}.public.ticks");
    let es = Elasticsearch::new(Transport::single_node(&es_url)?);
    // The slow log names any single document that took long to index.
    let mut settings = json!({"number_of_replicas": 0,
                              "indexing.slowlog.threshold.index.warn": "300ms"});
    // Every second unless BENCH_ES_REFRESH says otherwise, and explicitly: with
    // the setting unset, a shard nobody searches goes search-idle after 30 s
    // and stops its periodic refreshes; updates then pile up and are written
    // in one burst when the indexing buffer fills, and a real-time get waits
    // for that burst (seconds here). An index users search never goes idle.
    let refresh = std::env::var("BENCH_ES_REFRESH").unwrap_or_else(|_| "1s".into());
    if refresh != "unset" {
        settings["refresh_interval"] = json!(refresh);
    }
    es.indices()
        .create(IndicesCreateParts::Index(&index))
        .body(json!({"settings": settings, "mappings": {"properties": {"n": {"type": "long"}}}}))
        .send()
        .await?
        .error_for_status_code()
        .context("create the benchmark index")?;

    let bin = bench_support::oncely_binary()?;
    let mut procs = Processes {
        children: vec![(
            "capture".into(),
            spawn(&bin, "capture", &capture, &dir.join("capture.log"))?,
        )],
    };
    for (name, config) in sinks.iter().filter(|(n, _)| targets.contains(n)) {
        let log = dir.join(format!("sink-{name}.log"));
        procs
            .children
            .push((name.to_string(), spawn(&bin, "sink", config, &log)?));
    }
    eprintln!("processes and logs in {}", dir.display());

    // Observers.
    let redis = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let log = Arc::new(Mutex::new(Log::default()));
    let mut seen: BTreeMap<&str, Seen> = BTreeMap::new();
    let visible: BTreeMap<&str, Arc<std::sync::atomic::AtomicI64>> = targets
        .iter()
        .map(|t| (*t, Arc::new(std::sync::atomic::AtomicI64::new(-1))))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_kafka = Arc::new(std::sync::atomic::AtomicI64::new(-1));
    tokio::spawn(watch_topic(
        brokers.clone(),
        format!("{prefix}.public.ticks"),
        in_kafka.clone(),
    ));
    let poll =
        Duration::from_millis(std::env::var("BENCH_POLL_MS").map_or(Ok(POLL_MS), |v| v.parse())?);
    let es_get = std::env::var("BENCH_ES_GET").is_ok();
    let mut observers = Vec::new();
    let mut probe_time: BTreeMap<&str, ProbeTimes> = BTreeMap::new();
    for &target in &targets {
        let s: Seen = Arc::default();
        seen.insert(target, s.clone());
        let (log, stop, visible) = (log.clone(), stop.clone(), visible[target].clone());
        let probe = Probe {
            target,
            dw: if target == "postgres" {
                let (c, conn) = dw_cfg.connect(NoTls).await?;
                tokio::spawn(conn);
                Some(c)
            } else {
                None
            },
            es: es.clone(),
            index: index.clone(),
            redis: redis.clone(),
            prefix: prefix.clone(),
            in_kafka: in_kafka.clone(),
            es_get,
        };
        let probe_times: ProbeTimes = Arc::default();
        probe_time.insert(target, probe_times.clone());
        observers.push(tokio::spawn(async move {
            let mut next = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let pending: Vec<(i64, i64)> = {
                    let log = log.lock().unwrap();
                    log.sent
                        .iter()
                        .skip(next)
                        .take(64)
                        .map(|s| (s.key, s.n))
                        .collect()
                };
                let asked = Instant::now();
                let max = probe.max_n(&pending).await;
                let now = Instant::now();
                probe_times
                    .lock()
                    .unwrap()
                    .push((asked, (now - asked).as_secs_f64()));
                visible.fetch_max(max, std::sync::atomic::Ordering::SeqCst);
                {
                    let log = log.lock().unwrap();
                    let mut out = s.lock().unwrap();
                    while next < log.sent.len() && log.sent[next].n <= max {
                        let sent = &log.sent[next];
                        out.push((sent.phase, sent.at, (now - sent.at).as_secs_f64()));
                        next += 1;
                    }
                }
                tokio::time::sleep(poll).await;
            }
        }));
    }

    // Warm-up row, rewritten each second until every target shows it (a write
    // made before capture created its slot is not streamed).
    let mut n: i64 = 0;
    let t = Instant::now();
    let mut last_write: Option<Instant> = None;
    while targets
        .iter()
        .any(|t| visible[t].load(std::sync::atomic::Ordering::SeqCst) < 0)
    {
        if t.elapsed() > Duration::from_secs(180) {
            bail!(
                "the pipeline did not deliver the first row within 180 s; logs in {}",
                dir.display()
            );
        }
        for (name, c) in &mut procs.children {
            if let Some(status) = c.try_wait()? {
                bail!("{name} exited with {status}; log in {}", dir.display());
            }
        }
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

    // Phases: [warm-up, main rate, ramp steps...].
    let mut phases = vec![(args.rate, args.warmup), (args.rate, args.seconds)];
    phases.extend(args.ramp.iter().map(|r| (*r, args.step_seconds)));
    let mut achieved = Vec::new();
    let mut cursor = 0i64;
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
                src.execute(
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
        for (name, c) in &mut procs.children {
            if let Some(status) = c.try_wait()? {
                bail!("{name} exited with {status}; log in {}", dir.display());
            }
        }
    }
    // Drain: every target shows the last change.
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
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for o in observers {
        o.await?;
    }
    drop(procs);
    src.query_one("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .context("drop the benchmark's slot")?;
    if targets.contains(&"elasticsearch") {
        print_index_stats(&es, &index).await;
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
    delete_topics(
        brokers,
        &[
            &format!("{prefix}.public.ticks"),
            &format!("{prefix}-offsets"),
            &format!("{prefix}-dlq"),
        ],
    )
    .await;

    println!(
        "| phase | target rate | achieved | target | p50 ms | p99 ms | max ms | transactions |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut sustained: Option<u64> = None;
    for (phase, (rate, seconds)) in phases.iter().enumerate().skip(1) {
        let mut step_ok = achieved[phase] >= 0.95 * *rate as f64;
        for &target in &targets {
            let all = seen[target].lock().unwrap();
            let mut lat: Vec<f64> = all.iter().filter(|s| s.0 == phase).map(|s| s.2).collect();
            let first = all.iter().find(|s| s.0 == phase).map(|s| s.1);
            let mut second_half: Vec<f64> = all
                .iter()
                .filter(|s| {
                    s.0 == phase
                        && first.is_some_and(|f| {
                            s.1.duration_since(f).as_secs_f64() >= *seconds as f64 / 2.0
                        })
                })
                .map(|s| s.2)
                .collect();
            let (p50, p99, max) = percentiles(&mut lat);
            let (_, p99_late, _) = percentiles(&mut second_half);
            step_ok &= p99_late < 1.0;
            println!(
                "| {phase} | {rate} | {:.0} | {target} | {:.0} | {:.0} | {:.0} | {} |",
                achieved[phase],
                p50 * 1e3,
                p99 * 1e3,
                max * 1e3,
                lat.len()
            );
        }
        if phase >= 1 && step_ok {
            sustained = Some(sustained.map_or(*rate, |s| s.max(*rate)));
        }
    }
    // How long each target took to answer a poll: a stall in a target that its
    // reads also show is the target's, one they don't is upstream of it.
    let (now, wall) = (Instant::now(), chrono::Utc::now());
    for (target, times) in &probe_time {
        let times = times.lock().unwrap();
        let mut took: Vec<f64> = times.iter().map(|t| t.1).collect();
        let (p50, p99, max) = percentiles(&mut took);
        let slow: Vec<String> = times
            .iter()
            .filter(|t| t.1 >= 0.5)
            .map(|t| {
                let ago = chrono::Duration::from_std(now - t.0).unwrap_or_default();
                format!(
                    "{:.0} ms at {}",
                    t.1 * 1e3,
                    (wall - ago).format("%H:%M:%S%.3f")
                )
            })
            .collect();
        println!(
            "{target} observer: {} polls answered in p50 {:.1} / p99 {:.1} / max {:.0} ms{}",
            took.len(),
            p50 * 1e3,
            p99 * 1e3,
            max * 1e3,
            if slow.is_empty() {
                String::new()
            } else {
                format!("; slow (>= 500 ms): {}", slow.join(", "))
            }
        );
    }
    match sustained {
        Some(r) => {
            println!("highest rate with bounded lag (p99 of the second half < 1 s): {r} changes/s")
        }
        None => println!("no phase kept lag bounded"),
    }
    Ok(())
}

/// What the index did during the run: refreshes (a real-time get of a document
/// changed since the last refresh forces an internal one), merges, gets, GC.
async fn print_index_stats(es: &Elasticsearch, index: &str) {
    let stats = async {
        es.indices()
            .stats(elasticsearch::indices::IndicesStatsParts::Index(&[index]))
            .send()
            .await?
            .json::<Value>()
            .await
    };
    let Ok(stats) = stats.await else {
        return eprintln!("cannot read the index's stats");
    };
    let t = &stats["indices"][index]["total"];
    println!(
        "elasticsearch index: {} refreshes ({} scheduled or explicit) taking {} ms, \
         {} merges taking {} ms, {} segments at the end, {} gets taking {} ms, {} docs indexed taking {} ms",
        t["refresh"]["total"],
        t["refresh"]["external_total"],
        t["refresh"]["total_time_in_millis"],
        t["merges"]["total"],
        t["merges"]["total_time_in_millis"],
        t["segments"]["count"],
        t["get"]["total"],
        t["get"]["time_in_millis"],
        t["indexing"]["index_total"],
        t["indexing"]["index_time_in_millis"],
    );
}

async fn create_topic(brokers: &str, topic: &str) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topic = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for result in admin.create_topics([&topic], &AdminOptions::new()).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    Ok(())
}

/// Deletes the benchmark's topics (best effort: a topic never created is no error).
async fn delete_topics(brokers: &str, topics: &[&str]) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: Result<AdminClient<rdkafka::client::DefaultClientContext>, _> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create();
    if let Ok(admin) = admin {
        let _ = admin.delete_topics(topics, &AdminOptions::new()).await;
    }
}

fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

/// Reads the highest change number visible in one target (-1 when none yet).
struct Probe {
    target: &'static str,
    dw: Option<tokio_postgres::Client>,
    es: Elasticsearch,
    index: String,
    redis: redis::aio::MultiplexedConnection,
    prefix: String,
    in_kafka: Arc<std::sync::atomic::AtomicI64>,
    /// `BENCH_ES_GET`: read Elasticsearch by a real-time multi-get instead of a search.
    es_get: bool,
}

/// Follows the topic with `read_committed` and publishes the highest change number seen.
async fn watch_topic(brokers: String, topic: String, max: Arc<std::sync::atomic::AtomicI64>) {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    let consumer: StreamConsumer = match rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("{topic}-observer"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .create()
    {
        Ok(c) => c,
        Err(e) => return eprintln!("kafka observer: {e}"),
    };
    if let Err(e) = consumer.subscribe(&[&topic]) {
        return eprintln!("kafka observer: {e}");
    }
    loop {
        let Ok(m) = consumer.recv().await else {
            continue;
        };
        // Typed, so the rest of the envelope (and its schema) is skipped, not built.
        #[derive(serde::Deserialize)]
        struct Row {
            n: i64,
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            after: Option<Row>,
        }
        #[derive(serde::Deserialize)]
        struct Top {
            payload: Option<Envelope>,
            after: Option<Row>,
        }
        let Some(Ok(top)) = m.payload().map(serde_json::from_slice::<Top>) else {
            continue; // a tombstone
        };
        if let Some(row) = top.payload.and_then(|p| p.after).or(top.after) {
            max.fetch_max(row.n, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Probe {
    /// The highest change number known visible. `pending`: (row, change number)
    /// of the transactions not yet seen, oldest first. A row showing a change
    /// number at or past a transaction's proves that transaction landed (the
    /// sinks apply one partition in order); with nothing pending, the warm-up row.
    async fn max_n(&self, pending: &[(i64, i64)]) -> i64 {
        if self.target == "kafka" {
            return self.in_kafka.load(std::sync::atomic::Ordering::SeqCst);
        }
        let warm_up = [(0, 0)];
        let rows = if pending.is_empty() {
            &warm_up[..]
        } else {
            pending
        };
        let keys: Vec<i64> = rows.iter().map(|(k, _)| *k).collect();
        let Some(stored) = self.stored_n(&keys).await else {
            return -1;
        };
        if pending.is_empty() {
            return stored.get(&0).copied().unwrap_or(-1);
        }
        let mut max = -1;
        for (key, n) in pending {
            if stored.get(key).is_some_and(|s| s >= n) {
                max = *n;
            } else {
                break;
            }
        }
        max
    }

    /// The change number each of `keys` shows in the target.
    async fn stored_n(&self, keys: &[i64]) -> Option<std::collections::HashMap<i64, i64>> {
        match self.target {
            "postgres" => {
                let rows = self
                    .dw
                    .as_ref()?
                    .query(
                        "SELECT id, n FROM public_ticks WHERE id = ANY($1)",
                        &[&keys],
                    )
                    .await
                    .ok()?;
                Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            }
            "elasticsearch" => {
                // Searchable, not merely stored (a get by id would be real-time):
                // a search sees what the last refresh published.
                let ids: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                let resp = if self.es_get {
                    self.es
                        .mget(elasticsearch::MgetParts::Index(&self.index))
                        .body(json!({"ids": ids}))
                        .send()
                        .await
                        .ok()?
                } else {
                    self.es
                        .search(SearchParts::Index(&[&self.index]))
                        .body(json!({"size": ids.len(), "_source": ["id", "n"],
                                     "query": {"ids": {"values": ids}}}))
                        .send()
                        .await
                        .ok()?
                };
                let body = resp.json::<Value>().await.ok()?;
                Some(
                    body["hits"]["hits"]
                        .as_array()
                        .or(body["docs"].as_array())?
                        .iter()
                        .filter_map(|h| {
                            Some((h["_source"]["id"].as_i64()?, h["_source"]["n"].as_i64()?))
                        })
                        .collect(),
                )
            }
            _ => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.hget(format!("{}:ticks:{key}", self.prefix), "n");
                }
                let mut conn = self.redis.clone();
                let values: Vec<Option<i64>> = pipe.query_async(&mut conn).await.ok()?;
                Some(
                    keys.iter()
                        .zip(values)
                        .filter_map(|(k, v)| Some((*k, v?)))
                        .collect(),
                )
            }
        }
    }
}
