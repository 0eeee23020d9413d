//! From a batch's records to the changes one script call applies.
//!
//! * `c`, `r`, `u` upsert the row from `after`; `d` deletes it (leaving a
//!   version tombstone); tombstone records (null values) and `m` messages
//!   change nothing; `t` (truncate) removes the table's rows older than it,
//!   found in the table's key set ([`key_set`]), never by a scan of the keyspace.
//! * Row keys come from `key.pattern`; `{key}` is the record key's values in
//!   key order, joined by `key.separator` (strings as is, other values as
//!   JSON), every value escaped so that keys never collide ([`KeyPattern`]).
//! * A column holding [`UNAVAILABLE_VALUE`] (unchanged TOAST) is left out, so
//!   the stored value stays: the hash script does not touch the field, and the
//!   JSON layout merges the stored row in before the call ([`merge_json`]).
//! * Under `value.format = "native"` rows are stored in their users' form
//!   ([`crate::native`], read from the event's Connect schema): dates, times
//!   and timestamps as ISO-8601 text, JSON columns nested in the JSON layout
//!   (a hash field holds their text, as before). Schemaless events stay as
//!   they are: nothing tells a date from a number.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::config::Layout;
use super::keys::{key_set, KeyPattern};
use super::script::{decode_version, write_version};
use crate::error::RecordFailure;
use crate::event::{ChangeEvent, Op};
use crate::mirror::StoredForm;
use crate::native::{Kind, ValueFormat};
use crate::sink::{Batch, Record};

pub use oncely_core::wire::UNAVAILABLE_VALUE;

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
    /// Hash layout: the row replaces the stored hash (non-null columns as
    /// fields), keeping only the stored fields of its unavailable columns
    /// ([`hash_fields`]). Borrowed from the batch unless converted to native form.
    Hash(Cow<'a, Map<String, Value>>),
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

/// A hash row's columns: the fields of the new hash (null columns have
/// none), and the unavailable (unchanged TOAST) columns, whose stored field
/// the script keeps. Every other stored field goes: a column dropped or
/// renamed in the source leaves the cache with the next full row image.
pub fn hash_fields(row: &Map<String, Value>) -> (Vec<(&str, FieldValue<'_>)>, Vec<&str>) {
    let mut set = Vec::with_capacity(row.len());
    let mut keep = Vec::new();
    for (column, value) in row {
        match value {
            Value::Null => {}
            Value::String(s) if s == UNAVAILABLE_VALUE => keep.push(column.as_str()),
            Value::String(s) => set.push((column.as_str(), FieldValue::Str(s))),
            other => set.push((column.as_str(), FieldValue::Json(other))),
        }
    }
    (set, keep)
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

/// How rows are stored: the layout and, under `value.format = "native"`,
/// the conversions of the columns of the last schema seen (a batch's records
/// share theirs, decoded once).
struct Form {
    layout: Layout,
    stored: StoredForm,
    kinds: Option<(Arc<Value>, ColumnKinds)>,
}

/// The columns whose values change in native form, with their [`Kind`].
type ColumnKinds = Vec<(String, Kind)>;

/// How the cache stores values in `layout` and `format`: the hash layout's
/// fields are text, so JSON columns keep their text there.
pub fn stored_form(layout: Layout, format: ValueFormat) -> StoredForm {
    StoredForm {
        values: format,
        nest_json: layout == Layout::Json,
        json_arrays_as_text: false,
    }
}

impl Form {
    /// `row` as stored: in native form when asked and the event has a schema.
    fn row<'r>(
        &mut self,
        event: &ChangeEvent,
        row: &'r Map<String, Value>,
    ) -> Cow<'r, Map<String, Value>> {
        let (ValueFormat::Native, Some(schema)) = (self.stored.values, &event.schema) else {
            return Cow::Borrowed(row);
        };
        if !matches!(&self.kinds, Some((s, _)) if Arc::ptr_eq(s, schema)) {
            let kinds = crate::event::row_fields(Some(schema))
                .map(|fields| self.stored.columns(fields))
                .unwrap_or_default();
            self.kinds = Some((schema.clone(), kinds));
        }
        let kinds = self.kinds.as_ref().map_or(&[][..], |(_, k)| k.as_slice());
        StoredForm::convert(row, kinds)
    }
}

/// The changes of a batch, or the records that can never be applied.
pub fn plan<'a>(
    batch: &'a Batch,
    layout: Layout,
    format: ValueFormat,
    naming: Naming<'_>,
) -> Result<Vec<Change<'a>>, Vec<RecordFailure>> {
    let mut changes = Vec::with_capacity(batch.len());
    let mut failures = Vec::new();
    let mut form = Form {
        layout,
        stored: stored_form(layout, format),
        kinds: None,
    };
    for record in batch.records() {
        match change_of(batch.topic(), record, &mut form, naming) {
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
    form: &mut Form,
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
            if form.layout == Layout::Hash && after.contains_key(version_field) {
                return Err(format!(
                    "column `{version_field}` has the name of the hash field holding the \
                     row's version: set `sink.version.field` to a name no column uses"
                ));
            }
            let row = form.row(event, after);
            match form.layout {
                Layout::Hash => Body::Hash(row),
                Layout::Json => json_body(row.into_owned()),
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

fn json_body(row: Map<String, Value>) -> Body<'static> {
    let unavailable = row
        .iter()
        .filter(|(_, v)| v.as_str() == Some(UNAVAILABLE_VALUE))
        .map(|(c, _)| c.clone())
        .collect();
    Body::Json { row, unavailable }
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
