//! oncely-dedup: "seen before?" for effects that cannot be made idempotent
//! (calling an API, sending a mail).
//!
//! A [`WindowStore`] remembers the identities of recently seen events in a
//! bounded window and answers whether an identity was seen. Implementations:
//!
//! * [`MemoryWindow`]: in-process, bounded by count, bytes and age (moka), O(1).
//!   Lost on restart, unless rebuilt by re-reading the records just before the
//!   committed offset and [`WindowStore::remember`]ing them (as
//!   `tests/it/dedup_window.rs` does).
//! * [`RedisWindow`]: in Redis, bounded by age; survives restarts of the runner.
//! * [`SequenceWatermark`]: not a window but the cheaper alternative when events
//!   carry a sequence that grows per key or per partition: remembers only the
//!   highest sequence per key.
//!
//! # Limits (by design)
//!
//! A window is bounded: an identity older than the window (evicted by count
//! or bytes, or expired by age) is reported as new. Choose the bounds to cover the
//! longest redelivery you expect (the records after the last acknowledged
//! position, i.e. one batch per partition for the sink runner, plus anything
//! a rebalance or restart may replay).
//!
//! # Choosing between `check_and_remember` and `contains` + `remember`
//!
//! * `check_and_remember` then the effect: **at most once** — a crash after
//!   remembering and before the effect loses the effect.
//! * `contains`, the effect, then `remember`: **at least once** — a crash
//!   between the effect and remembering repeats the effect once. Usually the
//!   right choice when the window is persistent or rebuilt from Kafka.
//!   [`WindowStore::forget`] undoes a `check_and_remember` whose effect failed.

mod memory;
mod redis_window;
mod watermark;

use async_trait::async_trait;

pub use memory::{MemoryWindow, DEFAULT_MAX_BYTES, ENTRY_OVERHEAD_BYTES};
pub use redis_window::RedisWindow;
pub use watermark::SequenceWatermark;

/// The answer of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not in the window (never seen, or seen longer ago than the window covers).
    New,
    /// Seen within the window.
    Duplicate,
}

impl Seen {
    /// True for [`Seen::Duplicate`].
    pub fn is_duplicate(self) -> bool {
        self == Self::Duplicate
    }
}

/// Why a window could not answer.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// The backend is unreachable or overloaded: retry later.
    #[error("dedup backend unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend refused the operation (bad configuration, wrong type at the key): do not retry.
    #[error("dedup backend failed: {0}")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl DedupError {
    /// True when trying again may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// A bounded window of event identities (see the crate docs for the semantics).
///
/// Implementations are safe to share between tasks. Identities are opaque
/// bytes; use something stable across redeliveries, such as
/// `topic/partition/offset`, or the source version plus the key.
#[async_trait]
pub trait WindowStore: Send + Sync {
    /// Atomically: if `id` is in the window, [`Seen::Duplicate`]; otherwise remember it
    /// and [`Seen::New`]. Two concurrent calls with the same new id: exactly one sees `New`
    /// (for [`MemoryWindow`], see its note on races).
    async fn check_and_remember(&self, id: &[u8]) -> Result<Seen, DedupError>;

    /// True if `id` is in the window. Does not change the window.
    async fn contains(&self, id: &[u8]) -> Result<bool, DedupError>;

    /// Puts `id` in the window (again), restarting its age.
    async fn remember(&self, id: &[u8]) -> Result<(), DedupError>;

    /// Removes `id` from the window.
    async fn forget(&self, id: &[u8]) -> Result<(), DedupError>;
}
