//! Webhook sink throughput: `kind = "http"` against a local receiver
//! (`oncely_testkit::webhook`, counting mode: it applies each
//! `Idempotency-Key` once and keeps only keys and counts), with no dedup
//! window, the memory window and the Redis window.
//!
//! Produces N update events (10,000 keys over 4 partitions) to a fresh topic,
//! then for each window runs the runner in-process with a fresh consumer
//! group from the start of the topic, and measures from the receiver's first
//! request to its last: events/s = N / that span (group join excluded).
//! One POST per event (`batch.size = 1`), `max.concurrency` 16.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo run --release --example bench_http -- 100000 [rounds]
//! ```
//! `BENCH_CONCURRENCY` (16) and `BENCH_BATCH` (`batch.max.records`, 500) change the set-up.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use oncely_testkit::webhook::Receiver;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 10_000;
const WINDOWS: [&str; 3] = ["none", "memory", "redis"];

fn env(key: &str) -> Result<String> {
    std::env::var(key)
        .with_context(|| format!("{key} is not set: eval \"$(scripts/services env)\""))
}

fn tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// N update events, event n on row n % KEYS at position (1000 + n)/0.
async fn produce(brokers: &str, topic: &str, total: u64) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()?;
    for chunk in (0..total).collect::<Vec<_>>().chunks(10_000) {
        let mut pending = Vec::with_capacity(chunk.len());
        for &n in chunk {
            let id = n % KEYS;
            let key = json!({ "id": id }).to_string();
            let value = json!({
                "before": null,
                "after": {"id": id, "v": n, "note": "bench"},
                "source": {"connector": "bench", "lsn": 1000 + n, "commit_lsn": 1000 + n,
                           "event_seq": 0, "schema": "public", "table": "t"},
                "op": "u", "ts_ms": 0,
            })
            .to_string();
            let record = FutureRecord::to(topic)
                .key(&key)
                .payload(&value)
                .partition((id % PARTITIONS as u64) as i32);
            pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        for p in pending {
            p.await?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// One run: the runner with window `store` until the receiver applied every event.
struct Run {
    window: &'static str,
    total: u64,
    span: Duration,
    requests: usize,
    duplicates: u64,
}

async fn run(brokers: &str, topic: &str, total: u64, store: &'static str) -> Result<Run> {
    let receiver = Receiver::start_counting("127.0.0.1:0").await;
    let concurrency = std::env::var("BENCH_CONCURRENCY").unwrap_or_else(|_| "16".into());
    let batch = std::env::var("BENCH_BATCH").unwrap_or_else(|_| "500".into());
    let dedup = match store {
        "redis" => format!(
            "store = \"redis\"\nredis.url = \"{}\"\nredis.key.prefix = \"oncely:bench:{}:\"\nttl.ms = 600000\n",
            env("ONCELY_REDIS_URL")?,
            tag()
        ),
        "memory" => format!("store = \"memory\"\nmax.entries = {}\nttl.ms = 600000\n", total.max(1)),
        _ => "store = \"none\"\n".into(),
    };
    let text = format!(
        "bootstrap.servers = \"{brokers}\"\ngroup.id = \"bench_http_{}\"\ntopics = [\"{topic}\"]\n\
         batch.max.records = {batch}\n[dedup]\n{dedup}[sink]\nkind = \"http\"\nurl = \"{}\"\nmax.concurrency = {concurrency}\n",
        tag(),
        receiver.url()
    );
    let (config, sink) = oncely_sinks::kinds::parse_config(&text)?;
    let runner = oncely_sinks::Runner::new(config, sink.build().await?)?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(runner.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(900);
    while (receiver.applied_count() as u64) < total {
        if task.is_finished() || Instant::now() > deadline {
            stop.cancel();
            bail!(
                "window {store}: {} of {total} events delivered",
                receiver.applied_count()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await??;
    Ok(Run {
        window: store,
        total,
        span: receiver.span().context("no request")?,
        requests: receiver.request_count(),
        duplicates: receiver.duplicates(),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let total: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    let rounds: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let brokers = env("ONCELY_KAFKA_BROKERS")?;
    let topic = format!("bench_http_{}", tag());
    println!("producing {total} events to {topic} ({PARTITIONS} partitions, {KEYS} keys)");
    produce(&brokers, &topic, total).await?;
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for store in WINDOWS {
            let r = run(&brokers, &topic, total, store).await?;
            println!(
                "round {round}, window {:<6}: {:>8.0} events/s ({} events in {:.2} s; {} requests, {} repeats)",
                r.window,
                r.total as f64 / r.span.as_secs_f64(),
                r.total,
                r.span.as_secs_f64(),
                r.requests,
                r.duplicates
            );
            runs.push(r);
        }
    }
    println!("\nmedian events/s by window over {rounds} round(s):");
    for store in WINDOWS {
        let mut rates: Vec<f64> = runs
            .iter()
            .filter(|r| r.window == store)
            .map(|r| r.total as f64 / r.span.as_secs_f64())
            .collect();
        rates.sort_by(f64::total_cmp);
        println!("  {store:<6} {:>8.0}", rates[rates.len() / 2]);
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    admin.delete_topics(&[&topic], &AdminOptions::new()).await?;
    Ok(())
}
