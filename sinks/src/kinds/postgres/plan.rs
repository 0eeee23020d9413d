//! From a batch to the writes it needs: rows per target table collapsed to the
//! newest change per key, history rows, truncates in their place. Pure: no I/O.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde_json::{Map, Value};

use super::config::{expand_name, PostgresConfig};
use super::types::{from_schema, infer, row_fields, ColumnSpec};
use crate::error::RecordFailure;
use crate::event::{ChangeEvent, Op, Version};
use crate::sink::{Batch, Record};

/// The string capture (and Debezium) put in place of an unchanged TOASTed value.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// The newest change of one key in the batch.
///
/// Borrows names and values from the batch's records: nothing is copied per row.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    /// Offset of the record the row comes from (the newest of its key).
    pub offset: i64,
    /// The row's version.
    pub version: Version,
    /// Key columns and values, by name (sorted).
    pub key: BTreeMap<&'a str, &'a Value>,
    /// `None` for a delete; otherwise every column of the after image, unavailable ones removed.
    pub values: Option<BTreeMap<&'a str, &'a Value>>,
    /// Columns whose value was unavailable (unchanged TOAST): the stored value stays.
    pub unavailable: Vec<&'a str>,
    /// Column types as the event describes them (or inferred), for new columns.
    pub specs: BTreeMap<&'a str, ColumnSpec>,
}

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
pub struct TableRows<'a> {
    /// Key (serialized) -> newest row.
    pub rows: HashMap<String, Row<'a>>,
}

/// A unit of work, applied in order inside the batch's transaction.
#[derive(Debug)]
pub enum Step<'a> {
    /// Upserts (and deletes) per target table.
    Rows(BTreeMap<String, TableRows<'a>>),
    /// A truncate of one target table at a version.
    Truncate {
        /// Target table.
        table: String,
        /// The truncate's version.
        version: Version,
    },
}

/// Everything a batch writes.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    /// Upserts and truncates, in order.
    pub steps: Vec<Step<'a>>,
    /// History rows per history table.
    pub history: BTreeMap<String, Vec<HistoryRow>>,
    /// Records that can never be applied.
    pub rejected: Vec<RecordFailure>,
}

/// Builds the plan of `batch`.
pub fn plan<'a>(config: &PostgresConfig, batch: &'a Batch) -> Plan<'a> {
    let mut out = Plan::default();
    let mut pending: BTreeMap<String, TableRows> = BTreeMap::new();
    let mut names_cache: Option<((String, String), Rc<TargetNames>)> = None;
    for record in batch.records() {
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
        match row_of(record, event) {
            Ok(row) => match pending.get_mut(&names.0) {
                Some(table) => collapse(table, row),
                None => collapse(pending.entry(names.0.clone()).or_default(), row),
            },
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
        version: event.version,
        op: event.op.code(),
        key: record.key.as_ref().map(Value::to_string),
        before: json(&event.before),
        after: json(&event.after),
        source: Value::Object(event.source.clone()).to_string(),
        ts_ms: event.ts_ms,
    }
}

fn row_of<'a>(record: &'a Record, event: &'a ChangeEvent) -> Result<Row<'a>, String> {
    let key = match &record.key {
        Some(Value::Object(k)) if !k.is_empty() => k,
        Some(_) => return Err("the record key is not a JSON object of key columns".into()),
        None => return Err("the record has no key: a table without a primary key cannot be upserted (use history mode)".into()),
    };
    let key: BTreeMap<&str, &Value> = key.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let fields = row_fields(event.schema.as_deref());
    let spec_of =
        |name: &str, value: &Value| match fields.as_ref().and_then(|f| f.get(name).copied()) {
            Some(field) => Some(from_schema(field)),
            None => infer(value),
        };
    let mut specs = BTreeMap::new();
    if event.op == Op::Delete {
        let before = event.before.as_ref();
        for (name, value) in &key {
            let image = before.and_then(|b| b.get(*name)).unwrap_or(value);
            if let Some(spec) = spec_of(name, image) {
                specs.insert(*name, spec);
            }
        }
        return Ok(Row {
            offset: record.offset,
            version: event.version,
            key,
            values: None,
            unavailable: Vec::new(),
            specs,
        });
    }
    let after = event
        .after
        .as_ref()
        .ok_or_else(|| format!("op `{}` without `after`", event.op.code()))?;
    let mut values = BTreeMap::new();
    let mut unavailable = Vec::new();
    for (name, value) in after {
        if value.as_str() == Some(UNAVAILABLE) {
            if let Some(field) = fields.as_ref().and_then(|f| f.get(name.as_str()).copied()) {
                specs.insert(name.as_str(), from_schema(field));
            }
            unavailable.push(name.as_str());
            continue;
        }
        if let Some(spec) = spec_of(name, value) {
            specs.insert(name.as_str(), spec);
        }
        values.insert(name.as_str(), value);
    }
    for name in key.keys() {
        if !values.contains_key(name) {
            return Err(format!("key column `{name}` is missing from `after`"));
        }
    }
    Ok(Row {
        offset: record.offset,
        version: event.version,
        key,
        values: Some(values),
        unavailable,
        specs,
    })
}

/// Keeps the newest row per key; an unavailable value of the newest is taken from
/// an older change of the same batch when that one carried it.
fn collapse<'a>(table: &mut TableRows<'a>, mut row: Row<'a>) {
    let mut id = String::new();
    for value in row.key.values() {
        push_key_part(&mut id, value);
    }
    match table.rows.remove(&id) {
        None => {}
        Some(old) if old.version > row.version => row = old,
        Some(old) => {
            if let (Some(new_values), Some(old_values)) = (row.values.as_mut(), old.values) {
                row.unavailable.retain(|c| match old_values.get(c) {
                    Some(v) => {
                        new_values.insert(c, v);
                        if let Some(spec) = old.specs.get(c) {
                            row.specs.insert(c, spec.clone());
                        }
                        false
                    }
                    None => true,
                });
            }
        }
    }
    table.rows.insert(id, row);
}

/// Appends one key value to a row's identity so that different key tuples never
/// give the same text: integers and strings (the usual keys) are written
/// directly with a type tag and, for strings, their length; anything else as JSON.
fn push_key_part(id: &mut String, value: &Value) {
    use std::fmt::Write;
    // Writing into a String cannot fail.
    let _ = match value {
        Value::Number(n) if n.is_i64() => write!(id, "i{};", n.as_i64().unwrap_or_default()),
        Value::String(s) => write!(id, "s{}:{s};", s.len()),
        other => {
            let text = other.to_string();
            write!(id, "j{}:{text};", text.len())
        }
    };
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
