//! `summary`: what went through, from the processes' Prometheus endpoints
//! (and, with `--webhook`, the webhook receiver's own counts).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{on_mysql, Source, TABLES};

/// Prometheus endpoints of the demo's processes (the demo configs' `metrics.listen`).
const METRICS: [(&str, &str); 4] = [
    ("capture", "127.0.0.1:19464"),
    ("postgres", "127.0.0.1:19465"),
    ("elasticsearch", "127.0.0.1:19466"),
    ("redis", "127.0.0.1:19467"),
];
/// The webhook sink's (examples/demo/sink-http.toml).
const WEBHOOK_METRICS: &str = "127.0.0.1:19468";

/// Metric samples of each process, summed over labels.
pub(crate) struct Metrics(BTreeMap<(String, String), f64>);

impl Metrics {
    fn value(&self, process: &str, name: &str) -> Option<f64> {
        self.0.get(&(process.to_owned(), name.to_owned())).copied()
    }

    pub(crate) fn get(&self, process: &str, name: &str) -> String {
        self.value(process, name)
            .map_or("-".to_owned(), |v| format!("{v:.0}"))
    }
}

pub(crate) async fn scrape_all() -> Metrics {
    scrape_from(&METRICS).await
}

async fn scrape_from(endpoints: &[(&str, &str)]) -> Metrics {
    let mut out = BTreeMap::new();
    for &(process, addr) in endpoints {
        // A process that is not up yet (or not started) shows as "-".
        if let Ok(text) = scrape(addr).await {
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let Some((name_labels, value)) = line.rsplit_once(' ') else {
                    continue;
                };
                let name = name_labels.split('{').next().unwrap_or(name_labels);
                if let Ok(v) = value.parse::<f64>() {
                    *out.entry((process.to_owned(), name.to_owned()))
                        .or_insert(0.0) += v;
                }
            }
        }
    }
    Metrics(out)
}

/// `GET /metrics` over a plain TCP connection (HTTP/1.0: the server closes when done).
async fn scrape(addr: &str) -> Result<String> {
    get(addr, "/metrics").await
}

/// `GET <path>`'s body (HTTP/1.0).
async fn get(addr: &str, path: &str) -> Result<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        anyhow::Ok(
            body.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_owned())
                .unwrap_or_default(),
        )
    };
    tokio::time::timeout(Duration::from_secs(3), fetch).await?
}

pub(crate) async fn summary(seconds: u64, webhook: Option<&str>) -> Result<()> {
    let mut c = Source::connect().await?;
    let m = scrape_all().await;
    let (server, indexes) = if on_mysql()? {
        ("MariaDB", "shop.shop.*")
    } else {
        ("PostgreSQL", "shop.public.*")
    };
    println!("\n==== oncely demo summary");
    println!("source tables ({server} database shop):");
    for t in TABLES {
        let n = c.count(t).await?;
        println!("  {t:<12} {n:>7} rows");
    }
    let events = m
        .value("capture", "oncely_capture_events_total")
        .unwrap_or(0.0);
    println!(
        "capture: {events:.0} change events in {} Kafka transactions ({:.0} events/s over the {seconds} s workload), {} heartbeats",
        m.get("capture", "oncely_capture_kafka_transactions_total"),
        events / seconds.max(1) as f64,
        m.get("capture", "oncely_capture_heartbeats_total"),
    );
    let search = format!("search (indexes {indexes})");
    for (process, what) in [
        (
            "postgres",
            "warehouse (database shop_warehouse, schema warehouse)",
        ),
        ("elasticsearch", search.as_str()),
        ("redis", "cache (keys shop:<table>:<key>)"),
    ] {
        let applied = m
            .value(process, "oncely_sink_events_applied_total")
            .unwrap_or(0.0);
        println!(
            "{what}: {applied:.0} events applied ({:.0}/s), consumer lag now {} offsets (transaction markers count too), {:.0} dead letters",
            applied / seconds.max(1) as f64,
            m.get(process, "oncely_sink_consumer_lag_records"),
            m.value(process, "oncely_sink_dead_letters_total").unwrap_or(0.0),
        );
    }
    if let Some(receiver) = webhook {
        webhook_summary(receiver, events).await?;
    }
    Ok(())
}

/// The webhook sink's counts and what its receiver saw, once the sink is as
/// far as the warehouse sink (which `oncely verify` waited for; at most 60 s).
async fn webhook_summary(receiver: &str, captured: f64) -> Result<()> {
    const LAG: &str = "oncely_sink_consumer_lag_records";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = scrape_from(&[("webhook", WEBHOOK_METRICS), METRICS[1]]).await;
        let caught_up = matches!(
            (m.value("webhook", LAG), m.value("postgres", LAG)),
            (Some(hook), Some(warehouse)) if hook <= warehouse
        );
        if caught_up || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stats: serde_json::Value = serde_json::from_str(&get(receiver, "/stats").await?)?;
    let m = scrape_from(&[("webhook", WEBHOOK_METRICS)]).await;
    println!(
        "webhook (http://{receiver}, Redis dedup window): the receiver got {} requests, {} distinct events (of the {captured:.0} records capture published, tombstones included, which are not POSTed), {} repeats of an Idempotency-Key it had applied (the batches in flight at the kill)",
        stats["requests"], stats["applied"], stats["duplicates"],
    );
    println!(
        "  the webhook sink restarted after its SIGKILL: {} events POSTed since, {} skipped by the dedup window (redelivered after the kill, or a tombstone repeating its delete), {:.0} dead letters",
        m.get("webhook", "oncely_sink_events_applied_total"),
        m.get("webhook", "oncely_sink_dedup_skipped_total"),
        m.value("webhook", "oncely_sink_dead_letters_total").unwrap_or(0.0),
    );
    Ok(())
}
