//! The sequence-watermark deduplicator.

use std::hash::Hash;

use moka::ops::compute::Op;
use moka::sync::Cache;

use crate::Seen;

/// Remembers, per key (or per partition), the highest sequence seen, and reports
/// any sequence at or below it as a duplicate. Exact and tiny when sequences only
/// grow per key — e.g. `oncely_sinks::Version` per row key, or the offset per partition —
/// and wrong otherwise (an out-of-order older event is reported as a duplicate).
///
/// Bounded by `capacity` keys, least recently updated evicted first: a key
/// evicted from the watermark table forgets its watermark, so its next event
/// is reported as new (size the capacity to the number of live keys, or key by
/// partition, which is small and never evicted in practice).
pub struct SequenceWatermark<K, S> {
    marks: Cache<K, S>,
}

impl<K, S> SequenceWatermark<K, S>
where
    K: Hash + Eq + Send + Sync + Clone + 'static,
    S: Ord + Clone + Send + Sync + 'static,
{
    /// A watermark table of at most `capacity` keys.
    pub fn new(capacity: u64) -> Self {
        let marks = Cache::builder()
            .max_capacity(capacity)
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build();
        Self { marks }
    }

    /// `New` (and raises the watermark) when `seq` is above the key's watermark,
    /// `Duplicate` otherwise. Atomic per key.
    pub fn check(&self, key: K, seq: S) -> Seen {
        let mut seen = Seen::Duplicate;
        self.marks
            .entry(key)
            .and_compute_with(|current| match current {
                Some(entry) if *entry.value() >= seq => Op::Nop,
                _ => {
                    seen = Seen::New;
                    Op::Put(seq)
                }
            });
        seen
    }

    /// The key's watermark, if it has one.
    pub fn watermark(&self, key: &K) -> Option<S> {
        self.marks.get(key)
    }

    /// Applies pending evictions now.
    pub fn run_pending_tasks(&self) {
        self.marks.run_pending_tasks();
    }

    /// Number of keys held (approximate until [`SequenceWatermark::run_pending_tasks`]).
    pub fn len(&self) -> u64 {
        self.marks.entry_count()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn only_higher_sequences_are_new() {
        let w: SequenceWatermark<&str, (u64, u64)> = SequenceWatermark::new(10);
        assert_eq!(w.check("k", (5, 0)), Seen::New);
        assert_eq!(w.check("k", (5, 0)), Seen::Duplicate);
        assert_eq!(w.check("k", (4, 9)), Seen::Duplicate);
        assert_eq!(w.check("k", (5, 1)), Seen::New);
        assert_eq!(w.check("other", (1, 0)), Seen::New);
        assert_eq!(w.watermark(&"k"), Some((5, 1)));
    }

    proptest! {
        /// Matches a per-key max model exactly while all keys fit; never exceeds capacity.
        #[test]
        fn matches_the_max_model(events in proptest::collection::vec((0u8..8, 0u32..50), 1..300)) {
            let w: SequenceWatermark<u8, u32> = SequenceWatermark::new(8);
            let mut model: HashMap<u8, u32> = HashMap::new();
            for (key, seq) in events {
                let expected = match model.get(&key) {
                    Some(m) if *m >= seq => Seen::Duplicate,
                    _ => { model.insert(key, seq); Seen::New }
                };
                prop_assert_eq!(w.check(key, seq), expected);
            }
            w.run_pending_tasks();
            prop_assert!(w.len() <= 8);
        }
    }
}
