//! The source `oncely verify` and `oncely status` read: the database
//! capture's configuration names (`source`), PostgreSQL (`source.rs`) or
//! MySQL/MariaDB (`mysql_source.rs`), one dispatch over both.

use oncely_capture::config::{CaptureConfig, SourceKind};

use super::mysql_source::MySqlSource;
use super::source::{PgSource, SourceRow, SourceTable};
use super::VerifyError;

/// The source database capture's configuration names (`source`).
pub enum SourceDb {
    Postgres(PgSource),
    Mysql(MySqlSource),
}

impl SourceDb {
    /// Connects to the source `cfg.source` names.
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, VerifyError> {
        Ok(match cfg.source {
            SourceKind::Postgres => SourceDb::Postgres(PgSource::connect(cfg).await?),
            SourceKind::Mysql => SourceDb::Mysql(MySqlSource::connect(cfg).await?),
        })
    }

    /// The PostgreSQL source, for what only it has so far; `what` says
    /// what a MySQL source lacks, for the error.
    pub fn postgres(&self, what: &str) -> Result<&PgSource, VerifyError> {
        match self {
            SourceDb::Postgres(pg) => Ok(pg),
            SourceDb::Mysql(_) => Err(VerifyError::Config(format!("source = \"mysql\": {what}"))),
        }
    }

    /// The source's position now, on the scale of capture's offset
    /// records (`flush_lsn`): PostgreSQL's WAL end, MySQL's binlog end as
    /// its order key (in the failover epoch capture streams it at).
    pub async fn position_now(&self, cfg: &CaptureConfig) -> Result<u64, VerifyError> {
        match self {
            SourceDb::Postgres(pg) => pg.current_wal_lsn().await,
            SourceDb::Mysql(my) => my.position_now(cfg).await,
        }
    }

    /// The tables capture captures.
    pub async fn tables(&self, cfg: &CaptureConfig) -> Result<Vec<SourceTable>, VerifyError> {
        match self {
            SourceDb::Postgres(pg) => pg.tables(cfg).await,
            SourceDb::Mysql(my) => my.tables(cfg).await,
        }
    }

    /// Up to `limit` rows with keys after `after`'s (from the start when `None`), in key order.
    pub async fn page(
        &self,
        table: &SourceTable,
        after: Option<&SourceRow>,
        limit: usize,
    ) -> Result<Vec<SourceRow>, VerifyError> {
        match self {
            SourceDb::Postgres(pg) => pg.page(table, after, limit).await,
            SourceDb::Mysql(my) => my.page(table, after, limit).await,
        }
    }

    /// Of `keys` (key values in text form), those the table holds.
    pub async fn existing(
        &self,
        table: &SourceTable,
        keys: &[Vec<String>],
    ) -> Result<Vec<Vec<String>>, VerifyError> {
        match self {
            SourceDb::Postgres(pg) => pg.existing(table, keys).await,
            SourceDb::Mysql(my) => my.existing(table, keys).await,
        }
    }
}
