//! How PostgreSQL's failures become [`CaptureError`]s: a failed query is
//! retriable unless the server said something definite about us, the
//! replication stream's errors by their SQLSTATE, never by their text.

use pgwire_replication::PgWireError;

use crate::error::CaptureError;

impl CaptureError {
    /// A failed query on a PostgreSQL connection, doing `context`.
    pub(crate) fn pg(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CaptureError {
        move |source| CaptureError::Database {
            database: "postgres",
            context,
            retriable: transient_pg(&source),
            source: Box::new(source),
        }
    }

    /// The PostgreSQL error behind a failed query, when it is one.
    pub(crate) fn as_pg(&self) -> Option<&tokio_postgres::Error> {
        match self {
            CaptureError::Database { source, .. } => source.downcast_ref(),
            _ => None,
        }
    }
}

impl From<oncely_core::postgres::ConnectError> for CaptureError {
    fn from(source: oncely_core::postgres::ConnectError) -> Self {
        let retriable = source.postgres().is_some_and(transient_pg);
        CaptureError::Connect { source, retriable }
    }
}

impl From<PgWireError> for CaptureError {
    fn from(source: PgWireError) -> Self {
        let retriable = match &source {
            PgWireError::Io(_) | PgWireError::Task(_) => true,
            // "replication slot ... is active for PID": the previous
            // instance's walsender has not exited yet.
            // A walsender terminated (pg_terminate_backend) or a
            // server shutting down: connect again.
            PgWireError::Server(msg) => match sqlstate_in(msg) {
                // object_in_use: the slot is still held.
                Some(code) => code == "55006" || is_shutdown(code),
                None => msg.contains("is active for PID"),
            },
            _ => false,
        };
        CaptureError::Stream {
            source: Box::new(source),
            retriable,
        }
    }
}

/// Transient unless the server said something definite about us.
fn transient_pg(source: &tokio_postgres::Error) -> bool {
    source.code().is_none()
        || source.is_closed()
        || source.code().is_some_and(|c| is_shutdown(c.code()))
}

/// SQLSTATE class 57 codes that end a connection, not the work: the backend
/// was terminated (`57P01` admin_shutdown, also `pg_terminate_backend`), the
/// server crashed (`57P02`) or is starting (`57P03`).
fn is_shutdown(code: &str) -> bool {
    matches!(code, "57P01" | "57P02" | "57P03")
}

/// The code of a server error as pgwire-replication renders it (`... (SQLSTATE 57P01)`).
fn sqlstate_in(msg: &str) -> Option<&str> {
    let at = msg.find("SQLSTATE ")? + "SQLSTATE ".len();
    msg.get(at..at + 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminated_walsender_is_retriable() {
        let server =
            |m: &str| CaptureError::from(pgwire_replication::PgWireError::Server(m.into()));
        assert!(server(
            "server error: terminating connection due to administrator command (SQLSTATE 57P01)"
        )
        .is_retriable());
        assert!(server("replication slot \"s\" is active for PID 7").is_retriable());
        assert!(server(
            "server error: replication slot \"s\" is active for PID 7 (SQLSTATE 55006)"
        )
        .is_retriable());
        assert!(
            !server("server error: a column named 55006 does not exist (SQLSTATE 42703)")
                .is_retriable(),
            "codes, not text"
        );
        assert!(
            !server("server error: publication \"p\" does not exist (SQLSTATE 42704)")
                .is_retriable()
        );
        assert!(!server("server error without a code").is_retriable());
    }
}
