//! An in-memory Kafka and slot for unit tests of the pipeline's parts: every
//! call is a step of one log, so a test reads the order of transactions and
//! slot confirmations, and what a `read_committed` reader would see.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::committer::{Committer, Limits, Slot, Topics, Transactions};
use super::record::Record;
use crate::error::CaptureError;
use crate::metrics::CaptureMetrics;
use crate::offset::SourceOffset;

pub(super) const OFFSETS: &str = "offsets";

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    Begin,
    Send {
        topic: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        /// The explicit partition, if the record names one.
        partition: Option<i32>,
    },
    Commit {
        ok: bool,
    },
    Abort,
    /// The slot was confirmed up to this LSN.
    Confirm(u64),
}

/// The steps so far, shared by the producer, the slot and the test.
#[derive(Clone, Default)]
pub(super) struct Log(Arc<Mutex<Vec<Step>>>);

impl Log {
    fn push(&self, step: Step) {
        self.0.lock().expect("log lock").push(step);
    }

    pub(super) fn steps(&self) -> Vec<Step> {
        self.0.lock().expect("log lock").clone()
    }

    /// The records of committed transactions, in commit order (what a
    /// `read_committed` reader sees), offset records included.
    pub(super) fn committed(&self) -> Vec<Vec<Step>> {
        let mut done = Vec::new();
        let mut open = Vec::new();
        for step in self.steps() {
            match step {
                Step::Begin => open.clear(),
                s @ Step::Send { .. } => open.push(s),
                Step::Commit { ok: true } => done.push(std::mem::take(&mut open)),
                Step::Commit { ok: false } | Step::Abort => open.clear(),
                Step::Confirm(_) => {}
            }
        }
        done
    }

    /// The confirmed LSNs, in order.
    pub(super) fn confirms(&self) -> Vec<u64> {
        let steps = self.steps();
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Confirm(lsn) => Some(*lsn),
                _ => None,
            })
            .collect()
    }

    /// Checks the exactly-once order: every confirmation is at or before the
    /// flush LSN of an offset record already committed, and every committed
    /// transaction ends with its offset record.
    pub(super) fn check_confirms(&self) {
        let mut open = Vec::new();
        let mut committed_flush: Option<u64> = None;
        for step in self.steps() {
            match step {
                Step::Begin => open.clear(),
                Step::Send { topic, value, .. } => open.push((topic, value)),
                Step::Commit { ok: true } => {
                    let (topic, value) = open.last().expect("a committed transaction has records");
                    assert_eq!(topic, OFFSETS, "a transaction ends with its offset record");
                    committed_flush = Some(decode(value.as_deref()).flush_lsn);
                }
                Step::Commit { ok: false } | Step::Abort => open.clear(),
                Step::Confirm(lsn) => {
                    let flush = committed_flush.expect("confirmed before any commit");
                    assert!(lsn <= flush, "confirmed {lsn} past the committed {flush}");
                }
            }
        }
    }
}

/// The offset in an offset record's value.
pub(super) fn decode(value: Option<&[u8]>) -> SourceOffset {
    serde_json::from_slice(value.expect("an offset record has a value")).expect("offset record")
}

impl Slot for Log {
    fn confirm(&mut self, flush_lsn: u64) {
        self.push(Step::Confirm(flush_lsn));
    }
}

/// A transactional producer that logs its calls. Its rules are the
/// broker's: one open transaction, sends only inside it.
#[derive(Default)]
pub(super) struct MemoryKafka {
    pub(super) log: Log,
    open: bool,
    /// Outcomes of the next commits, in order (success when empty).
    pub(super) outcomes: VecDeque<bool>,
    /// What `prepare` does to each record (a converter's part), if anything.
    pub(super) convert: Option<fn(&mut Record)>,
}

impl Transactions for MemoryKafka {
    async fn prepare(&mut self, records: &mut [Record]) -> Result<(), CaptureError> {
        if let Some(convert) = self.convert {
            records.iter_mut().for_each(convert);
        }
        Ok(())
    }

    fn begin(&mut self) -> Result<(), CaptureError> {
        if self.open {
            return Err(CaptureError::Protocol("begin inside a transaction".into()));
        }
        self.open = true;
        self.log.push(Step::Begin);
        Ok(())
    }

    async fn send(&mut self, r: &Record) -> Result<(), CaptureError> {
        if !self.open {
            return Err(CaptureError::Protocol("send outside a transaction".into()));
        }
        self.log.push(Step::Send {
            topic: r.topic.to_string(),
            key: r.key.clone(),
            value: r.value.clone(),
            partition: r.partition,
        });
        Ok(())
    }

    fn commit(&mut self) -> impl Future<Output = Result<(), CaptureError>> + Send + 'static {
        let was_open = std::mem::replace(&mut self.open, false);
        let ok = was_open && self.outcomes.pop_front().unwrap_or(true);
        let log = self.log.clone();
        async move {
            log.push(Step::Commit { ok });
            if ok {
                Ok(())
            } else {
                Err(CaptureError::Protocol("commit failed".into()))
            }
        }
    }

    async fn abort(&mut self) -> Result<(), CaptureError> {
        self.open = false;
        self.log.push(Step::Abort);
        Ok(())
    }
}

/// A committer over [`MemoryKafka`] starting at `offset`, batches of at most
/// `events` records, and the log its producer and slot write.
pub(super) fn committer(events: usize, offset: SourceOffset) -> (Committer<MemoryKafka>, Log) {
    let log = Log::default();
    (committer_on(&log, events, offset), log)
}

/// [`committer`] writing to `log`: a restarted pipeline on the same Kafka.
pub(super) fn committer_on(
    log: &Log,
    events: usize,
    offset: SourceOffset,
) -> Committer<MemoryKafka> {
    let kafka = MemoryKafka {
        log: log.clone(),
        ..MemoryKafka::default()
    };
    Committer::new(
        kafka,
        Limits {
            events,
            bytes: usize::MAX,
        },
        Topics {
            offsets: OFFSETS.into(),
            offset_key: b"connector".to_vec(),
            schema_changes: "schema-changes".into(),
        },
        CaptureMetrics::new("test"),
        offset,
    )
}

/// The offset in the last committed offset record: where a restart resumes.
pub(super) fn stored_offset(log: &Log) -> Option<SourceOffset> {
    log.committed()
        .iter()
        .flatten()
        .filter_map(|s| match s {
            Step::Send { topic, value, .. } if topic == OFFSETS => Some(decode(value.as_deref())),
            _ => None,
        })
        .next_back()
}

/// A one-record change on `topic` with key `key`.
pub(super) fn record(topic: &str, key: &str) -> Record {
    Record::new(
        &topic.into(),
        Some(key.as_bytes().to_vec()),
        Some(b"{}".to_vec()),
    )
}

/// The (topic, key) of each record sent, offset records left out.
pub(super) fn keys(records: &[Step]) -> Vec<String> {
    records
        .iter()
        .filter_map(|s| match s {
            Step::Send { topic, key, .. } if topic != OFFSETS => {
                Some(String::from_utf8_lossy(key.as_deref().unwrap_or_default()).into_owned())
            }
            _ => None,
        })
        .collect()
}
