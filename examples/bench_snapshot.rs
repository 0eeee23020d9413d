//! Snapshot throughput benchmark.
//!
//! Fills a fresh database's table with N rows, then measures in the same run:
//! 1. the ceiling: `COPY orders TO STDOUT` of the whole table, read by a client
//!    that only counts the bytes;
//! 2. `oncely capture` (the release binary) with `snapshot.mode =
//!    "initial_only"`: from the moment its snapshot starts (its
//!    `oncely_capture_snapshot_running` gauge) until it exits once every row
//!    is committed to Kafka as an op `r` event; plus its memory;
//! 3. the Kafka floor: the same records (a sample of what capture wrote,
//!    cycled) sent by a bare transactional producer with capture's producer
//!    settings and transaction size. No row is read or encoded, so no
//!    snapshot can be faster than this on the same machine and broker.
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo build --release && cargo run --release --example bench_snapshot -- 1000000
//! BENCH_CHUNK=8192 cargo run --release --example bench_snapshot -- 1000000   # incremental.snapshot.chunk.size
//! BENCH_COLUMNS=10 cargo run --release --example bench_snapshot -- 1000000   # five more column kinds, as a real table mixes
//! BENCH_SCHEMAS=false cargo run --release --example bench_snapshot -- 1000000 # schemas.enable = false
//! BENCH_PRODUCER=compression.type=zstd,linger.ms=20 cargo run ...             # [kafka.producer] settings
//! BENCH_CAPTURE_LOG=info,oncely_capture=debug cargo run ...                   # capture's RUST_LOG (default warn)
//! ```
mod bench_support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;

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
    let schemas = std::env::var("BENCH_SCHEMAS")
        .map(|v| v != "false")
        .unwrap_or(true);
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
    let services = bench_support::Services::from_env()?;
    let (host, port, user) = (&services.host, services.port, &services.user);
    let brokers = &services.brokers;
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

    // 1. Ceiling: COPY of the same table.
    let t = Instant::now();
    let copy = client.copy_out("COPY orders TO STDOUT").await?;
    futures::pin_mut!(copy);
    let (mut bytes, mut lines) = (0usize, 0usize);
    while let Some(buf) = copy.next().await {
        let buf = buf?;
        bytes += buf.len();
        lines += buf.iter().filter(|b| **b == b'\n').count();
    }
    let copy_secs = t.elapsed().as_secs_f64();
    if lines as i64 != total {
        bail!("COPY returned {lines} rows, expected {total}");
    }
    let copy_rate = total as f64 / copy_secs;
    eprintln!("COPY TO STDOUT: {total} rows, {bytes} bytes in {copy_secs:.2}s");

    // 2. oncely capture, snapshot only.
    let dir = std::env::temp_dir().join(&db);
    std::fs::create_dir_all(&dir)?;
    let metrics_port = 20000 + (rand::random::<u16>() % 20000);
    let slot = format!("bench_snap_{tag}");
    let config = dir.join("capture.toml");
    std::fs::write(
        &config,
        format!(
            "topic.prefix = \"bench-snap-{tag}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             publication.name = \"bench_snap_pub\"\npublication.autocreate.mode = \"filtered\"\n\
             table.include.list = \"public.orders\"\nsnapshot.mode = \"initial_only\"\n\
             incremental.snapshot.chunk.size = {chunk}\nschemas.enable = {schemas}\n\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"bench-snap-{tag}-offsets\"\n\
             metrics.listen = \"127.0.0.1:{metrics_port}\"\n[kafka.producer]\n{producer}"
        ),
    )?;
    let bin = bench_support::oncely_binary()?;
    let mut child = bench_support::spawn_capture(Command::new(&bin), &config)?;
    let pid = child.id();
    let mut started: Option<Instant> = None;
    let mut rss_samples = Vec::new();
    let (mut peak_kb, mut cpu_secs, mut commits, mut chunks) = (0, 0.0, 0.0, 0.0);
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
            rss_samples.push(bench_support::rss_kb(pid, "VmRSS:"));
            // The process exits when done: keep the last values seen.
            peak_kb = peak_kb.max(bench_support::rss_kb(pid, "VmHWM:"));
            cpu_secs = f64::max(cpu_secs, bench_support::cpu_seconds(pid));
            if let Some(c) =
                bench_support::scrape(metrics_port, "oncely_capture_kafka_transactions_total").await
            {
                commits = c;
            }
            if let Some(c) =
                bench_support::scrape(metrics_port, "oncely_capture_snapshot_chunks_total").await
            {
                chunks = c;
            }
        }
    };
    let snap_secs = started
        .map(|s| s.elapsed().as_secs_f64())
        .context("the snapshot never reported running")?;
    if !status.success() {
        bail!("capture exited with {status}; see its stderr above");
    }
    let snap_rate = total as f64 / snap_secs;
    rss_samples.sort_unstable();
    let median_kb = rss_samples.get(rss_samples.len() / 2).copied().unwrap_or(0);
    println!("rows={total} columns={columns} incremental.snapshot.chunk.size={chunk} schemas.enable={schemas} producer={producer:?}");
    println!("COPY orders TO STDOUT : {copy_secs:8.2}s {copy_rate:10.0} rows/s");
    println!(
        "oncely snapshot       : {snap_secs:8.2}s {snap_rate:10.0} rows/s  ({:.1}% of COPY, COPY is {:.1}x faster)",
        100.0 * snap_rate / copy_rate,
        copy_rate / snap_rate
    );
    println!(
        "capture RSS           : median {:.1} MB, peak {:.1} MB",
        median_kb as f64 / 1024.0,
        peak_kb as f64 / 1024.0
    );
    println!("capture CPU           : {cpu_secs:.2}s user+sys (last sample before exit)");
    println!("chunks, kafka commits : {chunks:.0}, {commits:.0} (last sample before exit)");

    // 3. The Kafka floor for these very records.
    let topic = format!("bench-snap-{tag}.public.orders");
    // Ten transactions: fewer and larger than capture's, so commits cost
    // the floor less than they cost capture.
    let per_tx = (total as usize).div_ceil(10);
    let floor_brokers = brokers.clone();
    let (floor_secs, floor_cpu) = tokio::task::spawn_blocking(move || {
        kafka_floor(&floor_brokers, &topic, total as usize, per_tx, &overrides)
    })
    .await??;
    let floor_rate = total as f64 / floor_secs;
    println!(
        "Kafka floor           : {floor_secs:8.2}s {floor_rate:10.0} records/s ({:.1}% of COPY; {:.1} CPU µs/record in the producer, {per_tx} records per transaction)",
        100.0 * floor_rate / copy_rate,
        floor_cpu * 1e6 / total as f64
    );

    let _ = bench_support::delete_topics(brokers, &format!("bench-snap-{tag}")).await;
    let _ = admin
        .query_one("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await;
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await;
    Ok(())
}

/// Sends `total` records copied from the first records of `source` to a new
/// topic of as many partitions, in transactions of `per_tx` records, with the
/// producer settings capture uses (`oncely_capture::catalog::PRODUCER_SETTINGS`), then
/// `overrides` (capture's `[kafka.producer]`). Returns the seconds taken and
/// this process's CPU seconds meanwhile. Blocking.
fn kafka_floor(
    brokers: &str,
    source: &str,
    total: usize,
    per_tx: usize,
    overrides: &[(String, String)],
) -> Result<(f64, f64)> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    use rdkafka::TopicPartitionList;

    const SAMPLE: usize = 10_000;
    let timeout = Duration::from_secs(30);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{source}-floor"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(source), timeout)?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .filter(|n| *n > 0)
        .context("capture's topic has no partitions")?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(source, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let mut sample = Vec::with_capacity(SAMPLE);
    let deadline = Instant::now() + timeout;
    while sample.len() < SAMPLE.min(total) && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m?;
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        sample.push((
            m.key().unwrap_or_default().to_vec(),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    if sample.is_empty() {
        bail!("read no records back from {source}");
    }

    let floor = format!("{source}-floor");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(&floor, partitions as i32, TopicReplication::Fixed(1))
        .set("max.message.bytes", "10485760");
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()))?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("transactional.id", &floor)
        .set("queue.buffering.max.kbytes", "65536");
    for (k, v) in oncely_capture::catalog::PRODUCER_SETTINGS {
        config.set(*k, *v);
    }
    for (k, v) in overrides {
        config.set(k, v);
    }
    let producer: ThreadedProducer<_> = config.create()?;
    producer.init_transactions(timeout)?;
    let cpu_before = bench_support::cpu_seconds(std::process::id());
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        producer.begin_transaction()?;
        for _ in 0..per_tx.min(total - sent) {
            let (key, value, headers) = &sample[sent % sample.len()];
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let mut record = BaseRecord::to(&floor)
                .key(key.as_slice())
                .payload(value.as_slice())
                .headers(owned);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            sent += 1;
        }
        producer.commit_transaction(timeout)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = bench_support::cpu_seconds(std::process::id()) - cpu_before;
    Ok((secs, cpu))
}
