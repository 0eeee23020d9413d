//! Index generations: how an index of the sink's follows a column type
//! change its mapping cannot take (`ALTER COLUMN code TYPE text` after
//! `code` was mapped `long`). A field's type never changes in place, so the
//! sink moves the index to a new generation with the new mapping:
//!
//! ```text
//!   orders (index, code: long)                orders (alias) ──> orders-g2 (code: text)
//!     1. write block on orders                   4. one _aliases request: add the alias,
//!     2. create orders-g2: orders' mapping          remove the old index (atomic)
//!        with the field remapped
//!     3. copy every document, same _id and
//!        external version
//! ```
//!
//! The sink keeps writing and reading the name it always did (`orders`): an
//! alias of one index takes writes and reads as the index did, so `oncely
//! verify`, searches and the other sink processes need no change. Later
//! changes make `orders-g3` from the index the alias names.
//!
//! Why it is safe under kills and concurrent writers: the write block makes
//! every other writer's bulk fail retriably (`cluster_block_exception`)
//! until the alias exists, so nothing is written to the old index after the
//! copy read it; every step is idempotent (the block, the creation, the copy
//! with `version_type = external_gte`, the switch, which fails harmlessly
//! once another process made it), and a process killed half-way finds the
//! old index still there with the old mapping and does it again. The copy
//! carries the values as they were; capture's backfill after the source's
//! change (an incremental snapshot of the table) then rewrites every row in
//! its new form. A copied document the new mapping cannot take is left out
//! (the backfill writes it).
//!
//! The copy reads the old index through a scroll and writes with bulk
//! requests from the sink itself: no reindex module or scripting needed.

use ::elasticsearch::indices::{
    IndicesCreateParts, IndicesGetMappingParts, IndicesPutSettingsParts,
};
use ::elasticsearch::{BulkParts, ClearScrollParts, Elasticsearch, ScrollParts, SearchParts};
use serde_json::{json, Map, Value};

use super::bulk::{read_json as read, status_error};
use super::error::EsError;
use super::values::Format;

/// Documents per scroll page and bulk request of the copy.
const COPY_PAGE: usize = 500;
/// How long a scroll context lives between pages.
const SCROLL_KEEP_ALIVE: &str = "2m";

/// Numeric field types of Elasticsearch: they refuse a string that is no
/// number and a boolean.
const NUMERIC: &[&str] = &[
    "long",
    "integer",
    "short",
    "byte",
    "double",
    "float",
    "half_float",
    "scaled_float",
    "unsigned_long",
];

/// What JSON a column's values are, by their Connect schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
}

fn kind(field: &Value) -> Option<Kind> {
    Some(match field.get("type").and_then(Value::as_str)? {
        "string" | "bytes" => Kind::Str,
        "int8" | "int16" | "int32" | "int64" => Kind::Int,
        "float" | "float32" | "double" | "float64" => Kind::Float,
        "boolean" => Kind::Bool,
        _ => return None,
    })
}

/// The mapping a field of Connect schema `field` gets in a new generation:
/// the sink's own ([`Format::field_mapping`]) or what Elasticsearch's
/// dynamic mapping would give its JSON.
fn wanted_mapping(field: &Value, format: Format) -> Option<Value> {
    if let Some(m) = format.field_mapping(field) {
        return Some(m);
    }
    Some(match kind(field)? {
        Kind::Str => json!({
            "type": "text",
            "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}
        }),
        Kind::Int => json!({"type": "long"}),
        Kind::Float => json!({"type": "double", "ignore_malformed": true}),
        Kind::Bool => json!({"type": "boolean"}),
    })
}

/// Integer field types: they index a fraction truncated.
const INTEGER: &[&str] = &["long", "integer", "short", "byte", "unsigned_long"];

/// Whether a field mapped `mapped` cannot hold values of Connect schema
/// `field` as they are, by what Elasticsearch takes per field type: a
/// numeric field refuses strings that are no numbers (`integer` → `text`)
/// and booleans (`integer` → `boolean`), and an integer field truncates
/// fractions (`integer` → `numeric(12,2)`: the document keeps `12.34` but
/// searches and aggregations see `12`); a boolean field refuses numbers and
/// strings other than `"true"`/`"false"` (`boolean` → `integer`, `text`);
/// `text`, `keyword` and the other fields take every scalar. A field keeping
/// malformed values in `_source` (`ignore_malformed`) takes anything, and a
/// decimal string (mapped `double` by the sink) is a number to a numeric
/// field. The new generation's mapping ([`new_mapping`]) takes the old
/// values too, so events from before the change (read late or replayed) fit
/// it and never move the index back.
pub(super) fn refuses(mapped: &Value, field: &Value, format: Format) -> bool {
    let Some(kind) = kind(field) else {
        return false;
    };
    let wanted = format
        .field_mapping(field)
        .and_then(|m| m["type"].as_str().map(str::to_owned));
    let wanted_numeric = wanted.as_deref().is_some_and(|t| NUMERIC.contains(&t));
    let fractions = kind == Kind::Float || matches!(wanted.as_deref(), Some("double" | "float"));
    match mapped["type"].as_str() {
        Some(t) if INTEGER.contains(&t) && fractions => true,
        _ if mapped["ignore_malformed"] == json!(true) => false,
        Some(t) if NUMERIC.contains(&t) => {
            kind == Kind::Bool || (kind == Kind::Str && !wanted_numeric)
        }
        Some("boolean") => kind != Kind::Bool,
        _ => false,
    }
}

/// The mapping a refused field gets in the new generation: the one
/// [`wanted_mapping`] gives when it takes the values the old mapping held
/// too, else a string field, which takes every scalar (numbers before the
/// change and booleans after, or the other way round). Either way events
/// from before the change fit the new generation (the one-way rule).
fn new_mapping(mapped: &Value, field: &Value, format: Format) -> Option<Value> {
    let wanted = wanted_mapping(field, format)?;
    let held = match mapped["type"].as_str() {
        Some("boolean") => json!({"type": "boolean"}),
        Some(t) if INTEGER.contains(&t) => json!({"type": "int64"}),
        Some(t) if NUMERIC.contains(&t) => json!({"type": "float64"}),
        _ => return Some(wanted),
    };
    if refuses(&wanted, &held, format) {
        return wanted_mapping(&json!({"type": "string"}), format);
    }
    Some(wanted)
}

/// The concrete index behind `name` and its mappings (`None` when `name`
/// does not exist).
async fn concrete(client: &Elasticsearch, name: &str) -> Result<Option<(String, Value)>, EsError> {
    let what = "get mapping";
    let response = client
        .indices()
        .get_mapping(IndicesGetMappingParts::Index(&[name]))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    match status {
        200..=299 => Ok(body
            .as_object()
            .and_then(|indices| indices.iter().next())
            .map(|(index, m)| (index.clone(), m["mappings"].clone()))),
        404 => Ok(None),
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

/// The name of the generation after `current` (the concrete index behind
/// `name`): `<name>-g2`, then `-g3`, ...
pub(super) fn next_generation(name: &str, current: &str) -> String {
    let n = current
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix("-g"))
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(1);
    format!("{name}-g{}", n.saturating_add(1))
}

/// Moves `name` (an index of the sink's, or the alias of one) to a new
/// generation when its mapping refuses the values `fields` (Connect
/// schemas by column) describe; see the module docs. Returns whether it
/// did.
pub async fn follow(
    client: &Elasticsearch,
    name: &str,
    fields: &std::collections::BTreeMap<String, Value>,
    format: Format,
) -> Result<bool, EsError> {
    let Some((old, mappings)) = concrete(client, name).await? else {
        return Ok(false);
    };
    let properties = mappings["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let remapped: Map<String, Value> = fields
        .iter()
        .filter_map(|(f, schema)| {
            let mapped = properties.get(f)?;
            if !refuses(mapped, schema, format) {
                return None;
            }
            Some((f.clone(), new_mapping(mapped, schema, format)?))
        })
        .collect();
    if remapped.is_empty() {
        return Ok(false);
    }
    let new = next_generation(name, &old);
    tracing::info!(index = name, from = %old, to = %new, fields = ?remapped.keys().collect::<Vec<_>>(),
        "a column's new type does not fit the index mapping: moving the index to a new generation");
    block_writes(client, &old).await?;
    let mut body = mappings.clone();
    let mut new_properties = properties;
    new_properties.extend(remapped);
    body["properties"] = Value::Object(new_properties);
    create(client, &new, json!({ "mappings": body })).await?;
    let copied = copy(client, &old, &new).await?;
    switch(client, name, &old, &new).await?;
    tracing::info!(index = name, generation = %new, copied, "the index name now is an alias of the new generation");
    Ok(true)
}

async fn block_writes(client: &Elasticsearch, index: &str) -> Result<(), EsError> {
    let what = "block writes to the old generation";
    let response = client
        .indices()
        .put_settings(IndicesPutSettingsParts::Index(&[index]))
        .body(json!({"index.blocks.write": true}))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    expect_ok(response, what).await.map(drop)
}

async fn create(client: &Elasticsearch, index: &str, body: Value) -> Result<(), EsError> {
    let what = "create the new generation";
    let response = client
        .indices()
        .create(IndicesCreateParts::Index(index))
        .body(body)
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    match (status, body["error"]["type"].as_str()) {
        (200..=299, _) => Ok(()),
        // A previous attempt (killed, or another process) made it.
        (400, Some("resource_already_exists_exception")) => Ok(()),
        _ => Err(status_error(what, status, body.to_string().as_bytes())),
    }
}

/// Copies every document of `from` into `to` with its id and external
/// version; returns how many the new mapping took.
async fn copy(client: &Elasticsearch, from: &str, to: &str) -> Result<u64, EsError> {
    let what = "copy into the new generation";
    let response = client
        .search(SearchParts::Index(&[from]))
        .scroll(SCROLL_KEEP_ALIVE)
        .version(true)
        .size(COPY_PAGE as i64)
        .body(json!({"sort": ["_doc"]}))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let mut page = expect_ok(response, what).await?;
    let mut copied = 0;
    let mut scroll_id = page["_scroll_id"].as_str().map(str::to_owned);
    loop {
        let hits = page["hits"]["hits"].as_array().cloned().unwrap_or_default();
        if hits.is_empty() {
            break;
        }
        copied += write_copies(client, to, &hits).await?;
        let Some(id) = scroll_id.clone() else {
            break;
        };
        let response = client
            .scroll(ScrollParts::None)
            .body(json!({"scroll": SCROLL_KEEP_ALIVE, "scroll_id": id}))
            .send()
            .await
            .map_err(|source| EsError::Transport { what, source })?;
        page = expect_ok(response, what).await?;
        scroll_id = page["_scroll_id"].as_str().map(str::to_owned).or(scroll_id);
    }
    if let Some(id) = scroll_id {
        // Best effort: the context expires by itself.
        let _ = client
            .clear_scroll(ClearScrollParts::None)
            .body(json!({"scroll_id": [id]}))
            .send()
            .await;
    }
    Ok(copied)
}

/// One bulk request of copies; a copy already there (a repeated attempt)
/// or refused by the new mapping is skipped.
async fn write_copies(client: &Elasticsearch, to: &str, hits: &[Value]) -> Result<u64, EsError> {
    let what = "copy into the new generation";
    let mut lines: Vec<::elasticsearch::http::request::JsonBody<Value>> = Vec::new();
    for hit in hits {
        let (Some(id), Some(version)) = (hit["_id"].as_str(), hit["_version"].as_i64()) else {
            continue;
        };
        lines.push(
            json!({"index": {"_index": to, "_id": id, "version": version, "version_type": "external_gte"}})
                .into(),
        );
        lines.push(hit["_source"].clone().into());
    }
    if lines.is_empty() {
        return Ok(0);
    }
    let response = client
        .bulk(BulkParts::None)
        .body(lines)
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let body = expect_ok(response, what).await?;
    let mut copied = 0;
    for item in body["items"].as_array().into_iter().flatten() {
        let status = item["index"]["status"].as_u64().unwrap_or(0);
        match status {
            200..=299 | 409 => copied += 1,
            400 => {
                tracing::warn!(index = to, id = %item["index"]["_id"], reason = %item["index"]["error"]["reason"],
                "a document the new mapping cannot take is left for the backfill")
            }
            _ => {
                return Err(status_error(
                    what,
                    u16::try_from(status).unwrap_or(500),
                    item["index"]["error"].to_string().as_bytes(),
                ))
            }
        }
    }
    Ok(copied)
}

/// The atomic switch: `name` becomes an alias of `new` and `old` is
/// removed, in one request. When `old` is gone already, another process
/// switched: done if `name` names `new`.
async fn switch(client: &Elasticsearch, name: &str, old: &str, new: &str) -> Result<(), EsError> {
    let what = "switch the index name to the new generation";
    let response = client
        .indices()
        .update_aliases()
        .body(json!({"actions": [
            {"add": {"index": new, "alias": name, "is_write_index": true}},
            {"remove_index": {"index": old}}
        ]}))
        .send()
        .await
        .map_err(|source| EsError::Transport { what, source })?;
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    if (200..300).contains(&status) {
        return Ok(());
    }
    if status == 404 {
        if let Some((now, _)) = concrete(client, name).await? {
            if now == new {
                return Ok(());
            }
        }
    }
    Err(status_error(what, status, body.to_string().as_bytes()))
}

async fn expect_ok(
    response: ::elasticsearch::http::response::Response,
    what: &'static str,
) -> Result<Value, EsError> {
    let status = response.status_code().as_u16();
    let body = read(response, what).await?;
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(status_error(what, status, body.to_string().as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::elasticsearch::JsonMode;
    use crate::native::ValueFormat;

    #[test]
    fn numeric_fields_refuse_strings_and_generations_count_up() {
        let format = Format {
            values: ValueFormat::Native,
            json: JsonMode::Text,
        };
        let long = json!({"type": "long"});
        let text = json!({"type": "string"});
        assert!(refuses(&long, &text, format));
        assert!(!refuses(&long, &json!({"type": "int64"}), format));
        // A decimal string is a number to a numeric field, but an integer
        // field truncates its fractions.
        let decimal =
            json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC"}});
        assert!(!refuses(&json!({"type": "double"}), &decimal, format));
        assert!(refuses(&long, &decimal, format));
        assert!(refuses(&long, &json!({"type": "double"}), format));
        // Malformed values kept in `_source`: nothing is refused.
        assert!(!refuses(
            &json!({"type": "double", "ignore_malformed": true}),
            &text,
            format
        ));
        assert!(!refuses(
            &json!({"type": "keyword"}),
            &json!({"type": "int32"}),
            format
        ));
        assert!(!refuses(
            &json!({"type": "text"}),
            &json!({"type": "boolean"}),
            format
        ));
        assert_eq!(next_generation("p.t", "p.t"), "p.t-g2");
        assert_eq!(next_generation("p.t", "p.t-g2"), "p.t-g3");
    }

    /// Per field type, what Elasticsearch refuses, and the new generation's
    /// mapping taking the values from before the change too.
    #[test]
    fn booleans_and_numbers_move_to_a_field_taking_both() {
        let format = Format {
            values: ValueFormat::Native,
            json: JsonMode::Text,
        };
        let long = json!({"type": "long"});
        let boolean = json!({"type": "boolean"});
        let int = json!({"type": "int32"});
        let bool_ = json!({"type": "boolean"});
        let text = json!({"type": "string"});
        // `integer` → `boolean`: a numeric field refuses `true`.
        assert!(refuses(&long, &bool_, format));
        assert!(refuses(&json!({"type": "double"}), &bool_, format));
        // `boolean` → `integer` / `double precision` / `text`: a boolean
        // field refuses numbers and most strings.
        assert!(refuses(&boolean, &int, format));
        assert!(refuses(&boolean, &json!({"type": "double"}), format));
        assert!(refuses(&boolean, &text, format));
        assert!(!refuses(&boolean, &bool_, format));
        // A boolean field keeping malformed values refuses nothing.
        assert!(!refuses(
            &json!({"type": "boolean", "ignore_malformed": true}),
            &int,
            format
        ));
        // The new mapping takes old and new values: a string field for
        // numbers and booleans, which refuses neither afterwards.
        for (mapped, field, old) in [(&long, &bool_, &int), (&boolean, &int, &bool_)] {
            let new = new_mapping(mapped, field, format).expect("a mapping");
            assert_eq!(new["type"], "text", "{mapped} {field}");
            assert!(!refuses(&new, field, format));
            assert!(!refuses(&new, old, format));
        }
        // Where the wanted mapping takes the old values it is kept.
        assert_eq!(
            new_mapping(&long, &text, format).expect("text")["type"],
            "text"
        );
        assert_eq!(
            new_mapping(&long, &json!({"type": "double"}), format).expect("double")["type"],
            "double"
        );
        assert_eq!(
            new_mapping(&boolean, &text, format).expect("text")["type"],
            "text"
        );
    }
}
