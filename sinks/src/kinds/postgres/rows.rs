//! A planned row and its shape: the columns, specs and values of the
//! newest change of one key, read from the batch's records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::source_ids::SourceTable;
use super::types::ColumnSpec;
use crate::event::Version;
use crate::sink::Record;

/// Event column name -> target column: `Some(name)` (itself when unchanged),
/// or `None` for a field the sink leaves out (a column it dropped).
pub type NameMap = HashMap<String, Option<String>>;

/// The columns of a row and their specs: rows of a table nearly always share
/// one, so it is built once and shared ([`Arc`]), and rows compare by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Key columns, sorted.
    pub key: Vec<String>,
    /// `None` for a delete; otherwise the available columns of the after image, sorted.
    pub values: Option<Vec<String>>,
    /// Columns whose value was unavailable (unchanged TOAST): the stored value stays.
    pub unavailable: Vec<String>,
    /// Column types as the event describes them (or inferred), for new columns.
    pub specs: BTreeMap<String, ColumnSpec>,
    /// What a record is compared against to reuse this shape: key columns and
    /// after-image entries (name, spec, unavailable) in the record's own order.
    /// Empty for a shape that is never reused (filled from an older change).
    pub(super) matcher: Option<Matcher>,
    /// The source table the event's schema names ([`source_ids`](super::source_ids)).
    pub source: Option<Arc<SourceTable>>,
    /// (target column, event field) of fields written under another name
    /// (a renamed column): values are read under the field's name.
    pub(super) renamed: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Matcher {
    pub(super) key: Vec<String>,
    pub(super) entries: Vec<(String, Option<ColumnSpec>, bool)>,
}

impl Shape {
    /// For each entry of the after image of records of this shape (in the
    /// record's order), the index in `columns` it fills: available non-key
    /// columns only. Empty when the shape does not know its records' order
    /// (deletes, rows filled from older changes): values are then looked up by name.
    fn after_layout(&self, columns: &[&str]) -> Vec<Option<usize>> {
        let Some(m) = self.matcher.as_ref().filter(|_| self.values.is_some()) else {
            return Vec::new();
        };
        m.entries
            .iter()
            .map(|(name, _, unavailable)| {
                if *unavailable || self.key.iter().any(|k| k == name) {
                    return None;
                }
                columns.iter().position(|c| c == name)
            })
            .collect()
    }

    /// The event field holding target column `column`'s value.
    pub fn source_of<'s>(&'s self, column: &'s str) -> &'s str {
        self.renamed
            .iter()
            .find(|(target, _)| target == column)
            .map_or(column, |(_, field)| field.as_str())
    }

    /// This shape with its fields renamed to the target columns `map`
    /// names (left out where it names none); values are then read by name.
    pub fn translated(&self, map: &NameMap) -> Shape {
        let target = |name: &String| match map.get(name) {
            Some(t) => t.clone(),
            None => Some(name.clone()),
        };
        let rename =
            |names: &[String]| -> Vec<String> { names.iter().filter_map(target).collect() };
        let mut values = self.values.as_deref().map(rename);
        if let Some(v) = values.as_mut() {
            v.sort();
            v.dedup();
        }
        let mut key: Vec<String> = self
            .key
            .iter()
            .map(|k| target(k).unwrap_or(k.clone()))
            .collect();
        key.sort();
        // Values are read under the event's own field name, also when this
        // shape was translated before (a rename, then a retired column).
        let mut renamed: Vec<(String, String)> = map
            .iter()
            .filter_map(|(field, t)| Some((t.clone()?, self.source_of(field).to_owned())))
            .collect();
        renamed.extend(
            self.renamed
                .iter()
                .filter(|(target, _)| !map.contains_key(target))
                .cloned(),
        );
        Shape {
            key,
            values,
            unavailable: rename(&self.unavailable),
            specs: self
                .specs
                .iter()
                .filter_map(|(n, s)| Some((target(n)?, s.clone())))
                .collect(),
            matcher: None,
            source: self.source.clone(),
            renamed,
        }
    }

    /// Whether `column` is one of the row's available columns (key included).
    pub fn has_value(&self, column: &str) -> bool {
        self.key.iter().any(|k| k == column)
            || self
                .values
                .as_ref()
                .is_some_and(|v| v.binary_search_by(|c| c.as_str().cmp(column)).is_ok())
    }
}

/// The newest change of one key in the batch: the record it comes from (by
/// index in the batch) and its shape. Owns its data (no borrow of the batch),
/// so that a plan can be built ahead and stored in the batch.
#[derive(Debug, Clone)]
pub struct Row {
    /// Index of the record in `batch.records()`.
    pub record: usize,
    /// Offset of the record the row comes from (the newest of its key).
    pub offset: i64,
    /// The row's version.
    pub version: Version,
    /// Columns and specs.
    pub shape: Arc<Shape>,
    /// Columns unavailable in the record whose value an older change of the
    /// same batch carried: (column, index of that record).
    pub fills: Vec<(String, usize)>,
}

impl Row {
    /// True for a delete.
    pub fn is_delete(&self) -> bool {
        self.shape.values.is_none()
    }

    /// The row's value of `column` (`None` when absent or unavailable), read from `records`
    /// (the batch the row was planned from).
    pub fn value<'r>(&self, records: &'r [Record], target: &str) -> Option<&'r Value> {
        let column = self.shape.source_of(target);
        if let Some((_, i)) = self.fills.iter().find(|(c, _)| c == target) {
            return after_of(&records[*i])?.get(column);
        }
        let record = &records[self.record];
        // `shape.key` names the record key's columns: no lookup for the others.
        if self.shape.key.iter().any(|k| k == target) {
            if let Some(v) = record.key.as_ref().and_then(|k| k.get(column)) {
                return Some(v);
            }
        }
        if self.shape.unavailable.iter().any(|c| c == target) {
            return None;
        }
        after_of(record)?.get(column)
    }
}

/// The values of `columns` for each of `rows` (planned from `records`), one
/// vector per column, JSON null as `None`: what [`Row::value`] gives, read by
/// walking each record's after image once in the order its shape recorded
/// instead of one lookup by name per column.
pub fn column_values<'r>(
    columns: &[&str],
    rows: &[&Row],
    records: &'r [Record],
) -> Vec<Vec<Option<&'r Value>>> {
    let mut out: Vec<Vec<Option<&Value>>> = columns
        .iter()
        .map(|_| Vec::with_capacity(rows.len()))
        .collect();
    // The layout of the previous row's shape: rows nearly always share one.
    let mut layout: Option<(&Shape, Vec<Option<usize>>)> = None;
    // This row's values found by position (`None`: look it up by name).
    let mut found: Vec<Option<&Value>> = Vec::with_capacity(columns.len());
    for row in rows {
        found.clear();
        found.resize(columns.len(), None);
        if row.fills.is_empty() {
            let (_, map) = match layout.take() {
                Some((shape, map)) if std::ptr::eq(shape, &*row.shape) => {
                    layout.insert((shape, map))
                }
                _ => layout.insert((&row.shape, row.shape.after_layout(columns))),
            };
            if let Some(after) = after_of(&records[row.record]).filter(|_| !map.is_empty()) {
                for ((name, value), column) in after.iter().zip(map.iter()) {
                    if let Some(c) = *column {
                        if name == columns[c] {
                            found[c] = Some(value);
                        }
                    }
                }
            }
        }
        for (c, column) in columns.iter().enumerate() {
            let value = found[c].or_else(|| row.value(records, column));
            out[c].push(value.filter(|v| !v.is_null()));
        }
    }
    out
}

fn after_of(record: &Record) -> Option<&Map<String, Value>> {
    record.event()?.after.as_ref()
}
