//! Indexing rate of the elasticsearch sink next to a plain bulk client, same run,
//! same documents, same cluster.
//!
//! ```text
//! eval "$(scripts/services env)"
//! cargo run --release -p oncely-sinks --example bench_elasticsearch -- [EVENTS] [PARTITIONS]
//! ```
//!
//! 1. Produces EVENTS (default 1,000,000) change events (`op = c`, distinct keys,
//!    oncely envelope without schemas) to a fresh topic of PARTITIONS (default 2)
//!    partitions — not timed.
//! 2. Plain client: the same documents, `index` actions of 1,000 per `_bulk`
//!    request, PARTITIONS requests in flight — timed until the last response.
//! 3. The sink: `Runner` + `ElasticsearchSink` reading the topic (read_committed,
//!    batches of 1,000, one worker per partition) — timed from start until every
//!    event is applied.
//!
//! Both indices are then refreshed and counted (each must hold EVENTS documents),
//! and deleted with the topic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use elasticsearch::http::transport::Transport;
use elasticsearch::indices::{IndicesDeleteParts, IndicesRefreshParts};
use elasticsearch::{BulkOperation, BulkParts, CountParts, Elasticsearch};
use oncely_sinks::kinds::elasticsearch::{ElasticsearchConfig, ElasticsearchSink};
use oncely_sinks::{Batch, Runner, RunnerConfig, Sink, SinkError};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const BULK: usize = 1000;

fn env(name: &str) -> Res<String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set: eval \"$(scripts/services env)\"").into())
}

/// Row `i`: about 200 bytes of JSON, like a typical customer row.
fn row(i: u64) -> Value {
    let tier = ["bronze", "silver", "gold"][(i % 3) as usize];
    json!({
        "id": i,
        "name": format!("customer {i}"),
        "email": format!("customer{i}@example.com"),
        "balance": format!("{}.{:02}", i % 100_000, i % 100),
        "tier": tier,
        "active": !i.is_multiple_of(7),
        "created_at": 1_700_000_000_000_000u64 + i * 1_000,
        "note": "lorem ipsum dolor sit amet, consectetur adipiscing elit",
    })
}

fn envelope(i: u64) -> Vec<u8> {
    json!({"before": null, "after": row(i), "op": "c", "ts_ms": 0,
        "source": {"connector": "bench", "db": "bench", "schema": "public", "table": "customers",
                   "lsn": 1_000 + i, "commit_lsn": 1_000 + i, "event_seq": 0}})
    .to_string()
    .into_bytes()
}

async fn produce(brokers: &str, topic: &str, events: u64, partitions: i32) -> Res<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| format!("create {t}: {e}"))?;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "500000")
        .create()?;
    let mut pending = Vec::with_capacity(10_000);
    for i in 0..events {
        let key = json!({ "id": i }).to_string();
        let value = envelope(i);
        let rec = FutureRecord::to(topic)
            .key(&key)
            .payload(&value)
            .partition((i % partitions as u64) as i32);
        pending.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        if pending.len() == 10_000 {
            for p in pending.drain(..) {
                p.await?.map_err(|(e, _)| e)?;
            }
        }
    }
    for p in pending {
        p.await?.map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// The plain client: `partitions` streams of `_bulk` requests of `BULK` index actions.
async fn plain(client: &Elasticsearch, index: &str, events: u64, partitions: u64) -> Res<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..partitions {
        let (client, index) = (client.clone(), index.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut i = p;
            while i < events {
                let mut ops: Vec<BulkOperation<Value>> = Vec::with_capacity(BULK);
                while ops.len() < BULK && i < events {
                    ops.push(BulkOperation::index(row(i)).id(i.to_string()).into());
                    i += partitions;
                }
                let r = client
                    .bulk(BulkParts::Index(&index))
                    .body(ops)
                    .send()
                    .await?;
                let body: Value = r.json().await?;
                if body["errors"] != json!(false) {
                    return Err(format!("plain bulk errors: {}", body).into());
                }
            }
            Res::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// Counts applied records, to time the sink until the last one.
struct Counting {
    inner: ElasticsearchSink,
    applied: Arc<AtomicU64>,
}

#[async_trait]
impl Sink for Counting {
    fn name(&self) -> &str {
        "elasticsearch"
    }
    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        self.inner.apply(batch).await?;
        self.applied.fetch_add(batch.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}

async fn through_sink(brokers: &str, topic: &str, es_url: &str, events: u64) -> Res<Duration> {
    let config: ElasticsearchConfig = toml::from_str(&format!("url = \"{es_url}\""))?;
    let applied = Arc::new(AtomicU64::new(0));
    let sink = Counting {
        inner: ElasticsearchSink::connect(&config).await?,
        applied: applied.clone(),
    };
    let mut rc = RunnerConfig::new(brokers, format!("{topic}-g"), vec![topic.to_owned()]);
    rc.batch_max_records = BULK;
    rc.max_inflight_bytes = 64 * 1024 * 1024;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(Runner::new(rc, Arc::new(sink))?.run(stop.clone()));
    while applied.load(Ordering::SeqCst) < events {
        if task.is_finished() {
            return Err("the runner stopped early".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    task.await??;
    Ok(elapsed)
}

async fn count(client: &Elasticsearch, index: &str) -> Res<u64> {
    client
        .indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await?;
    let body: Value = client
        .count(CountParts::Index(&[index]))
        .send()
        .await?
        .json()
        .await?;
    body["count"]
        .as_u64()
        .ok_or_else(|| format!("count of {index}: {body}").into())
}

#[tokio::main]
async fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let events: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let partitions: i32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    let (brokers, es_url) = (env("ONCELY_KAFKA_BROKERS")?, env("ONCELY_ES_URL")?);
    let tag = format!("{:08x}", rand::random::<u32>());
    let topic = format!("bench-es-{tag}");
    let (plain_index, sink_index) = (format!("bench-plain-{tag}"), topic.clone());
    let client = Elasticsearch::new(Transport::single_node(&es_url)?);

    eprintln!("producing {events} events to {topic} ({partitions} partitions)...");
    produce(&brokers, &topic, events, partitions).await?;

    let plain_time = plain(&client, &plain_index, events, partitions as u64).await?;
    let sink_time = through_sink(&brokers, &topic, &es_url, events).await?;
    let (plain_docs, sink_docs) = (
        count(&client, &plain_index).await?,
        count(&client, &sink_index).await?,
    );
    let _ = client
        .indices()
        .delete(IndicesDeleteParts::Index(&[&plain_index, &sink_index]))
        .send()
        .await;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;

    let rate = |d: Duration| events as f64 / d.as_secs_f64();
    println!("events: {events}, partitions: {partitions}, bulk: {BULK}");
    println!(
        "plain bulk client: {:>8.0} docs/s ({:.1} s, {plain_docs} docs)",
        rate(plain_time),
        plain_time.as_secs_f64()
    );
    println!(
        "oncely sink:       {:>8.0} docs/s ({:.1} s, {sink_docs} docs)",
        rate(sink_time),
        sink_time.as_secs_f64()
    );
    println!(
        "ratio sink/plain:  {:.1} %",
        100.0 * rate(sink_time) / rate(plain_time)
    );
    if plain_docs != events || sink_docs != events {
        return Err("an index does not hold every document".into());
    }
    Ok(())
}
