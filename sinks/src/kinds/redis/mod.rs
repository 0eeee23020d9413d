//! `redis`: a cache of the current row per key, correct after any crash or
//! replay. Owns its consumer positions.
//!
//! ```toml
//! [sink]
//! kind = "redis"
//! url = "redis://127.0.0.1:6379/0"     # rediss://... for TLS
//! # tls.ca.file = "/etc/oncely/redis-ca.pem"   # CAs to trust (default: the system's)
//! password = "${env:REDIS_PASSWORD}"   # optional; username too (ACL)
//! layout = "hash"                      # or "json"
//! value.format = "native"              # or "wire" (days and µs since 1970)
//! key.pattern = "{table}:{key}"
//! ```
//!
//! # How it stays exact
//!
//! In the hash layout without `ttl.seconds`, each batch becomes **one
//! transaction** (`MULTI`/`EXEC`) of plain commands: the runner keeps the
//! versions of its partition's rows in memory (read once, by one pipelined
//! read of the rows it does not know yet), writes only the changes newer
//! than them, and stores the position in the same transaction. A fence per
//! partition (`<fence.key.prefix><topic>:<partition>`, taken on assignment)
//! and the truncate counter are `WATCH`ed: a runner that lost its partition
//! writes nothing and stores no position, and a cache another writer or a
//! truncate made stale is read again (see the `transaction` module). Otherwise — the JSON
//! layout, rows with a TTL, truncates, a row key of another type — a batch
//! becomes **one Lua script call** (`EVALSHA`; on `NOSCRIPT` the
//! script is loaded again). For every change the script compares the
//! change's [`Version`](crate::event::Version) (commit LSN, event ordinal)
//! with the version stored beside the row and writes only if it is newer;
//! then, in the same call, it stores the batch's next offset in the group's
//! positions hash. Redis runs a script atomically and logs its writes as one
//! unit, so rows and position never disagree, and on assignment the runner
//! seeks to the positions read back from Redis: each change is applied once.
//! The version check is the second line of defence: replays (positions lost,
//! a second consumer group, a zombie runner) never move a key backwards.
//!
//! # Layout
//!
//! * Row key: `key.pattern` with `{topic}`, `{db}`, `{schema}`, `{table}` and
//!   `{key}` (the primary key values in key order, joined by `key.separator`);
//!   each value is escaped (`\` before `\`, before the separator's and the
//!   pattern's own characters), so two rows never share a key.
//! * `layout = "hash"`: one field per non-null column (strings as is, numbers,
//!   booleans, arrays and objects as JSON text); null columns have no field.
//!   `layout = "json"`: the row as a JSON object string.
//! * Values (`value.format`): `native` (default) in their users' form, read
//!   from the event's Connect schema ([`crate::native`]): dates, times and
//!   timestamps as ISO-8601 text, JSON columns nested in the JSON layout (a
//!   hash field holds their text), the rest as sent (decimal strings, base64
//!   bytes); schemaless events as sent. `wire`: every value as sent
//!   (Debezium's value mapping, see the wire format).
//! * Version: 40 digits. In the hash layout a live row carries it in the
//!   field `version.field` (default `_oncely_version`; a column of that name
//!   is a per-record failure — pick another name), so one `HGET` and one
//!   `HSET` per change read and write row and version together. In the JSON
//!   layout it lives at `<version.key.prefix><row key>`.
//! * Positions: the hash `<positions.key.prefix><group.id>`, field
//!   `<topic>:<partition>`.
//! * Fences: the hash `<fence.key.prefix><topic>:<partition>`, field
//!   `<group.id>` = the token of the group's current owner, field `""` = the
//!   last writer; and the counter `<fence.key.prefix>truncates`.
//! * Key sets: the set `<keyset.key.prefix><db>.<schema>.<table>` (each name
//!   escaped as in row keys, `\` before `\` and `.`) holds the
//!   row keys of a table's live rows, written in the same script call as the
//!   rows, so a truncate finds them without a scan of the keyspace.
//!
//! # Truncates
//!
//! Capture puts a truncate on every partition of the table's topic. Each copy
//! removes the table's rows whose version is older than the truncate (and
//! leaves newer ones: another partition may already have applied rows
//! written after it), going through the key set in calls of at most
//! `script.max.changes` members; the last call stores the position. No
//! tombstones are left: an older row that another partition applies later is
//! removed by that partition's own copy, which follows it. Rows cached by a
//! sink version without key sets are in none, so a truncate leaves them.
//! * `ttl.seconds` (optional) expires a row and its version together.
//! * Unchanged TOAST columns keep their stored value: the hash layout does not
//!   touch the field; the JSON layout reads the stored row first and fills them
//!   in (a column of a row the cache does not hold is left out).
//!
//! # Deletes and their retention limit
//!
//! A delete removes the row and keeps its version as a **tombstone** — the
//! key `<version.key.prefix><row key>` — for `tombstone.ttl.seconds` (default 7 days, 0 = forever; ~100 bytes per deleted
//! key). A replayed older insert cannot bring the row back while the tombstone
//! lives. After it expires, only a replay from a position older than the delete
//! could resurrect the row — which needs the stored positions to be lost — and
//! that replay then also re-applies the delete that follows in the partition.
//!
//! # Bounds
//!
//! Redis is single-threaded: while a script runs, no other client is served.
//! A call carries at most `script.max.changes` (default 1000) changes and about
//! `script.max.bytes` (default 4 MiB) of arguments; a larger batch is split and
//! its position is written by the last call only (earlier calls are versioned,
//! so a crash in between is harmless). Measured here, a 1000-change call blocks
//! Redis for a few milliseconds (see BENCHMARKS.md); lower the bound for
//! latency-sensitive neighbours. Memory is bounded by the batch.
//!
//! # Persistence requirement
//!
//! Positions live in Redis, so Redis must persist them: run it with
//! `appendonly yes` (`appendfsync everysec` or `always`). A script's writes
//! reach the AOF as one unit, so losing the last second of writes rewinds rows
//! and positions together and the sink re-reads that second from Kafka. If
//! Redis loses everything (no persistence), no position is found and every
//! partition starts again from `auto.offset.reset` (**not** from Kafka's
//! committed offsets, which a position-owning sink never reads): with
//! `earliest` the cache is rebuilt from what Kafka retains; with `latest` it
//! misses everything before. The sink logs a warning at start when
//! `appendonly` is `no`.
//!
//! # Limits
//!
//! * Standalone Redis (or a primary with replicas) only: a cluster would need
//!   all keys of a call in one slot.
//! * A key of another Redis type under a row key is a per-record failure
//!   (dead-lettered) in the hash layout; the JSON layout overwrites it.
//! * A zombie runner (one that lost its partition but still writes): on the
//!   transaction path it writes nothing once the new owner took the fence;
//!   on the script path it may store an older position after the new
//!   owner's (versions keep the rows right; the cost is re-reading those
//!   records after the next restart).
//! * The transaction path trusts its cache while the fence says it was the
//!   last writer: every write (either path) marks the fence.

mod calls;
pub mod config;
mod error;
mod keys;
mod plan;
mod script;
mod sink;
mod transaction;
mod verify_reader;

pub use config::{Layout, RedisConfig};
pub use keys::KeyPattern;
pub use plan::stored_form;
pub use script::{decode_version, encode_version, position_field, HASH_SCRIPT, JSON_SCRIPT};
pub use sink::RedisSink;
pub use verify_reader::RedisVerifyReader;

#[async_trait::async_trait]
impl super::SinkKind for RedisConfig {
    fn validate(&self) -> Result<(), crate::error::ConfigError> {
        RedisConfig::validate(self)
    }
    fn field_selection(
        &self,
    ) -> Result<Option<crate::fields::FieldSelection>, crate::error::ConfigError> {
        crate::fields::FieldSelection::parse(&self.fields_include, &self.fields_exclude)
    }
    async fn build(
        &self,
    ) -> Result<std::sync::Arc<dyn crate::sink::Sink>, crate::error::SinkError> {
        Ok(std::sync::Arc::new(RedisSink::connect(self).await?))
    }
    async fn verify_reader(
        &self,
        ctx: &crate::verify_reader::VerifyContext<'_>,
    ) -> Option<
        Result<Box<dyn crate::verify_reader::VerifyReader>, crate::verify_reader::VerifyReadError>,
    > {
        let reader = RedisVerifyReader::connect(self, ctx).await;
        Some(reader.map(|m| Box::new(m) as Box<dyn crate::verify_reader::VerifyReader>))
    }
}

#[cfg(test)]
mod tests;
