//! The relations seen so far in the stream, by OID.
//!
//! pgoutput sends a Relation message before the first change to a table in a
//! session and again after any schema change, so the latest one always
//! describes the tuples that follow it. Entries are `Arc`s so that an encoder
//! built for one shape can keep it while the cache moves on to the next.

use std::collections::HashMap;
use std::sync::Arc;

use super::{DecodeError, Relation, TupleData};

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

    pub fn remove(&mut self, relation_id: u32) -> Option<Arc<Relation>> {
        self.relations.remove(&relation_id)
    }

    pub fn len(&self) -> usize {
        self.relations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.relations.is_empty()
    }

    /// The relation a tuple belongs to, after checking that the tuple has
    /// exactly one value per column. A mismatch means we missed a Relation
    /// message (a schema change) and would map values to the wrong columns.
    pub fn check_tuple(
        &self,
        relation_id: u32,
        tuple: &TupleData,
    ) -> Result<&Arc<Relation>, DecodeError> {
        let rel = self
            .get(relation_id)
            .ok_or(DecodeError::UnknownRelation { relation_id })?;
        if rel.columns.len() != tuple.0.len() {
            return Err(DecodeError::ColumnCountMismatch {
                relation_id,
                namespace: rel.namespace.clone(),
                name: rel.name.clone(),
                expected: rel.columns.len(),
                got: tuple.0.len(),
            });
        }
        Ok(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::postgres::pgoutput::{Column, ReplicaIdentity, TupleValue};

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
        assert_eq!(cache.len(), 1);
        assert_eq!(first.columns.len(), 2);
        assert_eq!(cache.get(1).unwrap().columns.len(), 3);
        assert!(Arc::ptr_eq(cache.get(1).unwrap(), &second));
        assert!(cache.remove(1).is_some());
        assert!(cache.is_empty());
    }

    #[test]
    fn check_tuple() {
        let mut cache = RelationCache::new();
        cache.insert(rel(1, 2));
        let ok = TupleData(vec![TupleValue::Null, TupleValue::UnchangedToast]);
        assert_eq!(cache.check_tuple(1, &ok).unwrap().id, 1);

        let short = TupleData(vec![TupleValue::Null]);
        let err = cache.check_tuple(1, &short).unwrap_err();
        assert_eq!(
            err,
            DecodeError::ColumnCountMismatch {
                relation_id: 1,
                namespace: "public".into(),
                name: "t1".into(),
                expected: 2,
                got: 1,
            }
        );
        assert!(err.to_string().contains("public.t1"));
        assert_eq!(
            cache.check_tuple(2, &ok).unwrap_err(),
            DecodeError::UnknownRelation { relation_id: 2 }
        );
    }
}
