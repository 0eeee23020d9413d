//! What `oncely verify` reads of a MySQL/MariaDB source without running a
//! capture: the captured tables' shapes (`database.include.list`,
//! `table.include.list`, `table.exclude.list`), their rows through the
//! snapshot's own key-ordered chunk reads, and which of a list of keys a
//! table holds. Rows come back as the same [`Cell`]s capture maps, so
//! verify compares with the envelope's values, not a second mapping.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Value};
use oncely_core::sql::quote_mysql_ident;

use super::cell::Cell;
use super::checks::{current_position, Flavor, ServerFacts};
use super::error::MySqlSourceError;
use super::offset::{order_key, MySqlOffset};
use super::position::Position;
use super::shape::TableShape;
use super::snapshot::{SnapshotLockingMode, SnapshotReader, SnapshotSettings};
use crate::config::CaptureConfig;

pub use crate::config::mysql::SYSTEM_DATABASES;

/// The connection settings of capture's `database.*` keys.
pub fn opts(cfg: &CaptureConfig) -> Opts {
    let password = cfg.database_password.expose();
    OptsBuilder::default()
        .ip_or_hostname(cfg.database_hostname.clone())
        .tcp_port(cfg.port())
        .user(Some(cfg.database_user.clone()))
        .pass((!password.is_empty()).then(|| password.to_owned()))
        .into()
}

/// A connection to the source for catalog reads and key look-ups.
pub struct MySqlCatalog {
    conn: Conn,
    opts: Opts,
    flavor: Flavor,
    /// `SELECT VERSION()`: which binlog status statement it has.
    version: String,
}

impl MySqlCatalog {
    /// Connects with capture's `database.*` settings.
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, MySqlSourceError> {
        let opts = opts(cfg);
        let mut conn = Conn::new(opts.clone())
            .await
            .map_err(|e| MySqlSourceError::server("connect", e))?;
        let version: String = conn
            .query_first("SELECT VERSION()")
            .await
            .map_err(|e| MySqlSourceError::server("read the server version", e))?
            .ok_or_else(|| MySqlSourceError::Protocol("no row from SELECT VERSION()".into()))?;
        Ok(Self {
            conn,
            opts,
            flavor: Flavor::from_version(&version),
            version,
        })
    }

    /// The order key of the server's binlog end now, the scale of a MySQL
    /// capture's offset records (`flush_lsn`): once capture's committed
    /// offset reaches it, every change made before is in Kafka.
    pub async fn position_now(&mut self) -> Result<u64, MySqlSourceError> {
        let at = current_position(&mut self.conn, self.flavor, &self.version).await?;
        order_key(&at)
    }

    /// [`Self::position_now`] in the failover epoch capture streams this
    /// server at: `stored`'s own when it is of this server, one up when it
    /// is another's (capture takes it over, `offset.rs`), else 0.
    pub async fn position_now_after(
        &mut self,
        stored: Option<&MySqlOffset>,
    ) -> Result<u64, MySqlSourceError> {
        let (mut at, facts) = self.binlog_status().await?;
        at.epoch = match stored {
            Some(part) if part.server == facts.server => part.position.epoch,
            Some(part) => part.position.epoch.saturating_add(1),
            None => 0,
        };
        order_key(&at)
    }

    /// The shapes of the tables capture captures, by database and name.
    pub async fn captured_tables(
        &mut self,
        cfg: &CaptureConfig,
    ) -> Result<Vec<TableShape>, MySqlSourceError> {
        let mut out = Vec::new();
        for (db, table) in selected_names(&mut self.conn, cfg).await? {
            out.push(TableShape::from_catalog(&mut self.conn, self.flavor, &db, &table).await?);
        }
        Ok(out)
    }

    /// A consistent read of `shape`'s table: the snapshot reader without
    /// locks (verify must not stop writers), in its own read view, whose
    /// [`SnapshotReader::read_chunk`] pages through the rows in key order.
    pub async fn read(&self, shape: &TableShape) -> Result<SnapshotReader, MySqlSourceError> {
        let settings = SnapshotSettings {
            locking_mode: SnapshotLockingMode::None,
        };
        SnapshotReader::begin(
            self.opts.clone(),
            &settings,
            &[(shape.database.clone(), shape.table.clone())],
        )
        .await
    }

    /// Inserts a signal row (`id`, `type`, `data`, as Debezium's signal
    /// table has them) into `database`.`table` (`signal.data.collection`):
    /// the running capture reads it from the binlog. The user needs
    /// `INSERT` on that table.
    pub async fn insert_signal(
        &mut self,
        (database, table): (&str, &str),
        id: &str,
        kind: &str,
        data: Option<&str>,
    ) -> Result<(), MySqlSourceError> {
        let sql = format!(
            "INSERT INTO {}.{} (id, type, data) VALUES (?, ?, ?)",
            quote_mysql_ident(database),
            quote_mysql_ident(table)
        );
        self.conn
            .exec_drop(sql, (id, kind, data))
            .await
            .map_err(|e| MySqlSourceError::server("insert the signal", e))
    }

    /// The server's binlog end (file, offset, GTIDs), then its facts
    /// (settings, grants, identity, `SHOW BINARY LOGS`): what `oncely
    /// status` holds a stored offset against. The end is read first, so
    /// its file is among the binlogs listed after it.
    pub async fn binlog_status(&mut self) -> Result<(Position, ServerFacts), MySqlSourceError> {
        let end = current_position(&mut self.conn, self.flavor, &self.version).await?;
        let facts = self.server_facts().await?;
        Ok((end, facts))
    }

    /// The server's facts alone (settings, grants, identity, `SHOW BINARY
    /// LOGS` when the user may list them): read also without the grant
    /// that reads the binlog's end, to say which grant is missing.
    pub async fn server_facts(&mut self) -> Result<ServerFacts, MySqlSourceError> {
        ServerFacts::read(&mut self.conn).await
    }

    /// Of `keys` (each the key columns' values as text, in key order), the
    /// key cells of the rows the table holds; the server converts the text
    /// to the key columns' types.
    pub async fn existing(
        &mut self,
        shape: &TableShape,
        keys: &[Vec<String>],
    ) -> Result<Vec<Vec<Cell>>, MySqlSourceError> {
        let n = shape.primary_key.len();
        let keys: Vec<&Vec<String>> = keys.iter().filter(|k| k.len() == n).collect();
        if n == 0 || keys.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = shape
            .primary_key
            .iter()
            .map(|&i| quote_mysql_ident(&shape.columns[i].name))
            .collect();
        let tuple = format!("({})", vec!["?"; n].join(", "));
        let sql = format!(
            "SELECT {cols} FROM {}.{} WHERE ({cols}) IN ({})",
            quote_mysql_ident(&shape.database),
            quote_mysql_ident(&shape.table),
            vec![tuple.as_str(); keys.len()].join(", "),
            cols = names.join(", "),
        );
        let params: Vec<Value> = keys
            .iter()
            .flat_map(|k| k.iter().map(|t| Value::Bytes(t.clone().into_bytes())))
            .collect();
        let rows: Vec<mysql_async::Row> = self
            .conn
            .exec(sql, params)
            .await
            .map_err(|e| MySqlSourceError::server("look up keys in a source table", e))?;
        rows.into_iter()
            .map(|row| {
                row.unwrap()
                    .into_iter()
                    .zip(&shape.primary_key)
                    .map(|(v, &i)| {
                        Cell::from_query(&shape.columns[i], v).map_err(MySqlSourceError::Protocol)
                    })
                    .collect()
            })
            .collect()
    }
}

/// The `(database, table)` of the base tables `database.include.list`,
/// `table.include.list` and `table.exclude.list` select, the server's own
/// databases left out.
pub async fn selected_names(
    conn: &mut Conn,
    cfg: &CaptureConfig,
) -> Result<Vec<(String, String)>, MySqlSourceError> {
    let filter = cfg
        .captured_tables_filter()
        .map_err(|e| MySqlSourceError::Protocol(e.to_string()))?;
    let rows: Vec<(String, String)> = conn
        .query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME",
        )
        .await
        .map_err(|e| MySqlSourceError::server("read information_schema.TABLES", e))?;
    Ok(rows
        .into_iter()
        .filter(|(db, table)| filter.matches(db, table))
        .collect())
}
