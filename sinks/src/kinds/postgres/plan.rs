//! From a batch to the writes it needs: rows per target table collapsed to the
//! newest change per key, history rows, truncates in their place. Pure: no I/O.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use super::config::{expand_name, PostgresConfig};
use super::generation::stored_identifier;
use super::rows::{Matcher, NameMap, Row, Shape};
use super::source_ids::{source_table, SourceTable};
use super::types::{from_schema, infer, ColumnSpec};
use crate::error::RecordFailure;
use crate::event::row_fields;
use crate::event::{replaces, ChangeEvent, Op, Version};
use crate::sink::{Batch, Record};

use oncely_core::wire::UNAVAILABLE_VALUE as UNAVAILABLE;

/// One change for the history table.
#[derive(Debug, Clone)]
pub struct HistoryRow {
    /// Kafka offset.
    pub offset: i64,
    /// Source position.
    pub version: Version,
    /// `op` code.
    pub op: &'static str,
    /// The record key, the row images and the `source` block as JSON text.
    pub key: Option<String>,
    /// `before` as JSON text.
    pub before: Option<String>,
    /// `after` as JSON text.
    pub after: Option<String>,
    /// `source` as JSON text.
    pub source: String,
    /// Envelope `ts_ms`.
    pub ts_ms: Option<i64>,
}

/// Rows of one target table, newest per key.
#[derive(Debug, Default)]
pub struct TableRows {
    /// Key (serialized) -> newest row. Fx hashing: the keys are short byte
    /// strings built here, and SipHash showed in profiles.
    pub rows: FxHashMap<Vec<u8>, Row>,
    /// The shape of the previous row, reused by rows like it.
    last: Option<Arc<Shape>>,
}

/// A unit of work, applied in order inside the batch's transaction.
#[derive(Debug)]
pub enum Step {
    /// Upserts (and deletes) per target table.
    Rows(BTreeMap<String, TableRows>),
    /// A truncate of one target table at a version.
    Truncate {
        /// Target table.
        table: String,
        /// The truncate's version.
        version: Version,
    },
}

/// Everything a batch writes. Owns its data (rows refer to records by index),
/// so it can be built by [`Sink::prepare`](crate::Sink::prepare) and stored in the batch.
#[derive(Debug, Default)]
pub struct Plan {
    /// Upserts and truncates, in order.
    pub steps: Vec<Step>,
    /// History rows per history table.
    pub history: BTreeMap<String, Vec<HistoryRow>>,
    /// Records that can never be applied.
    pub rejected: Vec<RecordFailure>,
}

#[cfg(test)]
impl Shape {
    /// The shape of an upsert of `fields` (name, attnum; the first is the
    /// key) from source table `oid` whose dropped attnums are `dropped`.
    pub fn with_attnums(fields: &[(&str, i16)], oid: u32, dropped: &[i16]) -> Shape {
        let entries = fields
            .iter()
            .map(|(name, attnum)| {
                let field = serde_json::json!({"type": "string",
                    "parameters": {super::types::PARAM_ATTNUM: attnum.to_string()}});
                ((*name).to_owned(), Some(from_schema(&field)), false)
            })
            .collect();
        let source = SourceTable {
            oid,
            dropped: dropped.to_vec(),
        };
        shape_of(vec![fields[0].0.to_owned()], entries, false, Some(source))
    }
}

impl Plan {
    /// This plan with the shapes of each table's rows replaced where
    /// `shape_for(table, row)` gives another (fields renamed to the target
    /// columns by attnum, or to a retired column generation).
    pub fn translated(&self, shape_for: impl Fn(&str, &Row) -> Option<Arc<Shape>>) -> Plan {
        let steps = self
            .steps
            .iter()
            .map(|step| match step {
                Step::Rows(tables) => Step::Rows(
                    tables
                        .iter()
                        .map(|(table, rows)| {
                            let rows = rows
                                .rows
                                .iter()
                                .map(|(id, row)| {
                                    let mut row = row.clone();
                                    if let Some(shape) = shape_for(table, &row) {
                                        for (c, _) in &mut row.fills {
                                            if let Some((t, _)) =
                                                shape.renamed.iter().find(|(_, f)| f == c)
                                            {
                                                *c = t.clone();
                                            }
                                        }
                                        row.fills.retain(|(c, _)| shape.has_value(c));
                                        row.shape = shape;
                                    }
                                    (id.clone(), row)
                                })
                                .collect();
                            (table.clone(), TableRows { rows, last: None })
                        })
                        .collect(),
                ),
                Step::Truncate { table, version } => Step::Truncate {
                    table: table.clone(),
                    version: *version,
                },
            })
            .collect();
        Plan {
            steps,
            history: self.history.clone(),
            rejected: self.rejected.clone(),
        }
    }
}

/// Builds the plan of `batch`.
pub fn plan(config: &PostgresConfig, batch: &Batch) -> Plan {
    let mut out = Plan::default();
    let mut pending: BTreeMap<String, TableRows> = BTreeMap::new();
    let mut names_cache: Option<((String, String), Rc<TargetNames>)> = None;
    for (index, record) in batch.records().iter().enumerate() {
        let Some(event) = record.event() else {
            continue; // the key's Kafka tombstone: the delete before it did the work
        };
        if event.op == Op::Message {
            continue;
        }
        let cached = names_cache.as_ref().filter(|((schema, table), _)| {
            event.schema_name() == Some(schema.as_str()) && event.table() == Some(table.as_str())
        });
        let names = match cached
            .map(|(_, names)| Ok(Rc::clone(names)))
            .unwrap_or_else(|| {
                let names = Rc::new(target_names(config, batch.topic(), event)?);
                if let (Some(schema), Some(table)) = (event.schema_name(), event.table()) {
                    names_cache = Some(((schema.to_owned(), table.to_owned()), Rc::clone(&names)));
                }
                Ok::<_, String>(names)
            }) {
            Ok(n) => n,
            Err(reason) => {
                out.rejected.push(RecordFailure::new(record.offset, reason));
                continue;
            }
        };
        if config.history_enabled {
            let row = history_row(record, event);
            match out.history.get_mut(&names.1) {
                Some(rows) => rows.push(row),
                None => {
                    out.history.insert(names.1.clone(), vec![row]);
                }
            }
        }
        if !config.upsert_enabled {
            continue;
        }
        if event.op == Op::Truncate {
            if !pending.is_empty() {
                out.steps.push(Step::Rows(std::mem::take(&mut pending)));
            }
            out.steps.push(Step::Truncate {
                table: names.0.clone(),
                version: event.version,
            });
            continue;
        }
        let table = match pending.get_mut(&names.0) {
            Some(table) => table,
            None => pending.entry(names.0.clone()).or_default(),
        };
        match row_of(index, record, event, table.last.as_ref()) {
            Ok(row) => {
                if row.shape.matcher.is_some() {
                    table.last = Some(Arc::clone(&row.shape));
                }
                collapse(batch.records(), table, row);
            }
            Err(reason) => out.rejected.push(RecordFailure::new(record.offset, reason)),
        }
    }
    if !pending.is_empty() {
        out.steps.push(Step::Rows(pending));
    }
    out
}

/// (target table, history table).
type TargetNames = (String, String);

/// (target table, history table) for an event.
fn target_names(
    config: &PostgresConfig,
    topic: &str,
    event: &ChangeEvent,
) -> Result<(String, String), String> {
    let (Some(schema), Some(table)) = (event.schema_name(), event.table()) else {
        return Err("the event has no `source.schema` / `source.table`".into());
    };
    let expand = |format: &str| {
        expand_name(format, topic, schema, table).ok_or_else(|| {
            format!("target name from `{format}` for {schema}.{table} exceeds 63 bytes")
        })
    };
    Ok((
        expand(&config.table_name_format)?,
        expand(&config.history_table_name_format)?,
    ))
}

fn history_row(record: &Record, event: &ChangeEvent) -> HistoryRow {
    let json =
        |m: &Option<Map<String, Value>>| m.as_ref().map(|m| Value::Object(m.clone()).to_string());
    HistoryRow {
        offset: record.offset,
        version: event.unique_position(record.partition(), record.offset),
        op: event.op.code(),
        key: record.key.as_ref().map(Value::to_string),
        before: json(&event.before),
        after: json(&event.after),
        source: Value::Object(event.source.clone()).to_string(),
        ts_ms: event.ts_ms,
    }
}

fn row_of(
    index: usize,
    record: &Record,
    event: &ChangeEvent,
    last: Option<&Arc<Shape>>,
) -> Result<Row, String> {
    let key = match &record.key {
        Some(Value::Object(k)) if !k.is_empty() => k,
        Some(_) => return Err("the record key is not a JSON object of key columns".into()),
        None => return Err("the record has no key: a table without a primary key cannot be upserted (use history mode)".into()),
    };
    let fields = row_fields(event.schema.as_deref());
    let field = |name: &str| fields.as_ref().and_then(|f| f.get(name).copied());
    let source = source_table(event.schema.as_deref());
    // A shape is reused only for the same source table.
    let last = last.filter(|l| l.source.as_deref() == source.as_ref());
    let spec_of = |name: &str, value: &Value| match field(name) {
        Some(field) => Some(from_schema(field)),
        None => infer(value),
    };
    let row = |shape: Arc<Shape>| Row {
        record: index,
        offset: record.offset,
        version: event.version,
        shape,
        fills: Vec::new(),
    };
    let key_order: Vec<String>;
    let mut entries: Vec<(String, Option<ColumnSpec>, bool)>;
    if event.op == Op::Delete {
        let before = event.before.as_ref();
        let spec = |name: &str, value: &Value| {
            let image = before.and_then(|b| b.get(name)).unwrap_or(value);
            spec_of(name, image)
        };
        if let Some(m) = last.and_then(|s| s.matcher.as_ref().filter(|_| s.values.is_none())) {
            if m.key.len() == key.len()
                && key
                    .iter()
                    .zip(&m.entries)
                    .all(|((k, v), (n, s, _))| k == n && spec(k, v) == *s)
            {
                return Ok(row(Arc::clone(last.expect("matched"))));
            }
        }
        key_order = key.keys().cloned().collect();
        entries = key
            .iter()
            .map(|(k, v)| (k.clone(), spec(k, v), false))
            .collect();
        let shape = within_identifier_limit(shape_of(key_order, entries, true, source))?;
        return Ok(row(Arc::new(shape)));
    }
    let after = event
        .after
        .as_ref()
        .ok_or_else(|| format!("op `{}` without `after`", event.op.code()))?;
    let entry = |name: &str, value: &Value| {
        if value.as_str() == Some(UNAVAILABLE) {
            (field(name).map(from_schema), true)
        } else {
            (spec_of(name, value), false)
        }
    };
    if let Some(m) = last.and_then(|s| s.matcher.as_ref().filter(|_| s.values.is_some())) {
        if m.key.len() == key.len()
            && m.entries.len() == after.len()
            && key.keys().zip(&m.key).all(|(a, b)| a == b)
            && after
                .iter()
                .zip(&m.entries)
                .all(|((name, value), (n, s, u))| {
                    name == n && {
                        let (spec, unavailable) = entry(name, value);
                        unavailable == *u && spec == *s
                    }
                })
        {
            return Ok(row(Arc::clone(last.expect("matched"))));
        }
    }
    key_order = key.keys().cloned().collect();
    entries = Vec::with_capacity(after.len());
    for (name, value) in after {
        let (spec, unavailable) = entry(name, value);
        entries.push((name.clone(), spec, unavailable));
    }
    let shape = within_identifier_limit(shape_of(key_order, entries, false, source))?;
    let values = shape.values.as_ref().expect("not a delete");
    for name in &shape.key {
        if values.binary_search(name).is_err() {
            return Err(format!("key column `{name}` is missing from `after`"));
        }
    }
    Ok(row(Arc::new(shape)))
}

/// `shape` with each field name longer than PostgreSQL's 63 bytes cut as
/// PostgreSQL cuts it in every statement, so the sink's catalog, its
/// statements and verify name the column PostgreSQL holds (values are
/// still read under the field's own name). Two fields cut to one name are
/// the record's failure: they would be one column.
fn within_identifier_limit(shape: Shape) -> Result<Shape, String> {
    let names = || {
        shape
            .key
            .iter()
            .chain(shape.specs.keys())
            .chain(shape.values.iter().flatten())
            .chain(&shape.unavailable)
    };
    if names().all(|n| stored_identifier(n).len() == n.len()) {
        return Ok(shape);
    }
    let mut cut: BTreeMap<&str, &str> = BTreeMap::new();
    for name in names() {
        let stored = stored_identifier(name);
        match cut.insert(stored, name) {
            Some(other) if other != name => {
                return Err(format!(
                    "columns `{other}` and `{name}` are one column `{stored}` in PostgreSQL, which cuts names to 63 bytes: rename one in the source (or leave one out with column.exclude.list)"
                ))
            }
            _ => {}
        }
    }
    let map: NameMap = names()
        .filter(|n| stored_identifier(n).len() < n.len())
        .map(|n| (n.clone(), Some(stored_identifier(n).to_owned())))
        .collect();
    Ok(shape.translated(&map))
}

/// The shape of a row from its key columns and after-image entries (name,
/// spec, unavailable), both in the record's order.
fn shape_of(
    key_order: Vec<String>,
    entries: Vec<(String, Option<ColumnSpec>, bool)>,
    delete: bool,
    source: Option<SourceTable>,
) -> Shape {
    let mut key = key_order.clone();
    key.sort();
    let mut specs = BTreeMap::new();
    let mut values = Vec::new();
    let mut unavailable = Vec::new();
    for (name, spec, unav) in &entries {
        if let Some(spec) = spec {
            specs.insert(name.clone(), spec.clone());
        }
        if *unav {
            unavailable.push(name.clone());
        } else {
            values.push(name.clone());
        }
    }
    values.sort();
    values.dedup();
    Shape {
        key,
        values: (!delete).then_some(values),
        unavailable,
        specs,
        matcher: Some(Matcher {
            key: key_order,
            entries,
        }),
        source: source.map(Arc::new),
        renamed: Vec::new(),
    }
}

/// Keeps the newest row per key; an unavailable value of the newest is taken from
/// an older change of the same batch when that one carried it.
fn collapse(records: &[Record], table: &mut TableRows, mut row: Row) {
    let mut id = Vec::with_capacity(16);
    if let Some(Value::Object(key)) = &records[row.record].key {
        // The key columns in sorted order, as the shape lists them.
        for name in &row.shape.key {
            if let Some(value) = key.get(name) {
                push_key_part(&mut id, value);
            }
        }
    }
    match table.rows.entry(id) {
        Entry::Vacant(slot) => {
            slot.insert(row);
        }
        Entry::Occupied(mut slot) => {
            let old = slot.get();
            if !replaces(row.version, old.version) {
                return;
            }
            if !row.is_delete() && !old.is_delete() && !row.shape.unavailable.is_empty() {
                fill(&mut row, old);
            }
            slot.insert(row);
        }
    }
}

/// Takes the unavailable columns of `row` that `old` (an older change of its key) carried.
fn fill(row: &mut Row, old: &Row) {
    let filled: Vec<&String> = row
        .shape
        .unavailable
        .iter()
        .filter(|c| old.shape.has_value(c))
        .collect();
    if filled.is_empty() {
        return;
    }
    let mut shape = Shape::clone(&row.shape);
    shape.matcher = None;
    let values = shape.values.as_mut().expect("not a delete");
    for c in &filled {
        values.push((*c).clone());
        if let Some(spec) = old.shape.specs.get(*c) {
            shape.specs.insert((*c).clone(), spec.clone());
        }
        let source = old
            .fills
            .iter()
            .find(|(f, _)| f == *c)
            .map_or(old.record, |(_, i)| *i);
        row.fills.push(((*c).clone(), source));
    }
    values.sort();
    values.dedup();
    shape.unavailable.retain(|c| !filled.contains(&c));
    row.shape = Arc::new(shape);
}

/// Appends one key value to a row's identity so that different key tuples never
/// give the same bytes: integers (the usual keys) as a tag and their 8 bytes,
/// strings as a tag, their length and their bytes, anything else likewise as JSON.
fn push_key_part(id: &mut Vec<u8>, value: &Value) {
    let mut tagged = |tag: u8, bytes: &[u8]| {
        id.push(tag);
        id.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        id.extend_from_slice(bytes);
    };
    match value {
        Value::Number(n) if n.is_i64() => {
            id.push(b'i');
            id.extend_from_slice(&n.as_i64().unwrap_or_default().to_le_bytes());
        }
        Value::String(s) => tagged(b's', s.as_bytes()),
        other => tagged(b'j', other.to_string().as_bytes()),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
