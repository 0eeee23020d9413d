//! Where the fixes of quarantined tables were seen (see `quarantine`): its
//! own file, so the snapshot driver that holds it and the quarantine that
//! reads it do not import each other.

use std::collections::HashMap;

/// The quarantine's own state, held by the snapshot driver: per
/// quarantined table whose fix the catalog shows, the server's WAL end when
/// it was seen; the table is released once the stream passes it. The
/// quarantined tables themselves (and their reasons) are part of the offset
/// record, so they are the committer's staged position's, not this.
#[derive(Default)]
pub(super) struct Fixes {
    fixed_at: HashMap<String, u64>,
}

impl Fixes {
    /// Forgets a fix seen for `table` (set aside again, or gone).
    pub(super) fn forget(&mut self, table: &str) {
        self.fixed_at.remove(table);
    }

    /// Whether a fix of `table` was seen and waits for the stream.
    pub(super) fn seen(&self, table: &str) -> bool {
        self.fixed_at.contains_key(table)
    }

    /// The catalog shows `table` fixed when the server's WAL ends at `at`.
    pub(super) fn note(&mut self, table: String, at: u64) {
        self.fixed_at.insert(table, at);
    }

    /// The tables whose fix the stream has passed, having `reached`.
    pub(super) fn passed(&self, reached: u64) -> Vec<String> {
        self.fixed_at
            .iter()
            .filter(|(_, at)| **at <= reached)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Where `table`'s fix was seen, forgetting it: the table is released.
    pub(super) fn take(&mut self, table: &str) -> Option<u64> {
        self.fixed_at.remove(table)
    }
}

#[cfg(test)]
mod tests {
    use super::Fixes;

    #[test]
    fn a_fix_is_passed_once_the_stream_reaches_it() {
        let mut fixes = Fixes::default();
        fixes.note("public.a".into(), 0x200);
        fixes.note("public.b".into(), 0x300);
        assert!(fixes.seen("public.a"));
        assert!(fixes.passed(0x1ff).is_empty());
        assert_eq!(fixes.passed(0x200), vec!["public.a".to_owned()]);
        let mut both = fixes.passed(0x300);
        both.sort();
        assert_eq!(both, vec!["public.a".to_owned(), "public.b".to_owned()]);
        assert_eq!(fixes.take("public.a"), Some(0x200));
        assert_eq!(fixes.take("public.a"), None);
        assert!(!fixes.seen("public.a"));
    }

    #[test]
    fn a_forgotten_fix_is_never_passed() {
        let mut fixes = Fixes::default();
        fixes.note("public.a".into(), 0x200);
        fixes.forget("public.a");
        assert!(!fixes.seen("public.a"));
        assert!(fixes.passed(u64::MAX).is_empty());
    }
}
