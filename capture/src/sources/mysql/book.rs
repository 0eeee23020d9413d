//! Which binlog [`Position`] each order key of the stream is, so that every
//! offset record the committer writes carries the MySQL part of its own
//! position ([`MySqlOffset`]): a transaction's start (`flush_lsn` of a
//! complete record) and the last change of an open transaction
//! (`commit_lsn` of a partial one, with its event and row counts).
//!
//! The stream notes each position as it moves a change, commit or
//! keepalive; the committer only names positions the stream handed out,
//! and confirmations prune what lies before the committed `flush_lsn`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::checks::ServerIdentity;
use super::history::ShapeFacts;
use super::offset::{order_key, MySqlOffset};
use super::position::Position;
use crate::error::CaptureError;
use crate::offset::{SourceOffset, SourcePart};

/// Binlog positions by order key.
#[derive(Debug, Clone)]
pub struct PositionBook {
    server: ServerIdentity,
    /// Transaction starts (event and row 0), with the shape facts as of
    /// each.
    starts: BTreeMap<u64, (Position, Arc<ShapeFacts>)>,
    /// The event and row counts of the last change moved of each
    /// transaction, by its start's key (a change is noted per row, so
    /// without copying its position).
    inside: BTreeMap<u64, (u64, u64)>,
    /// The shape facts as of the next transaction start noted.
    facts: Arc<ShapeFacts>,
    /// After a failover: the opening key, whose position is in the old
    /// server's binlog (the first transaction keeps that key, see
    /// `offset.rs`), with that server.
    origin: Option<(u64, ServerIdentity)>,
}

impl PositionBook {
    /// A book of `server`'s binlog from `from` (where the stream opens),
    /// with the shape facts as of `from`.
    pub fn new(
        server: ServerIdentity,
        from: &Position,
        facts: ShapeFacts,
    ) -> Result<Self, CaptureError> {
        let mut book = Self {
            server,
            starts: BTreeMap::new(),
            inside: BTreeMap::new(),
            facts: Arc::new(facts),
            origin: None,
        };
        book.note_start(from.clone())?;
        Ok(book)
    }

    /// A book of a failover: `from` (where the new server's stream opens,
    /// found by GTIDs) is a position of `stored_server`'s binlog, and
    /// records naming its key say so; every other position is `server`'s.
    pub fn taking_over(
        server: ServerIdentity,
        stored_server: ServerIdentity,
        from: &Position,
        facts: ShapeFacts,
    ) -> Result<Self, CaptureError> {
        let mut book = Self::new(server, from, facts)?;
        book.origin = Some((key(from)?, stored_server));
        Ok(book)
    }

    /// A transaction starts at `position` (also: the stream moved past
    /// everything before it).
    pub fn note_start(&mut self, position: Position) -> Result<u64, CaptureError> {
        let position = Position {
            event: 0,
            row: 0,
            ..position
        };
        let key = key(&position)?;
        self.starts.insert(key, (position, Arc::clone(&self.facts)));
        Ok(key)
    }

    /// The shape facts changed (DDL, a table's first TABLE_MAP): these are
    /// the facts as of the next transaction start noted.
    pub fn set_facts(&mut self, facts: Arc<ShapeFacts>) {
        self.facts = facts;
    }

    /// A change of the transaction starting at key `start`, at `event`
    /// and `row` past its start.
    pub fn note_change(&mut self, start: u64, event: u64, row: u64) {
        self.inside.insert(start, (event, row));
    }

    /// Committed up to `flush`: positions before it are never named again.
    pub fn confirm(&mut self, flush: u64) {
        self.starts = self.starts.split_off(&flush);
        self.inside = self.inside.split_off(&flush);
    }

    /// The earliest transaction start a committed offset record may still
    /// name (where a restart would resume): confirmations prune the rest.
    pub fn resume_from(&self) -> Option<&Position> {
        self.starts.first_key_value().map(|(_, (p, _))| p)
    }

    /// The MySQL part of offset record `offset`.
    pub fn part(&self, offset: &SourceOffset) -> Result<SourcePart, CaptureError> {
        let found = if offset.complete || offset.events == 0 {
            self.starts
                .get(&offset.flush_lsn)
                .map(|(p, f)| (p.clone(), f))
        } else {
            // A partial record resumes from its transaction's start, so
            // with the facts as of that start.
            self.inside
                .get(&offset.commit_lsn)
                .zip(self.starts.get(&offset.commit_lsn))
                .map(|(&(event, row), (start, f))| {
                    let inside = Position {
                        event,
                        row,
                        ..start.clone()
                    };
                    (inside, f)
                })
        };
        let Some((position, facts)) = found else {
            return Err(CaptureError::Protocol(format!(
                "no binlog position is known for the offset record (commit {}, {} events, complete {}, flush {}): the stream did not hand out that position",
                offset.commit_lsn, offset.events, offset.complete, offset.flush_lsn
            )));
        };
        // Every table's facts are kept: the stream reads every database
        // (the router drops what is not captured), and the facts of a
        // table are as small as its tinyint(1) and JSON columns' names.
        let key = if offset.complete || offset.events == 0 {
            offset.flush_lsn
        } else {
            offset.commit_lsn
        };
        let server = match &self.origin {
            Some((origin, stored)) if *origin == key => stored.clone(),
            _ => self.server.clone(),
        };
        let part = MySqlOffset::new(position, server, facts, |_, _| true);
        let mut stamped = offset.clone();
        part.store(&mut stamped)
            .map_err(|e| CaptureError::Protocol(e.to_string()))?;
        stamped
            .source
            .ok_or_else(|| CaptureError::Protocol("the MySQL offset part was not written".into()))
    }
}

fn key(position: &Position) -> Result<u64, CaptureError> {
    order_key(position).map_err(|e| CaptureError::Protocol(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ServerIdentity {
        ServerIdentity { id: 1, uuid: None }
    }

    fn at(pos: u64, event: u64, row: u64) -> Position {
        Position {
            event,
            row,
            ..Position::at("mariadb-bin.000002", pos)
        }
    }

    const SEQ: u64 = 2 << 32;

    #[test]
    fn a_complete_record_names_the_next_start_and_a_partial_one_its_last_change() {
        let mut book = PositionBook::new(server(), &at(4, 0, 0), ShapeFacts::default()).unwrap();
        let start = book.note_start(at(100, 0, 0)).unwrap();
        assert_eq!(start, SEQ | 100);
        book.note_change(start, 2, 3);
        book.note_start(at(900, 0, 0)).unwrap();

        let partial = SourceOffset {
            commit_lsn: SEQ | 100,
            events: 3,
            complete: false,
            ..SourceOffset::start(SEQ | 4)
        };
        let mut stored = partial.clone();
        stored.source = Some(book.part(&partial).unwrap());
        let read = MySqlOffset::read(&stored).expect("agrees with its order keys");
        assert_eq!(read.position, at(100, 2, 3));
        assert_eq!(read.resume_from(), at(100, 0, 0));

        let complete = SourceOffset {
            commit_lsn: SEQ | 100,
            events: 3,
            complete: true,
            ..SourceOffset::start(SEQ | 900)
        };
        let mut stored = complete.clone();
        stored.source = Some(book.part(&complete).unwrap());
        assert_eq!(MySqlOffset::read(&stored).unwrap().position, at(900, 0, 0));

        // Where the stream opened, before any event.
        assert!(book.part(&SourceOffset::start(SEQ | 4)).is_ok());
    }

    #[test]
    fn a_position_the_stream_did_not_hand_out_or_pruned_is_an_error() {
        let mut book = PositionBook::new(server(), &at(4, 0, 0), ShapeFacts::default()).unwrap();
        book.note_start(at(900, 0, 0)).unwrap();
        let err = book.part(&SourceOffset::start(SEQ | 500)).unwrap_err();
        assert!(err.to_string().contains("no binlog position"), "{err}");
        book.confirm(SEQ | 900);
        assert!(book.part(&SourceOffset::start(SEQ | 4)).is_err());
        assert!(book.part(&SourceOffset::start(SEQ | 900)).is_ok());
    }

    #[test]
    fn a_restart_resumes_from_the_last_confirmed_start() {
        let mut book = PositionBook::new(server(), &at(4, 0, 0), ShapeFacts::default()).unwrap();
        assert_eq!(book.resume_from(), Some(&at(4, 0, 0)), "before any commit");
        let start = book.note_start(at(100, 0, 0)).unwrap();
        book.note_change(start, 1, 1);
        book.note_start(at(900, 0, 0)).unwrap();
        assert_eq!(book.resume_from(), Some(&at(4, 0, 0)), "nothing confirmed");
        book.confirm(SEQ | 100);
        assert_eq!(book.resume_from(), Some(&at(100, 0, 0)));
        book.confirm(SEQ | 900);
        assert_eq!(book.resume_from(), Some(&at(900, 0, 0)));
    }

    #[test]
    fn a_record_carries_the_facts_as_of_the_start_it_resumes_from() {
        let facts: ShapeFacts = serde_json::from_value(serde_json::json!([
            {"database": "shop", "table": "orders", "tinyint1": ["flag"]}
        ]))
        .unwrap();
        let mut book = PositionBook::new(server(), &at(4, 0, 0), ShapeFacts::default()).unwrap();
        let first = book.note_start(at(100, 0, 0)).unwrap();
        book.note_change(first, 2, 1);
        // The transaction's DDL changed the facts; its commit says so.
        book.set_facts(Arc::new(facts.clone()));
        book.note_start(at(900, 0, 0)).unwrap();

        let read = |offset: SourceOffset| {
            let mut stored = offset.clone();
            stored.source = Some(book.part(&offset).unwrap());
            MySqlOffset::read(&stored).unwrap().facts
        };
        let partial = SourceOffset {
            commit_lsn: first,
            events: 1,
            complete: false,
            ..SourceOffset::start(SEQ | 4)
        };
        assert_eq!(
            read(partial),
            ShapeFacts::default(),
            "as of its start, before the DDL"
        );
        let complete = SourceOffset {
            complete: true,
            ..SourceOffset::start(SEQ | 900)
        };
        assert_eq!(read(complete), facts);
    }
}
