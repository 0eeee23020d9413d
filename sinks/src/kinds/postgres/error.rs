//! Classifying warehouse errors by SQLSTATE, never by message text.
//!
//! | SQLSTATE | meaning | class |
//! | --- | --- | --- |
//! | `22xxx` data exception, `23xxx` integrity violation | a value the target refuses | [`Class::Record`]: find the records and dead-letter them |
//! | `28xxx` auth, `3D000` no such database, `42501` privilege, `42601` syntax | retrying cannot fix it | [`Class::Fatal`] |
//! | `42701` duplicate column, `42P07` duplicate table, `42P16` invalid table definition, `42611` invalid column definition, `42622` name too long, `42602` invalid name, `42939` reserved name | a definite answer to the sink's own DDL: retrying would fail the same way for ever | [`Class::Fatal`] |
//! | a server certificate refused by `sslmode` (no SQLSTATE; a rustls certificate error) | retrying cannot fix it | [`Class::Fatal`] |
//! | anything else, and errors without a SQLSTATE (I/O, closed connection) | | [`Class::Transient`] ("transient unless proven otherwise") |

use tokio_postgres::error::SqlState;

use crate::error::SinkError;

/// What to do about a failed statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Retry the batch.
    Transient,
    /// Some record of the statement can never be applied.
    Record,
    /// Stop the runner.
    Fatal,
}

/// Classifies a PostgreSQL client error by its SQLSTATE.
pub fn classify(e: &tokio_postgres::Error) -> Class {
    match e.code() {
        Some(code) => classify_code(code),
        None if oncely_core::tls::is_certificate_error(e) => Class::Fatal,
        None => Class::Transient,
    }
}

/// Classifies a SQLSTATE.
pub fn classify_code(code: &SqlState) -> Class {
    let s = code.code();
    if s.starts_with("22") || s.starts_with("23") {
        Class::Record
    } else if s.starts_with("28")
        || *code == SqlState::INVALID_CATALOG_NAME
        || *code == SqlState::INSUFFICIENT_PRIVILEGE
        || *code == SqlState::SYNTAX_ERROR
        || is_definite_ddl(code)
    {
        Class::Fatal
    } else {
        Class::Transient
    }
}

/// Definite answers to DDL. Not among them: undefined table or column
/// (`42P01`, `42703`), which a stale catalog cache explains and a retry with
/// a fresh one fixes.
fn is_definite_ddl(code: &SqlState) -> bool {
    [
        SqlState::DUPLICATE_COLUMN,
        SqlState::DUPLICATE_TABLE,
        SqlState::INVALID_TABLE_DEFINITION,
        SqlState::INVALID_COLUMN_DEFINITION,
        SqlState::NAME_TOO_LONG,
        SqlState::INVALID_NAME,
        SqlState::RESERVED_NAME,
    ]
    .contains(code)
}

/// The sink error for a failed statement that is not a per-record failure.
pub fn to_sink_error(context: &str, e: tokio_postgres::Error) -> SinkError {
    let message = match e.code() {
        Some(code) => format!("{context} (SQLSTATE {})", code.code()),
        None => context.to_owned(),
    };
    match classify(&e) {
        Class::Fatal => SinkError::fatal_from(message, e),
        Class::Transient | Class::Record => SinkError::retriable_from(message, e),
    }
}

/// The sink error for a pool that could not hand out a connection.
/// `place` says where (`host:port/db`), never with credentials.
pub fn pool_error(e: deadpool_postgres::PoolError, place: &str) -> SinkError {
    match e {
        deadpool_postgres::PoolError::Backend(pg) => {
            to_sink_error(&format!("connect to the warehouse at {place}"), pg)
        }
        other => SinkError::retriable_from("warehouse connection pool", other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decide() {
        assert_eq!(
            classify_code(&SqlState::INVALID_TEXT_REPRESENTATION),
            Class::Record
        );
        assert_eq!(classify_code(&SqlState::NOT_NULL_VIOLATION), Class::Record);
        assert_eq!(
            classify_code(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE),
            Class::Record
        );
        assert_eq!(classify_code(&SqlState::INVALID_PASSWORD), Class::Fatal);
        assert_eq!(
            classify_code(&SqlState::T_R_DEADLOCK_DETECTED),
            Class::Transient
        );
        assert_eq!(
            classify_code(&SqlState::T_R_SERIALIZATION_FAILURE),
            Class::Transient
        );
        assert_eq!(classify_code(&SqlState::ADMIN_SHUTDOWN), Class::Transient);
        assert_eq!(classify_code(&SqlState::UNDEFINED_COLUMN), Class::Transient);
        // "column specified more than once" in CREATE TABLE: for ever, so fatal.
        assert_eq!(classify_code(&SqlState::DUPLICATE_COLUMN), Class::Fatal);
        assert_eq!(
            classify_code(&SqlState::INVALID_TABLE_DEFINITION),
            Class::Fatal
        );
    }
}
