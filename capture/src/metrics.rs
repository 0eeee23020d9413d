//! Prometheus metrics of capture, registered once, and what the shared
//! listener (`oncely_core::endpoint`) serves: `/metrics` and `/readyz`.

use std::sync::{Arc, Mutex};

use std::cell::RefCell;

use oncely_core::endpoint::MetricInfo;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::health::CaptureHealth;

pub const EVENTS_TOTAL: &str = "oncely_capture_events_total";
pub const KAFKA_TRANSACTIONS_TOTAL: &str = "oncely_capture_kafka_transactions_total";
pub const BATCH_COMMIT_SECONDS: &str = "oncely_capture_batch_commit_seconds";
pub const LAG_SECONDS: &str = "oncely_capture_lag_seconds";
pub const SLOT_RETAINED_WAL_BYTES: &str = "oncely_capture_slot_retained_wal_bytes";
pub const SLOT_MAX_RETAINED_BYTES: &str = "oncely_capture_slot_max_retained_bytes";
pub const SLOT_OVER_LIMIT: &str = "oncely_capture_slot_over_limit";
pub const BINLOG_RETAINED_BYTES: &str = "oncely_capture_binlog_retained_bytes";
pub const CONFIRMED_LSN: &str = "oncely_capture_confirmed_lsn";
pub const HEARTBEATS_TOTAL: &str = "oncely_capture_heartbeats_total";
pub const SCHEMA_CHANGES_TOTAL: &str = "oncely_capture_schema_changes_total";
pub const RESTARTS_TOTAL: &str = "oncely_capture_restarts_total";
pub const SNAPSHOT_ROWS_TOTAL: &str = "oncely_capture_snapshot_rows_total";
pub const SNAPSHOT_ROWS_DROPPED_TOTAL: &str = "oncely_capture_snapshot_rows_dropped_total";
pub const SNAPSHOT_ROWS_ESTIMATED: &str = "oncely_capture_snapshot_rows_estimated";
pub const SNAPSHOT_CHUNKS_TOTAL: &str = "oncely_capture_snapshot_chunks_total";
pub const SNAPSHOT_RUNNING: &str = "oncely_capture_snapshot_running";
pub const SNAPSHOT_PAUSED: &str = "oncely_capture_snapshot_paused";
pub const REFUSED_CHANGES_TOTAL: &str = "oncely_capture_refused_changes_total";
pub const OUTBOX_DEAD_LETTERS_TOTAL: &str = "oncely_capture_outbox_dead_letters_total";
pub const QUARANTINED: &str = "oncely_capture_quarantined";
pub const SCHEMA_REGISTRY_RETRIES_TOTAL: &str = "oncely_capture_schema_registry_retries_total";
pub const TABLE_LABEL: &str = "table";

/// The snapshot as a progress display shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotView {
    /// `schema.table` being copied.
    pub table: String,
    /// Rows of it read so far.
    pub rows: u64,
    /// `pg_class.reltuples`, when known.
    pub estimate: Option<u64>,
    /// Tables queued after this one.
    pub tables_after: usize,
    pub paused: bool,
}

/// The capture metrics, cheap to clone.
#[derive(Clone)]
pub struct CaptureMetrics {
    pub registry: Registry,
    /// Kafka records published (change events, tombstones).
    pub events: IntCounter,
    pub kafka_transactions: IntCounter,
    /// Time to commit one Kafka transaction (flush included).
    pub batch_commit: Histogram,
    /// Now minus the source commit time of the last published event.
    pub lag: Gauge,
    pub slot_retained_wal: IntGauge,
    /// `slot.max.retained.bytes` (0 when unset).
    pub slot_max_retained: IntGauge,
    /// 1 while the slot retains more than `slot.max.retained.bytes`.
    pub slot_over_limit: IntGauge,
    /// MySQL: binlog bytes from capture's resume position to the end.
    pub binlog_retained: IntGauge,
    pub confirmed_lsn: IntGauge,
    pub heartbeats: IntCounter,
    /// Schema changes of captured tables published.
    pub schema_changes: IntCounter,
    pub restarts: IntCounter,
    /// Requests to the schema registry retried because it was unreachable.
    pub schema_registry_retries: IntCounter,
    /// Snapshot rows read, by table (rows read again after a restart count again).
    pub snapshot_rows: IntCounterVec,
    /// Snapshot rows dropped because the stream changed their key during the chunk.
    pub snapshot_rows_dropped: IntCounterVec,
    /// The planner's row count of each snapshotted table.
    pub snapshot_rows_estimated: IntGaugeVec,
    pub snapshot_chunks: IntCounter,
    pub snapshot_running: IntGauge,
    pub snapshot_paused: IntGauge,
    /// Changes not published: a value its field cannot carry, or their
    /// table is quarantined.
    pub refused_changes: IntCounterVec,
    /// Outbox rows that could not be routed, written to the outbox
    /// dead-letter topic instead.
    pub outbox_dead_letters: IntCounterVec,
    /// 1 while a table is set aside because it cannot be captured as it is
    /// (no key, a taken topic, an identity without its key).
    pub quarantined: IntGaugeVec,
    /// What a progress bar shows; `None` when no snapshot runs.
    pub snapshot_view: Arc<Mutex<Option<SnapshotView>>>,
    /// What `/readyz` answers.
    pub health: CaptureHealth,
    /// Every registered metric, as registered.
    catalog: Arc<Vec<MetricInfo>>,
}

/// The label every capture metric carries (the registry's constant label).
pub const CONNECTOR_LABEL: &str = "connector";

/// What each metric means: its help text in `/metrics` and the catalog.
const HELP: &[(&str, &str)] = &[
    (EVENTS_TOTAL, "Kafka records published"),
    (KAFKA_TRANSACTIONS_TOTAL, "Kafka transactions committed"),
    (BATCH_COMMIT_SECONDS, "Time to commit one Kafka transaction"),
    (
        LAG_SECONDS,
        "Now minus the source commit time of the last published event",
    ),
    (
        SLOT_RETAINED_WAL_BYTES,
        "WAL bytes the slot keeps on the server",
    ),
    (
        SLOT_MAX_RETAINED_BYTES,
        "slot.max.retained.bytes, the retained WAL capture reports (0: no limit)",
    ),
    (
        SLOT_OVER_LIMIT,
        "1 while the slot retains more WAL than slot.max.retained.bytes",
    ),
    (
        BINLOG_RETAINED_BYTES,
        "MySQL/MariaDB: binlog bytes from where capture would resume to the server's end, which its retention must keep",
    ),
    (CONFIRMED_LSN, "Last LSN confirmed to the slot"),
    (HEARTBEATS_TOTAL, "Heartbeat offset commits"),
    (
        SCHEMA_CHANGES_TOTAL,
        "Schema changes of captured tables published",
    ),
    (RESTARTS_TOTAL, "Pipeline restarts after retriable errors"),
    (
        SCHEMA_REGISTRY_RETRIES_TOTAL,
        "Schema registrations retried because the schema registry was unreachable",
    ),
    (SNAPSHOT_ROWS_TOTAL, "Snapshot rows read"),
    (
        SNAPSHOT_ROWS_DROPPED_TOTAL,
        "Snapshot rows dropped because the stream changed them during their chunk",
    ),
    (
        SNAPSHOT_ROWS_ESTIMATED,
        "Estimated rows (pg_class.reltuples) of each snapshotted table",
    ),
    (SNAPSHOT_CHUNKS_TOTAL, "Snapshot chunks completed"),
    (SNAPSHOT_RUNNING, "1 while a snapshot runs"),
    (
        SNAPSHOT_PAUSED,
        "1 while the snapshot is paused by a signal",
    ),
    (
        REFUSED_CHANGES_TOTAL,
        "Changes not published: a value its field cannot carry, or their table is quarantined",
    ),
    (
        OUTBOX_DEAD_LETTERS_TOTAL,
        "Outbox rows written to the outbox dead-letter topic because they cannot be routed",
    ),
    (
        QUARANTINED,
        "1 while the table is set aside (quarantined) because it cannot be captured as it is",
    ),
];

/// The help text of the metric `name` in [`HELP`].
fn help(name: &str) -> &'static str {
    HELP.iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, help)| help)
}

/// Registers metrics in one registry and notes each in the catalog.
struct Registrar {
    registry: Registry,
    catalog: RefCell<Vec<MetricInfo>>,
}

impl Registrar {
    fn new(connector: &str) -> Self {
        let registry = Registry::new_custom(
            None,
            Some(std::iter::once((CONNECTOR_LABEL.to_string(), connector.to_string())).collect()),
        )
        .unwrap_or_default();
        Self {
            registry,
            catalog: RefCell::new(Vec::new()),
        }
    }

    /// Registers `c` and notes it in the catalog.
    fn register<C: Collector + Clone + 'static>(&self, c: C, kind: &'static str) -> C {
        for d in c.desc() {
            let mut labels = d.variable_labels.clone();
            labels.push(CONNECTOR_LABEL.to_owned());
            labels.sort();
            self.catalog.borrow_mut().push(MetricInfo {
                name: d.fq_name.clone(),
                kind,
                labels,
                help: d.help.clone(),
            });
        }
        let _ = self.registry.register(Box::new(c.clone()));
        c
    }

    fn counter(&self, name: &str) -> IntCounter {
        let c = IntCounter::with_opts(Opts::new(name, help(name)))
            .expect("static metric options are valid");
        self.register(c, "counter")
    }

    fn gauge(&self, name: &str) -> IntGauge {
        let g = IntGauge::with_opts(Opts::new(name, help(name)))
            .expect("static metric options are valid");
        self.register(g, "gauge")
    }

    fn float_gauge(&self, name: &str) -> Gauge {
        let g =
            Gauge::with_opts(Opts::new(name, help(name))).expect("static metric options are valid");
        self.register(g, "gauge")
    }

    /// A counter by table.
    fn counter_vec(&self, name: &str) -> IntCounterVec {
        let c = IntCounterVec::new(Opts::new(name, help(name)), &[TABLE_LABEL])
            .expect("static metric options are valid");
        self.register(c, "counter")
    }

    /// A gauge by table.
    fn gauge_vec(&self, name: &str) -> IntGaugeVec {
        let g = IntGaugeVec::new(Opts::new(name, help(name)), &[TABLE_LABEL])
            .expect("static metric options are valid");
        self.register(g, "gauge")
    }

    fn histogram(&self, name: &str, buckets: Vec<f64>) -> Histogram {
        let h = Histogram::with_opts(HistogramOpts::new(name, help(name)).buckets(buckets))
            .expect("static metric options are valid");
        self.register(h, "histogram")
    }
}

impl CaptureMetrics {
    pub fn new(connector: &str) -> Self {
        let r = Registrar::new(connector);
        // Registered in this order so the catalog lists them as before.
        let batch_commit = r.histogram(
            BATCH_COMMIT_SECONDS,
            vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
        );
        let lag = r.float_gauge(LAG_SECONDS);
        let snapshot_rows_estimated = r.gauge_vec(SNAPSHOT_ROWS_ESTIMATED);
        let quarantined = r.gauge_vec(QUARANTINED);
        let metrics = CaptureMetrics {
            snapshot_rows: r.counter_vec(SNAPSHOT_ROWS_TOTAL),
            snapshot_rows_dropped: r.counter_vec(SNAPSHOT_ROWS_DROPPED_TOTAL),
            snapshot_rows_estimated,
            snapshot_chunks: r.counter(SNAPSHOT_CHUNKS_TOTAL),
            snapshot_running: r.gauge(SNAPSHOT_RUNNING),
            snapshot_paused: r.gauge(SNAPSHOT_PAUSED),
            refused_changes: r.counter_vec(REFUSED_CHANGES_TOTAL),
            outbox_dead_letters: r.counter_vec(OUTBOX_DEAD_LETTERS_TOTAL),
            quarantined,
            snapshot_view: Arc::new(Mutex::new(None)),
            health: CaptureHealth::default(),
            events: r.counter(EVENTS_TOTAL),
            kafka_transactions: r.counter(KAFKA_TRANSACTIONS_TOTAL),
            batch_commit,
            lag,
            slot_retained_wal: r.gauge(SLOT_RETAINED_WAL_BYTES),
            slot_max_retained: r.gauge(SLOT_MAX_RETAINED_BYTES),
            slot_over_limit: r.gauge(SLOT_OVER_LIMIT),
            binlog_retained: r.gauge(BINLOG_RETAINED_BYTES),
            confirmed_lsn: r.gauge(CONFIRMED_LSN),
            heartbeats: r.counter(HEARTBEATS_TOTAL),
            schema_changes: r.counter(SCHEMA_CHANGES_TOTAL),
            restarts: r.counter(RESTARTS_TOTAL),
            schema_registry_retries: r.counter(SCHEMA_REGISTRY_RETRIES_TOTAL),
            registry: r.registry.clone(),
            catalog: Arc::default(),
        };
        CaptureMetrics {
            catalog: Arc::new(r.catalog.take()),
            ..metrics
        }
    }

    /// Every metric capture registers: name, type, labels, help.
    pub fn catalog(&self) -> &[MetricInfo] {
        &self.catalog
    }

    /// Prometheus text exposition of all metrics.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl oncely_core::endpoint::Probe for CaptureMetrics {
    fn metrics(&self) -> Vec<u8> {
        self.render()
    }

    fn ready(&self) -> Result<(), String> {
        self.health.ready()
    }
}
