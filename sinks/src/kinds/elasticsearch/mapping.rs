//! The mapping of the indexes the sink creates: each column's field typed
//! from its Connect schema ([`super::values`]: dates as `date`, decimals as
//! `double` with an exact `keyword` sub-field, JSON as `flattened`, ...),
//! floating-point fields `double` (a `real` column `float`), and values a
//! field cannot index kept in `_source`.
//!
//! Elasticsearch's dynamic mapping makes a JSON fraction a `float`, which
//! refuses `1e308` and rounds every double to 24 bits, and a JSON integer a
//! `long`, which a `double precision` column whose first value was `1`
//! then refuses for `1e308`. And a numeric field refuses the strings
//! `"NaN"`, `"Infinity"` and `"-Infinity"` that capture writes for the
//! non-finite floats, a `date` field `infinity`. So before the first write
//! to an index the sink creates it ([`Mappings::prepare`]) with:
//!
//! * `properties` for each column whose Connect schema says more than its
//!   JSON does ([`Format::field_mapping`]), arrays of them included; the
//!   numeric and date fields with `ignore_malformed: true`: a value they
//!   cannot parse is kept in `_source` (exact, what `oncely verify` and every
//!   reader of the document see) and left out of the field's index, so it is
//!   not searchable;
//! * a dynamic template mapping any other JSON fraction (schemaless topics)
//!   to `double`, also with `ignore_malformed`, and one keeping strings
//!   dynamic date detection takes for dates;
//! * `_meta.oncely`, which marks the index as the sink's own and records the
//!   form of its values ([`Format::mark`]).
//!
//! Columns that appear later (`ADD COLUMN`) get their properties the same
//! way (`PUT _mapping`) before their first value is written; a column whose
//! new type a field's mapping cannot hold moves the index to a new
//! generation behind an alias of its name ([`super::generation`]). The sink shapes
//! only indexes it created: an index that exists without the mark (made by
//! hand, by a template) is left as it is, and so is any index an index
//! template with mappings applies to — the user's template wins whole (copy
//! the dynamic templates above into it to keep doubles). An index an older
//! version created keeps its mapping and the wire form it was made for.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use ::elasticsearch::indices::{
    IndicesCreateParts, IndicesGetMappingParts, IndicesPutMappingParts,
    IndicesSimulateIndexTemplateParts,
};
use ::elasticsearch::Elasticsearch;
use serde_json::{json, Map, Value};

use super::bulk::{read_json as read, status_error};
use super::config::ElasticsearchConfig;
use super::error::EsError;
use super::generation;
use super::plan::event_index;
use super::values::Format;
use crate::event::row_fields;
use crate::sink::Batch;

/// The `_meta` key marking an index the sink created.
pub const META_KEY: &str = "oncely";

/// The Connect schemas of some columns, by name.
type Fields = BTreeMap<String, Value>;

/// `properties` for `fields` in `format` (columns mapped dynamically left out).
fn properties(fields: &Fields, format: Format) -> Map<String, Value> {
    fields
        .iter()
        .filter_map(|(name, f)| Some((name.clone(), format.field_mapping(f)?)))
        .collect()
}

/// The body of the index creation: see the module docs.
pub fn index_body(fields: &Fields, format: Format) -> Value {
    json!({
        "mappings": {
            "_meta": {META_KEY: format.mark()},
            "dynamic_templates": [{
                "oncely_floating_point": {
                    "match_mapping_type": "double",
                    "mapping": {"type": "double", "ignore_malformed": true}
                }
            }, {
                // Strings dynamic date detection takes for dates keep a value
                // they cannot parse (`infinity`, a year before 0 or after
                // 9999 as java.time writes it: `-0043-03-15T12:00:00.000000Z`,
                // `+294276-...`) in `_source`, unindexed, instead of refusing
                // the document.
                "oncely_dates": {
                    "match_mapping_type": "date",
                    "mapping": {"type": "date", "ignore_malformed": true}
                }
            }],
            "properties": properties(fields, format)
        }
    })
}

/// What the sink knows of an index.
#[derive(Debug)]
enum Known {
    /// Created by the sink, in this form; these columns are mapped.
    Ours(Format, HashSet<String>),
    /// Someone else's (or a template's): never touched.
    Theirs,
}

/// The indexes this process has seen; see the module docs.
#[derive(Debug)]
pub struct Mappings {
    known: Mutex<HashMap<String, Known>>,
    /// (index, column, Connect schema) whose fit to the index's mapping was
    /// checked ([`super::generation::follow`]): a schema is checked once.
    checked: Mutex<HashSet<(String, String, String)>>,
    /// The form of new indexes and of those not the sink's.
    configured: Format,
}

impl Mappings {
    /// No index seen yet; new ones get the form `config` sets.
    pub fn new(config: &ElasticsearchConfig) -> Self {
        Self {
            known: Mutex::default(),
            checked: Mutex::default(),
            configured: Format::of_config(config),
        }
    }

    /// The form `index` is written in (after [`Self::prepare`] saw it).
    pub fn format(&self, index: &str) -> Format {
        match self.lock().get(index) {
            Some(Known::Ours(format, _)) => *format,
            _ => self.configured,
        }
    }

    /// Creates the indexes `batch` writes to that this process has not seen
    /// yet, and maps the columns new to an index of the sink's.
    /// Runs before the batch's writes; repeated calls (replays, other
    /// partitions, other processes) are harmless.
    pub async fn prepare(
        &self,
        client: &Elasticsearch,
        batch: &Batch,
        pattern: &str,
    ) -> Result<(), EsError> {
        let mut wanted: BTreeMap<String, Fields> = BTreeMap::new();
        // Events of a table share their schema: each is read once per index.
        let mut read: HashSet<(String, usize)> = HashSet::new();
        for record in batch.records() {
            let Some(event) = record.event() else {
                continue;
            };
            if event.after.is_none() && event.before.is_none() {
                continue; // truncates and messages write no document
            }
            // A name Elasticsearch refuses is the record's failure (in the plan).
            let Ok(index) = event_index(pattern, batch.topic(), event) else {
                continue;
            };
            let fields = wanted.entry(index.clone()).or_default();
            let Some(schema) = &event.schema else {
                continue;
            };
            if !read.insert((index, std::sync::Arc::as_ptr(schema) as usize)) {
                continue;
            }
            // The newest schema of a column (records come in order): the
            // one a type change must be checked against.
            for (name, field) in row_fields(Some(schema)).unwrap_or_default() {
                fields.insert(name.to_owned(), field.clone());
            }
        }
        for (index, fields) in wanted {
            // Decided under the lock, without copying what is known.
            let new: Option<(Format, Fields)> = match self.lock().get(&index) {
                Some(Known::Theirs) => continue,
                Some(Known::Ours(format, mapped)) => Some((
                    *format,
                    fields
                        .iter()
                        .filter(|(f, _)| !mapped.contains(*f))
                        .map(|(f, t)| (f.clone(), t.clone()))
                        .collect(),
                )),
                None => None,
            };
            match new {
                Some((format, new)) => {
                    // A column whose new type the mapping refuses moves the
                    // index to a new generation, before anything is written.
                    self.follow_types(client, &index, &fields, format).await?;
                    if new.is_empty() {
                        continue;
                    }
                    put_fields(client, &index, &new, format).await?;
                    if let Some(Known::Ours(_, mapped)) = self.lock().get_mut(&index) {
                        mapped.extend(new.into_keys());
                    }
                }
                None => {
                    let known = adopt(client, &index, &fields, self.configured).await?;
                    if matches!(known, Known::Ours(..)) {
                        // `adopt` followed them.
                        self.note_checked(&index, &fields);
                    }
                    self.lock().insert(index, known);
                }
            }
        }
        Ok(())
    }

    /// [`generation::follow`] for the columns of `fields` not checked yet.
    async fn follow_types(
        &self,
        client: &Elasticsearch,
        index: &str,
        fields: &Fields,
        format: Format,
    ) -> Result<(), EsError> {
        let unchecked: Fields = {
            let checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            fields
                .iter()
                .filter(|(f, s)| {
                    !checked.contains(&(index.to_owned(), (*f).clone(), s.to_string()))
                })
                .map(|(f, s)| (f.clone(), s.clone()))
                .collect()
        };
        if unchecked.is_empty() {
            return Ok(());
        }
        generation::follow(client, index, &unchecked, format).await?;
        self.note_checked(index, &unchecked);
        Ok(())
    }

    fn note_checked(&self, index: &str, fields: &Fields) {
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        for (f, s) in fields {
            checked.insert((index.to_owned(), f.clone(), s.to_string()));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        // A panic elsewhere cannot leave the map half-written: inserts are whole.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// First sight of `index` in this process: create it, or find out whose it is.
async fn adopt(
    client: &Elasticsearch,
    index: &str,
    fields: &Fields,
    configured: Format,
) -> Result<Known, EsError> {
    if template_maps(client, index).await? {
        tracing::info!(
            index,
            "an index template with mappings applies: the sink leaves the mapping to it"
        );
        return Ok(Known::Theirs);
    }
    let response = client
        .indices()
        .create(IndicesCreateParts::Index(index))
        .body(index_body(fields, configured))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "create index",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = read(response, "create index").await?;
    if (200..300).contains(&status) {
        tracing::info!(
            index,
            value_format = configured.values.as_str(),
            "index created with a mapping from the columns' schemas"
        );
        return Ok(Known::Ours(configured, fields.keys().cloned().collect()));
    }
    match (status, body["error"]["type"].as_str()) {
        (400, Some("resource_already_exists_exception")) => {}
        // A name Elasticsearch refuses, an alias of that name, ...: the
        // bulk request says what is wrong, per record.
        (400, _) => return Ok(Known::Theirs),
        _ => {
            return Err(status_error(
                "create index",
                status,
                body.to_string().as_bytes(),
            ))
        }
    }
    let Some(mark) = mark(client, index).await? else {
        return Ok(Known::Theirs);
    };
    let format = Format::of_mark(&mark);
    if format != configured {
        tracing::info!(
            index,
            value_format = format.values.as_str(),
            json_handling_mode = format.json.as_str(),
            "the index keeps the form of values it was created with (reindex to change it)"
        );
    }
    // Before any mapping change: a generation left half-made by a killed
    // process has its old index write-blocked.
    generation::follow(client, index, fields, format).await?;
    put_fields(client, index, fields, format).await?;
    Ok(Known::Ours(format, fields.keys().cloned().collect()))
}

/// Whether an index template with mappings would apply to a new `index`.
async fn template_maps(client: &Elasticsearch, index: &str) -> Result<bool, EsError> {
    let what = "simulate index template";
    let response = client
        .indices()
        .simulate_index_template(IndicesSimulateIndexTemplateParts::Name(index))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    match status {
        200..=299 => Ok(body["template"]["mappings"]
            .as_object()
            .is_some_and(|m| !m.is_empty())),
        // The name is refused: creating it would be refused too.
        400 | 404 => Ok(false),
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

/// The form `index` is written in: recorded in the sink's mark, or the
/// configured one for an index that is not the sink's (or does not exist
/// yet). `oncely verify` reads documents in it.
pub async fn index_format(
    client: &Elasticsearch,
    index: &str,
    configured: Format,
) -> Result<Format, EsError> {
    Ok(mark(client, index)
        .await?
        .map_or(configured, |m| Format::of_mark(&m)))
}

/// The sink's mark on the existing `index`, if it carries one.
async fn mark(client: &Elasticsearch, index: &str) -> Result<Option<Value>, EsError> {
    let what = "get mapping";
    let response = client
        .indices()
        .get_mapping(IndicesGetMappingParts::Index(&[index]))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    match status {
        // Keyed by the concrete index (the name may be an alias).
        200..=299 => Ok(body
            .as_object()
            .and_then(|indices| indices.values().next())
            .and_then(|i| i["mappings"]["_meta"].get(META_KEY))
            .cloned()),
        404 => Ok(None),
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

/// Maps `fields` in the sink's `index`, written in `format`. A field
/// already mapped otherwise (by a schemaless event before it) stays as it
/// is, with a warning: an existing field's type cannot change.
async fn put_fields(
    client: &Elasticsearch,
    index: &str,
    fields: &Fields,
    format: Format,
) -> Result<(), EsError> {
    let properties = properties(fields, format);
    if properties.is_empty() {
        return Ok(());
    }
    let what = "put mapping";
    let response = client
        .indices()
        .put_mapping(IndicesPutMappingParts::Index(&[index]))
        .body(json!({ "properties": properties }))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    match status {
        200..=299 => Ok(()),
        400 => {
            tracing::warn!(
                index,
                reason = %body["error"]["reason"],
                "fields keep the type they were mapped with first"
            );
            Ok(())
        }
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::elasticsearch::JsonMode;
    use crate::native::ValueFormat;

    #[test]
    fn the_index_body_maps_columns_and_keeps_malformed_values() {
        let fields = Fields::from([
            ("f8".to_owned(), json!({"type": "double"})),
            ("f4".to_owned(), json!({"type": "float"})),
            (
                "d".to_owned(),
                json!({"type": "int32", "name": "io.debezium.time.Date"}),
            ),
            ("i".to_owned(), json!({"type": "int64"})),
        ]);
        let format = Format {
            values: ValueFormat::Native,
            json: JsonMode::Flattened,
        };
        let body = index_body(&fields, format);
        let m = &body["mappings"];
        assert_eq!(
            m["properties"]["f8"],
            json!({"type": "double", "ignore_malformed": true})
        );
        assert_eq!(
            m["properties"]["f4"],
            json!({"type": "float", "ignore_malformed": true})
        );
        assert_eq!(m["properties"]["d"]["type"], "date");
        assert!(m["properties"].get("i").is_none());
        let t = &m["dynamic_templates"][0]["oncely_floating_point"];
        assert_eq!(t["match_mapping_type"], "double");
        assert_eq!(t["mapping"]["type"], "double");
        assert_eq!(Format::of_mark(&m["_meta"][META_KEY]), format);
    }
}
