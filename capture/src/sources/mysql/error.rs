//! What can stop the MySQL/MariaDB source, by what to do about it: retry
//! (reconnect and resume from the stored position), stop with the fix
//! named, or refuse one record (dead letter) and go on.

/// Server error codes the classification needs (MySQL and MariaDB share them).
pub mod codes {
    /// MariaDB's `ER_STATEMENT_TIMEOUT`: past `max_statement_time`.
    pub const STATEMENT_TIMEOUT: u16 = 1969;
    /// MySQL's `ER_QUERY_TIMEOUT`: past `max_execution_time`.
    pub const QUERY_TIMEOUT: u16 = 3024;
    /// `ER_ACCESS_DENIED_ERROR`: wrong user or password.
    pub const ACCESS_DENIED: u16 = 1045;
    /// `ER_DBACCESS_DENIED_ERROR`.
    pub const DB_ACCESS_DENIED: u16 = 1044;
    /// `ER_SPECIFIC_ACCESS_DENIED_ERROR`: a privilege is missing.
    pub const SPECIFIC_ACCESS_DENIED: u16 = 1227;
    /// `ER_TABLEACCESS_DENIED_ERROR`.
    pub const TABLE_ACCESS_DENIED: u16 = 1142;
    /// `ER_MASTER_FATAL_ERROR_READING_BINLOG`: the requested binlog file or
    /// position (or GTID) is not on the server any more, or never was.
    pub const FATAL_READING_BINLOG: u16 = 1236;
    /// `ER_SLAVE_SAME_ID` / duplicate `server_id` among the replicas.
    pub const SERVER_ID_IN_USE: u16 = 1593;
}

#[derive(Debug, thiserror::Error)]
pub enum MySqlSourceError {
    /// The server is not set up for capture; `fix` says what to change.
    #[error("{setting} is {found:?}, capture needs {needed}: {fix}")]
    Prerequisite {
        setting: &'static str,
        found: String,
        needed: &'static str,
        fix: &'static str,
    },

    /// The capture user lacks privileges.
    #[error("user {user} lacks {missing}: run GRANT {missing} ON *.* TO {user}")]
    Privileges { user: String, missing: String },

    /// The stored position is older than the oldest binlog the server
    /// keeps: the changes in between are gone. Never skipped silently.
    #[error("the stored position {stored} is no longer on the server (oldest binlog: {oldest}): the changes in between were purged. Take a new snapshot (delete the stored offset) and raise the binlog retention (binlog_expire_logs_seconds / expire_logs_days) above the longest capture downtime")]
    PositionPurged { stored: String, oldest: String },

    /// The stored position is in another server's binlog (a failover, or
    /// the connector pointed at another server): files and offsets of two
    /// servers are not comparable. Never resumed by guess.
    #[error("the stored offset is a position in the binlog of {stored}, but this server is {found}: binlog files and offsets of two servers cannot be compared (a promoted replica's files and offsets start over), so capture cannot tell which of this server's transactions Kafka already holds. Point database.hostname back at the server of the offset; or capture this one from a new snapshot: delete the connector's stored offset (a null-valued record under its key on the offsets topic) and start again")]
    OtherServer { stored: String, found: String },

    /// After a failover the new server does not hold every transaction
    /// the stored GTIDs name (a replica behind, or not a replica of the
    /// old primary): resuming there would lose the difference.
    #[error("the stored offset is a position in the binlog of {stored}; this server ({found}) could take over by GTIDs, but its GTID state {server_gtids} does not contain the stored {stored_gtids}: it has not applied every transaction already in Kafka. Wait until it has caught up (a replica with log_slave_updates / log_replica_updates of the old primary), or point database.hostname back at the server of the offset")]
    FailoverBehind {
        stored: String,
        found: String,
        stored_gtids: String,
        server_gtids: String,
    },

    /// The stored offset record is not one this source wrote (another
    /// source's, or a part that does not read).
    #[error("the stored offset record {0}: connector names must be unique per source; delete the record (a null-valued record under the connector's key on the offsets topic) or give this capture another name")]
    StoredOffset(String),

    /// A binlog position the offset's order key cannot hold (see
    /// `offset::order_key`).
    #[error("binlog position {file}:{pos} after {epoch} failovers does not fit the offset's order key (the offset must be below 2^32, as the binlog's own 32-bit event positions are; the file's sequence number below 2^23 = 8388608; at most 255 failovers): keep max_binlog_size at or below 1G, its maximum, and transactions below 4 GiB (max_binlog_cache_size = 4G); past 8388607 binlog files or 255 failovers, take a new snapshot (delete the stored offset) after RESET MASTER on the server")]
    PositionOutOfRange { file: String, pos: u64, epoch: u32 },

    /// `snapshot.locking.mode = minimal` and the user may take neither
    /// lock the consistent snapshot needs.
    #[error("user {user} may take neither the global read lock (RELOAD) nor read locks on the captured tables (LOCK TABLES) that a snapshot consistent with the binlog needs: run GRANT RELOAD ON *.* TO {user} (or GRANT LOCK TABLES, which blocks writers to those tables for the whole snapshot), or set snapshot.locking.mode = \"none\" on a server without writes during the snapshot (docs/mysql.md)")]
    SnapshotLockRefused { user: String },

    /// A server or connection error; [`Self::is_retriable`] classifies it
    /// by its code.
    #[error("mysql: {context}: {source}")]
    Server {
        context: &'static str,
        source: mysql_async::Error,
    },

    /// The binlog carried something that does not decode: a bug or an
    /// unsupported server; reading it again would meet it again.
    #[error("binlog: {0}")]
    Protocol(String),

    /// One value its field cannot hold: that change is refused (dead
    /// letter), naming table, column and the setting that makes it fit.
    #[error("column {column} of table {table}: {reason}")]
    Record {
        table: String,
        column: String,
        reason: String,
    },
}

impl MySqlSourceError {
    pub fn server(context: &'static str, source: mysql_async::Error) -> Self {
        Self::Server { context, source }
    }

    /// Reconnecting and resuming can help: connection and I/O failures and
    /// server errors not known to be definite ("transient unless proven
    /// otherwise").
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Server { source, .. } => match source {
                mysql_async::Error::Server(e) => !matches!(
                    e.code,
                    codes::ACCESS_DENIED
                        | codes::DB_ACCESS_DENIED
                        | codes::SPECIFIC_ACCESS_DENIED
                        | codes::TABLE_ACCESS_DENIED
                        | codes::FATAL_READING_BINLOG
                        | codes::SERVER_ID_IN_USE
                ),
                mysql_async::Error::Url(_) => false,
                _ => true,
            },
            _ => false,
        }
    }

    /// The server refused the user a statement or object (a missing
    /// grant).
    pub fn is_access_denied(&self) -> bool {
        matches!(self, Self::Server { source: mysql_async::Error::Server(e), .. }
        if matches!(
            e.code,
            codes::ACCESS_DENIED
                | codes::DB_ACCESS_DENIED
                | codes::SPECIFIC_ACCESS_DENIED
                | codes::TABLE_ACCESS_DENIED
        ))
    }

    /// Only this record is refused; the stream goes on.
    pub fn is_per_record(&self) -> bool {
        matches!(self, Self::Record { .. })
    }

    /// As the pipeline's error: a server's as `Database` (retriable by its
    /// code), a purged position as the gap it is, the checks' and the
    /// stored offset's refusals as prerequisites (fatal, their fix named).
    pub(crate) fn into_capture(self) -> crate::error::CaptureError {
        use crate::error::CaptureError;
        let retriable = self.is_retriable();
        match self {
            Self::Server { context, source } => CaptureError::Database {
                database: "mysql",
                context,
                source: Box::new(source),
                retriable,
            },
            Self::PositionPurged { .. } => CaptureError::Gap(self.to_string()),
            Self::Protocol(m) => CaptureError::Protocol(m),
            other => CaptureError::Prerequisite(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> MySqlSourceError {
        MySqlSourceError::server(
            "binlog dump",
            mysql_async::Error::Server(mysql_async::ServerError {
                code,
                message: "m".into(),
                state: "HY000".into(),
            }),
        )
    }

    #[test]
    fn classification_is_by_code() {
        assert!(!server(codes::FATAL_READING_BINLOG).is_retriable());
        assert!(!server(codes::ACCESS_DENIED).is_retriable());
        // 1205 lock wait timeout, 2013 lost connection: transient.
        assert!(server(1205).is_retriable());
        assert!(server(2013).is_retriable());
        let rec = MySqlSourceError::Record {
            table: "t".into(),
            column: "c".into(),
            reason: "r".into(),
        };
        assert!(rec.is_per_record() && !rec.is_retriable());
        assert!(!MySqlSourceError::Protocol("x".into()).is_retriable());
    }
}
