//! The capture pipeline: replication stream -> change events -> Kafka
//! transactions that each end with the offset record covering them.
//!
//! One task owns the stream, the producer and the position, so the order of
//! events, offset records and slot confirmations is the order of the code:
//! a position is confirmed to PostgreSQL only after the Kafka transaction
//! holding its offset record committed.
//!
//! A Kafka transaction commits in the background while the stream is read on:
//! changes read meanwhile are encoded and held, and open the next transaction
//! once the commit succeeded (a producer has one transaction at a time). The
//! committing transaction's offset record names the position reached when its
//! commit started, so the held changes are replayed if it is the last to land.

mod committer;
#[cfg(test)]
mod committer_tests;
mod fill;
#[cfg(test)]
mod memory;
mod record;
mod router;
#[cfg(test)]
mod router_tests;
mod schema;
mod signal;
mod snapshot;
mod tracker;
#[cfg(test)]
mod tracker_tests;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::config::{CaptureConfig, ReplicaIdentityCheck};
use crate::envelope::{EnvelopeConfig, SourcePosition, TableEncoder};
use crate::error::CaptureError;
use crate::filter::TableFilter;
use crate::kafka::{TopicCreator, TxProducer};
use crate::metrics::CaptureMetrics;
use crate::naming::{check_length, TopicClaims};
use crate::offset::{read_stored_offset, SourceOffset};
use crate::outbox::OutboxRouter;
use crate::pgoutput::{self, LogicalMessage, Relation, RelationCache, TupleData};
use crate::snapshot::{plan_start, GapRefused, StartFacts, TableProgress};
use crate::source::{self, format_lsn};
use crate::value::TypeRegistry;
use committer::{Committer, KafkaTx, Limits};
use record::Record;
use router::{refusable, Mapping, Resolved, Route, Routes};
use tracker::Tracker;

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
    let mut backoff = oncely_core::backoff::Backoff::new(RESTART_BACKOFF, MAX_RESTART_BACKOFF);
    let mut first_life = true;
    loop {
        let started = Instant::now();
        let result = run_once(&cfg, &metrics, &shutdown, first_life).await;
        first_life = false;
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retriable() && !shutdown.is_cancelled() => {
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
async fn run_once(
    cfg: &CaptureConfig,
    metrics: &CaptureMetrics,
    shutdown: &CancellationToken,
    first_life: bool,
) -> Result<(), CaptureError> {
    let control = source::connect(cfg).await?;
    source::check_wal_level(&control).await?;
    let tables = source::captured_tables(&control, cfg).await?;
    if let Some(outbox) = &cfg.outbox {
        if !tables.iter().any(|t| t.qualified() == outbox.table) {
            return Err(CaptureError::Prerequisite(format!(
                "outbox.table {} is not among the captured tables: create it (with a primary key) and make table.include.list match it",
                outbox.table
            )));
        }
    }
    let topic_claims = claim_topics(cfg, &tables)?;
    let mut published = tables.clone();
    if let Some(signal) = cfg.signal_table() {
        published.push(source::signal_table(&control, signal).await?);
    }
    source::ensure_publication(&control, cfg, &published).await?;
    // The outbox publishes only inserts: its old rows never matter.
    let checked: Vec<&source::CapturedTable> = tables
        .iter()
        .filter(|t| cfg.outbox.as_ref().is_none_or(|o| o.table != t.qualified()))
        .collect();
    // A restart inside this process (after a retriable error) only warns:
    // a table whose identity broke while streaming is refused by the stream
    // check, and must not stop the others.
    let identity_check = if first_life {
        cfg.replica.identity.check
    } else {
        ReplicaIdentityCheck::Warn
    };
    crate::replica_identity::check_tables(&control, &checked, identity_check).await?;
    let slot = source::ensure_slot(&control, cfg).await?;
    let mut types = TypeRegistry::builtin().with_interval_mode(cfg.interval.handling.mode);
    types
        .load_user_types(&control)
        .await
        .map_err(CaptureError::pg("load user types"))?;

    let checked = crate::kafka::check_login(cfg, Duration::from_secs(30), shutdown).await;
    if shutdown.is_cancelled() {
        return Ok(()); // stopped while Kafka was unreachable
    }
    checked?;
    let offsets_topic = cfg.offsets_topic();
    let mut topics = TopicCreator::new(cfg)?;
    topics.ensure_offsets_topic(&offsets_topic).await?;
    // Fences an older instance and aborts its open transaction, so the offset
    // read next is final.
    let producer = TxProducer::connect(cfg).await?;
    let stored = match read_stored_offset(cfg).await? {
        Some((o, found)) if found != offsets_topic => {
            tracing::info!(
                legacy_topic = %found,
                offsets_topic = %offsets_topic,
                commit_lsn = %format_lsn(o.commit_lsn),
                flush_lsn = %format_lsn(o.flush_lsn),
                "resuming from this connector's offset in the offsets topic shared by earlier versions; from now on its offsets go to its own topic"
            );
            Some(o)
        }
        found => found.map(|(o, _)| o),
    };
    // Snapshot candidates: captured tables, less the outbox and signal tables
    // (their rows are events and commands, not state).
    let snapshot_tables: Vec<String> = tables
        .iter()
        .map(|t| t.qualified())
        .filter(|t| cfg.outbox.as_ref().is_none_or(|o| &o.table != t))
        .filter(|t| cfg.signal_table() != Some(t.as_str()))
        .collect();
    let gap = stored
        .as_ref()
        .is_some_and(|o| slot.confirmed_flush_lsn > o.flush_lsn);
    let plan = plan_start(StartFacts {
        mode: cfg.snapshot.mode,
        stored: stored
            .as_ref()
            .map(|o| (o.snapshot.is_some(), o.tables.as_ref())),
        gap,
        first_life,
        new_tables: cfg.snapshot.new.tables,
        captured: &snapshot_tables,
    })
    .map_err(|GapRefused| {
        let o = stored.as_ref().map(|o| o.flush_lsn).unwrap_or_default();
        CaptureError::Gap(format!(
            "replication slot `{slot_name}` is confirmed up to {slot_lsn}, but connector `{name}` committed offsets to Kafka only up to {offset_lsn}: the changes in between were never published, so data may be missing from Kafka. The slot was dropped and recreated, or advanced by another client. To recover: re-snapshot the captured tables (start once with snapshot.mode = \"when_needed\"); or, accepting the gap, delete this connector's offset (a null-valued record with key {key} on topic `{topic}`) and start again",
            slot_name = cfg.slot.name,
            slot_lsn = format_lsn(slot.confirmed_flush_lsn),
            name = cfg.connector_name(),
            offset_lsn = format_lsn(o),
            key = String::from_utf8_lossy(&SourceOffset::key(cfg.connector_name())),
            topic = offsets_topic,
        ))
    })?;
    let mut offset = match stored {
        Some(o) if !plan.restart_from_slot => o,
        Some(o) => {
            tracing::warn!(
                slot_lsn = %format_lsn(slot.confirmed_flush_lsn),
                offset_lsn = %format_lsn(o.flush_lsn),
                mode = ?cfg.snapshot.mode,
                "the stored position is no longer in the slot: streaming from the slot's position and snapshotting every captured table again"
            );
            SourceOffset::start(slot.confirmed_flush_lsn)
        }
        None => SourceOffset::start(slot.confirmed_flush_lsn),
    };
    if let Some((kind, names)) = plan.snapshot {
        let label = match kind {
            crate::snapshot::SnapshotKind::Initial => "initial",
            crate::snapshot::SnapshotKind::Incremental => "new-tables",
        };
        let queued = names.iter().map(|t| TableProgress::new(t, None)).collect();
        let id = format!("{label}-{}", now_ms());
        let added = crate::snapshot::request(&mut offset.snapshot, id, kind, queued);
        tracing::info!(mode = ?cfg.snapshot.mode, tables = ?added, "snapshot requested");
    }
    let mut known = offset.tables.take().unwrap_or_default();
    known.extend(snapshot_tables.iter().cloned());
    offset.tables = Some(known);
    tracing::info!(
        connector = cfg.connector_name(),
        slot = %cfg.slot.name,
        tables = tables.len(),
        resume_commit_lsn = %format_lsn(offset.commit_lsn),
        resume_events = offset.events,
        flush_lsn = %format_lsn(offset.flush_lsn),
        snapshot_table = offset.snapshot.as_ref().and_then(|p| p.current()).map(|t| t.table.as_str()),
        snapshot_rows_done = offset.snapshot.as_ref().and_then(|p| p.current()).map(|t| t.rows),
        "capture starting"
    );

    let schemas = crate::schema_change::read_history(cfg).await?;
    let stream = connect_stream(cfg, offset.flush_lsn).await?;
    metrics.health.connected();
    let mut pipeline = Pipeline {
        cfg,
        tables_by_topic: HashMap::new(),
        topic_claims,
        envelope: EnvelopeConfig {
            topic_prefix: cfg.topic.prefix.clone(),
            topic_mapping: cfg.topic.name.mapping.clone(),
            database: cfg.database.dbname.clone(),
            schemas_enable: cfg.schemas.enable,
        },
        filter: TableFilter::new(&cfg.table.include.list.0, &cfg.table.exclude.list.0)
            .map_err(|e| CaptureError::Prerequisite(format!("table.include.list: {e}")))?,
        key_columns: source::key_columns_by_table(&tables),
        kafka: Committer::new(
            KafkaTx { producer, topics },
            Limits {
                events: cfg.batch.max.events,
                bytes: cfg.batch.max.bytes,
            },
            committer::Topics {
                offsets: offsets_topic.as_str().into(),
                offset_key: SourceOffset::key(cfg.connector_name()),
                schema_changes: crate::schema_change::topic(cfg).into(),
            },
            metrics.clone(),
            offset,
        ),
        types,
        relations: RelationCache::new(),
        encoders: HashMap::new(),
        stream,
        control,
        snap: snapshot::SnapshotRuntime::new(cfg.chunk_size()),
        exit_when_done: plan.exit_when_done,
        tracker: Tracker::default(),
        server_position: 0,
        metrics: metrics.clone(),
        schema_topic: crate::schema_change::topic(cfg).into(),
        schemas,
    };
    // A record the broker refused for its size fails the transaction, and
    // whatever call comes next (a send, the commit) reports only that: name
    // the record, and make it definite.
    let result = pipeline
        .stream(shutdown)
        .await
        .map_err(|e| pipeline.explain_refused(e));
    if result.is_err() {
        // Nothing of an aborted batch is visible; the restart resumes at the
        // last offset record in Kafka.
        pipeline.kafka.abort().await;
    }
    pipeline.stream.stop();
    result
}

async fn connect_stream(cfg: &CaptureConfig, from: u64) -> Result<ReplicationClient, CaptureError> {
    let db = &cfg.database;
    let repl = ReplicationConfig::new(
        db.hostname.clone(),
        db.user.clone(),
        db.password.expose().to_string(),
        db.dbname.clone(),
        cfg.slot.name.clone(),
        cfg.publication.name.clone(),
    )
    .with_port(db.port)
    // `database.sslmode` and its files, as every other connection to the source.
    .with_tls(db.tls().replication(&db.hostname))
    .with_start_lsn(Lsn::from_u64(from))
    // Until we confirm more, report only what Kafka already holds.
    .with_ack_lsn(Lsn::from_u64(from))
    .with_status_interval(Duration::from_millis(
        crate::config::DEFAULT_STATUS_INTERVAL_MS,
    ))
    // Text values render the same on every server: UTC, ISO dates, full float precision.
    .with_options(
        "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3",
    )
    .with_application_name(format!("oncely-{}", cfg.connector_name()));
    let mut client = ReplicationClient::connect(repl).await?;
    client.wait_started().await?;
    Ok(client)
}

struct Pipeline<'a> {
    cfg: &'a CaptureConfig,
    /// The table whose changes a topic carries, to name it in errors.
    tables_by_topic: HashMap<Arc<str>, String>,
    /// Which table owns which topic: a table that appears while capture
    /// runs must not take a topic another table writes to.
    topic_claims: TopicClaims,
    envelope: EnvelopeConfig,
    filter: TableFilter,
    key_columns: HashMap<String, Vec<String>>,
    /// The Kafka transactions, the position they reach and what they confirm.
    kafka: Committer<KafkaTx>,
    types: TypeRegistry,
    relations: RelationCache,
    /// Per relation: how its changes are published, or `None` when not captured.
    encoders: Routes,
    stream: ReplicationClient,
    control: Client,
    /// The snapshot chunk in flight and what reads it.
    snap: snapshot::SnapshotRuntime,
    /// `snapshot.mode = initial_only`: stop once no snapshot runs.
    exit_when_done: bool,
    /// Where the stream stands in the open source transaction.
    tracker: Tracker,
    /// Last server WAL position heard outside a transaction (keepalives).
    server_position: u64,
    metrics: CaptureMetrics,
    /// `<topic.prefix>.schema-changes`.
    schema_topic: Arc<str>,
    /// Per captured table, the columns of its last schema-change record
    /// (read back from the topic at start): what its events use.
    schemas: crate::schema_change::SchemaHistory,
}

impl Pipeline<'_> {
    async fn stream(&mut self, shutdown: &CancellationToken) -> Result<(), CaptureError> {
        let mut heartbeat = tokio::time::interval(self.cfg.heartbeat_interval());
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let batch_max = self.cfg.batch_max_time();
        self.publish_view();
        loop {
            self.launch_chunk().await?;
            if self.exit_when_done && self.snapshot_finished() {
                self.commit_position().await?;
                tracing::info!(flush_lsn = %format_lsn(self.kafka.committed.flush_lsn), "snapshot complete; snapshot.mode = initial_only: exiting");
                return Ok(());
            }
            // While a commit runs no batch is open (reads are held); the next
            // batch's age starts when the commit ends and it opens.
            let deadline = self
                .kafka
                .batch_started()
                .map(|started| started + batch_max);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.commit_position().await?;
                    tracing::info!(flush_lsn = %format_lsn(self.kafka.committed.flush_lsn), "capture stopped cleanly");
                    return Ok(());
                }
                done = self.kafka.commit_done() => self.kafka.on_commit_done(done, &mut self.stream).await?,
                _ = sleep_until(deadline) => self.kafka.start_commit().await?,
                _ = heartbeat.tick() => self.heartbeat().await?,
                read = snapshot::chunk_read(&mut self.snap) => self.on_chunk_read(read).await?,
                event = self.stream.recv() => match event? {
                    Some(event) => self.on_event(event).await?,
                    None => return Err(CaptureError::Replication(pgwire_replication::PgWireError::Task(
                        "replication stream ended".into(),
                    ))),
                },
            }
        }
    }

    async fn on_event(&mut self, event: ReplicationEvent) -> Result<(), CaptureError> {
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                xid,
                commit_time_micros,
            } => {
                self.tracker.begin(
                    &self.kafka.pending,
                    final_lsn.as_u64(),
                    xid,
                    commit_time_micros,
                )?;
                self.snap.note_begin(xid);
            }
            ReplicationEvent::Commit { lsn, end_lsn, .. } => {
                self.on_commit(lsn.as_u64(), end_lsn.as_u64()).await?
            }
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => {
                let msg =
                    pgoutput::decode(data).map_err(|e| CaptureError::Protocol(e.to_string()))?;
                self.on_message(msg, wal_start.as_u64()).await?;
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                let msg = LogicalMessage::Message {
                    transactional,
                    lsn: lsn.as_u64(),
                    prefix,
                    content,
                };
                self.on_message(msg, lsn.as_u64()).await?;
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                tracing::trace!(wal_end = %format_lsn(wal_end.as_u64()), in_tx = self.tracker.in_tx(), "keepalive");
                if !self.tracker.in_tx() {
                    self.server_position = self.server_position.max(wal_end.as_u64());
                }
            }
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    async fn on_commit(&mut self, commit_lsn: u64, end_lsn: u64) -> Result<(), CaptureError> {
        self.tracker
            .commit(&mut self.kafka.pending, commit_lsn, end_lsn)?;
        self.close_if_full().await
    }

    async fn on_message(&mut self, msg: LogicalMessage, lsn: u64) -> Result<(), CaptureError> {
        match msg {
            LogicalMessage::Relation(mut rel) => {
                // Partitions are published through their root; a partition
                // under its own name (WAL decoded before the publication
                // published via the root) is still the root's change.
                if let Some((schema, root)) = source::partition_root(&self.control, rel.id).await? {
                    tracing::debug!(partition = %format!("{}.{}", rel.namespace, rel.name), root = %format!("{schema}.{root}"), "partition's changes go to its root");
                    rel.namespace = schema;
                    rel.name = root;
                }
                self.encoders.remove(&rel.id);
                // A Relation that differs from the cached one follows DDL:
                // compare the catalog now rather than at the next heartbeat.
                let changed = self
                    .relations
                    .get(rel.id)
                    .is_some_and(|old| old.columns != rel.columns);
                self.relations.insert(rel);
                if changed {
                    self.check_schemas().await?;
                }
                Ok(())
            }
            LogicalMessage::Type(t) => {
                if self.types.observe(&t) {
                    // A type created after start-up (an enum, a domain, an
                    // array of them): learn what kind it is from the catalog.
                    self.types
                        .load_user_types(&self.control)
                        .await
                        .map_err(CaptureError::pg("load user types"))?;
                    self.encoders.clear();
                }
                Ok(())
            }
            LogicalMessage::Begin(_)
            | LogicalMessage::Commit(_)
            | LogicalMessage::Origin { .. } => Ok(()),
            LogicalMessage::Message {
                transactional: false,
                lsn: msg_lsn,
                prefix,
                content,
            } => {
                self.non_transactional_message(msg_lsn, &prefix, &content)
                    .await
            }
            change => self.on_change(change, lsn).await,
        }
    }

    /// A change inside a transaction: counted, skipped if already published,
    /// otherwise turned into records of the open batch.
    async fn on_change(&mut self, change: LogicalMessage, lsn: u64) -> Result<(), CaptureError> {
        let position = self.tracker.change(lsn)?;
        // Every change seen while a chunk is in flight counts, replayed or
        // not: dropping a chunk row is always safe, keeping a stale one is not.
        self.mark_chunk_dirty(&change);
        let Some(position) = position else {
            // Its events are in Kafka; their ordinals still count.
            let ordinals = self.ordinals(&change).await?;
            self.tracker.use_ordinals(ordinals);
            return Ok(());
        };
        if let LogicalMessage::Message {
            prefix, content, ..
        } = &change
        {
            if prefix == crate::snapshot::WATERMARK_PREFIX {
                // Never published; the high watermark of the chunk in flight
                // publishes its rows, in this Kafka transaction with the
                // offset that moves the snapshot past them.
                self.on_watermark(content, &position).await?;
                self.tracker.use_ordinals(1);
                self.tracker.advance(&mut self.kafka.pending);
                return self.close_if_full().await;
            }
        }
        let signal = self.signal_row(&change).await?;
        if signal.is_none() {
            let (records, ordinals) = match self.records_for(change, &position).await {
                Ok(built) => built,
                Err(CaptureError::ValueRefused(refused)) => {
                    self.refuse_value(&refused);
                    (Vec::new(), refused.ordinals)
                }
                Err(e) => return Err(e),
            };
            self.tracker.use_ordinals(ordinals);
            self.publish(records).await?;
        } else {
            self.tracker.use_ordinals(1);
        }
        self.tracker.advance(&mut self.kafka.pending);
        if let Some(signal) = signal {
            self.on_signal(signal).await?;
        }
        let ts = position.commit_ts_ms;
        self.metrics.lag.set((now_ms() - ts).max(0) as f64 / 1000.0);
        self.close_if_full().await
    }

    /// `pg_logical_emit_message(false, ..)` stands alone at its own LSN, so it
    /// is positioned like a one-change transaction committed there.
    async fn non_transactional_message(
        &mut self,
        lsn: u64,
        prefix: &str,
        content: &[u8],
    ) -> Result<(), CaptureError> {
        let ts = now_ms();
        let Some(position) = self.tracker.message(&self.kafka.pending, lsn, ts)? else {
            return Ok(());
        };
        let (topic, key, value) =
            crate::envelope::message_record(&self.envelope, false, prefix, content, &position, ts);
        let mut record = Record::change(&topic.as_str().into(), key, value, &position);
        record.ensure_topic = true;
        self.publish(vec![record]).await?;
        Tracker::message_published(&mut self.kafka.pending, &position);
        self.close_if_full().await
    }

    /// A change (or snapshot row) holding a value its field cannot carry is
    /// not published: logged with table, column, value and the fix, and
    /// counted per table. The other changes, of that table too, go on
    /// (stopping would not help: the same WAL decodes the same way).
    pub(super) fn refuse_value(&self, refused: &crate::error::RefusedValue) {
        let counter = &self.metrics.refused_changes;
        counter.with_label_values(&[refused.table.as_str()]).inc();
        tracing::error!(table = %refused.table, metric = crate::metrics::REFUSED_CHANGES_TOTAL, "{}", refused.reason);
    }

    /// How many event ordinals a change uses ([`router::ordinals`]), its
    /// routes resolved first.
    async fn ordinals(&mut self, change: &LogicalMessage) -> Result<u64, CaptureError> {
        if let LogicalMessage::Update { .. } | LogicalMessage::Truncate { .. } = change {
            for &id in router::relations(change) {
                self.route(id).await?;
            }
        }
        router::ordinals(&self.encoders, change)
    }

    /// The Kafka records of one change and the event ordinals they use:
    /// what it needs resolved, then mapped ([`router::records`]).
    async fn records_for(
        &mut self,
        change: LogicalMessage,
        src: &SourcePosition,
    ) -> Result<(Vec<Record>, u64), CaptureError> {
        let now_ms = now_ms();
        let Some(resolved) = self.resolve(&change, src.tx_id).await? else {
            // One ordinal, as `ordinals` counts a change of no table route.
            return Ok((Vec::new(), 1));
        };
        let mapping = Mapping {
            envelope: &self.envelope,
            tombstones: self.cfg.tombstones.on.delete,
            now_ms,
        };
        router::records(&self.encoders, change, src, resolved, &mapping)
    }

    /// The async step before [`router::records`]: the routes of the
    /// change's relations, the unchanged TOAST values of a primary-key
    /// change's new row (read from the source once transaction `xid` is
    /// visible), the partitions of a truncated topic. `None` for a change of
    /// a table whose changes are refused (counted here).
    async fn resolve(
        &mut self,
        change: &LogicalMessage,
        xid: u32,
    ) -> Result<Option<Resolved>, CaptureError> {
        let mut resolved = Resolved::default();
        match change {
            LogicalMessage::Insert { relation_id, .. }
            | LogicalMessage::Update { relation_id, .. }
            | LogicalMessage::Delete { relation_id, .. } => {
                let need = match self.route(*relation_id).await? {
                    Some(Route::Refused(table)) => Err(table.clone()),
                    Some(Route::Table(enc, _)) => Ok(match change {
                        LogicalMessage::Update { old, new, .. } => {
                            router::create_needs_source(enc, old.as_ref(), new)
                        }
                        _ => None,
                    }),
                    _ => Ok(None),
                };
                let need = match need {
                    Ok(need) => need,
                    Err(table) => {
                        let counter = &self.metrics.refused_changes;
                        counter.with_label_values(&[table.as_str()]).inc();
                        return Ok(None);
                    }
                };
                if let Some((key_columns, row)) = need {
                    let filled = self
                        .read_unavailable(*relation_id, &key_columns, row, xid)
                        .await?;
                    resolved.created = Some(filled);
                }
            }
            LogicalMessage::Truncate { relation_ids, .. } => {
                for &id in relation_ids {
                    let Some(Route::Table(_, topic)) = self.route(id).await? else {
                        continue;
                    };
                    let topic = Arc::clone(topic);
                    let count = self.kafka.tx.producer.partition_count(&topic).await?;
                    resolved.partitions.insert(id, count);
                }
            }
            _ => {}
        }
        Ok(Some(resolved))
    }

    /// `row` with its unchanged TOAST values read from the source table by
    /// its key (`key_columns`), once transaction `xid` is visible; `row` as it
    /// is when no row has that key any more (a later change deleted it or
    /// changed its key again, and its own events bring the targets there).
    async fn read_unavailable(
        &mut self,
        relation_id: u32,
        key_columns: &[String],
        row: TupleData,
        xid: u32,
    ) -> Result<TupleData, CaptureError> {
        let rel = self.relations.get(relation_id).cloned().ok_or_else(|| {
            CaptureError::Protocol(format!(
                "change for relation {relation_id} before its Relation message"
            ))
        })?;
        let key_idx = key_columns
            .iter()
            .map(|k| rel.columns.iter().position(|c| &c.name == k))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "key columns {key_columns:?} are not all columns of {}.{}",
                    rel.namespace, rel.name
                ))
            })?;
        match fill::read_unavailable(&mut self.control, &rel, &key_idx, xid, &row).await? {
            Some(filled) => Ok(filled),
            None => {
                tracing::debug!(table = %format!("{}.{}", rel.namespace, rel.name), "row of a primary-key update is gone from the source; its unchanged TOAST values stay unavailable");
                Ok(row)
            }
        }
    }

    /// How a relation's changes are published, decided on first use after each Relation message.
    async fn route(&mut self, relation_id: u32) -> Result<Option<&Route>, CaptureError> {
        if !self.encoders.contains_key(&relation_id) {
            let rel = self.relations.get(relation_id).cloned().ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "change for relation {relation_id} before its Relation message"
                ))
            })?;
            let built = self.build_route(rel).await?;
            self.encoders.insert(relation_id, built);
        }
        Ok(self.encoders.get(&relation_id).and_then(Option::as_ref))
    }

    async fn build_route(&mut self, rel: Arc<Relation>) -> Result<Option<Route>, CaptureError> {
        let qualified = format!("{}.{}", rel.namespace, rel.name);
        if self.cfg.signal_table() == Some(qualified.as_str()) {
            return Ok(Some(Route::Signal(rel)));
        }
        if !self.filter.matches(&rel.namespace, &rel.name) {
            return Ok(None);
        }
        if let Some(outbox) = self.cfg.outbox.as_ref().filter(|o| o.table == qualified) {
            let router = OutboxRouter::new(&rel, outbox)
                .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
            return Ok(Some(Route::Outbox(router, rel)));
        }
        if !self.key_columns.contains_key(&qualified) {
            // A table created after start-up: key it by its primary key.
            let pk = source::primary_key(&self.control, &rel.namespace, &rel.name).await?;
            if !pk.is_empty() {
                self.key_columns.insert(qualified.clone(), pk);
            }
        }
        let key = self.key_columns.get(&qualified).map(Vec::as_slice);
        let identity_columns = crate::replica_identity::flagged_columns(&rel);
        if let Some(lacks) = crate::replica_identity::lacks(
            rel.replica_identity,
            &identity_columns,
            key.unwrap_or_default(),
        ) {
            let why = crate::replica_identity::explain(
                &qualified,
                &qualified,
                &lacks,
                key.unwrap_or_default(),
            );
            match self.cfg.replica.identity.check {
                ReplicaIdentityCheck::Fail => {
                    tracing::error!(table = %qualified, metric = crate::metrics::REFUSED_CHANGES_TOTAL, "{why}. Until it is fixed, changes of {qualified} are not published (the other tables go on); after the fix, snapshot it again (oncely capture snapshot --table {qualified}) to bring the targets up to date. Or set replica.identity.check = \"warn\" to publish as the identity allows");
                    return Ok(Some(Route::Refused(qualified)));
                }
                ReplicaIdentityCheck::Warn => {
                    tracing::warn!(table = %qualified, "{why} (replica.identity.check = \"warn\": publishing anyway)");
                }
            }
        }
        let identity = self.source_identity(&qualified, &rel).await?;
        let enc =
            TableEncoder::identified(&rel, &self.types, key, &self.envelope, identity.as_ref())
                .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        let topic: Arc<str> = enc.topic().into();
        // A table created (or renamed) while capture runs: its topic must
        // not be another table's. Stopping loses nothing: after the fix, a
        // restart streams its changes from the committed offset.
        check_length(&topic, &qualified).map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        self.topic_claims
            .claim_table(&topic, &rel.namespace, &rel.name)
            .map_err(|e| {
                CaptureError::Prerequisite(format!(
                    "{e} (table {qualified} appeared while capture ran; capture stops so that nothing of it is lost: fix the configuration and start again)"
                ))
            })?;
        self.kafka.tx.topics.ensure(&topic).await?;
        self.tables_by_topic
            .insert(Arc::clone(&topic), qualified.clone());
        // Captured from now on: a later start must not take it for a table
        // added to the include list (snapshot.new.tables).
        self.kafka
            .pending
            .tables
            .get_or_insert_with(BTreeSet::new)
            .insert(qualified);
        Ok(Some(Route::Table(enc, topic)))
    }

    /// A failed send or commit, named when the producer or the broker
    /// refused one of its records for its size.
    fn explain_refused(&mut self, e: CaptureError) -> CaptureError {
        if let Some(r) = self.kafka.tx.producer.take_too_large() {
            return self.too_large(
                &r.topic,
                r.key.as_deref(),
                r.size,
                format!("the broker refused it, so the topic's max.message.bytes is lower; the commit failed with: {e}"),
                true,
            );
        }
        match (&e, self.kafka.take_failed_send()) {
            (CaptureError::Kafka { source, .. }, Some(r)) if crate::error::is_too_large(source) => {
                let limit = self.kafka.tx.producer.max_message_bytes();
                self.too_large(
                    &r.topic,
                    r.key.as_deref(),
                    r.size,
                    format!("the producer's message.max.bytes is {limit}"),
                    false,
                )
            }
            _ => e,
        }
    }

    fn too_large(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        size: usize,
        limit: String,
        by_broker: bool,
    ) -> CaptureError {
        let table = self
            .tables_by_topic
            .get(topic)
            .cloned()
            .or_else(|| {
                self.cfg
                    .outbox
                    .as_ref()
                    .map(|o| format!("{} (outbox)", o.table))
            })
            .unwrap_or_else(|| "(logical decoding message)".to_owned());
        // The key's payload, without its Connect schema.
        let mut key = match key.map(serde_json::from_slice::<serde_json::Value>) {
            None => "null".to_owned(),
            Some(Ok(mut v)) => match v.get_mut("payload") {
                Some(payload) => payload.take().to_string(),
                None => v.to_string(),
            },
            Some(Err(_)) => String::from_utf8_lossy(key.unwrap_or_default()).into_owned(),
        };
        if key.len() > 200 {
            let mut end = 200;
            while !key.is_char_boundary(end) {
                end -= 1;
            }
            key.truncate(end);
            key.push_str("...");
        }
        let configured = self.cfg.max_message_bytes();
        let wanted = size.next_power_of_two().max(configured);
        let topic_setting = format!(
            "the max.message.bytes of topic {topic} (kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config max.message.bytes={wanted})"
        );
        let setting = if by_broker && size <= configured {
            topic_setting
        } else {
            format!(
                "topic.creation.default.max.message.bytes (now {configured}; the producer's message.max.bytes follows it unless [kafka.producer] sets it) to at least {size}, and {topic_setting} if the topic exists already"
            )
        };
        CaptureError::RecordTooLarge(Box::new(crate::error::TooLargeRecord {
            table,
            topic: topic.to_owned(),
            key,
            size,
            limit,
            setting,
        }))
    }

    async fn publish(&mut self, records: Vec<Record>) -> Result<(), CaptureError> {
        self.kafka.publish(records).await
    }

    async fn close_if_full(&mut self) -> Result<(), CaptureError> {
        self.kafka.close_if_full(&mut self.stream).await
    }

    async fn commit_position(&mut self) -> Result<(), CaptureError> {
        self.kafka.commit_position(&mut self.stream).await
    }

    /// `slot.max.retained.bytes`: beyond it an error (at most one a minute),
    /// the metric `oncely_capture_slot_over_limit` and `/readyz` say so.
    fn check_slot_limit(&self, retained: i64) {
        static OVER: oncely_core::log_limit::LogLimit =
            oncely_core::log_limit::LogLimit::new(Duration::from_secs(60), 1);
        let Some(limit) = self.cfg.slot.max.retained.bytes else {
            return;
        };
        self.metrics
            .slot_max_retained
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        let over = u64::try_from(retained).is_ok_and(|r| r > limit);
        self.metrics.slot_over_limit.set(i64::from(over));
        if !over {
            self.metrics.health.slot_over(None);
            return;
        }
        let why = format!(
            "replication slot {} retains {retained} bytes of WAL, more than slot.max.retained.bytes = {limit}: capture confirms only what Kafka holds, so a slow or failing Kafka commit, or a long source transaction, keeps WAL on the server (see README, Operating: slot lag)",
            self.cfg.slot.name
        );
        if let Some(suppressed) = OVER.admit() {
            tracing::error!(suppressed, "{why}");
        }
        self.metrics.health.slot_over(Some(why));
    }

    /// When nothing is in flight, commits an offset at the server's position so
    /// an idle slot does not pin WAL.
    async fn heartbeat(&mut self) -> Result<(), CaptureError> {
        if let Some(query) = &self.cfg.heartbeat.action.query {
            if let Err(e) = self.control.batch_execute(query).await {
                tracing::warn!(error = %e, "heartbeat.action.query failed");
            }
        }
        self.check_schemas().await?;
        match source::slot_retained_wal(&self.control, &self.cfg.slot.name).await {
            Ok(Some(bytes)) => {
                self.metrics.slot_retained_wal.set(bytes);
                self.check_slot_limit(bytes);
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read slot lag"),
        }
        if self.tracker.in_tx() || self.kafka.busy() {
            return Ok(());
        }
        if self.server_position > self.kafka.pending.flush_lsn {
            self.kafka.pending.flush_lsn = self.server_position;
        }
        if self.kafka.pending != self.kafka.committed {
            self.commit_position().await?;
            self.metrics.heartbeats.inc();
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The topics of the captured tables, each claimed by one table: start-up
/// stops when two tables (or a table and capture's own offsets or message
/// topic) would share one, or a name is longer than Kafka allows.
fn claim_topics(
    cfg: &CaptureConfig,
    tables: &[source::CapturedTable],
) -> Result<TopicClaims, CaptureError> {
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
            &crate::naming::sanitize_topic(&format!("{}.message", cfg.topic.prefix)),
            "logical decoding messages",
        )
        .map_err(|e| refuse(&e))?;
    for t in tables {
        // The outbox's rows go to its event topics, not to a table topic.
        if cfg
            .outbox
            .as_ref()
            .is_some_and(|o| o.table == t.qualified())
        {
            continue;
        }
        let topic = cfg.table_topic(&t.schema, &t.name);
        check_length(&topic, &t.qualified()).map_err(|e| refuse(&e))?;
        claims
            .claim_table(&topic, &t.schema, &t.name)
            .map_err(|e| refuse(&e))?;
    }
    Ok(claims)
}
