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
use std::fmt;
use std::sync::Arc;

use redis::RedisWrite;
use serde_json::{Map, Value};

use super::config::Layout;
use super::keys::{key_set, KeyPattern};
use super::script::{decode_version, write_version};
use crate::error::RecordFailure;
use crate::event::{ChangeEvent, Op};
use crate::native::{Kind, ValueFormat};
use crate::sink::{Batch, Record};
use crate::verify_reader::StoredForm;

use oncely_core::wire::UNAVAILABLE_VALUE;

/// One change, owning what it writes (so a batch can be planned ahead in
/// [`crate::Sink::prepare`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
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
    pub body: Body,
}

/// The write of a [`Change`].
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Remove the row, keep its version as a tombstone.
    Delete,
    /// Remove every row of the table (its key set) older than this version.
    Truncate,
    /// Hash layout: the row replaces the stored hash (non-null columns as
    /// fields), keeping only the stored fields of its unavailable columns.
    Hash(HashRow),
    /// JSON layout: the row, and the columns to take from the stored row.
    Json {
        /// The row; its unavailable columns still hold the marker until merged.
        row: Map<String, Value>,
        /// Unchanged TOAST columns, to fill from the stored row.
        unavailable: Vec<String>,
    },
}

impl Change {
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
            Body::Hash(row) => row.fields().map(|(f, v)| f.len() + v.len() + 8).sum(),
            Body::Json { row, .. } => row.len() * 16,
        }
    }
}

/// A hash-layout row, made once: the `HSET` writing it and the names of the
/// fields it sets (null columns get none) and keeps (unavailable, i.e.
/// unchanged TOAST, columns, whose stored field stays). Every other stored
/// field goes: a column dropped or renamed in the source leaves the cache
/// with the next full row image.
#[derive(Clone)]
pub struct HashRow {
    /// `HSET <row key> <version field> <version> <field> <value> ...`:
    /// strings as is, other values as their JSON text.
    pub hset: redis::Cmd,
    /// The fields `hset` sets besides the version, in column order; rows of a
    /// batch with the same names share one list.
    pub names: Arc<[String]>,
    /// The unavailable columns.
    pub keep: Vec<String>,
}

/// Arguments of `HSET` before the row's fields: the command, key, version field, version.
const HSET_HEAD: usize = 4;

impl HashRow {
    fn new(
        row: &Map<String, Value>,
        row_key: &str,
        version_field: &str,
        version: &[u8; 40],
        last_names: &mut Option<Arc<[String]>>,
    ) -> Self {
        // Sized once, roughly (32 bytes a column): growing the buffer field by
        // field costs more than filling it; measuring each value costs too.
        let data = 32 * row.len() + row_key.len() + version_field.len() + 48;
        let mut hset = redis::Cmd::with_capacity(HSET_HEAD + 2 * row.len(), data);
        hset.arg("HSET")
            .arg(row_key)
            .arg(version_field)
            .arg(&version[..]);
        let mut names: Vec<&str> = Vec::with_capacity(row.len());
        let mut keep = Vec::new();
        for (column, value) in row {
            match value {
                Value::Null => continue,
                Value::String(s) if s == UNAVAILABLE_VALUE => {
                    keep.push(column.clone());
                    continue;
                }
                Value::String(s) => hset.arg(column.as_str()).arg(s.as_str()),
                other => {
                    hset.arg(column.as_str());
                    hset.write_arg_fmt(other);
                    &mut hset
                }
            };
            names.push(column);
        }
        Self {
            hset,
            names: intern(last_names, &names),
            keep,
        }
    }

    /// The (name, value) of each field the row sets, as written.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut args = self.hset.args_iter().skip(HSET_HEAD).map(|a| match a {
            redis::Arg::Simple(bytes) => bytes,
            _ => &[], // only simple arguments are written
        });
        std::iter::from_fn(move || Some((args.next()?, args.next()?)))
    }
}

impl fmt::Debug for HashRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<(Cow<'_, str>, Cow<'_, str>)> = self
            .fields()
            .map(|(n, v)| (String::from_utf8_lossy(n), String::from_utf8_lossy(v)))
            .collect();
        f.debug_struct("HashRow")
            .field("fields", &fields)
            .field("keep", &self.keep)
            .finish()
    }
}

impl PartialEq for HashRow {
    fn eq(&self, other: &Self) -> bool {
        self.hset.args_iter().eq(other.hset.args_iter()) && self.keep == other.keep
    }
}

/// `names` as a shared list, the last one's when equal (rows of a table
/// usually have the same columns, so a batch and the cache hold one list for them).
pub(super) fn intern(last: &mut Option<Arc<[String]>>, names: &[&str]) -> Arc<[String]> {
    if let Some(l) = last {
        if l.len() == names.len() && l.iter().zip(names).all(|(a, b)| a == b) {
            return l.clone();
        }
    }
    let list: Arc<[String]> = names.iter().map(|n| (*n).to_owned()).collect();
    *last = Some(list.clone());
    list
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
    /// The field names of the last hash row.
    names: Option<Arc<[String]>>,
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
pub fn plan(
    batch: &Batch,
    layout: Layout,
    format: ValueFormat,
    naming: Naming<'_>,
) -> Result<Vec<Change>, Vec<RecordFailure>> {
    let mut changes = Vec::with_capacity(batch.len());
    let mut failures = Vec::new();
    let mut form = Form {
        layout,
        stored: stored_form(layout, format),
        kinds: None,
        names: None,
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

fn change_of(
    topic: &str,
    record: &Record,
    form: &mut Form,
    naming: Naming<'_>,
) -> Result<Option<Change>, String> {
    let Some(event) = record.event() else {
        return Ok(None); // a tombstone record: the delete before it did the work
    };
    let version_field = naming.version_field;
    let key_set = key_set(naming.keyset_prefix, topic, event);
    let mut version = [0u8; 40];
    write_version(event.version, &mut version);
    let row = match event.op {
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
        Op::Delete => None,
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
            Some(form.row(event, after))
        }
    };
    let key = record
        .key
        .as_ref()
        .ok_or("a change without a record key: the redis sink needs the primary key")?;
    let row_key = naming.keys.render(topic, event, key);
    let body = match (row, form.layout) {
        (None, _) => Body::Delete,
        (Some(row), Layout::Hash) => Body::Hash(HashRow::new(
            &row,
            &row_key,
            version_field,
            &version,
            &mut form.names,
        )),
        (Some(row), Layout::Json) => json_body(row.into_owned()),
    };
    Ok(Some(Change {
        offset: record.offset,
        row_key,
        key_set,
        version,
        body,
    }))
}

fn json_body(row: Map<String, Value>) -> Body {
    let unavailable = row
        .iter()
        .filter(|(_, v)| v.as_str() == Some(UNAVAILABLE_VALUE))
        .map(|(c, _)| c.clone())
        .collect();
    Body::Json { row, unavailable }
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
