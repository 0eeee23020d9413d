//! The source seam: what the source-independent core asks of a source
//! (docs/design.md, "Architecture: the source seam"). Each source under
//! `sources/<database>/` implements these; the core names no driver.
//!
//! So far the seam holds the confirmation of durable positions; the change
//! stream, snapshot chunks and table descriptions are still reached
//! directly (the files `sources/boundary_tests.rs` lists).

/// Where the committer tells the source what Kafka holds.
///
/// Contract: `confirm` is called only with a flush position that a
/// committed Kafka transaction's offset record names, in increasing order,
/// by the committer alone, after each commit. The source may then release
/// what precedes it (PostgreSQL: the slot's WAL); a source with nothing to
/// release (MySQL's binlog) does nothing. It never fails: a confirmation
/// that does not reach the server is sent again with the next one.
pub(crate) trait Slot {
    /// The source may release what precedes `flush_lsn`.
    fn confirm(&mut self, flush_lsn: u64);
}
