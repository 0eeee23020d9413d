//! One life of the pipeline from its start: the checks, the fencing
//! producer, the stored offset, the snapshot plan, then the stream; and the
//! restarts after retriable failures.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::committer::{self, Committer, KafkaTx, Limits};
use super::router::Router;
use super::schema::SchemaWatch;
use super::snapshot_runtime::SnapshotDriver;
use super::tracker::Tracker;
use super::{now_ms, Pipeline, SourceSide};
use crate::config::{CaptureConfig, SourceKind};
use crate::error::CaptureError;
use crate::kafka::{check_one_partition, InternalTopic, TopicCreator, TxProducer};
use crate::metrics::CaptureMetrics;
use crate::naming::{check_length, TopicClaims};
use crate::offset::{read_stored_offset, SourceOffset};
use crate::seam::{key_columns_by_table, CapturedTable, CheckedSource, Source};
use crate::snapshot::{plan_start, GapRefused, StartFacts, TableProgress};
use crate::sources::{MySql, Postgres};
use oncely_core::wire::format_lsn;

/// Longest wait between restarts after retriable failures.
const RESTART_BACKOFF: Duration = Duration::from_millis(500);
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// Runs capture until `shutdown` is cancelled (then commits what it holds and
/// returns `Ok`) or a fatal error. Retriable failures restart the pipeline
/// from the last committed offset, with backoff.
pub async fn run(
    cfg: CaptureConfig,
    metrics: CaptureMetrics,
    shutdown: CancellationToken,
) -> Result<(), CaptureError> {
    match cfg.source {
        SourceKind::Postgres => run_source::<Postgres>(cfg, metrics, shutdown).await,
        SourceKind::Mysql => run_source::<MySql>(cfg, metrics, shutdown).await,
    }
}

/// [`run`] with source `S`.
async fn run_source<S: Source>(
    cfg: CaptureConfig,
    metrics: CaptureMetrics,
    shutdown: CancellationToken,
) -> Result<(), CaptureError> {
    if let Some(warning) = S::warning(&cfg) {
        tracing::warn!("{warning}");
    }
    let mut backoff = oncely_core::backoff::Backoff::new(RESTART_BACKOFF, MAX_RESTART_BACKOFF);
    let mut first_life = true;
    loop {
        let started = Instant::now();
        let result = run_once::<S>(&cfg, &metrics, &shutdown, first_life).await;
        first_life = false;
        match result {
            Ok(()) => return Ok(()),
            // Told to stop while waiting on something retriable (a
            // registry, Kafka): the open transaction was aborted, so the
            // last committed offset is where the next start resumes.
            Err(e) if e.is_retriable() && shutdown.is_cancelled() => {
                tracing::info!(error = %e, "capture stopped while retrying; resuming from the last committed offset next time");
                return Ok(());
            }
            Err(e) if e.is_retriable() => {
                metrics.restarts.inc();
                metrics.health.down(&e.to_string());
                if started.elapsed() > Duration::from_secs(60) {
                    backoff.reset();
                }
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "capture failed; restarting from the last committed offset");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One life of the pipeline: checks, fencing, offset, snapshot plan, stream.
/// `first_life` is false for restarts after retriable errors, which resume
/// rather than start anything (`snapshot.mode = always` snapshots once per process).
async fn run_once<S: Source>(
    cfg: &CaptureConfig,
    metrics: &CaptureMetrics,
    shutdown: &CancellationToken,
    first_life: bool,
) -> Result<(), CaptureError> {
    let mut source = S::check(cfg).await?;
    let Some(kafka) = open_kafka(cfg, shutdown).await? else {
        return Ok(()); // stopped while Kafka was unreachable
    };
    let start = plan_resume(cfg, &mut source, &kafka.offsets_topic, first_life).await?;
    log_start(cfg, &source, &start.offset);
    let mut pipeline = assemble(cfg, metrics, source, kafka, start, shutdown).await?;
    drive(&mut pipeline, shutdown).await
}

/// Kafka as start-up leaves it: capture's own topics checked and a producer
/// that fenced any older instance.
struct OpenedKafka {
    producer: TxProducer,
    topics: TopicCreator,
    offsets_topic: String,
}

/// Logs in to Kafka, checks capture's own topics and fences an older
/// instance; `None` when stopped while Kafka was unreachable.
async fn open_kafka(
    cfg: &CaptureConfig,
    shutdown: &CancellationToken,
) -> Result<Option<OpenedKafka>, CaptureError> {
    let checked = crate::kafka::check_login(cfg, Duration::from_secs(30), shutdown).await;
    if shutdown.is_cancelled() {
        return Ok(None);
    }
    checked?;
    let offsets_topic = cfg.offsets_topic();
    let mut topics = TopicCreator::new(cfg)?;
    topics.ensure_offsets_topic(&offsets_topic).await?;
    // Both are read back from partition 0 only, next.
    check_one_partition(cfg, &offsets_topic, InternalTopic::Offsets).await?;
    let schema_topic = crate::schema_change::topic(cfg);
    check_one_partition(cfg, &schema_topic, InternalTopic::SchemaChanges).await?;
    // Fences an older instance and aborts its open transaction, so the offset
    // read next is final.
    let producer = TxProducer::connect(cfg).await?;
    Ok(Some(OpenedKafka {
        producer,
        topics,
        offsets_topic,
    }))
}

/// Where this life resumes: the offset (with any snapshot the plan asks
/// for), the topics each table claims, and whether to exit once no snapshot runs.
struct Resume {
    offset: SourceOffset,
    topic_claims: TopicClaims,
    exit_when_done: bool,
}

/// Reads the stored offset, claims topics, and plans the start: the
/// snapshot to run, or the gap to refuse.
async fn plan_resume<S: Source>(
    cfg: &CaptureConfig,
    source: &mut CheckedSource<S>,
    offsets_topic: &str,
    first_life: bool,
) -> Result<Resume, CaptureError> {
    let stored = read_stored_offset(cfg).await?;
    let (topic_claims, clashes) = claim_topics(
        cfg,
        &source.tables,
        stored.as_ref().and_then(|o| o.tables.as_ref()),
    )?;
    let set_aside = &mut source.set_aside;
    for (table, why) in clashes {
        set_aside.entry(table).or_insert(why);
    }
    // The signal table's rows are commands, never published: nothing of it
    // needs a key or a topic.
    set_aside.retain(|t, _| cfg.signal_table() != Some(t.as_str()));
    let snapshot_tables = snapshot_candidates(cfg, &source.tables, set_aside, stored.as_ref());
    let start_at = source.start_at;
    let gap = stored
        .as_ref()
        .is_some_and(|o| source.earliest > o.flush_lsn);
    let plan = plan_start(StartFacts {
        mode: cfg.snapshot_mode,
        stored: stored
            .as_ref()
            .map(|o| (o.snapshot.is_some(), o.tables.as_ref())),
        gap,
        first_life,
        new_tables: cfg.snapshot_new_tables,
        captured: &snapshot_tables,
    })
    .map_err(|GapRefused| {
        let o = stored.as_ref().map(|o| o.flush_lsn).unwrap_or_default();
        gap_refused(cfg, source.earliest, o, offsets_topic)
    })?;
    let mut offset = match stored {
        Some(o) if !plan.restart_from_slot => o,
        Some(o) => {
            tracing::warn!(
                start_at = %format_lsn(start_at),
                offset_lsn = %format_lsn(o.flush_lsn),
                mode = ?cfg.snapshot_mode,
                "the stored position is no longer in the slot: streaming from the slot's position and snapshotting every captured table again"
            );
            SourceOffset::start(start_at)
        }
        None => SourceOffset::start(start_at),
    };
    if let Some((kind, names)) = plan.snapshot {
        let label = match kind {
            crate::snapshot::SnapshotKind::Initial => "initial",
            crate::snapshot::SnapshotKind::Incremental => "new-tables",
        };
        let queued = names.iter().map(|t| TableProgress::new(t, None)).collect();
        let id = format!("{label}-{}", now_ms());
        let added = crate::snapshot::request(&mut offset.snapshot, id, kind, queued);
        tracing::info!(mode = ?cfg.snapshot_mode, tables = ?added, "snapshot requested");
    }
    let mut known = offset.tables.take().unwrap_or_default();
    known.extend(snapshot_tables.iter().cloned());
    offset.tables = Some(known);
    Ok(Resume {
        offset,
        topic_claims,
        exit_when_done: plan.exit_when_done,
    })
}

/// Snapshot candidates: captured tables, less the outbox and signal tables
/// (their rows are events and commands, not state) and the tables set
/// aside, now or before (each is snapshotted when released).
fn snapshot_candidates(
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
    set_aside: &BTreeMap<String, String>,
    stored: Option<&SourceOffset>,
) -> Vec<String> {
    tables
        .iter()
        .map(|t| t.qualified())
        .filter(|t| cfg.outbox.as_ref().is_none_or(|o| &o.table != t))
        .filter(|t| cfg.signal_table() != Some(t.as_str()))
        .filter(|t| !set_aside.contains_key(t))
        .filter(|t| stored.is_none_or(|o| !o.quarantined.contains_key(t)))
        .collect()
}

/// The slot is confirmed past the stored offset and `snapshot.mode` does
/// not re-snapshot: the error names both positions and the two ways out.
fn gap_refused(cfg: &CaptureConfig, slot_lsn: u64, offset_lsn: u64, topic: &str) -> CaptureError {
    CaptureError::Gap(format!(
        "replication slot `{slot_name}` is confirmed up to {slot_lsn}, but connector `{name}` committed offsets to Kafka only up to {offset_lsn}: the changes in between were never published, so data may be missing from Kafka. The slot was dropped and recreated, or advanced by another client. To recover: re-snapshot the captured tables (start once with snapshot.mode = \"when_needed\"); or, accepting the gap, delete this connector's offset (a null-valued record with key {key} on topic `{topic}`) and start again",
        slot_name = cfg.slot_name,
        slot_lsn = format_lsn(slot_lsn),
        name = cfg.connector_name(),
        offset_lsn = format_lsn(offset_lsn),
        key = String::from_utf8_lossy(&SourceOffset::key(cfg.connector_name())),
    ))
}

fn log_start<S: Source>(cfg: &CaptureConfig, source: &CheckedSource<S>, offset: &SourceOffset) {
    tracing::info!(
        connector = cfg.connector_name(),
        // A MySQL source reads the binlog: it has no slot.
        slot = (cfg.source == SourceKind::Postgres).then_some(cfg.slot_name.as_str()),
        tables = source.tables.len(),
        resume_commit_lsn = %format_lsn(offset.commit_lsn),
        resume_events = offset.events,
        flush_lsn = %format_lsn(offset.flush_lsn),
        snapshot_table = offset.snapshot.as_ref().and_then(|p| p.current()).map(|t| t.table.as_str()),
        snapshot_rows_done = offset.snapshot.as_ref().and_then(|p| p.current()).map(|t| t.rows),
        "capture starting"
    );
}

/// Reads the schema history, opens the stream at the resumed position and
/// puts the pipeline together, the tables set aside quarantined.
async fn assemble<'a, S: Source>(
    cfg: &'a CaptureConfig,
    metrics: &CaptureMetrics,
    source: CheckedSource<S>,
    kafka: OpenedKafka,
    start: Resume,
    shutdown: &CancellationToken,
) -> Result<Pipeline<'a, S>, CaptureError> {
    let schemas = crate::schema_change::read_history(cfg).await?;
    let stream = S::open_stream(cfg, &start.offset).await?;
    let chunks = S::chunks(cfg, &stream);
    metrics.health.connected();
    let mut pipeline = Pipeline {
        cfg,
        metrics: metrics.clone(),
        router: Router::new(
            cfg,
            start.topic_claims,
            key_columns_by_table(&source.tables),
            source.types,
        )?,
        kafka: Committer::new(
            KafkaTx {
                producer: kafka.producer,
                topics: kafka.topics,
                avro: crate::avro::AvroWriter::new(
                    cfg,
                    crate::avro::WriterContext {
                        json_topics: vec![
                            kafka.offsets_topic.clone(),
                            crate::schema_change::topic(cfg),
                        ],
                        stop: shutdown.clone(),
                        retries: metrics.schema_registry_retries.clone(),
                    },
                )?,
            },
            Limits {
                events: cfg.batch_max_events,
                bytes: cfg.batch_max_bytes,
            },
            committer::Topics {
                offsets: kafka.offsets_topic.as_str().into(),
                offset_key: SourceOffset::key(cfg.connector_name()),
                schema_changes: crate::schema_change::topic(cfg).into(),
            },
            metrics.clone(),
            start.offset,
        ),
        source: SourceSide {
            stream,
            control: source.control,
            tracker: Tracker::default(),
            server_position: 0,
            chunks,
            schema: SchemaWatch::new(crate::schema_change::topic(cfg).into(), schemas),
        },
        snapshot: SnapshotDriver::new(cfg.chunk_size(), metrics.clone())
            .with_row_filters(cfg.table_filter.clone())
            .exiting_when_done(start.exit_when_done),
    };
    for (table, why) in source.set_aside {
        pipeline.quarantine(&table, why);
    }
    // Set aside by an earlier life and not seen broken now: the first
    // heartbeat's catalog check decides (see `pipeline::quarantine`).
    pipeline.snapshot.show_quarantine(pipeline.kafka.position());
    Ok(pipeline)
}

/// Streams until shutdown or an error; after an error aborts the open
/// transaction. Stops the stream either way.
async fn drive<S: Source>(
    pipeline: &mut Pipeline<'_, S>,
    shutdown: &CancellationToken,
) -> Result<(), CaptureError> {
    // A record the broker refused for its size fails the transaction, and
    // whatever call comes next (a send, the commit) reports only that: name
    // the record, and make it definite.
    let result = match pipeline.stream(shutdown).await {
        Ok(()) => Ok(()),
        Err(e) => Err(pipeline.explain_refused(e).await),
    };
    if result.is_err() {
        // Nothing of an aborted batch is visible; the restart resumes at the
        // last offset record in Kafka.
        pipeline.kafka.abort().await;
    }
    S::stop(&mut pipeline.source.stream);
    result
}

/// The topics of the captured tables, each claimed by one table, and the
/// tables set aside (with the reason) because their topic is another's
/// (a table, or capture's own offsets or message topic) or longer than
/// Kafka allows. Tables captured before (`known`) claim first, so a table
/// that appears keeps none of an existing table's topic.
fn claim_topics(
    cfg: &CaptureConfig,
    tables: &[CapturedTable],
    known: Option<&BTreeSet<String>>,
) -> Result<(TopicClaims, Vec<(String, String)>), CaptureError> {
    let mut claims = TopicClaims::default();
    let refuse = |e: &dyn std::fmt::Display| CaptureError::Prerequisite(e.to_string());
    claims
        .claim_own(
            &cfg.offsets_topic(),
            "the offsets topic (offset.storage.topic)",
        )
        .map_err(|e| refuse(&e))?;
    claims
        .claim_own(
            &crate::naming::sanitize_topic(&format!("{}.message", cfg.topic_prefix)),
            "logical decoding messages",
        )
        .map_err(|e| refuse(&e))?;
    if let Some(outbox) = &cfg.outbox {
        let topic = outbox.dead_letter_topic(&cfg.topic_prefix);
        claims
            .claim_own(
                &topic,
                "the outbox dead-letter topic (outbox.errors.deadletterqueue.topic.name)",
            )
            .map_err(|e| refuse(&e))?;
    }
    let is_known = |t: &CapturedTable| known.is_some_and(|k| k.contains(&t.qualified()));
    let ordered = tables
        .iter()
        .filter(|t| is_known(t))
        .chain(tables.iter().filter(|t| !is_known(t)));
    let mut clashes = Vec::new();
    for t in ordered {
        // The outbox's rows go to its event topics, not to a table topic.
        if cfg
            .outbox
            .as_ref()
            .is_some_and(|o| o.table == t.qualified())
        {
            continue;
        }
        let topic = cfg.table_topic(&t.schema, &t.name);
        let claimed = check_length(&topic, &t.qualified())
            .map_err(|e| e.to_string())
            .and_then(|()| {
                claims
                    .claim_table(&topic, &t.schema, &t.name)
                    .map_err(|e| e.to_string())
            });
        if let Err(why) = claimed {
            clashes.push((t.qualified(), why));
        }
    }
    Ok((claims, clashes))
}

#[cfg(test)]
mod source_tests {
    use super::*;

    #[tokio::test]
    async fn a_mysql_capture_without_its_replica_id_stops_before_connecting() {
        let text =
            "source = \"mysql\"\ntopic.prefix = \"shop\"\ndatabase.hostname = \"127.0.0.1\"\n\
             database.port = 1\ndatabase.user = \"oncely\"\ndatabase.include.list = \"inventory\"\n\
             kafka.bootstrap.servers = \"127.0.0.1:1\"\n";
        let cfg = CaptureConfig::parse(text, "test").expect("a valid MySQL config");
        let err = run(cfg, CaptureMetrics::new("test"), CancellationToken::new())
            .await
            .expect_err("no replica id");
        let message = err.to_string();
        assert!(message.contains("database.server.id"), "{message}");
        assert!(!err.is_retriable(), "{message}");
    }
}
