//! The MySQL change stream as the pipeline holds it: the binlog reader in
//! a task of its own, its changes moved into core events
//! ([`StreamAdapter`]), and the offset record's MySQL part of each commit
//! ([`Slot::offset_part`], from the [`PositionBook`]).
//!
//! ```text
//!  BinlogReader ──task──▶ channel ──▶ MySqlStream::next_event ──▶ pipeline
//!                                       │ StreamAdapter (order keys, row images)
//!                                       └ PositionBook ──▶ offset_part (committer)
//! ```
//!
//! The reader runs in a task because its reads are not cancel-safe (a
//! TABLE_MAP waits on a catalog read) while the pipeline's select on
//! `next_event` cancels it whenever another branch is ready; a channel's
//! receive is cancel-safe. The channel is bounded, so a slow pipeline
//! slows the dump instead of buffering the binlog.

use std::sync::Arc;

use mysql_async::Opts;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::book::PositionBook;
use super::checks::{Flavor, ServerIdentity};
use super::decoder::BinlogChange;
use super::error::MySqlSourceError;
use super::history::ShapeFacts;
use super::mapping::MappingConfig;
use super::position::Position;
use super::reader::{BinlogReader, ResumeBy};
use super::stream::{MySqlEvent, StreamAdapter};
use super::watermarks::{Handed, Next, WatermarkBoard};
use crate::change::StreamEvent;
use crate::error::CaptureError;
use crate::filter::TableFilter;
use crate::offset::{SourceOffset, SourcePart};
use crate::seam::Slot;

/// Changes the reader may run ahead of the pipeline.
const AHEAD: usize = 1024;

/// Where and how a stream opens.
#[derive(Debug, Clone)]
pub struct StreamStart {
    pub opts: Opts,
    /// This replica's `server_id`, unique among the server's replicas.
    pub replica_id: u32,
    pub flavor: Flavor,
    /// The server whose binlog is read (named in each offset record).
    pub server: ServerIdentity,
    /// A transaction start (the stored part's [`super::MySqlOffset::resume_from`]).
    pub from: Position,
    pub resume: ResumeBy,
    pub mapping: MappingConfig,
    /// `include.query`: changes carry their statement.
    pub include_query: bool,
    /// The shape facts as of `from` (the stored part's).
    pub facts: ShapeFacts,
    /// A failover: `from` is a position of this server's binlog (the
    /// stored one), found on `server` by GTIDs (`resume`); the stream
    /// reads one epoch up and its first transaction keeps `from`'s key
    /// (the failover rule of `offset.rs`).
    pub takeover: Option<ServerIdentity>,
    /// The captured tables (`database.include.list`, `table.include.list`, ...).
    pub captured: TableFilter,
}

/// A change as the reader task sends it: with the shape facts as of the
/// next transaction's start when a commit changed them.
type Sent = Result<(BinlogChange, Option<Arc<ShapeFacts>>), MySqlSourceError>;

/// The binlog as the pipeline's change stream.
pub struct MySqlStream {
    changes: mpsc::Receiver<Sent>,
    reader: JoinHandle<()>,
    adapter: StreamAdapter,
    /// Snapshot chunks' watermarks, handed out at their binlog positions.
    watermarks: WatermarkBoard,
    /// What was handed out to the pipeline.
    handed: Handed,
}

impl MySqlStream {
    /// Registers as a replica and starts reading from `start.from`.
    pub async fn open(start: StreamStart) -> Result<Self, CaptureError> {
        let opened_at = super::offset::order_key(&start.from).map_err(stream_error)?;
        let (book, read_from) = match &start.takeover {
            None => (
                PositionBook::new(start.server.clone(), &start.from, start.facts.clone())?,
                start.from.clone(),
            ),
            Some(stored) => (
                PositionBook::taking_over(
                    start.server.clone(),
                    stored.clone(),
                    &start.from,
                    start.facts.clone(),
                )?,
                Position {
                    epoch: start.from.epoch + 1,
                    ..start.from.clone()
                },
            ),
        };
        let mut reader = BinlogReader::open(
            start.opts,
            start.replica_id,
            start.flavor,
            &read_from,
            start.resume,
            start.captured,
        )
        .await
        .map_err(stream_error)?;
        let mut adapter = StreamAdapter::new(start.mapping, book);
        if start.takeover.is_some() {
            adapter = adapter.adopting(opened_at);
        }
        // Chunks are numbered by the facts as of the stream's position.
        let watermarks = WatermarkBoard::new(adapter.numbering()).in_epoch(read_from.epoch);
        watermarks.set_numbering(Arc::new(start.facts.clone()));
        reader.set_facts(start.facts);
        reader.keep_queries(start.include_query);
        let (tx, changes) = mpsc::channel(AHEAD);
        let reader = tokio::spawn(read(reader, tx));
        Ok(Self {
            changes,
            reader,
            adapter,
            watermarks,
            handed: Handed::at(opened_at),
        })
    }

    /// The board the chunk reads register their watermarks on.
    pub fn watermarks(&self) -> WatermarkBoard {
        self.watermarks.clone()
    }

    /// The next event; cancel-safe. A chunk's watermark goes out where its
    /// binlog position is in the stream's order ([`super::watermarks`]):
    /// before the next event when that starts at or after it, at once when
    /// everything before it was handed out.
    pub(crate) async fn next_event(&mut self) -> Result<MySqlEvent, CaptureError> {
        loop {
            let next = self.adapter.peek().map(next_of);
            if let Some(watermark) = self.watermarks.take_due(self.handed, next) {
                return Ok(watermark);
            }
            if let Some(event) = self.adapter.next() {
                self.handed.note(next_of(&event));
                return Ok(event);
            }
            match self.changes.recv().await {
                Some(Ok((change, facts))) => self.adapter.push_with_facts(change, facts)?,
                Some(Err(e)) => return Err(stream_error(e)),
                None => {
                    return Err(stream_error(MySqlSourceError::Protocol(
                        "the binlog reader stopped".into(),
                    )))
                }
            }
        }
    }

    /// Where a restart would resume: the transaction start of the last
    /// committed offset record (the opening position before any).
    pub fn resume_from(&self) -> Option<&Position> {
        self.adapter.book_ref().resume_from()
    }

    /// Ends the dump.
    pub fn stop(&mut self) {
        self.reader.abort();
        self.changes.close();
    }
}

impl Drop for MySqlStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Slot for MySqlStream {
    /// The binlog keeps what the server's retention keeps, whatever is
    /// confirmed; the book forgets positions no record names again.
    fn confirm(&mut self, flush_lsn: u64) {
        self.adapter.book().confirm(flush_lsn);
    }

    fn offset_part(&self, offset: &SourceOffset) -> Result<Option<SourcePart>, CaptureError> {
        self.adapter.book_ref().part(offset).map(Some)
    }
}

/// What the watermarks need to know of a stream event.
fn next_of(event: &MySqlEvent) -> Next {
    match event {
        StreamEvent::Begin { commit, .. } => Next::Begin(*commit),
        StreamEvent::Commit { end, .. } => Next::Commit(*end),
        StreamEvent::KeepAlive { position } => Next::KeepAlive(*position),
        _ => Next::Other,
    }
}

/// The reader's task: each change, with the facts as of the next
/// transaction's start after a commit that changed them, until the
/// pipeline stops listening or the reader fails.
async fn read(mut reader: BinlogReader, tx: mpsc::Sender<Sent>) {
    let mut sent = reader.facts_at_transaction_start().clone();
    loop {
        let next = match reader.next().await {
            Ok(Some(change)) => {
                let mut facts = None;
                if matches!(change, BinlogChange::Commit { .. })
                    && reader.facts_at_transaction_start() != &sent
                {
                    sent = reader.facts_at_transaction_start().clone();
                    facts = Some(Arc::new(sent.clone()));
                }
                Ok((change, facts))
            }
            Ok(None) => Err(MySqlSourceError::Protocol(
                "the server ended the binlog dump".into(),
            )),
            Err(e) => Err(e),
        };
        let failed = next.is_err();
        if tx.send(next).await.is_err() || failed {
            break;
        }
    }
    let _ = reader.close().await;
}

/// A reader's error as the stream's, retriable as the server's code says.
fn stream_error(e: MySqlSourceError) -> CaptureError {
    CaptureError::Stream {
        retriable: e.is_retriable(),
        source: Box::new(e),
    }
}

/// A stream event as the service tests read it (the core's events are
/// crate-private): positions, tables and rows as text.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventView {
    Begin {
        commit: u64,
    },
    Table {
        id: u32,
        database: String,
        table: String,
    },
    /// `op` is Debezium's: `c`, `u` or `d`; values as rendered text.
    Change {
        at: u64,
        table: u32,
        op: char,
        before: Option<Vec<Option<String>>>,
        after: Option<Vec<Option<String>>>,
    },
    Commit {
        commit: u64,
        end: u64,
    },
    KeepAlive {
        position: u64,
    },
    /// A snapshot chunk's watermark (`content`: the core's text).
    Watermark {
        at: u64,
        content: String,
    },
}

#[cfg(feature = "testing")]
impl MySqlStream {
    /// [`MySqlStream::next_event`] as an [`EventView`].
    pub async fn next_view(&mut self) -> Result<EventView, CaptureError> {
        use crate::change::{Change, Datum, RowImage};
        fn text(row: &RowImage) -> Vec<Option<String>> {
            row.0
                .iter()
                .map(|d| match d {
                    Datum::Text(b) | Datum::Binary(b) => Some(String::from_utf8_lossy(b).into()),
                    Datum::Null | Datum::Unchanged => None,
                })
                .collect()
        }
        Ok(match self.next_event().await? {
            StreamEvent::Begin { commit, .. } => EventView::Begin { commit },
            StreamEvent::Table(t) => EventView::Table {
                id: t.id,
                database: t.namespace.clone(),
                table: t.name.clone(),
            },
            StreamEvent::Change { at, change } => {
                let (table, op, before, after) = match &change {
                    Change::Insert { table, new } => (*table, 'c', None, Some(text(new))),
                    Change::Update { table, old, new } => (
                        *table,
                        'u',
                        old.as_ref().map(|o| text(o.row())),
                        Some(text(new)),
                    ),
                    Change::Delete { table, old } => (*table, 'd', Some(text(old.row())), None),
                    other => {
                        return Err(CaptureError::Protocol(format!(
                            "not a MySQL change: {other:?}"
                        )))
                    }
                };
                EventView::Change {
                    at,
                    table,
                    op,
                    before,
                    after,
                }
            }
            StreamEvent::Commit { commit, end } => EventView::Commit { commit, end },
            StreamEvent::KeepAlive { position } => EventView::KeepAlive { position },
            StreamEvent::Message { at, content, .. } => EventView::Watermark {
                at,
                content: String::from_utf8_lossy(&content).into(),
            },
            other => {
                return Err(CaptureError::Protocol(format!(
                    "not a MySQL stream event: {other:?}"
                )))
            }
        })
    }

    /// The MySQL part of offset record `offset` ([`Slot::offset_part`]).
    pub fn part_of(&self, offset: &SourceOffset) -> Result<Option<SourcePart>, CaptureError> {
        self.offset_part(offset)
    }
}
