//! The [`Sink`] trait users implement, and the [`Batch`] the runner hands it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;

use crate::error::SinkError;
use crate::event::{ChangeEvent, Payload};

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
}

impl TopicPartition {
    /// A topic partition from its parts.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// Stored consumer positions: for each partition, the offset of the next record to read.
pub type Positions = HashMap<TopicPartition, i64>;

/// One decoded Kafka record of a batch.
#[derive(Debug, Clone)]
pub struct Record {
    /// Offset in the batch's partition.
    pub offset: i64,
    /// The batch's partition, set when the record joins a [`Batch`].
    partition: i32,
    /// Kafka record timestamp in milliseconds, when the broker or producer set one.
    pub timestamp_ms: Option<i64>,
    /// The decoded key (the row's primary key as a JSON object), `None` for a null key.
    pub key: Option<Value>,
    /// The decoded value.
    pub payload: Payload,
    raw_key: Option<Bytes>,
    raw_value: Option<Bytes>,
    /// The value of the `dedup.identity.header` Kafka header, the one header carried.
    identity_header: Option<Bytes>,
}

impl Record {
    /// A record built from its decoded parts and the bytes it was decoded from.
    pub fn new(offset: i64, key: Option<Value>, payload: Payload) -> Self {
        Self {
            offset,
            partition: 0,
            timestamp_ms: None,
            key,
            payload,
            raw_key: None,
            raw_value: None,
            identity_header: None,
        }
    }

    /// Attaches the value of the Kafka header named by `dedup.identity.header`.
    pub fn with_identity_header(mut self, value: Option<Vec<u8>>) -> Self {
        self.identity_header = value.map(Bytes::from);
        self
    }

    /// The value of the Kafka header named by `dedup.identity.header`, when
    /// that is set and the record had the header (no other header is carried).
    pub fn identity_header(&self) -> Option<&[u8]> {
        self.identity_header.as_deref()
    }

    /// Attaches the original bytes, as read from Kafka.
    pub fn with_raw(mut self, key: Option<&[u8]>, value: Option<&[u8]>) -> Self {
        self.raw_key = key.map(Bytes::copy_from_slice);
        self.raw_value = value.map(Bytes::copy_from_slice);
        self
    }

    /// Like [`Record::with_raw`], taking the bytes as they are (no copy).
    pub fn with_raw_owned(mut self, key: Option<Vec<u8>>, value: Option<Vec<u8>>) -> Self {
        self.raw_key = key.map(Bytes::from);
        self.raw_value = value.map(Bytes::from);
        self
    }

    /// The Kafka partition the record was read from (that of its [`Batch`]).
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The change event, `None` for a tombstone or a Debezium bookkeeping record.
    pub fn event(&self) -> Option<&ChangeEvent> {
        match &self.payload {
            Payload::Change(e) => Some(e),
            Payload::Tombstone | Payload::Bookkeeping(_) => None,
        }
    }

    /// The key's bytes as read from Kafka.
    pub fn raw_key(&self) -> Option<&[u8]> {
        self.raw_key.as_deref()
    }

    /// The value's bytes as read from Kafka (`None` for a tombstone).
    pub fn raw_value(&self) -> Option<&[u8]> {
        self.raw_value.as_deref()
    }

    /// Size of the original key and value in bytes.
    pub fn raw_len(&self) -> usize {
        self.raw_key.as_ref().map_or(0, |k| k.len())
            + self.raw_value.as_ref().map_or(0, |v| v.len())
    }
}

/// An ordered run of records from one partition, and the position after it.
///
/// Records are in offset order. Offsets may have gaps (transaction markers,
/// compacted records, records already dead-lettered, ignored records), so a
/// batch may even hold no record at all: a position-owning sink must still
/// store [`Batch::next_offset`] then, or the skipped records come back.
///
/// A batch may carry what [`Sink::prepare`] derived from its records (see
/// [`Batch::prepared`]); changing the records drops it.
#[derive(Clone)]
pub struct Batch {
    group: Arc<str>,
    topic: Arc<str>,
    partition: i32,
    records: Vec<Record>,
    next_offset: i64,
    prepared: Option<Arc<dyn Any + Send + Sync>>,
    skipped: SkipCount,
    /// Whether the records' events went through the sink's field selection
    /// ([`crate::fields`]); kept by clones and removals.
    fields_selected: bool,
}

/// Records of a batch that its last apply left out as already applied (the
/// dedup window), so the runner counts them as skipped, not applied.
#[derive(Debug, Default)]
struct SkipCount(AtomicUsize);

impl Clone for SkipCount {
    fn clone(&self) -> Self {
        Self(AtomicUsize::new(self.0.load(Ordering::Relaxed)))
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("records", &self.records)
            .field("next_offset", &self.next_offset)
            .field("prepared", &self.prepared.is_some())
            .finish()
    }
}

impl Batch {
    /// A batch of `records` from `topic`/`partition`, read by consumer group `group`,
    /// after which the partition continues at `next_offset`.
    pub fn new(
        group: Arc<str>,
        tp: (Arc<str>, i32),
        mut records: Vec<Record>,
        next_offset: i64,
    ) -> Self {
        for r in &mut records {
            r.partition = tp.1;
        }
        Self {
            group,
            topic: tp.0,
            partition: tp.1,
            records,
            next_offset,
            prepared: None,
            skipped: SkipCount::default(),
            fields_selected: false,
        }
    }

    /// The records, to change in place; drops what [`Sink::prepare`] stored.
    pub(crate) fn records_mut(&mut self) -> &mut [Record] {
        self.prepared = None;
        &mut self.records
    }

    /// Notes that the records' events went through the field selection.
    pub(crate) fn mark_fields_selected(&mut self) {
        self.fields_selected = true;
    }

    /// Whether the records' events went through the field selection.
    pub(crate) fn fields_selected(&self) -> bool {
        self.fields_selected
    }

    /// Notes that the current apply leaves `n` records out as already applied
    /// (each apply of a retried batch notes its own count).
    pub(crate) fn note_skipped(&self, n: usize) {
        self.skipped.0.store(n, Ordering::Relaxed);
    }

    /// Records the last apply left out as already applied.
    pub(crate) fn skipped(&self) -> usize {
        self.skipped.0.load(Ordering::Relaxed)
    }

    /// The consumer group, the first part of a position's identity.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The topic all records come from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition all records come from.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The records, in offset order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The offset of the next record to read once this batch is applied: the position to store.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// The batch's partition as a [`TopicPartition`].
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition::new(self.topic.as_ref(), self.partition)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when the batch holds no record (it still carries a position).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Each source table (schema, table) of the batch's change events, with
    /// the first event of each run of records of that table, in offset order:
    /// what a sink claims its targets for before it writes (a batch is
    /// usually one table, so one item).
    pub fn table_runs(&self) -> impl Iterator<Item = (&ChangeEvent, &str, &str)> {
        let mut last = None;
        self.records.iter().filter_map(move |record| {
            let event = record.event()?;
            let (Some(schema), Some(table)) = (event.schema_name(), event.table()) else {
                return None;
            };
            if last == Some((schema, table)) {
                return None;
            }
            last = Some((schema, table));
            Some((event, schema, table))
        })
    }

    /// Finds a record by offset.
    pub fn record_at(&self, offset: i64) -> Option<&Record> {
        self.records
            .binary_search_by_key(&offset, |r| r.offset)
            .ok()
            .and_then(|i| self.records.get(i))
    }

    /// Removes the records at `offsets`, keeping the position (used after dead-lettering them).
    /// Drops what [`Sink::prepare`] stored: it was derived from the records removed too.
    pub fn remove_offsets(&mut self, offsets: &[i64]) {
        self.records.retain(|r| !offsets.contains(&r.offset));
        self.prepared = None;
    }

    /// Stores what a sink derived from this batch's records in [`Sink::prepare`],
    /// replacing anything stored before.
    pub fn set_prepared<T: Any + Send + Sync>(&mut self, prepared: T) {
        self.prepared = Some(Arc::new(prepared));
    }

    /// What [`Sink::prepare`] stored, when it is a `T` and the records have not
    /// changed since (`None` otherwise: the sink then does that work in `apply`).
    pub fn prepared<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.prepared.as_deref()?.downcast_ref::<T>()
    }
}

/// A target that applies change events: the trait users implement.
///
/// # Delivery and idempotence
///
/// The runner delivers each record **at least once**. A batch can be applied
/// again after a retriable error, after a crash, and after its partition moved
/// to another runner. A sink therefore makes applying a batch twice harmless —
/// by applying a change only when its [`Version`](crate::event::Version) is
/// newer than the stored one (and keeping a tombstone version for deletes) —
/// unless it **owns its positions**: it stores [`Batch::next_offset`] in the
/// same atomic write as the batch's data and returns it from
/// [`Sink::load_positions`]. The runner then seeks to those positions on
/// assignment and each record is applied exactly once; Kafka-committed offsets
/// are written for lag monitoring only and never read back.
///
/// # Ordering and concurrency
///
/// Batches of one partition are applied one at a time, in offset order, and a
/// batch is never handed out before the previous one of its partition returned
/// `Ok`. Batches of different partitions are applied concurrently, so the
/// implementation must be `Sync`. Ordering is per partition, hence per key;
/// there is no order across partitions or topics.
///
/// # Errors
///
/// See [`SinkError`]: when `apply` returns an error, the batch's position must
/// not have been stored. `Rejected` names the records that can never be
/// applied; the runner writes them to the dead-letter topic (and waits for
/// Kafka to acknowledge them) *before* it applies the rest of the batch, so a
/// position-owning sink never stores a position past a record that is neither
/// applied nor dead-lettered.
///
/// # Preparing
///
/// [`Sink::prepare`] lets a sink do the CPU work of a batch that does not
/// depend on the target (parsing, collapsing to the newest change per key,
/// building rows) ahead of `apply`: the runner calls it right after decoding,
/// in the partition's decoding task, while the previous batch of the partition
/// is still being applied. It changes nothing in the target and the contract
/// above holds unchanged: `apply` may get a batch that was never prepared (or
/// whose records changed since, which drops the prepared part) and must then
/// do that work itself.
///
/// # Lifecycle
///
/// [`Sink::load_positions`] and [`Sink::assigned`] run when partitions are
/// assigned, before any batch of them; [`Sink::shutdown`] runs once, after the
/// last batch returned, when the runner stops.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// A short name for logs and metrics.
    fn name(&self) -> &str;

    /// True when the target stores consumer positions atomically with the data
    /// (see the trait docs). Constant for the life of the sink.
    fn owns_positions(&self) -> bool {
        false
    }

    /// The stored positions of `group` for `partitions` (position-owning sinks only).
    /// A partition missing from the result has never been applied; the runner
    /// starts it according to `auto.offset.reset`.
    async fn load_positions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        let _ = (group, partitions);
        Ok(Positions::new())
    }

    /// Called once per assignment with the offset each new partition starts at,
    /// before any batch of them (e.g. to warm a dedup window from the records
    /// just before). Errors are treated like `apply` errors: retried or fatal.
    async fn assigned(&self, starts: &Positions) -> Result<(), SinkError> {
        let _ = starts;
        Ok(())
    }

    /// Prepares `batch` for [`Sink::apply`] (see "Preparing" in the trait docs):
    /// pure CPU work on the batch's records, no I/O and no state of the target,
    /// stored with [`Batch::set_prepared`] and read back in `apply` with
    /// [`Batch::prepared`]. Cannot fail: whatever is wrong with a record is
    /// reported by `apply`. The runner calls it on a blocking thread
    /// (`spawn_blocking`), together with decoding, so a slow `prepare` does
    /// not hold up async tasks; it still delays the batch. The default does nothing.
    fn prepare(&self, batch: &mut Batch) {
        let _ = batch;
    }

    /// Applies `batch` (see the trait docs for the contract).
    async fn apply(&self, batch: &Batch) -> Result<(), SinkError>;

    /// Releases resources; called once when the runner stops, after the last `apply` returned.
    async fn shutdown(&self) -> Result<(), SinkError> {
        Ok(())
    }
}
