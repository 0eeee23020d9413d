//! The committer against the in-memory Kafka: batches, held records and the
//! order of commits and slot confirmations.

use super::memory::{committer, decode, keys, record, Step, OFFSETS};
use crate::offset::SourceOffset;

fn offset_at(flush_lsn: u64) -> SourceOffset {
    SourceOffset::start(flush_lsn)
}

#[tokio::test]
async fn a_full_batch_commits_then_confirms_its_position() {
    let (mut c, mut log) = committer(2, offset_at(10));
    c.publish(vec![record("t", "a")]).await.unwrap();
    c.close_if_full(&mut log.clone()).await.unwrap();
    assert!(!c.committing(), "one record of two: the batch stays open");
    c.publish(vec![record("t", "b")]).await.unwrap();
    c.pending.flush_lsn = 100;
    c.close_if_full(&mut log.clone()).await.unwrap();
    assert!(c.committing());
    assert!(
        log.confirms().is_empty(),
        "nothing confirmed before the commit ends"
    );
    c.finish_inflight(&mut log).await.unwrap();

    let steps = log.steps();
    assert_eq!(steps[0], Step::Begin);
    assert_eq!(keys(&steps), ["a", "b"]);
    let Step::Send {
        topic,
        value,
        partition,
        ..
    } = &steps[3]
    else {
        panic!("{steps:?}")
    };
    assert_eq!(topic, OFFSETS, "the offset record ends the transaction");
    assert_eq!(
        *partition,
        Some(0),
        "the offset record goes to partition 0, which start-up reads"
    );
    assert_eq!(decode(value.as_deref()).flush_lsn, 100);
    assert_eq!(&steps[4..], [Step::Commit { ok: true }, Step::Confirm(100)]);
    assert_eq!(c.committed.flush_lsn, 100);
    log.check_confirms();
}

#[tokio::test]
async fn records_read_during_a_commit_wait_for_the_next_transaction() {
    let (mut c, mut log) = committer(2, offset_at(10));
    c.publish(vec![record("t", "a"), record("t", "b")])
        .await
        .unwrap();
    c.pending.flush_lsn = 100;
    c.close_if_full(&mut log.clone()).await.unwrap();
    // Read while the commit runs: held, and the position moves on.
    c.publish(vec![record("t", "c")]).await.unwrap();
    c.pending.flush_lsn = 200;
    assert_eq!(keys(&log.steps()), ["a", "b"], "c is held, not sent");
    assert!(
        c.batch_started().is_none(),
        "no batch ages while a commit runs"
    );

    c.finish_inflight(&mut log.clone()).await.unwrap();
    assert_eq!(
        log.confirms(),
        [100],
        "the first commit names where it started"
    );
    assert!(c.busy(), "the held record opened the next batch");
    c.commit_position(&mut log).await.unwrap();

    let committed = log.committed();
    assert_eq!(committed.len(), 2);
    assert_eq!(keys(&committed[0]), ["a", "b"]);
    assert_eq!(keys(&committed[1]), ["c"]);
    assert_eq!(log.confirms(), [100, 200]);
    log.check_confirms();
}

#[tokio::test]
async fn held_records_that_fill_a_batch_wait_for_the_running_commit() {
    let (mut c, mut log) = committer(2, offset_at(10));
    c.publish(vec![record("t", "a"), record("t", "b")])
        .await
        .unwrap();
    c.pending.flush_lsn = 100;
    c.close_if_full(&mut log.clone()).await.unwrap();
    c.publish(vec![record("t", "c"), record("t", "d")])
        .await
        .unwrap();
    c.pending.flush_lsn = 300;
    // Two held records fill a batch: the running commit is awaited, the held
    // records sent, and their (full) batch starts committing at once.
    c.close_if_full(&mut log.clone()).await.unwrap();
    assert_eq!(log.confirms(), [100]);
    assert!(c.committing());
    assert_eq!(keys(&log.steps()), ["a", "b", "c", "d"]);
    c.finish_inflight(&mut log).await.unwrap();
    assert_eq!(log.confirms(), [100, 300]);
    assert_eq!(log.committed().len(), 2);
    log.check_confirms();
}

#[tokio::test]
async fn a_failed_commit_confirms_nothing() {
    let (mut c, log) = committer(10, offset_at(10));
    c.tx.outcomes.push_back(false);
    c.publish(vec![record("t", "a")]).await.unwrap();
    c.pending.flush_lsn = 100;
    assert!(c.commit_position(&mut log.clone()).await.is_err());
    assert!(log.confirms().is_empty());
    assert!(log.committed().is_empty());
    assert_eq!(c.committed.flush_lsn, 10, "the committed position stays");
    c.abort().await;
    assert_eq!(log.steps().last(), Some(&Step::Abort));
    log.check_confirms();
}

#[tokio::test]
async fn a_commit_failing_behind_held_records_confirms_nothing_and_sends_nothing_more() {
    let (mut c, mut log) = committer(1, offset_at(10));
    c.tx.outcomes.push_back(false);
    c.publish(vec![record("t", "a")]).await.unwrap();
    c.pending.flush_lsn = 100;
    c.close_if_full(&mut log.clone()).await.unwrap();
    c.publish(vec![record("t", "b")]).await.unwrap();
    c.pending.flush_lsn = 200;
    assert!(c.close_if_full(&mut log).await.is_err());
    assert!(log.confirms().is_empty());
    assert_eq!(keys(&log.steps()), ["a"], "the held record is not sent");
    c.abort().await;
    assert!(log.committed().is_empty());
}

#[tokio::test]
async fn with_nothing_new_nothing_commits_and_a_moved_position_commits_alone() {
    let (mut c, mut log) = committer(10, offset_at(10));
    c.commit_position(&mut log.clone()).await.unwrap();
    assert!(log.steps().is_empty());
    // A heartbeat moved the position: an offset-only transaction.
    c.pending.flush_lsn = 50;
    c.commit_position(&mut log).await.unwrap();
    let committed = log.committed();
    assert_eq!(committed.len(), 1);
    assert_eq!(committed[0].len(), 1, "the offset record alone");
    assert_eq!(log.confirms(), [50]);
    log.check_confirms();
}

/// A source that writes its own part into every offset record.
struct PartSlot(super::memory::Log);

impl crate::seam::Slot for PartSlot {
    fn confirm(&mut self, flush_lsn: u64) {
        crate::seam::Slot::confirm(&mut self.0, flush_lsn);
    }

    fn offset_part(
        &self,
        offset: &SourceOffset,
    ) -> Result<Option<crate::offset::SourcePart>, crate::error::CaptureError> {
        Ok(Some(crate::offset::SourcePart::new(
            serde_json::json!({"test": {"flush": offset.flush_lsn}}),
        )))
    }
}

#[tokio::test]
async fn each_offset_record_carries_the_sources_part_of_its_position() {
    let (mut c, log) = committer(1, offset_at(10));
    let mut slot = PartSlot(log.clone());
    c.publish(vec![record("t", "a")]).await.unwrap();
    c.pending.flush_lsn = 100;
    c.close_if_full(&mut slot).await.unwrap();
    c.finish_inflight(&mut slot).await.unwrap();
    let steps = log.steps();
    let offsets: Vec<SourceOffset> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Send { topic, value, .. } if topic == OFFSETS => Some(decode(value.as_deref())),
            _ => None,
        })
        .collect();
    assert_eq!(offsets.len(), 1, "{steps:?}");
    let part = offsets[0].source.as_ref().expect("the source's part");
    assert_eq!(part.value()["test"]["flush"], 100);
}

/// Records are converted as they are published, before they are held or
/// counted: a batch's bytes and what waits behind a running commit are what
/// Kafka gets, so records that shrink (JSON with schemas to Avro, a
/// twentieth) neither close batches early nor stall reading behind a commit
/// as their JSON would.
#[tokio::test]
async fn records_are_held_and_counted_as_converted() {
    let (mut c, mut log) = committer(100, offset_at(10));
    c.limits.bytes = 1000;
    c.transactions().convert = Some(|r| r.value = Some(b"small".to_vec()));
    let big = |key| {
        let mut r = record("t", key);
        r.value = Some(vec![b' '; 600]);
        r
    };
    c.publish(vec![big("a"), big("b")]).await.unwrap();
    assert!(!c.batch_full(), "two converted records: 12 bytes of 1000");
    c.pending.flush_lsn = 100;
    c.start_commit(&log).await.unwrap();
    c.publish(vec![big("c"), big("d")]).await.unwrap();
    assert_eq!(c.held.bytes, 2 * (1 + 5), "held as converted");
    c.close_if_full(&mut log.clone()).await.unwrap();
    assert!(
        log.confirms().is_empty(),
        "the held records are small: the running commit is not awaited"
    );
    c.commit_position(&mut log).await.unwrap();
    let committed = log.committed();
    assert_eq!(keys(&committed[0]), ["a", "b"]);
    assert_eq!(keys(&committed[1]), ["c", "d"]);
    for step in committed.iter().flatten() {
        if let Step::Send { topic, value, .. } = step {
            if topic != OFFSETS {
                assert_eq!(value.as_deref(), Some(&b"small"[..]), "sent as converted");
            }
        }
    }
    log.check_confirms();
}
