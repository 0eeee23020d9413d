//! The MySQL/MariaDB source: the binlog read as a replica.
//!
//! ```text
//!            SHOW BINARY LOGS, settings, grants
//!  server ─────────────────────────────────────▶ checks (fix named, or go)
//!     │ binlog dump as replica server.id
//!     ▼
//!  reader ──events──▶ decoder ──▶ Row / Ddl / Commit, each with a Position
//!     │ TABLE_MAP + shape facts               │ (file, pos, gtids, event, row)
//!     ▼ (tinyint(1), MariaDB JSON)            ▼
//!  history: facts from DDL text,          mapping: Cell ─▶ Connect schema + JSON ─▶ envelope:
//!  as of each position                        ▲          Debezium's MySQL records (key, value)
//!                                             │ the same cells
//!  snapshot: lock, consistent read view, position, unlock, key-ordered chunks
//!
//!  source (MySqlStream): reader task ──▶ stream (StreamAdapter): core events
//!     at order keys, rows rendered ──▶ pipeline; book: the binlog position
//!     and shape facts of each offset record the committer writes
//!  connector (MySql, the seam's Source): checks, tables, the stream from the
//!     stored offset's part; control: the catalog reads while streaming
//! ```
//!
//! The invariant it keeps: every change carries the [`Position`] that,
//! stored, makes a restart hand out exactly the changes after it (the file
//! and offset of its transaction's first event plus the events and rows of
//! the transaction already handed out). What is tested against MariaDB and
//! what only with byte fixtures: docs/mysql.md.

pub mod book;
pub mod catalog;
pub mod cell;
pub mod checks;
pub mod chunks;
mod connector;
pub mod control;
pub mod decoder;
pub mod envelope;
pub mod error;
pub mod filter;
pub mod history;
pub mod mapping;
pub mod offset;
pub mod position;
pub mod reader;
pub mod shape;
pub mod snapshot;
pub mod source;
pub mod stream;
pub mod watermarks;

pub use catalog::MySqlCatalog;
pub use cell::Cell;
pub use checks::{Flavor, ServerFacts, ServerIdentity};
pub(crate) use connector::MySql;
pub use decoder::{BinlogChange, ChangeKind, Decoder, RowChange};
pub use error::MySqlSourceError;
pub use history::{ShapeFacts, TableFacts, TransactionFacts};
pub use mapping::{MappingConfig, MappingError};
pub use offset::{order_key, MySqlOffset, Resume};
pub use position::{
    binlog_bytes_between, BinlogCoordinates, GtidParseError, Gtids, MariaGtid, MariaGtidList,
    MySqlGtidSet, Position,
};
pub use reader::{BinlogReader, ResumeBy};
pub use shape::{CatalogColumn, ColumnShape, TableShape};
pub use snapshot::{Chunk, SnapshotLock, SnapshotLockingMode, SnapshotReader, SnapshotSettings};
#[cfg(feature = "testing")]
pub use source::EventView;
pub use source::{MySqlStream, StreamStart};
