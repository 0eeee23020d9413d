//! Truncates: the documents of an index whose version is older than the
//! truncate are removed — a versioned delete at the truncate's version
//! (`delete.mode = delete`), or, soft, the document indexed again with the
//! flag set at the truncate's version — found by a search on the version
//! field every document carries (`version.field`).
//!
//! Not `_delete_by_query`: it needs the `reindex` module, which minimal
//! distributions and locked-down clusters lack, and it deletes with internal
//! versions. Each removal here is an ordinary bulk action with
//! `version_type = external` and the truncate's version, so Elasticsearch
//! itself applies it only to a document still older than the truncate: a
//! document another partition meanwhile rewrote after the truncate answers
//! 409 and stays, and a delete's tombstone (or the soft document) at the
//! truncate's version refuses older replays as any delete does.
//!
//! Rounds: refresh, search up to `bulk.max.actions` documents older than the
//! truncate (sorted by version), remove them in one bulk request that
//! refreshes what it wrote, and again until a search finds nothing.
//! Each round removes every hit or sees it rewritten newer, so the matches
//! only shrink — but for older rows other partitions write meanwhile, of
//! which there are finitely many.
//!
//! Why this converges when the copies of one truncate arrive on several
//! partitions at different times (see docs/design.md, "Truncate on every
//! partition"): every older write of a partition precedes that partition's
//! copy, whose first search runs after a refresh and so sees it; once every
//! partition applied its copy, nothing older than the truncate is left, and
//! nothing newer was touched. A replay finds nothing more to remove.

use ::elasticsearch::indices::{IndicesGetFieldMappingParts, IndicesRefreshParts};
use ::elasticsearch::{CountParts, Elasticsearch, SearchParts};
use serde_json::{json, Map, Value};

use super::bulk::{self, encode, status_error, Chunk, ItemMeta};
use super::config::{DeleteMode, ElasticsearchConfig, RefreshPolicy};
use super::error::{EsError, OpKind};
use super::plan::Truncate;
use crate::event::replaces;

/// What a truncate did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied: the documents found older than the truncate and removed (a
    /// removal refused because the document was rewritten newer counts too).
    Applied {
        /// Documents removed (or flagged).
        removed: u64,
    },
    /// The index does not exist: nothing to remove.
    NoIndex,
    /// It cannot be applied safely: the reason (for the dead-letter topic).
    Refused(String),
}

/// Applies `t` (see the module docs).
pub async fn apply(
    client: &Elasticsearch,
    config: &ElasticsearchConfig,
    t: &Truncate,
) -> Result<Outcome, EsError> {
    let field = config.version_field.as_str();
    match field_type(client, &t.index, field).await? {
        FieldType::NoIndex => return Ok(Outcome::NoIndex),
        FieldType::Long => {}
        FieldType::Other(found) => {
            // Unmapped, documents without the field would all match: only
            // safe when there is nothing to remove.
            if found.is_none() && count(client, &t.index).await? == 0 {
                return Ok(Outcome::Applied { removed: 0 });
            }
            return Ok(Outcome::Refused(format!(
                "truncate of index {}: the version field `{field}` is {} there, not a `long`; \
                 map it as `long` in the index template (or let dynamic mapping add it) \
                 and replay the truncate",
                t.index,
                found.map_or_else(|| "not mapped".to_owned(), |ty| format!("mapped as `{ty}`")),
            )));
        }
    }
    let soft = config.delete_mode == DeleteMode::Soft;
    // Older than the truncate, or written before documents carried the field
    // (by an earlier version of the sink); with soft deletes, not yet flagged.
    let mut query = json!({"bool": {"should": [
        {"range": {field: {"lt": t.version}}},
        {"bool": {"must_not": {"exists": {"field": field}}}},
    ], "minimum_should_match": 1}});
    if soft {
        query["bool"]["must_not"] = json!([{"term": {config.soft_delete_field.as_str(): true}}]);
    }
    let page = config.bulk_max_actions.clamp(1, 10_000);
    let body = json!({
        "size": page,
        "version": true,
        "_source": soft,
        "query": query,
        "sort": [{field: {"order": "asc", "missing": "_first", "unmapped_type": "long"}}],
    });
    refresh(client, &t.index).await?;
    let mut removed = 0;
    loop {
        let hits = search(client, &t.index, &body).await?;
        let mut chunk = Chunk::default();
        for hit in &hits {
            // Rewritten at or after the truncate by an earlier sink version
            // (no version field): not ours to remove.
            if !replaces(t.version, hit.version) {
                continue;
            }
            let meta = ItemMeta {
                index: t.index.clone(),
                id: hit.id.clone(),
                op: if soft { OpKind::Index } else { OpKind::Delete },
                offset: t.offset,
            };
            let doc = soft.then(|| {
                let mut doc = hit.source.clone();
                doc.shift_remove(field);
                doc.insert(config.soft_delete_field.clone(), Value::Bool(true));
                doc
            });
            let encoded =
                encode(meta, t.version, doc.as_ref(), field).map_err(|e| EsError::Response {
                    what: "truncate",
                    reason: e.to_string(),
                })?;
            if !chunk.fits(encoded.len(), page, config.bulk_max_bytes) {
                removed += send(client, std::mem::take(&mut chunk)).await?;
            }
            chunk.push(encoded);
        }
        if chunk.is_empty() {
            return Ok(Outcome::Applied { removed });
        }
        removed += send(client, chunk).await?;
    }
}

/// Sends removals, refreshing what they wrote so the next search no longer
/// finds them; their number. A 409 (rewritten newer meanwhile) is settled.
async fn send(client: &Elasticsearch, chunk: Chunk) -> Result<u64, EsError> {
    let n = chunk.len() as u64;
    match bulk::send(client, chunk, RefreshPolicy::True)
        .await?
        .into_iter()
        .next()
    {
        Some((_, e)) => Err(e),
        None => Ok(n),
    }
}

/// A document a search found.
struct Hit {
    id: String,
    version: i64,
    source: Map<String, Value>,
}

async fn search(client: &Elasticsearch, index: &str, body: &Value) -> Result<Vec<Hit>, EsError> {
    let response = client
        .search(SearchParts::Index(&[index]))
        .body(body.clone())
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "truncate search",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = read(response, "truncate search").await?;
    if !(200..300).contains(&status) {
        return Err(status_error(
            "truncate search",
            status,
            body.to_string().as_bytes(),
        ));
    }
    let hits = body["hits"]["hits"].as_array().cloned().unwrap_or_default();
    hits.into_iter()
        .map(|h| {
            Some(Hit {
                id: h["_id"].as_str()?.to_owned(),
                version: h["_version"].as_i64()?,
                source: h["_source"].as_object().cloned().unwrap_or_default(),
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| EsError::Response {
            what: "truncate search",
            reason: "a hit without _id or _version".into(),
        })
}

enum FieldType {
    NoIndex,
    Long,
    /// Another type, or `None` when the field is not mapped.
    Other(Option<String>),
}

async fn field_type(
    client: &Elasticsearch,
    index: &str,
    field: &str,
) -> Result<FieldType, EsError> {
    let response = client
        .indices()
        .get_field_mapping(IndicesGetFieldMappingParts::IndexFields(&[index], &[field]))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "get field mapping",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = read(response, "get field mapping").await?;
    if status == 404 && body["error"]["type"] == "index_not_found_exception" {
        return Ok(FieldType::NoIndex);
    }
    if !(200..300).contains(&status) {
        return Err(status_error(
            "get field mapping",
            status,
            body.to_string().as_bytes(),
        ));
    }
    // {"<index>": {"mappings": {"<field>": {"mapping": {"<leaf>": {"type": ...}}}}}}
    let ty = body
        .as_object()
        .and_then(|indices| indices.values().next())
        .and_then(|i| i["mappings"][field]["mapping"].as_object())
        .and_then(|m| m.values().next())
        .and_then(|m| m["type"].as_str())
        .map(str::to_owned);
    Ok(match ty.as_deref() {
        Some("long") => FieldType::Long,
        _ => FieldType::Other(ty),
    })
}

async fn count(client: &Elasticsearch, index: &str) -> Result<u64, EsError> {
    refresh(client, index).await?;
    let response = client
        .count(CountParts::Index(&[index]))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "count",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = read(response, "count").await?;
    if !(200..300).contains(&status) {
        return Err(status_error("count", status, body.to_string().as_bytes()));
    }
    body["count"].as_u64().ok_or_else(|| EsError::Response {
        what: "count",
        reason: body.to_string(),
    })
}

/// Makes every acknowledged write visible to the query that follows.
async fn refresh(client: &Elasticsearch, index: &str) -> Result<(), EsError> {
    let response = client
        .indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "refresh",
            source,
        })?;
    let status = response.status_code().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let body = read(response, "refresh").await?;
    Err(status_error("refresh", status, body.to_string().as_bytes()))
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
