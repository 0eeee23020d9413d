//! A snapshot chunk's watermarks in a binlog, which carries no message a
//! reader could write: the chunk read ([`super::chunks`]) finds the binlog
//! position C its read view is exactly consistent with and registers the
//! chunk's low and high watermark at C on this board; the stream hands
//! them out where C is in its order.
//!
//! ```text
//!  chunk read: read view + C ──register(C)──▶ board ◀──due?── MySqlStream
//!  stream:  .. Commit{end ≤ C} [low, high at C-1] Begin{commit ≥ C} ..
//! ```
//!
//! The rule it keeps: a watermark at C is handed out outside any
//! transaction, after every transaction that ends at or before C and
//! before every transaction that starts at or after C; once the stream has
//! handed out everything before C it is handed out at once, so an idle
//! server does not hold it back. It carries the order key C - 1: no
//! transaction starts there (each one before C starts further back), so
//! the chunk's rows, versioned by it, sort after every change the read
//! saw and before every change it did not. Sans I/O, so the decisions are
//! unit-tested.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::envelope::{EventFacts, SharedFacts};
use super::history::ShapeFacts;
use super::position::Position;

use crate::snapshot::{watermark_content, Watermark, WATERMARK_PREFIX};

/// A watermark registered and not handed out yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    /// The order key of the binlog position C it stands at.
    at: u64,
    /// C's file and offset, for the `source` block of the chunk's rows.
    file: String,
    pos: u64,
    content: String,
}

/// The watermarks the chunk reads registered, shared with the stream.
/// Registered in read order at non-decreasing positions (each chunk's
/// read view is taken after the one before it), so they are handed out in
/// that order.
#[derive(Debug, Clone, Default)]
pub struct WatermarkBoard {
    pending: Arc<Mutex<VecDeque<Pending>>>,
    /// The `source` block facts of the chunk rows encoded next: the
    /// pipeline publishes a chunk's rows when its high watermark is
    /// handed out, before it asks for the next event, so each chunk's rows
    /// name its own C (the encoder of a table's chunks is built once).
    facts: SharedFacts,
    /// The failover epoch of the stream's positions (`offset.rs`): a chunk's
    /// position C, read from the server, is in it.
    epoch: u32,
    /// The shape facts as of what the stream handed out last: a chunk's
    /// rows go out when its high watermark is handed out, so their columns
    /// are numbered as the stream's rows at C are, DDL passed since the
    /// table's last TABLE_MAP included.
    numbering: SharedNumbering,
}

/// The shape facts as of the stream's last handed-out event.
pub type SharedNumbering = Arc<Mutex<Arc<ShapeFacts>>>;

/// Where the stream stands: what it has handed out to the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handed {
    /// The order key everything before which was handed out (the last
    /// commit's `end`, keepalive, or where the stream opened).
    pub upto: u64,
    /// A transaction was begun and not committed yet.
    pub in_tx: bool,
}

impl Handed {
    pub fn at(upto: u64) -> Self {
        Self { upto, in_tx: false }
    }

    /// Notes that `event` was handed out.
    pub fn note(&mut self, event: Next) {
        match event {
            Next::Begin(_) => self.in_tx = true,
            Next::Commit(end) => {
                self.in_tx = false;
                self.upto = self.upto.max(end);
            }
            Next::KeepAlive(position) => self.upto = self.upto.max(position),
            Next::Other => {}
        }
    }
}

/// The stream's next event as far as the watermarks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A transaction starting at this order key.
    Begin(u64),
    /// A transaction's commit, the next one starting at `end`.
    Commit(u64),
    /// Everything before this order key was sent (a transaction without
    /// rows ended there, or a file's header events).
    KeepAlive(u64),
    /// Anything else (a table, a change).
    Other,
}

/// Whether a watermark at order key `at` goes out before `next` (`None`:
/// nothing is waiting to be handed out), the stream standing at `handed`.
pub fn is_due(at: u64, handed: Handed, next: Option<Next>) -> bool {
    if handed.in_tx {
        return false;
    }
    handed.upto >= at
        || match next {
            Some(Next::Begin(start)) => start >= at,
            // A keepalive past C: whatever ended there started at or after C.
            Some(Next::KeepAlive(position)) => position > at,
            _ => false,
        }
}

impl WatermarkBoard {
    /// The same board for a stream reading in failover epoch `epoch`.
    pub fn in_epoch(mut self, epoch: u32) -> Self {
        self.epoch = epoch;
        self
    }

    /// The failover epoch of the stream's positions.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Registers chunk `id`'s low and high watermark at binlog position
    /// `c` (file and offset), whose order key is `at`.
    pub fn register(&self, at: u64, c: &Position, id: &str) {
        let mut board = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for side in [Watermark::Low, Watermark::High] {
            board.push_back(Pending {
                at,
                file: c.file.clone(),
                pos: c.pos,
                content: watermark_content(id, side),
            });
        }
    }

    /// The `source` block facts every chunk table's encoder reads: those of
    /// the chunk whose watermark was handed out last.
    pub fn chunk_facts(&self) -> SharedFacts {
        Arc::clone(&self.facts)
    }

    /// A board whose chunk tables are numbered by `numbering` (the
    /// stream's: [`super::stream::StreamAdapter::numbering`]).
    pub fn new(numbering: SharedNumbering) -> Self {
        Self {
            numbering,
            ..Self::default()
        }
    }

    /// The shape facts every chunk table is numbered by
    /// ([`Self::set_numbering`]).
    pub fn numbering(&self) -> SharedNumbering {
        Arc::clone(&self.numbering)
    }

    /// The stream handed out the event after which `facts` hold.
    pub fn set_numbering(&self, facts: Arc<ShapeFacts>) {
        *self
            .numbering
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = facts;
    }

    /// The next watermark due before `next` ([`is_due`]), as the stream
    /// event that carries it: a message outside any transaction at C - 1.
    pub(crate) fn take_due<T, N>(
        &self,
        handed: Handed,
        next: Option<Next>,
    ) -> Option<crate::change::StreamEvent<T, N>> {
        let mut board = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let front = board.front()?;
        if !is_due(front.at, handed, next) {
            return None;
        }
        let due = board.pop_front()?;
        // A snapshot row's block: the read view's position, no server,
        // GTID or thread (as the initial snapshot's rows).
        *self.facts.lock().unwrap_or_else(PoisonError::into_inner) = EventFacts {
            ts_ms: oncely_core::clock::now_ms(),
            file: due.file.clone(),
            pos: due.pos,
            ..EventFacts::default()
        };
        Some(crate::change::StreamEvent::Message {
            at: due.at.saturating_sub(1),
            prefix: WATERMARK_PREFIX.to_owned(),
            content: Bytes::from(due.content.into_bytes()),
        })
    }

    /// Watermarks registered and not handed out yet.
    pub fn len(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::StreamEvent;
    use crate::snapshot::parse_watermark;

    type Event = StreamEvent<(), ()>;

    /// Order keys of binlog positions: file sequence << 32 | offset.
    fn key(file: u64, pos: u64) -> u64 {
        file << 32 | pos
    }

    fn watermark(e: Option<Event>) -> Option<(u64, String, Watermark)> {
        match e? {
            StreamEvent::Message {
                at,
                prefix,
                content,
            } => {
                assert_eq!(prefix, WATERMARK_PREFIX);
                let (id, side) = parse_watermark(&content).expect("a watermark");
                Some((at, id.to_owned(), side))
            }
            other => panic!("not a message: {other:?}"),
        }
    }

    #[test]
    fn a_watermark_waits_for_the_transactions_before_its_position() {
        let c = key(2, 1000);
        // The stream handed out up to 500: the transaction at 500 is before C.
        let handed = Handed::at(key(2, 500));
        assert!(!is_due(c, handed, None));
        assert!(!is_due(c, handed, Some(Next::Begin(key(2, 500)))));
        assert!(!is_due(c, handed, Some(Next::KeepAlive(key(2, 1000)))));
        // The next transaction starts at C: the watermark goes before it.
        assert!(is_due(c, handed, Some(Next::Begin(c))));
        assert!(is_due(c, handed, Some(Next::Begin(key(2, 1200)))));
        // A transaction without rows that ended past C started at or after it.
        assert!(is_due(c, handed, Some(Next::KeepAlive(key(2, 1200)))));
    }

    #[test]
    fn a_watermark_the_stream_has_reached_goes_out_at_once() {
        let c = key(2, 1000);
        // Idle: the last commit ended at C, nothing else to hand out.
        assert!(is_due(c, Handed::at(c), None));
        // Already past it (the stream read on before the read view ended).
        assert!(is_due(c, Handed::at(key(2, 1400)), None));
    }

    #[test]
    fn never_inside_a_transaction() {
        let c = key(2, 1000);
        let mut handed = Handed::at(key(2, 500));
        handed.note(Next::Begin(key(2, 500)));
        assert!(!is_due(c, handed, Some(Next::Other)));
        assert!(!is_due(c, handed, Some(Next::Commit(c))));
        handed.note(Next::Commit(c));
        assert_eq!(handed, Handed::at(c));
        assert!(is_due(c, handed, None));
        // A transaction begun at C is handed out after the watermark.
        handed.note(Next::Begin(c));
        assert!(!is_due(c, handed, Some(Next::Other)));
    }

    #[test]
    fn across_a_binlog_rotation() {
        // The last transaction of file 2 ended at 9000; the snapshot's
        // position is after file 3's header events (a rotation, no write
        // since). The header's keepalive brings the stream to C.
        let c = key(3, 379);
        let mut handed = Handed::at(key(2, 9000));
        assert!(!is_due(c, handed, None));
        handed.note(Next::KeepAlive(key(3, 379)));
        assert!(is_due(c, handed, None));
        // A position at the end of file 2: due as soon as its last commit
        // was handed out, before anything of file 3.
        let end_of_2 = key(2, 9000);
        assert!(is_due(end_of_2, Handed::at(key(2, 9000)), None));
        assert!(is_due(
            end_of_2,
            Handed::at(key(2, 8000)),
            Some(Next::Begin(key(3, 379)))
        ));
        assert!(is_due(
            end_of_2,
            Handed::at(key(2, 8000)),
            Some(Next::KeepAlive(key(3, 379)))
        ));
    }

    #[test]
    fn chunks_go_out_in_order_low_before_high_at_c_minus_one() {
        let board = WatermarkBoard::default();
        let c1 = key(2, 1000);
        let c2 = key(2, 3000);
        board.register(c1, &Position::at("binlog.000002", 1000), "c1");
        board.register(c2, &Position::at("binlog.000002", 3000), "c2");
        assert_eq!(board.len(), 4);
        let handed = Handed::at(key(2, 500));
        assert_eq!(watermark(board.take_due(handed, None)), None);
        let before = Some(Next::Begin(key(2, 2000)));
        assert_eq!(
            watermark(board.take_due(handed, before)),
            Some((c1 - 1, "c1".into(), Watermark::Low))
        );
        assert_eq!(
            watermark(board.take_due(handed, before)),
            Some((c1 - 1, "c1".into(), Watermark::High))
        );
        // The chunk's rows, encoded now, name its position.
        let facts = board.chunk_facts();
        let now = facts.lock().unwrap().clone();
        assert_eq!((now.file.as_str(), now.pos), ("binlog.000002", 1000));
        // The second chunk's position is after the transaction at 2000.
        assert_eq!(watermark(board.take_due(handed, before)), None);
        let handed = Handed::at(key(2, 3000));
        assert_eq!(
            watermark(board.take_due(handed, None)),
            Some((c2 - 1, "c2".into(), Watermark::Low))
        );
        assert_eq!(
            watermark(board.take_due(handed, None)),
            Some((c2 - 1, "c2".into(), Watermark::High))
        );
        assert!(board.is_empty());
        let now = facts.lock().unwrap().clone();
        assert_eq!((now.pos, now.server_id, now.gtid), (3000, 0, None));
    }
}
