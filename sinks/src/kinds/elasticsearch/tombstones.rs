//! The deletes this process applied lately: their event version and the
//! external version of their tombstone.
//!
//! A hard delete leaves only Elasticsearch's tombstone, which keeps the
//! external version (for `index.gc_deletes`) but not the event version. A
//! write of an absent document goes out at its clock (see [`super::version`]);
//! a tombstone at or above it refuses it (409), which is right for an older
//! event but not for a newer one that shares the delete's clock (the
//! delete and the insert again of a key in one transaction, read in two
//! batches, above LSN 2^42) or follows a delete written at `stored + 1`.
//! Remembering the deletes tells the two apart: a newer event goes out again
//! just above the remembered tombstone; an older one is dropped.
//!
//! Bounded: at most [`CAPACITY`] entries, each kept [`TTL`] (well beyond the
//! default `index.gc_deletes` of 60 s); the oldest go first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::event::Version;

/// Most deletes remembered.
pub const CAPACITY: usize = 100_000;
/// How long a delete is remembered.
pub const TTL: Duration = Duration::from_secs(600);

type Key = (String, String);

/// See the module docs.
#[derive(Debug, Default)]
pub struct Tombstones {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<Key, (Version, i64, Instant)>,
    /// Keys in the order recorded (a key recorded again appears twice; the
    /// map holds its latest time).
    order: VecDeque<(Key, Instant)>,
}

impl Tombstones {
    /// Records that the delete of `version` left a tombstone at `external`.
    pub fn record(&self, index: &str, id: &str, version: Version, external: i64) {
        self.record_at(index, id, version, external, Instant::now());
    }

    fn record_at(&self, index: &str, id: &str, version: Version, external: i64, now: Instant) {
        let mut inner = self.lock();
        let key = (index.to_owned(), id.to_owned());
        inner.by_key.insert(key.clone(), (version, external, now));
        inner.order.push_back((key, now));
        inner.evict(now);
    }

    /// The delete of `index`/`id` remembered: its event version and external version.
    pub fn get(&self, index: &str, id: &str) -> Option<(Version, i64)> {
        self.get_at(index, id, Instant::now())
    }

    fn get_at(&self, index: &str, id: &str, now: Instant) -> Option<(Version, i64)> {
        let inner = self.lock();
        let (v, e, at) = inner.by_key.get(&(index.to_owned(), id.to_owned()))?;
        (now.saturating_duration_since(*at) < TTL).then_some((*v, *e))
    }

    /// Entries remembered.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change leaves the map whole: a panic elsewhere cannot break it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn evict(&mut self, now: Instant) {
        while let Some((key, at)) = self.order.front() {
            let expired = now.saturating_duration_since(*at) >= TTL;
            if !expired && self.order.len() <= CAPACITY {
                break;
            }
            if self.by_key.get(key).is_some_and(|(_, _, t)| t == at) {
                self.by_key.remove(key);
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_are_remembered_for_a_while_and_at_most_capacity() {
        let t = Tombstones::default();
        let now = Instant::now();
        t.record_at("i", "1", Version::new(5, 1), 9, now);
        assert_eq!(t.get_at("i", "1", now), Some((Version::new(5, 1), 9)));
        assert_eq!(t.get_at("i", "2", now), None);
        assert_eq!(t.get_at("i", "1", now + TTL), None, "expired");
        t.record_at("i", "1", Version::new(6, 0), 10, now);
        assert_eq!(t.get_at("i", "1", now), Some((Version::new(6, 0), 10)));
        for n in 0..CAPACITY + 10 {
            t.record_at("j", &n.to_string(), Version::new(1, 0), 1, now);
        }
        assert!(t.lock().order.len() <= CAPACITY);
        assert!(t.len() <= CAPACITY);
        assert_eq!(t.get_at("i", "1", now), None, "the oldest went first");
        assert!(t.get_at("j", &(CAPACITY + 9).to_string(), now).is_some());
        // Expired entries go at the next record.
        t.record_at("k", "1", Version::new(1, 0), 1, now + TTL);
        assert_eq!(t.len(), 1);
    }
}
