//! From a batch's records to the changes one script call applies.
//!
//! * `c`, `r`, `u` upsert the row from `after`; `d` deletes it (leaving a
//!   version tombstone); tombstone records (null values) and `m` messages
//!   change nothing; `t` (truncate) is rejected to the dead-letter topic: the
//!   cache cannot drop a whole table inside one short script (see the module
//!   docs of [`super`]).
//! * Row keys come from `key.pattern`; `{key}` is the record key's values in
//!   key order, joined by `key.separator` (strings as is, other values as JSON).
//! * A column holding [`UNAVAILABLE_VALUE`] (unchanged TOAST) is left out, so
//!   the stored value stays: the hash script does not touch the field, and the
//!   JSON layout merges the stored row in before the call ([`merge_json`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::config::Layout;
use super::script::{decode_version, encode_version};
use crate::error::RecordFailure;
use crate::event::{ChangeEvent, Op};
use crate::sink::{Batch, Record};

/// Debezium's marker of an unchanged TOASTed column.
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

/// One change for the script.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The record's offset (to name it in a rejection).
    pub offset: i64,
    /// The row key.
    pub row_key: String,
    /// The version, encoded for the script.
    pub version: String,
    /// What to do.
    pub body: Body,
}

/// The write of a [`Change`].
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Remove the row, keep its version as a tombstone.
    Delete,
    /// Hash layout: set these fields, remove the null ones, keep the others.
    Hash {
        /// Non-null columns and their text.
        set: Vec<(String, String)>,
        /// Null columns.
        unset: Vec<String>,
    },
    /// JSON layout: the row, and the columns to take from the stored row.
    Json {
        /// The row; its unavailable columns still hold the marker until merged.
        row: Map<String, Value>,
        /// Unchanged TOAST columns, to fill from the stored row.
        unavailable: Vec<String>,
    },
}

impl Change {
    /// Bytes this change adds to a script call (keys and arguments), roughly.
    pub fn weight(&self, version_prefix_len: usize) -> usize {
        let key = 2 * self.row_key.len() + version_prefix_len + 64;
        key + match &self.body {
            Body::Delete => 0,
            Body::Hash { set, unset } => {
                set.iter()
                    .map(|(f, v)| f.len() + v.len() + 8)
                    .sum::<usize>()
                    + unset.iter().map(|f| f.len() + 4).sum::<usize>()
            }
            Body::Json { row, .. } => row.len() * 16,
        }
    }
}

/// How row keys are built.
#[derive(Debug, Clone)]
pub struct KeyPattern {
    pattern: String,
    separator: String,
}

impl KeyPattern {
    /// A pattern (placeholders checked by the config) and the composite-key separator.
    pub fn new(pattern: &str, separator: &str) -> Self {
        Self {
            pattern: pattern.to_owned(),
            separator: separator.to_owned(),
        }
    }

    /// The row key of `key` for an event of `topic`.
    pub fn render(&self, topic: &str, event: &ChangeEvent, key: &Value) -> String {
        let key_text = match key {
            Value::Object(map) => {
                let mut out = String::new();
                for (i, v) in map.values().enumerate() {
                    if i > 0 {
                        out.push_str(&self.separator);
                    }
                    out.push_str(&text(v).unwrap_or_default());
                }
                out
            }
            other => text(other).unwrap_or_default(),
        };
        let source = |f: &str| event.source.get(f).and_then(Value::as_str).unwrap_or("");
        self.pattern
            .replace("{topic}", topic)
            .replace("{db}", source("db"))
            .replace("{schema}", source("schema"))
            .replace("{table}", source("table"))
            .replace("{key}", &key_text)
    }
}

/// A column's text in a hash field: strings as is, other values as JSON, `None` for null.
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The changes of a batch, or the records that can never be applied.
pub fn plan(
    batch: &Batch,
    layout: Layout,
    keys: &KeyPattern,
) -> Result<Vec<Change>, Vec<RecordFailure>> {
    let mut changes = Vec::with_capacity(batch.len());
    let mut failures = Vec::new();
    for record in batch.records() {
        match change_of(batch.topic(), record, layout, keys) {
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

fn change_of(
    topic: &str,
    record: &Record,
    layout: Layout,
    keys: &KeyPattern,
) -> Result<Option<Change>, String> {
    let Some(event) = record.event() else {
        return Ok(None); // a tombstone record: the delete before it did the work
    };
    let body = match event.op {
        Op::Message => return Ok(None),
        Op::Truncate => {
            return Err("truncate is not applied by the redis sink: clear the table's keys by hand (see the sink's docs)".into())
        }
        Op::Delete => Body::Delete,
        Op::Create | Op::Read | Op::Update => {
            let after = event
                .after
                .as_ref()
                .ok_or_else(|| format!("op `{}` without `after`", event.op.code()))?;
            row_body(after, layout)
        }
    };
    let key = record
        .key
        .as_ref()
        .ok_or("a change without a record key: the redis sink needs the primary key")?;
    Ok(Some(Change {
        offset: record.offset,
        row_key: keys.render(topic, event, key),
        version: encode_version(event.version),
        body,
    }))
}

fn row_body(after: &Map<String, Value>, layout: Layout) -> Body {
    let unavailable = |v: &Value| v.as_str() == Some(UNAVAILABLE_VALUE);
    match layout {
        Layout::Hash => {
            let mut set = Vec::with_capacity(after.len());
            let mut unset = Vec::new();
            for (column, value) in after {
                if unavailable(value) {
                    continue;
                }
                match text(value) {
                    Some(t) => set.push((column.clone(), t)),
                    None => unset.push(column.clone()),
                }
            }
            Body::Hash { set, unset }
        }
        Layout::Json => Body::Json {
            row: after.clone(),
            unavailable: after
                .iter()
                .filter(|(_, v)| unavailable(v))
                .map(|(c, _)| c.clone())
                .collect(),
        },
    }
}

/// The row keys whose stored JSON rows [`merge_json`] needs.
pub fn keys_to_merge(changes: &[Change]) -> Vec<String> {
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
    changes: &mut [Change],
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
    for change in changes.iter_mut() {
        let Some((version, base)) = state.get_mut(&change.row_key) else {
            continue;
        };
        if version
            .as_deref()
            .is_some_and(|v| v >= change.version.as_str())
        {
            continue; // the script will skip it too
        }
        *version = Some(change.version.clone());
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
            Body::Hash { .. } => {}
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
