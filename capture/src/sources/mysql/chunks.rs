//! The core's snapshot chunks (initial, new tables, signals, verify's
//! repair) read from MySQL or MariaDB, with watermarks at a binlog
//! position instead of messages written into the log.
//!
//! ```text
//!  start (pipeline task):  START TRANSACTION WITH CONSISTENT SNAPSHOT
//!                          C = Binlog_snapshot_file/_position   (MariaDB)
//!                          board.register(C, chunk id) ──▶ MySqlStream hands out
//!  task:                   shape, SELECT .. ORDER BY key LIMIT n+1, COMMIT
//!                                                  low, high at C (watermarks.rs)
//! ```
//!
//! The invariant: the chunk's rows are the table exactly as of C — every
//! transaction binlogged before C visible, none after — and its
//! watermarks reach the pipeline between the transactions before C and
//! those after, so its rows, versioned at C - 1, lose to every later
//! change and win over every earlier one. MariaDB reports C for the read
//! view itself (`Binlog_snapshot_*`, taken with the read view under its
//! commit order, no lock). MySQL has no such status: C is read under a
//! brief `FLUSH TABLES WITH READ LOCK`, which waits for commits in flight,
//! so no transaction is binlogged and not yet visible while the read view
//! opens (`snapshot.locking.mode = none` skips the lock; see
//! docs/mysql.md for what that leaves open). Rows are read by the initial
//! snapshot's reader ([`super::snapshot::read_rows`]) as the binlog
//! decoder's cells, rendered by the stream's mapping.

use std::sync::{Arc, Mutex, PoisonError};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::Mutex as AsyncMutex;

use super::cell::Cell;
use super::checks::{current_position, status_statement, Flavor};
use super::envelope::{MySqlRowImages, SharedFacts};
use super::error::{codes, MySqlSourceError};
use super::mapping::MappingConfig;
use super::offset::order_key;
use super::position::Position;
use super::shape::TableShape;
use super::snapshot::{read_rows, SnapshotLockingMode};
use super::stream::MySqlTable;
use super::watermarks::{SharedNumbering, WatermarkBoard};
use crate::change::{Datum, RowImage};
use crate::error::CaptureError;
use crate::seam::{ChunkError, ChunkReads, ChunkRequest, ChunkRows, ChunkTask};
use mysql_async::consts::ColumnType;

/// How a chunk's read view is tied to a binlog position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadView {
    /// MariaDB: the read view's own position, from its status variables.
    SnapshotStatus,
    /// MySQL: the position read under the global read lock.
    Locked,
    /// MySQL under `snapshot.locking.mode = none`: read after the view.
    Unlocked,
}

impl ReadView {
    pub fn of(flavor: Flavor, mode: SnapshotLockingMode) -> Self {
        match (flavor, mode) {
            (Flavor::MariaDb, _) => Self::SnapshotStatus,
            (Flavor::MySql, SnapshotLockingMode::Minimal) => Self::Locked,
            (Flavor::MySql, SnapshotLockingMode::None) => Self::Unlocked,
        }
    }

    /// The statements that open the read view and read its position, in
    /// order (the position's own statement named for MySQL `version`).
    pub fn statements(self, version: &str) -> Vec<&'static str> {
        const BEGIN: &str = "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY";
        match self {
            Self::SnapshotStatus => vec![BEGIN, SNAPSHOT_STATUS],
            Self::Locked => vec![
                "FLUSH TABLES WITH READ LOCK",
                BEGIN,
                status_statement(Flavor::MySql, version),
                "UNLOCK TABLES",
            ],
            Self::Unlocked => vec![BEGIN, status_statement(Flavor::MySql, version)],
        }
    }
}

/// MariaDB's position of the transaction's consistent snapshot.
const SNAPSHOT_STATUS: &str = "SHOW STATUS LIKE 'binlog\\_snapshot\\_%'";

/// The connection chunks are read on, opened with the first chunk.
struct Session {
    conn: Conn,
    flavor: Flavor,
    version: String,
    /// Whether its statements are cancelled past [`FILTERED_CHUNK_TIMEOUT`].
    bounded: bool,
}

/// How long one statement of a filtered chunk may run: a filter is the
/// user's SQL, and one that runs away is cancelled, its table skipped
/// with the reason (as PostgreSQL's filtered chunks are).
pub const FILTERED_CHUNK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The session setting that bounds (or, `false`, frees) the time of each
/// statement: MariaDB's in seconds, MySQL's in milliseconds (SELECTs only).
fn statement_timeout(flavor: Flavor, bounded: bool) -> String {
    let t = FILTERED_CHUNK_TIMEOUT;
    match (flavor, bounded) {
        (Flavor::MariaDb, true) => format!("SET SESSION max_statement_time = {}", t.as_secs()),
        (Flavor::MariaDb, false) => "SET SESSION max_statement_time = 0".into(),
        (Flavor::MySql, true) => format!("SET SESSION max_execution_time = {}", t.as_millis()),
        (Flavor::MySql, false) => "SET SESSION max_execution_time = 0".into(),
    }
}

impl Session {
    /// Bounds the session's statements for a filtered chunk, frees them
    /// for any other, setting only what changes.
    async fn bound(&mut self, bounded: bool) -> Result<(), CaptureError> {
        if self.bounded != bounded {
            self.conn
                .query_drop(statement_timeout(self.flavor, bounded))
                .await
                .map_err(|e| {
                    database(MySqlSourceError::server(
                        "set the chunk's statement timeout",
                        e,
                    ))
                })?;
            self.bounded = bounded;
        }
        Ok(())
    }
}

/// The last key a chunk read, as cells: the next chunk of the table goes
/// on after it, whatever its type (a key the core stored as text is read
/// back from the text only for integer and character keys).
type LastKey = Option<(String, Vec<Option<String>>, Vec<Cell>)>;

/// MySQL's chunk reads: on a connection of their own; their watermarks go
/// out through the stream's board.
pub struct MySqlChunks {
    opts: Opts,
    mode: SnapshotLockingMode,
    mapping: MappingConfig,
    board: WatermarkBoard,
    session: Arc<AsyncMutex<Option<Session>>>,
    last: Arc<Mutex<LastKey>>,
}

impl MySqlChunks {
    /// Chunk reads on a connection of `opts`, registering their watermarks
    /// on `board` (the stream's: [`super::MySqlStream::watermarks`]).
    pub fn new(
        opts: Opts,
        mode: SnapshotLockingMode,
        mapping: MappingConfig,
        board: WatermarkBoard,
    ) -> Self {
        Self {
            opts,
            mode,
            mapping,
            board,
            session: Arc::new(AsyncMutex::new(None)),
            last: Arc::new(Mutex::new(None)),
        }
    }
}

impl ChunkReads for MySqlChunks {
    type Table = MySqlTable;

    /// Opens the chunk's read view and reads its position C before it
    /// returns (the pipeline's one task waits, so the stream stands at or
    /// before C), registers the watermarks at C, and reads the rows in a
    /// task of their own.
    async fn start(&mut self, req: ChunkRequest) -> Result<ChunkTask<MySqlTable>, CaptureError> {
        let mut guard = self.session.lock().await;
        if guard.is_none() {
            *guard = Some(connect(self.opts.clone()).await.map_err(database)?);
        }
        let Some(session) = guard.as_mut() else {
            return Err(CaptureError::Protocol("no chunk connection".into()));
        };
        let at = Position {
            epoch: self.board.epoch(),
            ..open_read_view(session, self.mode).await?
        };
        let key = order_key(&at).map_err(database)?;
        self.board.register(key, &at, &req.id);
        drop(guard);
        let read = ChunkRead {
            session: Arc::clone(&self.session),
            last: Arc::clone(&self.last),
            mapping: self.mapping,
            facts: self.board.chunk_facts(),
            numbering: self.board.numbering(),
        };
        Ok(tokio::spawn(async move { read.run(req).await }))
    }
}

async fn connect(opts: Opts) -> Result<Session, MySqlSourceError> {
    let q = |c| move |e| MySqlSourceError::server(c, e);
    let mut conn = Conn::new(opts).await.map_err(q("connect for chunks"))?;
    // TIMESTAMPs come back as UTC readings (Cell::from_query).
    conn.query_drop("SET SESSION time_zone = '+00:00'")
        .await
        .map_err(q("set the chunks' time zone"))?;
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(q("read the server version"))?
        .unwrap_or_default();
    Ok(Session {
        flavor: Flavor::from_version(&version),
        conn,
        version,
        bounded: false,
    })
}

/// Opens a read view on `session` and gives the binlog position it is
/// consistent with ([`ReadView`]).
async fn open_read_view(
    session: &mut Session,
    mode: SnapshotLockingMode,
) -> Result<Position, CaptureError> {
    let view = ReadView::of(session.flavor, mode);
    let conn = &mut session.conn;
    let q = |c| move |e| database(MySqlSourceError::server(c, e));
    // A read that ended early (an error) left its transaction open.
    conn.query_drop("ROLLBACK")
        .await
        .map_err(q("end the last chunk"))?;
    match view {
        ReadView::SnapshotStatus => {
            conn.query_drop(view.statements("")[0])
                .await
                .map_err(q("open the chunk's read view"))?;
            let rows: Vec<(String, String)> = conn
                .query(SNAPSHOT_STATUS)
                .await
                .map_err(q("read the read view's binlog position"))?;
            snapshot_position(&rows).map_err(database)
        }
        ReadView::Locked | ReadView::Unlocked => {
            let locked = view == ReadView::Locked;
            if locked {
                global_read_lock(conn).await?;
            }
            conn.query_drop(view.statements(&session.version)[usize::from(locked)])
                .await
                .map_err(q("open the chunk's read view"))?;
            let at = current_position(conn, session.flavor, &session.version).await;
            if locked {
                conn.query_drop("UNLOCK TABLES")
                    .await
                    .map_err(q("release the global read lock"))?;
            }
            at.map_err(database)
        }
    }
}

/// MySQL's brief global read lock; a user without RELOAD is told the fix.
async fn global_read_lock(conn: &mut Conn) -> Result<(), CaptureError> {
    match conn.query_drop("FLUSH TABLES WITH READ LOCK").await {
        Ok(()) => Ok(()),
        Err(mysql_async::Error::Server(e)) if e.code == codes::SPECIFIC_ACCESS_DENIED => {
            Err(CaptureError::Prerequisite(
                "a snapshot chunk on MySQL reads its binlog position under a brief global read lock, which needs RELOAD: run GRANT RELOAD ON *.* TO the capture user, or set snapshot.locking.mode = \"none\" (docs/mysql.md says what that leaves open)".into(),
            ))
        }
        Err(e) => Err(database(MySqlSourceError::server(
            "take the global read lock",
            e,
        ))),
    }
}

/// The position in MariaDB's `Binlog_snapshot_file` / `_position` rows.
pub fn snapshot_position(rows: &[(String, String)]) -> Result<Position, MySqlSourceError> {
    let get = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    match (get("Binlog_snapshot_file"), get("Binlog_snapshot_position")) {
        (Some(file), Some(pos)) if !file.is_empty() => pos
            .parse()
            .map(|pos| Position::at(file, pos))
            .map_err(|_| MySqlSourceError::Protocol(format!("Binlog_snapshot_position {pos:?}"))),
        _ => Err(MySqlSourceError::Prerequisite {
            setting: "log_bin",
            found: "OFF".into(),
            needed: "ON",
            fix: "start the server with log_bin",
        }),
    }
}

/// A failed query of the chunk connection, retriable as its code says.
fn database(e: MySqlSourceError) -> CaptureError {
    CaptureError::Database {
        database: "mysql",
        context: "snapshot chunk",
        retriable: e.is_retriable(),
        source: Box::new(e),
    }
}

/// One chunk's read in its task, its read view open on the session.
struct ChunkRead {
    session: Arc<AsyncMutex<Option<Session>>>,
    last: Arc<Mutex<LastKey>>,
    mapping: MappingConfig,
    /// The `source` block facts of chunk rows, which the stream sets to
    /// the chunk's position as it hands out its watermarks.
    facts: SharedFacts,
    /// The shape facts as of the stream's position, which number the
    /// chunk's columns when its rows go out.
    numbering: SharedNumbering,
}

impl ChunkRead {
    async fn run(self, req: ChunkRequest) -> Result<ChunkRows<MySqlTable>, ChunkError> {
        let filter = checked_filter(&req)?;
        let mut guard = self.session.lock().await;
        let Some(session) = guard.as_mut() else {
            return Err(CaptureError::Protocol("no chunk connection".into()).into());
        };
        session.bound(filter.is_some()).await?;
        let conn = &mut session.conn;
        let shape = TableShape::from_catalog(conn, session.flavor, &req.schema, &req.table)
            .await
            .map_err(table_or_capture)?;
        let key_idx = key_positions(&shape, &req)?;
        // Paged by the key the core keys the table's events by.
        let paging = TableShape {
            primary_key: key_idx.clone(),
            identity: None,
            ..shape.clone()
        };
        let shape = Arc::new(shape);
        let images = MySqlRowImages::new(Arc::clone(&shape), self.mapping);
        let after = match &req.after {
            Some(text) => Some(self.key_cells(&req, &paging, &images, text)?),
            None => None,
        };
        // In the read view's READ ONLY transaction: a filter cannot write.
        let read = read_rows(conn, &paging, after.as_deref(), filter, req.size + 1)
            .await
            .map_err(|e| match filter {
                Some(_) => filtered_refusal(e),
                None => table_or_capture(e),
            })?;
        let estimate = estimate(conn, &req).await;
        conn.query_drop("COMMIT")
            .await
            .map_err(|e| database(MySqlSourceError::server("end the chunk", e)))?;
        drop(guard);
        let (cells, more) = page(read.rows, req.size, key_idx.is_empty());
        let rows = cells
            .iter()
            .map(|row| images.image(row))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CaptureError::Protocol(e.to_string()))?;
        self.remember(&req, &key_idx, &cells, &rows);
        Ok(ChunkRows {
            relation: self.table(shape, images),
            key_idx,
            rows,
            more,
            estimate,
            // Every transaction binlogged before C is visible to the read,
            // and the stream hands out the watermarks after exactly those.
            invisible: Vec::new(),
        })
    }

    /// The chunk's table: its snapshot rows' `source` block names C.
    fn table(&self, shape: Arc<TableShape>, images: MySqlRowImages) -> MySqlTable {
        MySqlTable {
            id: 0,
            namespace: shape.database.clone(),
            name: shape.table.clone(),
            shape,
            images,
            facts: Arc::clone(&self.facts),
            numbering: Some(Arc::clone(&self.numbering)),
        }
    }

    /// The last row's key, as text (the core's) and as cells.
    fn remember(
        &self,
        req: &ChunkRequest,
        key_idx: &[usize],
        cells: &[Vec<Cell>],
        rows: &[RowImage],
    ) {
        let (Some(cells), Some(row)) = (cells.last(), rows.last()) else {
            return;
        };
        let text = key_text(row, key_idx);
        let key = key_idx.iter().map(|&i| cells[i].clone()).collect();
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((qualified(req), text, key));
    }

    /// The cells of key `text` (the last key of a chunk before): the ones
    /// remembered, else read back from the text and checked by rendering.
    fn key_cells(
        &self,
        req: &ChunkRequest,
        paging: &TableShape,
        images: &MySqlRowImages,
        text: &[Option<String>],
    ) -> Result<Vec<Cell>, ChunkError> {
        let remembered = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((table, known, cells)) = remembered.as_ref() {
            if *table == qualified(req) && known == text {
                return Ok(cells.clone());
            }
        }
        drop(remembered);
        key_from_text(paging, images, text).ok_or_else(|| {
            ChunkError::Table(format!(
                "the snapshot of {} cannot go on after its stored last key {text:?}: only integer and character keys are read back from text after a restart; snapshot the table again (an execute-snapshot signal)",
                qualified(req)
            ))
        })
    }
}

/// The rows of a chunk asked for `size` (one more was read) and whether
/// rows follow; a table without key columns is read whole, in one chunk.
fn page(mut rows: Vec<Vec<Cell>>, size: usize, keyless: bool) -> (Vec<Vec<Cell>>, bool) {
    if keyless {
        return (rows, false);
    }
    let more = rows.len() > size;
    rows.truncate(size);
    (rows, more)
}

/// Positions of the request's key columns in `shape`.
fn key_positions(shape: &TableShape, req: &ChunkRequest) -> Result<Vec<usize>, ChunkError> {
    req.key_columns
        .iter()
        .map(|k| {
            shape
                .columns
                .iter()
                .position(|c| &c.name == k)
                .ok_or_else(|| {
                    ChunkError::Table(format!("{} has no key column {k:?}", qualified(req)))
                })
        })
        .collect()
}

/// Key `text` read back as cells of an integer or character key, kept
/// only when the mapping renders them as that very text.
fn key_from_text(
    paging: &TableShape,
    images: &MySqlRowImages,
    text: &[Option<String>],
) -> Option<Vec<Cell>> {
    if text.len() != paging.primary_key.len() {
        return None;
    }
    let cells: Vec<Cell> = paging
        .primary_key
        .iter()
        .zip(text)
        .map(|(&i, t)| cell_from_text(&paging.columns[i], t.as_deref()?))
        .collect::<Option<_>>()?;
    let mut row = vec![Cell::Null; paging.columns.len()];
    for (&i, cell) in paging.primary_key.iter().zip(&cells) {
        row[i] = cell.clone();
    }
    let image = images.image(&row).ok()?;
    (key_text(&image, &paging.primary_key) == text).then_some(cells)
}

fn cell_from_text(col: &super::shape::ColumnShape, text: &str) -> Option<Cell> {
    use ColumnType::*;
    match col.ty {
        MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
        | MYSQL_TYPE_LONGLONG => match text {
            // tinyint(1) as boolean (tinyint.one.as.boolean).
            "true" => Some(Cell::Int(1)),
            "false" => Some(Cell::Int(0)),
            _ if col.unsigned => text.parse().ok().map(Cell::UInt),
            _ => text.parse().ok().map(Cell::Int),
        },
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING | MYSQL_TYPE_STRING if !col.binary => {
            Some(Cell::Bytes(text.as_bytes().to_vec()))
        }
        _ => None,
    }
}

/// The text of a row image's key columns, as the core stores a last key.
fn key_text(row: &RowImage, key_idx: &[usize]) -> Vec<Option<String>> {
    key_idx
        .iter()
        .map(|&i| match row.0.get(i) {
            Some(Datum::Text(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect()
}

/// The catalog's estimate of the table's rows (InnoDB's is approximate).
async fn estimate(conn: &mut Conn, req: &ChunkRequest) -> Option<u64> {
    conn.exec_first(
        "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        (&req.schema, &req.table),
    )
    .await
    .ok()
    .flatten()
}

fn qualified(req: &ChunkRequest) -> String {
    format!("{}.{}", req.schema, req.table)
}

/// A definite refusal (no such table, a privilege) skips the table with
/// the reason; anything else restarts from the committed offset.
fn table_or_capture(e: MySqlSourceError) -> ChunkError {
    if e.is_retriable() {
        ChunkError::Capture(database(e))
    } else {
        ChunkError::Table(e.to_string())
    }
}

/// The chunk's filter (a signal's `additional-conditions`, which the
/// core stored with the snapshot's progress), held to MySQL's lexical
/// rules again before it goes into SQL: one stored by another source's
/// rules is refused, never read past.
fn checked_filter(req: &ChunkRequest) -> Result<Option<&str>, ChunkError> {
    match req.filter.as_deref() {
        Some(filter) => match super::filter::check_lexically(filter) {
            Ok(()) => Ok(Some(filter)),
            Err(why) => Err(ChunkError::Table(format!(
                "the snapshot filter of {}: {why}",
                qualified(req)
            ))),
        },
        None => Ok(None),
    }
}

/// A filtered chunk the server refused for a definite reason (SQLSTATE
/// class 42: a column the filter names was dropped, a syntax or access
/// error) skips the table, saying only the error's code: the server's
/// message may quote the filter's values. Anything else is as unfiltered.
fn filtered_refusal(e: MySqlSourceError) -> ChunkError {
    match &e {
        MySqlSourceError::Server {
            source: mysql_async::Error::Server(s),
            ..
        } if matches!(s.code, codes::STATEMENT_TIMEOUT | codes::QUERY_TIMEOUT) => {
            ChunkError::Table(format!(
                "the filtered chunk query was cancelled after {} s (MySQL error {})",
                FILTERED_CHUNK_TIMEOUT.as_secs(),
                s.code
            ))
        }
        MySqlSourceError::Server {
            source: mysql_async::Error::Server(s),
            ..
        } if s.state.starts_with("42") => ChunkError::Table(format!(
            "the filtered chunk query failed with MySQL error {} (SQLSTATE {}; its text is not logged: it can hold the filter's values)",
            s.code, s.state
        )),
        _ => table_or_capture(e),
    }
}

/// A chunk as the service tests read it: its rows as text.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkView {
    pub rows: Vec<Vec<Option<String>>>,
    pub more: bool,
}

#[cfg(feature = "testing")]
impl MySqlChunks {
    /// [`ChunkReads::start`], the read's outcome as a [`ChunkView`].
    pub async fn start_view(
        &mut self,
        req: ChunkRequest,
    ) -> Result<tokio::task::JoinHandle<Result<ChunkView, String>>, CaptureError> {
        let task = self.start(req).await?;
        Ok(tokio::spawn(async move {
            let read = task.await.map_err(|e| e.to_string())?;
            let read = read.map_err(|e| e.to_string())?;
            let all: Vec<usize> = (0..read.relation.shape.columns.len()).collect();
            Ok(ChunkView {
                rows: read.rows.iter().map(|r| key_text(r, &all)).collect(),
                more: read.more,
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mariadb_reads_the_read_views_own_position_without_a_lock() {
        let view = ReadView::of(Flavor::MariaDb, SnapshotLockingMode::Minimal);
        assert_eq!(view, ReadView::SnapshotStatus);
        assert_eq!(
            ReadView::of(Flavor::MariaDb, SnapshotLockingMode::None),
            view
        );
        assert_eq!(
            view.statements("10.11.19-MariaDB"),
            vec![
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                "SHOW STATUS LIKE 'binlog\\_snapshot\\_%'"
            ]
        );
        let rows = [
            (
                "Binlog_snapshot_file".to_owned(),
                "binlog.000047".to_owned(),
            ),
            ("Binlog_snapshot_position".to_owned(), "379".to_owned()),
        ];
        assert_eq!(
            snapshot_position(&rows).unwrap(),
            Position::at("binlog.000047", 379)
        );
        // Without a binlog the variables are empty: the fix is named.
        let off = [
            ("Binlog_snapshot_file".to_owned(), String::new()),
            ("Binlog_snapshot_position".to_owned(), "0".to_owned()),
        ];
        assert!(snapshot_position(&off)
            .unwrap_err()
            .to_string()
            .contains("log_bin"));
    }

    /// MySQL-only (no server here): the position is read under the global
    /// read lock, after the read view opened, and the lock released at once.
    #[test]
    fn mysql_reads_its_position_under_a_brief_global_read_lock() {
        let view = ReadView::of(Flavor::MySql, SnapshotLockingMode::Minimal);
        assert_eq!(
            view.statements("8.4.3"),
            vec![
                "FLUSH TABLES WITH READ LOCK",
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                "SHOW BINARY LOG STATUS",
                "UNLOCK TABLES"
            ]
        );
        assert_eq!(view.statements("8.0.40")[2], "SHOW MASTER STATUS");
        let none = ReadView::of(Flavor::MySql, SnapshotLockingMode::None);
        assert_eq!(
            none.statements("8.0.40"),
            vec![
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                "SHOW MASTER STATUS"
            ]
        );
    }

    /// A filtered chunk's statements are cancelled past the timeout (each
    /// flavor's own setting and unit); a cancelled or refused one skips
    /// the table without the server's text, never restarts capture.
    #[test]
    fn filtered_chunks_are_bounded_in_time_and_a_definite_refusal_skips_the_table() {
        assert_eq!(
            statement_timeout(Flavor::MariaDb, true),
            "SET SESSION max_statement_time = 300"
        );
        assert_eq!(
            statement_timeout(Flavor::MariaDb, false),
            "SET SESSION max_statement_time = 0"
        );
        assert_eq!(
            statement_timeout(Flavor::MySql, true),
            "SET SESSION max_execution_time = 300000"
        );
        assert_eq!(
            statement_timeout(Flavor::MySql, false),
            "SET SESSION max_execution_time = 0"
        );
        let server = |code, state: &str| {
            MySqlSourceError::server(
                "read a snapshot chunk",
                mysql_async::Error::Server(mysql_async::ServerError {
                    code,
                    message: "near 'swordfish'".into(),
                    state: state.into(),
                }),
            )
        };
        for (code, state, says) in [
            (1969, "70100", "cancelled after 300 s"),
            (3024, "HY000", "cancelled after 300 s"),
            (1054, "42S22", "SQLSTATE 42S22"),
            (1064, "42000", "SQLSTATE 42000"),
        ] {
            match filtered_refusal(server(code, state)) {
                ChunkError::Table(why) => {
                    assert!(why.contains(says), "{code}: {why}");
                    assert!(!why.contains("swordfish"), "{code}: {why}");
                }
                other => panic!("{code}: {other:?}"),
            }
        }
        // A lost connection or a deadlock: read again after a restart.
        assert!(matches!(
            filtered_refusal(server(1213, "40001")),
            ChunkError::Capture(_)
        ));
    }

    #[test]
    fn a_chunk_is_its_size_and_says_whether_rows_follow_and_a_keyless_table_is_one_chunk() {
        let rows = |n: i64| (0..n).map(|i| vec![Cell::Int(i)]).collect::<Vec<_>>();
        assert_eq!(page(rows(4), 3, false), (rows(3), true));
        assert_eq!(page(rows(3), 3, false), (rows(3), false));
        // Read whole (no LIMIT): never "more", or it would be read again.
        assert_eq!(page(rows(5), 3, true), (rows(5), false));
    }

    fn shape() -> TableShape {
        let mut u = super::super::shape::ColumnShape::new("u", ColumnType::MYSQL_TYPE_LONGLONG);
        u.unsigned = true;
        TableShape {
            database: "shop".into(),
            table: "t".into(),
            columns: vec![
                super::super::shape::ColumnShape::new("id", ColumnType::MYSQL_TYPE_LONG),
                super::super::shape::ColumnShape::new("name", ColumnType::MYSQL_TYPE_VARCHAR),
                u,
                super::super::shape::ColumnShape::new("d", ColumnType::MYSQL_TYPE_DATE),
            ],
            primary_key: vec![0, 1],
            identity: None,
        }
    }

    #[test]
    fn integer_and_character_keys_are_read_back_from_their_text() {
        let shape = shape();
        let images = MySqlRowImages::new(Arc::new(shape.clone()), MappingConfig::default());
        let text = vec![Some("-7".to_owned()), Some("ab c".to_owned())];
        assert_eq!(
            key_from_text(&shape, &images, &text),
            Some(vec![Cell::Int(-7), Cell::Bytes(b"ab c".to_vec())])
        );
        let unsigned = TableShape {
            primary_key: vec![2],
            identity: None,
            ..shape.clone()
        };
        assert_eq!(
            key_from_text(&unsigned, &images, &[Some("42".into())]),
            Some(vec![Cell::UInt(42)])
        );
        // Not a number, a null, a date key: not guessed at.
        assert_eq!(
            key_from_text(&shape, &images, &[Some("x".into()), Some("a".into())]),
            None
        );
        assert_eq!(
            key_from_text(&shape, &images, &[None, Some("a".into())]),
            None
        );
        let dated = TableShape {
            primary_key: vec![3],
            identity: None,
            ..shape
        };
        assert_eq!(
            key_from_text(&dated, &images, &[Some("19000".into())]),
            None
        );
    }
}
