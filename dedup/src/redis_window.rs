//! The persistent window in Redis.
//!
//! **Choice:** one key per identity, `SET <prefix><id> 1 NX PX <ttl>`. The
//! `NX` makes check-and-remember a single atomic command (no script, no race
//! between runners), and Redis expires each identity by itself, so the window
//! is bounded by **age**. It is not bounded by count: memory grows with the
//! event rate times the TTL (about 60-100 bytes per identity); bound it with
//! the TTL, or with Redis `maxmemory` and a `volatile-*` eviction policy (which
//! then evicts the identities closest to expiry first). A sorted set per window
//! would add a count bound, at the price of a script and O(log n) trims.
//!
//! The window survives restarts of the process (and of Redis, with persistence).

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{RedisError, RetryMethod};

use crate::{DedupError, Seen, WindowStore};

/// A window in Redis (see the module docs). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisWindow {
    conn: ConnectionManager,
    prefix: Vec<u8>,
    ttl_ms: u64,
}

impl RedisWindow {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`); identities are stored under
    /// `prefix` (use one prefix per window, e.g. `oncely:dedup:<sink>:`) for `ttl`.
    pub async fn connect(url: &str, prefix: &str, ttl: Duration) -> Result<Self, DedupError> {
        let client = redis::Client::open(url).map_err(|e| DedupError::Failed(Box::new(e)))?;
        let conn = ConnectionManager::new(client).await.map_err(classify)?;
        Ok(Self::with_connection(conn, prefix, ttl))
    }

    /// Uses an existing connection manager.
    pub fn with_connection(conn: ConnectionManager, prefix: &str, ttl: Duration) -> Self {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        Self {
            conn,
            prefix: prefix.as_bytes().to_vec(),
            ttl_ms,
        }
    }

    fn key(&self, id: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + id.len());
        key.extend_from_slice(&self.prefix);
        key.extend_from_slice(id);
        key
    }
}

/// Connection and overload errors are retriable; what Redis says will not work again is not.
fn classify(e: RedisError) -> DedupError {
    if matches!(e.retry_method(), RetryMethod::NoRetry) && !e.is_io_error() && !e.is_timeout() {
        DedupError::Failed(Box::new(e))
    } else {
        DedupError::Unavailable(Box::new(e))
    }
}

#[async_trait]
impl WindowStore for RedisWindow {
    async fn check_and_remember(&self, id: &[u8]) -> Result<Seen, DedupError> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(id))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        Ok(if set.is_some() {
            Seen::New
        } else {
            Seen::Duplicate
        })
    }

    async fn contains(&self, id: &[u8]) -> Result<bool, DedupError> {
        let mut conn = self.conn.clone();
        let n: u64 = redis::cmd("EXISTS")
            .arg(self.key(id))
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        Ok(n > 0)
    }

    async fn remember(&self, id: &[u8]) -> Result<(), DedupError> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(self.key(id))
            .arg(1)
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async::<()>(&mut conn)
            .await
            .map_err(classify)
    }

    async fn forget(&self, id: &[u8]) -> Result<(), DedupError> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(self.key(id))
            .query_async::<()>(&mut conn)
            .await
            .map_err(classify)
    }
}
