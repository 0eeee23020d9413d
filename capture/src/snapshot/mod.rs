//! Chunked snapshots that run while the stream flows (docs/design.md, "Snapshots";
//! the DBLog watermark method).
//!
//! A chunk is read on a connection of its own: a low watermark
//! (`pg_logical_emit_message(true, 'oncely-watermark', ..)`), a primary-key
//! ordered `SELECT ... WHERE (key) > (last key) ORDER BY key LIMIT n`, a high
//! watermark. Both watermarks are transactions of their own, so they reach the
//! stream in commit order around the SELECT. The stream loop records the keys
//! of the table that change from the moment it launches the chunk until the
//! high watermark arrives; rows whose keys changed are dropped (the stream
//! carries a state at least as new), and the survivors are published as op
//! `r`, versioned by the high watermark's commit LSN, in the same Kafka
//! transaction as the offset record that moves [`SnapshotProgress`] past the
//! chunk. A restart therefore resumes at the next chunk, and a chunk whose
//! high watermark was not committed is simply read again.
//!
//! This module holds the pure parts (progress, start plan, SQL, keys,
//! watermark ids); a source reads chunks (PostgreSQL's in
//! `sources/postgres/chunk.rs`) and [`signal`] parses signals.

pub mod filter;
pub mod signal;
pub mod window;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::change::{Datum, RowImage};
use crate::config::SnapshotMode;

/// Prefix of the watermark messages; never published as events.
pub const WATERMARK_PREFIX: &str = "oncely-watermark";

/// Snapshot progress, stored in every offset record while a snapshot runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// The snapshot's id (`initial-<ms>` or the signal's id), for operators.
    pub id: String,
    pub kind: SnapshotKind,
    /// Tables still to copy, the one being copied first.
    pub tables: Vec<TableProgress>,
    /// Set by a `pause-snapshot` signal: no chunk starts until `resume-snapshot`.
    #[serde(default)]
    pub paused: bool,
}

/// What started a snapshot; decides `source.snapshot` of its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// `snapshot.mode` at start: rows say `"true"`, the very last one `"last"`.
    Initial,
    /// A signal or `snapshot.new.tables`: rows say `"incremental"`, as
    /// Debezium's incremental snapshots do.
    Incremental,
}

/// One table of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableProgress {
    /// `schema.table`.
    pub table: String,
    /// An `additional-conditions` filter (SQL boolean expression) of the signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Text form of the key columns of the last row read, in key order;
    /// `None` before the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_key: Option<Vec<Option<String>>>,
    /// Rows read so far (before dropping those changed in the window).
    #[serde(default)]
    pub rows: u64,
    /// Chunks completed so far.
    #[serde(default)]
    pub chunks: u64,
}

impl TableProgress {
    pub fn new(table: &str, filter: Option<String>) -> Self {
        TableProgress {
            table: table.to_string(),
            filter,
            last_key: None,
            rows: 0,
            chunks: 0,
        }
    }

    /// A chunk of it was published (a chunk in flight is not: its rows take
    /// a high watermark after anything streamed before it).
    pub fn begun(&self) -> bool {
        self.chunks > 0 || self.last_key.is_some()
    }
}

impl SnapshotProgress {
    pub fn new(id: String, kind: SnapshotKind, tables: Vec<TableProgress>) -> Self {
        SnapshotProgress {
            id,
            kind,
            tables,
            paused: false,
        }
    }

    /// Adds tables not queued yet (a table queued and not begun keeps its
    /// place). A table whose copy has begun is queued again, at the end: the
    /// rows of its published chunks are older than this request, and a
    /// request wants every row copied after it (a sink recovering a gap
    /// removes the rows older than its request). Returns the names added.
    pub fn enqueue(&mut self, tables: Vec<TableProgress>) -> Vec<String> {
        let mut added = Vec::new();
        for t in tables {
            if !self.tables.iter().any(|q| q.table == t.table && !q.begun()) {
                added.push(t.table.clone());
                self.tables.push(t);
            }
        }
        added
    }

    /// The table being copied.
    pub fn current(&self) -> Option<&TableProgress> {
        self.tables.first()
    }
}

/// Queues `tables` on the snapshot in `slot`, starting one when none runs.
/// Returns the names actually added.
pub fn request(
    slot: &mut Option<SnapshotProgress>,
    id: String,
    kind: SnapshotKind,
    tables: Vec<TableProgress>,
) -> Vec<String> {
    match slot {
        Some(running) => running.enqueue(tables),
        None => {
            let names = tables.iter().map(|t| t.table.clone()).collect();
            if !tables.is_empty() {
                *slot = Some(SnapshotProgress::new(id, kind, tables));
            }
            names
        }
    }
}

/// What start-up does, given `snapshot.mode` and what Kafka holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartPlan {
    /// Start (or add to the running snapshot) these tables.
    pub snapshot: Option<(SnapshotKind, Vec<String>)>,
    /// Forget the stored offset and stream from the slot's position (a gap
    /// the new snapshot repairs).
    pub restart_from_slot: bool,
    /// Exit once no snapshot is running (`initial_only`).
    pub exit_when_done: bool,
}

/// The inputs of [`plan_start`].
#[derive(Debug, Clone, Copy)]
pub struct StartFacts<'a> {
    pub mode: SnapshotMode,
    /// A stored offset exists: (snapshot running in it, tables it lists as captured).
    pub stored: Option<(bool, Option<&'a BTreeSet<String>>)>,
    /// The slot is confirmed past the stored offset: changes were lost.
    pub gap: bool,
    /// The first pipeline life of this process (not a restart after an error).
    pub first_life: bool,
    pub new_tables: bool,
    /// The tables captured now (snapshot candidates).
    pub captured: &'a [String],
}

/// The stored position is gone and `snapshot.mode` does not re-snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapRefused;

/// Decides what start-up does (Debezium's `snapshot.mode` semantics; a
/// snapshot already running in the stored offset always resumes).
pub fn plan_start(f: StartFacts<'_>) -> Result<StartPlan, GapRefused> {
    let all = || Some((SnapshotKind::Initial, f.captured.to_vec()));
    let mut plan = StartPlan {
        snapshot: None,
        restart_from_slot: false,
        exit_when_done: f.mode == SnapshotMode::InitialOnly,
    };
    let Some((running, known)) = f.stored else {
        if f.mode != SnapshotMode::NoData {
            plan.snapshot = all();
        }
        return Ok(plan);
    };
    if f.gap {
        if !matches!(f.mode, SnapshotMode::WhenNeeded | SnapshotMode::Always) {
            return Err(GapRefused);
        }
        plan.restart_from_slot = true;
        plan.snapshot = all();
        return Ok(plan);
    }
    if f.mode == SnapshotMode::Always && f.first_life && !running {
        plan.snapshot = all();
        return Ok(plan);
    }
    if f.new_tables {
        if let Some(known) = known {
            let new: Vec<String> = f
                .captured
                .iter()
                .filter(|t| !known.contains(*t))
                .cloned()
                .collect();
            if !new.is_empty() {
                plan.snapshot = Some((SnapshotKind::Incremental, new));
            }
        }
    }
    Ok(plan)
}

/// A watermark's side of the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watermark {
    Low,
    High,
}

/// Content of a watermark message: `<chunk id>:low|high`.
pub fn watermark_content(chunk_id: &str, side: Watermark) -> String {
    match side {
        Watermark::Low => format!("{chunk_id}:low"),
        Watermark::High => format!("{chunk_id}:high"),
    }
}

/// Parses a watermark message's content.
pub fn parse_watermark(content: &[u8]) -> Option<(&str, Watermark)> {
    let text = std::str::from_utf8(content).ok()?;
    let (id, side) = text.rsplit_once(':')?;
    match side {
        "low" => Some((id, Watermark::Low)),
        "high" => Some((id, Watermark::High)),
        _ => None,
    }
}

/// A chunk id unique across restarts of the connector: watermarks of a
/// chunk read by a killed process come through the stream again and must
/// not be taken for the current chunk's.
pub fn new_chunk_id(counter: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{nanos:x}-{counter}", std::process::id())
}

/// The key of a row as the snapshot compares it: the text of each key column
/// (`None` for NULL). Stream changes and chunk rows render values with the
/// same output functions and session settings, so equal keys are equal bytes.
pub type RowKey = Vec<Option<bytes::Bytes>>;

/// The key of `row` at column positions `key_idx`; `None` when a key value
/// is not in the tuple (unchanged TOAST, binary), so the caller must assume
/// any key changed.
pub fn row_key(row: &RowImage, key_idx: &[usize]) -> Option<RowKey> {
    key_idx
        .iter()
        .map(|&i| match row.0.get(i)? {
            Datum::Null => Some(None),
            Datum::Text(b) => Some(Some(b.clone())),
            Datum::Unchanged | Datum::Binary(_) => None,
        })
        .collect()
}

pub use crate::naming::{quote_ident, quote_literal};

/// A key column and its type for casting literals: the column's exact type,
/// type modifier included (`format_type(atttypid, atttypmod)`). Without the
/// modifier `char(6)` would be `character`, which is `char(1)`, and `bit(8)`
/// would be `bit(1)`: a cast to those truncates the last key, and the cursor
/// goes back and reads the same chunk again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    pub name: String,
    pub type_name: String,
}

/// The SELECT of one chunk: rows after `after` in key order, `limit` of them.
pub fn chunk_query(
    schema: &str,
    table: &str,
    columns: &[String],
    key: &[KeyColumn],
    after: Option<&[Option<String>]>,
    filter: Option<&str>,
    limit: usize,
) -> String {
    let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    let keys: Vec<String> = key.iter().map(|k| quote_ident(&k.name)).collect();
    let mut conditions = Vec::new();
    if let Some(after) = after {
        let values: Vec<String> = key
            .iter()
            .zip(after)
            .map(|(k, v)| match v {
                Some(v) => format!("{}::{}", quote_literal(v), k.type_name),
                None => format!("NULL::{}", k.type_name),
            })
            .collect();
        // A row comparison orders composite and non-integer keys the way
        // ORDER BY and the primary key index do.
        conditions.push(format!("({}) > ({})", keys.join(", "), values.join(", ")));
    }
    if let Some(filter) = filter {
        conditions.push(format!("({filter})"));
    }
    let mut sql = format!(
        "SELECT {} FROM {}.{}",
        cols.join(", "),
        quote_ident(schema),
        quote_ident(table)
    );
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY {} LIMIT {limit}", keys.join(", ")));
    sql
}

/// Splits `schema.table` (no quoting: names as the catalog spells them).
pub fn split_table(qualified: &str) -> Option<(&str, &str)> {
    qualified
        .split_once('.')
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

#[cfg(test)]
mod tests;
