//! `oncely status`: one screen per pipeline — the source's side (PostgreSQL:
//! the replication slot and capture's committed offset against the server's
//! WAL position; MySQL/MariaDB: the stored binlog position against the
//! server's binlogs, [`mysql`]), and per sink its positions against the
//! topics' ends and its dead letters. It reads what `oncely verify` reads
//! (the same configs, [`crate::verify`]'s source, target and topic readers)
//! and compares nothing row by row.
//!
//! The verdict, for scripts: **down** (exit 2) when the slot is missing or no
//! walsender holds it (capture is not streaming), capture has committed no
//! offset, or it cannot resume from it (MySQL: a purged binlog, another
//! server's position, a server not set up for capture); **degraded**
//! (exit 1) when the slot retains more WAL than `slot.max.retained.bytes`,
//! a sink's dead-letter topic holds records, or a sink is more than
//! `max_lag` offsets behind; else **healthy** (exit 0).

mod mysql;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use oncely_capture::catalog::{read_stored_offset, SourceOffset};
use oncely_capture::config::CaptureConfig;
use oncely_core::clock::now_ms;
use oncely_sinks::TopicPartition;
use serde_json::{json, Value};

use crate::verify::{
    oldest_unapplied, topic_ends, PgSource, SourceDb, Target, Unapplied, VerifyError,
};

pub use mysql::BinlogStatus;

/// What to look at.
#[derive(Debug, Clone)]
pub struct Options {
    pub capture: PathBuf,
    pub sinks: Vec<PathBuf>,
    /// Offsets a sink may be behind its topics' ends before it is degraded.
    pub max_lag: i64,
}

/// The verdict; its exit code is [`Health::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Healthy,
    Degraded,
    Down,
}

impl Health {
    pub fn code(self) -> i32 {
        self as i32
    }

    fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Down => "down",
        }
    }
}

/// The replication slot as the server reports it.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub name: String,
    pub exists: bool,
    /// A walsender holds it (capture streams).
    pub active: bool,
    pub confirmed_lsn: Option<String>,
    pub retained_bytes: Option<i64>,
    /// Capture's lag as the walsender measures it (see [`PgStatus::capture_lag_seconds`]).
    pub lag_seconds: Option<f64>,
    /// `slot.max.retained.bytes`.
    pub max_retained_bytes: Option<u64>,
}

/// One sink.
#[derive(Debug, Clone)]
pub struct SinkStatus {
    pub label: String,
    pub group: String,
    /// Per partition: (position, end); position `None` before the first apply.
    pub partitions: BTreeMap<TopicPartition, (Option<i64>, i64)>,
    /// Per partition behind its end: seconds the oldest committed record it
    /// has not applied has been in Kafka (absent: nothing unapplied).
    pub waiting_seconds: BTreeMap<TopicPartition, f64>,
    /// Per partition behind its end: seconds since that record's change
    /// committed at the source (its `source.ts_ms`), so capture's delay
    /// counts too: how stale the target is.
    pub source_seconds: BTreeMap<TopicPartition, f64>,
    pub dead_letter_topic: Option<String>,
    /// Records in the dead-letter topic (all sinks writing to it).
    pub dead_letters: Option<i64>,
}

impl SinkStatus {
    /// Offsets between the positions and the ends (transaction markers
    /// included, so at most this many records).
    pub fn lag(&self) -> i64 {
        self.partitions
            .values()
            .map(|(at, end)| (end - at.unwrap_or(0)).max(0))
            .sum()
    }
}

/// The source's side of a PostgreSQL pipeline: the slot and capture's
/// committed offset against the server's WAL.
#[derive(Debug, Clone)]
pub struct PgStatus {
    pub server_lsn: String,
    pub slot: SlotStatus,
    /// Capture's committed offset: its flush LSN, and bytes behind the server.
    pub committed_lsn: Option<String>,
    pub capture_lag_bytes: Option<i64>,
    /// The server's measure of capture's lag: time from flushing WAL at the
    /// source to capture confirming it (`pg_stat_replication.replay_lag` of
    /// the walsender holding the slot); 0 when nothing is unconfirmed,
    /// `None` when no walsender holds the slot.
    pub capture_lag_seconds: Option<f64>,
}

/// The source's side, by the source capture's configuration names.
#[derive(Debug, Clone)]
pub enum SourceStatus {
    Postgres(PgStatus),
    Mysql(Box<BinlogStatus>),
}

/// Everything `oncely status` shows.
#[derive(Debug, Clone)]
pub struct Status {
    pub connector: String,
    pub source: SourceStatus,
    /// Seconds since the source commit of the last transaction capture
    /// published (grows while the source is idle too).
    pub last_published_age_seconds: Option<f64>,
    /// The snapshot running, from the committed offset: (id, table being
    /// copied, its rows read, tables queued after it, paused).
    pub snapshot: Option<(String, String, u64, usize, bool)>,
    pub sinks: Vec<SinkStatus>,
    pub max_lag: i64,
    /// Why the verdict is what it is (empty when healthy).
    pub problems: Vec<(Health, String)>,
}

impl Status {
    pub fn health(&self) -> Health {
        self.problems
            .iter()
            .map(|(h, _)| *h)
            .max()
            .unwrap_or(Health::Healthy)
    }

    pub fn to_json(&self) -> Value {
        let mut doc = json!({
            "health": self.health().name(),
            "problems": self.problems.iter().map(|(h, why)| json!({"severity": h.name(), "problem": why})).collect::<Vec<_>>(),
            "connector": self.connector,
        });
        let mut capture = match &self.source {
            SourceStatus::Postgres(pg) => {
                doc["server_lsn"] = json!(pg.server_lsn);
                doc["slot"] = json!({
                    "name": pg.slot.name,
                    "exists": pg.slot.exists,
                    "active": pg.slot.active,
                    "confirmed_lsn": pg.slot.confirmed_lsn,
                    "retained_bytes": pg.slot.retained_bytes,
                    "max_retained_bytes": pg.slot.max_retained_bytes,
                });
                json!({
                    "committed_lsn": pg.committed_lsn,
                    "lag_bytes": pg.capture_lag_bytes,
                    "lag_seconds": pg.capture_lag_seconds,
                })
            }
            SourceStatus::Mysql(my) => {
                doc["source"] = json!("mysql");
                doc["server"] = my.server_json();
                my.capture_json()
            }
        };
        capture["last_published_age_seconds"] = json!(self.last_published_age_seconds);
        capture["snapshot"] =
            json!(self.snapshot.as_ref().map(|(id, table, rows, queued, paused)| json!({
            "id": id, "table": table, "rows": rows, "tables_queued": queued, "paused": paused,
        })));
        doc["capture"] = capture;
        doc["sinks"] = self
            .sinks
            .iter()
            .map(|s| {
                json!({
                    "sink": s.label,
                    "group": s.group,
                    "lag_offsets": s.lag(),
                    "partitions": s.partitions.iter().map(|(tp, (at, end))| json!({
                        "topic": tp.topic, "partition": tp.partition, "position": at, "end": end,
                        "lag_offsets": (end - at.unwrap_or(0)).max(0),
                        "lag_seconds": seconds(&s.waiting_seconds, tp),
                        "lag_source_seconds": seconds(&s.source_seconds, tp),
                    })).collect::<Vec<_>>(),
                    "dead_letter_topic": s.dead_letter_topic,
                    "dead_letters": s.dead_letters,
                })
            })
            .collect();
        doc
    }
}

impl PgStatus {
    fn fmt_lines(&self, connector: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.slot;
        writeln!(f, "capture {connector} (server WAL at {})", self.server_lsn)?;
        if s.exists {
            writeln!(
                f,
                "  slot {}: {}, confirmed {}, retains {} bytes of WAL (limit {})",
                s.name,
                if s.active { "active" } else { "INACTIVE" },
                s.confirmed_lsn.as_deref().unwrap_or("-"),
                s.retained_bytes.unwrap_or(0),
                s.max_retained_bytes
                    .map_or("none: slot.max.retained.bytes unset".to_owned(), |m| m
                        .to_string()),
            )?;
        } else {
            writeln!(f, "  slot {}: MISSING", s.name)?;
        }
        writeln!(
            f,
            "  committed offset {} ({} bytes, {} behind the server)",
            self.committed_lsn.as_deref().unwrap_or("none"),
            self.capture_lag_bytes
                .map_or("?".to_owned(), |b| b.to_string()),
            self.capture_lag_seconds
                .map_or("? s".to_owned(), |s| format!("{s:.1} s"))
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            SourceStatus::Postgres(pg) => pg.fmt_lines(&self.connector, f)?,
            SourceStatus::Mysql(my) => my.fmt_lines(&self.connector, f)?,
        }
        if let Some(age) = self.last_published_age_seconds {
            writeln!(
                f,
                "  last published transaction committed {age:.0} s ago at the source"
            )?;
        }
        if let Some((id, table, rows, queued, paused)) = &self.snapshot {
            writeln!(
                f,
                "  snapshot {id}: copying {table} ({rows} rows read), {queued} tables queued{}",
                if *paused { ", PAUSED" } else { "" }
            )?;
        }
        for sink in &self.sinks {
            writeln!(
                f,
                "{}: {} offsets behind, dead letters {}",
                sink.label,
                sink.lag(),
                match (&sink.dead_letter_topic, sink.dead_letters) {
                    (None, _) => "(no dead-letter topic)".to_owned(),
                    (Some(t), n) => format!("{} in {t}", n.unwrap_or(0)),
                }
            )?;
            for (tp, (at, end)) in &sink.partitions {
                writeln!(
                    f,
                    "  {tp} at {} of {end} (lag {} offsets, {:.1} s in Kafka, {:.1} s since the source commit)",
                    at.map_or("-".to_owned(), |a| a.to_string()),
                    (end - at.unwrap_or(0)).max(0),
                    seconds(&sink.waiting_seconds, tp),
                    seconds(&sink.source_seconds, tp),
                )?;
            }
        }
        for (h, why) in &self.problems {
            writeln!(f, "{}: {why}", h.name().to_uppercase())?;
        }
        write!(f, "status: {}", self.health().name())
    }
}

fn seconds(per_partition: &BTreeMap<TopicPartition, f64>, tp: &TopicPartition) -> f64 {
    per_partition.get(tp).copied().unwrap_or(0.0)
}

/// A sink whose position Kafka deleted (retention) before it applied the
/// records: what is gone and the fix.
fn gap_problem(label: &str, tp: &TopicPartition, at: i64, low: i64) -> String {
    format!(
        "{label}: {tp} needs offset {at} but Kafka's log starts at {low}: {} offsets were deleted before the sink applied them, and the target misses their changes. Fix: snapshot the topic's table (`oncely capture snapshot --table <schema.table>`), then start the sink once with `--resume-after-gap`",
        low - at
    )
}

/// What a running sink's `/readyz` says when it is not ready (a quarantined
/// table, a gap, a lagging commit); `None` when it is ready, serves no
/// endpoint or cannot be reached (it may run on another host).
async fn not_ready(target: &Target) -> Option<String> {
    let addr = target.health_addr()?;
    let probe = oncely_core::endpoint::get(addr, "/readyz");
    match tokio::time::timeout(std::time::Duration::from_secs(2), probe).await {
        Ok(Ok((503, body))) => Some(body.trim().to_owned()),
        _ => None,
    }
}

/// Seconds from `ms` (since the epoch) to `now`, never negative.
fn age(now: i64, ms: i64) -> f64 {
    (now - ms).max(0) as f64 / 1000.0
}

/// Reads the status of the pipeline the configs describe.
pub async fn run(options: &Options) -> Result<Status, VerifyError> {
    let cfg =
        CaptureConfig::load(&options.capture).map_err(|e| VerifyError::Config(e.to_string()))?;
    let source = SourceDb::connect(&cfg).await?;
    let mut problems = Vec::new();
    let offset = stored_offset(&cfg, &mut problems).await;
    // Capture keeps the tables it set aside in its offset record: read
    // there, they show whether or not capture runs.
    for (table, why) in offset.iter().flat_map(|o| &o.quarantined) {
        problems.push((
            Health::Degraded,
            format!("capture: table {table} is quarantined, its changes are not published (the other tables flow); once fixed, capture snapshots it by itself: {why}"),
        ));
    }
    let (source_status, tables) = match &source {
        SourceDb::Postgres(pg) => (
            SourceStatus::Postgres(postgres(pg, &cfg, offset.as_ref(), &mut problems).await?),
            pg.keyed_tables(&cfg).await?,
        ),
        SourceDb::Mysql(_) => (
            SourceStatus::Mysql(Box::new(
                mysql::read(&cfg, offset.as_ref(), &mut problems).await?,
            )),
            source.tables(&cfg).await?,
        ),
    };
    let topics: Vec<String> = tables.iter().map(|t| t.topic.clone()).collect();
    let sinks = sinks(options, &cfg, &topics, &mut problems).await?;
    Ok(Status {
        connector: cfg.connector_name().to_owned(),
        source: source_status,
        last_published_age_seconds: offset
            .as_ref()
            .filter(|o| o.ts_ms > 0)
            .map(|o| age(now_ms(), o.ts_ms)),
        snapshot: offset
            .as_ref()
            .and_then(|o| o.snapshot.as_ref())
            .and_then(|s| {
                s.current().map(|t| {
                    let queued = s.tables.len().saturating_sub(1);
                    (s.id.clone(), t.table.clone(), t.rows, queued, s.paused)
                })
            }),
        sinks,
        max_lag: options.max_lag,
        problems,
    })
}

/// Capture's committed offset record; `None`, with the problem, when there
/// is none or it cannot be read.
async fn stored_offset(
    cfg: &CaptureConfig,
    problems: &mut Vec<(Health, String)>,
) -> Option<SourceOffset> {
    match read_stored_offset(cfg).await {
        Ok(Some(o)) => Some(o),
        Ok(None) => {
            problems.push((
                Health::Down,
                "capture has committed no offset to Kafka yet".to_owned(),
            ));
            None
        }
        // Before capture's first start its offsets topic does not exist.
        Err(e) => {
            problems.push((
                Health::Down,
                format!("cannot read capture's offset ({e}): has capture ever run?"),
            ));
            None
        }
    }
}

/// The slot and capture's committed offset against the server's WAL.
async fn postgres(
    source: &PgSource,
    cfg: &CaptureConfig,
    offset: Option<&SourceOffset>,
    problems: &mut Vec<(Health, String)>,
) -> Result<PgStatus, VerifyError> {
    let server = source.current_wal_lsn().await?;
    let row = source
        .client()
        .query_opt(
            "SELECT active AND EXISTS (SELECT 1 FROM pg_stat_replication r WHERE r.pid = s.active_pid),
                    confirmed_flush_lsn::text,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
                    -- NULL lag while a walsender holds the slot: nothing unconfirmed.
                    (SELECT extract(epoch FROM coalesce(r.replay_lag, interval '0'))::float8
                       FROM pg_stat_replication r WHERE r.pid = s.active_pid)
               FROM pg_replication_slots s WHERE slot_name = $1",
            &[&cfg.slot_name],
        )
        .await
        .map_err(crate::verify::pg_error("read the replication slot"))?;
    let slot = SlotStatus {
        name: cfg.slot_name.clone(),
        exists: row.is_some(),
        active: row.as_ref().is_some_and(|r| r.get::<_, bool>(0)),
        confirmed_lsn: row.as_ref().and_then(|r| r.get(1)),
        retained_bytes: row.as_ref().and_then(|r| r.get(2)),
        lag_seconds: row.as_ref().and_then(|r| r.get(3)),
        max_retained_bytes: cfg.slot_max_retained_bytes,
    };
    if !slot.exists {
        problems.push((Health::Down, format!("replication slot {} does not exist: capture never started, or the slot was dropped (start capture; a dropped slot needs snapshot.mode = \"when_needed\")", slot.name)));
    } else if !slot.active {
        problems.push((Health::Down, format!("no walsender holds slot {}: capture is not streaming (is `oncely capture` running? its log and /readyz say why)", slot.name)));
    }
    if let (Some(r), Some(max)) = (slot.retained_bytes, slot.max_retained_bytes) {
        if u64::try_from(r).is_ok_and(|r| r > max) {
            problems.push((Health::Degraded, format!("slot {} retains {r} bytes of WAL, more than slot.max.retained.bytes = {max} (docs/operating.md, Slot lag)", slot.name)));
        }
    }
    let committed = offset.map(|o| o.flush_lsn);
    Ok(PgStatus {
        capture_lag_seconds: slot.lag_seconds,
        server_lsn: crate::verify::format_lsn(server),
        slot,
        committed_lsn: committed.map(crate::verify::format_lsn),
        capture_lag_bytes: committed
            .map(|c| i64::try_from(server.saturating_sub(c)).unwrap_or(i64::MAX)),
    })
}

/// Each sink's positions against the ends of `topics`, its dead letters
/// and its readiness.
async fn sinks(
    options: &Options,
    cfg: &CaptureConfig,
    topics: &[String],
    problems: &mut Vec<(Health, String)>,
) -> Result<Vec<SinkStatus>, VerifyError> {
    let kafka = cfg.kafka_client();
    let ends = topic_ends(&kafka, topics).await?;
    let mut sinks = Vec::new();
    for path in &options.sinks {
        let target = Target::open(path, cfg).await?;
        let partitions: Vec<TopicPartition> = ends
            .keys()
            .filter(|tp| target.covers(&tp.topic))
            .cloned()
            .collect();
        let positions = target.positions(&partitions).await?;
        let dlq = target.dead_letter_topic().map(str::to_owned);
        let dead_letters = match &dlq {
            Some(t) => Some(
                topic_ends(&kafka, std::slice::from_ref(t))
                    .await?
                    .values()
                    .map(|(low, high)| high - low)
                    .sum(),
            ),
            None => None,
        };
        // The oldest unapplied record of each partition behind its end
        // (low watermark when it has no position yet).
        let behind: Vec<(TopicPartition, i64, i64)> = partitions
            .iter()
            .map(|p| {
                (
                    p.clone(),
                    positions.get(p).copied().unwrap_or(ends[p].0),
                    ends[p].1,
                )
            })
            .filter(|(_, at, end)| at < end)
            .collect();
        let now = now_ms();
        let unapplied = oldest_unapplied(&kafka, behind).await?;
        let ages = |at: fn(&Unapplied) -> Option<i64>| -> BTreeMap<TopicPartition, f64> {
            unapplied
                .iter()
                .filter_map(|(p, u)| Some((p.clone(), age(now, at(u.as_ref()?)?))))
                .collect()
        };
        let sink = SinkStatus {
            waiting_seconds: ages(|u| u.kafka_ms),
            source_seconds: ages(|u| u.source_ms),
            label: target.label.clone(),
            group: target.group().to_owned(),
            partitions: partitions
                .iter()
                .map(|p| (p.clone(), (positions.get(p).copied(), ends[p].1)))
                .collect(),
            dead_letter_topic: dlq,
            dead_letters,
        };
        for p in &partitions {
            let (low, _) = ends[p];
            // No position: the sink starts it at offset 0 when it reads
            // from the earliest, and stops there if the log lost its start.
            let needs = positions
                .get(p)
                .copied()
                .or_else(|| target.reads_from_earliest().then_some(0));
            if let Some(at) = needs.filter(|at| *at < low) {
                problems.push((Health::Down, gap_problem(&sink.label, p, at, low)));
            }
        }
        if let Some(why) = not_ready(&target).await {
            problems.push((
                Health::Degraded,
                format!("{}: not ready: {why}", sink.label),
            ));
        }
        if sink.dead_letters.unwrap_or(0) > 0 {
            problems.push((
                Health::Degraded,
                format!(
                    "{}: {} dead letters in {} (docs/operating.md, Dead letters)",
                    sink.label,
                    sink.dead_letters.unwrap_or(0),
                    sink.dead_letter_topic.as_deref().unwrap_or("-")
                ),
            ));
        }
        if sink.lag() > options.max_lag {
            problems.push((Health::Degraded, format!("{}: {} offsets behind, more than --max-lag {} (is it running? its /readyz says why)", sink.label, sink.lag(), options.max_lag)));
        }
        sinks.push(sink);
    }
    Ok(sinks)
}
