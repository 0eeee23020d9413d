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
//! is no publication to add a table to). The schema watch's questions are
//! answered the same way: from the tables as the stream last described
//! them (the [`Described`] board), whose columns are numbered by the shape
//! facts derived from DDL text (`history.rs`), never from the catalog now,
//! which may be past later DDL.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::catalog::selected_names;
use super::checks::{binary_logs, current_position, Flavor};
use super::error::MySqlSourceError;
use super::offset::order_key;
use super::position::{binlog_bytes_between, Position};
use super::stream::MySqlTable;
use crate::change::{RowImage, StreamTable};
use crate::config::CaptureConfig;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::filter::parse_key_columns;
use crate::schema_change::{match_attnums, ColumnDef, FormerName, TableSchemas};
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
    /// Each table as the stream last described it, by `database.table`.
    described: Mutex<BTreeMap<String, Described>>,
    /// The failover epoch the stream reads this server in (`offset.rs`).
    epoch: u32,
}

/// A table as the stream last described it (a TABLE_MAP with the shape
/// facts' column numbers, as of its binlog position): what the schema
/// watch compares and snapshot chunks are numbered by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    /// Its numbered columns, in number order.
    columns: Vec<ColumnDef>,
    identity: SourceIdentity,
}

impl Described {
    /// `None` for a table the facts do not number.
    fn of(table: &MySqlTable) -> Option<Self> {
        let identity = table.shape.identity.clone()?;
        let mut columns: Vec<ColumnDef> = table
            .shape
            .columns
            .iter()
            .zip(&identity.attnums)
            .filter_map(|(c, n)| {
                Some(ColumnDef {
                    attnum: (*n)?,
                    name: c.name.clone(),
                    type_name: binlog_type_name(c),
                    not_null: !c.nullable,
                    // MySQL fills existing rows of an added column without
                    // row events whenever it has a default, an explicit one
                    // or NOT NULL's implicit one, which the binlog does not
                    // tell: every added column is taken to have one, so its
                    // rows are backfilled.
                    has_default: true,
                })
            })
            .collect();
        columns.sort_by_key(|c| c.attnum);
        Some(Self { columns, identity })
    }
}

/// A column's type as its TABLE_MAP gives it: the binlog type, its
/// metadata bytes and signedness (`long`, `newdecimal(12,2)`,
/// `varchar(80,0)`, `longlong unsigned`), so a widening changes it.
fn binlog_type_name(c: &super::shape::ColumnShape) -> String {
    let ty = format!("{:?}", c.ty);
    let mut out = ty.trim_start_matches("MYSQL_TYPE_").to_ascii_lowercase();
    if !c.meta.is_empty() {
        let meta: Vec<String> = c.meta.iter().map(u8::to_string).collect();
        out.push_str(&format!("({})", meta.join(",")));
    }
    if c.unsigned {
        out.push_str(" unsigned");
    }
    out
}

impl MySqlControl {
    pub(crate) fn new(conn: Conn, flavor: Flavor, version: String) -> Self {
        Self {
            conn,
            flavor,
            version,
            described: Mutex::new(BTreeMap::new()),
            epoch: 0,
        }
    }

    /// Reads positions in failover epoch `epoch`, as the stream does.
    pub(crate) fn in_epoch(mut self, epoch: u32) -> Self {
        self.epoch = epoch;
        self
    }

    /// Notes the stream's description of `table`; whether the table's
    /// columns or numbers differ from those noted before (or none were).
    fn note_described(&self, table: &MySqlTable) -> bool {
        let qualified = format!("{}.{}", table.namespace, table.name);
        let mut board = self
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = match Described::of(table) {
            Some(d) if board.get(&qualified) == Some(&d) => return false,
            Some(d) => board.insert(qualified.clone(), d),
            None => board.remove(&qualified),
        };
        old.is_some() || board.contains_key(&qualified)
    }

    fn described(&self, qualified: &str) -> Option<Described> {
        let board = self
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        board.get(qualified).cloned()
    }

    pub(crate) fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// Binlog bytes from `from` to the server's end now, across files
    /// (`None` when `from`'s file is no longer listed or is another
    /// server's): what the server must still hold for capture to resume.
    pub(crate) async fn bytes_behind(
        &mut self,
        from: &Position,
    ) -> Result<Option<u64>, MySqlSourceError> {
        let end = current_position(&mut self.conn, self.flavor, &self.version).await?;
        let logs = binary_logs(&mut self.conn)
            .await
            .map_err(|e| MySqlSourceError::server("SHOW BINARY LOGS", e))?;
        Ok(binlog_bytes_between(
            &logs,
            &from.coordinates(),
            &end.coordinates(),
        ))
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

    /// The columns of `tables` as the stream last described them (not the
    /// catalog now, which may be past DDL the stream has not reached): a
    /// table the stream has not described yet is left out until it is.
    async fn columns(&self, tables: &[String]) -> Result<TableSchemas, CaptureError> {
        let board = self
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(tables
            .iter()
            .filter_map(|t| Some((t.clone(), board.get(t)?.columns.clone())))
            .collect())
    }

    /// A stream table carries its own identity; a snapshot chunk's is
    /// [`chunk_identity`].
    async fn identity(
        &self,
        table: &MySqlTable,
        known: Option<&[ColumnDef]>,
        former: &[FormerName],
        _xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        if let Some(id) = &table.shape.identity {
            return Ok(Some(id.clone()));
        }
        let qualified = format!("{}.{}", table.namespace, table.name);
        let described = self.described(&qualified);
        Ok(chunk_identity(table, described.as_ref(), known, former))
    }
}

/// The identity of a snapshot chunk's table (read from the catalog at the
/// chunk's binlog position, which the stream has reached when its rows go
/// out). Numbered by the shape facts as of that position, as the stream's
/// own rows there are: the stream's last description may be older, since
/// DDL sends no TABLE_MAP (a chunk read after `RENAME COLUMN a TO b` and
/// before the table's next row event would find no `b` in it, and the
/// warehouse would add `b` as a column of its own beside the renamed `a`).
/// A table the facts do not number (or a column they do not cover: DDL
/// the parser passed over) is matched by name against the stream's last
/// description (`described`), then `known` and `former` names.
fn chunk_identity(
    table: &MySqlTable,
    described: Option<&Described>,
    known: Option<&[ColumnDef]>,
    former: &[FormerName],
) -> Option<SourceIdentity> {
    let names: Vec<&str> = table
        .shape
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    if let Some(numbering) = &table.numbering {
        let facts = Arc::clone(&numbering.lock().unwrap_or_else(PoisonError::into_inner));
        if let Some(ids) = facts.ids(&table.shape.database, &table.shape.table) {
            if ids.covers(names.iter().copied()) {
                return Some(ids.identity(names.iter().copied()));
            }
        }
    }
    let described = described?;
    let candidates: Vec<(i16, &str)> = described
        .columns
        .iter()
        .chain(known.unwrap_or_default())
        .map(|c| (c.attnum, c.name.as_str()))
        .chain(former.iter().map(|f| (f.attnum, f.name.as_str())))
        .collect();
    let attnums = match_attnums(&names, &candidates);
    let mut dropped = described.identity.dropped.clone();
    dropped.retain(|d| !attnums.contains(&Some(*d)));
    Some(SourceIdentity {
        table_oid: described.identity.table_oid,
        attnums,
        dropped,
    })
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

    /// MySQL's rules for a filter ([`super::filter`]), then the server
    /// prepares, never runs, its probe on a connection of its own (as
    /// [`SnapshotTableChecks::primary_key`]): an unknown column or a
    /// syntax error refuses the signal with the server's message.
    async fn check_filter(
        &self,
        filter: &str,
        schema: &str,
        name: &str,
    ) -> Result<Result<(), String>, CaptureError> {
        if let Err(why) = super::filter::check(filter, schema, name) {
            return Ok(Err(why));
        }
        let lost = |e| MySqlSourceError::server("check a snapshot filter", e).into_capture();
        let mut conn = Conn::new(self.conn.opts().clone()).await.map_err(lost)?;
        let prepared = conn.prep(super::filter::probe(filter, schema, name)).await;
        let checked = match prepared {
            Ok(statement) => {
                let ty = statement.columns().first().map(|c| c.column_type());
                conn.close(statement).await.map_err(lost)?;
                probe_type(ty)
            }
            Err(mysql_async::Error::Server(e)) => Err(format!(
                "the filter does not work: {} (MySQL error {})",
                e.message, e.code
            )),
            Err(e) => return Err(lost(e)),
        };
        let _ = conn.disconnect().await;
        Ok(checked)
    }
}

/// A condition's value is an integer (MySQL's truth value), or NULL.
fn probe_type(ty: Option<mysql_async::consts::ColumnType>) -> Result<(), String> {
    use mysql_async::consts::ColumnType::*;
    match ty {
        Some(
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_NULL,
        ) => Ok(()),
        other => Err(format!(
            "the filter is not a condition (the server gives it the type {})",
            other.map_or_else(|| "none".to_owned(), |t| format!("{t:?}"))
        )),
    }
}

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
/// later DDL), and its identity from the shape facts as of that event.
pub struct StreamTables<'a> {
    control: &'a MySqlControl,
}

impl<'a> StreamTables<'a> {
    pub(crate) fn new(control: &'a MySqlControl) -> Self {
        Self { control }
    }
}

impl TableCatalog for StreamTables<'_> {
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
        table: &MySqlTable,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        Ok(table.shape.identity.clone())
    }

    /// The binlog announces no value types.
    async fn learn_types(&mut self, _types: &mut ()) -> Result<(), CaptureError> {
        Ok(())
    }

    /// What the schema watch compares from now on: compared at once when
    /// it changed, so a table's first description is its baseline before
    /// any later DDL (else a DROP before the next heartbeat would be the
    /// baseline, and no record would say the column went).
    fn described(&mut self, table: &MySqlTable) -> bool {
        self.control.note_described(table)
    }
}

#[cfg(test)]
mod tests {
    use mysql_async::consts::ColumnType;

    use super::*;
    use crate::sources::mysql::envelope::MySqlRowImages;
    use crate::sources::mysql::history::ShapeFacts;
    use crate::sources::mysql::mapping::MappingConfig;
    use crate::sources::mysql::shape::{ColumnShape, TableShape};

    fn table(columns: &[&str], facts: &ShapeFacts, numbering: Option<&ShapeFacts>) -> MySqlTable {
        let mut shape = TableShape {
            database: "shop".into(),
            table: "orders".into(),
            columns: columns
                .iter()
                .map(|c| ColumnShape::new(c, ColumnType::MYSQL_TYPE_LONG))
                .collect(),
            primary_key: vec![0],
            identity: None,
        };
        if numbering.is_none() {
            // A stream table: numbered by the facts as of its TABLE_MAP.
            let ids = facts.ids("shop", "orders").expect("numbered");
            shape.identity = Some(ids.identity(columns.iter().copied()));
        }
        let shape = Arc::new(shape);
        MySqlTable {
            id: 1,
            namespace: "shop".into(),
            name: "orders".into(),
            images: MySqlRowImages::new(Arc::clone(&shape), MappingConfig::default()),
            shape,
            facts: Default::default(),
            numbering: numbering.map(|f| Arc::new(Mutex::new(Arc::new(f.clone())))),
        }
    }

    /// The stream's last TABLE_MAP of the table came before `DROP gone`
    /// and `RENAME COLUMN`; a chunk read after both goes out once the
    /// stream has passed them, before the table's next row event.
    #[test]
    fn a_chunk_read_after_a_rename_the_stream_passed_keeps_the_renamed_columns_number() {
        let mut facts = ShapeFacts::default();
        facts.apply_ddl(
            "shop",
            "CREATE TABLE orders (id int PRIMARY KEY, qty int, gone int, `old name` int, note int)",
        );
        let before = ["id", "qty", "gone", "old name", "note"];
        let described = Described::of(&table(&before, &facts, None)).expect("numbered");
        facts.apply_ddl("shop", "ALTER TABLE orders DROP gone");
        facts.apply_ddl(
            "shop",
            "ALTER TABLE orders RENAME COLUMN `old name` TO `new name`",
        );
        let chunk = table(&["id", "qty", "new name", "note"], &facts, Some(&facts));
        let id = chunk_identity(&chunk, Some(&described), Some(&described.columns), &[])
            .expect("an identity");
        assert_eq!(
            id.attnums,
            vec![Some(1), Some(2), Some(4), Some(5)],
            "`new name` is the renamed column 4, not a column without a number"
        );
        assert_eq!(id.dropped, vec![3]);
        assert_eq!(id.table_oid, described.identity.table_oid);

        // Facts that do not number the table: by name against the
        // stream's last description, as before.
        let unnumbered = table(
            &["id", "qty", "old name", "note"],
            &facts,
            Some(&ShapeFacts::default()),
        );
        let id = chunk_identity(&unnumbered, Some(&described), None, &[]).expect("an identity");
        assert_eq!(id.attnums, vec![Some(1), Some(2), Some(4), Some(5)]);
    }

    /// Two chunks of one pass, `c` dropped and added again under its name
    /// and type between them: their tables are equal (one shape), so only
    /// their identities tell the new `c` from the dropped one (the chunk
    /// encoder's cache is keyed by both).
    #[test]
    fn a_column_dropped_and_added_again_between_two_chunks_is_another_column() {
        let mut facts = ShapeFacts::default();
        facts.apply_ddl("shop", "CREATE TABLE orders (id int PRIMARY KEY, c int)");
        let mut again = facts.clone();
        again.apply_ddl("shop", "ALTER TABLE orders DROP c");
        again.apply_ddl("shop", "ALTER TABLE orders ADD c int");
        let names = ["id", "c"];
        let first = table(&names, &facts, Some(&facts));
        let second = table(&names, &again, Some(&again));
        assert!(first == second, "one shape");
        let first = chunk_identity(&first, None, None, &[]).expect("numbered");
        let second = chunk_identity(&second, None, None, &[]).expect("numbered");
        assert_eq!(first.attnums, vec![Some(1), Some(2)]);
        assert_eq!(second.attnums, vec![Some(1), Some(3)], "a new `c`");
        assert_eq!(second.dropped, vec![2]);
    }

    /// `information_schema` has no read view: a RENAME committed between a
    /// chunk's read view and its catalog read gives it names the stream
    /// does not know at the chunk's high watermark, before the RENAME.
    #[test]
    fn a_chunk_whose_catalog_read_is_past_its_position_is_read_again() {
        let mut facts = ShapeFacts::default();
        facts.apply_ddl(
            "shop",
            "CREATE TABLE orders (id int PRIMARY KEY, `old name` int)",
        );
        let mut renamed = facts.clone();
        renamed.apply_ddl(
            "shop",
            "ALTER TABLE orders RENAME COLUMN `old name` TO `new name`",
        );
        let names = ["id", "new name"];
        assert!(table(&names, &renamed, Some(&facts)).shape_ahead_of_stream());
        assert!(!table(&names, &renamed, Some(&renamed)).shape_ahead_of_stream());
        // Facts that do not number the table cannot tell.
        assert!(!table(&names, &renamed, Some(&ShapeFacts::default())).shape_ahead_of_stream());
        // A stream table is its event's own shape.
        assert!(!table(&names, &renamed, None).shape_ahead_of_stream());
    }
}
