//! The binlog as the core's change stream: the decoder's changes moved
//! into core [`StreamEvent`]s at `u64` order keys ([`order_key`]).
//!
//! ```text
//!  BinlogChange::Row ──▶ Begin (first row of a transaction)
//!                        Table (a table not described yet, or of another shape)
//!                        Change { at: file sequence << 32 | rows event offset }
//!  BinlogChange::Commit ─▶ Commit { commit: key of the transaction's start,
//!                                   end: key of the next one's } (rows were published)
//!                        KeepAlive { key of the next start } (none were)
//!  BinlogChange::Ddl ───▶ nothing: the next TABLE_MAP of the table brings its shape
//! ```
//!
//! Sans I/O, so the rules are unit-tested. What it keeps: a transaction's
//! `Begin.commit` and `Commit.commit` are the order key of its first event
//! (what the offset record's `commit_lsn` names, see `offset.rs`), its
//! `Commit.end` the next transaction's, so the core's tracker counts the
//! changes of a transaction from its start and a restart at that key skips
//! exactly those already published.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, PoisonError};

use super::book::PositionBook;
use super::decoder::{BinlogChange, ChangeKind, RowChange};
use super::envelope::{EventFacts, MySqlRowImages, SharedFacts};
use super::error::MySqlSourceError;
use super::history::ShapeFacts;
use super::mapping::MappingConfig;
use super::offset::order_key;
use super::position::Position;
use super::shape::TableShape;
use super::watermarks::SharedNumbering;
use crate::change::{Change, OldImage, StreamEvent, StreamTable};
use crate::envelope::{EnvelopeConfig, EnvelopeError, SourceIdentity, TableEncoder};
use crate::error::CaptureError;
use crate::seam::RoutedTable;

/// Microseconds from 1970 to 2000-01-01, the epoch of the core's
/// `commit_ts_us` (PostgreSQL's, which the tracker converts from).
const CORE_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// A MySQL table as the stream describes it to the core: its shape as of a
/// TABLE_MAP, under a stream id stable for its `database.table`.
#[derive(Debug, Clone)]
pub struct MySqlTable {
    pub id: u32,
    pub shape: Arc<TableShape>,
    /// The database and table it publishes under.
    pub namespace: String,
    pub name: String,
    /// Renders its rows for the core.
    pub images: MySqlRowImages,
    /// The `source` block's facts of the change being encoded.
    pub facts: SharedFacts,
    /// A snapshot chunk's table (no identity of its own): the shape facts
    /// as of the stream's position when its rows go out, which number its
    /// columns ([`super::control`]).
    pub numbering: Option<SharedNumbering>,
}

impl PartialEq for MySqlTable {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.shape == other.shape
            && self.namespace == other.namespace
            && self.name == other.name
    }
}

impl StreamTable for MySqlTable {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn width(&self) -> usize {
        self.shape.columns.len()
    }

    fn column_name(&self, i: usize) -> &str {
        &self.shape.columns[i].name
    }

    /// The binlog type code with the flags and metadata that change how
    /// its values are written (signedness, binary, JSON, length/precision).
    fn column_type(&self, i: usize) -> u32 {
        let c = &self.shape.columns[i];
        u32::from(c.ty as u8)
            | u32::from(c.unsigned) << 8
            | u32::from(c.binary) << 9
            | u32::from(c.json) << 10
            | u32::from(c.meta_byte(0)) << 16
            | u32::from(c.meta_byte(1)) << 24
    }

    /// A chunk's table whose columns the shape facts as of the stream's
    /// position number only in part: the catalog was read past a DDL
    /// (RENAME, ADD) after the chunk's read view.
    fn shape_ahead_of_stream(&self) -> bool {
        let Some(numbering) = &self.numbering else {
            return false;
        };
        let facts = Arc::clone(&numbering.lock().unwrap_or_else(PoisonError::into_inner));
        facts
            .ids(&self.shape.database, &self.shape.table)
            .is_some_and(|ids| !ids.covers(self.shape.columns.iter().map(|c| c.name.as_str())))
    }
}

/// A table map with its shape is how the binlog describes a table to the
/// router: under `binlog_row_image = FULL` (a start-up check) every before
/// image carries every column, so no key is ever missing from one.
impl RoutedTable for MySqlTable {
    /// The mapping's settings travel in each table's images.
    type Types = ();
    /// The binlog announces no value types.
    type TypeNote = Infallible;

    fn id(&self) -> u32 {
        self.id
    }

    fn publish_as(&mut self, namespace: String, name: String) {
        self.namespace = namespace;
        self.name = name;
    }

    /// Columns and their identity: a column dropped and added again under
    /// its name and type is another column.
    fn same_columns(&self, other: &Self) -> bool {
        self.shape.columns == other.shape.columns && self.shape.identity == other.shape.identity
    }

    fn stream_key(&self) -> Vec<String> {
        self.shape
            .primary_key
            .iter()
            .map(|&i| self.shape.columns[i].name.clone())
            .collect()
    }

    fn identity_lacks(&self, _qualified: &str, _key: &[String]) -> Option<String> {
        None
    }

    fn identity_reason(lacks: &str) -> String {
        format!("{lacks}; set binlog_row_image = FULL on the server")
    }

    fn keyless_reason(qualified: &str) -> String {
        format!(
            "table {qualified} has no primary key, so its changes have no key to order them by: \
             add a primary key (ALTER TABLE {qualified} ADD PRIMARY KEY (...)) or name key \
             columns in message.key.columns"
        )
    }

    fn encoder(
        &self,
        _types: &(),
        key: Option<&[String]>,
        envelope: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<TableEncoder, EnvelopeError> {
        self.images
            .encoder(envelope, key, identity, Arc::clone(&self.facts))
    }

    fn observe_type(_types: &mut (), note: &Infallible) -> bool {
        match *note {}
    }
}

/// An event of the MySQL stream as the core reads it.
pub(crate) type MySqlEvent = StreamEvent<MySqlTable, Infallible>;

/// The open transaction: the order key of its first event.
#[derive(Debug, Clone, Copy)]
struct OpenTx {
    start: u64,
}

/// Moves decoded binlog changes into core stream events.
#[derive(Debug)]
pub struct StreamAdapter {
    mapping: MappingConfig,
    /// Stream ids by `(database, table)`, from 1, never reused.
    ids: HashMap<(String, String), u32>,
    /// The description last sent of each id.
    described: HashMap<u32, Arc<MySqlTable>>,
    open: Option<OpenTx>,
    /// The core's transaction id: binlog transactions have none that fits
    /// 32 bits on every server, so they are counted (wrapping).
    xid: u32,
    /// Events moved, not handed out yet, each change with its facts, a
    /// commit with the shape facts it brought.
    queue: VecDeque<(MySqlEvent, Option<EventFacts>, Option<Arc<ShapeFacts>>)>,
    /// The facts of the change handed out last, which the tables'
    /// encoders write into its `source` block.
    facts: SharedFacts,
    /// The binlog positions of the order keys moved.
    book: PositionBook,
    /// After a failover, until the first transaction with rows: the
    /// stored key that transaction keeps (the failover rule of
    /// `offset.rs`), so the core skips what of it was published.
    adopt: Option<u64>,
    /// The shape facts as of the event handed out last, which number
    /// snapshot chunks ([`super::watermarks::WatermarkBoard::numbering`]).
    numbering: SharedNumbering,
}

impl StreamAdapter {
    pub fn new(mapping: MappingConfig, book: PositionBook) -> Self {
        Self {
            mapping,
            ids: HashMap::new(),
            described: HashMap::new(),
            open: None,
            xid: 0,
            queue: VecDeque::new(),
            facts: SharedFacts::default(),
            book,
            adopt: None,
            numbering: SharedNumbering::default(),
        }
    }

    /// After a failover: the first transaction with rows starts at the
    /// stored key `key` (where the book opened), and nothing before it
    /// moves the position, whose keys are the new server's.
    pub fn adopting(mut self, key: u64) -> Self {
        self.adopt = Some(key);
        self
    }

    /// The shape facts as of the event [`StreamAdapter::next`] handed out
    /// last (a commit's, from when it is handed out: a watermark handed
    /// out before it stands before that commit's DDL).
    pub fn numbering(&self) -> SharedNumbering {
        Arc::clone(&self.numbering)
    }

    /// The binlog positions of the order keys moved so far.
    pub fn book(&mut self) -> &mut PositionBook {
        &mut self.book
    }

    /// [`StreamAdapter::book`], to read.
    pub fn book_ref(&self) -> &PositionBook {
        &self.book
    }

    /// What the tables' encoders read the `source` block's facts from.
    pub fn facts(&self) -> SharedFacts {
        Arc::clone(&self.facts)
    }

    /// The next event moved, its facts (a change's) now the shared ones.
    pub(crate) fn next(&mut self) -> Option<MySqlEvent> {
        let (event, facts, shape) = self.queue.pop_front()?;
        if let Some(facts) = facts {
            *self.facts.lock().unwrap_or_else(PoisonError::into_inner) = facts;
        }
        if let Some(shape) = shape {
            *self
                .numbering
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = shape;
        }
        Some(event)
    }

    /// The event [`StreamAdapter::next`] hands out next, if one was moved.
    pub(crate) fn peek(&self) -> Option<&MySqlEvent> {
        self.queue.front().map(|(event, _, _)| event)
    }

    /// Whether a transaction is open (rows of it were moved, no commit yet).
    pub fn in_tx(&self) -> bool {
        self.open.is_some()
    }

    /// Moves `change` into the events [`StreamAdapter::next`] hands out
    /// (the stream always names the facts: [`Self::push_with_facts`]).
    #[cfg(test)]
    pub(crate) fn push(&mut self, change: BinlogChange) -> Result<(), CaptureError> {
        self.push_with_facts(change, None)
    }

    /// Moves `change` into the events [`StreamAdapter::next`] hands out; a
    /// commit after which the shape facts are `shape` (DDL, a table's
    /// first TABLE_MAP) names them: the next transaction
    /// start noted has them, and chunks are numbered by them once the
    /// commit's event is handed out.
    pub(crate) fn push_with_facts(
        &mut self,
        change: BinlogChange,
        shape: Option<Arc<ShapeFacts>>,
    ) -> Result<(), CaptureError> {
        if let Some(shape) = &shape {
            self.book.set_facts(Arc::clone(shape));
        }
        let mut out = VecDeque::new();
        let facts = match &change {
            BinlogChange::Row(row) => Some(EventFacts::of_change(row)),
            _ => None,
        };
        self.moved(change, &mut out)?;
        // Only the change itself (the last event a row moves) has facts.
        let last = out.len().saturating_sub(1);
        for (i, event) in out.into_iter().enumerate() {
            let (facts, shape) = if i == last {
                (facts.clone(), shape.clone())
            } else {
                (None, None)
            };
            self.queue.push_back((event, facts, shape));
        }
        Ok(())
    }

    fn moved(
        &mut self,
        change: BinlogChange,
        out: &mut VecDeque<MySqlEvent>,
    ) -> Result<(), CaptureError> {
        match change {
            BinlogChange::Row(row) => self.row(row, out),
            // Before the adopted transaction, a position of the new server
            // (keys of the next epoch) would pass over it.
            BinlogChange::Commit { .. } if self.adopt.is_some() && self.open.is_none() => Ok(()),
            BinlogChange::Commit { position, .. } => {
                let end = self.book.note_start(position)?;
                match self.open.take() {
                    Some(tx) => out.push_back(StreamEvent::Commit {
                        commit: tx.start,
                        end,
                    }),
                    None => out.push_back(StreamEvent::KeepAlive { position: end }),
                }
                Ok(())
            }
            // The statement changed a shape the next TABLE_MAP carries;
            // the core learns it from the Table event sent then.
            BinlogChange::Ddl { .. } => Ok(()),
        }
    }

    fn row(&mut self, row: RowChange, out: &mut VecDeque<MySqlEvent>) -> Result<(), CaptureError> {
        if self.open.is_none() {
            let start = match self.adopt.take() {
                Some(key) => key,
                None => self.book.note_start(row.position.clone())?,
            };
            self.xid = self.xid.wrapping_add(1);
            out.push_back(StreamEvent::Begin {
                commit: start,
                xid: self.xid,
                commit_ts_us: row
                    .ts_ms
                    .saturating_mul(1000)
                    .saturating_sub(CORE_EPOCH_OFFSET_US),
            });
            self.open = Some(OpenTx { start });
        }
        if let Some(tx) = self.open {
            self.book
                .note_change(tx.start, row.position.event, row.position.row);
        }
        let table = self.describe(&row.table, out);
        let at = key(&Position {
            epoch: row.position.epoch,
            ..Position::at(row.position.file.clone(), row.event_pos)
        })?;
        let image = |cells: Option<Vec<_>>| -> Result<_, CaptureError> {
            let cells = cells.ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "a row change of {} without its row image",
                    row.table.qualified()
                ))
            })?;
            table
                .images
                .image(&cells)
                .map_err(|e| CaptureError::Protocol(e.to_string()))
        };
        let change = match row.kind {
            ChangeKind::Insert => Change::Insert {
                table: table.id,
                new: image(row.after)?,
            },
            ChangeKind::Update => Change::Update {
                table: table.id,
                old: Some(OldImage::Full(image(row.before)?)),
                new: image(row.after)?,
            },
            ChangeKind::Delete => Change::Delete {
                table: table.id,
                old: OldImage::Full(image(row.before)?),
            },
        };
        out.push_back(StreamEvent::Change { at, change });
        Ok(())
    }

    /// The table of `shape`, described to the core first when it was not
    /// yet or had another shape.
    fn describe(
        &mut self,
        shape: &Arc<TableShape>,
        out: &mut VecDeque<MySqlEvent>,
    ) -> Arc<MySqlTable> {
        let next = self.ids.len() as u32 + 1;
        let id = *self
            .ids
            .entry((shape.database.clone(), shape.table.clone()))
            .or_insert(next);
        if let Some(known) = self.described.get(&id) {
            // The decoder shares one shape per TABLE_MAP: compared by
            // pointer first, since this runs for every row.
            if Arc::ptr_eq(&known.shape, shape) {
                return Arc::clone(known);
            }
            if *known.shape == **shape {
                // A new TABLE_MAP of the same shape: its rows share this
                // pointer from now on.
                let same = Arc::new(MySqlTable {
                    shape: Arc::clone(shape),
                    ..(**known).clone()
                });
                self.described.insert(id, Arc::clone(&same));
                return same;
            }
        }
        let table = Arc::new(MySqlTable {
            id,
            shape: Arc::clone(shape),
            namespace: shape.database.clone(),
            name: shape.table.clone(),
            images: MySqlRowImages::new(Arc::clone(shape), self.mapping),
            facts: Arc::clone(&self.facts),
            numbering: None,
        });
        self.described.insert(id, Arc::clone(&table));
        out.push_back(StreamEvent::Table((*table).clone()));
        table
    }
}

/// The order key of `position`, a protocol error past its range.
fn key(position: &Position) -> Result<u64, CaptureError> {
    order_key(position).map_err(|e: MySqlSourceError| CaptureError::Protocol(e.to_string()))
}

#[cfg(test)]
mod tests;
