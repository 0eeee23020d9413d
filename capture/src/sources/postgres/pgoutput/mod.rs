//! pgoutput logical replication messages, protocol version 1.
//!
//! PostgreSQL's built-in `pgoutput` plugin sends one message per `XLogData`
//! payload; the first byte is a tag that names the message kind. The layouts
//! follow the PostgreSQL 15 documentation, "Logical Replication Message
//! Formats". Only protocol version 1 is supported: no streamed (in-progress)
//! transactions, so no message carries a leading transaction id.
//!
//! We decode every kind, including Begin/Commit/Message that the stream
//! client already decodes for us, so that the capture logic can be tested
//! against hand-written bytes and does not depend on one client's decoder.
//! [`encode`] is the exact inverse of [`decode`]; it exists for fixtures,
//! round-trip property tests and the changes capture rewrites where it
//! evaluates row filters itself (`sources/postgres/filter.rs`).
//!
//! Decoding is zero-copy for column values: [`TupleValue::Text`] and
//! [`TupleValue::Binary`] are slices of the input [`Bytes`].

mod decode;
mod encode;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod row_change_tests;

use bytes::Bytes;

pub use decode::decode;
pub use encode::encode;

/// A PostgreSQL WAL position (`pg_lsn`), as a plain 64-bit number.
pub type Lsn = u64;

/// Message tags, the first byte of every pgoutput message.
pub(crate) mod tag {
    pub const BEGIN: u8 = b'B';
    pub const MESSAGE: u8 = b'M';
    pub const COMMIT: u8 = b'C';
    pub const ORIGIN: u8 = b'O';
    pub const RELATION: u8 = b'R';
    pub const TYPE: u8 = b'Y';
    pub const INSERT: u8 = b'I';
    pub const UPDATE: u8 = b'U';
    pub const DELETE: u8 = b'D';
    pub const TRUNCATE: u8 = b'T';
}

/// Markers that introduce a tuple inside Insert/Update/Delete.
pub(crate) mod tuple_marker {
    /// New tuple.
    pub const NEW: u8 = b'N';
    /// Old tuple holding only the replica identity key columns.
    pub const KEY: u8 = b'K';
    /// Old tuple holding every column (REPLICA IDENTITY FULL).
    pub const OLD: u8 = b'O';
}

/// Kind bytes of one column inside TupleData.
pub(crate) mod column_kind {
    pub const NULL: u8 = b'n';
    pub const UNCHANGED_TOAST: u8 = b'u';
    pub const TEXT: u8 = b't';
    pub const BINARY: u8 = b'b';
}

/// Flag bit of a logical decoding Message: emitted inside a transaction.
pub(crate) const MESSAGE_TRANSACTIONAL: u8 = 1;
/// Flag bit of a Relation column: part of the replica identity key.
pub(crate) const COLUMN_IS_KEY: u8 = 1;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    /// The transaction was replayed from another node (origin set on the
    /// session that wrote it). Sent after Begin, before the changes.
    Origin {
        commit_lsn: Lsn,
        name: String,
    },
    Relation(Relation),
    Type(TypeMessage),
    Insert {
        relation_id: u32,
        new: TupleData,
    },
    Update {
        relation_id: u32,
        /// Present only when the replica identity is FULL, or when a key
        /// column changed; `None` otherwise.
        old: Option<OldTuple>,
        new: TupleData,
    },
    Delete {
        relation_id: u32,
        old: OldTuple,
    },
    Truncate {
        /// Bit set: 1 is `CASCADE`, 2 is `RESTART IDENTITY`.
        options: u8,
        relation_ids: Vec<u32>,
    },
    /// `pg_logical_emit_message`.
    Message {
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: Bytes,
    },
}

/// Start of a transaction. `final_lsn` is the LSN of its commit record, so
/// the position of the whole transaction is known before its first change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    pub final_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 00:00:00 UTC (PostgreSQL epoch).
    pub commit_ts_us: i64,
    pub xid: u32,
}

/// End of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Currently unused by PostgreSQL; kept so encoding is lossless.
    pub flags: u8,
    /// LSN of the commit record; equals the Begin's `final_lsn`.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: the position to confirm once the
    /// transaction is durably handled.
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 00:00:00 UTC.
    pub commit_ts_us: i64,
}

/// `pg_type` row announced before a Relation that uses a non-builtin type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage {
    pub oid: u32,
    /// Schema of the type; empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
}

/// A table's shape as of this point in the stream. pgoutput re-sends it
/// after a schema change, so it replaces any earlier one with the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The table's OID.
    pub id: u32,
    /// Schema of the table; empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    pub replica_identity: ReplicaIdentity,
    pub columns: Vec<Column>,
}

impl Relation {
    /// Indices of the columns flagged as part of the replica identity key.
    pub fn key_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_key)
            .map(|(i, _)| i)
    }
}

/// `pg_class.relreplident`: what an update/delete carries of the old row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaIdentity {
    /// `d`: the primary key, if any.
    Default,
    /// `n`: nothing.
    Nothing,
    /// `f`: every column.
    Full,
    /// `i`: the columns of a chosen unique index.
    Index,
}

impl ReplicaIdentity {
    /// The `relreplident` byte sent on the wire.
    pub fn as_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }

    /// Parses the `relreplident` byte; `None` for anything PostgreSQL does not send.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'd' => Some(ReplicaIdentity::Default),
            b'n' => Some(ReplicaIdentity::Nothing),
            b'f' => Some(ReplicaIdentity::Full),
            b'i' => Some(ReplicaIdentity::Index),
            _ => None,
        }
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Part of the replica identity (primary key or chosen index); with
    /// REPLICA IDENTITY FULL every column is flagged.
    pub is_key: bool,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod`: -1 when the type has none.
    pub type_modifier: i32,
}

/// A tuple's values are the core's row images: pgoutput decodes straight
/// into them (an unchanged TOASTed value is [`TupleValue::Unchanged`]).
pub use crate::change::{Datum as TupleValue, RowImage as TupleData};

impl crate::change::StreamTable for Relation {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn width(&self) -> usize {
        self.columns.len()
    }

    fn column_name(&self, i: usize) -> &str {
        &self.columns[i].name
    }

    fn column_type(&self, i: usize) -> u32 {
        self.columns[i].type_oid
    }
}

/// The old row image of an update or delete: `K`, only the replica
/// identity columns set (the others null); `O`, every column (REPLICA
/// IDENTITY FULL). pgoutput decodes it straight into the core's type.
pub use crate::change::OldImage as OldTuple;
use crate::change::{Change, StreamEvent};

impl LogicalMessage {
    /// The core's stream event this message is, at `at` (the WAL position
    /// it was sent at): its rows MOVED into the event, none copied.
    /// pgwire_replication reports a transaction's Begin and Commit as
    /// events of their own, so those here (and an Origin) say nothing.
    pub(crate) fn into_event(self, at: u64) -> StreamEvent<Relation, TypeMessage> {
        let change = match self {
            LogicalMessage::Begin(_)
            | LogicalMessage::Commit(_)
            | LogicalMessage::Origin { .. } => return StreamEvent::Nothing,
            LogicalMessage::Relation(rel) => return StreamEvent::Table(rel),
            LogicalMessage::Type(t) => return StreamEvent::Type(t),
            LogicalMessage::Message {
                transactional: false,
                lsn,
                prefix,
                content,
            } => {
                return StreamEvent::Message {
                    at: lsn,
                    prefix,
                    content,
                }
            }
            LogicalMessage::Message {
                prefix, content, ..
            } => Change::Message { prefix, content },
            LogicalMessage::Insert { relation_id, new } => Change::Insert {
                table: relation_id,
                new,
            },
            LogicalMessage::Update {
                relation_id,
                old,
                new,
            } => Change::Update {
                table: relation_id,
                old,
                new,
            },
            LogicalMessage::Delete { relation_id, old } => Change::Delete {
                table: relation_id,
                old,
            },
            LogicalMessage::Truncate { relation_ids, .. } => Change::Truncate {
                tables: relation_ids,
            },
        };
        StreamEvent::Change { at, change }
    }
}

/// Why a pgoutput message could not be decoded (or a tuple does not fit
/// its relation). Every variant names the message kind involved so a log
/// line is enough to find the offending message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty pgoutput message")]
    Empty,
    #[error("truncated pgoutput {message} message: {field} at offset {offset} needs {needed} bytes, {available} left")]
    Truncated {
        message: &'static str,
        field: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error("unterminated string {field} in pgoutput {message} message at offset {offset}")]
    UnterminatedString {
        message: &'static str,
        field: &'static str,
        offset: usize,
    },
    #[error("invalid UTF-8 in {field} of pgoutput {message} message")]
    InvalidUtf8 {
        message: &'static str,
        field: &'static str,
    },
    #[error("unknown pgoutput message tag {tag:#04x}")]
    UnknownTag { tag: u8 },
    #[error(
        "bad tuple column kind byte {byte:#04x} for column {column} in pgoutput {message} message"
    )]
    BadColumnKind {
        message: &'static str,
        column: usize,
        byte: u8,
    },
    #[error(
        "unexpected tuple marker {byte:#04x} in pgoutput {message} message, expected {expected}"
    )]
    BadTupleMarker {
        message: &'static str,
        byte: u8,
        expected: &'static str,
    },
    #[error("unknown replica identity {byte:#04x} in Relation message for relation {relation_id}")]
    UnknownReplicaIdentity { relation_id: u32, byte: u8 },
    #[error("negative {field} {value} in pgoutput {message} message")]
    NegativeLength {
        message: &'static str,
        field: &'static str,
        value: i64,
    },
    #[error("{extra} unexpected trailing bytes after pgoutput {message} message")]
    TrailingBytes { message: &'static str, extra: usize },
}
