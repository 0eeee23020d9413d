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
//! **Order key**: `file sequence << 32 | offset` of the transaction's first
//! event. Within one server's binlog it orders transaction starts exactly
//! as [`Position`] does, and with the changes published (`event`, `row`,
//! which the core counts as `events`) every position; a rotation (`FLUSH
//! BINARY LOGS`, `max_binlog_size`) raises the sequence, so the key grows
//! across it. Both halves fit: an event header's position is 32 bits (the
//! servers cannot address a file past 4 GiB, so `max_binlog_cache_size`
//! is documented to stay at 4 GiB), and a file's numeric extension stops
//! at 2^31 - 1. A position beyond either is refused, never wrapped. Keys
//! of two servers are not comparable (a promoted replica's files start
//! over), so the part names the server and [`MySqlOffset::check`] refuses
//! another's, naming the fix.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cell::Cell;
use super::checks::{ServerFacts, ServerIdentity};
use super::error::MySqlSourceError;
use super::history::ShapeFacts;
use super::position::Position;
use crate::offset::{SourceOffset, SourcePart};

/// Bits of the order key that hold the offset inside a binlog file.
const OFFSET_BITS: u32 = 32;

/// The order key of the transaction starting at `position` (its `event`
/// and `row` are not part of it: they count what of the transaction was
/// published, which the core keeps as `events`).
pub fn order_key(position: &Position) -> Result<u64, MySqlSourceError> {
    let (sequence, _) = position.coordinates().file_sequence();
    let limit = 1u64 << OFFSET_BITS;
    if sequence >= limit || position.pos >= limit {
        return Err(MySqlSourceError::PositionOutOfRange {
            file: position.file.clone(),
            pos: position.pos,
        });
    }
    Ok((sequence << OFFSET_BITS) | position.pos)
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
    /// binlog retained, the offset inside it).
    pub fn check(&self, server: &ServerFacts) -> Result<(), MySqlSourceError> {
        if self.server != server.server {
            return Err(MySqlSourceError::OtherServer {
                stored: self.server.to_string(),
                found: server.server.to_string(),
            });
        }
        server.check(Some(&self.position))
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
