//! MySQL's tables as the envelope writes them: Debezium's MySQL connector
//! records (topic `<topic.prefix>.<database>.<table>`, key, value with
//! `before`/`after`/`op`/`ts_ms`) from a decoded binlog change or a
//! snapshot row. The core [`TableEncoder`] writes the records; this module
//! gives it the table's columns, each cell rendered by the Debezium
//! mapping ([`super::mapping`]), and the MySQL `source` block.
//!
//! ```text
//!  RowChange / snapshot row ──cells──▶ mapping ──JSON per cell──▶ TableEncoder
//!  Position, server id, thread ──────▶ MySqlSource ──source block──┘
//! ```
//!
//! What it keeps: a record is Debezium's MySQL connector's, field for
//! field, but for the differences docs/mysql.md lists (each asserted by the
//! comparison with Debezium's own records in `tests.rs`); a value the
//! mapping refuses refuses the change, never publishes it altered.

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};

use super::cell::Cell;
use super::decoder::{ChangeKind, RowChange};
use super::mapping::{self, MappingConfig, MappingError};
use super::position::Position;
use super::shape::{ColumnShape as MySqlColumnShape, TableShape as MySqlTableShape};
use crate::change::{Datum, RowImage};
use crate::envelope::{
    self, Characters, ColumnShape, ColumnType, EnvelopeConfig, EnvelopeError, Op, Row,
    SnapshotMarker, SourceBlock, SourceIdentity, SourcePosition, SourceType, TableEncoder,
    TableShape, Unrepresentable, SOURCE_VERSION,
};
use crate::envelope::{common_source_fields, schema_field as field};
use crate::json::{write_i64, write_str, write_u64};

pub use crate::envelope::SnapshotMarker as Snapshot;

/// Connect name of the MySQL `source` struct.
pub const SOURCE_SCHEMA_NAME: &str = "io.debezium.connector.mysql.Source";

/// `source.server_id` of snapshot rows (Debezium's: no event, no server).
pub const SNAPSHOT_SERVER_ID: u32 = 0;

/// Values the `snapshot` field may take, as Debezium's MySQL connector
/// declares them.
const SNAPSHOT_ALLOWED: &str =
    "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental";

/// The `source` struct of Debezium's MySQL connector.
pub fn source_schema() -> Value {
    let mut fields = common_source_fields(SNAPSHOT_ALLOWED);
    fields.extend([
        field("int64", true, "ts_us"),
        field("int64", true, "ts_ns"),
        field("string", true, "table"),
        field("int64", false, "server_id"),
        field("string", true, "gtid"),
        field("string", false, "file"),
        field("int64", false, "pos"),
        field("int32", false, "row"),
        field("int64", true, "thread"),
        field("string", true, "query"),
    ]);
    json!({
        "type": "struct",
        "fields": fields,
        "optional": false,
        "name": SOURCE_SCHEMA_NAME,
        "version": 1,
        "field": "source"
    })
}

/// The per-event fields of the `source` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MySqlSource<'a> {
    /// The event's time (a snapshot row: when the snapshot read it), ms
    /// since 1970.
    pub ts_ms: i64,
    pub snapshot: SnapshotMarker,
    /// The server that wrote the event ([`SNAPSHOT_SERVER_ID`] for a
    /// snapshot row).
    pub server_id: u32,
    /// The transaction's GTID.
    pub gtid: Option<&'a str>,
    /// Binlog file and offset of the rows event (a snapshot row: the
    /// snapshot's position).
    pub file: &'a str,
    pub pos: u64,
    /// The row's place in its rows event, from 0.
    pub row: u64,
    /// The connection that made the change, when the binlog says.
    pub thread: Option<u64>,
    /// The statement, with `include.query` (null otherwise).
    pub query: Option<&'a str>,
    /// The position's failover epoch (`Position::epoch`): written as
    /// `failover_epoch` only when above 0, so records of a binlog never
    /// failed over are Debezium's byte for byte; sinks put it above the
    /// file and offset in the row's version (the failover rule of
    /// `offset.rs`).
    pub epoch: u32,
}

impl<'a> MySqlSource<'a> {
    /// The source fields of a binlog change (a change's position counts
    /// the rows already published, its own included; Debezium's `row`
    /// counts from 0). `query` is the statement with `include.query`.
    pub fn of_change(change: &'a RowChange, query: Option<&'a str>) -> Self {
        Self {
            ts_ms: change.ts_ms,
            snapshot: SnapshotMarker::False,
            server_id: change.server_id,
            gtid: change.gtid.as_deref(),
            file: &change.position.file,
            pos: change.event_pos,
            row: change.position.row.saturating_sub(1),
            thread: change.thread.map(u64::from),
            query,
            epoch: change.position.epoch,
        }
    }
}

impl<'a> MySqlSource<'a> {
    /// The source fields of a snapshot row: the snapshot's binlog position,
    /// no event (server id 0, row 0, no GTID or thread), `ts_ms` when the
    /// row was read.
    pub fn of_snapshot(position: &'a Position, ts_ms: i64, marker: SnapshotMarker) -> Self {
        Self {
            ts_ms,
            snapshot: marker,
            server_id: SNAPSHOT_SERVER_ID,
            gtid: None,
            file: &position.file,
            pos: position.pos,
            row: 0,
            thread: None,
            query: None,
            epoch: position.epoch,
        }
    }
}

/// The source fields of `change` as JSON, as the block writes them (for
/// tests comparing with Debezium's records).
pub fn change_source(change: &RowChange, query: Option<&str>) -> Value {
    source_json(&MySqlSource::of_change(change, query))
}

/// The source block of `src` as JSON (for tests comparing with Debezium's
/// records; the names are placeholders).
pub fn source_json(src: &MySqlSource<'_>) -> Value {
    let writer = SourceWriter::new("p", "d", "t");
    let mut out = Vec::new();
    writer.write(&mut out, src);
    serde_json::from_slice(&out).unwrap_or(Value::Null)
}

/// Pre-escaped fragments of one table's `source` block.
#[derive(Debug, Clone)]
struct SourceWriter {
    /// `{"version":...,"connector":"mysql","name":"<prefix>","ts_ms":`
    head: Vec<u8>,
    /// `,"db":"<database>","sequence":null,"ts_us":`
    db: Vec<u8>,
    /// `,"table":"<table>","server_id":`
    table: Vec<u8>,
}

impl SourceWriter {
    fn new(prefix: &str, database: &str, table: &str) -> Self {
        let mut head = b"{\"version\":".to_vec();
        write_str(&mut head, SOURCE_VERSION);
        head.extend_from_slice(b",\"connector\":\"mysql\",\"name\":");
        write_str(&mut head, prefix);
        head.extend_from_slice(b",\"ts_ms\":");
        let mut db = b",\"db\":".to_vec();
        write_str(&mut db, database);
        db.extend_from_slice(b",\"sequence\":null,\"ts_us\":");
        let mut tbl = b",\"table\":".to_vec();
        write_str(&mut tbl, table);
        tbl.extend_from_slice(b",\"server_id\":");
        Self {
            head,
            db,
            table: tbl,
        }
    }

    fn write(&self, out: &mut Vec<u8>, src: &MySqlSource<'_>) {
        out.extend_from_slice(&self.head);
        write_i64(out, src.ts_ms);
        out.extend_from_slice(b",\"snapshot\":\"");
        out.extend_from_slice(src.snapshot.as_str().as_bytes());
        out.push(b'"');
        out.extend_from_slice(&self.db);
        write_i64(out, src.ts_ms.saturating_mul(1000));
        out.extend_from_slice(b",\"ts_ns\":");
        write_i64(out, src.ts_ms.saturating_mul(1_000_000));
        out.extend_from_slice(&self.table);
        write_u64(out, u64::from(src.server_id));
        out.extend_from_slice(b",\"gtid\":");
        write_opt_str(out, src.gtid);
        out.extend_from_slice(b",\"file\":");
        write_str(out, src.file);
        out.extend_from_slice(b",\"pos\":");
        write_u64(out, src.pos);
        out.extend_from_slice(b",\"row\":");
        write_u64(out, src.row);
        out.extend_from_slice(b",\"thread\":");
        match src.thread {
            Some(t) => write_u64(out, t),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"query\":");
        write_opt_str(out, src.query);
        if src.epoch > 0 {
            out.extend_from_slice(b",\"failover_epoch\":");
            write_u64(out, u64::from(src.epoch));
        }
        out.push(b'}');
    }
}

fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A MySQL column as the envelope writes it: a cell arrives rendered as
/// its JSON (character columns: as their text, so that masks see the
/// characters, not the JSON quoting).
#[derive(Debug)]
struct MySqlColumn {
    col: MySqlColumnShape,
    mapping: MappingConfig,
    chars: bool,
}

impl MySqlColumn {
    fn new(col: &MySqlColumnShape, mapping: MappingConfig) -> Self {
        let schema = mapping::field_schema(&mapping, col, true);
        // Plain text: a string field without a logical name (not JSON,
        // ENUM, SET, a zoned timestamp or a decimal as text).
        let chars = schema["type"] == "string"
            && schema.get("name").is_none()
            && !col.binary
            && !is_decimal(col);
        Self {
            col: col.clone(),
            mapping,
            chars,
        }
    }
}

fn is_decimal(col: &MySqlColumnShape) -> bool {
    use mysql_async::consts::ColumnType::*;
    matches!(col.ty, MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL)
}

/// A column whose values the mapping can refuse, and how its rendered
/// values look when it did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusable {
    /// BIGINT UNSIGNED as int64: a rendered value fits an i64.
    UnsignedLong,
    /// DECIMAL as Connect Decimal: a rendered value is a JSON string.
    PreciseDecimal,
}

impl MySqlColumn {
    fn refusable(&self) -> Option<Refusable> {
        use mysql_async::consts::ColumnType::MYSQL_TYPE_LONGLONG;
        if self.col.ty == MYSQL_TYPE_LONGLONG
            && self.col.unsigned
            && self.mapping.bigint_unsigned == mapping::BigintUnsignedHandlingMode::Long
        {
            Some(Refusable::UnsignedLong)
        } else if is_decimal(&self.col)
            && self.mapping.decimal == mapping::DecimalHandlingMode::Precise
        {
            Some(Refusable::PreciseDecimal)
        } else {
            None
        }
    }

    /// Whether `text` is a value the mapping refused (its raw text), not
    /// one it rendered.
    fn refuses(&self, text: &str) -> bool {
        match self.refusable() {
            Some(Refusable::UnsignedLong) => text.parse::<i64>().is_err(),
            Some(Refusable::PreciseDecimal) => !text.starts_with('"'),
            None => false,
        }
    }
}

const UNSIGNED_FIELD: &str = "int64 (bigint.unsigned.handling.mode = \"long\")";
const UNSIGNED_FIX: &str = "set bigint.unsigned.handling.mode = \"precise\" in the capture config (a Connect Decimal holds every BIGINT UNSIGNED), restart capture, then snapshot the table to bring the refused rows to the targets";
const DECIMAL_FIELD: &str = "org.apache.kafka.connect.data.Decimal";
const DECIMAL_FIX: &str =
    "set decimal.handling.mode = \"string\" to publish the text as it is, then snapshot the table";

impl ColumnType for MySqlColumn {
    fn field_schema(&self, field: &str, optional: bool) -> Value {
        // Debezium declares NOT NULL columns required.
        let mut schema =
            mapping::field_schema(&self.mapping, &self.col, optional && self.col.nullable);
        schema["field"] = json!(field);
        schema
    }

    fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        if self.refuses(text) {
            return Err(Unrepresentable);
        }
        if self.chars {
            write_str(out, text);
        } else {
            out.extend_from_slice(text.as_bytes());
        }
        Ok(())
    }

    // The envelope's own records refuse values while rendered
    // (`MySqlTableEncoder::render`); the core's encoder of a streamed
    // table refuses here the raw values a row image carries instead
    // (`MySqlRowImages::image`), with the same help.
    fn refusal_help(&self) -> (&'static str, &'static str) {
        match self.refusable() {
            Some(Refusable::UnsignedLong) => (UNSIGNED_FIELD, UNSIGNED_FIX),
            Some(Refusable::PreciseDecimal) => (DECIMAL_FIELD, DECIMAL_FIX),
            None => (
                "its field",
                "bring the value into the field's range, then snapshot the table",
            ),
        }
    }

    fn characters(&self) -> Characters {
        if self.chars {
            Characters::Unbounded
        } else {
            Characters::No
        }
    }

    fn source_type(&self) -> Option<SourceType> {
        self.col.declared.as_deref().map(declared_source_type)
    }
}

/// A declared type (`information_schema.COLUMNS.COLUMN_TYPE`, as
/// `decimal(10,2) unsigned zerofill`) as Debezium's MySQL connector names
/// it: the type with its attributes, upper case (`DECIMAL UNSIGNED
/// ZEROFILL`), the declared length (or precision) and scale where the
/// declaration has them. ENUM's and SET's parentheses hold labels, no length.
fn declared_source_type(declared: &str) -> SourceType {
    let declared = declared.trim();
    let base_end = declared
        .find(|c: char| c == '(' || c.is_whitespace())
        .unwrap_or(declared.len());
    let base = declared[..base_end].to_ascii_uppercase();
    let (sizes, rest) = match declared[base_end..].strip_prefix('(') {
        // Labels may hold ')': the attributes follow the last one.
        Some(inner) => match inner.rfind(')') {
            Some(close) => (Some(&inner[..close]), &inner[close + 1..]),
            None => (None, ""),
        },
        None => (None, &declared[base_end..]),
    };
    let (length, scale) = match sizes {
        Some(sizes) if base != "ENUM" && base != "SET" => {
            let mut parts = sizes.split(',').map(|p| p.trim().parse::<u32>().ok());
            (parts.next().flatten(), parts.next().flatten())
        }
        _ => (None, None),
    };
    let name = std::iter::once(base)
        .chain(rest.split_whitespace().map(str::to_ascii_uppercase))
        .collect::<Vec<_>>()
        .join(" ");
    SourceType {
        name,
        length,
        scale,
    }
}

/// A row rendered for the encoder: each cell's JSON (or text) in one
/// buffer; `None` for SQL NULL and values Debezium writes as null.
struct Rendered {
    buf: Vec<u8>,
    cells: Vec<Option<(usize, usize)>>,
}

impl Row for Rendered {
    fn width(&self) -> usize {
        self.cells.len()
    }

    fn cell(&self, i: usize) -> envelope::Cell<'_> {
        match self.cells.get(i).copied().flatten() {
            Some((a, b)) => envelope::Cell::Text(&self.buf[a..b]),
            None => envelope::Cell::Null,
        }
    }
}

/// Records of one shape of one MySQL table; build a new one when the
/// shape changes (a TABLE_MAP with other columns, a DDL).
#[derive(Debug, Clone)]
pub struct MySqlTableEncoder {
    encoder: TableEncoder,
    shape: Arc<MySqlTableShape>,
    columns: Vec<Arc<MySqlColumn>>,
    source: SourceWriter,
    /// A table without a primary key has null keys (as Debezium writes).
    keyed: bool,
}

/// One record: its topic's key (null for a table without a primary key)
/// and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MySqlRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

impl MySqlTableEncoder {
    /// Prepares the records of `shape` under `mapping`; `cfg.columns`
    /// excludes and masks columns as for PostgreSQL (`cfg.database` is not
    /// used: `source.db` is the table's database).
    pub fn new(
        shape: Arc<MySqlTableShape>,
        mapping: MappingConfig,
        cfg: &EnvelopeConfig,
    ) -> Result<Self, EnvelopeError> {
        let columns: Vec<Arc<MySqlColumn>> = shape
            .columns
            .iter()
            .map(|c| Arc::new(MySqlColumn::new(c, mapping)))
            .collect();
        let core = core_shape(&shape, &columns);
        let encoder = TableEncoder::with_source_schema(&core, cfg, None, source_schema())?;
        Ok(Self {
            encoder,
            source: SourceWriter::new(&cfg.topic_prefix, &shape.database, &shape.table),
            keyed: !shape.primary_key.is_empty(),
            shape,
            columns,
        })
    }

    /// `<topic.prefix>.<database>.<table>` (or its `topic.name.mapping`).
    pub fn topic(&self) -> &str {
        self.encoder.topic()
    }

    /// The record of a binlog change, with the source fields `src`
    /// ([`MySqlSource::of_change`]); `now_ms` is the top-level `ts_ms`.
    pub fn change_record(
        &self,
        change: &RowChange,
        src: &MySqlSource<'_>,
        now_ms: i64,
    ) -> Result<MySqlRecord, EnvelopeError> {
        let op = match change.kind {
            ChangeKind::Insert => Op::Create,
            ChangeKind::Update => Op::Update,
            ChangeKind::Delete => Op::Delete,
        };
        self.record(
            op,
            change.before.as_deref(),
            change.after.as_deref(),
            src,
            now_ms,
        )
    }

    /// The record of a snapshot row (op `r`).
    pub fn read_record(
        &self,
        row: &[Cell],
        src: &MySqlSource<'_>,
        now_ms: i64,
    ) -> Result<MySqlRecord, EnvelopeError> {
        self.record(Op::Read, None, Some(row), src, now_ms)
    }

    /// A record with the key of the new row (the old one for a delete).
    pub fn record(
        &self,
        op: Op,
        before: Option<&[Cell]>,
        after: Option<&[Cell]>,
        src: &MySqlSource<'_>,
        now_ms: i64,
    ) -> Result<MySqlRecord, EnvelopeError> {
        let before = before.map(|r| self.render(r)).transpose()?;
        let after = after.map(|r| self.render(r)).transpose()?;
        let key = match after.as_ref().or(before.as_ref()) {
            Some(row) if self.keyed => Some(self.encoder.key(row)?),
            _ => None,
        };
        let mut value = Vec::new();
        self.encoder.value_with_source_into(
            op,
            before.as_ref(),
            after.as_ref(),
            |out: &mut Vec<u8>| self.source.write(out, src),
            now_ms,
            &mut value,
        )?;
        Ok(MySqlRecord { key, value })
    }

    /// Each cell's JSON by the mapping; a value the mapping refuses is the
    /// envelope's refusal (the change goes to the dead letter topic).
    fn render(&self, row: &[Cell]) -> Result<Rendered, EnvelopeError> {
        render(&self.shape, &self.columns, row, Refusals::Fail)
    }
}

/// Rows of one shape of one MySQL table as the core's row images: each
/// cell rendered by the mapping as [`MySqlTableEncoder`] renders it, so the
/// core's [`TableEncoder`] of the same shape writes them unchanged.
#[derive(Debug, Clone)]
pub struct MySqlRowImages {
    shape: Arc<MySqlTableShape>,
    columns: Vec<Arc<MySqlColumn>>,
}

impl MySqlRowImages {
    pub fn new(shape: Arc<MySqlTableShape>, mapping: MappingConfig) -> Self {
        let columns = shape
            .columns
            .iter()
            .map(|c| Arc::new(MySqlColumn::new(c, mapping)))
            .collect();
        Self { shape, columns }
    }

    /// The core's shape of the table, with these columns' types: what a
    /// core [`TableEncoder`] of the images is built from.
    pub fn core_shape(&self) -> TableShape {
        core_shape(&self.shape, &self.columns)
    }

    /// `row` as a core row image: a cell Debezium writes as null is
    /// [`Datum::Null`](crate::change::Datum::Null), any other its rendered
    /// text. A value the mapping refuses for its field (a BIGINT UNSIGNED
    /// above int64, a DECIMAL the Connect Decimal cannot hold) keeps its
    /// raw text, which the core's encoder refuses with the envelope's help
    /// (the change goes to the dead letter topic); text that is not UTF-8
    /// is an error.
    pub fn image(&self, row: &[Cell]) -> Result<RowImage, EnvelopeError> {
        let rendered = render(&self.shape, &self.columns, row, Refusals::Raw)?;
        let buf = bytes::Bytes::from(rendered.buf);
        Ok(RowImage(
            rendered
                .cells
                .into_iter()
                .map(|cell| match cell {
                    Some((a, b)) => Datum::Text(buf.slice(a..b)),
                    None => Datum::Null,
                })
                .collect(),
        ))
    }
}

/// The `source` fields of the change the core encodes next that its
/// [`SourcePosition`] does not carry (GTID, server, thread, file, the row
/// in its event): the stream sets them as it hands out each change, and
/// the core encodes a change before it asks for the next event (its one
/// task), so the block of every record is its own change's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFacts {
    pub ts_ms: i64,
    pub server_id: u32,
    pub gtid: Option<String>,
    /// The rows event's file and offset (a snapshot row: the snapshot's
    /// position).
    pub file: String,
    pub pos: u64,
    /// The row's place in its rows event, from 0.
    pub row: u64,
    pub thread: Option<u64>,
    /// The statement that made the change (`include.query`; else null).
    pub query: Option<Arc<str>>,
    /// The position's failover epoch.
    pub epoch: u32,
}

impl EventFacts {
    /// The facts of binlog change `change`.
    pub fn of_change(change: &RowChange) -> Self {
        let src = MySqlSource::of_change(change, None);
        Self {
            ts_ms: src.ts_ms,
            server_id: src.server_id,
            gtid: src.gtid.map(str::to_owned),
            file: src.file.to_owned(),
            pos: src.pos,
            row: src.row,
            thread: src.thread,
            query: change.query.clone(),
            epoch: src.epoch,
        }
    }
}

/// The facts the stream shares with its tables' encoders.
pub type SharedFacts = Arc<Mutex<EventFacts>>;

/// The MySQL `source` block on the core's encoder.
#[derive(Debug)]
struct MySqlBlock {
    writer: SourceWriter,
    facts: SharedFacts,
}

impl SourceBlock for MySqlBlock {
    fn write(&self, out: &mut Vec<u8>, src: &SourcePosition) {
        let facts = self.facts.lock().unwrap_or_else(PoisonError::into_inner);
        let block = if src.snapshot == SnapshotMarker::False {
            MySqlSource {
                ts_ms: facts.ts_ms,
                snapshot: src.snapshot,
                server_id: facts.server_id,
                gtid: facts.gtid.as_deref(),
                file: &facts.file,
                pos: facts.pos,
                row: facts.row,
                thread: facts.thread,
                query: facts.query.as_deref(),
                epoch: facts.epoch,
            }
        } else {
            MySqlSource {
                ts_ms: src.commit_ts_ms,
                snapshot: src.snapshot,
                server_id: SNAPSHOT_SERVER_ID,
                gtid: None,
                file: &facts.file,
                pos: facts.pos,
                row: 0,
                thread: None,
                // Snapshot rows have no statement (Debezium writes null).
                query: None,
                epoch: facts.epoch,
            }
        };
        self.writer.write(out, &block);
    }
}

impl MySqlRowImages {
    /// The core encoder of these images: Debezium's MySQL records keyed by
    /// `key` (`message.key.columns`, else the primary key), the `source`
    /// block from `facts` ([`EventFacts`]).
    pub fn encoder(
        &self,
        cfg: &EnvelopeConfig,
        key: Option<&[String]>,
        identity: Option<&SourceIdentity>,
        facts: SharedFacts,
    ) -> Result<TableEncoder, EnvelopeError> {
        let mut shape = self.core_shape();
        if let Some(names) = key {
            shape.key = names
                .iter()
                .map(|n| {
                    self.shape
                        .columns
                        .iter()
                        .position(|c| &c.name == n)
                        .ok_or_else(|| EnvelopeError::UnknownKeyColumn {
                            table: self.shape.qualified(),
                            column: n.clone(),
                        })
                })
                .collect::<Result<_, _>>()?;
        }
        if shape.key.is_empty() {
            return Err(EnvelopeError::NoKeyColumns {
                table: self.shape.qualified(),
            });
        }
        let block = MySqlBlock {
            writer: SourceWriter::new(&cfg.topic_prefix, &self.shape.database, &self.shape.table),
            facts,
        };
        TableEncoder::with_source_block(&shape, cfg, identity, source_schema(), Arc::new(block))
    }
}

fn core_shape(shape: &MySqlTableShape, columns: &[Arc<MySqlColumn>]) -> TableShape {
    TableShape {
        namespace: shape.database.clone(),
        name: shape.table.clone(),
        columns: shape
            .columns
            .iter()
            .zip(columns)
            .map(|(c, ty)| ColumnShape {
                name: c.name.clone(),
                ty: Arc::clone(ty) as Arc<dyn ColumnType>,
            })
            .collect(),
        key: shape.primary_key.clone(),
    }
}

/// What rendering does with a value the mapping refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusals {
    /// Fails the row with the refusal.
    Fail,
    /// Keeps the value's raw text (a BIGINT UNSIGNED's number, a
    /// DECIMAL's text), which the column's `write_json` refuses when the
    /// core's encoder writes it: the change goes to the dead letter topic
    /// there, as any refused value does.
    Raw,
}

/// Each cell of `row` (of `shape`) as JSON by its column's mapping.
fn render(
    shape: &MySqlTableShape,
    columns: &[Arc<MySqlColumn>],
    row: &[Cell],
    refusals: Refusals,
) -> Result<Rendered, EnvelopeError> {
    if row.len() != columns.len() {
        return Err(EnvelopeError::ColumnCount {
            table: shape.qualified(),
            expected: columns.len(),
            got: row.len(),
        });
    }
    let mut out = Rendered {
        buf: Vec::with_capacity(16 * row.len()),
        cells: Vec::with_capacity(row.len()),
    };
    for (col, cell) in columns.iter().zip(row) {
        let start = out.buf.len();
        let value = match mapping::to_json(&col.mapping, &col.col, cell) {
            Ok(value) => value,
            Err(e) => match (refusals, raw_refused(col, &e)) {
                (Refusals::Raw, Some(raw)) => {
                    out.buf.extend_from_slice(raw.as_bytes());
                    out.cells.push(Some((start, out.buf.len())));
                    continue;
                }
                _ => return Err(refusal(shape, &col.col, e)),
            },
        };
        match value {
            Value::Null => {
                out.cells.push(None);
                continue;
            }
            Value::String(s) if col.chars => out.buf.extend_from_slice(s.as_bytes()),
            v => {
                serde_json::to_writer(&mut out.buf, &v).map_err(|_| EnvelopeError::InvalidUtf8 {
                    table: shape.qualified(),
                    column: col.col.name.clone(),
                })?
            }
        }
        out.cells.push(Some((start, out.buf.len())));
    }
    Ok(out)
}

/// The raw text of a value `col`'s `write_json` refuses, for refusal `e`.
fn raw_refused(col: &MySqlColumn, e: &MappingError) -> Option<String> {
    let raw = match e {
        MappingError::UnsignedOverflow { value } => value.to_string(),
        MappingError::Decimal(text) => text.clone(),
        MappingError::InvalidUtf8 => return None,
    };
    col.refuses(&raw).then_some(raw)
}

fn refusal(shape: &MySqlTableShape, col: &MySqlColumnShape, e: MappingError) -> EnvelopeError {
    let table = shape.qualified();
    let column = col.name.clone();
    match e {
        MappingError::InvalidUtf8 => EnvelopeError::InvalidUtf8 { table, column },
        MappingError::UnsignedOverflow { value } => EnvelopeError::Unrepresentable {
            table,
            column,
            value: value.to_string(),
            field: UNSIGNED_FIELD,
            fix: UNSIGNED_FIX,
        },
        MappingError::Decimal(text) => EnvelopeError::Unrepresentable {
            table,
            column,
            value: text.chars().take(200).collect(),
            field: DECIMAL_FIELD,
            fix: DECIMAL_FIX,
        },
    }
}

/// A table shape as JSON (the Debezium fixtures store the shape their
/// cells were read with): each column's binlog type code and name,
/// metadata, flags and labels.
pub fn shape_json(shape: &MySqlTableShape) -> Value {
    let columns: Vec<Value> = shape
        .columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "type": c.ty as u8, "type_name": format!("{:?}", c.ty),
                "meta": c.meta, "unsigned": c.unsigned, "nullable": c.nullable,
                "binary": c.binary, "labels": c.labels, "declared": c.declared, "json": c.json,
            })
        })
        .collect();
    json!({
        "database": shape.database, "table": shape.table,
        "columns": columns, "primary_key": shape.primary_key,
    })
}

/// The shape [`shape_json`] wrote, or what is wrong with the JSON.
pub fn shape_from_json(v: &Value) -> Result<MySqlTableShape, String> {
    let text = |v: &Value, k: &str| -> Result<String, String> {
        v[k].as_str()
            .map(str::to_owned)
            .ok_or(format!("{k} is not a string"))
    };
    let columns = v["columns"]
        .as_array()
        .ok_or("no columns")?
        .iter()
        .map(|c| {
            let code = c["type"].as_u64().ok_or("type is not a number")?;
            let ty = mysql_async::consts::ColumnType::try_from(code as u8)
                .map_err(|_| format!("unknown column type {code}"))?;
            let mut col = MySqlColumnShape::new(&text(c, "name")?, ty);
            col.meta = serde_json::from_value(c["meta"].clone()).map_err(|e| e.to_string())?;
            col.unsigned = c["unsigned"].as_bool().unwrap_or(false);
            col.nullable = c["nullable"].as_bool().unwrap_or(true);
            col.binary = c["binary"].as_bool().unwrap_or(false);
            col.labels = serde_json::from_value(c["labels"].clone()).map_err(|e| e.to_string())?;
            col.declared = c["declared"].as_str().map(str::to_owned);
            col.json = c["json"].as_bool().unwrap_or(false);
            Ok(col)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(MySqlTableShape {
        database: text(v, "database")?,
        table: text(v, "table")?,
        columns,
        primary_key: serde_json::from_value(v["primary_key"].clone()).map_err(|e| e.to_string())?,
        identity: None,
    })
}
