//! The tracker's replay rules, alone and with the committer over the
//! in-memory Kafka: what is skipped, how events are numbered, and what a
//! restart after a failed commit publishes.

use super::committer::Committer;
use super::memory::{committer_on, keys, record, stored_offset, Log, MemoryKafka};
use super::tracker::Tracker;
use crate::offset::SourceOffset;

/// A commit time of 0 µs is PostgreSQL's epoch, 2000-01-01, in Unix ms.
const PG_EPOCH_MS: i64 = 946_684_800_000;

/// An offset after change `events` of the transaction committing at `commit_lsn`.
fn stored(commit_lsn: u64, events: u64, complete: bool, flush_lsn: u64) -> SourceOffset {
    SourceOffset {
        commit_lsn,
        events,
        complete,
        ..SourceOffset::start(flush_lsn)
    }
}

#[test]
fn a_new_transaction_is_published_whole_and_numbered_from_one() {
    let mut pending = stored(500, 3, true, 550);
    let mut t = Tracker::default();
    t.begin(&pending, 600, 7, 0).unwrap();
    let first = t.change(590).unwrap().expect("new: published");
    assert_eq!(
        (first.commit_lsn, first.lsn, first.event_seq, first.tx_id),
        (600, 590, 1, 7)
    );
    t.use_ordinals(1);
    t.advance(&mut pending);
    assert_eq!(
        (pending.commit_lsn, pending.events, pending.complete),
        (600, 1, false)
    );
    assert_eq!(pending.flush_lsn, 550, "not confirmable before its commit");
    assert_eq!(t.change(595).unwrap().unwrap().event_seq, 2);
    t.use_ordinals(1);
    t.advance(&mut pending);
    t.commit(&mut pending, 600, 650).unwrap();
    assert_eq!(
        (pending.commit_lsn, pending.events, pending.complete),
        (600, 2, true)
    );
    assert_eq!((pending.flush_lsn, pending.tx_id), (650, 7));
    assert!(!t.in_tx());
}

#[test]
fn a_transaction_already_in_kafka_is_skipped_and_only_its_end_is_new() {
    for commit_lsn in [500, 400] {
        let mut pending = stored(500, 3, true, 550);
        let mut t = Tracker::default();
        t.begin(&pending, commit_lsn, 7, 0).unwrap();
        for lsn in 0..5 {
            assert!(t.change(lsn).unwrap().is_none(), "{commit_lsn}: skipped");
        }
        t.commit(&mut pending, commit_lsn, 560).unwrap();
        assert_eq!(pending, stored(500, 3, true, 560));
    }
    // Older than the confirmed position (a heartbeat confirmed past it).
    let pending = stored(400, 1, true, 550);
    let mut t = Tracker::default();
    t.begin(&pending, 450, 7, 0).unwrap();
    assert!(t.change(440).unwrap().is_none());
}

#[test]
fn a_replay_resumes_mid_transaction_by_change_count_with_the_same_ordinals() {
    let mut pending = stored(500, 3, false, 450);
    let mut t = Tracker::default();
    t.begin(&pending, 500, 7, 0).unwrap();
    // The three changes in Kafka: skipped, their ordinals counted (the
    // second was a primary-key change: a delete and a create).
    for ordinals in [1, 2, 1] {
        assert!(t.change(480).unwrap().is_none());
        t.use_ordinals(ordinals);
    }
    let fourth = t.change(490).unwrap().expect("the fourth change is new");
    assert_eq!(fourth.event_seq, 5);
    t.use_ordinals(1);
    t.advance(&mut pending);
    assert_eq!((pending.events, pending.complete), (4, false));
    t.commit(&mut pending, 500, 510).unwrap();
    assert_eq!(
        pending,
        SourceOffset {
            tx_id: 7,
            ts_ms: PG_EPOCH_MS,
            ..stored(500, 4, true, 510)
        }
    );
}

#[test]
fn protocol_violations_are_errors() {
    let mut pending = SourceOffset::start(0);
    let mut t = Tracker::default();
    assert!(t.change(1).is_err(), "change outside a transaction");
    assert!(t.commit(&mut pending, 5, 6).is_err(), "commit outside");
    t.begin(&pending, 5, 1, 0).unwrap();
    assert!(t.begin(&pending, 9, 2, 0).is_err(), "nested begin");
    assert!(
        t.message(&pending, 3, 0).is_err(),
        "non-transactional inside"
    );
    assert!(t.commit(&mut pending, 6, 7).is_err(), "commit LSN differs");
}

#[test]
fn a_non_transactional_message_is_a_one_change_transaction_at_its_lsn() {
    let mut pending = stored(500, 3, true, 550);
    let t = Tracker::default();
    assert!(t.message(&pending, 540, 0).unwrap().is_none(), "in Kafka");
    let at = t.message(&pending, 600, 42).unwrap().expect("new");
    assert_eq!((at.commit_lsn, at.event_seq, at.commit_ts_ms), (600, 1, 42));
    Tracker::message_published(&mut pending, &at);
    assert_eq!(
        (pending.commit_lsn, pending.events, pending.complete),
        (600, 1, true)
    );
    assert_eq!((pending.flush_lsn, pending.ts_ms), (600, 42));
}

/// Streams one source transaction of `changes` one-event changes through
/// tracker and committer as the pipeline does; each record's key names its
/// transaction and event ordinal.
async fn stream_tx(
    t: &mut Tracker,
    c: &mut Committer<MemoryKafka>,
    log: &Log,
    commit_lsn: u64,
    changes: u64,
) -> Result<(), crate::error::CaptureError> {
    t.begin(c.position(), commit_lsn, 7, 0)?;
    for i in 0..changes {
        let Some(at) = t.change(commit_lsn - changes + i)? else {
            t.use_ordinals(1);
            continue;
        };
        c.publish(vec![record("t", &format!("{commit_lsn}/{}", at.event_seq))])
            .await?;
        t.use_ordinals(1);
        t.advance(c.stage());
        c.close_if_full(&mut log.clone()).await?;
    }
    t.commit(c.stage(), commit_lsn, commit_lsn + 10)?;
    c.close_if_full(&mut log.clone()).await
}

#[tokio::test]
async fn a_source_transaction_split_over_kafka_transactions_replays_exactly_once() {
    let log = Log::default();
    let mut c = committer_on(&log, 2, SourceOffset::start(100));
    c.transactions().outcomes.extend([true, false]);
    let mut t = Tracker::default();
    // Five changes, two per Kafka transaction: the second commit fails.
    let failed = stream_tx(&mut t, &mut c, &log, 1000, 5).await;
    let failed = match failed {
        Ok(()) => c.commit_position(&mut log.clone()).await,
        e => e,
    };
    assert!(failed.is_err());
    c.abort().await;
    let offset = stored_offset(&log).expect("the first commit landed");
    assert_eq!(
        (offset.commit_lsn, offset.events, offset.complete),
        (1000, 2, false)
    );
    // The slot is not confirmed into a transaction Kafka holds only part of.
    assert_eq!(log.confirms(), [100]);

    // The restart resumes from the stored offset; the stream resends the transaction.
    let mut c = committer_on(&log, 2, offset);
    let mut t = Tracker::default();
    stream_tx(&mut t, &mut c, &log, 1000, 5).await.unwrap();
    c.commit_position(&mut log.clone()).await.unwrap();

    let seen: Vec<String> = log.committed().iter().flat_map(|tx| keys(tx)).collect();
    assert_eq!(seen, ["1000/1", "1000/2", "1000/3", "1000/4", "1000/5"]);
    let last = stored_offset(&log).unwrap();
    assert_eq!(
        last,
        SourceOffset {
            tx_id: 7,
            ts_ms: PG_EPOCH_MS,
            ..stored(1000, 5, true, 1010)
        }
    );
    assert_eq!(log.confirms().last(), Some(&1010));
    log.check_confirms();
}
