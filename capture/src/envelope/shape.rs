//! What the envelope knows of a table, whatever the source database: its
//! columns (a name and a [`ColumnType`] that names the Connect field and
//! writes values as JSON), which of them are the key, and rows as
//! [`Cell`]s. Each source describes its tables with these
//! (docs/design.md, "Architecture: the source seam"); the envelope names no
//! source type.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::Characters;

/// A value its field's type cannot hold (a timestamp beyond 64-bit µs, for
/// one): the change is refused, never sent as something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrepresentable;

/// One column's type as the envelope writes it. A source implements it for
/// its own types, so its type mapping stays its own.
///
/// Contract: `field_schema` and `write_json` agree (a value written is one
/// the field's schema allows); `write_json` writes nothing when it returns
/// [`Unrepresentable`]; both are pure, called from the capture task.
pub trait ColumnType: fmt::Debug + Send + Sync {
    /// The Connect schema of the field `field`, `optional` unless it is a
    /// key column.
    fn field_schema(&self, field: &str, optional: bool) -> Value;
    /// Appends the JSON of a value given as the source's text.
    fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable>;
    /// The field and the fix an operator is told when a value is refused.
    fn refusal_help(&self) -> (&'static str, &'static str);
    /// Whether the column holds character data (which masks apply to).
    fn characters(&self) -> Characters {
        Characters::No
    }
    /// The column's declared type, for `column.propagate.source.type` and
    /// `datatype.propagate.source.type`. `None` (the default) propagates
    /// nothing: a source whose mapping does not say yet (MySQL's) implements
    /// it when it does.
    fn source_type(&self) -> Option<SourceType> {
        None
    }
}

/// A column's declared type as Debezium's `PropagateSourceMetadataToSchemaParameter`
/// writes it: the type name and, where the declaration gives them, its
/// length (or precision) and scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceType {
    /// The source's own type name, upper case (`VARCHAR`, `NUMERIC`,
    /// `_INT4` for an `int4[]`, `MOOD` for an enum `mood`).
    pub name: String,
    pub length: Option<u32>,
    pub scale: Option<u32>,
}

/// One column of a table.
#[derive(Debug, Clone)]
pub struct ColumnShape {
    pub name: String,
    pub ty: Arc<dyn ColumnType>,
}

/// A table as the envelope writes it.
#[derive(Debug, Clone)]
pub struct TableShape {
    /// The schema (PostgreSQL) or database (MySQL) the table is in.
    pub namespace: String,
    pub name: String,
    pub columns: Vec<ColumnShape>,
    /// Positions of the key columns in `columns`, in key order; never empty.
    pub key: Vec<usize>,
}

/// One value of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell<'a> {
    Null,
    /// Not in the change (an unchanged TOASTed value): written as
    /// Debezium's unavailable marker, so sinks keep what they hold.
    Unavailable,
    /// The value as the source's text, written by its [`ColumnType`].
    Text(&'a [u8]),
    /// Bytes no type mapping applies to: written as base64 text.
    Binary(&'a [u8]),
}

/// A row of a table, one cell per column of its [`TableShape`].
pub trait Row {
    /// How many cells the row has.
    fn width(&self) -> usize;
    /// The cell of column `i` (`i < width()`).
    fn cell(&self, i: usize) -> Cell<'_>;
}

/// No row: the images of a truncate.
pub(super) struct NoRow;

impl Row for NoRow {
    fn width(&self) -> usize {
        0
    }

    fn cell(&self, _: usize) -> Cell<'_> {
        Cell::Null
    }
}

impl<R: Row + ?Sized> Row for &R {
    fn width(&self) -> usize {
        (**self).width()
    }

    fn cell(&self, i: usize) -> Cell<'_> {
        (**self).cell(i)
    }
}
