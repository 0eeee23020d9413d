//! Binlog events -> row changes, DDL and commits, each with the
//! [`Position`] that, stored, resumes right after it.
//!
//! Sans I/O: [`Decoder::handle`] takes one event as mysql_common parsed
//! it, so the rules are tested with byte fixtures (MySQL's GTID events,
//! which this machine's MariaDB cannot produce) as well as against a real
//! MariaDB (`tests/it/mysql_binlog.rs`).
//!
//! Counting: events of a transaction are numbered from 0 (its GTID event,
//! or `BEGIN` without GTIDs). A row change from event `i`, row `r` (from 0)
//! carries `event = i, row = r + 1`; a DDL `event = i, row = 1`; a commit
//! the next transaction's start (`event = 0, row = 0`). Events a server
//! sends at other times than their place in the file (heartbeats, the
//! rotate and format description that open every dump, MariaDB's GTID list
//! and checkpoint events) are not counted, so a replay counts the same.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use mysql_async::binlog::events::{
    Event, EventData, GtidEvent, QueryEvent, RotateEvent, RowsEventData, TableMapEvent,
    TransactionPayloadEvent, XidEvent,
};
use mysql_async::binlog::{BinlogVersion, EventType};

use super::cell::Cell;
use super::checks::Flavor;
use super::error::MySqlSourceError;
use super::history::TableIds;
use super::position::{Gtids, MariaGtid, MariaGtidList, MySqlGtidSet, Position, TAGGED_GTIDS};
use super::shape::{CatalogColumn, TableShape};
use crate::filter::TableFilter;

/// MariaDB's own event types (not in mysql_common's list).
pub mod mariadb_events {
    pub const ANNOTATE_ROWS: u8 = 160;
    pub const BINLOG_CHECKPOINT: u8 = 161;
    pub const GTID: u8 = 162;
    pub const GTID_LIST: u8 = 163;
    pub const START_ENCRYPTION: u8 = 164;
    /// `FL_STANDALONE` of a GTID event: no BEGIN/COMMIT around it (DDL).
    pub const FL_STANDALONE: u8 = 1;
}

/// MySQL's `HEARTBEAT_LOG_EVENT_V2`.
const HEARTBEAT_V2: u8 = 0x29;
/// MySQL's `ROWS_QUERY_LOG_EVENT` (`binlog_rows_query_log_events`).
const ROWS_QUERY: u8 = 0x1d;

/// Insert, update or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Insert,
    Update,
    Delete,
}

/// One row change.
#[derive(Debug, Clone, PartialEq)]
pub struct RowChange {
    pub table: Arc<TableShape>,
    pub kind: ChangeKind,
    pub before: Option<Vec<Cell>>,
    pub after: Option<Vec<Cell>>,
    pub position: Position,
    /// The transaction's GTID (`domain-server-seq` or `uuid:n`).
    pub gtid: Option<String>,
    /// The event's timestamp, ms since 1970.
    pub ts_ms: i64,
    /// Offset of the rows event in `position.file` (Debezium's
    /// `source.pos`; `position.pos` is where its transaction starts).
    pub event_pos: u64,
    /// The server that wrote the event (`source.server_id`).
    pub server_id: u32,
    /// The connection that made the change: MySQL's BEGIN event says,
    /// MariaDB's GTID event does not (`source.thread`).
    pub thread: Option<u32>,
    /// The statement that made the change, from the ANNOTATE_ROWS
    /// (MariaDB) or ROWS_QUERY (MySQL) event before its rows events, when
    /// the decoder keeps them ([`Decoder::keep_queries`]).
    pub query: Option<Arc<str>>,
}

/// What the decoder hands out, in binlog order.
#[derive(Debug, Clone, PartialEq)]
pub enum BinlogChange {
    Row(RowChange),
    /// A statement other than BEGIN/COMMIT: DDL under ROW format.
    Ddl {
        database: String,
        query: String,
        position: Position,
        gtid: Option<String>,
    },
    /// The end of a transaction; `position` is where the next one starts.
    Commit {
        position: Position,
        xid: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxGtid {
    MariaDb(MariaGtid),
    MySql([u8; 16], u64),
}

impl TxGtid {
    fn text(self) -> String {
        match self {
            TxGtid::MariaDb(g) => g.to_string(),
            TxGtid::MySql(sid, gno) => {
                let mut set = MySqlGtidSet::default();
                set.add(sid, gno);
                set.to_string()
            }
        }
    }
}

/// Where a rows event is: its offset, time and the server that wrote it.
#[derive(Debug, Clone, Copy)]
struct EventPlace {
    start: u64,
    ts_ms: i64,
    server_id: u32,
}

#[derive(Debug)]
struct Tx {
    start: Position,
    gtid: Option<TxGtid>,
    /// Index of the last event seen.
    event: u64,
    /// Ends with a COMMIT or XID (a BEGIN was seen, or a MariaDB GTID
    /// without FL_STANDALONE); else the first statement ends it.
    explicit: bool,
    /// The thread id of its BEGIN event.
    thread: Option<u32>,
    /// The statement of the rows events that follow (`include.query`).
    query: Option<Arc<str>>,
}

/// Binlog events in, changes out.
#[derive(Debug)]
pub struct Decoder {
    flavor: Flavor,
    file: String,
    gtids: Option<Gtids>,
    tables: HashMap<u64, (Arc<TableShape>, TableMapEvent<'static>)>,
    catalog: HashMap<(String, String), Vec<CatalogColumn>>,
    /// The column numbers of each table in `catalog` the facts number.
    ids: HashMap<(String, String), TableIds>,
    tx: Option<Tx>,
    /// From a resume: what the first transaction already published.
    skip: Option<(u64, u64)>,
    resume_pos: Option<u64>,
    seen_fde: bool,
    /// The failover epoch of every position of this binlog.
    epoch: u32,
    /// The captured tables: a row change logged as a statement stops the
    /// stream only when it may write one (`None`: any may).
    captured: Option<TableFilter>,
    /// Whether row changes carry their statement (`include.query`).
    queries: bool,
    /// The place (start, end) of the compressed transaction whose events
    /// come now (MySQL's `binlog_transaction_compression`): the replica
    /// stream hands them over unpacked right after its
    /// TRANSACTION_PAYLOAD event, with no place of their own in the file
    /// (MySQL writes them with end position 0), so they take the
    /// payload's: the commit ends where the payload ends.
    payload: Option<(u64, u64)>,
}

impl Decoder {
    /// A decoder that starts at `from` (a transaction start, with the
    /// event and row counts already published).
    pub fn new(flavor: Flavor, from: &Position) -> Self {
        Self {
            flavor,
            file: from.file.clone(),
            gtids: from.gtids.clone(),
            tables: HashMap::new(),
            catalog: HashMap::new(),
            ids: HashMap::new(),
            tx: None,
            skip: (from.event > 0 || from.row > 0).then_some((from.event, from.row)),
            resume_pos: Some(from.pos),
            seen_fde: false,
            epoch: from.epoch,
            captured: None,
            queries: false,
            payload: None,
        }
    }

    /// Only a statement that may write a table `captured` matches stops
    /// the stream (see [`Self::statement_change`]).
    pub fn capturing(mut self, captured: TableFilter) -> Self {
        self.captured = Some(captured);
        self
    }

    /// A row change logged as a statement (`verb`, the session's
    /// `binlog_format` was not ROW): its rows are not in the binlog, so
    /// passing over it would lose them — an error when it may write a
    /// captured table (or its tables cannot be told), else noted and passed
    /// over, as the binlog of a database capture does not read.
    fn statement_change(
        &self,
        verb: &str,
        schema: &str,
        query: &str,
        start: u64,
    ) -> Result<(), MySqlSourceError> {
        let targets = super::history::row_change_targets(schema, query);
        let captured = match (&self.captured, &targets) {
            (Some(filter), Some(targets)) => targets.iter().any(|(db, t)| filter.matches(db, t)),
            _ => true,
        };
        if !captured {
            tracing::warn!(file = %self.file, pos = start, database = schema, tables = ?targets, "a {verb} logged as a statement (binlog_format is not ROW in its session) writes no captured table: passed over");
            return Ok(());
        }
        Err(MySqlSourceError::Prerequisite {
            setting: "binlog_format",
            found: format!(
                "STATEMENT in the session that wrote the {verb} statement at {}:{start} (database {schema:?})",
                self.file
            ),
            needed: "ROW in every session",
            fix: "capture reads row events only, and this statement's changes are not in the binlog as rows: passing over it would lose them. Keep binlog_format = ROW in every session (SET SESSION binlog_format needs SUPER or BINLOG ADMIN: revoke it from applications), then take a new snapshot (delete the stored offset) of the tables the statement changed",
        })
    }

    /// Row changes carry the statement that made them (`include.query`).
    /// The statement event comes before its rows events inside the
    /// transaction, and a resume reads the transaction again from its
    /// start, so a replayed change carries it too.
    pub fn keep_queries(&mut self, keep: bool) {
        self.queries = keep;
    }

    /// `pos` in the current file, with the GTIDs committed before it.
    fn here(&self, pos: u64) -> Position {
        Position {
            gtids: self.gtids.clone(),
            epoch: self.epoch,
            ..Position::at(self.file.clone(), pos)
        }
    }

    /// For a resume by GTID: the server finds the transaction by its GTID,
    /// and after a failover its offset differs from the stored one, so the
    /// first transaction's offset is not checked against it.
    pub fn found_by_gtid(mut self) -> Self {
        self.resume_pos = None;
        self
    }

    /// The declared types of a table and its column numbers, applied to
    /// its next TABLE_MAPs.
    pub fn set_catalog(
        &mut self,
        database: &str,
        table: &str,
        columns: Vec<CatalogColumn>,
        ids: Option<TableIds>,
    ) {
        let key = (database.to_owned(), table.to_owned());
        match ids {
            Some(ids) => self.ids.insert(key.clone(), ids),
            None => self.ids.remove(&key),
        };
        self.catalog.insert(key, columns);
    }

    pub fn has_catalog(&self, database: &str, table: &str) -> bool {
        self.catalog
            .contains_key(&(database.to_owned(), table.to_owned()))
    }

    /// Forgets a table's declared types (after DDL naming it), so its
    /// next TABLE_MAP takes them again.
    pub fn forget_catalog(&mut self, database: &str, table: &str) {
        let key = (database.to_owned(), table.to_owned());
        self.catalog.remove(&key);
        self.ids.remove(&key);
    }

    /// Decodes one event, appending what it yields to `out`.
    pub fn handle(
        &mut self,
        event: &Event,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        let header = event.header();
        let Some((start, end)) = self.payload else {
            let end = u64::from(header.log_pos());
            let start = end.saturating_sub(u64::from(header.event_size()));
            return self.decode(event, start, end, out);
        };
        if !may_be_in_a_payload(header.event_type_raw()) {
            return Err(payload_cut(
                &self.file,
                start,
                "its events ended before its commit",
            ));
        }
        let decoded = self.decode(event, start, end, out);
        if self.tx.is_none() {
            self.payload = None;
        }
        decoded
    }

    /// Decodes one event that lies from `start` to `end` in the file,
    /// compressed (MariaDB's `log_bin_compress`) or not.
    fn decode(
        &mut self,
        event: &Event,
        start: u64,
        end: u64,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        let header = event.header();
        if compressed::is_compressed(header.event_type_raw()) {
            // Decoded as the plain event it stands for, at the compressed
            // one's place in the file (its size is the compressed size).
            let plain = compressed::decompress(event).map_err(|e| {
                protocol(
                    &self.file,
                    start,
                    "a compressed event (log_bin_compress = ON)",
                    &e,
                )
            })?;
            return self.dispatch(&plain, start, end, out);
        }
        self.dispatch(event, start, end, out)
    }

    /// Decodes one (plain) event that lies from `start` to `end` in the file.
    fn dispatch(
        &mut self,
        event: &Event,
        start: u64,
        end: u64,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        let header = event.header();
        let ts_ms = i64::from(header.timestamp()) * 1000;
        if let Some(handled) = self.mariadb_event(event, start) {
            if handled.is_ok() && is_file_header(event.header().event_type_raw()) {
                self.boundary(end, out);
            }
            return handled;
        }
        let Ok(ty) = header.event_type() else {
            return self.unknown(event, start);
        };
        match ty {
            EventType::ROTATE_EVENT => {
                let r: RotateEvent<'_> = event
                    .read_event()
                    .map_err(|e| protocol(&self.file, start, "ROTATE", &e))?;
                let mut name = r.name_raw().to_vec();
                // The rotate that opens a dump comes before the format
                // description that says events carry a CRC32, so its
                // checksum is still on the name: cut it when it is one.
                if !self.seen_fde && name.len() > 4 && ends_with_crc32(event) {
                    name.truncate(name.len() - 4);
                }
                self.file = String::from_utf8(name)
                    .map_err(|e| protocol(&self.file, start, "ROTATE", &e))?;
                Ok(())
            }
            EventType::FORMAT_DESCRIPTION_EVENT => {
                self.seen_fde = true;
                Ok(())
            }
            EventType::PREVIOUS_GTIDS_EVENT => {
                self.boundary(end, out);
                Ok(())
            }
            EventType::HEARTBEAT_EVENT | EventType::STOP_EVENT => Ok(()),
            EventType::GTID_EVENT | EventType::GTID_TAGGED_LOG_EVENT => self.gtid(event, start),
            EventType::ANONYMOUS_GTID_EVENT => self.begin(start, None, false),
            EventType::QUERY_EVENT => self.query(event, start, end, out),
            EventType::XID_EVENT => {
                let x: XidEvent = event
                    .read_event()
                    .map_err(|e| protocol(&self.file, start, "XID", &e))?;
                self.count()?;
                self.commit(end, Some(x.xid), out);
                Ok(())
            }
            EventType::TABLE_MAP_EVENT => self.table_map(event, start),
            EventType::TRANSACTION_PAYLOAD_EVENT => self.transaction_payload(event, start, end),
            EventType::WRITE_ROWS_EVENT
            | EventType::UPDATE_ROWS_EVENT
            | EventType::DELETE_ROWS_EVENT
            | EventType::WRITE_ROWS_EVENT_V1
            | EventType::UPDATE_ROWS_EVENT_V1
            | EventType::DELETE_ROWS_EVENT_V1
            | EventType::PARTIAL_UPDATE_ROWS_EVENT => {
                let at = EventPlace {
                    start,
                    ts_ms,
                    server_id: header.server_id(),
                };
                self.rows_event(event, at, out)
            }
            _ => self.count(),
        }
    }

    /// MySQL's GTID event: a transaction begins. A tagged GTID stops the
    /// stream: the stored GTID set has no place for its tag.
    fn gtid(&mut self, event: &Event, start: u64) -> Result<(), MySqlSourceError> {
        let g: GtidEvent = event
            .read_event()
            .map_err(|e| protocol(&self.file, start, "GTID", &e))?;
        let gtid = TxGtid::MySql(g.sid(), g.gno());
        if let Some(tag) = g.tag() {
            let untagged = gtid.text();
            let (uuid, gno) = untagged.split_once(':').unwrap_or_default();
            return Err(MySqlSourceError::Prerequisite {
                setting: "gtid_next",
                found: format!(
                    "a tagged GTID ({uuid}:{tag}:{gno}) at {}:{start}",
                    self.file
                ),
                needed: "untagged GTIDs",
                fix: TAGGED_GTIDS,
            });
        }
        self.begin(start, Some(gtid), false)
    }

    /// MySQL's compressed transaction (`binlog_transaction_compression`):
    /// its events, unpacked by the replica stream, come next and take its
    /// place ([`Self::handle`]).
    fn transaction_payload(
        &mut self,
        event: &Event,
        start: u64,
        end: u64,
    ) -> Result<(), MySqlSourceError> {
        event
            .read_event::<TransactionPayloadEvent<'_>>()
            .map_err(|e| payload_cut(&self.file, start, &format!("it does not parse: {e}")))?;
        self.payload = Some((start, end));
        self.count()
    }

    /// An event type neither mysql_common nor this decoder knows. A server
    /// marks the ones a replica may pass over (`LOG_EVENT_IGNORABLE_F`):
    /// those are counted; any other may carry rows, and passing over it
    /// would lose them with a healthy status, so the stream stops.
    fn unknown(&mut self, event: &Event, start: u64) -> Result<(), MySqlSourceError> {
        const LOG_EVENT_IGNORABLE_F: u16 = 0x80;
        if event.header().flags_raw() & LOG_EVENT_IGNORABLE_F != 0 {
            return self.count();
        }
        Err(MySqlSourceError::Protocol(format!(
            "event type {} at {}:{start} is not one capture decodes, and the server does not mark it ignorable: it may carry row changes, so capture stops rather than skip it. Turn off the server setting that writes it (a server newer than capture supports), and report it with SELECT VERSION()",
            event.header().event_type_raw(),
            self.file
        )))
    }

    /// The events only MariaDB sends (by raw type, which mysql_common does
    /// not name), MySQL's idle heartbeat and its ROWS_QUERY; `None` for
    /// any other event.
    fn mariadb_event(&mut self, event: &Event, start: u64) -> Option<Result<(), MySqlSourceError>> {
        use mariadb_events as m;
        let header = event.header();
        Some(match header.event_type_raw() {
            m::GTID => {
                let data = event.data();
                if data.len() < 13 {
                    return Some(Err(protocol(
                        &self.file,
                        start,
                        "MariaDB GTID event",
                        &"shorter than 13 bytes",
                    )));
                }
                let seq = u64::from_le_bytes(data[0..8].try_into().unwrap_or_default());
                let domain = u32::from_le_bytes(data[8..12].try_into().unwrap_or_default());
                let gtid = MariaGtid {
                    domain,
                    server: header.server_id(),
                    seq,
                };
                let explicit = data[12] & m::FL_STANDALONE == 0;
                self.begin(start, Some(TxGtid::MariaDb(gtid)), explicit)
            }
            // The statement text, the whole body.
            m::ANNOTATE_ROWS => self.statement(event.data()),
            m::BINLOG_CHECKPOINT | m::GTID_LIST | m::START_ENCRYPTION => Ok(()),
            // MySQL's HEARTBEAT_LOG_EVENT_V2 (not in mysql_common's list):
            // sent when idle, never counted.
            HEARTBEAT_V2 => Ok(()),
            // MySQL's statement: a length byte (which MySQL ignores too:
            // the text runs to the event's end), then the text.
            ROWS_QUERY => self.statement(event.data().get(1..).unwrap_or_default()),
            _ => return None,
        })
    }

    /// A QUERY event: BEGIN, COMMIT or ROLLBACK of a transaction, or DDL,
    /// which is its own transaction unless it is inside an explicit one.
    fn query(
        &mut self,
        event: &Event,
        start: u64,
        end: u64,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        let q: QueryEvent<'_> = event
            .read_event()
            .map_err(|e| protocol(&self.file, start, "QUERY", &e))?;
        let query = q.query();
        let verb = query.trim().to_ascii_uppercase();
        match verb.as_str() {
            "BEGIN" => {
                if self.tx.is_none() {
                    self.begin(start, None, true)?;
                } else {
                    self.count()?;
                }
                if let Some(tx) = self.tx.as_mut() {
                    tx.explicit = true;
                    tx.thread = Some(q.thread_id());
                }
                Ok(())
            }
            "COMMIT" => {
                self.count()?;
                self.commit(end, None, out);
                Ok(())
            }
            "ROLLBACK" => {
                // Only non-transactional changes are logged with it;
                // the transaction is over either way.
                self.count()?;
                self.commit(end, None, out);
                Ok(())
            }
            _ => {
                if let Some(verb) = row_change_verb(&query) {
                    self.statement_change(verb, &q.schema(), &query, start)?;
                }
                if self.tx.is_none() {
                    self.begin(start, None, false)?;
                } else {
                    self.count()?;
                }
                let (position, skipped, gtid) = self.place(0)?;
                if !skipped {
                    out.push_back(BinlogChange::Ddl {
                        database: q.schema().into_owned(),
                        query: query.into_owned(),
                        position,
                        gtid,
                    });
                }
                if self.tx.as_ref().is_some_and(|t| !t.explicit) {
                    self.commit(end, None, out);
                }
                Ok(())
            }
        }
    }

    /// A TABLE_MAP event: the shape of the table the next rows events
    /// change, with the declared types DDL told us.
    fn table_map(&mut self, event: &Event, start: u64) -> Result<(), MySqlSourceError> {
        self.count()?;
        let tme: TableMapEvent<'_> = event
            .read_event()
            .map_err(|e| protocol(&self.file, start, "TABLE_MAP", &e))?;
        let mut shape = TableShape::from_table_map(&tme)?;
        let key = (shape.database.clone(), shape.table.clone());
        if let Some(cat) = self.catalog.get(&key) {
            shape.apply_catalog(cat);
        }
        shape.identity = self
            .ids
            .get(&key)
            .map(|ids| ids.identity(shape.columns.iter().map(|c| c.name.as_str())));
        self.tables
            .insert(tme.table_id(), (Arc::new(shape), tme.into_owned()));
        Ok(())
    }

    fn begin(
        &mut self,
        start: u64,
        gtid: Option<TxGtid>,
        explicit: bool,
    ) -> Result<(), MySqlSourceError> {
        if let Some(tx) = &self.tx {
            return Err(MySqlSourceError::Protocol(format!(
                "a transaction begins at {}:{start} inside the one that began at {}:{}",
                self.file, tx.start.file, tx.start.pos
            )));
        }
        if let Some(expected) = self.resume_pos.take() {
            if self.skip.is_some() && expected != start {
                return Err(MySqlSourceError::Protocol(format!(
                    "the stored position {}:{expected} is not where a transaction starts (the first one starts at {start})",
                    self.file
                )));
            }
        }
        let pos = self.here(start);
        self.tx = Some(Tx {
            start: pos,
            gtid,
            event: 0,
            explicit,
            thread: None,
            query: None,
        });
        Ok(())
    }

    /// The statement of the rows events that follow, read aside (MariaDB's
    /// ANNOTATE_ROWS, which a dump omits unless asked: the reader reads it
    /// with SHOW BINLOG EVENTS). Not counted: the dump never sent it, so
    /// the event counts stay those of a dump without it.
    /// `None`: the statement has none.
    pub fn set_statement(&mut self, text: Option<&str>) {
        if let Some(tx) = self.tx.as_mut().filter(|_| self.queries) {
            tx.query = text.map(Arc::from);
        }
    }

    /// The binlog file being read.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// A statement event (ANNOTATE_ROWS, ROWS_QUERY): counted, and its
    /// text kept for the rows events after it when `include.query` is on.
    fn statement(&mut self, text: &[u8]) -> Result<(), MySqlSourceError> {
        if self.queries {
            if let Some(tx) = self.tx.as_mut() {
                tx.query = Some(Arc::from(String::from_utf8_lossy(text)));
            }
        }
        self.count()
    }

    /// Counts one event of the open transaction.
    fn count(&mut self) -> Result<(), MySqlSourceError> {
        if let Some(tx) = self.tx.as_mut() {
            tx.event += 1;
        }
        Ok(())
    }

    /// The position after row `row` (from 0) of the current event, whether
    /// a resume already published it, and the transaction's GTID.
    fn place(&self, row: u64) -> Result<(Position, bool, Option<String>), MySqlSourceError> {
        let tx = self.tx.as_ref().ok_or_else(|| {
            MySqlSourceError::Protocol(format!("a change outside a transaction in {}", self.file))
        })?;
        let mut p = tx.start.clone();
        p.event = tx.event;
        p.row = row + 1;
        let skipped = self
            .skip
            .is_some_and(|(e, r)| tx.event < e || (tx.event == e && row < r));
        Ok((p, skipped, tx.gtid.map(TxGtid::text)))
    }

    /// A write, update or delete rows event.
    fn rows_event(
        &mut self,
        event: &Event,
        at: EventPlace,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        self.count()?;
        let data = event
            .read_data()
            .map_err(|e| protocol(&self.file, at.start, "ROWS", &e))?;
        let Some(EventData::RowsEvent(rows)) = data else {
            return Err(protocol(&self.file, at.start, "ROWS", &"not a rows event"));
        };
        self.rows(&rows, at, out)
    }

    fn rows(
        &mut self,
        rows: &RowsEventData<'_>,
        at: EventPlace,
        out: &mut VecDeque<BinlogChange>,
    ) -> Result<(), MySqlSourceError> {
        let kind = match rows {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => {
                ChangeKind::Insert
            }
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => {
                ChangeKind::Delete
            }
            _ => ChangeKind::Update,
        };
        let Some((shape, tme)) = self.tables.get(&rows.table_id()) else {
            return Err(MySqlSourceError::Protocol(format!(
                "rows for table id {} without its TABLE_MAP in {}",
                rows.table_id(),
                self.file
            )));
        };
        let shape = Arc::clone(shape);
        let mut produced = Vec::new();
        for (r, item) in rows.rows(tme).enumerate() {
            let (before, after) = item.map_err(|e| {
                MySqlSourceError::Protocol(format!("row of {}: {e}", shape.qualified()))
            })?;
            let (position, skipped, gtid) = self.place(r as u64)?;
            if skipped {
                continue;
            }
            let cells = |row: Option<mysql_async::binlog::row::BinlogRow>| -> Result<Option<Vec<Cell>>, MySqlSourceError> {
                let Some(row) = row else { return Ok(None) };
                if row.len() != shape.columns.len() {
                    return Err(MySqlSourceError::Prerequisite {
                        setting: "binlog_row_image",
                        found: format!("{} of {} columns in a row of {}", row.len(), shape.columns.len(), shape.qualified()),
                        needed: "FULL",
                        fix: "SET GLOBAL binlog_row_image = 'FULL' (and in the server's config file)",
                    });
                }
                row.unwrap()
                    .into_iter()
                    .zip(&shape.columns)
                    .map(|(v, col)| {
                        Cell::from_binlog(col, v).map_err(|reason| MySqlSourceError::Protocol(format!("column {} of {}: {reason}", col.name, shape.qualified())))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            };
            produced.push(BinlogChange::Row(RowChange {
                table: Arc::clone(&shape),
                kind,
                before: cells(before)?,
                after: cells(after)?,
                position,
                gtid,
                ts_ms: at.ts_ms,
                event_pos: at.start,
                server_id: at.server_id,
                thread: self.tx.as_ref().and_then(|t| t.thread),
                query: self.tx.as_ref().and_then(|t| t.query.clone()),
            }));
        }
        out.extend(produced);
        Ok(())
    }

    /// A file's header event outside a transaction ends at `end`: nothing
    /// before it is left to send, so the stream stands there (a
    /// [`BinlogChange::Commit`] without a transaction, which the stream
    /// hands out as a keepalive). After a rotation with no write since,
    /// the server's position (a snapshot's `Binlog_snapshot_position`) is
    /// the end of the new file's header, and the stream reaches it only so.
    /// Events a dump resumed mid-file sends first (`end` 0) say nothing.
    fn boundary(&self, end: u64, out: &mut VecDeque<BinlogChange>) {
        if self.tx.is_some() || end <= 4 {
            return;
        }
        let position = self.here(end);
        out.push_back(BinlogChange::Commit {
            position,
            xid: None,
        });
    }

    fn commit(&mut self, end: u64, xid: Option<u64>, out: &mut VecDeque<BinlogChange>) {
        let Some(tx) = self.tx.take() else {
            return;
        };
        match (tx.gtid, &mut self.gtids) {
            (Some(TxGtid::MariaDb(g)), Some(Gtids::MariaDb(list))) => list.advance(g),
            (Some(TxGtid::MariaDb(g)), gtids) => {
                let mut list = MariaGtidList::default();
                list.advance(g);
                *gtids = Some(Gtids::MariaDb(list));
            }
            (Some(TxGtid::MySql(sid, gno)), Some(Gtids::MySql(set))) => set.add(sid, gno),
            (Some(TxGtid::MySql(sid, gno)), gtids) => {
                let mut set = MySqlGtidSet::default();
                set.add(sid, gno);
                *gtids = Some(Gtids::MySql(set));
            }
            (None, _) => {}
        }
        self.skip = None;
        let position = self.here(end);
        out.push_back(BinlogChange::Commit { position, xid });
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }
}

/// The verb of a statement that changes rows (`INSERT`, `UPDATE`,
/// `DELETE`, `REPLACE`, `LOAD DATA`), after leading comments: under
/// `binlog_format = ROW` such a change is a rows event, so one logged as a
/// statement comes from a session that set another format.
fn row_change_verb(query: &str) -> Option<&'static str> {
    let mut rest = query.trim_start();
    while let Some(after) = rest.strip_prefix("/*") {
        rest = after.split_once("*/").map_or("", |(_, r)| r).trim_start();
    }
    let word: String = rest
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .collect::<String>()
        .to_ascii_uppercase();
    ["INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD"]
        .into_iter()
        .find(|v| *v == word)
}

/// MariaDB's events of a file's header after its format description (the
/// GTIDs before the file, the binlogs still needed for crash recovery).
fn is_file_header(raw: u8) -> bool {
    matches!(
        raw,
        mariadb_events::GTID_LIST | mariadb_events::BINLOG_CHECKPOINT
    )
}

/// Whether an event of type `ty` may come from inside a compressed
/// transaction: any but those that open a transaction, carry another
/// payload, or come from the file or the dump rather than a transaction.
fn may_be_in_a_payload(ty: u8) -> bool {
    ![
        EventType::GTID_EVENT as u8,
        EventType::ANONYMOUS_GTID_EVENT as u8,
        EventType::GTID_TAGGED_LOG_EVENT as u8,
        EventType::TRANSACTION_PAYLOAD_EVENT as u8,
        EventType::ROTATE_EVENT as u8,
        EventType::FORMAT_DESCRIPTION_EVENT as u8,
        EventType::PREVIOUS_GTIDS_EVENT as u8,
        EventType::HEARTBEAT_EVENT as u8,
        HEARTBEAT_V2,
        EventType::STOP_EVENT as u8,
    ]
    .contains(&ty)
}

/// A compressed transaction capture cannot read whole: the replica stream
/// passes over a payload it cannot parse or unpack without a word, which
/// would lose the transaction's rows with a healthy status.
fn payload_cut(file: &str, start: u64, why: &str) -> MySqlSourceError {
    MySqlSourceError::Prerequisite {
        setting: "binlog_transaction_compression",
        found: format!("ON, and the compressed transaction at {file}:{start} cannot be read whole: {why}"),
        needed: "compressed transactions that unpack",
        fix: "capture stops rather than pass over the transaction's rows. Read that place with mysqlbinlog --verbose; if the payload is damaged, SET GLOBAL binlog_transaction_compression = OFF (and in the server's config file) and take a new snapshot of the captured tables (delete the stored offset)",
    }
}

/// An event at `file:start` that does not decode.
fn protocol(file: &str, start: u64, what: &str, e: &dyn std::fmt::Display) -> MySqlSourceError {
    MySqlSourceError::Protocol(format!("{what} at {file}:{start}: {e}"))
}

/// Whether the event's last four bytes are the CRC32 of the rest.
fn ends_with_crc32(event: &Event) -> bool {
    let mut bytes = Vec::new();
    if event.write(BinlogVersion::Version4, &mut bytes).is_err() || bytes.len() < 4 {
        return false;
    }
    let (body, sum) = bytes.split_at(bytes.len() - 4);
    <[u8; 4]>::try_from(sum).is_ok_and(|s| u32::from_le_bytes(s) == crc32fast::hash(body))
}

mod compressed;

#[cfg(test)]
mod tests;
