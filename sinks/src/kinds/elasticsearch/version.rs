//! The event [`Version`] as an Elasticsearch external version.
//!
//! Elasticsearch compares external versions as signed 64-bit longs and keeps a
//! document (or a delete tombstone) only when the incoming version is strictly
//! greater than the stored one. The event version `(lsn, seq)` is ordered
//! lexicographically; this packs it into one number that keeps that order:
//!
//! ```text
//! external = lsn << seq_bits | seq        (seq_bits = `version.seq.bits`, default 20)
//! ```
//!
//! # Limits (checked per event: a violating event is dead-lettered, never truncated)
//!
//! * `seq < 2^seq_bits`: with the default 20 bits, an event ordinal inside its
//!   transaction below 1,048,576. Larger transactions need more bits.
//! * `lsn < 2^(63 - seq_bits)`: with 20 bits, LSNs below 2^43 (8 TiB of WAL
//!   written over the server's life, LSN `7FF/FFFFFFFF`); 16 bits allow 128 TiB
//!   with 65,536 events per transaction, 24 bits 512 GiB with 16.7 M.
//!
//! `version.seq.bits` must never change for an index that already holds
//! documents: versions packed differently do not compare.

use crate::event::Version;

/// Smallest accepted `version.seq.bits`.
pub const MIN_SEQ_BITS: u32 = 8;
/// Largest accepted `version.seq.bits`.
pub const MAX_SEQ_BITS: u32 = 32;

/// An event version that does not fit the packing (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The event ordinal needs more than `version.seq.bits` bits.
    #[error("event ordinal {seq} does not fit version.seq.bits = {bits} (max {max})")]
    SeqTooLarge {
        /// The ordinal.
        seq: u64,
        /// The configured bits.
        bits: u32,
        /// The largest ordinal that fits.
        max: u64,
    },
    /// The LSN needs more than `63 - version.seq.bits` bits.
    #[error("LSN {lsn} does not fit 63 - version.seq.bits = {} bits (max {max})", 63 - .bits)]
    LsnTooLarge {
        /// The LSN.
        lsn: u64,
        /// The configured seq bits.
        bits: u32,
        /// The largest LSN that fits.
        max: u64,
    },
}

/// Packs `v` into a non-negative `i64` external version (see the module docs).
pub fn external_version(v: Version, seq_bits: u32) -> Result<i64, VersionError> {
    let bits = seq_bits.clamp(MIN_SEQ_BITS, MAX_SEQ_BITS);
    let max_seq = (1u64 << bits) - 1;
    let max_lsn = (1u64 << (63 - bits)) - 1;
    if v.seq > max_seq {
        return Err(VersionError::SeqTooLarge {
            seq: v.seq,
            bits,
            max: max_seq,
        });
    }
    if v.lsn > max_lsn {
        return Err(VersionError::LsnTooLarge {
            lsn: v.lsn,
            bits,
            max: max_lsn,
        });
    }
    // Both bounds checked: the result is below 2^63.
    i64::try_from((v.lsn << bits) | v.seq).map_err(|_| VersionError::LsnTooLarge {
        lsn: v.lsn,
        bits,
        max: max_lsn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_are_exact() {
        let max_lsn = (1u64 << 43) - 1;
        let top = external_version(Version::new(max_lsn, (1 << 20) - 1), 20).expect("fits");
        assert_eq!(top, i64::MAX);
        assert!(matches!(
            external_version(Version::new(max_lsn + 1, 0), 20),
            Err(VersionError::LsnTooLarge { .. })
        ));
        assert!(matches!(
            external_version(Version::new(1, 1 << 20), 20),
            Err(VersionError::SeqTooLarge { .. })
        ));
        assert_eq!(external_version(Version::new(1, 0), 20), Ok(1 << 20));
        assert_eq!(external_version(Version::new(0, 5), 8), Ok(5));
    }

    proptest! {
        #[test]
        fn packing_keeps_the_order(
            a in (0u64..(1 << 43), 0u64..(1 << 20)),
            b in (0u64..(1 << 43), 0u64..(1 << 20)),
        ) {
            let (va, vb) = (Version::new(a.0, a.1), Version::new(b.0, b.1));
            let (ea, eb) = (external_version(va, 20).unwrap(), external_version(vb, 20).unwrap());
            prop_assert_eq!(va.cmp(&vb), ea.cmp(&eb));
            prop_assert!(ea >= 0);
        }
    }
}
