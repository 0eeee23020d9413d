//! The MySQL source's part of the offset record, and the `u64` order key
//! the core compares its transactions by.
//!
//! ```text
//!  offset record (core fields)              source part (only this module reads it)
//!  commit_lsn  order key of the last   ◀─┐  {"mysql": {
//!              transaction published     ├─ "position": {file, pos, gtids, event, row},
//!  events      its changes in Kafka      │  "server":   {"id": 1, "uuid": ..},
//!  flush_lsn   order key of the next   ◀─┘  "facts":    [captured tables' shape facts],
//!              transaction's start          "snapshot": {"db.table": [last key cells]}}}
//! ```
//!
//! The invariant: the part and the core's fields are written together, in
//! the same record of the same Kafka transaction, and agree: the order key
//! of the stored position is `commit_lsn` while a transaction is partly
//! published (`event`/`row` past its start), else `flush_lsn`. The facts
//! are those as of the position, so a restart anywhere (also between a DDL
//! and the next row event) decodes with the shape each row was written
//! with.
//!
//! **Order key**: `epoch << 55 | file sequence << 32 | offset` of the
//! transaction's first event. Within one server's binlog it orders
//! transaction starts exactly as [`Position`] does, and with the changes
//! published (`event`, `row`, which the core counts as `events`) every
//! position; a rotation (`FLUSH BINARY LOGS`, `max_binlog_size`) raises the
//! sequence, so the key grows across it. The offset fits 32 bits (an event
//! header's position is 32 bits, so `max_binlog_cache_size` is documented
//! to stay at 4 GiB), the sequence 23 bits (8,388,607 files), the epoch 8.
//! A position beyond any is refused, never wrapped.
//!
//! **Failover rule**: a promoted replica's files and offsets start over,
//! so its keys would go backwards and sinks, which version rows by them,
//! would drop its changes as stale. The part names the server; another
//! server is taken over only by GTIDs (the stored set contained in the
//! server's), and every position read from it carries the **epoch** one
//! up (`Position::epoch`, absent = 0 in older records), the key's top
//! bits: every key after a failover is above every key before it. The
//! first transaction the new server sends (the one the stored GTIDs stop
//! before, possibly partly published) keeps the stored key, so the core
//! skips exactly its published changes; the next one's start is the first
//! key of the new epoch. Without GTIDs another server is refused
//! ([`MySqlOffset::check`]), naming the fix.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cell::Cell;
use super::checks::{ServerFacts, ServerIdentity};
use super::error::MySqlSourceError;
use super::history::ShapeFacts;
use super::position::{Gtids, Position};
use crate::offset::{SourceOffset, SourcePart};

/// Bits of the order key that hold the offset inside a binlog file.
const OFFSET_BITS: u32 = 32;
/// Bits of the file's sequence number, above the offset.
const SEQUENCE_BITS: u32 = 23;
/// Where the failover epoch starts: above the sequence, below the sign
/// bit (sinks keep versions as signed 64-bit numbers).
const EPOCH_SHIFT: u32 = OFFSET_BITS + SEQUENCE_BITS;
/// The last epoch the key holds (8 bits).
pub const MAX_EPOCH: u32 = (1 << (63 - EPOCH_SHIFT)) - 1;

/// The order key of the transaction starting at `position` (its `event`
/// and `row` are not part of it: they count what of the transaction was
/// published, which the core keeps as `events`): `epoch << 55 | file
/// sequence << 32 | offset`. Epoch 0 is today's key, so records written
/// before any failover keep theirs.
pub fn order_key(position: &Position) -> Result<u64, MySqlSourceError> {
    let (sequence, _) = position.coordinates().file_sequence();
    if sequence >= 1 << SEQUENCE_BITS
        || position.pos >= 1 << OFFSET_BITS
        || position.epoch > MAX_EPOCH
    {
        return Err(MySqlSourceError::PositionOutOfRange {
            file: position.file.clone(),
            pos: position.pos,
            epoch: position.epoch,
        });
    }
    Ok((u64::from(position.epoch) << EPOCH_SHIFT) | (sequence << OFFSET_BITS) | position.pos)
}

/// The binlog file sequence and offset of an order key (its epoch left
/// out): the inverse of [`order_key`] for a fresh start's key.
pub fn key_coordinates(key: u64) -> (u64, u64) {
    (
        (key >> OFFSET_BITS) & ((1 << SEQUENCE_BITS) - 1),
        key & ((1 << OFFSET_BITS) - 1),
    )
}

/// How a checked stored offset resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// On the server that wrote it: by binlog file and offset.
    Same,
    /// On another server holding its GTIDs (a promoted replica): by GTIDs,
    /// one failover epoch up.
    Failover,
}

/// What the MySQL source stores beside the core's fields of an offset
/// record (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlOffset {
    /// Where the stream stands: the start of the last transaction with
    /// published changes and how many of them (a change of event `i`, row
    /// `r` stores `event = i, row = r + 1`), or the next transaction's
    /// start once one is complete.
    pub position: Position,
    /// The server whose binlog `position` is in.
    pub server: ServerIdentity,
    /// The shape facts as of `position`, of the captured tables only.
    #[serde(default, skip_serializing_if = "ShapeFacts::is_empty")]
    pub facts: ShapeFacts,
    /// A running snapshot's last key read per table (`database.table`), in
    /// key order, to read the next chunk after.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot: BTreeMap<String, Vec<Cell>>,
}

/// The stored form: the part names its source.
#[derive(Serialize)]
struct Tagged<'a> {
    mysql: &'a MySqlOffset,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    mysql: MySqlOffset,
}

impl MySqlOffset {
    /// The part for `position` of `server`, keeping the facts of the
    /// tables `captured` selects: the others' rows are never published,
    /// and the record, read at every start and written with every Kafka
    /// transaction, stays as small as the captured tables' facts.
    pub fn new(
        position: Position,
        server: ServerIdentity,
        facts: &ShapeFacts,
        captured: impl FnMut(&str, &str) -> bool,
    ) -> Self {
        let mut facts = facts.clone();
        facts.retain_tables(captured);
        Self {
            position,
            server,
            facts,
            snapshot: BTreeMap::new(),
        }
    }

    /// The order key of the stored position's transaction.
    pub fn order_key(&self) -> Result<u64, MySqlSourceError> {
        order_key(&self.position)
    }

    /// Puts this part into `offset`, whose core fields it must agree with.
    pub fn store(&self, offset: &mut SourceOffset) -> Result<(), MySqlSourceError> {
        self.agrees_with(offset)?;
        let value = serde_json::to_value(Tagged { mysql: self })
            .map_err(|e| MySqlSourceError::StoredOffset(format!("cannot be written: {e}")))?;
        offset.source = Some(SourcePart::new(value));
        Ok(())
    }

    /// The MySQL part of a stored record, checked against its core fields.
    pub fn read(offset: &SourceOffset) -> Result<Self, MySqlSourceError> {
        let part = offset.source.as_ref().ok_or_else(|| {
            MySqlSourceError::StoredOffset(
                "has no MySQL part: another source (PostgreSQL) wrote it".into(),
            )
        })?;
        let Stored { mysql } = serde_json::from_value(part.value().clone()).map_err(|e| {
            MySqlSourceError::StoredOffset(format!("has a source part that is not MySQL's: {e}"))
        })?;
        mysql.agrees_with(offset)?;
        Ok(mysql)
    }

    /// Where the binlog reader opens: the start of the stored position's
    /// transaction. The core's tracker skips the `events` changes of it
    /// already published (so the reader must not skip `event`/`row` too);
    /// `event`/`row` say the same in the binlog's terms, for operators.
    pub fn resume_from(&self) -> Position {
        Position {
            event: 0,
            row: 0,
            ..self.position.clone()
        }
    }

    /// The start-up check of this stored offset against the server: the
    /// same server, then the server's own checks with the position (its
    /// binlog retained, the offset inside it). Another server is taken
    /// over by GTIDs ([`Resume::Failover`]) when the stored position has
    /// them and the server's GTID state `server_gtids` contains them;
    /// without GTIDs it is refused, naming the fix.
    pub fn check(
        &self,
        server: &ServerFacts,
        server_gtids: Option<&Gtids>,
    ) -> Result<Resume, MySqlSourceError> {
        if self.server == server.server {
            server.check(Some(&self.position))?;
            return Ok(Resume::Same);
        }
        let other = || MySqlSourceError::OtherServer {
            stored: self.server.to_string(),
            found: server.server.to_string(),
        };
        let Some(stored) = self.position.gtids.as_ref().filter(|g| !g.is_empty()) else {
            return Err(other());
        };
        let Some(found) = server_gtids else {
            return Err(other());
        };
        if !found.includes(stored) {
            return Err(MySqlSourceError::FailoverBehind {
                stored: self.server.to_string(),
                found: server.server.to_string(),
                stored_gtids: stored.to_string(),
                server_gtids: found.to_string(),
            });
        }
        server.check(None)?;
        if self.position.epoch >= MAX_EPOCH {
            return Err(MySqlSourceError::PositionOutOfRange {
                file: self.position.file.clone(),
                pos: self.position.pos,
                epoch: self.position.epoch + 1,
            });
        }
        Ok(Resume::Failover)
    }

    fn agrees_with(&self, offset: &SourceOffset) -> Result<(), MySqlSourceError> {
        let key = self.order_key()?;
        let inside = self.position.event > 0 || self.position.row > 0;
        let agrees = if inside {
            key == offset.commit_lsn && !offset.complete
        } else {
            key == offset.flush_lsn
        };
        if agrees {
            return Ok(());
        }
        Err(MySqlSourceError::StoredOffset(format!(
            "names binlog position {}:{} (event {}, row {}; order key {key}), which its order keys (commit {}, complete {}, flush {}) do not: it was not written with this position",
            self.position.file,
            self.position.pos,
            self.position.event,
            self.position.row,
            offset.commit_lsn,
            offset.complete,
            offset.flush_lsn,
        )))
    }
}

#[cfg(test)]
mod tests;
