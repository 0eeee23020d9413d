//! Runner-level dedup: the `[dedup]` table puts a bounded window of event
//! identities (`oncely-dedup`) in front of any sink that does not own its
//! positions, so a record the target already took is skipped, not applied again.
//!
//! # What the window guarantees
//!
//! For each batch the runner (1) asks the window which records it holds and
//! drops them (counted in `oncely_sink_dedup_skipped_total`), (2) applies the
//! rest, (3) puts their identities in the window — only after the sink
//! returned `Ok`. Hence:
//!
//! * A record whose identity is in the window is never applied again: not on a
//!   retried batch, not after a restart or rebalance that reads older offsets
//!   again (with `store = "redis"`, which outlives the process; the `memory`
//!   store only covers retries and redeliveries inside one process), as long
//!   as the identity is younger than `ttl.ms` (and, in memory, among the last
//!   `max.entries` and within `max.bytes`).
//! * A crash (or a failed window write) between the target's acknowledgement
//!   and step 3 leaves those records out of the window: they are applied once
//!   more. At most the batches in flight at the crash repeat, i.e. at most
//!   `batch.max.records` records per partition. That repeat carries the same
//!   identity, which sinks hand to the target (the HTTP sink's
//!   `Idempotency-Key`), so a target that remembers keys absorbs it too.
//! * A partially applied batch that failed (retriable or rejected records) is
//!   applied again whole: the same bound and the same key cover it.
//!
//! # Identity
//!
//! `<topic>/<commit_lsn>/<event_seq>` — the event's source position, unique per
//! event (a tombstone carrying `oncely.position` is decoded as the delete it
//! follows, hence a duplicate of it). Events of a topic Debezium wrote share
//! positions (every row of a snapshot has the snapshot's `source.lsn`, so do
//! the rows of one multi-row WAL record), so theirs is
//! `<topic>/<lsn>/<seq>/<partition>:<offset>`: the record's place in Kafka
//! tells them apart, and a replay of the same record is still a repeat. Or,
//! with `identity.field`, the value of
//! that field of the envelope (`after.event_id`: an outbox event's own id), or,
//! with `identity.header`, the value of that Kafka header (`<topic>/<name>=<value>`;
//! the runner carries only that header). Under `identity.header` a change
//! without the header (or with an empty one, or one longer than
//! [`MAX_IDENTITY_HEADER_BYTES`]) is never applied unchecked: it goes to the
//! dead-letter topic, the reason naming the header. Records without a change
//! event (plain tombstones, Debezium bookkeeping) and without the header have
//! no identity and always pass.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::try_join_all;
use oncely_dedup::{DedupError, MemoryWindow, RedisWindow, WindowStore};
use prometheus::IntCounterVec;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ConfigError, RecordFailure, SinkError};
use crate::event::VersionOrigin;
use crate::sink::{Batch, Positions, Record, Sink};
use oncely_core::Secret;

/// Default `dedup.max.entries` (memory store): identities kept.
pub const DEFAULT_DEDUP_MAX_ENTRIES: u64 = 100_000;
/// Default `dedup.max.bytes` (memory store): bytes the identities may hold (64 MiB).
pub const DEFAULT_DEDUP_MAX_BYTES: u64 = oncely_dedup::DEFAULT_MAX_BYTES;
/// Default `dedup.ttl.ms`: how long an identity is kept (one day).
pub const DEFAULT_DEDUP_TTL_MS: u64 = 86_400_000;
/// Longest `dedup.identity.header` value taken as an identity: an id, not a payload.
pub const MAX_IDENTITY_HEADER_BYTES: usize = 256;
/// Key prefix of the Redis store before the group id: `oncely:dedup:<group.id>:`.
pub const DEDUP_REDIS_PREFIX: &str = "oncely:dedup:";

/// Where the window lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DedupStore {
    /// In the process, bounded by count and age; lost on restart.
    #[default]
    Memory,
    /// In Redis, bounded by age; survives restarts and moves between runners.
    Redis,
    /// No window (turns off the HTTP sink's default one).
    None,
}

/// The `[dedup]` table (see the module docs).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// `store`: `memory` (default), `redis` or `none`.
    #[serde(default)]
    pub store: DedupStore,
    /// `max.entries`: bound on identities held by the memory store.
    #[serde(rename = "max.entries", default)]
    pub max_entries: Option<u64>,
    /// `max.bytes`: bound on the bytes the memory store's identities hold
    /// (`identity.field` values can be of any size).
    #[serde(rename = "max.bytes", default)]
    pub max_bytes: Option<u64>,
    /// `ttl.ms`: how long an identity stays in the window.
    #[serde(rename = "ttl.ms", default)]
    pub ttl_ms: Option<u64>,
    /// `redis.url`: the Redis of the `redis` store (`${env:..}`/`${file:..}` accepted).
    #[serde(rename = "redis.url", default)]
    pub redis_url: Option<Secret>,
    /// `redis.key.prefix`: prefix of the identities' keys (default `oncely:dedup:<group.id>:`).
    #[serde(rename = "redis.key.prefix", default)]
    pub redis_key_prefix: Option<String>,
    /// `identity.field`: dotted path into the envelope (`after.event_id`) whose
    /// value identifies an event; unset: the source position.
    #[serde(rename = "identity.field", default)]
    pub identity_field: Option<String>,
    /// `identity.header`: name of the Kafka header whose value identifies an
    /// event (e.g. an outbox event id set by the producer); excludes `identity.field`.
    #[serde(rename = "identity.header", default)]
    pub identity_header: Option<String>,
}

/// Where an event's identity comes from (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The source position `<commit_lsn>/<event_seq>`.
    Position,
    /// A dotted path into the envelope (`identity.field`).
    Field(String),
    /// A Kafka header's name (`identity.header`).
    Header(String),
}

impl DedupConfig {
    /// Checks the values; errors name `dedup.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ttl_ms == Some(0) {
            return Err(ConfigError::new("dedup.ttl.ms", "must be at least 1"));
        }
        if self.max_entries == Some(0) {
            return Err(ConfigError::new("dedup.max.entries", "must be at least 1"));
        }
        if self.max_bytes.is_some_and(|b| b < 1024) {
            return Err(ConfigError::new("dedup.max.bytes", "must be at least 1024"));
        }
        match self.store {
            DedupStore::Redis if self.redis_url.is_none() => Err(ConfigError::new(
                "dedup.redis.url",
                "required with store = \"redis\" (e.g. redis://127.0.0.1:6379)",
            )),
            DedupStore::Redis if self.max_entries.is_some() => Err(ConfigError::new(
                "dedup.max.entries",
                "the redis store is bounded by `ttl.ms` only (and Redis maxmemory)",
            )),
            DedupStore::Redis if self.max_bytes.is_some() => Err(ConfigError::new(
                "dedup.max.bytes",
                "the redis store is bounded by `ttl.ms` only (and Redis maxmemory)",
            )),
            DedupStore::Memory | DedupStore::None if self.redis_url.is_some() => Err(
                ConfigError::new("dedup.redis.url", "only used with store = \"redis\""),
            ),
            _ => Ok(()),
        }
        .and_then(|()| match &self.identity_field {
            Some(f) if f.split('.').any(str::is_empty) => Err(ConfigError::new(
                "dedup.identity.field",
                "a dotted path into the envelope, e.g. after.event_id",
            )),
            _ => Ok(()),
        })
        .and_then(|()| match &self.identity_header {
            Some(_) if self.identity_field.is_some() => Err(ConfigError::new(
                "dedup.identity.header",
                "set either identity.field or identity.header, not both: an event has one identity",
            )),
            Some(h) if h.trim().is_empty() => Err(ConfigError::new(
                "dedup.identity.header",
                "the name of a Kafka header, e.g. event_id",
            )),
            _ => Ok(()),
        })
    }

    /// Where identities come from.
    pub fn identity(&self) -> Identity {
        match (&self.identity_header, &self.identity_field) {
            (Some(h), _) => Identity::Header(h.clone()),
            (None, Some(f)) => Identity::Field(f.clone()),
            (None, None) => Identity::Position,
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.unwrap_or(DEFAULT_DEDUP_TTL_MS))
    }

    /// Opens the configured window; `None` for `store = "none"`.
    pub async fn open(&self, group: &str) -> Result<Option<Arc<dyn WindowStore>>, SinkError> {
        Ok(match self.store {
            DedupStore::None => None,
            DedupStore::Memory => Some(Arc::new(MemoryWindow::bounded(
                self.max_entries.unwrap_or(DEFAULT_DEDUP_MAX_ENTRIES),
                self.max_bytes.unwrap_or(DEFAULT_DEDUP_MAX_BYTES),
                self.ttl(),
            ))),
            DedupStore::Redis => {
                let url = self
                    .redis_url
                    .as_ref()
                    .ok_or_else(|| SinkError::fatal("dedup.redis.url is not set"))?;
                let prefix = self
                    .redis_key_prefix
                    .clone()
                    .unwrap_or_else(|| format!("{DEDUP_REDIS_PREFIX}{group}:"));
                let window = RedisWindow::connect(url.expose(), &prefix, self.ttl())
                    .await
                    .map_err(window_error)?;
                Some(Arc::new(window))
            }
        })
    }
}

/// A window error as a sink error: unavailable is retriable, the rest fatal.
pub fn window_error(e: DedupError) -> SinkError {
    if e.is_retriable() {
        SinkError::retriable_from("dedup window", e)
    } else {
        SinkError::fatal_from("dedup window", e)
    }
}

/// The identity of `record` of `topic` (see the module docs); `None`: no identity.
pub fn event_identity(topic: &str, record: &Record, field: Option<&str>) -> Option<String> {
    let event = record.event()?;
    if let Some(path) = field {
        let mut parts = path.split('.');
        let root = match parts.next()? {
            "after" => event.after.as_ref(),
            "before" => event.before.as_ref(),
            "source" => Some(&event.source),
            _ => None,
        };
        let found = root.and_then(|m| {
            let mut v = m.get(parts.next()?)?;
            for p in parts {
                v = v.get(p)?;
            }
            Some(v)
        });
        match found {
            Some(Value::String(s)) => return Some(format!("{topic}/{path}={s}")),
            Some(Value::Null) | None => {}
            Some(v) => return Some(format!("{topic}/{path}={v}")),
        }
    }
    Some(match event.version_origin {
        VersionOrigin::CommitLsn => format!("{topic}/{}", event.version),
        VersionOrigin::SourceLsn | VersionOrigin::Binlog => format!(
            "{topic}/{}/{}:{}",
            event.version,
            record.partition(),
            record.offset
        ),
    })
}

/// The identity of `record` of `topic` from the `name` header; `Err`: why
/// the record must be dead-lettered instead (see the module docs).
pub fn header_identity(topic: &str, record: &Record, name: &str) -> Result<Option<String>, String> {
    match record.identity_header() {
        Some(v) if v.len() > MAX_IDENTITY_HEADER_BYTES => Err(format!(
            "the `{name}` header (dedup.identity.header) is {} bytes, more than the {MAX_IDENTITY_HEADER_BYTES} an identity may have",
            v.len()
        )),
        Some(v) if !v.is_empty() => Ok(Some(match std::str::from_utf8(v) {
            Ok(text) => format!("{topic}/{name}={text}"),
            Err(_) => {
                let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                format!("{topic}/{name}=0x{hex}")
            }
        })),
        _ if record.event().is_none() => Ok(None),
        Some(_) => Err(format!(
            "the `{name}` header (dedup.identity.header) is empty: it must hold the event's identity"
        )),
        None => Err(format!(
            "no `{name}` header (dedup.identity.header): a change without its identity cannot be deduplicated, so it is not applied"
        )),
    }
}

/// A sink behind a dedup window (see the module docs).
pub(crate) struct DedupSink {
    inner: Arc<dyn Sink>,
    window: Arc<dyn WindowStore>,
    identity: Identity,
    skipped: IntCounterVec,
}

impl DedupSink {
    pub(crate) fn new(
        inner: Arc<dyn Sink>,
        window: Arc<dyn WindowStore>,
        identity: Identity,
        skipped: IntCounterVec,
    ) -> Self {
        Self {
            inner,
            window,
            identity,
            skipped,
        }
    }

    /// Each record's identity, or the records to dead-letter.
    fn identities(&self, batch: &Batch) -> Result<Vec<Option<String>>, SinkError> {
        let topic = batch.topic();
        let field = match &self.identity {
            Identity::Header(name) => {
                let mut ids = Vec::with_capacity(batch.len());
                let mut refused = Vec::new();
                for r in batch.records() {
                    match header_identity(topic, r, name) {
                        Ok(id) => ids.push(id),
                        Err(reason) => refused.push(RecordFailure::new(r.offset, reason)),
                    }
                }
                return if refused.is_empty() {
                    Ok(ids)
                } else {
                    Err(SinkError::Rejected(refused))
                };
            }
            Identity::Field(f) => Some(f.as_str()),
            Identity::Position => None,
        };
        Ok(batch
            .records()
            .iter()
            .map(|r| event_identity(topic, r, field))
            .collect())
    }
}

#[async_trait]
impl Sink for DedupSink {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn assigned(&self, starts: &Positions) -> Result<(), SinkError> {
        self.inner.assigned(starts).await
    }

    fn prepare(&self, batch: &mut Batch) {
        self.inner.prepare(batch);
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let ids = self.identities(batch)?;
        let held = try_join_all(ids.iter().map(|id| async move {
            match id {
                Some(id) => self.window.contains(id.as_bytes()).await,
                None => Ok(false),
            }
        }))
        .await
        .map_err(window_error)?;
        // Skip what the window holds, and a second record of one identity in the batch.
        let mut fresh = HashSet::new();
        let mut skip = Vec::new();
        for ((record, id), held) in batch.records().iter().zip(&ids).zip(held) {
            if let Some(id) = id {
                if held || !fresh.insert(id.as_str()) {
                    skip.push(record.offset);
                }
            }
        }
        let to_apply = if skip.is_empty() {
            Cow::Borrowed(batch)
        } else {
            let mut b = batch.clone();
            b.remove_offsets(&skip);
            Cow::Owned(b)
        };
        batch.note_skipped(skip.len());
        self.inner.apply(&to_apply).await?;
        try_join_all(fresh.iter().map(|id| self.window.remember(id.as_bytes())))
            .await
            .map_err(window_error)?;
        if !skip.is_empty() {
            self.skipped
                .with_label_values(&[self.inner.name(), batch.topic()])
                .inc_by(skip.len() as u64);
        }
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), SinkError> {
        self.inner.shutdown().await
    }
}

/// Puts `sink` behind the window `config` describes (`store = "none"`: unchanged).
pub(crate) async fn wrap(
    sink: Arc<dyn Sink>,
    config: &DedupConfig,
    group: &str,
    skipped: IntCounterVec,
) -> Result<Arc<dyn Sink>, SinkError> {
    if sink.owns_positions() {
        return Err(SinkError::fatal(format!(
            "`[dedup]`: sink `{}` owns its positions and applies each record once already; remove [dedup]",
            sink.name()
        )));
    }
    Ok(match config.open(group).await? {
        None => sink,
        Some(window) => Arc::new(DedupSink::new(sink, window, config.identity(), skipped)),
    })
}

#[cfg(test)]
#[path = "dedup_tests.rs"]
mod tests;
