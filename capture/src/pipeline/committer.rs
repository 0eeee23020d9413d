//! The Kafka side of the pipeline: batches of records in Kafka transactions,
//! each ending with the offset record of the position it reaches, one commit
//! at a time in the background, and the slot confirmed only after a commit.
//!
//! The order this keeps is the exactly-once guarantee: a position is
//! confirmed to the slot only once the Kafka transaction holding its offset
//! record committed; a failed commit confirms nothing, and the restart
//! replays from the last committed offset record.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::record::Record;
use crate::error::CaptureError;
use crate::kafka::{TopicCreator, TxProducer};
use crate::metrics::CaptureMetrics;
use crate::offset::SourceOffset;

/// Most bytes of records held while a transaction commits: beyond it reading
/// waits for the commit. The committing batch still sits in the producer's
/// queue until acknowledged, so this adds to it; kept small to bound memory.
const HOLD_MAX_BYTES: usize = 4 * 1024 * 1024;

// The tests read the private positions; the in-memory Kafka they use is the
// pipeline's.
#[cfg(test)]
use super::memory;
#[cfg(test)]
#[path = "committer_tests.rs"]
mod tests;

/// A transactional producer, as the committer uses it.
///
/// Contract: at most one transaction is open. `prepare` turns records into
/// the bytes they are sent as (outside any transaction, and before they are
/// held or counted against a batch's limits), `begin` opens a transaction,
/// `send` adds records to it (in order per partition), `commit` closes it to sends at
/// once and returns the commit itself, which the committer runs in the
/// background and awaits before the next `begin`. A transaction whose commit
/// failed or that `abort` ended is never visible to `read_committed`
/// readers. Calls are not concurrent: the committer is their one caller.
pub(super) trait Transactions: Send + 'static {
    /// Converts `records` in place to what is sent (Avro, registering its
    /// schemas first); records sent as they are stay untouched.
    async fn prepare(&mut self, _records: &mut [Record]) -> Result<(), CaptureError> {
        Ok(())
    }
    fn begin(&mut self) -> Result<(), CaptureError>;
    /// Adds `record` to the open transaction; creates its topic first when
    /// the record asks for it.
    async fn send(&mut self, record: &Record) -> Result<(), CaptureError>;
    fn commit(&mut self) -> impl Future<Output = Result<(), CaptureError>> + Send + 'static;
    async fn abort(&mut self) -> Result<(), CaptureError>;
}

/// Where the committer confirms positions: the source (the replication slot).
pub(super) use crate::seam::Slot;

/// The rdkafka producer and the topic creator its records may need.
pub(super) struct KafkaTx {
    pub(super) producer: TxProducer,
    pub(super) topics: TopicCreator,
    /// `key.converter` / `value.converter = "avro"`: converts each record
    /// as it is published (registering its schema first).
    pub(super) avro: Option<crate::avro::AvroWriter>,
}

impl Transactions for KafkaTx {
    async fn prepare(&mut self, records: &mut [Record]) -> Result<(), CaptureError> {
        let Some(avro) = &self.avro else {
            return Ok(());
        };
        for r in records {
            let (key, value) = avro
                .convert_apart(&r.topic, r.key.as_deref(), r.value.as_deref(), &r.heads)
                .await?;
            if key.is_some() {
                r.key = key;
                r.heads.key = None;
            }
            if value.is_some() {
                r.value = value;
                r.heads.value = None;
            }
        }
        Ok(())
    }

    fn begin(&mut self) -> Result<(), CaptureError> {
        self.producer.begin()
    }

    async fn send(&mut self, r: &Record) -> Result<(), CaptureError> {
        if r.ensure_topic {
            self.topics.ensure(&r.topic).await?;
        }
        let headers: Vec<(&str, &[u8])> =
            r.headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let headers = (!headers.is_empty()).then_some(headers.as_slice());
        self.producer
            .send_with_headers(
                &r.topic,
                r.partition,
                r.key.as_deref(),
                r.value.as_deref(),
                headers,
            )
            .await
    }

    fn commit(&mut self) -> impl Future<Output = Result<(), CaptureError>> + Send + 'static {
        let producer = self.producer.clone();
        async move { producer.commit().await }
    }

    async fn abort(&mut self) -> Result<(), CaptureError> {
        self.producer.abort().await
    }
}

/// When a batch is full.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    /// `batch.max.events`.
    pub(super) events: usize,
    /// `batch.max.bytes`.
    pub(super) bytes: usize,
}

/// Where offset records go and which records are not counted as events.
pub(super) struct Topics {
    /// [`crate::config::CaptureConfig::offsets_topic`].
    pub(super) offsets: Arc<str>,
    /// [`SourceOffset::key`] of this connector.
    pub(super) offset_key: Vec<u8>,
    /// Schema-change records are counted by `schema_changes`, not as events.
    pub(super) schema_changes: Arc<str>,
}

/// What the pipeline asks of Kafka besides transactions, through the
/// committer that owns the producer.
impl Committer<KafkaTx> {
    /// The record the broker refused as too large, once, waiting at most
    /// `wait` for delivery reports still due (see
    /// [`crate::kafka::TxProducer::await_too_large`]).
    pub(super) async fn take_too_large(
        &self,
        wait: std::time::Duration,
    ) -> Option<crate::kafka::RefusedRecord> {
        self.tx.producer.await_too_large(wait).await
    }

    /// The producer's `message.max.bytes`.
    pub(super) fn max_message_bytes(&self) -> usize {
        self.tx.producer.max_message_bytes()
    }

    pub(super) async fn partition_count(&self, topic: &str) -> Result<i32, CaptureError> {
        self.tx.producer.partition_count(topic).await
    }

    /// Creates `topic` when it does not exist yet.
    pub(super) async fn ensure_topic(&mut self, topic: &str) -> Result<(), CaptureError> {
        self.tx.topics.ensure(topic).await
    }

    /// Creates the compacted `topic` when it does not exist yet.
    pub(super) async fn ensure_compacted_topic(&mut self, topic: &str) -> Result<(), CaptureError> {
        self.tx.topics.ensure_compacted(topic).await
    }
}

/// A Kafka transaction committing in the background.
struct Inflight {
    task: tokio::task::JoinHandle<Result<(), CaptureError>>,
    /// The position its offset record holds.
    offset: SourceOffset,
    started: Instant,
}

/// Records read while a transaction commits, for the next one.
#[derive(Default)]
struct Held {
    records: Vec<Record>,
    bytes: usize,
}

/// The Kafka transaction being filled.
struct OpenBatch {
    started: Instant,
    records: usize,
    bytes: usize,
}

/// A record the producer refused to send, for the error that names it.
pub(super) struct FailedSend {
    pub(super) topic: Arc<str>,
    pub(super) key: Option<Vec<u8>>,
    /// Key, value and headers.
    pub(super) size: usize,
}

/// The outcome of a background commit.
pub(super) type CommitOutcome = Result<Result<(), CaptureError>, tokio::task::JoinError>;

/// Owns the Kafka transaction and both positions: the rest of the pipeline
/// reads them ([`Committer::position`], [`Committer::committed`]) and stages
/// what the next offset record carries ([`Committer::stage`]), but only a
/// finished commit moves `committed`, and only then is the source confirmed.
pub(super) struct Committer<T: Transactions> {
    /// The producer, also for what the pipeline asks of Kafka besides transactions.
    tx: T,
    limits: Limits,
    topics: Topics,
    metrics: CaptureMetrics,
    /// The position in the last committed offset record.
    committed: SourceOffset,
    /// The position the open batch (or the stream, when nothing is open) has reached.
    pending: SourceOffset,
    batch: Option<OpenBatch>,
    /// The previous batch, committing in the background.
    inflight: Option<Inflight>,
    /// Records waiting for `inflight` to finish.
    held: Held,
    failed_send: Option<FailedSend>,
}

impl<T: Transactions> Committer<T> {
    /// A committer resuming at `offset`, which Kafka holds.
    pub(super) fn new(
        tx: T,
        limits: Limits,
        topics: Topics,
        metrics: CaptureMetrics,
        offset: SourceOffset,
    ) -> Self {
        Committer {
            tx,
            limits,
            topics,
            metrics,
            committed: offset.clone(),
            pending: offset,
            batch: None,
            inflight: None,
            held: Held::default(),
            failed_send: None,
        }
    }

    /// The position in the last committed offset record: what Kafka holds
    /// and the source was confirmed up to.
    pub(super) fn committed(&self) -> &SourceOffset {
        &self.committed
    }

    /// The position the next offset record names: what the open batch (or
    /// the stream, when nothing is open) has reached.
    pub(super) fn position(&self) -> &SourceOffset {
        &self.pending
    }

    /// The position the next offset record names, to change: a change is
    /// staged, written with the next commit and durable once it committed.
    pub(super) fn stage(&mut self) -> &mut SourceOffset {
        &mut self.pending
    }

    /// The transactions, for tests that script their outcomes.
    #[cfg(test)]
    pub(super) fn transactions(&mut self) -> &mut T {
        &mut self.tx
    }

    /// When the open batch's age counts from: `None` while a commit runs (no
    /// batch is open then, reads are held; the next one's age starts when it
    /// opens) or nothing is open.
    pub(super) fn batch_started(&self) -> Option<Instant> {
        match &self.inflight {
            None => self.batch.as_ref().map(|b| b.started),
            Some(_) => None,
        }
    }

    /// Whether a commit runs in the background.
    pub(super) fn committing(&self) -> bool {
        self.inflight.is_some()
    }

    /// Whether a batch is open or committing.
    pub(super) fn busy(&self) -> bool {
        self.batch.is_some() || self.inflight.is_some()
    }

    /// The record the producer last refused to send, once.
    pub(super) fn take_failed_send(&mut self) -> Option<FailedSend> {
        self.failed_send.take()
    }

    /// Sends records into the open transaction, or holds them while the
    /// previous one commits; converted first, so that what is held and
    /// counted against `batch.max.bytes` is what Kafka gets (an Avro record
    /// is a twentieth of its JSON with schemas).
    pub(super) async fn publish(&mut self, mut records: Vec<Record>) -> Result<(), CaptureError> {
        self.tx.prepare(&mut records).await?;
        // What was written apart from its schema head and not converted goes as JSON.
        records.iter_mut().for_each(Record::join_heads);
        if self.inflight.is_some() {
            let held = &mut self.held;
            held.bytes += records.iter().map(Record::len).sum::<usize>();
            held.records.extend(records);
            return Ok(());
        }
        self.send(records).await
    }

    async fn send(&mut self, records: Vec<Record>) -> Result<(), CaptureError> {
        if records.is_empty() {
            return Ok(());
        }
        self.open_batch()?;
        let mut bytes = 0;
        for r in &records {
            bytes += r.len();
            if let Err(e) = self.tx.send(r).await {
                let headers = r.headers.iter().map(|(k, v)| k.len() + v.len());
                self.failed_send = Some(FailedSend {
                    topic: Arc::clone(&r.topic),
                    key: r.key.clone(),
                    size: r.len() + headers.sum::<usize>(),
                });
                return Err(e);
            }
        }
        if let Some(b) = self.batch.as_mut() {
            b.records += records.len();
            b.bytes += bytes;
        }
        let events = records
            .iter()
            .filter(|r| r.topic != self.topics.schema_changes)
            .count();
        self.metrics.events.inc_by(events as u64);
        Ok(())
    }

    fn open_batch(&mut self) -> Result<(), CaptureError> {
        if self.batch.is_none() {
            self.metrics.health.waiting();
            self.tx.begin()?;
            self.batch = Some(OpenBatch {
                started: Instant::now(),
                records: 0,
                bytes: 0,
            });
        }
        Ok(())
    }

    /// Starts the commit of a full batch; when the records held behind a
    /// running commit fill a batch, waits for that commit first (bounding memory).
    pub(super) async fn close_if_full(&mut self, slot: &mut impl Slot) -> Result<(), CaptureError> {
        let max = self.limits;
        if self.inflight.is_some()
            && (self.held.records.len() >= max.events
                || self.held.bytes >= max.bytes.min(HOLD_MAX_BYTES))
        {
            self.finish_inflight(slot).await?;
        }
        if self.batch_full() {
            self.start_commit(slot).await?;
        }
        Ok(())
    }

    fn batch_full(&self) -> bool {
        let max = self.limits;
        self.batch
            .as_ref()
            .is_some_and(|b| b.records >= max.events || b.bytes >= max.bytes)
    }

    /// Commits everything read so far and waits for it: the running commit,
    /// the records held behind it, and the offset record of `pending`; then
    /// confirms its flush position to the slot. With nothing new this does nothing.
    pub(super) async fn commit_position(
        &mut self,
        slot: &mut impl Slot,
    ) -> Result<(), CaptureError> {
        self.finish_inflight(slot).await?;
        self.start_commit(slot).await?;
        self.finish_inflight(slot).await
    }

    /// Closes the open batch with the offset record of `pending` (with the
    /// source's part of it, [`Slot::offset_part`]) and starts committing it
    /// in the background. Does nothing while a commit runs.
    pub(super) async fn start_commit(&mut self, slot: &impl Slot) -> Result<(), CaptureError> {
        if self.inflight.is_some() || (self.batch.is_none() && self.pending == self.committed) {
            return Ok(());
        }
        self.pending.source = slot.offset_part(&self.pending)?;
        self.open_batch()?;
        let mut offset = Record::new(
            &self.topics.offsets,
            Some(self.topics.offset_key.clone()),
            Some(self.pending.to_bytes()),
        );
        // Start-up reads partition 0 only (`offset::read_to_end`): never
        // leave the partition to the key's hash, whatever the topic holds.
        offset.partition = Some(0);
        self.tx.send(&offset).await?;
        self.inflight = Some(Inflight {
            task: tokio::spawn(self.tx.commit()),
            offset: self.pending.clone(),
            started: Instant::now(),
        });
        self.batch = None;
        Ok(())
    }

    /// Completes when the running commit ends; never without one. Awaiting
    /// the handle by reference leaves the task running if this is dropped.
    pub(super) async fn commit_done(&mut self) -> CommitOutcome {
        match &mut self.inflight {
            Some(i) => (&mut i.task).await,
            None => std::future::pending().await,
        }
    }

    /// Waits for the running commit (if any) and takes its outcome.
    pub(super) async fn finish_inflight(
        &mut self,
        slot: &mut impl Slot,
    ) -> Result<(), CaptureError> {
        if self.inflight.is_none() {
            return Ok(());
        }
        let done = self.commit_done().await;
        self.on_commit_done(done, slot).await
    }

    /// A background commit ended: on success its position is final, Kafka
    /// holds everything up to its flush LSN (confirmed to the slot now), and
    /// the held records open the next batch. On failure nothing is confirmed.
    pub(super) async fn on_commit_done(
        &mut self,
        done: CommitOutcome,
        slot: &mut impl Slot,
    ) -> Result<(), CaptureError> {
        let Some(inflight) = self.inflight.take() else {
            return Ok(());
        };
        done.map_err(CaptureError::task("kafka commit"))??;
        self.metrics
            .batch_commit
            .observe(inflight.started.elapsed().as_secs_f64());
        self.metrics.kafka_transactions.inc();
        self.metrics.health.committed();
        self.committed = inflight.offset;
        slot.confirm(self.committed.flush_lsn);
        self.metrics
            .confirmed_lsn
            .set(self.committed.flush_lsn as i64);
        // The held records open the next batch, whose age counts from now:
        // counting from when they were read would close it at once after a
        // long commit, and many small transactions cost more than they save.
        let held = std::mem::take(&mut self.held);
        self.send(held.records).await?;
        // A batch refilled from held records may already be full.
        if self.batch_full() {
            self.start_commit(slot).await?;
        }
        Ok(())
    }

    /// After a failure: lets a running commit end (one transaction call at a
    /// time; whether it landed, the restart reads from Kafka), then aborts the
    /// open transaction so nothing of it is visible.
    pub(super) async fn abort(&mut self) {
        if let Some(inflight) = self.inflight.take() {
            let _ = inflight.task.await;
        }
        let _ = self.tx.abort().await;
    }
}
