//! The source seam: what the source-independent core asks of a source
//! (docs/design.md, "Architecture: the source seam"). Each source under
//! `sources/<database>/` implements these; the core names no driver.
//!
//! A [`Source`] gives the pipeline its parts as associated types and the
//! steps of a life that speak its protocols (start-up checks, opening the
//! stream, its next event, chunk reads, the heartbeat's reads); the
//! pipeline is generic over it. The stream's events are the core's own
//! (`crate::change::StreamEvent`: begin, row changes with `RowImage`s, a
//! table's shape, a message, commit, keepalive), into which a source's
//! adapter moves what it decoded. The parts' contracts: confirming durable
//! positions ([`Slot`]), how the stream describes a table to the router
//! ([`RoutedTable`]), what the router asks the catalog about a table
//! ([`TableCatalog`]), what the schema watch reads ([`SchemaCatalog`]),
//! the quarantine's checks ([`QuarantineChecks`]), a signal's
//! ([`SnapshotTableChecks`]), chunk reads ([`ChunkReads`]) and the values
//! a change left out ([`UnchangedValues`]).

use std::collections::BTreeMap;

use tokio::task::JoinHandle;

use crate::change::{RowImage, StreamEvent, StreamTable};
use crate::config::CaptureConfig;
use crate::envelope::{EnvelopeConfig, EnvelopeError, SourceIdentity, TableEncoder};
use crate::error::CaptureError;
use crate::naming::quote_ident;
use crate::offset::{SourceOffset, SourcePart};
use crate::schema_change::{ColumnDef, FormerName, SchemaHistory, TableSchemas};

/// A source database as the pipeline runs it: the types of its parts and
/// the steps of a life that speak its protocols. The pipeline is generic
/// over it, and names one implementation only where the configuration
/// picks the source (`pipeline::start::run`).
///
/// Contract: `check` runs first in each life, before Kafka is opened, and
/// fails retriable or fatal as the source decides; `open_stream` then
/// starts the stream at a position a committed offset record names (never
/// before [`CheckedSource::earliest`] unless the core chose to
/// restart from there). `next_event` is cancel-safe (the stream loop
/// selects on it); its error ends the life. `heartbeat` never fails the
/// life: what it cannot do is logged. Nothing is called concurrently: the
/// pipeline's one task calls.
pub(crate) trait Source: Sized {
    /// How the stream describes a table (PostgreSQL: a pgoutput Relation).
    type Table: RoutedTable + Clone + PartialEq + Send + Sync + 'static;
    /// The change stream, which releases what Kafka holds ([`Slot`]).
    type Stream: Slot;
    /// The connection for catalog reads and checks while streaming.
    type Control: QuarantineChecks
        + SchemaCatalog<Table = Self::Table>
        + SnapshotTableChecks
        + UnchangedValues<Table = Self::Table>;
    /// The snapshot's chunk reads.
    type Chunks: ChunkReads<Table = Self::Table>;
    /// What the router asks of the catalog as of a streamed transaction.
    type Tables<'a>: TableCatalog<Table = Self::Table, Types = <Self::Table as RoutedTable>::Types>
    where
        Self: 'a;

    /// Start-up's checks and set-up: the tables the configuration selects,
    /// those that cannot be captured as they are, the value types.
    async fn check(cfg: &CaptureConfig) -> Result<CheckedSource<Self>, CaptureError>;

    /// The change stream from the committed offset record `from` (its
    /// `flush_lsn`, and the source's own part of it when the source writes
    /// one: [`Slot::offset_part`]).
    async fn open_stream(
        cfg: &CaptureConfig,
        from: &SourceOffset,
    ) -> Result<Self::Stream, CaptureError>;

    /// What to warn of once per process, before the first life (PostgreSQL:
    /// credentials sent to a server whose certificate is not verified).
    fn warning(cfg: &CaptureConfig) -> Option<String>;

    /// The chunk reads of this life's snapshots. They may reach `stream`
    /// (MySQL: its board of watermarks to hand out at a binlog position);
    /// PostgreSQL's ignore it.
    fn chunks(cfg: &CaptureConfig, stream: &Self::Stream) -> Self::Chunks;

    /// The stream's next event.
    async fn next_event(stream: &mut Self::Stream) -> Result<SourceEvent<Self>, CaptureError>;

    /// Ends the stream at the end of a life.
    fn stop(stream: &mut Self::Stream);

    /// The catalog as of the streamed transaction `xid` (none outside one),
    /// with the table identities the schema watch knows.
    fn tables<'a>(
        control: &'a Self::Control,
        history: &'a SchemaHistory,
        xid: Option<u32>,
    ) -> Self::Tables<'a>;

    /// Each heartbeat: runs `heartbeat.action.query`, and says how many
    /// bytes the source keeps for capture (PostgreSQL: the slot's WAL;
    /// MySQL: the binlog from where `stream` would resume to the server's
    /// end), when it can tell.
    async fn heartbeat(
        control: &mut Self::Control,
        stream: &Self::Stream,
        cfg: &CaptureConfig,
    ) -> Option<Retained>;
}

/// What a heartbeat found the source keeping for capture, in bytes: each
/// source's figure has its own metric, since only a slot's is a limit
/// capture enforces (`slot.max.retained.bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retained {
    /// WAL the replication slot keeps on the server.
    SlotWal(i64),
    /// Binlog bytes from capture's resume position to the server's end.
    Binlog(i64),
}

/// An event of source `S`'s stream.
pub(crate) type SourceEvent<S> =
    StreamEvent<<S as Source>::Table, <<S as Source>::Table as RoutedTable>::TypeNote>;

/// A source as start-up found it: checked, its tables selected, ready to
/// stream.
pub(crate) struct CheckedSource<S: Source> {
    pub(crate) control: S::Control,
    pub(crate) tables: Vec<CapturedTable>,
    /// Tables set aside (quarantined), with the reason.
    pub(crate) set_aside: BTreeMap<String, String>,
    /// Where a start without a stored offset (or one the core restarts
    /// from the source's position) streams from (PostgreSQL: the slot's
    /// confirmed flush LSN; MySQL: the binlog's end at the check).
    pub(crate) start_at: u64,
    /// The earliest position a stored offset may name: one before it is a
    /// gap (PostgreSQL: the slot's confirmed flush LSN, as `start_at`;
    /// MySQL: 0, since its stream refuses a purged stored position itself,
    /// naming the fix).
    pub(crate) earliest: u64,
    /// What the source knows of its value types.
    pub(crate) types: <S::Table as RoutedTable>::Types,
}

/// Where the committer tells the source what Kafka holds.
///
/// Contract: `confirm` is called only with a flush position that a
/// committed Kafka transaction's offset record names, in increasing order,
/// by the committer alone, after each commit. The source may then release
/// what precedes it (PostgreSQL: the slot's WAL); a source with nothing to
/// release (MySQL's binlog) does nothing. It never fails: a confirmation
/// that does not reach the server is sent again with the next one.
pub(crate) trait Slot {
    /// The source may release what precedes `flush_lsn`.
    fn confirm(&mut self, flush_lsn: u64);

    /// The source's part of offset record `offset` (its core fields
    /// final), written in the same record: what the source needs to resume
    /// there beyond the order keys (MySQL: the binlog file, offset and
    /// GTIDs). `None` for a source that needs nothing more (PostgreSQL).
    /// Called by the committer before each offset record it writes; an
    /// error (a position the stream cannot name) fails the commit.
    fn offset_part(&self, _offset: &SourceOffset) -> Result<Option<SourcePart>, CaptureError> {
        Ok(None)
    }
}

/// A table as the source's catalog names it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CatalogTable {
    pub(crate) schema: String,
    pub(crate) name: String,
    /// Its primary key's columns, in key order; empty when it has none.
    pub(crate) primary_key: Vec<String>,
}

/// What the router asks the source about a table the change stream
/// describes, to decide how its changes are published (its key, the name
/// it publishes under, its identity in the envelope).
///
/// Contract: a table is looked up by the stream's stable id for it, never
/// by its name: the catalog may have renamed it since, dropped it, or made
/// another of that name. Every answer is read from a catalog at least as new
/// as the change being streamed (the stream may be behind the catalog,
/// never ahead of it), so a table the catalog no longer holds is gone
/// (`None`), not unknown. Errors are the source's own: a retriable one ends
/// this life, and capture resumes from the committed offset. Calls are not
/// concurrent: the pipeline's one task asks, through the router.
pub(crate) trait TableCatalog {
    /// How the stream describes a table (PostgreSQL: a pgoutput Relation).
    type Table;
    /// What the source knows of its value types (PostgreSQL: the type registry).
    type Types;

    /// The table whose changes `table`'s are, as `(schema, name)`, when
    /// that is another table: a partition publishes as its root.
    async fn published_as(
        &mut self,
        table: &Self::Table,
    ) -> Result<Option<(String, String)>, CaptureError>;

    /// The table `table` is in the catalog now, with its primary key;
    /// `None` when it is gone.
    async fn current(&mut self, table: &Self::Table) -> Result<Option<CatalogTable>, CaptureError>;

    /// What identifies `table` (named `qualified`) and its columns across
    /// renames, for the envelope; `None` when it is gone.
    async fn identity(
        &mut self,
        qualified: &str,
        table: &Self::Table,
    ) -> Result<Option<SourceIdentity>, CaptureError>;

    /// Reads into `types` the types the stream named that it does not
    /// know yet (created after start-up).
    async fn learn_types(&mut self, types: &mut Self::Types) -> Result<(), CaptureError>;

    /// The stream describes `table` from here on (new, or its shape
    /// changed). A source whose schema answers follow the stream's own
    /// descriptions (MySQL: shapes tied to binlog positions) notes it and
    /// says whether the schema watch must compare now (its answer for the
    /// table changed, also the first time: the watch's baseline must be
    /// the shape before any later DDL); one that reads its catalog needs not.
    fn described(&mut self, _table: &Self::Table) -> bool {
        false
    }
}

/// How a source's stream describes a table, as the router reads it to
/// build the table's route: its stream id and name, its key as the stream
/// carries it, and the encoder of its changes.
///
/// Contract: a description replaces the one before it of the same `id`
/// from its point of the stream on; the row images that follow match its
/// columns ([`StreamTable`]). `encoder` writes the source's values with
/// the source's own type mapping (`Types`, what the source knows of its
/// value types, grown by the stream's `TypeNote`s).
pub(crate) trait RoutedTable: StreamTable + Sized {
    /// What the source knows of its value types (PostgreSQL: the type registry).
    type Types;
    /// A value type the stream announces (PostgreSQL: a Type message).
    type TypeNote;

    /// The stream's id of the table (PostgreSQL: the relation's OID).
    fn id(&self) -> u32;

    /// Names the table as the one it publishes under (a partition's root).
    fn publish_as(&mut self, namespace: String, name: String);

    /// Whether `other` has the same columns (names, types and flags).
    fn same_columns(&self, other: &Self) -> bool;

    /// The key the stream itself flags (PostgreSQL: the replica identity's
    /// columns), for a table the catalog no longer has.
    fn stream_key(&self) -> Vec<String>;

    /// What the stream's before images lack of event key `key`, in words,
    /// for table `qualified`; `None` when they carry it.
    fn identity_lacks(&self, qualified: &str, key: &[String]) -> Option<String>;

    /// Why a table whose before images lack its key is set aside, with the
    /// fix, from [`RoutedTable::identity_lacks`]'s words.
    fn identity_reason(lacks: &str) -> String;

    /// Why keyless table `qualified` is set aside, with the fix.
    fn keyless_reason(qualified: &str) -> String;

    /// The encoder of the table's changes keyed by `key` (else by
    /// [`RoutedTable::stream_key`]).
    fn encoder(
        &self,
        types: &Self::Types,
        key: Option<&[String]>,
        envelope: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<TableEncoder, EnvelopeError>;

    /// Notes `note` in `types`; whether it is a type not known before.
    fn observe_type(types: &mut Self::Types, note: &Self::TypeNote) -> bool;
}

/// How the core reads from the source the values a change left out (an
/// unchanged value of a primary-key change's new row, which no target holds
/// under the new key).
///
/// Contract: the read waits until transaction `xid`, which wrote the
/// change, is visible, so the values are at least as new as the change;
/// `None` when no row has the key any more (a later change deleted it or
/// changed its key, and its own events bring the targets there).
pub(crate) trait UnchangedValues {
    /// How the stream describes a table.
    type Table;

    /// `row` with its [`Datum::Unchanged`](crate::change::Datum::Unchanged)
    /// values read from `table` by the key values of `row` (columns `key_idx`).
    async fn read_unchanged(
        &mut self,
        table: &Self::Table,
        key_idx: &[usize],
        xid: u32,
        row: &RowImage,
    ) -> Result<Option<RowImage>, CaptureError>;
}

/// A table chosen for capture and the columns that key its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedTable {
    pub schema: String,
    pub name: String,
    /// Primary key columns, or the `message.key.columns` override.
    pub key_columns: Vec<String>,
    /// Whether `key_columns` come from `message.key.columns`.
    pub key_overridden: bool,
    /// A partitioned table (the root of a partition tree): captured, keyed
    /// and snapshotted as one table, its partitions included.
    pub partitioned: bool,
}

impl CapturedTable {
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// `"schema"."table"`, for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

/// The key columns of `tables`, by `schema.table`.
pub(crate) fn key_columns_by_table(
    tables: &[CapturedTable],
) -> std::collections::HashMap<String, Vec<String>> {
    tables
        .iter()
        .map(|t| (t.qualified(), t.key_columns.clone()))
        .collect()
}

/// The tables `table.include.list`/`exclude.list` select in the source's
/// catalog: those with key columns, and those without (`schema.table`),
/// which capture sets aside (quarantine).
#[derive(Debug, Default)]
pub struct Selected {
    pub tables: Vec<CapturedTable>,
    pub keyless: Vec<String>,
}

/// What the quarantine asks the source at each heartbeat about the tables
/// it set aside, and what it has the source do for one found fixed.
///
/// Contract: every answer is read from the catalog now (not as of the
/// stream), so a fix is seen as soon as it is made; the quarantine then
/// waits for the stream to pass [`QuarantineChecks::position_now`] before it
/// releases the table. A `Prerequisite` error from `selected` or `publish`
/// keeps the tables set aside (a catalog the filters cannot read now, a
/// table that cannot be published yet); other errors are the source's own
/// (a retriable one ends this life). Calls are not concurrent: the
/// pipeline's one task asks.
pub(crate) trait QuarantineChecks {
    /// The tables the configuration selects now.
    async fn selected(&mut self, cfg: &CaptureConfig) -> Result<Selected, CaptureError>;

    /// Why keyless `table` is set aside, with the fix.
    fn keyless_reason(&self, table: &str) -> String;

    /// Why `table`'s identity keeps it set aside under
    /// `replica.identity.check = "fail"`, with the fix; `None` when it is fine.
    async fn identity_problem(
        &mut self,
        table: &CapturedTable,
    ) -> Result<Option<String>, CaptureError>;

    /// Makes `table`'s changes reach the stream from here on (PostgreSQL:
    /// the publication holds it).
    async fn publish(
        &mut self,
        cfg: &CaptureConfig,
        table: &CapturedTable,
    ) -> Result<(), CaptureError>;

    /// The server's position now: every change made before it (the fix
    /// included) is in the stream at or before it.
    async fn position_now(&mut self) -> Result<u64, CaptureError>;
}

/// What the schema watch asks the source's catalog: the captured tables'
/// columns now, and which catalog columns a table's stream description is.
///
/// Contract: `columns` reads the catalog now, leaving out a table that no
/// longer exists. `identity` reads it at least as new as the streamed
/// transaction `xid` (none: a description read from the catalog itself),
/// and matches each column of `table` by name against the catalog's,
/// `known` (the columns last published, which the stream may still be at)
/// and `former` names, in column order, so a rename followed by an add of
/// the old name gives each field its own column; `None` when the table is
/// gone. Calls are not concurrent: the pipeline's one task asks.
pub(crate) trait SchemaCatalog {
    /// How the stream describes a table (PostgreSQL: a pgoutput Relation).
    type Table;

    /// The columns of `tables` (`schema.table` names) as the catalog has
    /// them now.
    async fn columns(&self, tables: &[String]) -> Result<TableSchemas, CaptureError>;

    /// What identifies `table` and its columns across renames, for the envelope.
    async fn identity(
        &self,
        table: &Self::Table,
        known: Option<&[ColumnDef]>,
        former: &[FormerName],
        xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError>;
}

/// What an `execute-snapshot` signal asks the source about a table it
/// names, before its snapshot is queued.
///
/// Contract: both read the catalog now. A definite answer of the server
/// (no such table, a filter it refuses) is `Ok(Err(reason))`, said in the
/// log and the signal ignored; an `Err` is the source's own (a lost
/// connection: the signal is read again after the restart). A table the
/// signal's own transaction created may not be visible at once: the
/// source looks again for a moment before it says it does not exist.
pub(crate) trait SnapshotTableChecks {
    /// The primary key of `schema.name`, in key order; empty when it has none.
    async fn primary_key(
        &self,
        schema: &str,
        name: &str,
    ) -> Result<Result<Vec<String>, String>, CaptureError>;

    /// Whether `filter` works as a snapshot filter of `schema.name`: an
    /// expression of its columns that chunk reads can run.
    async fn check_filter(
        &self,
        filter: &str,
        schema: &str,
        name: &str,
    ) -> Result<Result<(), String>, CaptureError>;
}

/// A chunk the snapshot driver asks a source to read: `size` rows of
/// `schema.table` in key order after key `after`, between two watermarks
/// named by `id`.
#[derive(Debug, Clone)]
pub struct ChunkRequest {
    /// Names this chunk's watermarks.
    pub id: String,
    pub schema: String,
    pub table: String,
    pub key_columns: Vec<String>,
    pub after: Option<Vec<Option<String>>>,
    pub filter: Option<String>,
    /// Rows to read; one more is asked for, to know whether the table ends here.
    pub size: usize,
}

/// What a chunk read, `T` being how the source describes the table.
#[derive(Debug, Clone)]
pub struct ChunkRows<T> {
    /// The table's shape as the catalog gave it; the rows follow it.
    pub relation: T,
    /// Positions of the key columns in the relation's columns.
    pub key_idx: Vec<usize>,
    /// At most `size` rows, in key order.
    pub rows: Vec<crate::change::RowImage>,
    /// Whether rows follow this chunk.
    pub more: bool,
    /// The catalog's estimate of the table's rows, when it has one
    /// (PostgreSQL: `pg_class.reltuples`, once the table was analyzed).
    pub estimate: Option<u64>,
    /// Transactions the read's snapshot saw as in progress (PostgreSQL: `xip`
    /// of `pg_current_snapshot()`, as 32-bit xids; empty for a source whose
    /// chunk reads see every transaction the stream carried before them): a
    /// transaction whose commit the stream carried before the chunk was
    /// launched can still be among them, its changes missing from the rows.
    pub invisible: Vec<u32>,
}

/// Why a chunk could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// The table cannot be snapshotted as asked (gone, no such key column):
    /// skip it, say why, and go on with the next table.
    #[error("{0}")]
    Table(String),
    /// The database failed; restart from the committed offset.
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// A chunk's read running in the background.
pub(crate) type ChunkTask<T> = JoinHandle<Result<ChunkRows<T>, ChunkError>>;

/// How the snapshot driver has the source read a chunk.
///
/// Contract: `start` begins reading `req` in the background and returns at
/// once with the read's task; the driver starts one read at a time (the
/// next only once the one before ended, abandoned or not), so a source may
/// read every chunk on one connection. The chunk's low and high watermark
/// reach the stream either as messages in its transactions (PostgreSQL)
/// or as `StreamEvent::Message`s outside any transaction, which a source
/// whose log cannot carry them has its stream hand out where the read
/// stands in the stream's order (MySQL: at the binlog position of the
/// read view, registered before `start` returns). An error is the
/// source's (a lost connection): capture restarts from the committed
/// offset.
pub(crate) trait ChunkReads {
    /// How the source describes a chunk's table (PostgreSQL: a Relation).
    type Table;

    async fn start(&mut self, req: ChunkRequest) -> Result<ChunkTask<Self::Table>, CaptureError>;
}

/// What identifies `table` (named `qualified`) and its columns across
/// renames ([`SchemaCatalog::identity`]), matched against the columns and
/// former names `history` holds for it; `xid`: the stream's transaction the
/// description came in (none for a snapshot chunk's).
pub(crate) async fn identity_in_history<C: SchemaCatalog>(
    control: &C,
    history: &SchemaHistory,
    qualified: &str,
    table: &C::Table,
    xid: Option<u32>,
) -> Result<Option<SourceIdentity>, CaptureError> {
    let known = history.columns.get(qualified).map(Vec::as_slice);
    control
        .identity(table, known, history.former_names(qualified), xid)
        .await
}
