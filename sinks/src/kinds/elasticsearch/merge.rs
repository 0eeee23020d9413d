//! What the index holds for the documents a batch writes, and the writes
//! that need it: the version check, unchanged TOAST values, soft deletes.
//!
//! A write whose document Elasticsearch refused (409), and one that needs
//! the stored source, reads the stored document (`_mget`, at most
//! `bulk.max.actions` ids per request): its external version and its event
//! version (see [`super::version`]), and its source where the write needs it.
//! A stored version at or above the event's means the event is stale: the
//! write is dropped. Otherwise the write goes out at
//! [`next_external`](super::version::next_external) of the stored external
//! version; if anything changed the document meanwhile Elasticsearch
//! answers 409 and the write is read and decided again. Any other write goes
//! out first without a read, at the clock of its version alone: taken only
//! over a smaller external version, whose event is older (the clock never
//! decreases).
//!
//! Elasticsearch's `_update` takes no external version, so values unavailable
//! in the event (unchanged TOAST) and soft deletes are merged on the client
//! from the stored source and indexed whole.
//!
//! **Limit:** a value unavailable in the event and absent from the stored
//! document (the sink started after the row's last full image, or the stored
//! document was deleted) cannot be known: the field is left out and a warning
//! names the document (never the values).

use std::time::Duration;

use ::elasticsearch::{Elasticsearch, MgetParts};
use oncely_core::log_limit::LogLimit;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::bulk::{status_error, VersionFields};
use super::error::{Class, EsError};
use super::plan::{Action, Write};
use super::version::{unflip, unpack};
use crate::event::Version;

#[derive(Deserialize)]
struct MgetResponse {
    docs: Vec<MgetDoc>,
}

#[derive(Deserialize)]
struct MgetDoc {
    #[serde(default)]
    found: bool,
    #[serde(rename = "_version", default)]
    version: Option<i64>,
    #[serde(rename = "_source", default)]
    source: Option<Map<String, Value>>,
    #[serde(default)]
    error: Option<Value>,
}

/// The warning for values neither the event nor the index holds: per
/// document, so rate-limited (a large batch would write hundreds of lines a
/// second; docs/design.md, "Operations": warnings are rate-limited).
static LEFT_OUT: LogLimit = LogLimit::new(Duration::from_secs(10), 5);

/// A stored document.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Its external version.
    pub external: i64,
    /// Its event version: from the version fields, or (written by an
    /// earlier sink version) unpacked from the external version.
    pub version: Version,
    /// Its source without the version fields, when the write needs it.
    pub source: Option<Map<String, Value>>,
}

/// How to read stored documents.
#[derive(Debug, Clone, Copy)]
pub struct ReadSpec<'a> {
    /// The version fields.
    pub fields: VersionFields<'a>,
    /// `version.field` (left out of sources), may be empty.
    pub legacy_field: &'a str,
    /// `version.seq.bits`, to unpack the versions of earlier documents.
    pub seq_bits: u32,
    /// Ids per `_mget`.
    pub per_request: usize,
}

/// What the index holds for each of `writes` (`None`: absent).
pub async fn read(
    client: &Elasticsearch,
    writes: &[&Write<'_>],
    spec: ReadSpec<'_>,
) -> Result<Vec<Option<Stored>>, EsError> {
    let mut out = Vec::with_capacity(writes.len());
    for part in writes.chunks(spec.per_request.max(1)) {
        let docs: Vec<Value> = part
            .iter()
            .map(|w| {
                let source = if w.needs_stored() {
                    json!(true)
                } else {
                    json!([spec.fields.lsn, spec.fields.seq])
                };
                json!({"_index": w.index, "_id": w.id, "_source": source})
            })
            .collect();
        let found = mget(client, docs).await?;
        if found.len() != part.len() {
            return Err(EsError::Response {
                what: "mget",
                reason: format!("{} docs for {} ids", found.len(), part.len()),
            });
        }
        for (w, doc) in part.iter().zip(found) {
            out.push(
                doc.map(|(external, source)| stored(external, source, w.needs_stored(), spec)),
            );
        }
    }
    Ok(out)
}

/// The stored document of `external` and `source` (see [`Stored`]).
pub fn stored(
    external: i64,
    mut source: Map<String, Value>,
    keep_source: bool,
    spec: ReadSpec<'_>,
) -> Stored {
    let lsn = source.shift_remove(spec.fields.lsn);
    let seq = source.shift_remove(spec.fields.seq);
    let version = match (lsn.and_then(|v| v.as_i64()), seq.and_then(|v| v.as_i64())) {
        (Some(lsn), Some(seq)) => Version::new(unflip(lsn), unflip(seq)),
        _ => unpack(external, spec.seq_bits),
    };
    if !spec.legacy_field.is_empty() {
        source.shift_remove(spec.legacy_field);
    }
    Stored {
        external,
        version,
        source: keep_source.then_some(source),
    }
}

/// Fills `w`'s unavailable values (and soft delete) from `stored`, making it
/// a plain index or delete.
pub fn resolve(w: &mut Write<'_>, stored: Option<Map<String, Value>>, flag: &str) {
    if w.needs_stored() {
        merge(w, stored, flag);
    }
}

/// Fills `w` from the stored source and turns it into a plain index.
fn merge(w: &mut Write<'_>, stored: Option<Map<String, Value>>, flag: &str) {
    match &mut w.action {
        Action::Index { doc, missing } => {
            let unknown: Vec<String> = std::mem::take(missing)
                .into_iter()
                .filter(|field| match stored.as_ref().and_then(|s| s.get(field)) {
                    Some(v) => {
                        doc.to_mut().insert(field.clone(), v.clone());
                        false
                    }
                    None => true,
                })
                .collect();
            if !unknown.is_empty() {
                if let Some(suppressed) = LEFT_OUT.admit() {
                    tracing::warn!(
                        index = %w.index,
                        id = %w.id,
                        fields = ?unknown,
                        suppressed,
                        "unavailable (unchanged TOAST) values are not stored either: left out (at most 5 such lines per 10 s; `suppressed` counts the documents not logged since the previous line)"
                    );
                }
            }
        }
        Action::SoftDelete { fallback } => {
            let doc = match stored {
                Some(mut source) => {
                    source.insert(flag.to_owned(), Value::Bool(true));
                    std::borrow::Cow::Owned(source)
                }
                None => std::mem::take(fallback),
            };
            w.action = Action::Index {
                doc,
                missing: Vec::new(),
            };
        }
        Action::Delete => {}
    }
}

/// One `_mget`: for each requested doc, its external version and source, or
/// `None` when absent.
async fn mget(
    client: &Elasticsearch,
    docs: Vec<Value>,
) -> Result<Vec<Option<(i64, Map<String, Value>)>>, EsError> {
    let response = client
        .mget(MgetParts::None)
        .body(json!({ "docs": docs }))
        .send()
        .await
        .map_err(|source| EsError::Transport {
            what: "mget",
            source,
        })?;
    let status = response.status_code().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|source| EsError::Transport {
            what: "mget response",
            source,
        })?;
    if !(200..300).contains(&status) {
        return Err(status_error("mget", status, &body));
    }
    let parsed: MgetResponse = serde_json::from_slice(&body).map_err(|e| EsError::Response {
        what: "mget",
        reason: e.to_string(),
    })?;
    parsed
        .docs
        .into_iter()
        .map(|d| match d.error {
            // A missing index holds no document.
            Some(e) if e["type"] == "index_not_found_exception" => Ok(None),
            Some(e) => Err(EsError::Item {
                index: String::new(),
                id: String::new(),
                status: 0,
                error_type: e["type"].as_str().unwrap_or("").to_owned(),
                reason: e["reason"].as_str().unwrap_or("").to_owned(),
                class: Class::Retriable,
            }),
            None if d.found => match (d.version, d.source) {
                (Some(v), s) => Ok(Some((v, s.unwrap_or_default()))),
                _ => Err(EsError::Response {
                    what: "mget",
                    reason: "a found document without _version".into(),
                }),
            },
            None => Ok(None),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_burst_of_documents_with_unknown_values_logs_a_bounded_number_of_lines() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..1000 {
                let mut w = Write {
                    index: "shop.public.docs".into(),
                    id: i.to_string(),
                    version: Version::new(1, 0),
                    action: Action::Index {
                        doc: Cow::Owned(Map::new()),
                        missing: vec!["body".into()],
                    },
                    offset: i,
                };
                merge(&mut w, None, "__deleted");
                assert!(
                    matches!(&w.action, Action::Index { doc, .. } if !doc.contains_key("body"))
                );
            }
        });
        let text = String::from_utf8(lines.0.lock().expect("lock").clone()).expect("utf-8");
        let warned = text.lines().filter(|l| l.contains("left out")).count();
        assert_eq!(warned, 5, "{text}");
        assert!(text.contains("suppressed=0"), "{text}");
    }
}
