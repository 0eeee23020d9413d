//! Avro in operation: the schema registry unreachable for 20 s under load
//! (a TCP proxy between capture, the sinks and Apicurio, cut and restored:
//! the shared registry service is never stopped), and column names Avro
//! refuses (`field.name.adjustment.mode`).
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::message::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::harness::capture::{read_to_end, terminate};
use crate::harness::checks::{dead_letters, event_counter, expected_events};
use crate::harness::e2e::Pipeline;

fn registry_url() -> String {
    std::env::var("ONCELY_REGISTRY_URL").unwrap_or_else(|_| {
        panic!("ONCELY_REGISTRY_URL is not set: run `scripts/services up` and `eval \"$(scripts/services env)\"`")
    })
}

/// A TCP proxy that can be cut: cut, it closes the connections it carries
/// and drops new ones at once, as a registry that went away.
struct Proxy {
    addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn to(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel(true);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut up = rx.clone();
                if !*up.borrow() {
                    continue; // dropped: the connection is closed
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Ok(Self {
            addr,
            up: Arc::new(tx),
            accept,
        })
    }

    fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `http://host:port/path` -> (the address, `/path`).
async fn split_url(url: &str) -> Result<(SocketAddr, String)> {
    let rest = url
        .strip_prefix("http://")
        .context("ONCELY_REGISTRY_URL is http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = tokio::net::lookup_host(host)
        .await?
        .next()
        .context("registry host")?;
    Ok((addr, format!("/{path}")))
}

/// Puts a runner key before the `[sink]` table of sink config `i`.
fn prepend_runner_key(p: &Pipeline, i: usize, line: &str) -> Result<()> {
    let text = std::fs::read_to_string(&p.sinks[i])?;
    std::fs::write(&p.sinks[i], format!("{line}\n{text}"))?;
    Ok(())
}

/// Every value on `topic` that a `read_committed` reader sees (tombstones
/// left out), raw.
fn committed_values(topic: &str) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    read_to_end(
        "read_committed",
        &[topic.to_owned()],
        Duration::from_secs(120),
        |m| {
            out.extend(m.payload().map(<[u8]>::to_vec));
            Ok(())
        },
    )?;
    Ok(out)
}

/// The change events of `topic`, decoded through the registry: how many,
/// and the positions (commit LSN, ordinal) seen more than once.
async fn scan_avro(topic: &str, registry_url: &str) -> Result<(u64, Vec<(u64, u64)>)> {
    let topic = topic.to_owned();
    let values = tokio::task::spawn_blocking(move || committed_values(&topic)).await??;
    let registry = oncely_core::avro::registry::RegistryClient::new(registry_url)?;
    let mut seen = HashSet::new();
    let mut twice = Vec::new();
    for v in &values {
        let (id, body) = oncely_core::avro::wire::unframe(v)?;
        let payload = registry.schema(id).await?.decode(body)?;
        let source = &payload["source"];
        let at = (
            source["commit_lsn"].as_u64().context("commit_lsn")?,
            source["event_seq"].as_u64().context("event_seq")?,
        );
        if !seen.insert(at) {
            twice.push(at);
        }
    }
    Ok((values.len() as u64, twice))
}

/// The registry unreachable for 20 s while transactions stream in and a
/// DDL needs a new schema: capture waits (and a SIGTERM meanwhile stops it
/// at once, cleanly), a new capture process waits too, and once the
/// registry is back every target equals the source; then the registry
/// unreachable for the sinks only after another DDL: they wait for the new
/// schema id rather than dead-letter its records. Each change is in Kafka
/// exactly once, and no record is a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_under_load_loses_and_duplicates_nothing() -> Result<()> {
    let url = registry_url();
    let (target, path) = split_url(&url).await?;
    let proxy = Proxy::to(target).await?;
    let via_proxy = format!("http://{}{path}", proxy.addr);
    // The sinks' own way to the registry, cut on its own below.
    let sink_proxy = Proxy::to(target).await?;
    let sinks_via = format!("http://{}{path}", sink_proxy.addr);
    let p = Pipeline::new(
        "e2e_avro_outage",
        &format!(
            "CREATE TABLE t (id bigint PRIMARY KEY, v text);{}",
            event_counter(&["t"])
        ),
        &["t"],
        &format!(
            "table.include.list = \"public\\\\.t\"\npublication.autocreate.mode = \"filtered\"\n\
             key.converter = \"avro\"\nvalue.converter = \"avro\"\nschema.registry.url = \"{via_proxy}\"\n"
        ),
    )
    .await?;
    for i in 0..p.sinks.len() {
        prepend_runner_key(&p, i, &format!("schema.registry.url = \"{sinks_via}\""))?;
    }
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_>>()?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 100) g;")
        .await?;
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "before the outage:\n{report}");

    // Load throughout: a transaction every 100 ms for 30 s.
    let writer = {
        let client = p.env.connect().await?;
        tokio::spawn(async move {
            for i in 0..300 {
                let base = 1000 + i * 5;
                client
                    .batch_execute(&format!(
                        "INSERT INTO t (id, v) SELECT g, 'load' FROM generate_series({base}, {}) g;
                         UPDATE t SET v = 'upd {i}' WHERE id = {};",
                        base + 4,
                        1 + i % 100
                    ))
                    .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_up(false);
    let cut = Instant::now();
    // A new schema while the registry is away: capture must register it.
    p.env
        .client
        .batch_execute(
            "ALTER TABLE t ADD COLUMN extra text; UPDATE t SET extra = 'x' WHERE id <= 10;",
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // SIGTERM while capture waits for the registry: it stops at once, cleanly.
    let stopping = Instant::now();
    let status = terminate(&mut capture.0, Duration::from_secs(10))
        .context("capture waiting for the registry must stop at SIGTERM")?;
    assert!(
        status.success(),
        "clean stop: {status:?}\n{}",
        p.env.capture_log()
    );
    assert!(stopping.elapsed() < Duration::from_secs(10));
    // A new process (an empty schema cache) waits too.
    capture = p.spawn_capture()?;
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(cut.elapsed())).await;
    proxy.set_up(true);
    writer.await??;

    let report = p.verify(Duration::from_secs(240)).await?;
    assert!(report.is_equal(), "after the outage:\n{report}");
    assert_eq!(report.compared(), p.sinks.len(), "{report}");
    let log = p.env.capture_log();
    assert!(
        log.contains("registering the schema of"),
        "capture waited for the registry: {log}"
    );

    // Only the sinks cut off: records of a schema id they have not read yet
    // wait for the registry, none is dead-lettered.
    sink_proxy.set_up(false);
    p.env
        .client
        .batch_execute("ALTER TABLE t ADD COLUMN late int; UPDATE t SET late = 1 WHERE id <= 50;")
        .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    sink_proxy.set_up(true);
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "after the sinks' outage:\n{report}");
    for i in 0..p.sinks.len() {
        let log = p.sink_log(i);
        assert!(
            log.contains("reading schema id"),
            "sink {i} waited for the registry: {log}"
        );
    }

    // Each committed change in Kafka exactly once.
    let expected = expected_events(&p.env.client).await?;
    let (events, twice) = scan_avro(&p.env.topic("t"), &url).await?;
    assert!(twice.is_empty(), "changes in Kafka twice: {twice:?}");
    assert_eq!(
        events, expected as u64,
        "events in Kafka vs changes committed"
    );

    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await?
    .context("read dead letters")?;
    assert!(letters.is_empty(), "no dead letters: {letters:#?}");
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// Columns Avro refuses as names (`"my-col"`, `"1st"`, `"é"`): under
/// `field.name.adjustment.mode = "none"` capture stops naming the column
/// and the key; under `avro` they are adjusted in the registered schema
/// (`my_col`, `_st`, `_`) and every target equals the source, the sinks
/// writing the columns as the source names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_names_avro_refuses_are_adjusted_or_named() -> Result<()> {
    let url = registry_url();
    let avro = format!(
        "snapshot.mode = \"initial\"\nkey.converter = \"avro\"\nvalue.converter = \"avro\"\nschema.registry.url = \"{url}\"\n"
    );
    let p = Pipeline::new(
        "e2e_avro_names",
        r#"CREATE TABLE h (id bigint PRIMARY KEY, "my-col" text, "1st" int, "é" text);
           INSERT INTO h SELECT g, 'c' || g, g, 'é' || g FROM generate_series(1, 20) g;"#,
        &["h"],
        &format!("{avro}field.name.adjustment.mode = \"avro\"\n"),
    )
    .await?;
    let refused = p.env.config(&avro);
    let (ok, stderr) =
        tokio::task::block_in_place(|| p.env.run_capture_with(&refused, Duration::from_secs(120)))?;
    assert!(!ok, "capture must stop: {stderr}");
    assert!(
        stderr.contains("`my-col`") && stderr.contains("field.name.adjustment.mode"),
        "the error names the column and the key: {stderr}"
    );

    for i in 0..p.sinks.len() {
        prepend_runner_key(&p, i, &format!("schema.registry.url = \"{url}\""))?;
    }
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_>>()?;
    p.env
        .client
        .batch_execute(
            r#"INSERT INTO h VALUES (100, 'new', 1, 'ü');
               UPDATE h SET "my-col" = NULL, "1st" = -"1st" WHERE id % 3 = 0;
               DELETE FROM h WHERE id = 7;"#,
        )
        .await?;
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "hostile names:\n{report}");
    assert_eq!(report.compared(), p.sinks.len(), "{report}");

    // The registered schema carries the adjusted names.
    let topic = p.env.topic("h");
    let values = tokio::task::spawn_blocking(move || committed_values(&topic)).await??;
    let (id, _) = oncely_core::avro::wire::unframe(values.first().context("a record")?)?;
    let registry = oncely_core::avro::registry::RegistryClient::new(&url)?;
    let text = registry.schema(id).await?.avro_schema().to_owned();
    for name in [r#""my_col""#, r#""_st""#, r#""name":"_""#] {
        assert!(text.contains(name), "{name} in {text}");
    }
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await?
    .context("read dead letters")?;
    assert!(letters.is_empty(), "no dead letters: {letters:#?}");
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}
