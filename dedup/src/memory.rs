//! The in-memory window on moka.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moka::ops::compute::{CompResult, Op};
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use crate::{DedupError, Seen, WindowStore};

/// An in-process window bounded by count (`capacity` identities) and age (`ttl`
/// since an identity was remembered). Checks are O(1) and never block on I/O.
///
/// Eviction is least-recently-*remembered* first: a check does not refresh an
/// identity, only [`WindowStore::remember`] (or the insert of a new identity)
/// does. Hence the window always holds at least the last `capacity` distinct
/// identities remembered less than `ttl` ago; it may briefly hold a few more,
/// until moka's maintenance runs (it never answers `Duplicate` for an identity
/// that was not remembered).
///
/// Race note: two tasks checking the same *new* identity at the same instant
/// serialize on moka's key-level compute lock, so exactly one of them sees `New`.
#[derive(Clone)]
pub struct MemoryWindow {
    cache: Cache<Arc<[u8]>, ()>,
}

impl MemoryWindow {
    /// A window of at most `capacity` identities, each kept at most `ttl`.
    pub fn new(capacity: u64, ttl: Duration) -> Self {
        let cache = Cache::builder()
            .max_capacity(capacity)
            .time_to_live(ttl)
            .eviction_policy(EvictionPolicy::lru())
            .build();
        Self { cache }
    }

    /// Synchronous [`WindowStore::check_and_remember`].
    pub fn check_and_remember_now(&self, id: &[u8]) -> Seen {
        if self.cache.contains_key(id) {
            return Seen::Duplicate;
        }
        // `and_compute_with` runs the calls of one key one after another under a
        // key-level lock, so exactly one concurrent caller inserts. (`or_insert`'s
        // `is_fresh` does not promise that: CI saw two callers both get `New`.)
        match self
            .cache
            .entry(Arc::from(id))
            .and_compute_with(|existing| match existing {
                Some(_) => Op::Nop,
                None => Op::Put(()),
            }) {
            CompResult::Inserted(_) => Seen::New,
            _ => Seen::Duplicate,
        }
    }

    /// Synchronous [`WindowStore::contains`].
    pub fn contains_now(&self, id: &[u8]) -> bool {
        self.cache.contains_key(id)
    }

    /// Synchronous [`WindowStore::remember`].
    pub fn remember_now(&self, id: &[u8]) {
        self.cache.insert(Arc::from(id), ());
    }

    /// Synchronous [`WindowStore::forget`].
    pub fn forget_now(&self, id: &[u8]) {
        self.cache.invalidate(id);
    }

    /// Number of identities held (approximate until [`MemoryWindow::run_pending_tasks`]).
    pub fn len(&self) -> u64 {
        self.cache.entry_count()
    }

    /// True when no identity is held (approximate, like [`MemoryWindow::len`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies pending evictions now (moka does it lazily otherwise).
    pub fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks();
    }
}

#[async_trait]
impl WindowStore for MemoryWindow {
    async fn check_and_remember(&self, id: &[u8]) -> Result<Seen, DedupError> {
        Ok(self.check_and_remember_now(id))
    }

    async fn contains(&self, id: &[u8]) -> Result<bool, DedupError> {
        Ok(self.contains_now(id))
    }

    async fn remember(&self, id: &[u8]) -> Result<(), DedupError> {
        self.remember_now(id);
        Ok(())
    }

    async fn forget(&self, id: &[u8]) -> Result<(), DedupError> {
        self.forget_now(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashSet, VecDeque};

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn duplicate_inside_the_window_is_suppressed() {
        let w = MemoryWindow::new(100, LONG);
        assert_eq!(w.check_and_remember_now(b"a"), Seen::New);
        assert_eq!(w.check_and_remember_now(b"a"), Seen::Duplicate);
        assert_eq!(w.check_and_remember_now(b"b"), Seen::New);
        w.forget_now(b"a");
        assert_eq!(w.check_and_remember_now(b"a"), Seen::New);
    }

    #[test]
    fn older_than_the_age_bound_is_new_again() {
        let w = MemoryWindow::new(100, Duration::from_millis(50));
        assert_eq!(w.check_and_remember_now(b"a"), Seen::New);
        std::thread::sleep(Duration::from_millis(120));
        assert!(!w.contains_now(b"a"));
        assert_eq!(w.check_and_remember_now(b"a"), Seen::New);
    }

    #[test]
    fn concurrent_checks_of_one_new_id_yield_one_new() {
        let w = MemoryWindow::new(1000, LONG);
        for round in 0..2000u32 {
            let id = round.to_be_bytes();
            let news: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| w.check_and_remember_now(&id)))
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| h.join().ok())
                    .filter(|r| *r == Seen::New)
                    .count()
            });
            assert_eq!(news, 1, "round {round}");
        }
    }

    proptest! {
        /// Bounds: after maintenance, never more than `capacity` identities.
        /// Eviction: the last `capacity` distinct identities remembered are always found.
        /// Exactness: an identity never remembered is never a duplicate.
        #[test]
        fn bounds_and_eviction(capacity in 1u64..40, ids in proptest::collection::vec(0u16..120, 1..400)) {
            let w = MemoryWindow::new(capacity, LONG);
            let mut recent: VecDeque<u16> = VecDeque::new(); // model: FIFO of first-remembered ids
            let mut ever: HashSet<u16> = HashSet::new();
            for id in ids {
                let key = id.to_be_bytes();
                let seen = w.check_and_remember_now(&key);
                if recent.contains(&id) {
                    prop_assert_eq!(seen, Seen::Duplicate, "id {} is among the last {} remembered", id, capacity);
                }
                if !ever.contains(&id) {
                    prop_assert_eq!(seen, Seen::New, "id {} was never remembered", id);
                }
                if seen == Seen::New {
                    recent.push_back(id);
                    if recent.len() as u64 > capacity {
                        recent.pop_front();
                    }
                }
                ever.insert(id);
                w.run_pending_tasks();
                prop_assert!(w.len() <= capacity, "{} entries > capacity {}", w.len(), capacity);
            }
        }
    }
}
