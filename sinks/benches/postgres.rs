//! Apply rate of the postgres sink (Kafka -> runner -> warehouse) next to a plain
//! client doing the same set-based versioned upserts without Kafka, in the same run.
//!
//! ```sh
//! eval "$(scripts/services env)"
//! cargo bench -p oncely-sinks --bench postgres -- 1000000   # events (default 200000)
//! ```
//!
//! Events are updates (schemas off) of `events / 10` keys, versions increasing;
//! both sides use batches of `BATCH` events collapsed to the newest per key, one
//! transaction each. The plain client binds typed arrays and stores no position;
//! the sink also decodes the envelopes, converts text values in SQL and stores its
//! position in the same transaction. Both targets are checked equal at the end.
//! The "sink.apply without Kafka" line calls `prepare` on each batch (untimed,
//! printed apart, as the runner does it ahead) and times `apply` alone.
//! The plain client runs first and again last (the ratio uses the mean of its
//! two times), and every phase's table is vacuumed, untimed, before the next
//! phase, so that no phase carries another's background work alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_sinks::kinds::postgres::{PostgresConfig, PostgresSink};
use oncely_sinks::{Runner, RunnerConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::json;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;

// The allocator the `oncely` binary runs the sink with (both sides get it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 2000;
const DEFAULT_EVENTS: usize = 200_000;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Event {
    id: i64,
    name: String,
    qty: i64,
    price: String,
    lsn: i64,
}

fn env(name: &str) -> Res<String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set: eval \"$(scripts/services env)\"").into())
}

fn events(n: usize) -> Vec<Event> {
    let keys = (n / 10).max(1) as u64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Event {
                id: (x % keys) as i64,
                name: format!("item-{i}"),
                qty: i as i64,
                price: format!("{}.{:02}", i % 10_000, i % 100),
                lsn: 1_000 + i as i64,
            }
        })
        .collect()
}

fn db_url(base: &str, db: &str) -> String {
    let head = base.split('?').next().unwrap_or(base);
    match head.rfind('/') {
        Some(i) if i > head.find("//").map_or(0, |j| j + 1) => format!("{}/{db}", &head[..i]),
        _ => format!("{head}/{db}"),
    }
}

async fn connect(url: &str) -> Res<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// CPU time and run-queue wait of server processes, from `/proc/<pid>/schedstat`:
/// shows whether a phase's backend works longer per event or waits for a core.
/// Zero when the server does not run on this machine.
#[derive(Debug, Default, Clone, Copy)]
struct Sched {
    cpu: Duration,
    wait: Duration,
}

impl Sched {
    fn of(pids: &[i32]) -> Self {
        let mut total = Self::default();
        for pid in pids {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/schedstat")) else {
                continue;
            };
            let mut fields = text
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0));
            total.cpu += Duration::from_nanos(fields.next().unwrap_or(0));
            total.wait += Duration::from_nanos(fields.next().unwrap_or(0));
        }
        total
    }

    fn since(self, start: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(start.cpu),
            wait: self.wait.saturating_sub(start.wait),
        }
    }

    fn per_event(self, n: usize) -> String {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        format!(
            "server backend {:.2} µs CPU + {:.2} µs waiting for a core per event",
            us(self.cpu),
            us(self.wait)
        )
    }
}

/// The server processes of this connection's database with `application_name` `app`.
async fn backends(client: &Client, app: &str) -> Res<Vec<i32>> {
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
            &[&app],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

async fn fresh_db(base: &str, name: &str) -> Res<String> {
    let admin = connect(base).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    Ok(db_url(base, name))
}

async fn produce(brokers: &str, topic: &str, events: &[Event]) -> Res<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| format!("create {t}: {e}"))?;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .create()?;
    for chunk in events.chunks(10_000) {
        let mut pending = Vec::with_capacity(chunk.len());
        for e in chunk {
            let key = json!({"id": e.id}).to_string();
            let value = json!({"before": null, "op": "u", "ts_ms": 0,
                "after": {"id": e.id, "name": e.name, "qty": e.qty, "price": e.price},
                "source": {"schema": "public", "table": "items", "commit_lsn": e.lsn, "event_seq": 0}})
            .to_string();
            let rec = FutureRecord::to(topic).key(&key).payload(&value);
            pending.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        }
        for p in pending {
            p.await?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// The plain client: per batch, newest per key, one `INSERT ... unnest ... ON CONFLICT` in a transaction.
async fn plain(url: &str, events: &[Event]) -> Res<(Duration, Sched)> {
    let mut c = connect(url).await?;
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    c.batch_execute(
        "CREATE TABLE public_items (id bigint PRIMARY KEY, name text, qty bigint, price text, \
         __oncely_lsn bigint NOT NULL, __oncely_seq bigint NOT NULL, \
         __oncely_deleted boolean NOT NULL DEFAULT false, __oncely_unavailable jsonb)",
    )
    .await?;
    let stmt = c
        .prepare(
            "INSERT INTO public_items AS t (id, name, qty, price, __oncely_lsn, __oncely_seq) \
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[]) \
             ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty, price = EXCLUDED.price, \
             __oncely_lsn = EXCLUDED.__oncely_lsn, __oncely_seq = EXCLUDED.__oncely_seq \
             WHERE (t.__oncely_lsn, t.__oncely_seq) < (EXCLUDED.__oncely_lsn, EXCLUDED.__oncely_seq)",
        )
        .await?;
    let started = Instant::now();
    let sched = Sched::of(&[pid]);
    for chunk in events.chunks(BATCH) {
        let mut newest: HashMap<i64, &Event> = HashMap::with_capacity(chunk.len());
        for e in chunk {
            newest.insert(e.id, e);
        }
        let rows: Vec<&Event> = newest.into_values().collect();
        let ids: Vec<i64> = rows.iter().map(|e| e.id).collect();
        let names: Vec<&str> = rows.iter().map(|e| e.name.as_str()).collect();
        let qtys: Vec<i64> = rows.iter().map(|e| e.qty).collect();
        let prices: Vec<&str> = rows.iter().map(|e| e.price.as_str()).collect();
        let lsns: Vec<i64> = rows.iter().map(|e| e.lsn).collect();
        let seqs: Vec<i64> = vec![0; rows.len()];
        let tx = c.transaction().await?;
        tx.execute(&stmt, &[&ids, &names, &qtys, &prices, &lsns, &seqs])
            .await?;
        tx.commit().await?;
    }
    Ok((started.elapsed(), Sched::of(&[pid]).since(sched)))
}

/// Timings of the sink behind the runner.
struct SinkRun {
    /// From building the sink to the last stored position.
    total: Duration,
    /// Events applied after the first stored position, and the time they took.
    steady: (usize, Duration),
    /// The sink's backends during the steady part.
    sched: Sched,
}

/// The sink behind the runner, until the last position is stored.
async fn sink(url: &str, brokers: &str, topic: &str, n: usize) -> Res<SinkRun> {
    let check = connect(url).await?;
    let started = Instant::now();
    let sink = PostgresSink::connect(&PostgresConfig::new(url)).await?;
    let mut config = RunnerConfig::new(brokers, format!("{topic}-g"), vec![topic.to_owned()]);
    config.batch_max_records = BATCH;
    config.batch_max_ms = 50;
    config.max_inflight_bytes = 64 * 1024 * 1024;
    let runner = Runner::new(config, Arc::new(sink))?;
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut first: Option<(i64, Instant)> = None;
    let mut sched = (Vec::new(), Sched::default());
    loop {
        let row = check
            .query_opt(
                "SELECT next_offset FROM oncely_positions WHERE topic = $1",
                &[&topic],
            )
            .await
            .ok()
            .flatten();
        let position = row.map(|r| r.get::<_, i64>(0));
        if let (None, Some(p)) = (first, position) {
            first = Some((p, Instant::now()));
            let pids = backends(&check, "oncely-sink-postgres").await?;
            sched = (pids.clone(), Sched::of(&pids));
        }
        if position >= Some(n as i64) {
            break;
        }
        if run.is_finished() || Instant::now() > deadline {
            return Err("the runner stopped or took too long".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (total, end) = (started.elapsed(), Instant::now());
    let steady_sched = Sched::of(&sched.0).since(sched.1);
    stop.cancel();
    run.await??;
    let (p0, t0) = first.unwrap_or((0, started));
    Ok(SinkRun {
        total,
        steady: (n - p0 as usize, end - t0),
        sched: steady_sched,
    })
}

/// Time spent decoding (key and value, as the runner does), in `Sink::prepare` and in `Sink::apply`.
#[derive(Default)]
struct Direct {
    decode: Duration,
    prepare: Duration,
    apply: Duration,
    /// The sink's backends over the whole phase (they only work in `apply`).
    sched: Sched,
}

/// `PostgresSink::prepare` then `apply` called directly with decoded batches:
/// the sink's own cost, no Kafka.
async fn direct(url: &str, events: &[Event]) -> Res<Direct> {
    use oncely_sinks::event::{decode_key, decode_value};
    use oncely_sinks::{Batch, Record, Sink};
    let sink = PostgresSink::connect(&PostgresConfig::new(url)).await?;
    let check = connect(url).await?;
    let pids = backends(&check, "oncely-sink-postgres").await?;
    let sched = Sched::of(&pids);
    let mut spent = Direct::default();
    for (b, chunk) in events.chunks(BATCH).enumerate() {
        let mut records = Vec::with_capacity(chunk.len());
        for (i, e) in chunk.iter().enumerate() {
            let key = json!({"id": e.id}).to_string();
            let value = json!({"before": null, "op": "u", "ts_ms": 0,
                "after": {"id": e.id, "name": e.name, "qty": e.qty, "price": e.price},
                "source": {"schema": "public", "table": "items", "commit_lsn": e.lsn, "event_seq": 0}})
            .to_string();
            let offset = (b * BATCH + i) as i64;
            let started = Instant::now();
            let payload = decode_value(Some(value.as_bytes()))?;
            let key = decode_key(Some(key.as_bytes()))?;
            spent.decode += started.elapsed();
            records.push(Record::new(offset, key, payload));
        }
        let next = ((b + 1) * BATCH) as i64;
        let mut batch = Batch::new(Arc::from("g"), (Arc::from("direct"), 0), records, next);
        // As the runner does, ahead of `apply` (there it overlaps the previous
        // batch's write): timed apart, so `apply` is the write path alone.
        let started = Instant::now();
        sink.prepare(&mut batch);
        spent.prepare += started.elapsed();
        let started = Instant::now();
        sink.apply(&batch).await?;
        spent.apply += started.elapsed();
    }
    spent.sched = Sched::of(&pids).since(sched);
    Ok(spent)
}

/// Vacuums a finished phase's table (untimed), so its autovacuum does not run
/// during the next phase.
async fn settle(url: &str) -> Res<()> {
    connect(url)
        .await?
        .batch_execute("VACUUM public_items")
        .await?;
    Ok(())
}

async fn digest(url: &str) -> Res<(i64, String)> {
    let row = connect(url)
        .await?
        .query_one(
            "SELECT count(*), md5(string_agg(id || ':' || name || ':' || qty || ':' || price, ',' ORDER BY id)) FROM public_items",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(DEFAULT_EVENTS);
    let (pg, brokers) = (env("ONCELY_PG_URL")?, env("ONCELY_KAFKA_BROKERS")?);
    let tag = format!("{:08x}", rand::random::<u32>());
    let topic = format!("bench-pg-{tag}");
    let events = events(n);
    let t = Instant::now();
    produce(&brokers, &topic, &events).await?;
    println!("produced {n} events to {topic} in {:.1?}", t.elapsed());

    // The plain client runs first and again last, so that what a phase leaves
    // behind (autovacuum of its table, the broker's and PostgreSQL's background
    // work) weighs on it as on the sink; each phase's table is vacuumed, untimed,
    // before the next phase starts.
    let plain_url = fresh_db(&pg, &format!("bench_plain_{tag}")).await?;
    let (plain_first, plain_first_sched) = plain(&plain_url, &events).await?;
    settle(&plain_url).await?;
    let sink_url = fresh_db(&pg, &format!("bench_sink_{tag}")).await?;
    let run = sink(&sink_url, &brokers, &topic, n).await?;
    settle(&sink_url).await?;
    let direct_url = fresh_db(&pg, &format!("bench_direct_{tag}")).await?;
    let direct_time = direct(&direct_url, &events).await?;
    settle(&direct_url).await?;
    let plain2_url = fresh_db(&pg, &format!("bench_plain2_{tag}")).await?;
    let (plain_last, plain_last_sched) = plain(&plain2_url, &events).await?;
    let digests = (
        digest(&plain_url).await?,
        digest(&sink_url).await?,
        digest(&direct_url).await?,
        digest(&plain2_url).await?,
    );
    if digests.0 != digests.1 || digests.0 != digests.2 || digests.0 != digests.3 {
        return Err(format!("targets differ: {digests:?}").into());
    }
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    let plain_time = (plain_first + plain_last) / 2;
    let plain_rate = rate(n, plain_time);
    let steady_rate = rate(run.steady.0, run.steady.1);
    println!(
        "plain client (no Kafka):   {n} events in {plain_time:.2?} = {plain_rate:.0} events/s \
         (mean of the first and last phase: {:.0} and {:.0} events/s)",
        rate(n, plain_first),
        rate(n, plain_last)
    );
    println!("  first: {}", plain_first_sched.per_event(n));
    println!("  last:  {}", plain_last_sched.per_event(n));
    println!(
        "postgres sink from Kafka:  {n} events in {:.2?} = {:.0} events/s including start-up; \
         steady state {} events in {:.2?} = {steady_rate:.0} events/s",
        run.total,
        rate(n, run.total),
        run.steady.0,
        run.steady.1
    );
    println!("  {}", run.sched.per_event(run.steady.0));
    println!(
        "sink.apply without Kafka:  {n} events in {:.2?} = {:.0} events/s \
         (not timed in: decoding {:.2?}, sink.prepare {:.2?})",
        direct_time.apply,
        rate(n, direct_time.apply),
        direct_time.decode,
        direct_time.prepare
    );
    println!("  {}", direct_time.sched.per_event(n));
    println!(
        "ratio sink/plain: steady {:.2}, including start-up {:.2} ({} rows in each target)",
        steady_rate / plain_rate,
        rate(n, run.total) / plain_rate,
        digests.0 .0
    );
    let admin = connect(&pg).await?;
    for db in [
        format!("bench_plain_{tag}"),
        format!("bench_plain2_{tag}"),
        format!("bench_direct_{tag}"),
        format!("bench_sink_{tag}"),
    ] {
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .await?;
    }
    let kafka: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let _ = kafka
        .delete_topics(&[topic.as_str()], &AdminOptions::new())
        .await;
    Ok(())
}
