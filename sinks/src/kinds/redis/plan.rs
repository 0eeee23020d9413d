//! From a batch's records to the changes one script call applies.
//!
//! * `c`, `r`, `u` upsert the row from `after`; `d` deletes it (leaving a
//!   version tombstone); tombstone records (null values) and `m` messages
//!   change nothing; `t` (truncate) removes the table's rows older than it,
//!   found in the table's key set ([`key_set`]), never by a scan of the keyspace.
//! * Row keys come from `key.pattern`; `{key}` is the record key's values in
//!   key order, joined by `key.separator` (strings as is, other values as JSON).
//! * A column holding [`UNAVAILABLE_VALUE`] (unchanged TOAST) is left out, so
//!   the stored value stays: the hash script does not touch the field, and the
//!   JSON layout merges the stored row in before the call ([`merge_json`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::config::Layout;
use super::script::{decode_version, write_version};
use crate::error::RecordFailure;
use crate::event::{ChangeEvent, Op};
use crate::sink::{Batch, Record};

/// Debezium's marker of an unchanged TOASTed column.
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

/// One change for the script, borrowing from its batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Change<'a> {
    /// The record's offset (to name it in a rejection).
    pub offset: i64,
    /// The row key (empty for a truncate).
    pub row_key: String,
    /// The set of the table's row keys ([`key_set`]): a write adds its row, a
    /// delete removes it, a truncate goes through it.
    pub key_set: String,
    /// The version, encoded for the script ([`encode_version`]).
    pub version: [u8; 40],
    /// What to do.
    pub body: Body<'a>,
}

/// The write of a [`Change`].
#[derive(Debug, Clone, PartialEq)]
pub enum Body<'a> {
    /// Remove the row, keep its version as a tombstone.
    Delete,
    /// Remove every row of the table (its key set) older than this version.
    Truncate,
    /// Hash layout: set the row's non-null columns, remove the null ones, keep
    /// the unavailable ones and every other field ([`hash_fields`]).
    Hash(&'a Map<String, Value>),
    /// JSON layout: the row, and the columns to take from the stored row.
    Json {
        /// The row; its unavailable columns still hold the marker until merged.
        row: Map<String, Value>,
        /// Unchanged TOAST columns, to fill from the stored row.
        unavailable: Vec<String>,
    },
}

impl Change<'_> {
    /// The version as text.
    pub fn version_str(&self) -> &str {
        // Only ASCII digits are ever written into it.
        std::str::from_utf8(&self.version).unwrap_or_default()
    }

    /// Bytes this change adds to a script call (keys and arguments), roughly.
    pub fn weight(&self, version_prefix_len: usize) -> usize {
        let key = 2 * self.row_key.len() + version_prefix_len + 64;
        key + match &self.body {
            Body::Delete | Body::Truncate => 0,
            Body::Hash(row) => row
                .iter()
                .map(|(f, v)| f.len() + value_len(v) + 8)
                .sum::<usize>(),
            Body::Json { row, .. } => row.len() * 16,
        }
    }
}

/// About how many bytes `v` takes as text (exact for strings).
fn value_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => 16 * a.len() + 2,
        Value::Object(o) => 32 * o.len() + 2,
        _ => 20,
    }
}

/// A hash-layout column's value as the script gets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'a> {
    /// A string column, as is.
    Str(&'a str),
    /// Any other non-null value: its JSON text.
    Json(&'a Value),
}

/// A hash row's columns: the fields to set and the null columns to remove;
/// unavailable (unchanged TOAST) columns are in neither, so they keep their
/// stored value.
pub fn hash_fields(row: &Map<String, Value>) -> (Vec<(&str, FieldValue<'_>)>, Vec<&str>) {
    let mut set = Vec::with_capacity(row.len());
    let mut unset = Vec::new();
    for (column, value) in row {
        match value {
            Value::Null => unset.push(column.as_str()),
            Value::String(s) if s == UNAVAILABLE_VALUE => {}
            Value::String(s) => set.push((column.as_str(), FieldValue::Str(s))),
            other => set.push((column.as_str(), FieldValue::Json(other))),
        }
    }
    (set, unset)
}

/// One piece of a parsed `key.pattern`.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Literal(String),
    Topic,
    Source(&'static str),
    Key,
}

/// How row keys are built: `key.pattern`, parsed once.
#[derive(Debug, Clone)]
pub struct KeyPattern {
    parts: Vec<Part>,
    separator: String,
}

impl KeyPattern {
    /// A pattern (placeholders checked by the config) and the composite-key separator.
    pub fn new(pattern: &str, separator: &str) -> Self {
        let mut parts = Vec::new();
        let mut rest = pattern;
        while !rest.is_empty() {
            let next = [
                ("{topic}", Part::Topic),
                ("{db}", Part::Source("db")),
                ("{schema}", Part::Source("schema")),
                ("{table}", Part::Source("table")),
                ("{key}", Part::Key),
            ]
            .into_iter()
            .filter_map(|(p, part)| rest.find(p).map(|at| (at, p.len(), part)))
            .min_by_key(|(at, _, _)| *at);
            match next {
                Some((at, len, part)) => {
                    if at > 0 {
                        parts.push(Part::Literal(rest[..at].to_owned()));
                    }
                    parts.push(part);
                    rest = &rest[at + len..];
                }
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    rest = "";
                }
            }
        }
        Self {
            parts,
            separator: separator.to_owned(),
        }
    }

    /// The row key of `key` for an event of `topic`.
    pub fn render(&self, topic: &str, event: &ChangeEvent, key: &Value) -> String {
        let mut out = String::with_capacity(64);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Topic => out.push_str(topic),
                Part::Source(f) => {
                    out.push_str(event.source.get(*f).and_then(Value::as_str).unwrap_or(""))
                }
                Part::Key => match key {
                    Value::Object(map) => {
                        for (i, v) in map.values().enumerate() {
                            if i > 0 {
                                out.push_str(&self.separator);
                            }
                            push_text(&mut out, v);
                        }
                    }
                    other => push_text(&mut out, other),
                },
            }
        }
        out
    }
}

/// Appends a key value's text: strings as is, other values as JSON, nothing for null.
fn push_text(out: &mut String, v: &Value) {
    use std::fmt::Write;
    match v {
        Value::Null => {}
        Value::String(s) => out.push_str(s),
        // Writing into a String cannot fail.
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

/// The key of the set holding the row keys of an event's table:
/// `<keyset.key.prefix><db>.<schema>.<table>` (the topic when the event names
/// no table). Per table, not per topic or key pattern, so a truncate of one
/// table never touches another's rows.
pub fn key_set(prefix: &str, topic: &str, event: &ChangeEvent) -> String {
    match event.table() {
        Some(table) => {
            let db = event.source.get("db").and_then(Value::as_str).unwrap_or("");
            let schema = event.schema_name().unwrap_or("");
            format!("{prefix}{db}.{schema}.{table}")
        }
        None => format!("{prefix}{topic}"),
    }
}

/// How a batch's records become changes: the row keys, the hash field holding
/// a row's version (hash layout) and the prefix of the tables' key sets.
#[derive(Debug, Clone, Copy)]
pub struct Naming<'a> {
    /// `key.pattern`, parsed.
    pub keys: &'a KeyPattern,
    /// `version.field`.
    pub version_field: &'a str,
    /// `keyset.key.prefix`.
    pub keyset_prefix: &'a str,
}

/// The changes of a batch, or the records that can never be applied.
pub fn plan<'a>(
    batch: &'a Batch,
    layout: Layout,
    naming: Naming<'_>,
) -> Result<Vec<Change<'a>>, Vec<RecordFailure>> {
    let mut changes = Vec::with_capacity(batch.len());
    let mut failures = Vec::new();
    for record in batch.records() {
        match change_of(batch.topic(), record, layout, naming) {
            Ok(Some(c)) => changes.push(c),
            Ok(None) => {}
            Err(reason) => failures.push(RecordFailure::new(record.offset, reason)),
        }
    }
    if failures.is_empty() {
        Ok(changes)
    } else {
        Err(failures)
    }
}

fn change_of<'a>(
    topic: &str,
    record: &'a Record,
    layout: Layout,
    naming: Naming<'_>,
) -> Result<Option<Change<'a>>, String> {
    let Some(event) = record.event() else {
        return Ok(None); // a tombstone record: the delete before it did the work
    };
    let version_field = naming.version_field;
    let key_set = key_set(naming.keyset_prefix, topic, event);
    let mut version = [0u8; 40];
    write_version(event.version, &mut version);
    let body = match event.op {
        Op::Message => return Ok(None),
        Op::Truncate => {
            return Ok(Some(Change {
                offset: record.offset,
                row_key: String::new(),
                key_set,
                version,
                body: Body::Truncate,
            }))
        }
        Op::Delete => Body::Delete,
        Op::Create | Op::Read | Op::Update => {
            let after = event
                .after
                .as_ref()
                .ok_or_else(|| format!("op `{}` without `after`", event.op.code()))?;
            match layout {
                Layout::Hash => {
                    if after.contains_key(version_field) {
                        return Err(format!(
                            "column `{version_field}` has the name of the hash field holding the \
                             row's version: set `sink.version.field` to a name no column uses"
                        ));
                    }
                    Body::Hash(after)
                }
                Layout::Json => json_body(after),
            }
        }
    };
    let key = record
        .key
        .as_ref()
        .ok_or("a change without a record key: the redis sink needs the primary key")?;
    Ok(Some(Change {
        offset: record.offset,
        row_key: naming.keys.render(topic, event, key),
        key_set,
        version,
        body,
    }))
}

fn json_body(after: &Map<String, Value>) -> Body<'static> {
    Body::Json {
        row: after.clone(),
        unavailable: after
            .iter()
            .filter(|(_, v)| v.as_str() == Some(UNAVAILABLE_VALUE))
            .map(|(c, _)| c.clone())
            .collect(),
    }
}

/// The row keys whose stored JSON rows [`merge_json`] needs.
pub fn keys_to_merge(changes: &[Change<'_>]) -> Vec<String> {
    let mut keys: Vec<String> = changes
        .iter()
        .filter(|c| matches!(&c.body, Body::Json { unavailable, .. } if !unavailable.is_empty()))
        .map(|c| c.row_key.clone())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The newest version of a key and its row (`None` when absent or deleted).
type MergeBase = (Option<String>, Option<Map<String, Value>>);

/// Fills the unavailable columns of JSON rows from the row they follow.
///
/// `stored` holds, for each key of [`keys_to_merge`], the stored version and
/// JSON text (either may be missing). The script's own rule is replayed in
/// order — a change counts only if it is newer than the current state — so a
/// column comes from the newest row before the change, whether that is stored
/// or earlier in the batch. A column whose base row is unknown (not cached) is
/// left out of the row.
pub fn merge_json(
    changes: &mut [Change<'_>],
    stored: HashMap<String, (Option<String>, Option<String>)>,
) {
    let mut state: HashMap<String, MergeBase> = stored
        .into_iter()
        .map(|(k, (v, json))| {
            let version = v.filter(|v| decode_version(v).is_some());
            let row = json
                .and_then(|j| serde_json::from_str::<Value>(&j).ok())
                .and_then(|r| match r {
                    Value::Object(m) => Some(m),
                    _ => None,
                });
            (k, (version, row))
        })
        .collect();
    let tables: HashMap<String, String> = changes
        .iter()
        .filter(|c| state.contains_key(&c.row_key))
        .map(|c| (c.row_key.clone(), c.key_set.clone()))
        .collect();
    for change in changes.iter_mut() {
        if change.body == Body::Truncate {
            // The script removes the table's rows older than the truncate.
            for (key, (version, base)) in state.iter_mut() {
                let older = version.as_deref().is_none_or(|v| v < change.version_str());
                if older && tables.get(key) == Some(&change.key_set) {
                    *version = None;
                    *base = None;
                }
            }
            continue;
        }
        let Some((version, base)) = state.get_mut(&change.row_key) else {
            continue;
        };
        if version
            .as_deref()
            .is_some_and(|v| v >= change.version_str())
        {
            continue; // the script will skip it too
        }
        *version = Some(change.version_str().to_owned());
        match &mut change.body {
            Body::Delete => *base = None,
            Body::Json { row, unavailable } => {
                for column in unavailable.drain(..) {
                    match base.as_ref().and_then(|b| b.get(&column)) {
                        Some(v) => {
                            row.insert(column, v.clone()); // in place: keeps column order
                        }
                        None => {
                            row.shift_remove(&column);
                        }
                    }
                }
                *base = Some(row.clone());
            }
            Body::Hash(_) | Body::Truncate => {}
        }
    }
}

/// The JSON text of a row for the script, without columns still unavailable.
pub fn json_text(row: &Map<String, Value>, unavailable: &[String]) -> String {
    // Serializing a map of JSON values cannot fail (its keys are strings).
    if unavailable.is_empty() {
        return serde_json::to_string(row).unwrap_or_default();
    }
    let mut row = row.clone();
    for c in unavailable {
        row.shift_remove(c);
    }
    serde_json::to_string(&row).unwrap_or_default()
}
