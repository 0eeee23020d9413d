//! Why a record could not be built, and what to tell the operator.

/// Why a record could not be built. Each names the table so the operator
/// knows where to look.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("table {table} has no key columns: give it a primary key, set REPLICA IDENTITY USING INDEX, or configure message.key.columns for it")]
    NoKeyColumns { table: String },
    #[error("table {table} has REPLICA IDENTITY FULL, so pgoutput flags every column as a key column; pass the table's primary key columns (or configure message.key.columns for it)")]
    FullIdentityNeedsKeyColumns { table: String },
    /// The column settings cannot apply to the table as it is.
    #[error("table {table}: {reason}")]
    ColumnPolicy { table: String, reason: String },
    #[error("message.key.columns for table {table} names column {column:?}, which the table does not have")]
    UnknownKeyColumn { table: String, column: String },
    #[error("row for table {table} has {got} columns, the table has {expected}: a schema change was missed")]
    ColumnCount {
        table: String,
        expected: usize,
        got: usize,
    },
    #[error("column {column} of table {table} is not valid UTF-8 text")]
    InvalidUtf8 { table: String, column: String },
    #[error("key column {column} of table {table} is an unchanged TOAST value, so the row's key is unknown")]
    KeyValueUnavailable { table: String, column: String },
    /// A value its field's type cannot hold: the change is refused, never
    /// sent with a string in an integer field, since a consumer trusts the
    /// field's schema (see docs/design.md, "Refused values").
    #[error("column {column} of table {table} holds {value:?}, which {field} cannot hold; the change is not published: {fix}")]
    Unrepresentable {
        table: String,
        column: String,
        /// The value's text (cut at 200 characters).
        value: String,
        /// The Connect field, e.g. `io.debezium.time.MicroTimestamp (int64)`.
        field: &'static str,
        /// What makes such values publishable.
        fix: &'static str,
    },
}

impl EnvelopeError {
    /// A refused value: the change is not published, the stream goes on.
    pub fn is_unrepresentable(&self) -> bool {
        matches!(self, EnvelopeError::Unrepresentable { .. })
    }
}
