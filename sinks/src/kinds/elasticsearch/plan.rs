//! From a batch to one write per document: index name, document id, event
//! version, and what to write.
//!
//! Events of one key inside a batch are folded into a single write carrying
//! the newest version (an older or repeated one is dropped, see [`fold`]): the
//! result equals applying them one by one, since Elasticsearch keeps only the
//! newest anyway. Values
//! marked unavailable (unchanged TOAST) are taken from an earlier event of the
//! same key in the batch when there is one, else left to be read from the
//! stored document (see [`super::merge`]). Rows are written in their
//! index's form ([`super::values`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::config::{DeleteMode, ElasticsearchConfig};
use super::values::{columns, document, Columns, Format};
use crate::error::RecordFailure;
use crate::event::{replaces, ChangeEvent, Op, Version};
use crate::sink::{Batch, Record};

/// Elasticsearch's limit on an index name, in bytes.
pub const MAX_INDEX_BYTES: usize = 255;
/// Elasticsearch's limit on `_id`, in bytes.
pub const MAX_ID_BYTES: usize = 512;

/// What to do with one document.
#[derive(Debug, Clone, PartialEq)]
pub enum Action<'a> {
    /// Index `doc`; the fields in `missing` must be taken from the stored document.
    Index {
        /// The document (the row), without unavailable values.
        doc: Cow<'a, Map<String, Value>>,
        /// Columns whose value was unavailable and is not in the batch.
        missing: Vec<String>,
    },
    /// A versioned delete (`delete.mode = delete`).
    Delete,
    /// `delete.mode = soft`: keep the stored document with the flag set; `fallback`
    /// (the before image) is written when nothing is stored.
    SoftDelete {
        /// The before image, used when the document is not stored.
        fallback: Cow<'a, Map<String, Value>>,
    },
}

/// One write: where, which version, what, and the record it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Write<'a> {
    /// Target index.
    pub index: String,
    /// Document id (the primary key).
    pub id: String,
    /// Version of the newest event folded in.
    pub version: Version,
    /// The write.
    pub action: Action<'a>,
    /// Offset of the event whose version is written (the one dead-lettered if the write is rejected).
    pub offset: i64,
}

impl Write<'_> {
    /// True when the stored document must be read first (TOAST merge, soft delete).
    pub fn needs_stored(&self) -> bool {
        match &self.action {
            Action::Index { missing, .. } => !missing.is_empty(),
            Action::Delete => false,
            Action::SoftDelete { .. } => true,
        }
    }
}

/// A truncate: the documents of `index` older than `version` go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Target index.
    pub index: String,
    /// Version of the truncate.
    pub version: Version,
    /// Offset of the truncate record.
    pub offset: i64,
}

/// The writes of a batch in first-seen order, its truncates, and the records
/// that can never be applied.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    /// One write per (index, id).
    pub writes: Vec<Write<'a>>,
    /// Truncates in offset order, applied after the batch's writes (a write
    /// older than a truncate must not land after it; newer ones it leaves).
    pub truncates: Vec<Truncate>,
    /// Records rejected before any request (no key, bad version, truncate, ...).
    pub rejected: Vec<RecordFailure>,
}

/// Builds the plan of `batch`, every index in the configured form.
pub fn plan<'a>(batch: &'a Batch, config: &ElasticsearchConfig) -> Plan<'a> {
    plan_with(batch, config, &|_| Format::of_config(config))
}

/// The converted columns of the schemas and forms of a batch, each worked
/// out once (a table's events share their schema).
#[derive(Default)]
struct ColumnCache(Vec<(Option<Arc<Value>>, Format, Rc<Columns>)>);

impl ColumnCache {
    fn get(&mut self, schema: &Option<Arc<Value>>, format: Format) -> Rc<Columns> {
        let same = |s: &Option<Arc<Value>>| match (s, schema) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if let Some((_, _, c)) = self.0.iter().find(|(s, f, _)| same(s) && *f == format) {
            return c.clone();
        }
        let c = Rc::new(columns(schema.as_deref(), format));
        self.0.push((schema.clone(), format, c.clone()));
        c
    }
}

/// Builds the plan of `batch`, each index in the form `format_of` gives.
/// Tombstones and logical messages need no write.
pub fn plan_with<'a>(
    batch: &'a Batch,
    config: &ElasticsearchConfig,
    format_of: &dyn Fn(&str) -> Format,
) -> Plan<'a> {
    let mut out = Plan::default();
    let mut cache = ColumnCache::default();
    let mut slots: HashMap<(String, String), usize> = HashMap::new();
    for record in batch.records() {
        let Some(event) = record.event() else {
            continue; // a tombstone: the delete event before it did the work
        };
        match event.op {
            Op::Message => continue,
            Op::Truncate => {
                match event_index(&config.index_pattern, batch.topic(), event) {
                    Ok(index) => out.truncates.push(Truncate {
                        index,
                        version: event.version,
                        offset: record.offset,
                    }),
                    Err(e) => out.rejected.push(RecordFailure::new(record.offset, e)),
                }
                continue;
            }
            Op::Create | Op::Read | Op::Update | Op::Delete => {}
        }
        let write = match write_of(batch, record, event, config, &mut |index| {
            cache.get(&event.schema, format_of(index))
        }) {
            Ok(w) => w,
            Err(reason) => {
                out.rejected.push(RecordFailure::new(record.offset, reason));
                continue;
            }
        };
        let slot = (write.index.clone(), write.id.clone());
        match slots.get(&slot).and_then(|&i| out.writes.get_mut(i)) {
            Some(prev) => fold(prev, write, &config.soft_delete_field),
            None => {
                slots.insert(slot, out.writes.len());
                out.writes.push(write);
            }
        }
    }
    out
}

/// Replaces `prev` by `next`, filling `next`'s unavailable values from `prev`'s document.
/// Keeps the newer of two writes of one document. Deliveries may repeat or go
/// back in version (a replayed or duplicated change), so offset order is not
/// enough: an older or equal version is dropped, as Elasticsearch would.
/// A newer write takes its unavailable values from the older one, and a soft
/// delete after an indexed version keeps that version's document, flagged.
fn fold<'a>(prev: &mut Write<'a>, mut next: Write<'a>, flag: &str) {
    if !replaces(next.version, prev.version) {
        return;
    }
    match (&mut prev.action, &mut next.action) {
        (Action::Index { doc: old, .. }, Action::Index { doc, missing }) => {
            missing.retain(|field| match old.get(field) {
                Some(v) => {
                    doc.to_mut().insert(field.clone(), v.clone());
                    false
                }
                None => true,
            });
        }
        (Action::Index { doc: old, missing }, Action::SoftDelete { .. }) => {
            let mut doc = std::mem::take(old);
            doc.to_mut().insert(flag.to_owned(), Value::Bool(true));
            next.action = Action::Index {
                doc,
                missing: std::mem::take(missing),
            };
        }
        _ => {}
    }
    *prev = next;
}

fn write_of<'a>(
    batch: &Batch,
    record: &'a Record,
    event: &'a ChangeEvent,
    config: &ElasticsearchConfig,
    columns_of: &mut dyn FnMut(&str) -> Rc<Columns>,
) -> Result<Write<'a>, String> {
    let key = record
        .key
        .as_ref()
        .ok_or("record without a key: the table needs a primary key")?;
    let id = document_id(key)?;
    let index = event_index(&config.index_pattern, batch.topic(), event)?;
    let columns = columns_of(&index);
    for row in [&event.before, &event.after].into_iter().flatten() {
        if let Some(field) = config.bookkeeping_fields().find(|f| row.contains_key(*f)) {
            return Err(format!(
                "column `{field}` has the name of a field holding the document's version: \
                 set `sink.version.field`, `sink.version.lsn.field` and \
                 `sink.version.seq.field` to names no column uses"
            ));
        }
    }
    let action = match (event.op, config.delete_mode) {
        (Op::Delete, DeleteMode::Delete) => Action::Delete,
        (Op::Delete, DeleteMode::Soft) => {
            // A tombstone standing for its delete carries no row image: the
            // key columns are the fallback document then.
            let before = event
                .before
                .as_ref()
                .or_else(|| key.as_object())
                .ok_or("delete without `before`")?;
            let (mut fallback, _) = document(before, &columns)?;
            fallback
                .to_mut()
                .insert(config.soft_delete_field.clone(), Value::Bool(true));
            Action::SoftDelete { fallback }
        }
        _ => {
            let after = event.after.as_ref().ok_or("change without `after`")?;
            let (mut doc, missing) = document(after, &columns)?;
            if config.delete_mode == DeleteMode::Soft {
                doc.to_mut()
                    .insert(config.soft_delete_field.clone(), Value::Bool(false));
            }
            Action::Index { doc, missing }
        }
    };
    Ok(Write {
        index,
        id,
        version: event.version,
        action,
        offset: record.offset,
    })
}

/// The document id of a primary key: a single column's value as text (strings as
/// they are), a composite key as the JSON array of its values in key order.
pub fn document_id(key: &Value) -> Result<String, String> {
    match key {
        Value::Object(fields) if !fields.is_empty() => {
            document_id_of(&fields.values().collect::<Vec<_>>())
        }
        other => Err(format!("key must be a non-empty JSON object, got {other}")),
    }
}

/// The document id of a primary key's values in key order ([`document_id`];
/// `oncely verify` derives the ids it looks up with it).
pub fn document_id_of(values: &[&Value]) -> Result<String, String> {
    let id = match values {
        [] | [Value::Null] => return Err("primary key value is null".into()),
        [Value::String(s)] => s.clone(),
        [one] => one.to_string(),
        many => Value::Array(many.iter().map(|v| (*v).clone()).collect()).to_string(),
    };
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(format!(
            "document id is {} bytes; Elasticsearch accepts 1 to {MAX_ID_BYTES}",
            id.len()
        ));
    }
    Ok(id)
}

/// The index of an event's table ([`index_name`]).
pub fn event_index(pattern: &str, topic: &str, event: &ChangeEvent) -> Result<String, String> {
    let db = event.source.get("db").and_then(Value::as_str).unwrap_or("");
    index_name(
        pattern,
        topic,
        db,
        event.schema_name().unwrap_or(""),
        event.table().unwrap_or(""),
    )
}

/// The index of a table: `index.pattern` with its placeholders replaced,
/// lower-cased (Elasticsearch takes no upper case). The one function the
/// sink and `oncely verify` name indexes with. A name Elasticsearch would
/// refuse (longer than [`MAX_INDEX_BYTES`], a forbidden character, a
/// forbidden first character) is an error naming `index.pattern`, never
/// shortened: a shortened name could be another table's.
pub fn index_name(
    pattern: &str,
    topic: &str,
    db: &str,
    schema: &str,
    table: &str,
) -> Result<String, String> {
    let name = pattern
        .replace("{topic}", topic)
        .replace("{db}", db)
        .replace("{schema}", schema)
        .replace("{table}", table)
        .to_lowercase();
    let refuse = |why: &str| {
        Err(format!(
            "index name {name:?} (from sink.index.pattern {pattern:?} for {schema}.{table}) {why}: change sink.index.pattern (e.g. to \"{{topic}}\", whose characters are always allowed), or give the table a shorter topic with capture's topic.name.mapping"
        ))
    };
    if name.len() > MAX_INDEX_BYTES {
        return refuse(&format!(
            "is {} bytes, longer than Elasticsearch's limit of {MAX_INDEX_BYTES}",
            name.len()
        ));
    }
    if name.is_empty() || name == "." || name == ".." {
        return refuse("is not a valid index name");
    }
    if name.starts_with(['-', '_', '+']) {
        return refuse("starts with '-', '_' or '+', which Elasticsearch refuses");
    }
    if let Some(c) = name.chars().find(|c| {
        matches!(
            c,
            '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ' ' | ',' | '#' | ':'
        )
    }) {
        return refuse(&format!(
            "contains {c:?}, which Elasticsearch refuses in index names"
        ));
    }
    Ok(name)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
