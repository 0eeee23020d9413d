//! The mapping of the indexes the sink creates: floating-point fields are
//! `double` (a `real` column `float`), and both keep documents whose value
//! is not a finite number.
//!
//! Elasticsearch's dynamic mapping makes a JSON fraction a `float`, which
//! refuses `1e308` and rounds every double to 24 bits, and a JSON integer a
//! `long`, which a `double precision` column whose first value was `1`
//! then refuses for `1e308`. And a numeric field refuses the strings
//! `"NaN"`, `"Infinity"` and `"-Infinity"` that capture writes for the
//! non-finite floats. So before the first write to an index the sink
//! creates it ([`Mappings::prepare`]) with:
//!
//! * `properties` for each column the Connect schema types `float` (`float`)
//!   or `double` (`double`), arrays of them included, each with
//!   `ignore_malformed: true`: a non-finite value is kept in `_source`
//!   (exact, what `oncely verify` and every reader of the document see) and
//!   left out of the field's index, so it is not searchable;
//! * a dynamic template mapping any other JSON fraction (schemaless topics)
//!   to `double`, also with `ignore_malformed`;
//! * `_meta.oncely`, which marks the index as the sink's own.
//!
//! Columns that appear later (`ADD COLUMN`) get their properties the same
//! way (`PUT _mapping`) before their first value is written. The sink shapes
//! only indexes it created: an index that exists without the mark (made by
//! hand, by an older version, by a template) is left as it is, and so is any
//! index an index template with mappings applies to — the user's template
//! wins whole (copy the dynamic template above into it to keep doubles).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use ::elasticsearch::indices::{
    IndicesCreateParts, IndicesGetMappingParts, IndicesPutMappingParts,
    IndicesSimulateIndexTemplateParts,
};
use ::elasticsearch::Elasticsearch;
use serde_json::{json, Map, Value};

use super::bulk::status_error;
use super::error::EsError;
use super::plan::event_index;
use crate::event::{row_fields, ChangeEvent};
use crate::sink::Batch;

/// The `_meta` key marking an index the sink created.
pub const META_KEY: &str = "oncely";

/// The Elasticsearch type of a Connect field, for the fields this module
/// maps: `float` for Connect `float`, `double` for `double`, also as array
/// items.
pub fn field_type(field: &Value) -> Option<&'static str> {
    let ty = field.get("type").and_then(Value::as_str)?;
    match ty {
        "float" | "float32" => Some("float"),
        "double" | "float64" => Some("double"),
        "array" => field.get("items").and_then(field_type),
        _ => None,
    }
}

/// The fields of `event`'s row schema this module maps, with their type.
pub fn floating_fields(event: &ChangeEvent) -> BTreeMap<String, &'static str> {
    row_fields(event.schema.as_deref())
        .map(|fields| {
            fields
                .into_iter()
                .filter_map(|(name, f)| Some((name.to_owned(), field_type(f)?)))
                .collect()
        })
        .unwrap_or_default()
}

/// `properties` for `fields`.
fn properties(fields: &BTreeMap<String, &'static str>) -> Map<String, Value> {
    fields
        .iter()
        .map(|(name, ty)| (name.clone(), json!({"type": ty, "ignore_malformed": true})))
        .collect()
}

/// The body of the index creation: see the module docs.
pub fn index_body(fields: &BTreeMap<String, &'static str>) -> Value {
    json!({
        "mappings": {
            "_meta": {META_KEY: {"floating_point": "double"}},
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
            "properties": properties(fields)
        }
    })
}

/// What the sink knows of an index.
#[derive(Debug)]
enum Known {
    /// Created by the sink; these fields are mapped.
    Ours(HashSet<String>),
    /// Someone else's (or a template's): never touched.
    Theirs,
}

/// The indexes this process has seen; see the module docs.
#[derive(Debug, Default)]
pub struct Mappings {
    known: Mutex<HashMap<String, Known>>,
}

impl Mappings {
    /// Creates the indexes `batch` writes to that this process has not seen
    /// yet, and maps the floating-point fields new to an index of the sink's.
    /// Runs before the batch's writes; repeated calls (replays, other
    /// partitions, other processes) are harmless.
    pub async fn prepare(
        &self,
        client: &Elasticsearch,
        batch: &Batch,
        pattern: &str,
    ) -> Result<(), EsError> {
        let mut wanted: BTreeMap<String, BTreeMap<String, &'static str>> = BTreeMap::new();
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
            wanted
                .entry(index)
                .or_default()
                .extend(floating_fields(event));
        }
        for (index, fields) in wanted {
            // Decided under the lock, without copying what is known.
            let new: Option<BTreeMap<String, &'static str>> = match self.lock().get(&index) {
                Some(Known::Theirs) => continue,
                Some(Known::Ours(mapped)) => Some(
                    fields
                        .iter()
                        .filter(|(f, _)| !mapped.contains(*f))
                        .map(|(f, t)| (f.clone(), *t))
                        .collect(),
                ),
                None => None,
            };
            match new {
                Some(new) if new.is_empty() => {}
                Some(new) => {
                    put_fields(client, &index, &new).await?;
                    if let Some(Known::Ours(mapped)) = self.lock().get_mut(&index) {
                        mapped.extend(new.into_keys());
                    }
                }
                None => {
                    let known = adopt(client, &index, &fields).await?;
                    self.lock().insert(index, known);
                }
            }
        }
        Ok(())
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
    fields: &BTreeMap<String, &'static str>,
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
        .body(index_body(fields))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "create index",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = read(response, "create index").await?;
    if (200..300).contains(&status) {
        tracing::info!(index, "index created with doubles mapped as double");
        return Ok(Known::Ours(fields.keys().cloned().collect()));
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
    if !marked(client, index).await? {
        return Ok(Known::Theirs);
    }
    put_fields(client, index, fields).await?;
    Ok(Known::Ours(fields.keys().cloned().collect()))
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

/// Whether the existing `index` carries the sink's mark.
async fn marked(client: &Elasticsearch, index: &str) -> Result<bool, EsError> {
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
            .is_some_and(|i| i["mappings"]["_meta"].get(META_KEY).is_some())),
        404 => Ok(false),
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

/// Maps `fields` in the sink's `index`. A field already mapped otherwise
/// (by a schemaless event before it) stays as it is, with a warning: an
/// existing field's type cannot change.
async fn put_fields(
    client: &Elasticsearch,
    index: &str,
    fields: &BTreeMap<String, &'static str>,
) -> Result<(), EsError> {
    if fields.is_empty() {
        return Ok(());
    }
    let what = "put mapping";
    let response = client
        .indices()
        .put_mapping(IndicesPutMappingParts::Index(&[index]))
        .body(json!({ "properties": properties(fields) }))
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
                "floating-point fields keep the type they were mapped with first"
            );
            Ok(())
        }
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

async fn read(
    response: ::elasticsearch::http::response::Response,
    what: &'static str,
) -> Result<Value, EsError> {
    let bytes = response
        .bytes()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_and_doubles_and_their_arrays_are_mapped() {
        assert_eq!(field_type(&json!({"type": "double"})), Some("double"));
        assert_eq!(field_type(&json!({"type": "float"})), Some("float"));
        assert_eq!(
            field_type(&json!({"type": "array", "items": {"type": "double"}})),
            Some("double")
        );
        assert_eq!(field_type(&json!({"type": "int64"})), None);
        assert_eq!(
            field_type(
                &json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC"}})
            ),
            None
        );
    }

    #[test]
    fn the_index_body_maps_doubles_and_keeps_malformed_values() {
        let fields = BTreeMap::from([("f8".to_owned(), "double"), ("f4".to_owned(), "float")]);
        let body = index_body(&fields);
        let m = &body["mappings"];
        assert_eq!(
            m["properties"]["f8"],
            json!({"type": "double", "ignore_malformed": true})
        );
        assert_eq!(
            m["properties"]["f4"],
            json!({"type": "float", "ignore_malformed": true})
        );
        let t = &m["dynamic_templates"][0]["oncely_floating_point"];
        assert_eq!(t["match_mapping_type"], "double");
        assert_eq!(t["mapping"]["type"], "double");
        assert!(m["_meta"].get(META_KEY).is_some());
    }
}
