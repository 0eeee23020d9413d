//! A conformance kit for [`Sink`] implementations: run [`check`] in your
//! sink's own tests, against your real target.
//!
//! It feeds one table (`public.conformance`, key `id`, columns `id`, `v`,
//! `doc`) over two partitions the way the runner can: creates, updates, an
//! update carrying `__debezium_unavailable_value` (unchanged TOAST: the
//! column keeps its value), a delete followed by its tombstone, a key
//! re-created after its delete, and a primary-key change (delete of the old
//! key, create of the new). Along the way it replays a batch right after it
//! was applied (a retry), "crashes" — a fresh sink from [`Target::sink`]
//! gets batches again from an older position (the runner's redelivery after
//! a crash; a sink that owns its positions resumes from
//! [`Sink::load_positions`] instead, as the runner seeks there) — and moves
//! a partition to a third instance (a rebalance) while the old owner applies
//! its batch in flight late, after newer changes of its keys (refusing it
//! with a retriable error is fine too: a fenced owner). Then it asks the target for
//! its rows ([`Target::rows`]) and compares them with the expected final
//! state: every expected row with equal `v` and `doc`, no other row.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use oncely_core::wire::UNAVAILABLE_VALUE as UNAVAILABLE;
use serde_json::{json, Map, Value};

use crate::error::{BoxError, SinkError};
use crate::event::decode_value;
use crate::sink::{Batch, Positions, Record, Sink, TopicPartition};

/// The consumer group the kit's batches carry.
pub const GROUP: &str = "oncely-conformance";
/// Partitions the kit uses (row `id` goes to partition `id % PARTITIONS`).
pub const PARTITIONS: i32 = 2;
/// Records per batch.
const BATCH: usize = 3;

/// Rows by id.
pub type Rows = BTreeMap<u64, Map<String, Value>>;

/// What the kit needs from a sink's test.
#[async_trait]
pub trait Target: Send + Sync {
    /// A fresh instance of the sink, as a new process would build it.
    async fn sink(&self) -> Result<Arc<dyn Sink>, SinkError>;
    /// The rows of `public.conformance` the target holds now, from `topic`, by `id`.
    async fn rows(&self, topic: &str) -> Result<Rows, BoxError>;
}

/// Why a sink does not conform.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The sink failed a batch.
    #[error("applying {what}: {source}")]
    Sink {
        /// Which step.
        what: String,
        /// The error.
        #[source]
        source: SinkError,
    },
    /// The target could not be read.
    #[error("reading the target: {0}")]
    Observe(#[source] BoxError),
    /// The final state differs.
    #[error("row {id}: expected {expected}, found {found}")]
    Mismatch {
        /// The row.
        id: u64,
        /// Expected row (`null`: absent).
        expected: Box<Value>,
        /// Found row (`null`: absent).
        found: Box<Value>,
    },
}

/// The kit's change stream: each partition's records, and the expected rows.
pub struct Script {
    /// Records by partition, offsets from 0.
    pub partitions: Vec<Vec<Record>>,
    /// The final state.
    pub expected: Rows,
}

fn envelope(op: &str, id: u64, row: Option<Value>, lsn: u64) -> Vec<u8> {
    let (before, after) = match op {
        "d" => (Some(json!({ "id": id })), None),
        _ => (None, row),
    };
    json!({
        "before": before, "after": after, "op": op, "ts_ms": 0,
        "source": {"connector": "conformance", "db": "db", "schema": "public", "table": "conformance",
                   "lsn": lsn, "commit_lsn": lsn, "event_seq": 0},
    })
    .to_string()
    .into_bytes()
}

/// Builds the script (deterministic).
pub fn script() -> Script {
    let mut partitions = vec![Vec::new(); PARTITIONS as usize];
    let mut expected = Rows::new();
    let mut lsn = 1000u64;
    let mut push = |id: u64, value: Option<Vec<u8>>| {
        let p = &mut partitions[(id % PARTITIONS as u64) as usize];
        let key = json!({ "id": id }).to_string().into_bytes();
        let payload = decode_value(value.as_deref()).expect("the kit's envelopes decode");
        let record = Record::new(p.len() as i64, Some(json!({ "id": id })), payload)
            .with_raw_owned(Some(key), value);
        p.push(record);
    };
    let mut change = |op: &str, id: u64, v: u64, doc: &str, expected: &mut Rows| {
        lsn += 1;
        let row = json!({"id": id, "v": v, "doc": doc});
        push(id, Some(envelope(op, id, Some(row), lsn)));
        match op {
            "d" => {
                expected.remove(&id);
                push(id, None); // the tombstone
            }
            _ => {
                let entry = expected.entry(id).or_default();
                entry.insert("id".into(), json!(id));
                entry.insert("v".into(), json!(v));
                if doc != UNAVAILABLE {
                    entry.insert("doc".into(), json!(doc));
                }
            }
        }
    };
    for id in 1..=6 {
        change("c", id, 0, &format!("d{id}"), &mut expected);
    }
    for id in 1..=6 {
        change("u", id, 1, &format!("d{id}"), &mut expected);
    }
    change("u", 2, 2, UNAVAILABLE, &mut expected);
    change("d", 3, 0, "", &mut expected);
    change("d", 4, 0, "", &mut expected); // primary-key change 4 -> 8
    change("c", 8, 5, "d8", &mut expected);
    change("c", 3, 9, "d3b", &mut expected);
    change("u", 5, 7, "d5", &mut expected);
    Script {
        partitions,
        expected,
    }
}

fn batches(topic: &str, partition: i32, records: &[Record]) -> Vec<Batch> {
    records
        .chunks(BATCH)
        .map(|c| {
            let next = c.last().map_or(0, |r| r.offset + 1);
            Batch::new(
                Arc::from(GROUP),
                (Arc::from(topic), partition),
                c.to_vec(),
                next,
            )
        })
        .collect()
}

async fn apply(sink: &dyn Sink, batch: &Batch, what: &str) -> Result<(), ConformanceError> {
    sink.apply(batch)
        .await
        .map_err(|source| ConformanceError::Sink {
            what: format!(
                "{what} ({}[{}] up to {})",
                batch.topic(),
                batch.partition(),
                batch.next_offset()
            ),
            source,
        })
}

/// Delivers `batches` from index `from` on to a fresh `sink`, as the runner
/// would after an assignment: a position-owning sink resumes at its stored position.
async fn resume(
    sink: &dyn Sink,
    tp: &TopicPartition,
    batches: &[Batch],
    from: usize,
    what: &str,
) -> Result<(), ConformanceError> {
    let mut start = batches
        .get(from)
        .map_or(i64::MAX, |b| b.records()[0].offset);
    if sink.owns_positions() {
        let stored = sink
            .load_positions(GROUP, std::slice::from_ref(tp))
            .await
            .map_err(|source| ConformanceError::Sink {
                what: "load_positions".into(),
                source,
            })?;
        start = stored.get(tp).copied().unwrap_or(0);
    }
    let starts: Positions = [(tp.clone(), start)].into_iter().collect();
    sink.assigned(&starts)
        .await
        .map_err(|source| ConformanceError::Sink {
            what: "assigned".into(),
            source,
        })?;
    for b in batches.iter().filter(|b| b.next_offset() > start) {
        apply(sink, b, what).await?;
    }
    Ok(())
}

/// Runs the kit against `target` on `topic` (use a fresh name per run).
pub async fn check(target: &dyn Target, topic: &str) -> Result<(), ConformanceError> {
    let script = script();
    let all: Vec<Vec<Batch>> = script
        .partitions
        .iter()
        .enumerate()
        .map(|(p, records)| batches(topic, p as i32, records))
        .collect();
    let tps: Vec<TopicPartition> = (0..PARTITIONS)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    let build = || async {
        target
            .sink()
            .await
            .map_err(|source| ConformanceError::Sink {
                what: "building the sink".into(),
                source,
            })
    };
    // First instance: each partition's first two batches, the first one twice
    // (retried after it was applied) — except for a position-owning sink, whose
    // retried batch never had its position stored, so it is not applied twice.
    let first = build().await?;
    for (p, batches) in all.iter().enumerate() {
        resume(first.as_ref(), &tps[p], &batches[..2], 0, "first run").await?;
        if !first.owns_positions() {
            apply(first.as_ref(), &batches[0], "a retried batch").await?;
        }
    }
    first.shutdown().await.ok();
    // Crash: the next instance gets everything again from the first batch
    // (Kafka's commit lagged) — older records after newer ones.
    let second = build().await?;
    resume(
        second.as_ref(),
        &tps[0],
        &all[0],
        0,
        "redelivery after a crash",
    )
    .await?;
    let half = all[1].len() / 2;
    resume(
        second.as_ref(),
        &tps[1],
        &all[1][..half.max(1)],
        0,
        "redelivery after a crash",
    )
    .await?;
    // Rebalance: partition 1 moves to a third instance, one batch back; the
    // old owner finishes its batch in flight late, after the new owner
    // applied newer changes of the same keys.
    let third = build().await?;
    let back = half.saturating_sub(1);
    resume(third.as_ref(), &tps[1], &all[1], back, "after a rebalance").await?;
    // A sink that fences revoked owners refuses the batch (retriable: the
    // runner retries until the revocation stops it); either way it must not
    // move a row backwards.
    match apply(
        second.as_ref(),
        &all[1][back],
        "a revoked owner's late batch",
    )
    .await
    {
        Err(ConformanceError::Sink { source, .. }) if source.is_retriable() => {}
        other => other?,
    }
    second.shutdown().await.ok();
    third.shutdown().await.ok();
    compare(
        &script.expected,
        &target
            .rows(topic)
            .await
            .map_err(ConformanceError::Observe)?,
    )
}

/// Equal when every expected row is found with equal `v` and `doc` (other
/// columns a sink adds are ignored) and no other row is there.
pub fn compare(expected: &Rows, found: &Rows) -> Result<(), ConformanceError> {
    let mismatch = |id: u64, e: Option<&Map<String, Value>>, f: Option<&Map<String, Value>>| {
        let v =
            |m: Option<&Map<String, Value>>| m.map_or(Value::Null, |m| Value::Object(m.clone()));
        ConformanceError::Mismatch {
            id,
            expected: Box::new(v(e)),
            found: Box::new(v(f)),
        }
    };
    for (id, row) in expected {
        let Some(got) = found.get(id) else {
            return Err(mismatch(*id, Some(row), None));
        };
        if ["v", "doc"].iter().any(|c| row.get(*c) != got.get(*c)) {
            return Err(mismatch(*id, Some(row), Some(got)));
        }
    }
    if let Some((id, row)) = found.iter().find(|(id, _)| !expected.contains_key(id)) {
        return Err(mismatch(*id, None, Some(row)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_covers_what_it_promises() {
        let s = script();
        let records: Vec<&Record> = s.partitions.iter().flatten().collect();
        assert!(records.iter().any(|r| r.event().is_none()), "a tombstone");
        assert!(records.iter().any(|r| r
            .raw_value()
            .is_some_and(|v| { String::from_utf8_lossy(v).contains(UNAVAILABLE) })));
        assert_eq!(
            s.expected.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3, 5, 6, 8]
        );
        assert_eq!(
            s.expected[&2]["doc"], "d2",
            "the unavailable value kept the old one"
        );
        assert_eq!(s.expected[&3]["v"], 9, "re-created after its delete");
    }

    #[test]
    fn compare_finds_missing_extra_and_different_rows() {
        let expected = script().expected;
        assert!(compare(&expected, &expected).is_ok());
        let mut extra = expected.clone();
        extra.insert(4, Map::new());
        assert!(matches!(
            compare(&expected, &extra),
            Err(ConformanceError::Mismatch { id: 4, .. })
        ));
        let mut changed = expected.clone();
        changed
            .get_mut(&2)
            .expect("row 2")
            .insert("doc".into(), json!(UNAVAILABLE));
        assert!(compare(&expected, &changed).is_err());
    }
}
