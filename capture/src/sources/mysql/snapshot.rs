//! The initial snapshot, consistent with the binlog position the stream
//! then starts from (Debezium's sequence):
//!
//! ```text
//!  FLUSH TABLES WITH READ LOCK        (no RELOAD: LOCK TABLES t.. READ)
//!  START TRANSACTION WITH CONSISTENT SNAPSHOT   (not under table locks)
//!  shapes from information_schema, position (file, pos, GTIDs)
//!  UNLOCK TABLES                      (table locks: only after the last chunk)
//!  SELECT .. WHERE key > last ORDER BY key LIMIT n   (chunk after chunk)
//!  COMMIT
//! ```
//!
//! The invariant it keeps: every row a chunk returns is the row as of the
//! position, so the stream from the position gives exactly the changes
//! the snapshot does not hold. The lock only has to keep writers out
//! between the transaction's read view and the reading of the position;
//! reading happens after it, in the transaction. `LOCK TABLES` ends any
//! transaction (and `START TRANSACTION` ends table locks), so without
//! RELOAD the tables stay locked, against writers, until the snapshot
//! finishes. `snapshot.locking.mode = none` takes no lock: see
//! docs/mysql.md for the window that leaves open.

use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Value};
use oncely_core::sql::quote_mysql_ident;

use super::cell::Cell;
use super::checks::{current_position, Flavor};
use super::error::{codes, MySqlSourceError};
use super::history::ShapeFacts;
use super::position::Position;
use super::shape::{CatalogColumn, ColumnShape, TableShape};
use mysql_async::consts::ColumnType;

pub use crate::config::mysql::SnapshotLockingMode;

/// The snapshot reader's settings (`snapshot.locking.mode` is also a
/// capture key, `CaptureConfig::snapshot_locking_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSettings {
    #[serde(rename = "snapshot.locking.mode", default)]
    pub locking_mode: SnapshotLockingMode,
}

/// The lock a snapshot took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLock {
    /// `FLUSH TABLES WITH READ LOCK`, released once the position was read.
    Global,
    /// `LOCK TABLES .. READ` of the captured tables, held to the end.
    Tables,
    /// `snapshot.locking.mode = none`.
    None,
}

/// One chunk of a table, in key order.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub rows: Vec<Vec<Cell>>,
    /// The key of the last row, to read the next chunk after; `None` when
    /// the table is done.
    pub next: Option<Vec<Cell>>,
}

/// An open snapshot: a connection in the snapshot's transaction (or under
/// its table locks) and the position the stream continues from.
pub struct SnapshotReader {
    conn: Conn,
    position: Position,
    lock: SnapshotLock,
    shapes: Vec<Arc<TableShape>>,
}

impl SnapshotReader {
    /// Locks, opens the snapshot's transaction, reads the shapes of
    /// `tables` (`(database, table)`) and the binlog position, unlocks.
    pub async fn begin(
        opts: Opts,
        settings: &SnapshotSettings,
        tables: &[(String, String)],
    ) -> Result<Self, MySqlSourceError> {
        let q = |c| move |e| MySqlSourceError::server(c, e);
        let mut conn = Conn::new(opts).await.map_err(q("connect"))?;
        // TIMESTAMPs come back as UTC readings (Cell::from_query).
        conn.query_drop("SET SESSION time_zone = '+00:00'")
            .await
            .map_err(q("set the snapshot's time zone"))?;
        let (version, user): (String, String) = conn
            .query_first("SELECT VERSION(), CURRENT_USER()")
            .await
            .map_err(q("read the server version"))?
            .ok_or_else(|| MySqlSourceError::Protocol("no row from SELECT VERSION()".into()))?;
        let flavor = Flavor::from_version(&version);
        let lock = match settings.locking_mode {
            SnapshotLockingMode::Minimal => take_lock(&mut conn, tables, &user).await?,
            SnapshotLockingMode::None => SnapshotLock::None,
        };
        if lock != SnapshotLock::Tables {
            conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                .await
                .map_err(q("start the snapshot transaction"))?;
        }
        let mut shapes = Vec::with_capacity(tables.len());
        for (db, table) in tables {
            shapes.push(Arc::new(
                TableShape::from_catalog(&mut conn, flavor, db, table).await?,
            ));
        }
        let position = current_position(&mut conn, flavor, &version).await?;
        if lock == SnapshotLock::Global {
            conn.query_drop("UNLOCK TABLES")
                .await
                .map_err(q("release the global read lock"))?;
        }
        Ok(Self {
            conn,
            position,
            lock,
            shapes,
        })
    }

    /// Where the stream continues: every change after it is not in the
    /// snapshot's rows, every change before it is.
    pub fn position(&self) -> &Position {
        &self.position
    }

    pub fn lock(&self) -> SnapshotLock {
        self.lock
    }

    /// The shape facts of the snapshotted tables as of the position (read
    /// under the lock), for the stream that continues from it.
    pub fn facts(&self) -> ShapeFacts {
        let mut facts = ShapeFacts::default();
        for s in &self.shapes {
            let cols: Vec<CatalogColumn> = s
                .columns
                .iter()
                .map(|c| CatalogColumn {
                    name: c.name.clone(),
                    column_type: c.declared.clone().unwrap_or_default(),
                    json: c.json,
                })
                .collect();
            facts.set_from_catalog(&s.database, &s.table, &cols);
        }
        facts
    }

    /// The shape of a snapshotted table, as of the position.
    pub fn shape(&self, database: &str, table: &str) -> Option<Arc<TableShape>> {
        self.shapes
            .iter()
            .find(|s| s.database == database && s.table == table)
            .cloned()
    }

    /// Up to `limit` rows of the table after key `after` (from the start
    /// when `None`), in primary key order. A table without a primary key
    /// is read whole in one chunk. Resumable: `after` is the `next` of
    /// the chunk before, or a stored one.
    pub async fn read_chunk(
        &mut self,
        database: &str,
        table: &str,
        after: Option<&[Cell]>,
        limit: usize,
    ) -> Result<Chunk, MySqlSourceError> {
        let shape = self.shape(database, table).ok_or_else(|| {
            MySqlSourceError::Protocol(format!(
                "{database}.{table} is not among the snapshot's tables"
            ))
        })?;
        read_rows(&mut self.conn, &shape, after, None, limit).await
    }

    /// Ends the snapshot's transaction (or its table locks) and closes the
    /// connection.
    pub async fn finish(mut self) -> Result<(), MySqlSourceError> {
        let end = match self.lock {
            SnapshotLock::Tables => "UNLOCK TABLES",
            SnapshotLock::Global | SnapshotLock::None => "COMMIT",
        };
        self.conn
            .query_drop(end)
            .await
            .map_err(|e| MySqlSourceError::server("end the snapshot", e))?;
        self.conn
            .disconnect()
            .await
            .map_err(|e| MySqlSourceError::server("close the snapshot connection", e))
    }
}

/// Up to `limit` rows of `shape`'s table after key `after` in primary key
/// order (the whole table when it has no key) that match `filter` (a
/// checked snapshot filter, [`super::filter`]), read on `conn` as cells:
/// the one reader of the initial snapshot and of the core's chunks
/// ([`super::chunks`]).
pub async fn read_rows(
    conn: &mut Conn,
    shape: &TableShape,
    after: Option<&[Cell]>,
    filter: Option<&str>,
    limit: usize,
) -> Result<Chunk, MySqlSourceError> {
    let (sql, params) = chunk_query(shape, after, filter, limit)?;
    let rows: Vec<mysql_async::Row> = conn
        .exec(sql, params)
        .await
        .map_err(|e| MySqlSourceError::server("read a snapshot chunk", e))?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let cells = row
            .unwrap()
            .into_iter()
            .zip(&shape.columns)
            .map(|(v, col)| {
                Cell::from_query(col, v).map_err(|reason| {
                    MySqlSourceError::Protocol(format!(
                        "column {} of {}: {reason}",
                        col.name,
                        shape.qualified()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(cells);
    }
    let full = !shape.primary_key.is_empty() && out.len() >= limit;
    let next = match out.last() {
        Some(last) if full => Some(shape.primary_key.iter().map(|&i| last[i].clone()).collect()),
        _ => None,
    };
    Ok(Chunk { rows: out, next })
}

/// The global read lock, or, when the user lacks RELOAD, read locks on the
/// captured tables; neither: the fix named.
async fn take_lock(
    conn: &mut Conn,
    tables: &[(String, String)],
    user: &str,
) -> Result<SnapshotLock, MySqlSourceError> {
    match conn.query_drop("FLUSH TABLES WITH READ LOCK").await {
        Ok(()) => return Ok(SnapshotLock::Global),
        Err(mysql_async::Error::Server(e)) if is_denied(e.code) => {}
        Err(e) => return Err(MySqlSourceError::server("take the global read lock", e)),
    }
    if tables.is_empty() {
        return Ok(SnapshotLock::Tables);
    }
    let list: Vec<String> = tables
        .iter()
        .map(|(db, t)| format!("{}.{} READ", quote_mysql_ident(db), quote_mysql_ident(t)))
        .collect();
    match conn
        .query_drop(format!("LOCK TABLES {}", list.join(", ")))
        .await
    {
        Ok(()) => Ok(SnapshotLock::Tables),
        Err(mysql_async::Error::Server(e)) if is_denied(e.code) => {
            Err(MySqlSourceError::SnapshotLockRefused { user: user.into() })
        }
        Err(e) => Err(MySqlSourceError::server("lock the captured tables", e)),
    }
}

fn is_denied(code: u16) -> bool {
    matches!(
        code,
        codes::SPECIFIC_ACCESS_DENIED | codes::DB_ACCESS_DENIED | codes::TABLE_ACCESS_DENIED
    )
}

/// The chunk's SELECT: every column, rows after `after` by the primary key
/// (`k1 > ? OR (k1 = ? AND k2 > ?) ...`, which an index range serves), in
/// key order. Without a primary key: the whole table. A filter comes
/// first, `WHERE (filter) AND (paging)`, each parenthesised so that
/// neither's OR binds to the other's terms.
pub fn chunk_query(
    shape: &TableShape,
    after: Option<&[Cell]>,
    filter: Option<&str>,
    limit: usize,
) -> Result<(String, Vec<Value>), MySqlSourceError> {
    let cols: Vec<String> = shape
        .columns
        .iter()
        .map(|c| quote_mysql_ident(&c.name))
        .collect();
    let mut sql = format!(
        "SELECT {} FROM {}.{}",
        cols.join(", "),
        quote_mysql_ident(&shape.database),
        quote_mysql_ident(&shape.table)
    );
    if let Some(filter) = filter {
        sql.push_str(&format!(" WHERE ({filter})"));
    }
    if shape.primary_key.is_empty() {
        return Ok((sql, Vec::new()));
    }
    let keys: Vec<&str> = shape
        .primary_key
        .iter()
        .map(|&i| cols[i].as_str())
        .collect();
    let holders: Vec<String> = shape
        .primary_key
        .iter()
        .map(|&i| placeholder(&shape.columns[i]))
        .collect();
    let mut params = Vec::new();
    if let Some(after) = after {
        if after.len() != keys.len() {
            return Err(MySqlSourceError::Protocol(format!(
                "a snapshot key of {} values for the {} key columns of {}",
                after.len(),
                keys.len(),
                shape.qualified()
            )));
        }
        let mut ors = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            let mut ands: Vec<String> = (0..i)
                .map(|j| format!("{} = {}", keys[j], holders[j]))
                .collect();
            ands.push(format!("{} > {}", keys[i], holders[i]));
            params.extend(after[..=i].iter().map(key_param));
            ors.push(format!("({})", ands.join(" AND ")));
        }
        match filter {
            Some(_) => sql.push_str(&format!(" AND ({})", ors.join(" OR "))),
            None => sql.push_str(&format!(" WHERE {}", ors.join(" OR "))),
        }
    }
    sql.push_str(&format!(" ORDER BY {} LIMIT {limit}", keys.join(", ")));
    Ok((sql, params))
}

/// A key's parameter in SQL: a DECIMAL one cast to the column's type.
/// MySQL documents a DECIMAL compared with a string as compared in double
/// precision, which rounds: keys differing past 17 digits would be lost or
/// read twice. (MariaDB compares them exactly without the cast; the
/// service test's keys pass either way, so only the SQL is unit-tested.)
fn placeholder(col: &ColumnShape) -> String {
    match col.ty {
        ColumnType::MYSQL_TYPE_NEWDECIMAL | ColumnType::MYSQL_TYPE_DECIMAL => format!(
            "CAST(? AS DECIMAL({}, {}))",
            col.meta_byte(0).max(1),
            col.meta_byte(1)
        ),
        _ => "?".into(),
    }
}

/// A key cell as a statement parameter that compares as the column does.
fn key_param(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::NULL,
        Cell::Int(i) => Value::Int(*i),
        Cell::UInt(u) => Value::UInt(*u),
        Cell::Float(f) => Value::Float(*f),
        Cell::Double(f) => Value::Double(*f),
        Cell::Decimal(t) => Value::Bytes(t.clone().into_bytes()),
        Cell::Bytes(b) => Value::Bytes(b.clone()),
        // BIT compares as the number its big-endian bytes make.
        Cell::Bit(b) => Value::UInt(
            b.iter()
                .rev()
                .take(8)
                .rev()
                .fold(0u64, |n, byte| n << 8 | u64::from(*byte)),
        ),
        Cell::Date { year, month, day } => Value::Date(*year, *month, *day, 0, 0, 0, 0),
        Cell::DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micros,
        } => Value::Date(*year, *month, *day, *hour, *minute, *second, *micros),
        // The session's time zone is UTC: compare as FROM_UNIXTIME does.
        Cell::Timestamp { secs, micros } => {
            let days = secs.div_euclid(86_400);
            let rest = secs.rem_euclid(86_400);
            let (y, m, d) = oncely_core::calendar::civil_from_days(days);
            Value::Date(
                u16::try_from(y).unwrap_or(0),
                u8::try_from(m).unwrap_or(0),
                u8::try_from(d).unwrap_or(0),
                u8::try_from(rest / 3600).unwrap_or(0),
                u8::try_from(rest % 3600 / 60).unwrap_or(0),
                u8::try_from(rest % 60).unwrap_or(0),
                *micros,
            )
        }
        Cell::Time {
            negative,
            hours,
            minutes,
            seconds,
            micros,
        } => Value::Time(
            *negative,
            hours / 24,
            u8::try_from(hours % 24).unwrap_or(0),
            *minutes,
            *seconds,
            *micros,
        ),
        Cell::Year(y) => Value::Int(i64::from(*y)),
        // ENUM compares by index, SET by its bits, as they sort.
        Cell::Enum(i) => Value::Int(i64::from(*i)),
        Cell::Set(m) => Value::UInt(*m),
        Cell::Json(j) => Value::Bytes(j.to_string().into_bytes()),
        Cell::JsonText(t) => Value::Bytes(t.clone().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(keys: Vec<usize>) -> TableShape {
        TableShape {
            database: "shop".into(),
            table: "order`s".into(),
            columns: vec![
                ColumnShape::new("a", ColumnType::MYSQL_TYPE_LONG),
                ColumnShape::new("b", ColumnType::MYSQL_TYPE_VARCHAR),
                ColumnShape::new("c", ColumnType::MYSQL_TYPE_LONG),
            ],
            primary_key: keys,
            identity: None,
        }
    }

    #[test]
    fn chunks_page_by_the_key_in_key_order() {
        let (sql, params) = chunk_query(&shape(vec![2, 0]), None, None, 100).unwrap();
        assert_eq!(
            sql,
            "SELECT `a`, `b`, `c` FROM `shop`.`order``s` ORDER BY `c`, `a` LIMIT 100"
        );
        assert!(params.is_empty());
        let after = [Cell::Int(7), Cell::Int(3)];
        let (sql, params) = chunk_query(&shape(vec![2, 0]), Some(&after), None, 10).unwrap();
        assert_eq!(
            sql,
            "SELECT `a`, `b`, `c` FROM `shop`.`order``s` WHERE (`c` > ?) OR (`c` = ? AND `a` > ?) ORDER BY `c`, `a` LIMIT 10"
        );
        assert_eq!(params, vec![Value::Int(7), Value::Int(7), Value::Int(3)]);
        assert!(chunk_query(&shape(vec![0]), Some(&after), None, 10).is_err());
        // No key: the whole table, once.
        let (sql, _) = chunk_query(&shape(vec![]), None, None, 10).unwrap();
        assert_eq!(sql, "SELECT `a`, `b`, `c` FROM `shop`.`order``s`");
    }

    /// The filter and the key paging are each parenthesised: the paging's
    /// ORs must not bind to the filter's AND (`(f) AND (c > ?) OR (...)`
    /// would read rows the filter leaves out), nor a filter's OR to it.
    #[test]
    fn a_filtered_chunk_ands_the_parenthesised_filter_with_the_parenthesised_paging() {
        let filter = Some("a > 1 OR b = 'x'");
        let (sql, params) = chunk_query(&shape(vec![2, 0]), None, filter, 100).unwrap();
        assert_eq!(
            sql,
            "SELECT `a`, `b`, `c` FROM `shop`.`order``s` WHERE (a > 1 OR b = 'x') ORDER BY `c`, `a` LIMIT 100"
        );
        assert!(params.is_empty());
        let after = [Cell::Int(7), Cell::Int(3)];
        let (sql, params) = chunk_query(&shape(vec![2, 0]), Some(&after), filter, 10).unwrap();
        assert_eq!(
            sql,
            "SELECT `a`, `b`, `c` FROM `shop`.`order``s` WHERE (a > 1 OR b = 'x') AND ((`c` > ?) OR (`c` = ? AND `a` > ?)) ORDER BY `c`, `a` LIMIT 10"
        );
        assert_eq!(params, vec![Value::Int(7), Value::Int(7), Value::Int(3)]);
        // No key: the whole table's matching rows, once.
        let (sql, _) = chunk_query(&shape(vec![]), None, filter, 10).unwrap();
        assert_eq!(
            sql,
            "SELECT `a`, `b`, `c` FROM `shop`.`order``s` WHERE (a > 1 OR b = 'x')"
        );
    }

    #[test]
    fn locking_mode_has_debezium_s_names() {
        let s: SnapshotSettings =
            serde_json::from_value(serde_json::json!({"snapshot.locking.mode": "none"})).unwrap();
        assert_eq!(s.locking_mode, SnapshotLockingMode::None);
        let d: SnapshotSettings = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(d.locking_mode, SnapshotLockingMode::Minimal);
        assert!(serde_json::from_value::<SnapshotSettings>(
            serde_json::json!({"snapshot.locking.mode": "extended"})
        )
        .is_err());
    }

    #[test]
    fn decimal_keys_compare_as_decimals_and_bits_as_numbers() {
        let mut d = ColumnShape::new("d", ColumnType::MYSQL_TYPE_NEWDECIMAL);
        d.meta = vec![65, 30];
        let shape = TableShape {
            database: "s".into(),
            table: "t".into(),
            columns: vec![d, ColumnShape::new("b", ColumnType::MYSQL_TYPE_BIT)],
            primary_key: vec![0, 1],
            identity: None,
        };
        let after = [
            Cell::Decimal("1.000000000000000000000000000001".into()),
            Cell::Bit(vec![0x0a, 0xbc]),
        ];
        let (sql, params) = chunk_query(&shape, Some(&after), None, 5).unwrap();
        assert_eq!(
            sql,
            "SELECT `d`, `b` FROM `s`.`t` WHERE (`d` > CAST(? AS DECIMAL(65, 30))) OR (`d` = CAST(? AS DECIMAL(65, 30)) AND `b` > ?) ORDER BY `d`, `b` LIMIT 5"
        );
        assert_eq!(params[2], Value::UInt(0x0abc));
    }

    #[test]
    fn timestamps_compare_as_utc_readings() {
        assert_eq!(
            key_param(&Cell::Timestamp {
                secs: 1_796_432_523,
                micros: 456_000
            }),
            Value::Date(2026, 12, 5, 1, 2, 3, 456_000)
        );
    }
}
