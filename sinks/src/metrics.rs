//! The runner's Prometheus metrics: names as constants, registered once per runner,
//! served as Prometheus text at `/metrics` by the shared listener
//! (`oncely_core::endpoint`, with `/healthz` and `/readyz`).

use std::sync::Arc;

use oncely_core::endpoint::MetricInfo;
use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Gauge: records between the partition's high watermark and the consumer's committed offset.
pub const CONSUMER_LAG_RECORDS: &str = "oncely_sink_consumer_lag_records";
/// Counter: change events (and tombstones) applied by the sink; what the dedup window skipped counts in [`DEDUP_SKIPPED_TOTAL`] only.
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
/// Counter: schema reads retried because the schema registry was unreachable.
pub const SCHEMA_REGISTRY_RETRIES_TOTAL: &str = "oncely_sink_schema_registry_retries_total";
/// Counter: rebalances a static member asked for because partitions of
/// subscribed topics had no owner in the group.
pub const UNOWNED_PARTITION_REBALANCES_TOTAL: &str =
    "oncely_sink_unowned_partition_rebalances_total";
/// Counter: records the dedup window (`[dedup]`) found already applied and skipped.
pub const DEDUP_SKIPPED_TOTAL: &str = "oncely_sink_dedup_skipped_total";
/// Gauge: offsets of a partition deleted from Kafka (retention) before the
/// sink applied them; the partition is stopped while it is above 0.
pub const GAP_OFFSETS: &str = "oncely_sink_gap_offsets";
/// Gauge: 1 for a partition set aside because its table cannot be applied
/// until a setting or the target changes (quarantine).
pub const QUARANTINED: &str = "oncely_sink_quarantined";
/// Counter: records the consumer delivered again within an assignment
/// (around rebalances) and the runner dropped, since the partition's worker
/// had them already.
pub const REDELIVERIES_DROPPED_TOTAL: &str = "oncely_sink_redeliveries_dropped_total";
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
    /// See [`QUARANTINED`].
    pub quarantined: IntGaugeVec,
    /// See [`GAP_OFFSETS`].
    pub gap_offsets: IntGaugeVec,
    /// See [`DEAD_LETTERS_TOTAL`].
    pub dead_letters: IntCounterVec,
    /// See [`UNCOMMITTED_RECORDS`].
    pub uncommitted_records: IntGaugeVec,
    /// See [`COMMIT_LAG_SECONDS`].
    pub commit_lag_seconds: GaugeVec,
    /// See [`OFFSET_COMMIT_FAILURES_TOTAL`].
    pub offset_commit_failures: IntCounter,
    /// See [`SCHEMA_REGISTRY_RETRIES_TOTAL`].
    pub schema_registry_retries: IntCounter,
    /// See [`UNOWNED_PARTITION_REBALANCES_TOTAL`].
    pub unowned_partition_rebalances: IntCounter,
    /// See [`DEDUP_SKIPPED_TOTAL`].
    pub dedup_skipped: IntCounterVec,
    /// See [`REDELIVERIES_DROPPED_TOTAL`].
    pub redeliveries_dropped: IntCounterVec,
    /// Every registered metric, as registered.
    catalog: Arc<Vec<MetricInfo>>,
}

/// Registers `c` in `registry` and notes it in `catalog`.
fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    catalog: &mut Vec<MetricInfo>,
    c: &C,
    kind: &'static str,
) -> Result<(), prometheus::Error> {
    for d in c.desc() {
        let mut labels = d.variable_labels.clone();
        labels.sort();
        catalog.push(MetricInfo {
            name: d.fq_name.clone(),
            kind,
            labels,
            help: d.help.clone(),
        });
    }
    registry.register(Box::new(c.clone()))
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
            Opts::new(
                EVENTS_APPLIED_TOTAL,
                "Records applied by the sink (not those the dedup window skipped)",
            ),
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
        let schema_registry_retries = IntCounter::new(
            SCHEMA_REGISTRY_RETRIES_TOTAL,
            "Schema reads retried because the schema registry was unreachable",
        )?;
        let unowned_partition_rebalances = IntCounter::new(
            UNOWNED_PARTITION_REBALANCES_TOTAL,
            "Rebalances asked for because subscribed partitions had no owner in the group",
        )?;
        let dedup_skipped = IntCounterVec::new(
            Opts::new(
                DEDUP_SKIPPED_TOTAL,
                "Records skipped because the dedup window holds their identity",
            ),
            &[LABEL_SINK, LABEL_TOPIC],
        )?;
        let redeliveries_dropped = IntCounterVec::new(
            Opts::new(
                REDELIVERIES_DROPPED_TOTAL,
                "Records the consumer delivered again that the partition's worker had already, dropped",
            ),
            &[LABEL_TOPIC],
        )?;
        let gap_offsets = IntGaugeVec::new(
            Opts::new(
                GAP_OFFSETS,
                "Offsets deleted from Kafka before the sink applied them (the partition is stopped, or recovering under gap.recovery = snapshot)",
            ),
            &[LABEL_TOPIC, LABEL_PARTITION],
        )?;
        let quarantined = IntGaugeVec::new(
            Opts::new(
                QUARANTINED,
                "1 while the partition is set aside because its table cannot be applied",
            ),
            &[LABEL_TOPIC, LABEL_PARTITION],
        )?;
        let mut catalog = Vec::new();
        let c = &mut catalog;
        register(&registry, c, &unowned_partition_rebalances, "counter")?;
        register(&registry, c, &uncommitted_records, "gauge")?;
        register(&registry, c, &commit_lag_seconds, "gauge")?;
        register(&registry, c, &offset_commit_failures, "counter")?;
        register(&registry, c, &schema_registry_retries, "counter")?;
        register(&registry, c, &consumer_lag, "gauge")?;
        register(&registry, c, &events_applied, "counter")?;
        register(&registry, c, &batch_duration, "histogram")?;
        register(&registry, c, &retries, "counter")?;
        register(&registry, c, &dead_letters, "counter")?;
        register(&registry, c, &dedup_skipped, "counter")?;
        register(&registry, c, &redeliveries_dropped, "counter")?;
        register(&registry, c, &gap_offsets, "gauge")?;
        register(&registry, c, &quarantined, "gauge")?;
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
            schema_registry_retries,
            unowned_partition_rebalances,
            dedup_skipped,
            redeliveries_dropped,
            gap_offsets,
            quarantined,
            catalog: Arc::new(catalog),
        })
    }

    /// Every metric the runner registers: name, type, labels, help.
    pub fn catalog(&self) -> &[MetricInfo] {
        &self.catalog
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_text_format() {
        let metrics = Metrics::new().expect("metrics");
        metrics
            .events_applied
            .with_label_values(&["s", "t"])
            .inc_by(3);
        metrics
            .batch_duration
            .with_label_values(&["s"])
            .observe(0.02);
        let text = metrics.render();
        assert!(
            text.contains("oncely_sink_events_applied_total{sink=\"s\",topic=\"t\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("oncely_sink_batch_duration_seconds_bucket"),
            "{text}"
        );
    }
}
