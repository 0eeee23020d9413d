//! The capture pipeline: replication stream -> change events -> Kafka
//! transactions that each end with the offset record covering them.
//!
//! ```text
//!  S::next_event() -------Begin/Commit--> tracker (position, replay skip)
//!       |  change                              |
//!       v                                      v
//!  router (relation -> route, encoder) ----records----> committer
//!       |  signal row, watermark, change        ^         | commit (background)
//!       v                                       |         | then source confirm
//!  snapshot driver: chunk reads, window,  --records-----+
//!    signals, quarantine (on the committer's staged position)
//!  heartbeat tick: schema watch, quarantine check, offset --^
//! ```
//!
//! The pipeline is generic over its source `S` ([`crate::seam::Source`]),
//! whose stream yields the core's events ([`crate::change::StreamEvent`]).
//! One task owns the stream, the producer and the position, so the order of
//! events, offset records and slot confirmations is the order of the code:
//! a position is confirmed to the source only after the Kafka transaction
//! holding its offset record committed.
//!
//! A Kafka transaction commits in the background while the stream is read on:
//! changes read meanwhile are encoded and held, and open the next transaction
//! once the commit succeeded (a producer has one transaction at a time). The
//! committing transaction's offset record names the position reached when its
//! commit started, so the held changes are replayed if it is the last to land.

mod committer;
mod fixes;
#[cfg(test)]
mod memory;
mod quarantine;
mod record;
mod resolve;
mod router;
#[cfg(test)]
mod router_tests;
mod schema;
#[cfg(test)]
mod schema_tests;
mod signal;
mod snapshot;
mod snapshot_runtime;
#[cfg(test)]
mod snapshot_tests;
mod start;
mod tracker;
#[cfg(test)]
mod tracker_tests;

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::change::{Change, StreamEvent};
use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::metrics::CaptureMetrics;
use crate::seam::{Retained, RoutedTable, Source, SourceEvent};
use committer::{Committer, KafkaTx};
use oncely_core::wire::format_lsn;
use record::Record;
use router::{refusable, Route, Router};
use snapshot_runtime::SnapshotDriver;
use tracker::Tracker;

pub use start::run;

/// How long a failed Kafka call waits for the delivery report that may say
/// a record was refused for its size (it normally runs within milliseconds).
const REFUSAL_REPORT_WAIT: Duration = Duration::from_secs(2);

/// The capture pipeline of one life: the stream loop (`Pipeline::stream`)
/// hands each event to the component that owns what it changes. `S` is
/// the source it reads ([`Source`]).
struct Pipeline<'a, S: Source> {
    cfg: &'a CaptureConfig,
    metrics: CaptureMetrics,
    /// Which relation publishes where and how.
    router: Router<S::Table>,
    /// The Kafka transactions, the position they reach and what they confirm.
    kafka: Committer<KafkaTx>,
    /// The replication stream and what is known of the source.
    source: SourceSide<S>,
    /// The snapshot chunks in flight and the quarantine's fixes seen.
    snapshot: SnapshotDriver<S::Table>,
}

/// What source `S` announces of its value types.
type TypeNote<S> = <<S as Source>::Table as RoutedTable>::TypeNote;

/// The source side of the pipeline: the stream, where it stands, the
/// control connection for catalog reads, the chunk reads and the schema
/// watch (what the source's tables looked like last).
struct SourceSide<S: Source> {
    stream: S::Stream,
    control: S::Control,
    /// Where the stream stands in the open source transaction.
    tracker: Tracker,
    /// Last server WAL position heard outside a transaction (keepalives).
    server_position: u64,
    /// The snapshot's chunk reads, on their own connection.
    chunks: S::Chunks,
    /// The schema-change topic and what it holds.
    schema: schema::SchemaWatch,
}

impl<S: Source> SourceSide<S> {
    /// What the router asks of the source's catalog, as of the streamed
    /// transaction (none outside one).
    fn tables(&self) -> S::Tables<'_> {
        S::tables(&self.control, self.schema.history(), self.tracker.xid())
    }
}

impl<S: Source> Pipeline<'_, S> {
    async fn stream(&mut self, shutdown: &CancellationToken) -> Result<(), CaptureError> {
        let mut heartbeat = tokio::time::interval(self.cfg.heartbeat_interval());
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let batch_max = self.cfg.batch_max_time();
        self.snapshot.publish_view(self.kafka.position());
        loop {
            let router = &self.router;
            let key_columns = |t: &str| router.key_columns(t).cloned();
            self.snapshot
                .launch(&mut self.kafka, key_columns, &mut self.source.chunks)
                .await?;
            let finished =
                self.snapshot.finished(self.kafka.position()) && !self.source.tracker.in_tx();
            if self.snapshot.exit_when_done && finished {
                self.commit_position().await?;
                tracing::info!(flush_lsn = %format_lsn(self.kafka.committed().flush_lsn), "snapshot complete; snapshot.mode = initial_only: exiting");
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
                    tracing::info!(flush_lsn = %format_lsn(self.kafka.committed().flush_lsn), "capture stopped cleanly");
                    return Ok(());
                }
                done = self.kafka.commit_done() => self.kafka.on_commit_done(done, &mut self.source.stream).await?,
                _ = sleep_until(deadline) => self.kafka.start_commit(&self.source.stream).await?,
                _ = heartbeat.tick() => self.heartbeat().await?,
                read = snapshot_runtime::chunk_read(&mut self.snapshot) => self.snapshot.on_chunk_read(&mut self.kafka, read)?,
                event = S::next_event(&mut self.source.stream) => self.on_event(event?).await?,
            }
        }
    }

    async fn on_event(&mut self, event: SourceEvent<S>) -> Result<(), CaptureError> {
        match event {
            StreamEvent::Begin {
                commit,
                xid,
                commit_ts_us,
            } => {
                let position = self.kafka.position();
                self.source
                    .tracker
                    .begin(position, commit, xid, commit_ts_us)?;
                self.snapshot.note_begin(xid);
            }
            StreamEvent::Commit { commit, end } => self.on_commit(commit, end).await?,
            StreamEvent::Change { at, change } => self.on_change(change, at).await?,
            StreamEvent::Table(rel) => self.on_relation(rel).await?,
            StreamEvent::Type(t) => self.on_type(t).await?,
            StreamEvent::Message {
                at,
                prefix,
                content,
            } if prefix == crate::snapshot::WATERMARK_PREFIX => {
                self.standalone_watermark(at, &content).await?
            }
            StreamEvent::Message {
                at,
                prefix,
                content,
            } => {
                self.non_transactional_message(at, &prefix, &content)
                    .await?
            }
            StreamEvent::KeepAlive { position } => {
                let source = &mut self.source;
                tracing::trace!(wal_end = %format_lsn(position), in_tx = source.tracker.in_tx(), "keepalive");
                if !source.tracker.in_tx() {
                    source.server_position = source.server_position.max(position);
                }
            }
            StreamEvent::Nothing => {}
        }
        Ok(())
    }

    async fn on_commit(&mut self, commit_lsn: u64, end_lsn: u64) -> Result<(), CaptureError> {
        self.source
            .tracker
            .commit(self.kafka.stage(), commit_lsn, end_lsn)?;
        self.close_if_full().await
    }

    /// A change inside a transaction: counted, skipped if already published,
    /// otherwise turned into records of the open batch.
    async fn on_change(&mut self, change: Change, lsn: u64) -> Result<(), CaptureError> {
        let position = self.source.tracker.change(lsn)?;
        // Every change seen while a chunk is in flight counts, replayed or
        // not: dropping a chunk row is always safe, keeping a stale one is not.
        let router = &self.router;
        if let Some(rows) = change.row_change() {
            self.snapshot
                .mark_dirty(rows, |id| router.relation(id).map(|r| &**r));
        }
        let Some(position) = position else {
            // Its events are in Kafka; their ordinals still count.
            let ordinals = self.ordinals(&change).await?;
            self.source.tracker.use_ordinals(ordinals);
            return Ok(());
        };
        if let Change::Message { prefix, content } = &change {
            if prefix == crate::snapshot::WATERMARK_PREFIX {
                // Never published; the high watermark of the chunk in flight
                // publishes its rows, in this Kafka transaction with the
                // offset that moves the snapshot past them.
                self.on_watermark(content, &position).await?;
                self.source.tracker.use_ordinals(1);
                self.source.tracker.advance(self.kafka.stage());
                return self.close_if_full().await;
            }
        }
        let signal = match &change {
            Change::Insert { table, new } => self.signal_row(*table, new).await?,
            _ => None,
        };
        if signal.is_none() {
            let (records, ordinals) = match self.records_for(change, &position).await {
                Ok(built) => built,
                Err(CaptureError::ValueRefused(refused)) => {
                    self.refuse_value(&refused);
                    (Vec::new(), refused.ordinals)
                }
                Err(e) => return Err(e),
            };
            self.source.tracker.use_ordinals(ordinals);
            self.note_dead_letters(&records);
            self.publish(records).await?;
        } else {
            self.source.tracker.use_ordinals(1);
        }
        self.source.tracker.advance(self.kafka.stage());
        if let Some(signal) = signal {
            self.on_signal(signal).await?;
        }
        let ts = position.commit_ts_ms;
        self.metrics.lag.set((now_ms() - ts).max(0) as f64 / 1000.0);
        self.close_if_full().await
    }

    /// A watermark outside any transaction (MySQL's, which the stream hands
    /// out at the binlog position of the chunk's read view): never
    /// published, and it moves no position, since no transaction starts at
    /// its order key `at` and nothing of the source is replayed for it
    /// after a restart. The high watermark of the chunk in flight publishes
    /// its rows at `at`, with the offset record that moves the snapshot
    /// past them.
    async fn standalone_watermark(&mut self, at: u64, content: &[u8]) -> Result<(), CaptureError> {
        if self.source.tracker.in_tx() {
            return Err(CaptureError::Protocol(
                "a snapshot watermark inside a transaction".into(),
            ));
        }
        let position = crate::envelope::SourcePosition {
            tx_id: 0,
            lsn: at,
            commit_lsn: at,
            event_seq: 1,
            commit_ts_ms: now_ms(),
            snapshot: crate::envelope::SnapshotMarker::False,
        };
        self.on_watermark(content, &position).await?;
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
        let Some(position) = self
            .source
            .tracker
            .message(self.kafka.position(), lsn, ts)?
        else {
            return Ok(());
        };
        let (topic, key, value) = crate::envelope::message_record(
            self.router.envelope(),
            false,
            prefix,
            content,
            &position,
            ts,
        );
        let mut record = Record::change(&topic.as_str().into(), key, value, &position, None);
        record.ensure_topic = true;
        self.publish(vec![record]).await?;
        Tracker::message_published(self.kafka.stage(), &position);
        self.close_if_full().await
    }

    /// A change (or snapshot row) holding a value its field cannot carry is
    /// not published: logged with table, column, value and the fix, and
    /// counted per table. The other changes, of that table too, go on
    /// (stopping would not help: the same WAL decodes the same way).
    pub(super) fn refuse_value(&self, refused: &crate::error::RefusedValue) {
        refuse_value(&self.metrics, refused);
    }

    /// Outbox rows that could not be routed go to the outbox dead-letter
    /// topic: logged (table, topic and reason; never the row's values) and
    /// counted per table. Capture goes on: the same WAL would fail the same
    /// way after a restart.
    fn note_dead_letters(&self, records: &[Record]) {
        for r in records {
            if let Some((table, reason)) = &r.dead_letter {
                let counter = &self.metrics.outbox_dead_letters;
                counter.with_label_values(&[table.as_str()]).inc();
                tracing::error!(table = %table, topic = %r.topic, metric = crate::metrics::OUTBOX_DEAD_LETTERS_TOTAL, "{reason}; the row goes to the outbox dead-letter topic, whose headers name the fix");
            }
        }
    }

    /// A failed send or commit, named when the producer or the broker
    /// refused one of its records for its size.
    async fn explain_refused(&mut self, e: CaptureError) -> CaptureError {
        // A Kafka call failing may be the refusal's first sign, its report
        // still due; for other errors only a report already in counts.
        let wait = match e {
            CaptureError::Kafka { .. } => REFUSAL_REPORT_WAIT,
            _ => Duration::ZERO,
        };
        if let Some(r) = self.kafka.take_too_large(wait).await {
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
                let limit = self.kafka.max_message_bytes();
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
            .router
            .table_of_topic(topic)
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
        self.kafka.close_if_full(&mut self.source.stream).await
    }

    async fn commit_position(&mut self) -> Result<(), CaptureError> {
        self.kafka.commit_position(&mut self.source.stream).await
    }

    /// `slot.max.retained.bytes`: beyond it an error (at most one a minute),
    /// the metric `oncely_capture_slot_over_limit` and `/readyz` say so.
    fn check_slot_limit(&self, retained: i64) {
        static OVER: oncely_core::log_limit::LogLimit =
            oncely_core::log_limit::LogLimit::new(Duration::from_secs(60), 1);
        let Some(limit) = self.cfg.slot_max_retained_bytes else {
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
            "replication slot {} retains {retained} bytes of WAL, more than slot.max.retained.bytes = {limit}: capture confirms only what Kafka holds, so a slow or failing Kafka commit, or a long source transaction, keeps WAL on the server (see docs/operating.md, Slot lag)",
            self.cfg.slot_name
        );
        if let Some(suppressed) = OVER.admit() {
            tracing::error!(suppressed, "{why}");
        }
        self.metrics.health.slot_over(Some(why));
    }

    /// When nothing is in flight, commits an offset at the server's position so
    /// an idle slot does not pin WAL.
    async fn heartbeat(&mut self) -> Result<(), CaptureError> {
        let retained = S::heartbeat(&mut self.source.control, &self.source.stream, self.cfg).await;
        self.check_schemas().await?;
        self.check_quarantine().await?;
        match retained {
            Some(Retained::SlotWal(bytes)) => {
                self.metrics.slot_retained_wal.set(bytes);
                self.check_slot_limit(bytes);
            }
            Some(Retained::Binlog(bytes)) => self.metrics.binlog_retained.set(bytes),
            None => {}
        }
        if self.source.tracker.in_tx() || self.kafka.busy() {
            return Ok(());
        }
        if self.source.server_position > self.kafka.position().flush_lsn {
            self.kafka.stage().flush_lsn = self.source.server_position;
        }
        if self.kafka.position() != self.kafka.committed() {
            self.commit_position().await?;
            self.metrics.heartbeats.inc();
        }
        Ok(())
    }
}

/// A change (or snapshot row) holding a value its field cannot carry is
/// not published: logged with table, column, value and the fix, and
/// counted per table.
fn refuse_value(metrics: &CaptureMetrics, refused: &crate::error::RefusedValue) {
    let counter = &metrics.refused_changes;
    counter.with_label_values(&[refused.table.as_str()]).inc();
    tracing::error!(table = %refused.table, metric = crate::metrics::REFUSED_CHANGES_TOTAL, "{}", refused.reason);
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
