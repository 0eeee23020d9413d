//! Row changes as the core reads them, whatever the source database: a
//! row image is one [`Datum`] per column of the table as the stream
//! describes it ([`StreamTable`]). A source decodes its change stream
//! straight into these (PostgreSQL's pgoutput tuples are [`RowImage`]s),
//! so the snapshot window, the outbox, signals and the tracker name no
//! source type (docs/design.md, "Architecture: the source seam").

use bytes::Bytes;

use crate::envelope::{Cell, Row};

/// One column value of a row image. Values are slices of the message they
/// were decoded from, so decoding copies no column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datum {
    Null,
    /// Not in the change: the source did not send it again because the
    /// change left it as it was (PostgreSQL: an unchanged TOASTed value).
    /// Never to be confused with NULL.
    Unchanged,
    /// The value in the source's text format (what capture asks for).
    Text(Bytes),
    /// The value in the type's binary format.
    Binary(Bytes),
}

/// The values of one row, in the order of its table's columns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowImage(pub Vec<Datum>);

impl Row for RowImage {
    fn width(&self) -> usize {
        self.0.len()
    }

    fn cell(&self, i: usize) -> Cell<'_> {
        match &self.0[i] {
            Datum::Null => Cell::Null,
            Datum::Unchanged => Cell::Unavailable,
            Datum::Text(bytes) => Cell::Text(bytes),
            Datum::Binary(bytes) => Cell::Binary(bytes),
        }
    }
}

/// A row change of the stream as the core reads it, whatever the source:
/// borrowed from the source's decoded event, so reading it copies nothing.
/// `Id` is the stream's id of a table, valid until the stream describes
/// the table again (PostgreSQL: the relation's OID; MySQL: the table map's
/// id).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowChange<'a, Id> {
    Insert {
        table: Id,
        new: &'a RowImage,
    },
    Update {
        table: Id,
        /// What the change carried of the row before it, if anything.
        old: Option<OldRow<'a>>,
        new: &'a RowImage,
    },
    Delete {
        table: Id,
        old: OldRow<'a>,
    },
    /// Every row of these tables went.
    Truncate {
        tables: &'a [Id],
    },
}

/// The row before an update or delete, as much of it as the source sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OldRow<'a> {
    /// Only the key columns are set; the others are null (PostgreSQL:
    /// default replica identity; MySQL: `binlog_row_image = MINIMAL`).
    Key(&'a RowImage),
    /// Every column (PostgreSQL: REPLICA IDENTITY FULL; MySQL: a full
    /// before image).
    Full(&'a RowImage),
}

impl<'a> OldRow<'a> {
    /// The row image, whichever kind it is.
    pub(crate) fn row(self) -> &'a RowImage {
        match self {
            OldRow::Key(row) | OldRow::Full(row) => row,
        }
    }
}

/// The row before an update or delete, owned: what a source's stream
/// event carries (PostgreSQL's pgoutput decodes its old tuples straight
/// into it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldImage {
    /// Only the key columns are set; the others are null.
    Key(RowImage),
    /// Every column.
    Full(RowImage),
}

impl OldImage {
    /// The row image, whichever kind it is.
    pub fn row(&self) -> &RowImage {
        match self {
            OldImage::Key(row) | OldImage::Full(row) => row,
        }
    }

    /// The borrowed view of this old row.
    pub(crate) fn as_old_row(&self) -> OldRow<'_> {
        match self {
            OldImage::Key(row) => OldRow::Key(row),
            OldImage::Full(row) => OldRow::Full(row),
        }
    }
}

/// A change inside a source transaction, owned: what the router maps to
/// Kafka records. `table` is the stream's id of a table (PostgreSQL: the
/// relation's OID; MySQL: the table map's id), valid until the stream
/// describes the table again ([`StreamEvent::Table`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    Insert {
        table: u32,
        new: RowImage,
    },
    Update {
        table: u32,
        /// What the change carried of the row before it, if anything.
        old: Option<OldImage>,
        new: RowImage,
    },
    Delete {
        table: u32,
        old: OldImage,
    },
    /// Every row of these tables went.
    Truncate {
        tables: Vec<u32>,
    },
    /// A message the source's writer put in the transaction (PostgreSQL:
    /// `pg_logical_emit_message(true, ..)`; the snapshot's watermarks).
    Message {
        prefix: String,
        content: Bytes,
    },
}

impl Change {
    /// The borrowed view of this change when it changes rows.
    pub(crate) fn row_change(&self) -> Option<RowChange<'_, u32>> {
        Some(match self {
            Change::Insert { table, new } => RowChange::Insert { table: *table, new },
            Change::Update { table, old, new } => RowChange::Update {
                table: *table,
                old: old.as_ref().map(OldImage::as_old_row),
                new,
            },
            Change::Delete { table, old } => RowChange::Delete {
                table: *table,
                old: old.as_old_row(),
            },
            Change::Truncate { tables } => RowChange::Truncate { tables },
            Change::Message { .. } => return None,
        })
    }

    /// The tables whose routes the change's records depend on.
    pub(crate) fn tables(&self) -> &[u32] {
        match self {
            Change::Insert { table, .. }
            | Change::Update { table, .. }
            | Change::Delete { table, .. } => std::slice::from_ref(table),
            Change::Truncate { tables } => tables,
            Change::Message { .. } => &[],
        }
    }
}

/// One event of a source's change stream, as the stream loop reads it,
/// whatever the source: transactions (`Begin`, changes, `Commit`) at
/// totally ordered positions (`u64` order keys along one stream), table
/// descriptions, and what happens between transactions. A source's stream
/// adapter MOVES what it decoded into these (rows are [`RowImage`]s
/// already), copying no row.
///
/// `T` is how the source describes a table (PostgreSQL: a pgoutput
/// Relation; MySQL: a table map with its columns), `N` what it announces
/// of its value types (PostgreSQL: a Type message; a source with nothing
/// to announce uses [`std::convert::Infallible`]).
#[derive(Debug)]
pub(crate) enum StreamEvent<T, N> {
    /// A transaction starts; `commit` is the position of its commit, known
    /// before its first change (PostgreSQL: the commit record's LSN).
    Begin {
        commit: u64,
        /// The source's transaction id.
        xid: u32,
        commit_ts_us: i64,
    },
    /// A change of the open transaction at position `at`.
    Change { at: u64, change: Change },
    /// The transaction ends at `commit`; the stream resumes after `end`.
    Commit { commit: u64, end: u64 },
    /// The table's shape from here on in the stream.
    Table(T),
    /// A value type the stream names.
    Type(N),
    /// A message outside any transaction, at its own position.
    Message {
        at: u64,
        prefix: String,
        content: Bytes,
    },
    /// The server is at `position`: every change before it was sent.
    KeepAlive { position: u64 },
    /// Nothing for the core (PostgreSQL: a transaction's origin).
    Nothing,
}

/// A table as the change stream describes it at a point of the stream:
/// what the core reads of it to match a row image's values to columns.
///
/// Contract: a row image of the table has one value per column, in this
/// order; `column_type` is the source's identity of a column's type, equal
/// for two descriptions exactly when values of the column are written the
/// same way (the snapshot window drops what it cannot compare).
pub(crate) trait StreamTable {
    /// The schema (PostgreSQL) or database (MySQL) the table is in.
    fn namespace(&self) -> &str;
    fn name(&self) -> &str;
    /// How many columns the table has.
    fn width(&self) -> usize;
    /// The name of column `i` (`i < width()`).
    fn column_name(&self, i: usize) -> &str;
    /// The source's identity of column `i`'s type (PostgreSQL: its OID).
    fn column_type(&self, i: usize) -> u32;
    /// A snapshot chunk's table whose columns were read from a catalog
    /// already past DDL the stream had not reached at the chunk's high
    /// watermark (MySQL: `information_schema` has no read view): its rows
    /// are read again, never published under names their position does
    /// not know.
    fn shape_ahead_of_stream(&self) -> bool {
        false
    }
}

impl<T: StreamTable + ?Sized> StreamTable for std::sync::Arc<T> {
    fn namespace(&self) -> &str {
        (**self).namespace()
    }

    fn name(&self) -> &str {
        (**self).name()
    }

    fn width(&self) -> usize {
        (**self).width()
    }

    fn column_name(&self, i: usize) -> &str {
        (**self).column_name(i)
    }

    fn column_type(&self, i: usize) -> u32 {
        (**self).column_type(i)
    }

    fn shape_ahead_of_stream(&self) -> bool {
        (**self).shape_ahead_of_stream()
    }
}

/// A table described by hand, for the core's unit tests.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestTable {
    pub(crate) namespace: &'static str,
    pub(crate) name: &'static str,
    /// Each column's name and type identity.
    pub(crate) columns: Vec<(String, u32)>,
    /// [`StreamTable::shape_ahead_of_stream`].
    pub(crate) ahead_of_stream: bool,
}

#[cfg(test)]
impl StreamTable for TestTable {
    fn namespace(&self) -> &str {
        self.namespace
    }

    fn name(&self) -> &str {
        self.name
    }

    fn width(&self) -> usize {
        self.columns.len()
    }

    fn column_name(&self, i: usize) -> &str {
        &self.columns[i].0
    }

    fn column_type(&self, i: usize) -> u32 {
        self.columns[i].1
    }

    fn shape_ahead_of_stream(&self) -> bool {
        self.ahead_of_stream
    }
}
