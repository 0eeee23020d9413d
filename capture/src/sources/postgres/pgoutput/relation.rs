//! The relations seen so far in the stream, by OID.
//!
//! pgoutput sends a Relation message before the first change to a table in a
//! session and again after any schema change, so the latest one always
//! describes the tuples that follow it. Entries are `Arc`s so that an encoder
//! built for one shape can keep it while the cache moves on to the next.

use std::collections::HashMap;
use std::sync::Arc;

use super::Relation;

/// OID -> latest [`Relation`].
#[derive(Debug, Default, Clone)]
pub struct RelationCache {
    relations: HashMap<u32, Arc<Relation>>,
}

impl RelationCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `rel`, replacing any earlier shape of the same table, and
    /// returns the shared handle now in the cache.
    pub fn insert(&mut self, rel: Relation) -> Arc<Relation> {
        let rel = Arc::new(rel);
        self.relations.insert(rel.id, Arc::clone(&rel));
        rel
    }

    pub fn get(&self, relation_id: u32) -> Option<&Arc<Relation>> {
        self.relations.get(&relation_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::postgres::pgoutput::{Column, ReplicaIdentity};

    fn rel(id: u32, ncols: usize) -> Relation {
        Relation {
            id,
            namespace: "public".into(),
            name: format!("t{id}"),
            replica_identity: ReplicaIdentity::Default,
            columns: (0..ncols)
                .map(|i| Column {
                    is_key: i == 0,
                    name: format!("c{i}"),
                    type_oid: 23,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    #[test]
    fn insert_replaces_and_old_handles_survive() {
        let mut cache = RelationCache::new();
        let first = cache.insert(rel(1, 2));
        let second = cache.insert(rel(1, 3));
        assert_eq!(first.columns.len(), 2);
        assert_eq!(cache.get(1).unwrap().columns.len(), 3);
        assert!(Arc::ptr_eq(cache.get(1).unwrap(), &second));
    }
}
