//! Bulk requests: NDJSON bodies bounded by count and bytes, versioned actions,
//! and the per-item outcome.
//!
//! Every action carries `version_type = external` (see [`super::version`] for
//! the number): Elasticsearch applies it only when it is greater than the
//! stored one (or tombstone); a refused item is reported as a conflict, for
//! the caller to read the document again. Every document carries its event
//! version in the version fields.

use ::elasticsearch::params::Refresh;
use ::elasticsearch::{BulkParts, Elasticsearch};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::RefreshPolicy;
use super::error::{
    classify_item, error_fields, exceeds_indexing_limit, Class, EsError, OpKind,
    INDEXING_LIMIT_HINT, REJECTED,
};
use super::version::flip;
use crate::event::Version;

/// The only response fields read: keeps bulk responses small.
const FILTER_PATH: &[&str] = &[
    "errors",
    "items.*.status",
    "items.*.error.type",
    "items.*.error.reason",
];

/// Who an item of a request is, to report its outcome.
#[derive(Debug, Clone)]
pub struct ItemMeta {
    /// Index.
    pub index: String,
    /// Document id.
    pub id: String,
    /// Operation.
    pub op: OpKind,
    /// The record dead-lettered if the item is rejected.
    pub offset: i64,
    /// The caller's number for the item (which write it is).
    pub slot: usize,
}

/// The names of the version fields every document carries.
#[derive(Debug, Clone, Copy)]
pub struct VersionFields<'a> {
    /// `version.lsn.field`.
    pub lsn: &'a str,
    /// `version.seq.field`.
    pub seq: &'a str,
}

/// One bulk request being filled.
#[derive(Debug, Default)]
pub struct Chunk {
    lines: Vec<Vec<u8>>,
    items: Vec<ItemMeta>,
    bytes: usize,
}

impl Chunk {
    /// Number of actions.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True without actions.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// NDJSON bytes so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// True when an encoded action of `extra` bytes may join this request
    /// without passing `max_actions` or `max_bytes`; an empty request takes any
    /// one action, however large.
    pub fn fits(&self, extra: usize, max_actions: usize, max_bytes: usize) -> bool {
        self.is_empty() || (self.len() < max_actions && self.bytes + extra <= max_bytes)
    }

    /// Who the actions are, in order.
    pub fn items(&self) -> &[ItemMeta] {
        &self.items
    }

    /// Adds an encoded action.
    pub fn push(&mut self, action: Encoded) {
        self.bytes += action.len();
        self.lines.push(action.action);
        if let Some(source) = action.source {
            self.lines.push(source);
        }
        self.items.push(action.meta);
    }
}

/// One action, encoded.
#[derive(Debug)]
pub struct Encoded {
    meta: ItemMeta,
    action: Vec<u8>,
    source: Option<Vec<u8>>,
}

impl Encoded {
    /// Sets the caller's number for the item ([`ItemMeta::slot`]).
    pub fn set_slot(&mut self, slot: usize) {
        self.meta.slot = slot;
    }

    /// Bytes on the wire, newlines included.
    pub fn len(&self) -> usize {
        self.action.len() + 1 + self.source.as_ref().map_or(0, |s| s.len() + 1)
    }

    /// Never true: an action has at least its action line.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Encodes an `index` (with `doc`, which gets the version fields of
/// `version`) or `delete` (without) at external version `external`.
pub fn encode(
    meta: ItemMeta,
    external: i64,
    version: Version,
    doc: Option<&Map<String, Value>>,
    fields: VersionFields<'_>,
) -> Result<Encoded, serde_json::Error> {
    let verb = match meta.op {
        OpKind::Index => "index",
        OpKind::Delete => "delete",
    };
    let mut action = Vec::with_capacity(96 + meta.index.len() + meta.id.len());
    action.extend_from_slice(b"{\"");
    action.extend_from_slice(verb.as_bytes());
    action.extend_from_slice(b"\":{\"_index\":");
    push_json_str(&mut action, &meta.index);
    action.extend_from_slice(b",\"_id\":");
    push_json_str(&mut action, &meta.id);
    action.extend_from_slice(b",\"version\":");
    action.extend_from_slice(external.to_string().as_bytes());
    action.extend_from_slice(b",\"version_type\":\"external\"}}");
    let source = doc
        .map(|d| {
            // `{...}` becomes `{...,"<lsn>":<l>,"<seq>":<s>}`: the version as
            // searchable fields, without copying the document to add them
            // (the plan refuses rows with columns of those names).
            let mut source = serde_json::to_vec(d)?;
            source.pop();
            for (name, value) in [(fields.lsn, version.lsn), (fields.seq, version.seq)] {
                if source.len() > 1 {
                    source.push(b',');
                }
                push_json_str(&mut source, name);
                source.push(b':');
                source.extend_from_slice(flip(value).to_string().as_bytes());
            }
            source.push(b'}');
            Ok::<_, serde_json::Error>(source)
        })
        .transpose()?;
    Ok(Encoded {
        meta,
        action,
        source,
    })
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[derive(Deserialize)]
struct BulkResponse {
    #[serde(default)]
    errors: bool,
    #[serde(default)]
    items: Vec<ItemWrap>,
}

#[derive(Deserialize)]
struct ItemWrap {
    #[serde(alias = "delete", alias = "create", alias = "update")]
    index: ItemResult,
}

#[derive(Deserialize)]
struct ItemResult {
    status: u16,
    #[serde(default)]
    error: Option<ItemError>,
}

#[derive(Deserialize)]
struct ItemError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    reason: String,
}

/// Items of a request that were not settled, each with its error (class inside).
pub type Failures = Vec<(ItemMeta, EsError)>;

/// The outcome of a request's items.
#[derive(Debug, Default)]
pub struct Sent {
    /// Items not settled, each with its error (class inside).
    pub failures: Failures,
    /// Items refused for their external version (409): the stored one is at
    /// or above it.
    pub conflicts: Vec<ItemMeta>,
}

/// Sends `chunk`; `Err` when the request as a whole failed, else the items'
/// outcome.
pub async fn send(
    client: &Elasticsearch,
    chunk: Chunk,
    refresh: RefreshPolicy,
) -> Result<Sent, EsError> {
    let Chunk { lines, items, .. } = chunk;
    let refresh = match refresh {
        RefreshPolicy::False => Refresh::False,
        RefreshPolicy::True => Refresh::True,
        RefreshPolicy::WaitFor => Refresh::WaitFor,
    };
    let response = client
        .bulk(BulkParts::None)
        .refresh(refresh)
        .filter_path(FILTER_PATH)
        .body(lines)
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "bulk",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|source| EsError::Transport {
            what: "bulk response",
            source,
        })?;
    if !(200..300).contains(&status) {
        let error = status_error("bulk", status, &body);
        return match (error, items.len()) {
            // A request of one document refused at the coordinating stage for
            // its size alone: that document, not the request, is the failure.
            (
                EsError::Status {
                    status: 429,
                    error_type: Some(ty),
                    reason,
                    ..
                },
                1,
            ) if ty == REJECTED && exceeds_indexing_limit(&reason).is_some() => {
                let Some(meta) = items.into_iter().next() else {
                    return Err(EsError::Response {
                        what: "bulk",
                        reason: "one item expected".into(),
                    });
                };
                let error = too_large(&meta, status, ty, &reason);
                Ok(Sent {
                    failures: vec![(meta, error)],
                    conflicts: Vec::new(),
                })
            }
            (error, _) => Err(error),
        };
    }
    let parsed: BulkResponse = serde_json::from_slice(&body).map_err(|e| EsError::Response {
        what: "bulk",
        reason: e.to_string(),
    })?;
    if parsed.items.len() != items.len() {
        return Err(EsError::Response {
            what: "bulk",
            reason: format!("{} items for {} actions", parsed.items.len(), items.len()),
        });
    }
    let mut sent = Sent::default();
    // `errors` is false for a versioned delete of an absent document (404) too:
    // anything but an all-2xx response is classified item by item.
    if !parsed.errors && parsed.items.iter().all(|i| i.index.status < 300) {
        return Ok(sent);
    }
    for (meta, item) in items.into_iter().zip(parsed.items) {
        let result = item.index;
        let (kind, reason) = result
            .error
            .map(|e| (Some(e.kind), e.reason))
            .unwrap_or((None, String::new()));
        let class = classify_item(meta.op, result.status, kind.as_deref(), &reason);
        if class == Class::Settled {
            if result.status == 409 {
                sent.conflicts.push(meta);
            }
            continue;
        }
        if result.status == 429 && class == Class::Record {
            let error = too_large(&meta, result.status, kind.unwrap_or_default(), &reason);
            sent.failures.push((meta, error));
            continue;
        }
        let error = EsError::Item {
            index: meta.index.clone(),
            id: meta.id.clone(),
            status: result.status,
            error_type: kind.unwrap_or_default(),
            reason,
            class,
        };
        sent.failures.push((meta, error));
    }
    Ok(sent)
}

/// The dead-letter error of a document over the indexing-pressure limit.
fn too_large(meta: &ItemMeta, status: u16, error_type: String, reason: &str) -> EsError {
    EsError::Item {
        index: meta.index.clone(),
        id: meta.id.clone(),
        status,
        error_type,
        reason: format!("{reason}; {INDEXING_LIMIT_HINT}"),
        class: Class::Record,
    }
}

/// The error of a non-2xx response, with `error.type` / `error.reason` when the body has them.
pub fn status_error(what: &'static str, status: u16, body: &[u8]) -> EsError {
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (error_type, reason) = error_fields(&json);
    let reason = reason.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        text.chars().take(300).collect()
    });
    EsError::Status {
        what,
        status,
        error_type,
        reason,
    }
}

/// A response's body as JSON (`null` when it is not JSON).
pub(super) async fn read_json(
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

    fn meta(op: OpKind) -> ItemMeta {
        ItemMeta {
            index: "in\"dex".into(),
            id: "7".into(),
            op,
            offset: 3,
            slot: 0,
        }
    }

    const FIELDS: VersionFields<'static> = VersionFields {
        lsn: "__l",
        seq: "__s",
    };

    #[test]
    fn actions_are_versioned_ndjson() {
        let mut doc = Map::new();
        doc.insert("a".into(), Value::from(1));
        let v = Version::new(u64::MAX, 1);
        let e = encode(meta(OpKind::Index), 42, v, Some(&doc), FIELDS).expect("encode");
        let action: Value = serde_json::from_slice(&e.action).expect("json");
        assert_eq!(
            action,
            serde_json::json!({"index": {"_index": "in\"dex", "_id": "7", "version": 42, "version_type": "external"}})
        );
        let source: Value =
            serde_json::from_slice(e.source.as_deref().expect("source")).expect("json");
        assert_eq!(
            source,
            serde_json::json!({"a": 1, "__l": i64::MAX, "__s": i64::MIN + 1})
        );
        let empty = encode(meta(OpKind::Index), 7, v, Some(&Map::new()), FIELDS).expect("encode");
        let source: Value =
            serde_json::from_slice(empty.source.as_deref().expect("source")).expect("json");
        assert_eq!(source.as_object().map(Map::len), Some(2));
        let d = encode(meta(OpKind::Delete), 43, v, None, FIELDS).expect("encode");
        let action: Value = serde_json::from_slice(&d.action).expect("json");
        assert_eq!(action["delete"]["version"], 43);
        assert!(d.source.is_none());
        assert_eq!(d.len(), d.action.len() + 1);
    }

    #[test]
    fn chunks_close_on_count_and_bytes() {
        let mut c = Chunk::default();
        let e = encode(meta(OpKind::Delete), 1, Version::new(0, 1), None, FIELDS).expect("encode");
        let n = e.len();
        assert!(c.fits(n, 2, n * 2));
        c.push(e);
        assert!(c.fits(n, 2, n * 2));
        assert!(!c.fits(n, 1, n * 10), "count bound");
        assert!(!c.fits(n, 10, n + n / 2), "byte bound");
        // An empty chunk takes any single action, however large.
        assert!(Chunk::default().fits(usize::MAX / 2, 1, 1));
    }
}
