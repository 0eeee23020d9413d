//! The transaction path of the hash layout: versions read once, decided in
//! the client, written as one `MULTI`/`EXEC` of plain commands.
//!
//! The script path spends ~15 µs per change in Lua (argument conversion, two
//! `redis.call`s, garbage collection) where a plain `HSET` costs ~2.5 µs
//! (BENCHMARKS.md). A partition's keys are written by one runner at a time,
//! so that runner can remember what it wrote: a cache of row key → stored
//! version (and the row's field names), filled for misses by one pipelined
//! read per chunk. The chunk then becomes plain `HSET`/`HDEL`/`DEL`/`SET`
//! commands plus the position, in one transaction: Redis applies it
//! atomically and logs it as one unit, like a script.
//!
//! # Why the cache stays right
//!
//! Every partition has a **fence**, the hash `<fence.key.prefix><topic>:<partition>`:
//! field `<group>` holds the token of the runner the group last assigned the
//! partition to ([`TransactionPath::claim`], called from `load_positions`), field `""`
//! the token of the last runner that wrote the partition's keys through a
//! transaction (`script` after a script call). Each chunk `WATCH`es the
//! fence and the truncate counter `<fence.key.prefix>truncates` before it
//! reads them, and the `EXEC` fails when either changed in between. The
//! `WATCH` is sent again right after each `EXEC` (same pipeline), so the next
//! chunk, when its rows are cached, needs neither the read nor a second
//! round trip: a change of either key since our last `EXEC` aborts it, and the
//! retry reads them.
//!
//! * **zombie**: a runner whose group token is not its own lost the
//!   partition; it writes nothing, stores no position and returns a
//!   retriable error (the runner's revocation stops it);
//! * **another writer** (a second consumer group, a script call): the writer
//!   token is not ours, so the cache is dropped and the versions read again;
//! * **a truncate** from another partition's copy (which removes rows of our
//!   keys) bumps the counter: the cache is dropped too.
//!
//! A chunk whose rows hold another Redis type (`WRONGTYPE`) goes to the
//! script, which reports those records. Rows with a TTL, the JSON layout and
//! truncates keep the script path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisResult, Value};
use rustc_hash::FxHashMap;

use super::error::classify;
use super::plan::Change;
use super::script::position_field;
use crate::error::SinkError;
use crate::sink::TopicPartition;
use rows::{fill_misses, misses, next, plan_writes, reads};

mod rows;

/// Rows remembered per partition; past it the cache starts again (bounded memory,
/// ~150 bytes a row).
const MAX_CACHED_ROWS: usize = 250_000;
/// Transactions tried per chunk before a retriable error (each failed one was
/// aborted by a concurrent change of the fence or the truncate counter).
const MAX_ATTEMPTS: usize = 4;
/// The fence field of the last transaction writer.
pub(super) const WRITER: &str = "";
/// The writer token a script call leaves: no runner's cache matches it.
pub(super) const SCRIPT_WRITER: &str = "script";

/// The fence hash of a partition: `<fence.key.prefix><topic>:<partition>`.
pub(super) fn fence_key(prefix: &str, tp: &TopicPartition) -> String {
    format!("{prefix}{}", position_field(&tp.topic, tp.partition))
}

/// The counter every truncate call increments: `<fence.key.prefix>truncates`
/// (no `:`, so no partition's fence).
pub(super) fn truncates_key(prefix: &str) -> String {
    format!("{prefix}truncates")
}

/// What a row key holds, as far as this runner knows.
#[derive(Debug, Clone)]
struct Stored {
    /// The row's version or its tombstone's; `None`: neither.
    version: Option<[u8; 40]>,
    /// A tombstone key exists (the version came from it).
    tomb: bool,
    /// The row's fields besides the version (empty: no row).
    fields: Arc<[String]>,
    /// The row key is in its table's key set.
    in_set: bool,
}

/// One partition's fence token, connection and cache.
#[derive(Default)]
pub(super) struct Partition {
    group: String,
    token: String,
    /// Dedicated: `WATCH` belongs to a connection, and only this partition's
    /// (sequential) batches use it.
    conn: Option<MultiplexedConnection>,
    /// Fx: hashing the row keys is a visible part of a chunk's client time.
    rows: FxHashMap<String, Stored>,
    /// The truncate counter the cache was filled under.
    epoch: Option<i64>,
    /// The last field-name list, shared by rows with the same columns.
    last_fields: Option<Arc<[String]>>,
    /// `conn` has `WATCH`ed the fence and the counter since this partition's
    /// last `EXEC`, and the cache is right as of that `EXEC`.
    watching: bool,
}

impl Partition {
    /// Forgets every cached row (after a script call, a truncate, an abort).
    pub(super) fn forget(&mut self) {
        self.rows.clear();
        self.epoch = None;
        self.watching = false;
    }
}

/// What a chunk came to.
pub(super) enum Outcome {
    /// Written (or skipped as not newer), position stored when given.
    Done { applied: u64, skipped: u64 },
    /// A row key holds another type: nothing written, let the script report it.
    Foreign,
}

/// Names and settings a chunk needs.
pub(super) struct Keys<'a> {
    pub positions: &'a str,
    pub version_field: &'a str,
    pub version_prefix: &'a str,
    pub tombstone_ttl_ms: u64,
}

/// The transaction path's shared part: client and per-partition state.
pub(super) struct TransactionPath {
    client: Client,
    conn_config: AsyncConnectionConfig,
    fence_prefix: String,
    parts: Mutex<HashMap<TopicPartition, Arc<tokio::sync::Mutex<Partition>>>>,
}

impl TransactionPath {
    pub(super) fn new(
        client: Client,
        conn_config: AsyncConnectionConfig,
        fence_prefix: String,
    ) -> Self {
        Self {
            client,
            conn_config,
            fence_prefix,
            parts: Mutex::new(HashMap::new()),
        }
    }

    /// The state of `tp` (created empty).
    pub(super) fn partition(&self, tp: &TopicPartition) -> Arc<tokio::sync::Mutex<Partition>> {
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        parts.entry(tp.clone()).or_default().clone()
    }

    /// Takes `tp` for `group` with a fresh token: a runner `group` assigned
    /// it to before now fails its next chunk. Starts with an empty cache.
    pub(super) async fn claim(
        &self,
        conn: &mut ConnectionManager,
        group: &str,
        tp: &TopicPartition,
        p: &mut Partition,
    ) -> Result<(), SinkError> {
        let token = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        redis::cmd("HSET")
            .arg(fence_key(&self.fence_prefix, tp))
            .arg(group)
            .arg(&token)
            .query_async::<()>(conn)
            .await
            .map_err(|e| classify("HSET fence", e))?;
        p.group = group.to_owned();
        p.token = token;
        p.forget();
        Ok(())
    }

    /// Whether `p` holds `group`'s claim on its partition.
    pub(super) fn claimed(p: &Partition, group: &str) -> bool {
        !p.token.is_empty() && p.group == group
    }

    async fn conn<'p>(
        &self,
        p: &'p mut Partition,
    ) -> Result<&'p mut MultiplexedConnection, SinkError> {
        if p.conn.is_none() {
            let c = self
                .client
                .get_multiplexed_async_connection_with_config(&self.conn_config)
                .await
                .map_err(|e| classify("connect (transactions)", e))?;
            p.conn = Some(c);
        }
        p.conn
            .as_mut()
            .ok_or_else(|| SinkError::retriable("redis: no connection"))
    }

    /// Applies `chunk` of `tp` (no truncates) in one transaction, storing
    /// `position` when given. Any failure leaves the cache empty and the
    /// connection dropped (which ends its `WATCH`).
    pub(super) async fn apply(
        &self,
        p: &mut Partition,
        tp: &TopicPartition,
        keys: &Keys<'_>,
        chunk: &[Change],
        position: Option<(&str, i64)>,
    ) -> Result<Outcome, SinkError> {
        let out = self.attempts(p, tp, keys, chunk, position).await;
        if !matches!(out, Ok(Outcome::Done { .. })) {
            p.forget();
            p.conn = None;
        }
        out
    }

    async fn attempts(
        &self,
        p: &mut Partition,
        tp: &TopicPartition,
        keys: &Keys<'_>,
        chunk: &[Change],
        position: Option<(&str, i64)>,
    ) -> Result<Outcome, SinkError> {
        let fence = fence_key(&self.fence_prefix, tp);
        let truncates = truncates_key(&self.fence_prefix);
        let mut aborted = 0;
        while aborted < MAX_ATTEMPTS {
            let misses = misses(&p.rows, chunk);
            // The WATCH sent right after our last EXEC still holds: a change of
            // the fence or the counter since then aborts this EXEC, so neither
            // is read again (one round trip when every row is cached).
            let watched = std::mem::take(&mut p.watching);
            let writer_ours = if watched {
                if !misses.is_empty() {
                    let mut read = redis::pipe();
                    reads(&mut read, &misses, keys);
                    let conn = self.conn(p).await?;
                    let replies: Vec<RedisResult<Value>> = read
                        .ignore_errors()
                        .query_async(conn)
                        .await
                        .map_err(|e| classify("read versions", e))?;
                    if let Some(out) = fill_misses(p, &misses, replies, keys)? {
                        return Ok(out);
                    }
                }
                true
            } else {
                let mut read = redis::pipe();
                read.cmd("WATCH").arg(&fence).arg(&truncates).ignore();
                read.cmd("HMGET").arg(&fence).arg(&p.group).arg(WRITER);
                read.cmd("GET").arg(&truncates);
                reads(&mut read, &misses, keys);
                let group = p.group.clone();
                let conn = self.conn(p).await?;
                let replies: Vec<RedisResult<Value>> = read
                    .ignore_errors()
                    .query_async(conn)
                    .await
                    .map_err(|e| classify("WATCH and read versions", e))?;
                let mut replies = replies.into_iter();
                let (owner, writer): (Option<String>, Option<String>) = next(&mut replies)
                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                    .map_err(|e| classify("HMGET fence", e))?;
                let epoch: Option<i64> = next(&mut replies)
                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                    .map_err(|e| classify("GET truncates", e))?;
                if owner.as_deref() != Some(p.token.as_str()) {
                    return Err(SinkError::retriable(format!(
                        "redis: partition {tp} was assigned to another runner of group `{group}`: \
                         this one lost it and writes nothing"
                    )));
                }
                // Someone else wrote our keys, or a truncate removed some: read again.
                let writer_ours = writer.as_deref() == Some(p.token.as_str());
                if !p.rows.is_empty() && (!writer_ours || epoch != p.epoch) {
                    p.forget();
                    continue;
                }
                p.epoch = epoch;
                if let Some(out) = fill_misses(p, &misses, replies, keys)? {
                    return Ok(out);
                }
                writer_ours
            };
            // MULTI, the writes, EXEC, then WATCH again for the next chunk, in
            // one pipeline; only the last two replies are read.
            let mut tx = redis::pipe();
            tx.cmd("MULTI");
            let (applied, skipped) = plan_writes(p, keys, chunk, &mut tx);
            if let Some((field, next)) = position {
                tx.cmd("HSET").arg(keys.positions).arg(field).arg(next);
            }
            if !writer_ours {
                tx.cmd("HSET").arg(&fence).arg(WRITER).arg(&p.token);
            }
            tx.cmd("EXEC");
            tx.cmd("WATCH").arg(&fence).arg(&truncates);
            // Tests change the fence here, between the read and the EXEC.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("redis-sink-before-exec");
            let sent = tx.len();
            let conn = self.conn(p).await?;
            let exec = conn
                .req_packed_commands(&tx, sent - 2, 2)
                .await
                .map_err(|e| classify("MULTI/EXEC", e))?
                .into_iter()
                .next()
                .unwrap_or(Value::Nil);
            if exec != Value::Nil {
                exec.extract_error().map_err(|e| classify("EXEC", e))?;
                if p.rows.len() > MAX_CACHED_ROWS {
                    p.forget();
                } else {
                    p.watching = true;
                }
                return Ok(Outcome::Done { applied, skipped });
            }
            // EXEC refused: the fence or the counter changed after WATCH.
            p.forget();
            aborted += 1;
        }
        Err(SinkError::retriable(format!(
            "redis: {tp}: {MAX_ATTEMPTS} transactions aborted by concurrent changes of the fence"
        )))
    }
}
