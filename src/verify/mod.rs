//! `oncely verify`: is every target equal to the source?
//!
//! For each sink configuration given, and each captured table that sink
//! consumes, verify reads the source table in primary-key pages (keyset
//! pagination: bounded memory on any table size), looks each page's keys up
//! in the target (warehouse rows by key, Elasticsearch `_mget`, pipelined
//! Redis reads), and compares every column in the form capture writes it
//! (docs/design.md, "Wire format"), read the way that sink stores it. Then it
//! compares the target's live row count with the source's; when the target
//! holds more, it pages through the target's keys to name the extra ones.
//!
//! First it waits for the targets to catch up: it takes the source's WAL
//! position, waits until capture's committed offset record covers it, then
//! until each sink has applied everything the topics held at that point.
//! Topics another producer wrote (a real Debezium connector) have no offset
//! record: with [`Options::capture_offset`] off only the sinks are waited for.
//! Changes made while verify runs may show up as differences: verify a
//! quiet source, or let it compare again (`retries`) — a difference that
//! stays through several catch-ups is real.
//!
//! The source is PostgreSQL, or MySQL/MariaDB (`source = "mysql"`:
//! `mysql_source.rs`, read through the MySQL source's own chunk reads and
//! mapping, values as the sinks hold Debezium's MySQL encodings); with a
//! MySQL source, capture's offset is waited for up to the binlog's end as
//! its order key (`SourceDb::position_now`), or not at all for topics
//! Debezium wrote (`--no-capture-offset`).

mod compare;
mod mysql_source;
mod report;
mod sink_target;
mod source;
mod source_db;
mod wait;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use oncely_capture::config::{CaptureConfig, SourceKind};
use oncely_sinks::verify_reader::{StoredForm, VerifiedTable};

pub use compare::{compare_row, compare_selected, values_equal, ColumnDiff, Compared};
pub use mysql_source::binlog_end_key;
pub use report::{Difference, Report, TableReport, TargetReport};
pub use sink_target::{Target, PAGE};
pub use source::format_lsn;
pub use source::{Column, ColumnKind, PgSource, SourceRow, SourceTable};
pub use source_db::SourceDb;
pub use wait::{oldest_unapplied, topic_ends, SinkWait, Unapplied};

/// [`VerifyError::Postgres`] with `context`, for readers outside verify (`oncely status`).
pub(crate) fn pg_error(context: &'static str) -> impl Fn(tokio_postgres::Error) -> VerifyError {
    VerifyError::pg(context)
}

/// What to verify and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The capture configuration: the source database, captured tables, topics.
    pub capture: PathBuf,
    /// Sink configurations: each names a target and the topics it consumes.
    pub sinks: Vec<PathBuf>,
    /// Whether to wait for capture and the sinks to catch up first.
    pub wait: bool,
    /// Whether that wait starts with capture's committed offset record
    /// covering the source's WAL position. `false` for topics another
    /// producer wrote (a real Debezium connector has no such record): then
    /// only the sinks are waited for, up to the ends the topics have when
    /// verify starts, so the producer must have published first.
    pub capture_offset: bool,
    /// How long the whole wait may take.
    pub timeout: Duration,
    /// Differing keys listed per table.
    pub examples: usize,
    /// How many times to wait and compare again while differences remain: on
    /// a source that keeps changing, rows changed during a pass differ until
    /// the targets catch up with them.
    pub retries: u32,
}

/// Why verify could not compare (differences are not errors: see [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("source: {0}")]
    Source(String),
    #[error("{context}: {source}")]
    Postgres {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("target: {0}")]
    Target(String),
    #[error("kafka: {0}")]
    Kafka(String),
    #[error("timed out waiting for the targets to catch up: {0}")]
    Timeout(String),
}

impl VerifyError {
    fn pg(context: impl Into<String>) -> impl Fn(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |source| Self::Postgres {
            context: context.clone(),
            source,
        }
    }
}

/// The source's database as the sinks name it (`{db}`): PostgreSQL's
/// `database.dbname`; for MySQL the one database `database.include.list`
/// names (`source.db` is each table's own database there; with several,
/// verify reads targets whose names do not use `{db}`).
pub(crate) fn source_db(cfg: &CaptureConfig) -> String {
    match cfg.source {
        SourceKind::Postgres => cfg.database_dbname.clone(),
        SourceKind::Mysql => match cfg.database_include_list.0.as_slice() {
            [one] => one.clone(),
            _ => String::new(),
        },
    }
}

/// Waits (unless told not to), then compares every target with the source.
pub async fn run(options: &Options) -> Result<Report, VerifyError> {
    let cfg =
        CaptureConfig::load(&options.capture).map_err(|e| VerifyError::Config(e.to_string()))?;
    let source = SourceDb::connect(&cfg).await?;
    let tables = source.tables(&cfg).await?;
    let mut targets = Vec::with_capacity(options.sinks.len());
    for path in &options.sinks {
        targets.push(Target::open(path, &cfg).await?);
    }
    // A field selection that excludes a key column is refused before waiting
    // for sinks that stop on it.
    for target in &targets {
        for table in tables.iter().filter(|t| target.covers(&t.topic)) {
            target.verified_table(table)?;
        }
    }
    let mut retried = 0;
    loop {
        let mut report = compare_all(options, &cfg, &source, &tables, &targets).await?;
        report.retried = retried;
        if report.is_equal() || retried >= options.retries {
            return Ok(report);
        }
        retried += 1;
        tracing::info!(
            differing = report.differing(),
            "differences found; comparing again (retry {retried} of {})",
            options.retries
        );
    }
}

/// One round: wait (unless told not to), then compare every table of every target.
async fn compare_all(
    options: &Options,
    cfg: &CaptureConfig,
    source: &SourceDb,
    tables: &[SourceTable],
    targets: &[Target],
) -> Result<Report, VerifyError> {
    let mut report = Report {
        source: format!(
            "{}@{}:{}/{}",
            cfg.database_user,
            cfg.database_hostname,
            cfg.port(),
            source_db(cfg)
        ),
        source_lsn: None,
        capture_wait: None,
        sink_waits: Vec::new(),
        targets: Vec::new(),
        retried: 0,
    };
    if options.wait {
        let started = Instant::now();
        let deadline = started + options.timeout;
        if options.capture_offset {
            let lsn = source.position_now(cfg).await?;
            report.source_lsn = Some(source::format_lsn(lsn));
            wait::capture(cfg, lsn, deadline).await?;
            report.capture_wait = Some(started.elapsed());
        }
        let topics: Vec<String> = tables.iter().map(|t| t.topic.clone()).collect();
        let kafka = cfg.kafka_client();
        let ends = wait::topic_ends(&kafka, &topics).await?;
        for target in targets {
            report
                .sink_waits
                .push(wait::sink(&kafka, target, &ends, deadline).await?);
        }
    }
    for target in targets {
        let mut tables_report = Vec::new();
        for table in tables.iter().filter(|t| target.covers(&t.topic)) {
            tables_report.push(compare_table(source, target, table, options.examples).await?);
        }
        report.targets.push(TargetReport {
            label: target.label.clone(),
            tables: tables_report,
        });
    }
    Ok(report)
}

/// Compares one table with its copy in one target.
pub async fn compare_table(
    source: &SourceDb,
    target: &Target,
    table: &SourceTable,
    examples: usize,
) -> Result<TableReport, VerifyError> {
    let verified = target.verified_table(table)?;
    let selected = |column: &str| target.stores(table, column);
    let mut out = TableReport {
        table: table.qualified(),
        location: target.location(&verified),
        ..TableReport::default()
    };
    let mut after: Option<SourceRow> = None;
    loop {
        let rows = source.page(table, after.as_ref(), PAGE).await?;
        if rows.is_empty() {
            break;
        }
        let found = target.fetch(&verified, &rows).await?;
        // Source values converted as the target converted its own.
        let converted = found
            .form
            .columns(verified.columns.iter().map(|(n, s)| (n.as_str(), s)));
        for (row, held) in rows.iter().zip(found.rows) {
            match held {
                None => {
                    out.missing += 1;
                    if out.examples.len() < examples {
                        out.examples.push(Difference::Missing {
                            key: row.key_json(table),
                        });
                    }
                }
                Some(held) => {
                    let stored = StoredForm::convert(&row.row, &converted);
                    let compared = compare_selected(table, &selected, &stored, &held);
                    out.held_unselected.extend(compared.held_unselected);
                    if let Some(diff) = compared.diff {
                        out.changed += 1;
                        if out.examples.len() < examples {
                            out.examples.push(Difference::Changed {
                                key: row.key_json(table),
                                diff,
                            });
                        }
                    }
                }
            }
        }
        out.source_rows += rows.len() as u64;
        let full = rows.len() == PAGE;
        after = rows.last().cloned();
        if !full {
            break;
        }
    }
    out.target_rows = target.count(&verified).await?;
    let matched = out.source_rows - out.missing;
    if out.target_rows > matched {
        out.extra = out.target_rows - matched;
        find_extra(source, target, (table, &verified), examples, &mut out).await?;
    }
    Ok(out)
}

/// Pages through the target's keys for ones the source lacks, until `examples` are named.
async fn find_extra(
    source: &SourceDb,
    target: &Target,
    (table, verified): (&SourceTable, &VerifiedTable),
    examples: usize,
    out: &mut TableReport,
) -> Result<(), VerifyError> {
    let mut named = 0;
    let mut cursor = None;
    loop {
        let (keys, next) = target.scan_keys(verified, cursor).await?;
        let existing = source.existing(table, &keys).await?;
        for key in keys.into_iter().filter(|k| !existing.contains(k)) {
            if named >= examples.min(out.extra as usize) {
                return Ok(());
            }
            out.examples.push(Difference::Extra { key });
            named += 1;
        }
        match next {
            Some(n) if named < examples => cursor = Some(n),
            _ => return Ok(()),
        }
    }
}
