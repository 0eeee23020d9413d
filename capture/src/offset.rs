//! The source offset: how far into the source's change stream Kafka holds
//! every event. It is written as the last record of each Kafka transaction,
//! to a compacted topic keyed by connector name, and read back with
//! `read_committed` on start.
//!
//! The core reads only what is source-independent: transactions ordered by
//! a `u64` order key (PostgreSQL: the commit LSN; MySQL: the binlog file's
//! sequence and the offset of the transaction's first event, see
//! `sources::mysql::offset`), the changes of one already published, the
//! snapshot plan and the tables set aside. What else a source needs to
//! resume (MySQL: the binlog file name, GTIDs, shape facts, typed snapshot
//! keys) is its [`SourcePart`], which only that source reads. PostgreSQL
//! has none, so its records are byte for byte what they always were
//! (`tests/fixtures/offsets/postgres.json`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::kafka::CaptureContext;
use crate::snapshot::SnapshotProgress;

/// Where publication stands. Transactions are identified by their order
/// key (PostgreSQL: the commit LSN, which pgoutput's Begin message
/// carries), known before a transaction's first change, so a restarted
/// connector knows before reading it whether it was published. Keys are
/// compared only within one source history; a source refuses at start a
/// stored offset of another history (see [`SourcePart`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceOffset {
    /// Order key of the last transaction with published events
    /// (PostgreSQL: its commit LSN, hence the name, which stays so that
    /// stored records keep reading).
    pub commit_lsn: u64,
    /// How many of that transaction's changes are published.
    pub events: u64,
    /// Whether all of them are (a transaction larger than a batch spans
    /// several Kafka transactions).
    pub complete: bool,
    /// The position confirmed to the slot: the end of the last complete
    /// transaction, or a heartbeat's server position, as an order key (a
    /// transaction whose key is below it is published). Never ahead of
    /// what this record covers.
    pub flush_lsn: u64,
    /// Source transaction id of `commit_lsn`, for operators.
    #[serde(default)]
    pub tx_id: u32,
    /// Commit time of `commit_lsn`, ms since the epoch.
    #[serde(default)]
    pub ts_ms: i64,
    /// The snapshot running, and how far it got; absent when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotProgress>,
    /// Tables captured so far (`schema.table`), so a start can tell which
    /// tables were added to `table.include.list` since (`snapshot.new.tables`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<BTreeSet<String>>,
    /// Tables set aside because they cannot be captured as they are
    /// (`schema.table` -> the reason and the fix): their changes are not
    /// published, so each owes an incremental snapshot once fixed. Kept
    /// here so that a restart cannot forget one (see `pipeline::quarantine`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quarantined: BTreeMap<String, String>,
    /// Tables released from quarantine -> the WAL position where their fix
    /// was seen. When the snapshot of such a table completes, a truncate
    /// event versioned at that position removes from every target the rows
    /// the snapshot and the stream did not rewrite since: rows deleted
    /// while the table was set aside (see `pipeline::quarantine`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stale_before: BTreeMap<String, u64>,
    /// The outcome of the last [`SIGNALS_KEPT`] execute-snapshot signals,
    /// oldest first, committed with each signal's own transaction: a gap
    /// recovery (`oncely sink`, `gap.recovery = "snapshot"`) reads here
    /// whether capture took its signal, since a refused one changes
    /// nothing else. Absent when there were none, so older records read
    /// as before and a capture without signals writes what it always did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<SignalOutcome>,
    /// The source's own part, which the core stores and never reads;
    /// absent for PostgreSQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourcePart>,
}

/// How many signal outcomes an offset record keeps: every record carries
/// them (compaction keeps the last only), and a recovery reads its own
/// within seconds of inserting it.
pub const SIGNALS_KEPT: usize = 16;

/// What capture did with one execute-snapshot signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOutcome {
    /// The signal row's `id`.
    pub id: String,
    /// Why none of its tables were queued (`schema.table: reason`); absent
    /// when they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// What a source needs to resume beyond the order key, stored in the same
/// offset record (so committed in the same Kafka transaction as the
/// records it covers) and read only by that source.
///
/// Contract: a JSON object with one key naming the source (`{"mysql":
/// {..}}`), so a source refuses a record another source wrote; it holds
/// the source's exact position, from which the order key in
/// [`SourceOffset::commit_lsn`] and [`SourceOffset::flush_lsn`] is derived
/// (the source checks they agree when it reads it); it is rewritten whole
/// with every record, since compaction keeps the last record only, so its
/// size is bounded by the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SourcePart(serde_json::Value);

impl SourcePart {
    pub fn new(value: serde_json::Value) -> Self {
        SourcePart(value)
    }

    pub fn value(&self) -> &serde_json::Value {
        &self.0
    }
}

/// What to do with a transaction the stream delivers, given the stored offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Already fully in Kafka.
    SkipAll,
    /// Its first `n` changes are in Kafka; publish the rest.
    SkipFirst(u64),
    /// New.
    PublishAll,
}

impl SourceOffset {
    /// The offset of a connector that has published nothing, starting at `flush_lsn`.
    pub fn start(flush_lsn: u64) -> Self {
        SourceOffset {
            commit_lsn: 0,
            events: 0,
            complete: true,
            flush_lsn,
            tx_id: 0,
            ts_ms: 0,
            snapshot: None,
            tables: None,
            quarantined: BTreeMap::new(),
            stale_before: BTreeMap::new(),
            signals: Vec::new(),
            source: None,
        }
    }

    /// Records what capture did with execute-snapshot signal `id` (`refused`:
    /// why not), dropping the oldest beyond [`SIGNALS_KEPT`].
    pub fn record_signal(&mut self, id: &str, refused: Option<String>) {
        self.signals.retain(|s| s.id != id);
        if self.signals.len() >= SIGNALS_KEPT {
            let excess = self.signals.len() + 1 - SIGNALS_KEPT;
            self.signals.drain(..excess);
        }
        self.signals.push(SignalOutcome {
            id: id.to_owned(),
            refused,
        });
    }

    /// The outcome of execute-snapshot signal `id`, when still kept.
    pub fn signal(&self, id: &str) -> Option<&SignalOutcome> {
        self.signals.iter().find(|s| s.id == id)
    }

    /// Classifies a transaction by its commit LSN against this offset.
    pub fn replay(&self, commit_lsn: u64) -> Replay {
        if commit_lsn < self.commit_lsn || (commit_lsn == self.commit_lsn && self.complete) {
            Replay::SkipAll
        } else if commit_lsn == self.commit_lsn {
            Replay::SkipFirst(self.events)
        } else if commit_lsn < self.flush_lsn {
            // Older than the confirmed position (e.g. a heartbeat confirmed past
            // it): PostgreSQL does not resend those, and we published them.
            Replay::SkipAll
        } else {
            Replay::PublishAll
        }
    }

    pub fn key(connector: &str) -> Vec<u8> {
        serde_json::json!({ "connector": connector })
            .to_string()
            .into_bytes()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain integers and strings cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The stored offset of `cfg`'s connector, from [`CaptureConfig::offsets_topic`]
/// only: another topic's open transaction (a SIGKILLed connector's) can
/// never hold this read back. Capture, `oncely verify` and the CLI all read
/// offsets through this function.
pub async fn read_stored_offset(cfg: &CaptureConfig) -> Result<Option<SourceOffset>, CaptureError> {
    read_last_offset(
        cfg.kafka_client(),
        &cfg.offsets_topic(),
        cfg.connector_name(),
    )
    .await
}

/// Whether `topic` exists on the cluster (assigning a missing topic would
/// wait for it until the reader's deadline).
pub(crate) async fn topic_exists(cfg: &CaptureConfig, topic: &str) -> Result<bool, CaptureError> {
    Ok(partition_count(cfg, topic).await?.is_some())
}

/// How many partitions `topic` has; `None` when it does not exist.
pub(crate) async fn partition_count(
    cfg: &CaptureConfig,
    topic: &str,
) -> Result<Option<usize>, CaptureError> {
    let mut client = cfg.kafka_client();
    client.set("group.id", "oncely-offset-reader");
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<CaptureContext> = client
            .create_with_context(CaptureContext::default())
            .map_err(|e| CaptureError::kafka("create offset reader", "-", e))?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(30))
            .map_err(|e| CaptureError::kafka("read topic metadata", "-", e))?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len()))
    })
    .await
    .map_err(CaptureError::task("kafka metadata"))?
}

/// Reads the last committed offset record of `connector` from the offsets
/// topic, with `read_committed` so aborted transactions are never seen.
/// Returns `None` when the connector never committed. `client`: brokers and
/// connection properties (see [`CaptureConfig::kafka_client`]).
///
/// [`CaptureConfig::kafka_client`]: crate::config::CaptureConfig::kafka_client
pub async fn read_last_offset(
    client: ClientConfig,
    topic: &str,
    connector: &str,
) -> Result<Option<SourceOffset>, CaptureError> {
    let topic = topic.to_string();
    let key = SourceOffset::key(connector);
    tokio::task::spawn_blocking(move || read_last_blocking(client, &topic, &key))
        .await
        .map_err(CaptureError::task("offset reader"))?
}

fn read_last_blocking(
    client: ClientConfig,
    topic: &str,
    key: &[u8],
) -> Result<Option<SourceOffset>, CaptureError> {
    let mut last = None;
    read_to_end(client, topic, "read offsets topic", |msg| {
        if msg.key() != Some(key) {
            return Ok(());
        }
        last = match msg.payload() {
            // A compaction tombstone resets the connector.
            None => None,
            Some(bytes) => Some(serde_json::from_slice::<SourceOffset>(bytes).map_err(|e| {
                CaptureError::CorruptOffset {
                    topic: topic.to_string(),
                    reason: format!("offset {}: {e}", msg.offset()),
                }
            })?),
        };
        Ok(())
    })?;
    Ok(last)
}

/// Hands every committed record of partition 0 of `topic` to `on`, from the
/// start to the end (`read_committed`, so aborted transactions are never
/// seen); `what` names the topic in errors. Blocking: run it off the runtime.
///
/// The end is the partition's last stable offset when the read starts:
/// every record committed before lies below it. Waiting for `PartitionEOF`
/// alone never ends while the topic is written without pause (a capture
/// under steady load commits every `batch.max.ms`): each fetch then brings
/// newer records, and `oncely status`, `oncely verify` and a restart waited
/// for this read until its deadline.
pub(crate) fn read_to_end(
    mut client: ClientConfig,
    topic: &str,
    what: &'static str,
    mut on: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> Result<(), CaptureError>,
) -> Result<(), CaptureError> {
    let kafka = |e| CaptureError::kafka(what, "-", e);
    let consumer: BaseConsumer<CaptureContext> = client
        .set("group.id", "oncely-offset-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create_with_context(CaptureContext::default())
        .map_err(kafka)?;
    // A read_committed client's high watermark is the last stable offset.
    let (low, end) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(30))
        .map_err(kafka)?;
    if end <= low {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .map_err(kafka)?;
    consumer.assign(&tpl).map_err(kafka)?;

    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(reason) = consumer.context().refused() {
            return Err(CaptureError::KafkaLogin { reason });
        }
        if std::time::Instant::now() > deadline {
            return Err(CaptureError::Kafka {
                context: what,
                source: KafkaError::NoMessageReceived,
                retriable: true,
            });
        }
        match consumer.poll(Duration::from_millis(500)) {
            // The last records below the end may be aborted ones or a
            // transaction marker, which are never delivered.
            None if read_past(&consumer, topic, end) => return Ok(()),
            None => continue,
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(()),
            Some(Err(e)) => return Err(kafka(e)),
            Some(Ok(msg)) => {
                // Records past the end committed since; newer, never wrong.
                on(&msg)?;
                if msg.offset() + 1 >= end {
                    return Ok(());
                }
            }
        }
    }
}

/// Whether `consumer`'s position on partition 0 of `topic` is at `end` or past it.
fn read_past(consumer: &BaseConsumer<CaptureContext>, topic: &str, end: i64) -> bool {
    consumer.position().is_ok_and(|tpl| {
        tpl.find_partition(topic, 0)
            .is_some_and(|p| matches!(p.offset(), Offset::Offset(at) if at >= end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(commit_lsn: u64, events: u64, complete: bool, flush_lsn: u64) -> SourceOffset {
        SourceOffset {
            commit_lsn,
            events,
            complete,
            flush_lsn,
            ..SourceOffset::start(0)
        }
    }

    #[test]
    fn replay_decisions() {
        let done = at(100, 5, true, 120);
        assert_eq!(done.replay(90), Replay::SkipAll);
        assert_eq!(done.replay(100), Replay::SkipAll);
        assert_eq!(done.replay(130), Replay::PublishAll);

        let partial = at(100, 5, false, 80);
        assert_eq!(partial.replay(90), Replay::SkipAll);
        assert_eq!(partial.replay(100), Replay::SkipFirst(5));
        // The first transaction after the offset is never dropped.
        assert_eq!(partial.replay(101), Replay::PublishAll);

        let fresh = SourceOffset::start(0);
        assert_eq!(fresh.replay(1), Replay::PublishAll);
    }

    #[test]
    fn heartbeat_flush_position_skips_older_transactions() {
        let hb = at(100, 5, true, 500);
        assert_eq!(hb.replay(400), Replay::SkipAll);
        assert_eq!(hb.replay(500), Replay::PublishAll);
    }

    /// The quarantine survives a restart: written while a table is set
    /// aside, absent (and read as empty) otherwise, as in older records.
    #[test]
    fn quarantined_tables_round_trip_and_older_records_have_none() {
        let mut o = at(7, 3, true, 5);
        o.quarantined
            .insert("public.bare".into(), "no primary key".into());
        let back: SourceOffset = serde_json::from_slice(&o.to_bytes()).unwrap();
        assert_eq!(back, o);
        let old = br#"{"commit_lsn":7,"events":3,"complete":true,"flush_lsn":5}"#;
        let old: SourceOffset = serde_json::from_slice(old).unwrap();
        assert!(old.quarantined.is_empty());
        assert!(!String::from_utf8(at(7, 3, true, 5).to_bytes())
            .unwrap()
            .contains("quarantined"));
    }

    /// A PostgreSQL offset record with every field set, as capture has
    /// always written it: records in Kafka are read back by every later
    /// version, so its bytes never change.
    #[test]
    fn postgres_records_are_byte_identical_to_the_golden_one() {
        use crate::snapshot::{SnapshotKind, SnapshotProgress, TableProgress};
        let mut orders = TableProgress::new("public.orders", Some("region = 'eu'".into()));
        orders.last_key = Some(vec![Some("42".into()), None]);
        orders.rows = 1024;
        orders.chunks = 2;
        let items = TableProgress::new("public.items", None);
        let mut o = at((1 << 32) + 42, 3, false, 1 << 32);
        o.tx_id = 771;
        o.ts_ms = 1_764_979_200_123;
        o.snapshot = Some(SnapshotProgress::new(
            "initial-1764979200000".into(),
            SnapshotKind::Initial,
            vec![orders, items],
        ));
        o.tables = Some(["public.orders".into(), "public.items".into()].into());
        o.quarantined.insert(
            "public.bare".into(),
            "no primary key: ALTER TABLE public.bare ADD PRIMARY KEY (...)".into(),
        );
        o.stale_before.insert("public.fixed".into(), 4_294_967_000);
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/offsets/postgres.json");
        let golden = std::fs::read(path).unwrap();
        assert_eq!(
            String::from_utf8(o.to_bytes()).unwrap(),
            String::from_utf8(golden.clone()).unwrap()
        );
        let back: SourceOffset = serde_json::from_slice(&golden).unwrap();
        assert_eq!(back, o);
        assert_eq!(back.to_bytes(), golden);
    }

    /// Signal outcomes are written once there are some, and older records
    /// read as having none.
    #[test]
    fn signal_outcomes_round_trip_and_older_records_have_none() {
        let mut o = at(7, 3, true, 5);
        o.record_signal("gap-1", Some("public.t: not captured".into()));
        o.record_signal("gap-2", None);
        let bytes = String::from_utf8(o.to_bytes()).unwrap();
        assert!(
            bytes.contains(
                r#""signals":[{"id":"gap-1","refused":"public.t: not captured"},{"id":"gap-2"}]"#
            ),
            "{bytes}"
        );
        let back: SourceOffset = serde_json::from_str(&bytes).unwrap();
        assert_eq!(back, o);
        let old = br#"{"commit_lsn":7,"events":3,"complete":true,"flush_lsn":5}"#;
        let old: SourceOffset = serde_json::from_slice(old).unwrap();
        assert!(old.signals.is_empty());
        assert!(!String::from_utf8(at(7, 3, true, 5).to_bytes())
            .unwrap()
            .contains("signals"));
    }

    #[test]
    fn round_trips_as_json() {
        let o = at(7, 3, false, 5);
        let back: SourceOffset = serde_json::from_slice(&o.to_bytes()).unwrap();
        assert_eq!(back, o);
        assert!(!String::from_utf8(o.to_bytes())
            .unwrap()
            .contains("snapshot"));
    }
}
