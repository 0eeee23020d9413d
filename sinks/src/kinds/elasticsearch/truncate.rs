//! Truncates: the documents of an index whose version is older than the
//! truncate are removed — a delete (`delete.mode = delete`), or, soft, the
//! document indexed again with the flag set and the truncate's version —
//! found by a search on the version fields every document carries
//! (`version.lsn.field`, `version.seq.field`; documents an earlier sink
//! version wrote by `version.field`, the old packing).
//!
//! Not `_delete_by_query`: it needs the `reindex` module, which minimal
//! distributions and locked-down clusters lack, and it deletes with internal
//! versions. Each removal here is an ordinary bulk action with
//! `version_type = external` at
//! [`next_external`](super::version::next_external) of the document's
//! external version as found and the truncate's version, so Elasticsearch
//! itself applies it only to a document not rewritten since the search with
//! anything newer than the truncate: one rewritten newer answers 409 and
//! stays, and a delete's tombstone (or the soft document) refuses older
//! replays as any delete does.
//!
//! Rounds: refresh, search up to `bulk.max.actions` documents older than the
//! truncate, remove them in one bulk request that refreshes what it wrote,
//! and again until a search finds nothing. Each round removes every hit or
//! sees it rewritten, so the matches only shrink — but for older rows other
//! partitions write meanwhile, of which there are finitely many.
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
use super::merge::{stored, ReadSpec};
use super::plan::Truncate;
use super::tombstones::Tombstones;
use super::version::{flip, next_external, packed};
use crate::event::{replaces, Version};

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
    spec: ReadSpec<'_>,
    tombstones: &Tombstones,
    t: &Truncate,
) -> Result<Outcome, EsError> {
    let (lsn, seq) = (spec.fields.lsn, spec.fields.seq);
    let legacy = config.version_field.as_str();
    let mut unmapped = Vec::new();
    for field in [lsn, seq] {
        match field_type(client, &t.index, field).await? {
            FieldType::NoIndex => return Ok(Outcome::NoIndex),
            FieldType::Long => {}
            FieldType::Other(None) => unmapped.push(field),
            FieldType::Other(Some(ty)) => {
                return Ok(Outcome::Refused(refusal(
                    t,
                    field,
                    &format!("mapped as `{ty}`"),
                )))
            }
        }
    }
    if !unmapped.is_empty() {
        // No document of the sink's has been indexed there yet: fine if the
        // earlier ones are found by `version.field`, or there are none.
        let legacy_ok = !legacy.is_empty()
            && matches!(field_type(client, &t.index, legacy).await?, FieldType::Long);
        if unmapped.len() == 1 || !(legacy_ok || count(client, &t.index).await? == 0) {
            return Ok(Outcome::Refused(refusal(t, unmapped[0], "not mapped")));
        }
    }
    let soft = config.delete_mode == DeleteMode::Soft;
    let (tl, ts) = (flip(t.version.lsn), flip(t.version.seq));
    // Documents of an earlier sink version: below the truncate's old packing
    // (all of them when it does not fit), or without `version.field`.
    let mut earlier = json!({"bool": {"must_not": [{"exists": {"field": lsn}}]}});
    if let (false, Some(p)) = (legacy.is_empty(), packed(t.version, config.seq_bits)) {
        earlier["bool"]["should"] = json!([
            {"range": {legacy: {"lt": p}}},
            {"bool": {"must_not": {"exists": {"field": legacy}}}},
        ]);
        earlier["bool"]["minimum_should_match"] = json!(1);
    }
    let mut query = json!({"bool": {"should": [
        {"range": {lsn: {"lt": tl}}},
        {"bool": {"filter": [{"term": {lsn: tl}}, {"range": {seq: {"lt": ts}}}]}},
        earlier,
    ], "minimum_should_match": 1}});
    if soft {
        query["bool"]["must_not"] = json!([{"term": {config.soft_delete_field.as_str(): true}}]);
    }
    let page = config.bulk_max_actions.clamp(1, 10_000);
    let body = json!({
        "size": page,
        "version": true,
        "_source": if soft { json!(true) } else { json!([lsn, seq]) },
        "query": query,
    });
    refresh(client, &t.index).await?;
    let mut removed = 0;
    // Hard deletes are remembered (see `tombstones`).
    let remember = (!soft).then_some((tombstones, t.version));
    loop {
        let hits = search(client, &t.index, &body).await?;
        let mut chunk = Chunk::default();
        // The external version of each removal in `chunk`.
        let mut externals = Vec::new();
        for hit in hits {
            let found = stored(hit.version, hit.source, soft, spec);
            // Newer than the truncate (an earlier sink's document the query
            // cannot tell): not ours to remove.
            if !replaces(t.version, found.version) {
                continue;
            }
            let Some(external) = next_external(Some(found.external), t.version, config.seq_bits)
            else {
                continue;
            };
            let meta = ItemMeta {
                index: t.index.clone(),
                id: hit.id,
                op: if soft { OpKind::Index } else { OpKind::Delete },
                offset: t.offset,
                slot: 0,
            };
            let doc = found.source.filter(|_| soft).map(|mut doc| {
                doc.insert(config.soft_delete_field.clone(), Value::Bool(true));
                doc
            });
            let mut encoded = encode(meta, external, t.version, doc.as_ref(), spec.fields)
                .map_err(|e| EsError::Response {
                    what: "truncate",
                    reason: e.to_string(),
                })?;
            if !chunk.fits(encoded.len(), page, config.bulk_max_bytes) {
                let full = std::mem::take(&mut chunk);
                removed += send(client, full, &std::mem::take(&mut externals), remember).await?;
            }
            encoded.set_slot(externals.len());
            externals.push(external);
            chunk.push(encoded);
        }
        if chunk.is_empty() {
            return Ok(Outcome::Applied { removed });
        }
        removed += send(client, chunk, &externals, remember).await?;
    }
}

/// The dead-letter reason of a truncate whose index cannot be searched by `field`.
fn refusal(t: &Truncate, field: &str, found: &str) -> String {
    format!(
        "truncate of index {}: the version field `{field}` is {found} there, not a `long`; \
         map it as `long` in the index template (or let dynamic mapping add it) \
         and replay the truncate",
        t.index
    )
}

/// Sends removals, refreshing what they wrote so the next search no longer
/// finds them; their number. A 409 (rewritten newer meanwhile) is settled.
/// With `remember`, each hard delete applied is recorded at its external
/// version (`externals`, by slot).
async fn send(
    client: &Elasticsearch,
    chunk: Chunk,
    externals: &[i64],
    remember: Option<(&Tombstones, Version)>,
) -> Result<u64, EsError> {
    let n = chunk.len() as u64;
    let items: Vec<(String, String, usize)> = match remember {
        Some(_) => chunk
            .items()
            .iter()
            .map(|m| (m.index.clone(), m.id.clone(), m.slot))
            .collect(),
        None => Vec::new(),
    };
    let sent = bulk::send(client, chunk, RefreshPolicy::True).await?;
    if let Some((_, e)) = sent.failures.into_iter().next() {
        return Err(e);
    }
    if let Some((tombstones, version)) = remember {
        let refused: Vec<usize> = sent.conflicts.iter().map(|m| m.slot).collect();
        for (index, id, slot) in items {
            if let (false, Some(external)) = (refused.contains(&slot), externals.get(slot)) {
                tombstones.record(&index, &id, version, *external);
            }
        }
    }
    Ok(n)
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
