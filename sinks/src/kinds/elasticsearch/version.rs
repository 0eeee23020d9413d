//! The event [`Version`] in Elasticsearch: exact in the document, ordered by
//! Elasticsearch through an external version derived from it.
//!
//! An event version `(lsn, seq)` is two `u64`, ordered lexicographically.
//! Elasticsearch's external versions are non-negative signed 64-bit longs, so
//! no fixed packing holds every version (the packing `lsn << 20 | seq` of
//! earlier sink versions ran out at LSN `7FF/FFFFFFFF`, 8 TiB of WAL). So:
//!
//! * **The document carries its exact version** in two `long` fields,
//!   `version.lsn.field` and `version.seq.field` (each `u64` with its top bit
//!   flipped, [`flip`], so the longs sort as the `u64` do). The sink reads
//!   them (`_mget`, see [`super::merge`]) and drops an event not newer than
//!   the stored document; truncates search them.
//! * **The external version** of a write is `max(stored + 1, clock(version))`
//!   ([`next_external`]; `clock(version)` alone for an absent document).
//!   [`clock`] is non-decreasing in the version and, below LSN 2^(62 -
//!   `version.seq.bits`) with ordinals below 2^`version.seq.bits`, equal to
//!   the old packing (so documents and tombstones of the old packing keep
//!   comparing); above, it follows the LSN in steps of 4 bytes. Two writers
//!   that read the same stored document race on `stored + 1`: one gets a 409
//!   and reads again (compare-and-set). A write that read an older state wins
//!   only with a larger clock, i.e. a newer event than whatever replaced that
//!   state, so the newest event always ends stored.
//! * **Delete tombstones** keep the external version for `index.gc_deletes`
//!   (60 s): an older event's clock is at most the delete's, so it is refused
//!   (409) as before.
//!
//! A document without the version fields was written by an earlier sink
//! version: its external version is the old packing, decoded by [`unpack`].

use crate::event::Version;

/// Smallest accepted `version.seq.bits`.
pub const MIN_SEQ_BITS: u32 = 8;
/// Largest accepted `version.seq.bits`.
pub const MAX_SEQ_BITS: u32 = 32;

/// First external version of the upper range of [`clock`] (2^62).
const UPPER: i64 = 1 << 62;

/// `v` as a `long` of the same order: the top bit flipped, so `0` is
/// `i64::MIN` and `u64::MAX` is `i64::MAX`.
pub fn flip(v: u64) -> i64 {
    (v ^ (1 << 63)) as i64
}

/// The `u64` [`flip`] stored as `v`.
pub fn unflip(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

/// The external version an event's write starts from: non-decreasing in the
/// version, below 2^62 - 2^40 (room for [`next_external`]'s `+ 1`s).
///
/// * LSN below 2^(62 - bits): the old packing `lsn << bits | seq`, the
///   ordinal capped at `2^bits - 1` (a larger one shares the clock; the
///   compare-and-set of [`next_external`] orders those).
/// * Above: 2^62 + (lsn - 2^(62 - bits)) / 4. Commit LSNs of two
///   transactions are a WAL record (24 bytes or more) apart, so they never
///   share a clock; the events of one transaction do (compare-and-set).
pub fn clock(v: Version, seq_bits: u32) -> i64 {
    let bits = seq_bits.clamp(MIN_SEQ_BITS, MAX_SEQ_BITS);
    let lower = 1u64 << (62 - bits);
    if v.lsn < lower {
        let seq = v.seq.min((1 << bits) - 1);
        // Below 2^62 by the bound on lsn.
        return ((v.lsn << bits) | seq) as i64;
    }
    // (u64::MAX - lower) / 4 < 2^62: the sum stays below 2^63.
    UPPER + ((v.lsn - lower) >> 2) as i64
}

/// The external version of a write of `v` over a document stored at
/// external version `stored` (`None`: absent): the larger of `stored + 1`
/// and [`clock`]. `None` when `stored` is `i64::MAX` (only an index of the
/// old packing at LSN `7FF/FFFFFFFF` can get there).
pub fn next_external(stored: Option<i64>, v: Version, seq_bits: u32) -> Option<i64> {
    let clock = clock(v, seq_bits);
    match stored {
        None => Some(clock),
        Some(s) => Some(s.checked_add(1)?.max(clock)),
    }
}

/// The version of a document written by an earlier sink version, from its
/// external version `lsn << bits | seq`.
pub fn unpack(external: i64, seq_bits: u32) -> Version {
    let bits = seq_bits.clamp(MIN_SEQ_BITS, MAX_SEQ_BITS);
    let e = external.max(0) as u64;
    Version::new(e >> bits, e & ((1 << bits) - 1))
}

/// The old packing of `v`, when it fits (a truncate compares the
/// `version.field` of documents an earlier sink version wrote with it).
pub fn packed(v: Version, seq_bits: u32) -> Option<i64> {
    let bits = seq_bits.clamp(MIN_SEQ_BITS, MAX_SEQ_BITS);
    if v.seq >= 1 << bits || v.lsn >= 1 << (63 - bits) {
        return None;
    }
    i64::try_from((v.lsn << bits) | v.seq).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_clock_is_the_old_packing_below_2_to_the_42_and_fits_above() {
        assert_eq!(clock(Version::new(200, 3), 20), (200 << 20) | 3);
        assert_eq!(clock(Version::new(1, 1 << 21), 20), (2 << 20) - 1);
        let top = clock(Version::new(u64::MAX, u64::MAX), 20);
        assert!(top <= i64::MAX - (1 << 40), "{top}");
        assert!(clock(Version::new((1 << 42) - 1, u64::MAX), 20) < UPPER);
        assert_eq!(clock(Version::new(1 << 42, 0), 20), UPPER);
        assert_eq!(next_external(Some(i64::MAX), Version::new(1, 0), 20), None);
        assert_eq!(next_external(Some(5), Version::new(0, 1), 20), Some(6));
        assert_eq!(unpack((7 << 20) | 9, 20), Version::new(7, 9));
        assert_eq!(packed(Version::new(1 << 43, 0), 20), None);
        assert_eq!(packed(Version::new(7, 9), 20), Some((7 << 20) | 9));
        for v in [0, 1, 1 << 63, u64::MAX] {
            assert_eq!(unflip(flip(v)), v);
        }
    }

    fn version() -> impl Strategy<Value = Version> {
        let lsn = prop_oneof![
            any::<u64>(),
            0u64..(1 << 44),
            (u64::MAX - 4096)..=u64::MAX,
            ((1u64 << 42) - 64)..((1 << 42) + 64),
        ];
        let seq = prop_oneof![0u64..8, any::<u64>(), 0u64..(1 << 21)];
        (lsn, seq).prop_map(|(l, s)| Version::new(l, s))
    }

    proptest! {
        #[test]
        fn flipped_longs_sort_as_the_versions(a in version(), b in version()) {
            prop_assert_eq!(
                (flip(a.lsn), flip(a.seq)).cmp(&(flip(b.lsn), flip(b.seq))),
                a.cmp(&b)
            );
        }

        #[test]
        fn the_clock_never_goes_back_and_is_the_packing_where_that_fits(
            a in version(), b in version(),
        ) {
            let (ca, cb) = (clock(a, 20), clock(b, 20));
            prop_assert!(ca >= 0 && cb >= 0);
            if a <= b {
                prop_assert!(ca <= cb);
            }
            if let (Some(pa), Some(pb)) = (packed(a, 20), packed(b, 20)) {
                if a.lsn < 1 << 42 && b.lsn < 1 << 42 {
                    prop_assert_eq!((ca, cb), (pa, pb));
                }
            }
        }

        /// The compare-and-set argument of the module docs, replayed on a
        /// model of Elasticsearch's external versions: writers read a state
        /// (or, `blind`, go out first as over an absent document), drop
        /// events not newer than it, and write at `next_external`; the
        /// cluster takes a write only above its version, and a refused
        /// writer reads again. Whatever the interleaving, the newest event
        /// ends stored.
        #[test]
        fn any_interleaving_of_readers_and_writers_keeps_the_newest(
            events in proptest::collection::vec(version(), 1..8),
            blind in proptest::collection::vec(any::<bool>(), 8),
            order in proptest::collection::vec(any::<u8>(), 1..40),
        ) {
            // (external, version) stored; each writer: its event and what it read.
            let mut stored: Option<(i64, Version)> = None;
            let mut read: Vec<Option<Option<(i64, Version)>>> = (0..events.len())
                .map(|w| blind[w].then_some(None))
                .collect();
            let mut done = vec![false; events.len()];
            for step in order.iter().chain(std::iter::repeat_n(&0, 4 * events.len())) {
                let Some(w) = (0..events.len())
                    .map(|i| (i + *step as usize) % events.len())
                    .find(|&i| !done[i])
                else {
                    break;
                };
                match read[w] {
                    None => read[w] = Some(stored),
                    Some(seen) => {
                        let v = events[w];
                        if seen.is_some_and(|(_, sv)| v <= sv) {
                            done[w] = true; // stale
                            continue;
                        }
                        let ext = next_external(seen.map(|(e, _)| e), v, 20).unwrap();
                        if stored.is_none_or(|(e, _)| ext > e) {
                            stored = Some((ext, v));
                            done[w] = true;
                        } else {
                            read[w] = None; // 409: read again
                        }
                    }
                }
            }
            // Writers still pending run alone, reading again until settled.
            for w in 0..events.len() {
                while !done[w] {
                    let v = events[w];
                    if stored.is_some_and(|(_, sv)| v <= sv) {
                        done[w] = true;
                        continue;
                    }
                    stored = Some((next_external(stored.map(|(e, _)| e), v, 20).unwrap(), v));
                    done[w] = true;
                }
            }
            let newest = events.iter().max().copied();
            prop_assert_eq!(stored.map(|(_, v)| v), newest);
        }
    }
}
