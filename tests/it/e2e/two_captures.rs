//! Two captures on one database and one Kafka cluster, each with its own
//! name, slot, publication and topics: one SIGKILLed inside a Kafka
//! transaction (left open for longer than the test runs) never holds back the
//! other — its committed position, `oncely status`, `oncely verify`, its
//! restart — while the other streams a steady load.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use oncely_capture::config::CaptureConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;
use serde_json::Value;

use crate::harness::capture::kill9;
use crate::harness::common;
use crate::harness::e2e::Pipeline;

/// What the other capture's answers must come within: well below Kafka's
/// default `transaction.timeout.ms` (60 s), the hold the killed capture's
/// open transaction would cause.
const BOUND: Duration = Duration::from_secs(20);
/// Rows of the killed capture's source transaction.
const BIG: i64 = 100_000;

/// Partition 0's end as a `read_committed` reader sees it (the last stable
/// offset) and as a `read_uncommitted` one does: apart while a transaction
/// is open on it.
async fn ends(topic: &str) -> Result<(i64, i64)> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let end = |isolation: &str| -> Result<i64> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", common::kafka_brokers())
                .set("group.id", common::unique("lso"))
                .set("isolation.level", isolation)
                .create()?;
            Ok(consumer
                .fetch_watermarks(&topic, 0, Duration::from_secs(10))
                .map_or(0, |(_, high)| high))
        };
        Ok((end("read_committed")?, end("read_uncommitted")?))
    })
    .await?
}

async fn server_lsn(p: &Pipeline) -> Result<u64> {
    let text: String = p
        .env
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    oncely_core::wire::parse_lsn(&text).context("server LSN")
}

/// `oncely status --json` of capture `config` and the warehouse sink: (exit
/// code, JSON, how long it took).
fn status(p: &Pipeline, config: &std::path::Path) -> Result<(i32, Value, Duration)> {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("status")
        .arg("--capture")
        .arg(config)
        .arg("--sink")
        .arg(&p.sinks[0])
        .arg("--json")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()?;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("status --json is not JSON ({e}):\n{text}"))?;
    Ok((out.status.code().unwrap_or(-1), json, took))
}

/// Runs `oncely status` of capture B until its committed LSN reaches `lsn`;
/// fails past `deadline`. Returns the last JSON.
async fn status_reaches(
    p: &Pipeline,
    config: &std::path::Path,
    lsn: u64,
    deadline: Instant,
) -> Result<Value> {
    loop {
        let (code, json, took) = status(p, config)?;
        ensure!(took < BOUND, "oncely status took {took:?}: {json:#}");
        let committed = json["capture"]["committed_lsn"]
            .as_str()
            .and_then(oncely_core::wire::parse_lsn);
        if committed.is_some_and(|c| c >= lsn) {
            ensure!(code == 0, "status of B is healthy (exit {code}): {json:#}");
            return Ok(json);
        }
        if Instant::now() > deadline {
            bail!(
                "B's committed position never reached the server's {} (status: {json:#})",
                oncely_core::wire::format_lsn(lsn)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Inserts one row into `small` every 20 ms until `stop`; the rows inserted.
fn steady_load(
    client: tokio_postgres::Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<i64>> {
    tokio::spawn(async move {
        let mut n = 0i64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            client
                .execute("INSERT INTO small VALUES ($1, 'steady')", &[&n])
                .await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(n)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_capture_never_holds_back_another_captures_position_status_or_verify() -> Result<()>
{
    // B: the pipeline's capture (its own publication) and its warehouse sink.
    let mut p = Pipeline::new(
        "two_captures",
        "CREATE TABLE big (id bigint PRIMARY KEY, v text);
         CREATE TABLE small (id bigint PRIMARY KEY, v text);",
        &["small"],
        "table.include.list = \"public.small\"\npublication.name = \"pub_b\"\n",
    )
    .await?;
    p.sinks.truncate(1);
    // A: its own name (= topic prefix), slot, publication and offsets topic.
    // One Kafka transaction for its whole source transaction (no batch limit
    // is reached, no heartbeat commits), and a transaction timeout longer
    // than the test, so what its SIGKILL leaves open stays open throughout.
    let (prefix_a, slot_a) = (format!("{}-a", p.env.prefix), format!("{}_a", p.env.slot));
    let offsets_a = format!("{prefix_a}-offsets");
    let config_a = p.env.write_config(
        "capture-a.toml",
        &format!(
            "snapshot.mode = \"no_data\"\n{}",
            p.env.config_as(
                &prefix_a,
                &slot_a,
                &offsets_a,
                "table.include.list = \"public.big\"\npublication.name = \"pub_a\"\n\
                 batch.max.events = 1000000\nbatch.max.bytes = 1000000000\nbatch.max.ms = 300000\n\
                 heartbeat.interval.ms = 600000\n\
                 [kafka.producer]\n\"transaction.timeout.ms\" = \"600000\"\n",
            )
        ),
    )?;
    let cfg_a = CaptureConfig::load(&config_a)?;
    let cfg_b = CaptureConfig::load(&p.capture_config)?;
    // Nothing a capture writes with transactions is shared.
    ensure!(cfg_a.transactional_id() != cfg_b.transactional_id());
    ensure!(cfg_a.offsets_topic() != cfg_b.offsets_topic());
    ensure!(
        oncely_capture::catalog::schema_change_topic(&cfg_a)
            != oncely_capture::catalog::schema_change_topic(&cfg_b)
    );
    let topic_big = format!("{prefix_a}.public.big");

    let mut b = p.spawn_capture()?;
    p.env.wait_named_slot_active(&p.env.slot).await?;
    let _sink = p.spawn_sink(0)?;
    let mut a = p.env.spawn_capture(&config_a)?;
    p.env.wait_named_slot_active(&slot_a).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(p.env.connect().await?, Arc::clone(&stop));

    // A's large source transaction commits; A is killed 1.2 s later, once
    // its Kafka transaction holds some of it (open, uncommitted).
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, {BIG}) g"
        ))
        .await?;
    let committed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    loop {
        let (stable, end) = ends(&topic_big).await?;
        if end > stable {
            break;
        }
        ensure!(
            committed_at.elapsed() < Duration::from_secs(60),
            "A never opened a Kafka transaction for the big one:\n{}",
            p.env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut a);
    let killed = Instant::now();
    let at_kill = server_lsn(&p).await?;

    // B, under load: its committed position passes the server's position of
    // the kill, status answers healthy, verify's wait for capture is short.
    status_reaches(&p, &p.capture_config, at_kill, killed + BOUND).await?;
    let stored = oncely_capture::catalog::read_stored_offset(&cfg_b).await?;
    ensure!(
        stored.is_some_and(|o| o.flush_lsn >= at_kill),
        "B's stored offset reaches the server position of the kill"
    );
    let started = Instant::now();
    let report = p.verify(Duration::from_secs(60)).await?;
    let took = started.elapsed();
    let capture_wait = report.capture_wait.context("verify waited for capture")?;
    ensure!(
        capture_wait < BOUND && took < BOUND,
        "verify of B waited {capture_wait:?} for capture, {took:?} in all"
    );
    ensure!(
        killed.elapsed() < BOUND,
        "B answered {:?} after the kill",
        killed.elapsed()
    );

    // B restarts while A's transaction is still open: its start reads its
    // offsets and schema history at once, and it streams on.
    kill9(&mut b);
    b = p.spawn_capture()?;
    let restarted = Instant::now();
    p.env.wait_named_slot_active(&p.env.slot).await?;
    let after_restart = server_lsn(&p).await?;
    status_reaches(&p, &p.capture_config, after_restart, restarted + BOUND).await?;

    // A's transaction was open all along: B was not merely lucky in timing.
    let (stable, end) = ends(&topic_big).await?;
    ensure!(
        end > stable,
        "A's transaction is still open ({stable} < {end})"
    );

    // The load stops; B's warehouse ends equal, verify (the command) at once.
    stop.store(true, Ordering::Relaxed);
    let inserted = load.await??;
    ensure!(inserted > 100, "steady load ran: {inserted} rows");
    let started = Instant::now();
    let (code, out) = p.verify_cli(&["--timeout", "60s"])?;
    let took = started.elapsed();
    ensure!(code.success(), "verify of B: {out}");
    ensure!(took < BOUND, "verify of B took {took:?}: {out}");
    ensure!(b.try_wait()?.is_none(), "B runs:\n{}", p.env.capture_log());

    // Clean up: a producer with A's transactional.id aborts what A left open.
    let fence: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("transactional.id", cfg_a.transactional_id())
        .create()?;
    tokio::task::spawn_blocking(move || fence.init_transactions(Duration::from_secs(30))).await??;
    kill9(&mut b);
    p.env.drop_slot(&slot_a).await;
    if let Ok(admin) = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create::<AdminClient<DefaultClientContext>>()
    {
        let topics = [
            topic_big,
            offsets_a,
            oncely_capture::catalog::schema_change_topic(&cfg_a),
        ];
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    }
    p.cleanup().await;
    Ok(())
}
