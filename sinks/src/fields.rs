//! `fields.include` / `fields.exclude`: which columns a prebuilt sink stores,
//! so a cache can hold a subset of what the warehouse holds.
//!
//! ```text
//!   decode ──► SelectingSink::prepare ──► the sink's own prepare / apply
//!              (row images and their schema
//!               lose the columns not selected)
//! ```
//!
//! The one invariant: a column the selection leaves out never reaches the
//! sink's code. The selection is applied to the decoded event itself — its
//! `before` and `after` images and the `before`/`after` structs of its
//! Connect schema — before the sink sees the batch, so every write path of
//! every sink (upserts, key changes, deletes, soft deletes, truncates, the
//! merge of unchanged TOAST values, history tables, the columns a warehouse
//! adds and the fields an index maps) works on the selected columns only,
//! with no per-sink code.
//!
//! Entries are exact column names (`email`, for every table) or
//! `<schema>.<table>.<column>` (`public.users.email`, one table); exact
//! names, not regexes, so a key field named in `fields.exclude` is found and
//! refused, and a typo cannot silently widen what a cache holds. Key fields
//! (those of the record's Kafka key) are always kept: `fields.include` need
//! not list them and `fields.exclude` may not — a record whose key holds an
//! excluded field stops the sink before anything of its batch is written.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde_json::Value;

use crate::error::{ConfigError, SinkError};
use crate::event::{ChangeEvent, Payload};
use crate::sink::{Batch, Positions, Record, Sink, TopicPartition};

/// The key of `fields.include`, as errors name it.
pub const INCLUDE_KEY: &str = "sink.fields.include";
/// The key of `fields.exclude`, as errors name it.
pub const EXCLUDE_KEY: &str = "sink.fields.exclude";

/// Schemas rewritten without the left-out columns kept at most (then the
/// cache starts over): one per table and schema version in practice.
const MAX_CACHED_SCHEMAS: usize = 4096;

/// Whether the list names the columns to keep or those to leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `fields.include`: the listed columns and the key fields.
    Include,
    /// `fields.exclude`: every column but the listed ones.
    Exclude,
}

/// A parsed `fields.include` or `fields.exclude` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSelection {
    mode: Mode,
    /// Unqualified entries: a column of that name in every table.
    any: HashSet<String>,
    /// Qualified entries, by `(schema, table)`.
    tables: HashMap<(String, String), HashSet<String>>,
}

impl FieldSelection {
    /// The selection of a sink's two lists; `None` when both are empty.
    /// Errors: both set, an empty entry, a dotted entry that is not
    /// `<schema>.<table>.<column>`.
    pub fn parse(include: &[String], exclude: &[String]) -> Result<Option<Self>, ConfigError> {
        let (mode, list, key) = match (include.is_empty(), exclude.is_empty()) {
            (true, true) => return Ok(None),
            (false, false) => {
                return Err(ConfigError::new(
                    INCLUDE_KEY,
                    format!("set either {INCLUDE_KEY} or {EXCLUDE_KEY}, not both"),
                ))
            }
            (false, true) => (Mode::Include, include, INCLUDE_KEY),
            (true, false) => (Mode::Exclude, exclude, EXCLUDE_KEY),
        };
        let mut selection = Self {
            mode,
            any: HashSet::new(),
            tables: HashMap::new(),
        };
        for entry in list {
            let parts: Vec<&str> = entry.split('.').collect();
            match parts.as_slice() {
                [column] if !column.is_empty() => {
                    selection.any.insert((*column).to_owned());
                }
                [schema, table, column] if parts.iter().all(|p| !p.is_empty()) => {
                    selection
                        .tables
                        .entry(((*schema).to_owned(), (*table).to_owned()))
                        .or_default()
                        .insert((*column).to_owned());
                }
                _ => {
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "`{entry}`: an entry is a column name (every table) or `<schema>.<table>.<column>` (one table), exact names"
                        ),
                    ))
                }
            }
        }
        Ok(Some(selection))
    }

    /// Whether the list is `fields.include` or `fields.exclude`.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The configuration key of the list.
    pub fn key(&self) -> &'static str {
        match self.mode {
            Mode::Include => INCLUDE_KEY,
            Mode::Exclude => EXCLUDE_KEY,
        }
    }

    /// The entry of the list naming `column` of `schema.table`, if any.
    fn listed(&self, schema: &str, table: &str, column: &str) -> Option<String> {
        if self.any.contains(column) {
            return Some(column.to_owned());
        }
        self.tables
            .get(&(schema.to_owned(), table.to_owned()))
            .filter(|names| names.contains(column))
            .map(|_| format!("{schema}.{table}.{column}"))
    }

    /// Whether the sink stores `column` of `schema.table`, a key field or
    /// not (key fields are kept by every selection a sink accepts).
    pub fn keeps(&self, schema: &str, table: &str, column: &str, is_key: bool) -> bool {
        let listed = self.listed(schema, table, column).is_some();
        match self.mode {
            Mode::Include => listed || is_key,
            Mode::Exclude => !listed,
        }
    }

    /// Why a record whose key holds `key_fields` cannot be stored under this
    /// selection: an excluded key field, named with the entry and the fix.
    pub fn refuse_key<'k>(
        &self,
        schema: &str,
        table: &str,
        key_fields: impl IntoIterator<Item = &'k str>,
    ) -> Option<String> {
        if self.mode != Mode::Exclude {
            return None;
        }
        key_fields.into_iter().find_map(|field| {
            let entry = self.listed(schema, table, field)?;
            Some(format!(
                "{EXCLUDE_KEY} lists `{entry}`, but `{field}` is a key field of {schema}.{table}: key fields identify the row in the target and are always stored; remove `{entry}` from {EXCLUDE_KEY}"
            ))
        })
    }

    /// Whether any entry applies to `schema.table` and names one of `columns`.
    fn matches_any<'c>(
        &self,
        schema: &str,
        table: &str,
        mut columns: impl Iterator<Item = &'c str>,
    ) -> bool {
        columns.any(|c| self.listed(schema, table, c).is_some())
    }

    /// `event`'s row images without the columns this selection leaves out
    /// (`key_fields`: the record's key fields, always kept); its schema
    /// from `schemas`, rewritten once per schema.
    fn select_event(&self, event: &mut ChangeEvent, key_fields: &[String], schemas: &SchemaCache) {
        let (Some(schema), Some(table)) = (event.schema_name(), event.table()) else {
            return;
        };
        let (schema, table) = (schema.to_owned(), table.to_owned());
        let keeps = |column: &str| {
            self.keeps(
                &schema,
                &table,
                column,
                key_fields.iter().any(|k| k == column),
            )
        };
        for image in [&mut event.before, &mut event.after].into_iter().flatten() {
            image.retain(|column, _| keeps(column));
        }
        if let Some(original) = event.schema.take() {
            // Keyed by table too: two tables whose schemas read the same
            // share one decoded schema, and a qualified entry is one table's.
            let id = SchemaId {
                address: Arc::as_ptr(&original) as usize,
                table: (schema.clone(), table.clone()),
                key_fields: key_fields.to_vec(),
            };
            let selected = schemas.selected(id, &original, |v| select_schema(v, &keeps));
            event.schema = Some(selected);
        }
    }
}

/// A Connect value schema without the columns `keeps` refuses in its
/// `before` and `after` structs.
fn select_schema(schema: &Value, keeps: &dyn Fn(&str) -> bool) -> Value {
    let mut out = schema.clone();
    if let Some(fields) = out.get_mut("fields").and_then(Value::as_array_mut) {
        for image in fields.iter_mut().filter(|f| {
            matches!(
                f.get("field").and_then(Value::as_str),
                Some("before" | "after")
            )
        }) {
            if let Some(columns) = image.get_mut("fields").and_then(Value::as_array_mut) {
                columns.retain(|c| c.get("field").and_then(Value::as_str).is_none_or(keeps));
            }
        }
    }
    out
}

/// Schemas as rewritten, by [`SchemaId`]; the original is held, so its
/// address is not reused while it is a key.
#[derive(Default)]
struct SchemaCache(Mutex<HashMap<SchemaId, Rewritten>>);

/// What a rewritten schema depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SchemaId {
    /// The shared original's address.
    address: usize,
    /// The event's `(schema, table)`.
    table: (String, String),
    /// The record's key fields.
    key_fields: Vec<String>,
}

/// The original schema (held) and its rewrite.
type Rewritten = (Arc<Value>, Arc<Value>);

impl SchemaCache {
    fn selected(
        &self,
        id: SchemaId,
        original: &Arc<Value>,
        rewrite: impl FnOnce(&Value) -> Value,
    ) -> Arc<Value> {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, selected)) = cache.get(&id) {
            return selected.clone();
        }
        if cache.len() >= MAX_CACHED_SCHEMAS {
            cache.clear();
        }
        let selected = Arc::new(rewrite(original));
        cache.insert(id, (original.clone(), selected.clone()));
        selected
    }
}

/// The key fields of a record (the fields of its Kafka key object).
fn key_fields(record: &Record) -> Vec<String> {
    match &record.key {
        Some(Value::Object(key)) => key.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Puts `sink` behind `selection` (`None`: unchanged).
pub fn select(sink: Arc<dyn Sink>, selection: Option<FieldSelection>) -> Arc<dyn Sink> {
    match selection {
        None => sink,
        Some(fields) => Arc::new(SelectingSink {
            inner: sink,
            fields,
            schemas: SchemaCache::default(),
            told: Mutex::default(),
        }),
    }
}

/// A prebuilt sink behind its field selection (see the module docs).
struct SelectingSink {
    inner: Arc<dyn Sink>,
    fields: FieldSelection,
    schemas: SchemaCache,
    /// Tables whose columns were checked against the list (logged once each).
    told: Mutex<HashSet<(String, String)>>,
}

impl SelectingSink {
    /// The first record whose key holds an excluded field, as a fatal error:
    /// a setting to fix, found before anything of the batch is written.
    fn refusal(&self, batch: &Batch) -> Option<SinkError> {
        batch.records().iter().find_map(|r| {
            let event = r.event()?;
            let key = match &r.key {
                Some(Value::Object(key)) => key,
                _ => return None,
            };
            let why = self.fields.refuse_key(
                event.schema_name()?,
                event.table()?,
                key.keys().map(String::as_str),
            )?;
            Some(SinkError::fatal(format!(
                "{}: offset {}: {why}",
                batch.topic_partition(),
                r.offset
            )))
        })
    }

    /// Selects the columns of every event of `records`, telling once per
    /// table when the list names none of its columns.
    fn select_records(&self, records: &mut [Record]) {
        for record in records {
            let keys = key_fields(record);
            if let Payload::Change(event) = &mut record.payload {
                self.tell_unmatched(event);
                self.fields.select_event(event, &keys, &self.schemas);
            }
        }
    }

    /// Logs once per table, at its first row image, that the list names
    /// none of its columns (tables differ, so that is no error).
    fn tell_unmatched(&self, event: &ChangeEvent) {
        if let Some(told) = self.unmatched(event) {
            match self.fields.mode {
                Mode::Include => tracing::warn!(sink = self.inner.name(), "{told}"),
                Mode::Exclude => tracing::info!(sink = self.inner.name(), "{told}"),
            }
        }
    }

    /// What [`Self::tell_unmatched`] logs for `event`: only at the first
    /// row image of its table, and only when the list names none of the
    /// image's columns.
    fn unmatched(&self, event: &ChangeEvent) -> Option<String> {
        let (schema, table) = (event.schema_name()?, event.table()?);
        let image = event.after.as_ref().or(event.before.as_ref())?;
        let first = self
            .told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((schema.to_owned(), table.to_owned()));
        if !first
            || self
                .fields
                .matches_any(schema, table, image.keys().map(String::as_str))
        {
            return None;
        }
        Some(match self.fields.mode {
            Mode::Include => format!(
                "{schema}.{table}: {INCLUDE_KEY} names none of its columns: only its key fields are stored"
            ),
            Mode::Exclude => format!(
                "{schema}.{table}: {EXCLUDE_KEY} names none of its columns: every column is stored"
            ),
        })
    }
}

#[async_trait]
impl Sink for SelectingSink {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn owns_positions(&self) -> bool {
        self.inner.owns_positions()
    }

    async fn load_positions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        self.inner.load_positions(group, partitions).await
    }

    async fn assigned(&self, starts: &Positions) -> Result<(), SinkError> {
        self.inner.assigned(starts).await
    }

    fn prepare(&self, batch: &mut Batch) {
        // A refused batch is left as it is: `apply` reports it.
        if self.refusal(batch).is_some() {
            return;
        }
        self.select_records(batch.records_mut());
        batch.mark_fields_selected();
        self.inner.prepare(batch);
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        if batch.fields_selected() {
            return self.inner.apply(batch).await;
        }
        if let Some(refused) = self.refusal(batch) {
            return Err(refused);
        }
        // Not prepared here (or prepared by another path): select a copy.
        let mut selected = batch.clone();
        self.select_records(selected.records_mut());
        selected.mark_fields_selected();
        self.inner.apply(&selected).await
    }

    async fn shutdown(&self) -> Result<(), SinkError> {
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests;
