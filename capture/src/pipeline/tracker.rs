//! Where the stream stands inside source transactions: which changes are
//! already in Kafka (replayed after a restart, skipped), the position and
//! event ordinal of each new one, and how far the offset moves. Pure state:
//! no I/O, so the replay rules are unit-tested here.

use crate::envelope::{SnapshotMarker, SourcePosition};
use crate::error::CaptureError;
use crate::offset::{Replay, SourceOffset};
use oncely_core::wire::format_lsn;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// The source transaction being read.
struct SourceTx {
    commit_lsn: u64,
    xid: u32,
    commit_ts_ms: i64,
    /// Changes received so far (every change counts, captured or not, so the
    /// count is the same on every replay).
    seen: u64,
    /// Changes already in Kafka: skip while `seen <= skip`.
    skip: u64,
    /// Event ordinals used so far (`source.event_seq` of the last event):
    /// one per change, two for a primary-key update (its delete and its
    /// create), one per captured table of a truncate. Counted for skipped
    /// changes too, so every replay numbers the same events the same way.
    seq: u64,
}

/// The open source transaction, if any.
#[derive(Default)]
pub(super) struct Tracker {
    tx: Option<SourceTx>,
}

impl Tracker {
    /// Whether a source transaction is open (between Begin and Commit).
    pub(super) fn in_tx(&self) -> bool {
        self.tx.is_some()
    }

    /// The xid of the open source transaction, if any.
    pub(super) fn xid(&self) -> Option<u32> {
        self.tx.as_ref().map(|tx| tx.xid)
    }

    /// A Begin: how much of the transaction committing at `commit_lsn` is
    /// already in Kafka, from the position `pending` reached.
    pub(super) fn begin(
        &mut self,
        pending: &SourceOffset,
        commit_lsn: u64,
        xid: u32,
        commit_time_micros: i64,
    ) -> Result<(), CaptureError> {
        if let Some(open) = &self.tx {
            return Err(CaptureError::Protocol(format!(
                "Begin of transaction {xid} inside transaction {}",
                open.xid
            )));
        }
        let skip = match pending.replay(commit_lsn) {
            Replay::SkipAll => u64::MAX,
            Replay::SkipFirst(n) => n,
            Replay::PublishAll => 0,
        };
        tracing::trace!(commit_lsn = %format_lsn(commit_lsn), xid, skip, "transaction");
        self.tx = Some(SourceTx {
            commit_lsn,
            xid,
            commit_ts_ms: (commit_time_micros + PG_EPOCH_OFFSET_US) / 1000,
            seen: 0,
            skip,
            seq: 0,
        });
        Ok(())
    }

    /// A change at `lsn` inside the open transaction: counted; `None` when it
    /// is already in Kafka, else the position of its first event.
    pub(super) fn change(&mut self, lsn: u64) -> Result<Option<SourcePosition>, CaptureError> {
        let Some(tx) = self.tx.as_mut() else {
            return Err(CaptureError::Protocol(
                "row change outside a transaction".into(),
            ));
        };
        tx.seen += 1;
        if tx.seen <= tx.skip {
            return Ok(None);
        }
        Ok(Some(SourcePosition {
            tx_id: tx.xid,
            lsn,
            commit_lsn: tx.commit_lsn,
            event_seq: tx.seq + 1,
            commit_ts_ms: tx.commit_ts_ms,
            snapshot: SnapshotMarker::False,
        }))
    }

    /// Counts `n` event ordinals of the open source transaction as used.
    pub(super) fn use_ordinals(&mut self, n: u64) {
        if let Some(tx) = self.tx.as_mut() {
            tx.seq += n;
        }
    }

    /// Moves `pending` to the last change counted (the transaction not yet
    /// complete); snapshot progress and known tables stay.
    pub(super) fn advance(&self, pending: &mut SourceOffset) {
        if let Some(tx) = &self.tx {
            set_position(
                pending,
                tx.commit_lsn,
                tx.seen,
                false,
                tx.xid,
                tx.commit_ts_ms,
            );
        }
    }

    /// A Commit: the transaction is complete, and the slot may be confirmed
    /// up to its end once Kafka holds it.
    pub(super) fn commit(
        &mut self,
        pending: &mut SourceOffset,
        commit_lsn: u64,
        end_lsn: u64,
    ) -> Result<(), CaptureError> {
        let Some(tx) = self.tx.take() else {
            return Err(CaptureError::Protocol(format!(
                "Commit at {} outside a transaction",
                format_lsn(commit_lsn)
            )));
        };
        if tx.commit_lsn != commit_lsn {
            return Err(CaptureError::Protocol(format!(
                "Commit LSN {} differs from its Begin's {}",
                format_lsn(commit_lsn),
                format_lsn(tx.commit_lsn)
            )));
        }
        // Skipped whole: already in Kafka, only its end is new.
        if tx.skip != u64::MAX {
            set_position(pending, commit_lsn, tx.seen, true, tx.xid, tx.commit_ts_ms);
        }
        pending.flush_lsn = pending.flush_lsn.max(end_lsn);
        Ok(())
    }

    /// `pg_logical_emit_message(false, ..)` stands alone at its own LSN, so it
    /// is positioned like a one-change transaction committed there: `None`
    /// when Kafka holds it already.
    pub(super) fn message(
        &self,
        pending: &SourceOffset,
        lsn: u64,
        now_ms: i64,
    ) -> Result<Option<SourcePosition>, CaptureError> {
        if self.tx.is_some() {
            return Err(CaptureError::Protocol(
                "non-transactional message inside a transaction".into(),
            ));
        }
        if pending.replay(lsn) != Replay::PublishAll {
            return Ok(None);
        }
        Ok(Some(SourcePosition {
            tx_id: 0,
            lsn,
            commit_lsn: lsn,
            event_seq: 1,
            commit_ts_ms: now_ms,
            snapshot: SnapshotMarker::False,
        }))
    }

    /// The message at `at` ([`Tracker::message`]) is published: `pending` moves past it.
    pub(super) fn message_published(pending: &mut SourceOffset, at: &SourcePosition) {
        set_position(pending, at.lsn, 1, true, 0, at.commit_ts_ms);
        pending.flush_lsn = pending.flush_lsn.max(at.lsn);
    }
}

/// Moves `p` to change `events` of the transaction committing at `commit_lsn`.
fn set_position(
    p: &mut SourceOffset,
    commit_lsn: u64,
    events: u64,
    complete: bool,
    tx_id: u32,
    ts_ms: i64,
) {
    p.commit_lsn = commit_lsn;
    p.events = events;
    p.complete = complete;
    p.tx_id = tx_id;
    p.ts_ms = ts_ms;
}
