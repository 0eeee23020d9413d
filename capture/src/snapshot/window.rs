//! What the stream did to the keys of the chunk in flight, and so what each
//! chunk row is worth at the chunk's high watermark.
//!
//! A row whose key the stream inserted, deleted or moved (a primary-key
//! change) while the chunk was in flight is dropped: the stream carries the
//! row's whole state, or its absence, and a delete must win. A row the stream
//! only updated in place is dropped too when those updates carried every
//! column. But an update leaves an unchanged TOASTed column out (pgoutput
//! sends it as "unchanged"), and a target that had no row yet — the snapshot
//! had not reached it — then never learns that value. The chunk row holds it:
//! a column that every update of the window left unchanged had one value
//! throughout the window, so the value the chunk read is the current one,
//! whenever in the window it read the row. Such a row is published
//! *completed*: the newest value the window's updates carried for each column
//! they carried, the chunk row's value for the rest — the row as it is at the
//! high watermark, so its version (the high watermark's) fits it.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;

use super::RowKey;
use crate::change::{Datum, RowImage, StreamTable};

/// The stream's changes to one key since its chunk was launched.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyChange {
    /// Inserted, deleted, or moved by a primary-key change.
    Replaced,
    /// Only updated in place: the newest value some update of the window
    /// carried for each column, by column name, with the column's type OID.
    /// A column every update left unchanged is absent.
    Updated(HashMap<String, (u32, Datum)>),
}

/// The most one window holds, in bytes: its keys and the values its updates
/// carried, each counted with [`ENTRY_OVERHEAD`]. Past it the window stops
/// noting and its chunk is read again (see [`Window::must_read_again`]).
pub const WINDOW_MAX_BYTES: usize = 64 << 20;

/// What one noted key or carried value costs beyond its bytes (map entry,
/// vectors, column name), roughly.
const ENTRY_OVERHEAD: usize = 96;

/// The keys of one chunk's table the stream changed while the chunk was in
/// flight. Memory: one entry per key changed in the window, holding the
/// values its updates carried (never the unchanged TOAST ones), copied out
/// of the WAL message they came in (a slice would keep the whole message);
/// once the chunk is read, only the chunk's own keys are kept, so at most a
/// chunk's worth of rows. Before the chunk is read every key of the table
/// counts, so a slow chunk under a busy writer could note without end:
/// [`WINDOW_MAX_BYTES`] bounds it.
#[derive(Debug)]
pub struct Window {
    keys: HashMap<RowKey, KeyChange>,
    /// The chunk's keys, once it is read.
    chunk: Option<HashSet<RowKey>>,
    /// A change whose key could not be told (a truncate, a key column not in
    /// the tuple): any row may have changed, so every row is dropped.
    all: bool,
    /// Bytes `keys` holds, as [`WINDOW_MAX_BYTES`] counts them.
    held: usize,
    limit: usize,
    /// The window went past its limit and forgot what it noted: no verdict
    /// can be told, the chunk must be read again.
    overflowed: bool,
}

impl Default for Window {
    fn default() -> Self {
        Self::with_limit(WINDOW_MAX_BYTES)
    }
}

/// What becomes of one chunk row at the high watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The stream did not touch the key: the row as read.
    Keep,
    /// Updated in the window, leaving columns out: the row completed from
    /// the window's updates and the chunk row.
    Complete(RowImage),
    /// The stream carries the row's state (or its absence).
    Drop,
}

impl Window {
    /// A window holding at most `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Window {
            keys: HashMap::new(),
            chunk: None,
            all: false,
            held: 0,
            limit,
            overflowed: false,
        }
    }

    fn tracks(&self, key: &RowKey) -> bool {
        !self.all && !self.overflowed && self.chunk.as_ref().is_none_or(|c| c.contains(key))
    }

    /// The key was inserted or deleted, or a primary-key change moved a row
    /// to or from it.
    pub fn replaced(&mut self, key: RowKey) {
        if !self.tracks(&key) {
            return;
        }
        match self.keys.get_mut(&key) {
            Some(change) => {
                if let KeyChange::Updated(carried) = change {
                    self.held = self.held.saturating_sub(carried_bytes(carried));
                }
                *change = KeyChange::Replaced;
            }
            None => {
                self.held += key_bytes(&key);
                self.keys.insert(owned_key(&key), KeyChange::Replaced);
            }
        }
        self.check_limit();
    }

    /// The key's row was updated in place to `new` (shaped by `rel`;
    /// unchanged TOAST values as [`Datum::Unchanged`]).
    pub fn updated(&mut self, key: RowKey, rel: &impl StreamTable, new: &RowImage) {
        if !self.tracks(&key) {
            return;
        }
        if !self.keys.contains_key(&key) {
            self.held += key_bytes(&key);
            self.keys
                .insert(owned_key(&key), KeyChange::Updated(HashMap::new()));
        }
        if let Some(KeyChange::Updated(carried)) = self.keys.get_mut(&key) {
            for (i, value) in new.0.iter().enumerate().take(rel.width()) {
                if matches!(value, Datum::Unchanged) {
                    continue;
                }
                let name = rel.column_name(i);
                let value = owned_value(value);
                self.held += value_bytes(name, &value);
                if let Some(old) = carried.insert(name.to_owned(), (rel.column_type(i), value)) {
                    self.held = self.held.saturating_sub(value_bytes(name, &old.1));
                }
            }
        }
        self.check_limit();
    }

    /// Past the limit, everything noted is let go: which keys the chunk
    /// holds is not known yet, so none can be kept for sure, and a verdict
    /// from a partial window would publish rows the stream changed.
    fn check_limit(&mut self) {
        if self.held > self.limit {
            self.overflowed = true;
            self.keys = HashMap::new();
            self.held = 0;
        }
    }

    /// Whether the window went past [`WINDOW_MAX_BYTES`]: nothing of the
    /// chunk may be published, it is read again.
    pub fn must_read_again(&self) -> bool {
        self.overflowed
    }

    /// A change whose key cannot be told: every row of the chunk is dropped.
    pub fn all_changed(&mut self) {
        self.all = true;
        self.keys = HashMap::new();
        self.held = 0;
    }

    /// Whether every row is dropped.
    #[cfg(test)]
    pub fn is_all_changed(&self) -> bool {
        self.all
    }

    /// The chunk was read with these keys: changes of other keys no longer matter.
    pub fn chunk_read(&mut self, keys: impl IntoIterator<Item = RowKey>) {
        let keys: HashSet<RowKey> = keys.into_iter().collect();
        self.keys.retain(|k, _| keys.contains(k));
        self.keys.shrink_to_fit();
        self.held = self
            .keys
            .iter()
            .map(|(k, change)| {
                key_bytes(k)
                    + match change {
                        KeyChange::Replaced => 0,
                        KeyChange::Updated(carried) => carried_bytes(carried),
                    }
            })
            .sum();
        self.chunk = Some(keys);
    }

    /// What becomes of chunk row `row` (shaped by the chunk's `rel`) with key
    /// `key` (`None`: not readable).
    pub fn verdict(&self, rel: &impl StreamTable, row: &RowImage, key: Option<&RowKey>) -> Verdict {
        if self.all || self.overflowed {
            return Verdict::Drop;
        }
        let Some(key) = key else {
            return Verdict::Drop;
        };
        let carried = match self.keys.get(key) {
            None => return Verdict::Keep,
            Some(KeyChange::Replaced) => return Verdict::Drop,
            Some(KeyChange::Updated(carried)) => carried,
        };
        let mut completed = false;
        let mut values = Vec::with_capacity(rel.width());
        for (i, read) in row.0.iter().enumerate().take(rel.width()) {
            match carried.get(rel.column_name(i)) {
                Some((ty, value)) if *ty == rel.column_type(i) => values.push(value.clone()),
                // The column's type changed under the chunk: which value is
                // current cannot be told here.
                Some(_) => return Verdict::Drop,
                None => {
                    completed = true;
                    values.push(read.clone());
                }
            }
        }
        if completed {
            Verdict::Complete(RowImage(values))
        } else {
            Verdict::Drop
        }
    }
}

fn key_bytes(key: &RowKey) -> usize {
    ENTRY_OVERHEAD + key.iter().flatten().map(Bytes::len).sum::<usize>()
}

fn value_bytes(column: &str, value: &Datum) -> usize {
    ENTRY_OVERHEAD
        + column.len()
        + match value {
            Datum::Text(b) | Datum::Binary(b) => b.len(),
            Datum::Null | Datum::Unchanged => 0,
        }
}

fn carried_bytes(carried: &HashMap<String, (u32, Datum)>) -> usize {
    carried.iter().map(|(c, (_, v))| value_bytes(c, v)).sum()
}

/// The key in memory of its own: a key read from the stream is a slice of
/// its whole WAL message.
fn owned_key(key: &RowKey) -> RowKey {
    key.iter()
        .map(|v| v.as_deref().map(Bytes::copy_from_slice))
        .collect()
}

fn owned_value(value: &Datum) -> Datum {
    match value {
        Datum::Text(b) => Datum::Text(Bytes::copy_from_slice(b)),
        Datum::Binary(b) => Datum::Binary(Bytes::copy_from_slice(b)),
        other => other.clone(),
    }
}

impl Verdict {
    /// The row to publish, if any (`read` is the chunk row).
    pub fn row<'r>(&'r self, read: &'r RowImage) -> Option<&'r RowImage> {
        match self {
            Verdict::Keep => Some(read),
            Verdict::Complete(row) => Some(row),
            Verdict::Drop => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::TestTable;

    const TEXT: u32 = 25;
    const INT: u32 = 23;

    fn t(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn u() -> Datum {
        Datum::Unchanged
    }

    fn rel(types: &[(&str, u32)]) -> TestTable {
        TestTable {
            namespace: "public",
            name: "docs",
            ahead_of_stream: false,
            columns: types
                .iter()
                .map(|(name, ty)| ((*name).to_owned(), *ty))
                .collect(),
        }
    }

    fn docs() -> TestTable {
        rel(&[("id", INT), ("rev", INT), ("big", TEXT)])
    }

    fn key(id: &str) -> RowKey {
        vec![Some(Bytes::copy_from_slice(id.as_bytes()))]
    }

    fn row(values: Vec<Datum>) -> RowImage {
        RowImage(values)
    }

    #[test]
    fn untouched_rows_are_kept_as_read() {
        let w = Window::default();
        let read = row(vec![t("1"), t("0"), t("B")]);
        assert_eq!(w.verdict(&docs(), &read, Some(&key("1"))), Verdict::Keep);
        assert_eq!(
            w.verdict(&docs(), &read, Some(&key("1")))
                .row(&read)
                .unwrap(),
            &read
        );
    }

    #[test]
    fn an_unchanged_toast_value_comes_from_the_chunk_row_the_rest_from_the_stream() {
        let mut w = Window::default();
        // Read before the updates: rev 0. The stream set rev 1, then 2, and never big.
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("1"), u()]));
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("2"), u()]));
        let read = row(vec![t("1"), t("0"), t("B")]);
        assert_eq!(
            w.verdict(&docs(), &read, Some(&key("1"))),
            Verdict::Complete(row(vec![t("1"), t("2"), t("B")]))
        );
    }

    #[test]
    fn a_toast_value_some_update_carried_wins_over_the_chunk_row() {
        let mut w = Window::default();
        // big set to B2 after the chunk read B1, then left unchanged: the
        // stream carried everything, the row is dropped.
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("1"), t("B2")]));
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("2"), u()]));
        let read = row(vec![t("1"), t("0"), t("B1")]);
        assert_eq!(w.verdict(&docs(), &read, Some(&key("1"))), Verdict::Drop);
        // A second TOASTed column left unchanged throughout: completed, with
        // the carried B2, never the chunk's B1.
        let two = rel(&[("id", INT), ("big", TEXT), ("other", TEXT)]);
        let mut w = Window::default();
        w.updated(key("1"), &two, &row(vec![t("1"), t("B2"), u()]));
        w.updated(key("1"), &two, &row(vec![t("1"), u(), u()]));
        let read = row(vec![t("1"), t("B1"), t("O")]);
        assert_eq!(
            w.verdict(&two, &read, Some(&key("1"))),
            Verdict::Complete(row(vec![t("1"), t("B2"), t("O")]))
        );
    }

    #[test]
    fn inserts_deletes_and_key_moves_win() {
        let read = row(vec![t("1"), t("0"), t("B")]);
        // Updated, then deleted: dropped, and a later update does not bring it back.
        let mut w = Window::default();
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("1"), u()]));
        w.replaced(key("1"));
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("2"), u()]));
        assert_eq!(w.verdict(&docs(), &read, Some(&key("1"))), Verdict::Drop);
        // Any unreadable key drops every row.
        let mut w = Window::default();
        w.all_changed();
        w.updated(key("2"), &docs(), &row(vec![t("2"), t("1"), u()]));
        assert_eq!(w.verdict(&docs(), &read, Some(&key("1"))), Verdict::Drop);
        assert!(w.is_all_changed());
        // A chunk row whose key cannot be read.
        assert_eq!(
            Window::default().verdict(&docs(), &read, None),
            Verdict::Drop
        );
    }

    #[test]
    fn columns_match_by_name_and_type() {
        let mut w = Window::default();
        // The stream's shape lists columns in another order than the chunk's.
        let stream = rel(&[("id", INT), ("big", TEXT), ("rev", INT)]);
        w.updated(key("1"), &stream, &row(vec![t("1"), u(), t("5")]));
        let read = row(vec![t("1"), t("0"), t("B")]);
        assert_eq!(
            w.verdict(&docs(), &read, Some(&key("1"))),
            Verdict::Complete(row(vec![t("1"), t("5"), t("B")]))
        );
        // rev changed type since: no telling which value is current.
        let changed = rel(&[("id", INT), ("rev", TEXT), ("big", TEXT)]);
        assert_eq!(w.verdict(&changed, &read, Some(&key("1"))), Verdict::Drop);
    }

    #[test]
    fn a_slow_chunk_holds_a_bounded_amount_and_no_wal_message() {
        // Updates to many keys while a slow chunk is read, each carrying a
        // large value, all slices of one big WAL message buffer.
        let message = Bytes::from(vec![b'x'; 1 << 20]);
        // Within the bound: what is noted is copied out of the message.
        let mut w = Window::default();
        let big = Datum::Text(message.slice(..1000));
        w.updated(
            vec![Some(message.slice(..8))],
            &docs(),
            &row(vec![t("1"), t("1"), big]),
        );
        assert!(
            message.is_unique(),
            "the window keeps the WAL message its keys and values came from"
        );
        assert!(!w.must_read_again());
        let mut w = Window::default();
        for i in 0..100 {
            let id = i.to_string();
            let big = Datum::Text(message.clone());
            w.updated(key(&id), &docs(), &row(vec![t(&id), t("1"), big]));
            w.replaced(vec![Some(message.slice(..8))]);
        }
        assert!(
            message.is_unique(),
            "the window keeps the WAL message its keys and values came from"
        );
        let held: usize = w
            .keys
            .iter()
            .map(|(k, change)| {
                let values = match change {
                    KeyChange::Updated(carried) => carried
                        .values()
                        .map(|(_, v)| match v {
                            Datum::Text(b) | Datum::Binary(b) => b.len(),
                            _ => 0,
                        })
                        .sum(),
                    _ => 0,
                };
                k.iter().flatten().map(Bytes::len).sum::<usize>() + values
            })
            .sum();
        assert!(
            held <= 64 << 20,
            "the window holds {held} bytes of {} keys",
            w.keys.len()
        );
        // Over its bound the window cannot tell the chunk's rows apart any
        // more: the chunk is read again, never published from a partial
        // window, and it notes nothing more.
        assert!(w.must_read_again());
        let read = row(vec![t("1"), t("0"), t("B")]);
        assert_eq!(w.verdict(&docs(), &read, Some(&key("1"))), Verdict::Drop);
        w.replaced(key("1"));
        assert!(w.keys.is_empty() && w.held == 0);
    }

    #[test]
    fn once_read_the_window_counts_only_the_chunks_keys() {
        let mut w = Window::with_limit(8192);
        for i in 0..20 {
            let id = i.to_string();
            w.updated(key(&id), &docs(), &row(vec![t(&id), t("1"), u()]));
        }
        assert!(!w.must_read_again());
        w.chunk_read([key("1"), key("2")]);
        assert_eq!(w.keys.len(), 2);
        let two_keys = w.held;
        // Updates of other keys no longer count; more updates of a chunk
        // key replace its carried values, they do not add up.
        for i in 0..1000 {
            let id = (i % 20).to_string();
            w.updated(key(&id), &docs(), &row(vec![t(&id), t("7"), u()]));
        }
        assert_eq!(w.held, two_keys);
        assert!(!w.must_read_again());
    }

    #[test]
    fn once_read_only_the_chunks_keys_are_kept() {
        let mut w = Window::default();
        w.updated(key("1"), &docs(), &row(vec![t("1"), t("1"), u()]));
        w.updated(key("9"), &docs(), &row(vec![t("9"), t("1"), u()]));
        w.chunk_read([key("1"), key("2")]);
        assert_eq!(w.keys.len(), 1);
        w.replaced(key("8"));
        w.updated(key("7"), &docs(), &row(vec![t("7"), t("1"), u()]));
        assert_eq!(w.keys.len(), 1);
        w.replaced(key("2"));
        let read = row(vec![t("2"), t("0"), t("B")]);
        assert_eq!(w.verdict(&docs(), &read, Some(&key("2"))), Verdict::Drop);
    }
}
