//! The runner's Prometheus metrics: names as constants, registered once per runner,
//! served as Prometheus text at `/metrics` by a tiny HTTP listener.

use std::net::SocketAddr;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Gauge: records between the partition's high watermark and the consumer's committed offset.
pub const CONSUMER_LAG_RECORDS: &str = "oncely_sink_consumer_lag_records";
/// Counter: change events (and tombstones) applied by the sink.
pub const EVENTS_APPLIED_TOTAL: &str = "oncely_sink_events_applied_total";
/// Histogram: time to apply one batch, retries and dead-lettering included.
pub const BATCH_DURATION_SECONDS: &str = "oncely_sink_batch_duration_seconds";
/// Counter: batch attempts that failed with a retriable error.
pub const RETRIES_TOTAL: &str = "oncely_sink_retries_total";
/// Counter: records written to the dead-letter topic.
pub const DEAD_LETTERS_TOTAL: &str = "oncely_sink_dead_letters_total";
/// Gauge: records applied but whose offset Kafka has not acknowledged yet, per owned partition.
pub const UNCOMMITTED_RECORDS: &str = "oncely_sink_uncommitted_records";
/// Gauge: seconds a partition's applied position has been ahead of its
/// acknowledged commit (0 when caught up); alert when it exceeds a bound.
pub const COMMIT_LAG_SECONDS: &str = "oncely_sink_commit_lag_seconds";
/// Counter: offset commits Kafka refused or that failed (they are sent again).
pub const OFFSET_COMMIT_FAILURES_TOTAL: &str = "oncely_sink_offset_commit_failures_total";
/// Counter: rebalances a static member asked for because partitions of
/// subscribed topics had no owner in the group.
pub const UNOWNED_PARTITION_REBALANCES_TOTAL: &str =
    "oncely_sink_unowned_partition_rebalances_total";
/// Label: topic name.
pub const LABEL_TOPIC: &str = "topic";
/// Label: partition number.
pub const LABEL_PARTITION: &str = "partition";
/// Label: sink name.
pub const LABEL_SINK: &str = "sink";

const BATCH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The runner's metric handles, all in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// See [`CONSUMER_LAG_RECORDS`].
    pub consumer_lag: IntGaugeVec,
    /// See [`EVENTS_APPLIED_TOTAL`].
    pub events_applied: IntCounterVec,
    /// See [`BATCH_DURATION_SECONDS`].
    pub batch_duration: HistogramVec,
    /// See [`RETRIES_TOTAL`].
    pub retries: IntCounterVec,
    /// See [`DEAD_LETTERS_TOTAL`].
    pub dead_letters: IntCounterVec,
    /// See [`UNCOMMITTED_RECORDS`].
    pub uncommitted_records: IntGaugeVec,
    /// See [`COMMIT_LAG_SECONDS`].
    pub commit_lag_seconds: GaugeVec,
    /// See [`OFFSET_COMMIT_FAILURES_TOTAL`].
    pub offset_commit_failures: IntCounter,
    /// See [`UNOWNED_PARTITION_REBALANCES_TOTAL`].
    pub unowned_partition_rebalances: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let consumer_lag = IntGaugeVec::new(
            Opts::new(
                CONSUMER_LAG_RECORDS,
                "Records not yet consumed and committed, per partition",
            ),
            &[LABEL_TOPIC, LABEL_PARTITION],
        )?;
        let events_applied = IntCounterVec::new(
            Opts::new(EVENTS_APPLIED_TOTAL, "Records applied by the sink"),
            &[LABEL_SINK, LABEL_TOPIC],
        )?;
        let batch_duration = HistogramVec::new(
            HistogramOpts::new(BATCH_DURATION_SECONDS, "Time to apply one batch")
                .buckets(BATCH_BUCKETS.to_vec()),
            &[LABEL_SINK],
        )?;
        let retries = IntCounterVec::new(
            Opts::new(
                RETRIES_TOTAL,
                "Batch attempts that failed with a retriable error",
            ),
            &[LABEL_SINK],
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                DEAD_LETTERS_TOTAL,
                "Records written to the dead-letter topic",
            ),
            &[LABEL_TOPIC],
        )?;
        let uncommitted_records = IntGaugeVec::new(
            Opts::new(
                UNCOMMITTED_RECORDS,
                "Records applied whose offset Kafka has not acknowledged, per partition",
            ),
            &[LABEL_TOPIC, LABEL_PARTITION],
        )?;
        let commit_lag_seconds = GaugeVec::new(
            Opts::new(
                COMMIT_LAG_SECONDS,
                "Seconds the applied position has been ahead of the acknowledged commit",
            ),
            &[LABEL_TOPIC, LABEL_PARTITION],
        )?;
        let offset_commit_failures = IntCounter::new(
            OFFSET_COMMIT_FAILURES_TOTAL,
            "Offset commits that failed (sent again later)",
        )?;
        let unowned_partition_rebalances = IntCounter::new(
            UNOWNED_PARTITION_REBALANCES_TOTAL,
            "Rebalances asked for because subscribed partitions had no owner in the group",
        )?;
        registry.register(Box::new(unowned_partition_rebalances.clone()))?;
        registry.register(Box::new(uncommitted_records.clone()))?;
        registry.register(Box::new(commit_lag_seconds.clone()))?;
        registry.register(Box::new(offset_commit_failures.clone()))?;
        registry.register(Box::new(consumer_lag.clone()))?;
        registry.register(Box::new(events_applied.clone()))?;
        registry.register(Box::new(batch_duration.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        Ok(Self {
            registry,
            consumer_lag,
            events_applied,
            batch_duration,
            retries,
            dead_letters,
            uncommitted_records,
            commit_lag_seconds,
            offset_commit_failures,
            unowned_partition_rebalances,
        })
    }

    /// The registry, to add a sink's own metrics next to the runner's.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Binds `addr` for [`serve`]; separate so that a bad address fails the start, not later.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `GET /metrics` (anything else is 404) until `stop` fires. One request per
/// connection; each connection is handled on its own task and bounded in time and size.
pub async fn serve(listener: TcpListener, metrics: Metrics, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let metrics = metrics.clone();
                // Detached on purpose: each connection ends within the timeout below.
                drop(tokio::spawn(async move {
                    let answer = tokio::time::timeout(
                        std::time::Duration::from_secs(5),
                        respond(stream, &metrics),
                    );
                    if let Ok(Err(e)) = answer.await {
                        tracing::debug!("metrics connection: {e}");
                    }
                }));
            }
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let mut parts = request.split_whitespace();
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => {
            ("200 OK", "text/plain; version=0.0.4", metrics.render())
        }
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_text_format_and_404() {
        let metrics = Metrics::new().expect("metrics");
        metrics
            .events_applied
            .with_label_values(&["s", "t"])
            .inc_by(3);
        metrics
            .batch_duration
            .with_label_values(&["s"])
            .observe(0.02);
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, metrics, stop.clone()));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(
            ok.contains("oncely_sink_events_applied_total{sink=\"s\",topic=\"t\"} 3"),
            "{ok}"
        );
        assert!(
            ok.contains("oncely_sink_batch_duration_seconds_bucket"),
            "{ok}"
        );
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        stop.cancel();
        server.await.expect("server task");
    }
}
