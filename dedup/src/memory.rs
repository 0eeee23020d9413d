//! The in-memory window on moka.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moka::ops::compute::{CompResult, Op};
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use crate::{DedupError, Seen, WindowStore};

/// Default bound on the bytes a [`MemoryWindow`] holds (64 MiB): identities
/// are ids, but `identity.field` values are whatever the envelope holds.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// What one identity costs besides its bytes, as counted against the byte
/// bound: moka's entry, its place in the eviction order and the map slot (an estimate).
pub const ENTRY_OVERHEAD_BYTES: u64 = 128;

/// An in-process window bounded by count (`max_entries` identities), by bytes
/// (`max_bytes`, each identity counted as its length plus
/// [`ENTRY_OVERHEAD_BYTES`]) and by age (`ttl` since an identity was
/// remembered). Checks are O(1) and never block on I/O.
///
/// Both bounds are one moka weight: an identity weighs its bytes, but at least
/// `max_bytes / max_entries`, against a capacity of `max_entries` times that
/// least weight (never above `max_bytes`). Small identities are then bounded
/// by count exactly, large ones by bytes, and a mix by both.
///
/// Eviction is least-recently-*remembered* first: a check does not refresh an
/// identity, only [`WindowStore::remember`] (or the insert of a new identity)
/// does. Hence the window always holds at least the last identities
/// remembered less than `ttl` ago that fit both bounds — the last
/// `max_entries` when identities are small; it may briefly hold a few more,
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
    /// A window of at most `capacity` identities and [`DEFAULT_MAX_BYTES`], each kept at most `ttl`.
    pub fn new(capacity: u64, ttl: Duration) -> Self {
        Self::bounded(capacity, DEFAULT_MAX_BYTES, ttl)
    }

    /// A window of at most `max_entries` identities and `max_bytes` (see the
    /// type's docs), each kept at most `ttl`.
    pub fn bounded(max_entries: u64, max_bytes: u64, ttl: Duration) -> Self {
        let least = (max_bytes / max_entries.max(1)).clamp(1, u64::from(u32::MAX));
        let capacity = max_bytes.min(max_entries.saturating_mul(least));
        let cache = Cache::builder()
            .max_capacity(capacity)
            .weigher(move |id: &Arc<[u8]>, _: &()| {
                let bytes = (id.len() as u64).saturating_add(ENTRY_OVERHEAD_BYTES);
                u32::try_from(bytes.max(least)).unwrap_or(u32::MAX)
            })
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

    /// The bytes of the identities of `ids` the window holds, counted as the bound counts them.
    fn held_bytes(w: &MemoryWindow, ids: &[Vec<u8>]) -> u64 {
        ids.iter()
            .filter(|id| w.contains_now(id))
            .map(|id| id.len() as u64 + ENTRY_OVERHEAD_BYTES)
            .sum()
    }

    /// `n` distinct identities of `len` bytes each.
    fn huge_ids(n: u32, len: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut id = vec![b'x'; len];
                id[..4].copy_from_slice(&i.to_be_bytes());
                id
            })
            .collect()
    }

    #[test]
    fn a_window_of_huge_identities_stays_under_its_byte_bound() {
        // `identity.field` values are the envelope's, of any size: 1 MiB each.
        let ids = huge_ids(100, 1 << 20);
        let w = MemoryWindow::new(100_000, LONG);
        for id in &ids {
            assert_eq!(w.check_and_remember_now(id), Seen::New);
        }
        w.run_pending_tasks();
        let held = held_bytes(&w, &ids);
        assert!(
            held <= DEFAULT_MAX_BYTES,
            "{} identities of 1 MiB held, {held} bytes > the default bound {DEFAULT_MAX_BYTES}",
            w.len()
        );
        let last = ids.last().expect("ids");
        assert!(w.contains_now(last), "the last remembered is kept");

        // An explicit bound: 20 KiB hold at most 19 identities of 1 KiB.
        let ids = huge_ids(200, 1024);
        let w = MemoryWindow::bounded(1000, 20 << 10, LONG);
        for id in &ids {
            w.check_and_remember_now(id);
            w.run_pending_tasks();
            assert!(held_bytes(&w, &ids) <= 20 << 10);
        }
        assert!((10..=19).contains(&w.len()), "{} held", w.len());
        assert!(
            ids[190..].iter().all(|id| w.contains_now(id)),
            "the last ten are kept"
        );
    }

    proptest! {
        // Each case runs moka's maintenance after every identity: few cases.
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Both bounds at once: identities of mixed sizes never hold more
        /// than `max_entries` nor more than `max_bytes` (after maintenance),
        /// and the last one remembered is always found.
        #[test]
        fn count_and_byte_bounds_hold_together(
            max_entries in 1u64..30,
            max_bytes in 200u64..20_000,
            sizes in proptest::collection::vec(0usize..3000, 1..100),
        ) {
            let w = MemoryWindow::bounded(max_entries, max_bytes, LONG);
            let ids: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let mut id = (i as u32).to_be_bytes().to_vec();
                    id.resize(4 + n, b'x');
                    id
                })
                .collect();
            for id in &ids {
                w.check_and_remember_now(id);
                w.run_pending_tasks();
                prop_assert!(w.len() <= max_entries, "{} entries > {}", w.len(), max_entries);
                let held = held_bytes(&w, &ids);
                prop_assert!(held <= max_bytes, "{} bytes > {}", held, max_bytes);
                if id.len() as u64 + ENTRY_OVERHEAD_BYTES <= max_bytes / max_entries {
                    prop_assert!(w.contains_now(id), "a small identity just remembered is held");
                }
            }
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
