//! Writes that need the stored document: unchanged TOAST values and soft deletes.
//!
//! Elasticsearch's `_update` takes no external version, so the sink reads the
//! stored documents (`_mget`), merges on the client and indexes the result with
//! the event's external version — the version check stays with Elasticsearch.
//! A stored version at or above the event's means the event is stale: the write
//! is dropped (it would be a 409 anyway).
//!
//! **Limit:** a value unavailable in the event and absent from the stored
//! document (the sink started after the row's last full image, or the stored
//! document was deleted) cannot be known: the field is left out and a warning
//! names the document (never the values).
//!
//! Only one writer applies a given key at a time (one partition, one batch at a
//! time), so nothing changes the document between the read and the write except
//! a zombie runner during a rebalance; its older versions still lose to ours.

use std::collections::HashMap;
use std::time::Duration;

use ::elasticsearch::{Elasticsearch, MgetParts};
use oncely_core::log_limit::LogLimit;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::bulk::status_error;
use super::error::{Class, EsError};
use super::plan::{Action, Write};
use crate::event::replaces;

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
/// document, so rate-limited (issue 20: hundreds of lines a second).
static LEFT_OUT: LogLimit = LogLimit::new(Duration::from_secs(10), 5);

/// A stored document: its version and source.
type Stored = (i64, Map<String, Value>);

/// Resolves every write that [`Write::needs_stored`] into a plain index (or drops
/// it when the stored version is already newer). Reads at most `per_request` ids per `_mget`.
pub async fn resolve(
    client: &Elasticsearch,
    writes: &mut Vec<Write<'_>>,
    per_request: usize,
    (flag, version_field): (&str, &str),
) -> Result<(), EsError> {
    let wanted: Vec<usize> = (0..writes.len())
        .filter(|&i| writes[i].needs_stored())
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let mut stored: HashMap<usize, Option<Stored>> = HashMap::with_capacity(wanted.len());
    for part in wanted.chunks(per_request.max(1)) {
        let docs: Vec<Value> = part
            .iter()
            .map(|&i| json!({"_index": writes[i].index, "_id": writes[i].id}))
            .collect();
        let found = mget(client, docs).await?;
        if found.len() != part.len() {
            return Err(EsError::Response {
                what: "mget",
                reason: format!("{} docs for {} ids", found.len(), part.len()),
            });
        }
        stored.extend(part.iter().copied().zip(found));
    }
    let mut stale = vec![false; writes.len()];
    for (i, found) in stored {
        let w = &mut writes[i];
        if let Some((version, _)) = &found {
            if !replaces(w.version, *version) {
                stale[i] = true;
                continue;
            }
        }
        // The stored version field is written again from the new version.
        let source = found.map(|(_, mut source)| {
            if !version_field.is_empty() {
                source.shift_remove(version_field);
            }
            source
        });
        merge(w, source, flag);
    }
    let mut i = 0;
    writes.retain(|_| {
        i += 1;
        !stale[i - 1]
    });
    Ok(())
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

/// One `_mget`: for each requested doc, its version and source, or `None` when absent.
async fn mget(client: &Elasticsearch, docs: Vec<Value>) -> Result<Vec<Option<Stored>>, EsError> {
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
                (Some(v), Some(s)) => Ok(Some((v, s))),
                _ => Err(EsError::Response {
                    what: "mget",
                    reason: "a found document without _version or _source".into(),
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
                    version: 1,
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
