//! A chunk's rows on the transaction path: the pipelined read of the rows
//! the cache misses, and the writes of the changes newer than what is stored.

use std::sync::Arc;

use redis::{RedisResult, Value};
use rustc_hash::FxHashMap;

use super::super::error::classify;
use super::super::plan::{intern, Body, Change};
use super::{Keys, Outcome, Partition, Stored};
use crate::error::SinkError;

/// The next reply of a pipeline, an error when it ran short.
pub(super) fn next(replies: &mut impl Iterator<Item = RedisResult<Value>>) -> RedisResult<Value> {
    replies.next().unwrap_or_else(|| {
        Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "short reply",
        )))
    })
}

/// Queues the reads of the missed rows: each row's version and field names
/// (`HGET`, `HKEYS`: not `HGETALL`, which would bring every value of a wide
/// row into memory), then every tombstone in one `MGET`.
pub(super) fn reads(pipe: &mut redis::Pipeline, misses: &[&str], keys: &Keys<'_>) {
    if misses.is_empty() {
        return;
    }
    for row in misses {
        pipe.cmd("HGET").arg(*row).arg(keys.version_field);
        pipe.cmd("HKEYS").arg(*row);
    }
    let mget = pipe.cmd("MGET");
    for row in misses {
        mget.arg(format!("{}{row}", keys.version_prefix));
    }
}

/// Caches what [`reads`] returned; `Some(Foreign)` when a row holds another type.
pub(super) fn fill_misses(
    p: &mut Partition,
    misses: &[&str],
    replies: impl IntoIterator<Item = RedisResult<Value>>,
    keys: &Keys<'_>,
) -> Result<Option<Outcome>, SinkError> {
    if misses.is_empty() {
        return Ok(None);
    }
    let failed = |e: redis::RedisError| {
        if e.code() == Some("WRONGTYPE") {
            Ok(Some(Outcome::Foreign))
        } else {
            Err(classify("read versions", e))
        }
    };
    let mut replies = replies.into_iter();
    let mut rows = Vec::with_capacity(misses.len());
    for _ in misses {
        let version = next(&mut replies).and_then(|v| Ok(redis::from_redis_value(v)?));
        let fields = next(&mut replies).and_then(|v| Ok(redis::from_redis_value(v)?));
        match (version, fields) {
            (Ok(version), Ok(fields)) => rows.push((version, fields)),
            (Err(e), _) | (_, Err(e)) => return failed(e),
        }
    }
    let tombs: Vec<Option<Vec<u8>>> =
        match next(&mut replies).and_then(|v| Ok(redis::from_redis_value(v)?)) {
            Ok(tombs) => tombs,
            Err(e) => return failed(e),
        };
    if tombs.len() != misses.len() {
        return Err(SinkError::retriable("redis: short MGET reply"));
    }
    for ((row, (version, fields)), tomb) in misses.iter().zip(rows).zip(tombs) {
        p.rows.insert(
            (*row).to_owned(),
            fill(version, fields, tomb, keys.version_field),
        );
    }
    Ok(None)
}

/// The distinct row keys of `chunk` the cache does not know.
pub(super) fn misses<'c>(rows: &FxHashMap<String, Stored>, chunk: &'c [Change]) -> Vec<&'c str> {
    let mut out: Vec<&str> = chunk
        .iter()
        .map(|c| c.row_key.as_str())
        .filter(|k| !rows.contains_key(*k))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A row's state from `HGET row version-field`, `HKEYS row` and its
/// tombstone: the version is the row's, else the tombstone's (as the script
/// reads it).
fn fill(
    version: Option<Vec<u8>>,
    fields: Vec<String>,
    tomb: Option<Vec<u8>>,
    version_field: &str,
) -> Stored {
    let from_tomb = version.is_none() && tomb.is_some();
    let version = version.or(tomb).map(|v| {
        // Versions are 40 digits; anything else sorts as written by the script (bytewise).
        let mut out = [0u8; 40];
        let n = v.len().min(40);
        out[..n].copy_from_slice(&v[..n]);
        out
    });
    Stored {
        version,
        tomb: from_tomb,
        fields: fields.into_iter().filter(|f| f != version_field).collect(),
        in_set: false,
    }
}

/// Adds each newer change's commands to `tx` and its new state to the cache,
/// following the script's rule: a change is written only when its version
/// is greater than the stored one. Returns (applied, skipped).
pub(super) fn plan_writes(
    p: &mut Partition,
    keys: &Keys<'_>,
    chunk: &[Change],
    tx: &mut redis::Pipeline,
) -> (u64, u64) {
    let (mut applied, mut skipped) = (0, 0);
    // Rows new to their key set, added by one `SADD` per set (usually one per
    // chunk, not one per row); a delete sends its set's pending ones first.
    let mut adds: Vec<(&str, Vec<&str>)> = Vec::new();
    for c in chunk {
        let Some(stored) = p.rows.get_mut(&c.row_key) else {
            continue; // every key was filled above
        };
        if stored.version.is_some_and(|v| v >= c.version) {
            skipped += 1;
            continue;
        }
        let tomb_key = || format!("{}{}", keys.version_prefix, c.row_key);
        let next = match &c.body {
            Body::Delete => {
                if let Some(i) = adds.iter().position(|(set, _)| *set == c.key_set) {
                    let (set, rows) = adds.swap_remove(i);
                    tx.cmd("SADD").arg(set).arg(rows);
                }
                tx.cmd("DEL").arg(&c.row_key);
                tx.cmd("SREM").arg(&c.key_set).arg(&c.row_key);
                let set = tx.cmd("SET").arg(tomb_key()).arg(&c.version[..]);
                if keys.tombstone_ttl_ms > 0 {
                    set.arg("PX").arg(keys.tombstone_ttl_ms);
                }
                Stored {
                    version: Some(c.version),
                    tomb: true,
                    fields: Arc::from([]),
                    in_set: false,
                }
            }
            Body::Hash(row) => {
                // The row image replaces the hash: fields it no longer has go,
                // unavailable (unchanged TOAST) ones stay. Rows of a table
                // mostly have the fields of the row before them: nothing goes.
                // (`Arc`'s `==` compares the pointers first.)
                if stored.fields != row.names {
                    let stale: Vec<&String> = stored
                        .fields
                        .iter()
                        .filter(|f| !row.names.contains(f) && !row.keep.contains(f))
                        .collect();
                    if !stale.is_empty() {
                        tx.cmd("HDEL").arg(&c.row_key).arg(stale);
                    }
                }
                tx.add_command(row.hset.clone());
                if stored.tomb {
                    tx.cmd("DEL").arg(tomb_key());
                }
                if !stored.in_set {
                    match adds.iter_mut().find(|(set, _)| *set == c.key_set) {
                        Some((_, rows)) => rows.push(&c.row_key),
                        None => adds.push((&c.key_set, vec![&c.row_key])),
                    }
                }
                let fields = if row.keep.is_empty() {
                    row.names.clone()
                } else {
                    let kept = stored.fields.iter().filter(|f| row.keep.contains(f));
                    let names: Vec<&str> =
                        row.names.iter().chain(kept).map(String::as_str).collect();
                    intern(&mut p.last_fields, &names)
                };
                Stored {
                    version: Some(c.version),
                    tomb: false,
                    fields,
                    in_set: true,
                }
            }
            // Not sent here: truncates and JSON rows take the script path.
            Body::Truncate | Body::Json { .. } => continue,
        };
        *stored = next;
        applied += 1;
    }
    for (set, rows) in adds {
        tx.cmd("SADD").arg(set).arg(rows);
    }
    (applied, skipped)
}
