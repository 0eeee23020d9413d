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
}

/// A table described by hand, for the core's unit tests.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestTable {
    pub(crate) namespace: &'static str,
    pub(crate) name: &'static str,
    /// Each column's name and type identity.
    pub(crate) columns: Vec<(String, u32)>,
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
}
