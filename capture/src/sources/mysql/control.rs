//! The MySQL source's control connection: the catalog reads and checks
//! the core asks for while streaming ([`QuarantineChecks`],
//! [`SchemaCatalog`], [`SnapshotTableChecks`], [`UnchangedValues`]) and
//! what the router asks of a streamed table ([`StreamTables`]).
//!
//! What a binlog makes different from PostgreSQL's answers: every TABLE_MAP
//! (with `binlog_row_metadata = FULL`, a start-up check) names the table's
//! columns and primary key as of its event, and every row event carries
//! whole rows (`binlog_row_image = FULL`), so the router's questions are
//! answered from the stream's own description, no value is ever left out
//! of a change, and every table's changes are in the binlog already (there
//! is no publication to add a table to). What is not built yet is refused
//! with its reason, never skipped: snapshot filters (MySQL snapshot reads
//! are another part), schema-change records (the catalog's columns are not
//! compared yet: `columns` answers none, so the schema watch publishes
//! nothing for MySQL tables).

use std::collections::HashMap;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::catalog::selected_names;
use super::checks::{current_position, Flavor};
use super::error::MySqlSourceError;
use super::offset::order_key;
use super::position::Position;
use super::stream::MySqlTable;
use crate::change::{RowImage, StreamTable};
use crate::config::CaptureConfig;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::filter::parse_key_columns;
use crate::schema_change::{ColumnDef, FormerName, TableSchemas};
use crate::seam::{
    CapturedTable, CatalogTable, QuarantineChecks, RoutedTable, SchemaCatalog, Selected,
    SnapshotTableChecks, TableCatalog, UnchangedValues,
};

/// The primary keys of every table, in key order.
const PRIMARY_KEYS_SQL: &str = "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME \
     FROM information_schema.KEY_COLUMN_USAGE WHERE CONSTRAINT_NAME = 'PRIMARY' \
     ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION";

/// The capture user's connection for catalog reads while streaming.
pub struct MySqlControl {
    conn: Conn,
    flavor: Flavor,
    version: String,
    /// The failover epoch the stream reads this server in (`offset.rs`).
    epoch: u32,
}

impl MySqlControl {
    pub(crate) fn new(conn: Conn, flavor: Flavor, version: String) -> Self {
        Self {
            conn,
            flavor,
            version,
            epoch: 0,
        }
    }

    /// Reads positions in failover epoch `epoch`, as the stream does.
    pub(crate) fn in_epoch(mut self, epoch: u32) -> Self {
        self.epoch = epoch;
        self
    }

    pub(crate) fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The order key of the server's binlog end now.
    pub(crate) async fn position_key(&mut self) -> Result<u64, MySqlSourceError> {
        let at = current_position(&mut self.conn, self.flavor, &self.version).await?;
        order_key(&Position {
            epoch: self.epoch,
            ..at
        })
    }
}

/// The tables `cfg` selects, keyed by their primary key (or
/// `message.key.columns`), and those with neither, apart.
pub(crate) async fn selected_tables(
    conn: &mut Conn,
    cfg: &CaptureConfig,
) -> Result<Selected, CaptureError> {
    let overrides = parse_key_columns(cfg.message_key_columns.as_deref())
        .map_err(|e| CaptureError::Prerequisite(format!("message.key.columns: {e}")))?;
    let names = selected_names(conn, cfg)
        .await
        .map_err(MySqlSourceError::into_capture)?;
    let rows: Vec<(String, String, String)> = conn
        .query(PRIMARY_KEYS_SQL)
        .await
        .map_err(|e| MySqlSourceError::server("read primary keys", e).into_capture())?;
    let mut keys: HashMap<(String, String), Vec<String>> = HashMap::new();
    for (db, table, column) in rows {
        keys.entry((db, table)).or_default().push(column);
    }
    let mut selected = Selected::default();
    for (db, table) in names {
        let qualified = format!("{db}.{table}");
        let (key_columns, key_overridden) = match overrides.get(&qualified) {
            Some(cols) => (cols.clone(), true),
            None => (
                keys.remove(&(db.clone(), table.clone()))
                    .unwrap_or_default(),
                false,
            ),
        };
        if key_columns.is_empty() {
            selected.keyless.push(qualified);
            continue;
        }
        selected.tables.push(CapturedTable {
            schema: db,
            name: table,
            key_columns,
            key_overridden,
            partitioned: false,
        });
    }
    Ok(selected)
}

/// Why keyless `table` is set aside, with the fix.
pub(crate) fn keyless_reason(table: &str) -> String {
    MySqlTable::keyless_reason(table)
}

impl QuarantineChecks for MySqlControl {
    async fn selected(&mut self, cfg: &CaptureConfig) -> Result<Selected, CaptureError> {
        selected_tables(&mut self.conn, cfg).await
    }

    fn keyless_reason(&self, table: &str) -> String {
        keyless_reason(table)
    }

    /// Full row images (a start-up check) carry every key.
    async fn identity_problem(
        &mut self,
        _table: &CapturedTable,
    ) -> Result<Option<String>, CaptureError> {
        Ok(None)
    }

    /// Every table's changes are in the binlog already.
    async fn publish(
        &mut self,
        _cfg: &CaptureConfig,
        _table: &CapturedTable,
    ) -> Result<(), CaptureError> {
        Ok(())
    }

    async fn position_now(&mut self) -> Result<u64, CaptureError> {
        self.position_key()
            .await
            .map_err(MySqlSourceError::into_capture)
    }
}

impl SchemaCatalog for MySqlControl {
    type Table = MySqlTable;

    /// Schema-change records are not built for MySQL yet: none of the
    /// catalog's columns are compared (docs/mysql.md), so the schema watch
    /// publishes none. The stream itself follows DDL (each TABLE_MAP
    /// brings the shape its rows were written with).
    async fn columns(&self, _tables: &[String]) -> Result<TableSchemas, CaptureError> {
        Ok(TableSchemas::new())
    }

    /// The envelope names fields by the binlog's column names.
    async fn identity(
        &self,
        _table: &MySqlTable,
        _known: Option<&[ColumnDef]>,
        _former: &[FormerName],
        _xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        Ok(None)
    }
}

impl SnapshotTableChecks for MySqlControl {
    /// On a connection of its own: signals are rare, and the control
    /// connection is not shared (`&self`).
    async fn primary_key(
        &self,
        schema: &str,
        name: &str,
    ) -> Result<Result<Vec<String>, String>, CaptureError> {
        let mut conn = Conn::new(self.conn.opts().clone()).await.map_err(|e| {
            MySqlSourceError::server("read a signalled table's primary key", e).into_capture()
        })?;
        let found: Result<Vec<String>, mysql_async::Error> = conn
            .exec(
                "SELECT k.COLUMN_NAME FROM information_schema.TABLE_CONSTRAINTS c \
                 JOIN information_schema.KEY_COLUMN_USAGE k USING (CONSTRAINT_SCHEMA, CONSTRAINT_NAME, TABLE_NAME) \
                 WHERE c.CONSTRAINT_TYPE = 'PRIMARY KEY' AND c.TABLE_SCHEMA = ? AND c.TABLE_NAME = ? \
                 ORDER BY k.ORDINAL_POSITION",
                (schema, name),
            )
            .await;
        let exists: Option<u8> = conn
            .exec_first(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (schema, name),
            )
            .await
            .map_err(|e| {
                MySqlSourceError::server("read a signalled table's primary key", e).into_capture()
            })?;
        let _ = conn.disconnect().await;
        let key = found.map_err(|e| {
            MySqlSourceError::server("read a signalled table's primary key", e).into_capture()
        })?;
        Ok(match exists {
            Some(_) => Ok(key),
            None => Err(format!("no table `{schema}`.`{name}` on the server")),
        })
    }

    /// Filtered chunks are not read on MySQL: refused, never read unfiltered.
    async fn check_filter(
        &self,
        _filter: &str,
        _schema: &str,
        _name: &str,
    ) -> Result<Result<(), String>, CaptureError> {
        Ok(Err(FILTERS_NOT_BUILT.into()))
    }
}

/// A signal's filtered snapshot of a MySQL table is refused, with why.
const FILTERS_NOT_BUILT: &str = "filtered snapshots (additional-conditions) of a MySQL source \
     are not built in this build: the signal is refused (docs/mysql.md)";

/// Whole rows are in every change (`binlog_row_image = FULL`, a start-up
/// check): nothing is left out, so the row is its own answer.
impl UnchangedValues for MySqlControl {
    type Table = MySqlTable;

    async fn read_unchanged(
        &mut self,
        _table: &MySqlTable,
        _key_idx: &[usize],
        _xid: u32,
        row: &RowImage,
    ) -> Result<Option<RowImage>, CaptureError> {
        Ok(Some(row.clone()))
    }
}

/// What the router asks about a streamed MySQL table, answered from the
/// TABLE_MAP that described it: its names and primary key as of its event,
/// which is what its rows were written with (the catalog now may be past
/// later DDL).
pub struct StreamTables;

impl TableCatalog for StreamTables {
    type Table = MySqlTable;
    type Types = ();

    /// A partitioned MySQL table is one table in the binlog.
    async fn published_as(
        &mut self,
        _table: &MySqlTable,
    ) -> Result<Option<(String, String)>, CaptureError> {
        Ok(None)
    }

    async fn current(&mut self, table: &MySqlTable) -> Result<Option<CatalogTable>, CaptureError> {
        Ok(Some(CatalogTable {
            schema: table.namespace().to_owned(),
            name: table.name().to_owned(),
            primary_key: table.stream_key(),
        }))
    }

    async fn identity(
        &mut self,
        _qualified: &str,
        _table: &MySqlTable,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        Ok(None)
    }

    /// The binlog announces no value types.
    async fn learn_types(&mut self, _types: &mut ()) -> Result<(), CaptureError> {
        Ok(())
    }
}
