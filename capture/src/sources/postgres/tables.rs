//! PostgreSQL's answers to what the router asks about a table
//! ([`TableCatalog`]), read from `pg_catalog` on the control connection.

use tokio_postgres::Client;

use super::control;
use super::pgoutput::{Relation, TypeMessage};
use super::replica_identity;
use super::value::TypeRegistry;
use crate::envelope::{EnvelopeConfig, EnvelopeError, SourceIdentity, TableEncoder};
use crate::error::CaptureError;
use crate::schema_change::SchemaHistory;
use crate::seam::{identity_in_history, CatalogTable, RoutedTable, TableCatalog};

/// What the router asks PostgreSQL about a table ([`TableCatalog`]): the
/// catalog, read through the control connection once the streamed
/// transaction `xid` is visible, so it is never behind the stream; a
/// table's identity with the column names the schema history knew.
pub(crate) struct SourceTables<'a> {
    control: &'a Client,
    history: &'a SchemaHistory,
    xid: Option<u32>,
}

impl<'a> SourceTables<'a> {
    /// The catalog as of the streamed transaction `xid` (none outside one).
    pub(crate) fn at(control: &'a Client, history: &'a SchemaHistory, xid: Option<u32>) -> Self {
        Self {
            control,
            history,
            xid,
        }
    }
}

impl TableCatalog for SourceTables<'_> {
    type Table = Relation;
    type Types = TypeRegistry;

    async fn published_as(
        &mut self,
        rel: &Relation,
    ) -> Result<Option<(String, String)>, CaptureError> {
        control::partition_root(self.control, rel.id, self.xid).await
    }

    async fn current(&mut self, rel: &Relation) -> Result<Option<CatalogTable>, CaptureError> {
        let found = control::relation_by_oid(self.control, rel.id, self.xid).await?;
        Ok(found.map(|(schema, name, primary_key)| CatalogTable {
            schema,
            name,
            primary_key,
        }))
    }

    async fn identity(
        &mut self,
        qualified: &str,
        rel: &Relation,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        identity_in_history(self.control, self.history, qualified, rel, self.xid).await
    }

    async fn learn_types(&mut self, types: &mut TypeRegistry) -> Result<(), CaptureError> {
        types.load_user_types_of(self.control, self.xid).await
    }
}

/// A Relation message is how the stream describes a table to the router:
/// its replica identity decides what before images carry.
impl RoutedTable for Relation {
    type Types = TypeRegistry;
    type TypeNote = TypeMessage;

    fn id(&self) -> u32 {
        self.id
    }

    fn publish_as(&mut self, namespace: String, name: String) {
        self.namespace = namespace;
        self.name = name;
    }

    fn same_columns(&self, other: &Self) -> bool {
        self.columns == other.columns
    }

    fn stream_key(&self) -> Vec<String> {
        replica_identity::key_from_relation(self)
    }

    fn identity_lacks(&self, qualified: &str, key: &[String]) -> Option<String> {
        let identity_columns = replica_identity::flagged_columns(self);
        let lacks = replica_identity::lacks(self.replica_identity, &identity_columns, key)?;
        Some(replica_identity::explain(qualified, qualified, &lacks, key))
    }

    fn identity_reason(lacks: &str) -> String {
        replica_identity::quarantine_reason(lacks)
    }

    fn keyless_reason(qualified: &str) -> String {
        control::keyless_reason(qualified, qualified)
    }

    fn encoder(
        &self,
        types: &TypeRegistry,
        key: Option<&[String]>,
        envelope: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<TableEncoder, EnvelopeError> {
        TableEncoder::identified(self, types, key, envelope, identity)
    }

    fn observe_type(types: &mut TypeRegistry, note: &TypeMessage) -> bool {
        types.observe(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::postgres::pgoutput::{Column, ReplicaIdentity};

    /// `public.orders`: `id int` flagged as its identity, and `note text`.
    fn orders(identity: ReplicaIdentity) -> Relation {
        let column = |name: &str, type_oid, is_key| Column {
            is_key,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        Relation {
            id: 10,
            namespace: "public".into(),
            name: "orders".into(),
            replica_identity: identity,
            columns: vec![column("id", 23, true), column("note", 25, false)],
        }
    }

    #[test]
    fn a_relations_identity_decides_what_the_router_is_told() {
        let rel = orders(ReplicaIdentity::Default);
        assert_eq!(rel.stream_key(), ["id"]);
        assert_eq!(rel.identity_lacks("public.orders", &["id".into()]), None);
        let lacks = rel.identity_lacks("public.orders", &["note".into()]);
        let lacks = lacks.expect("the identity does not carry `note`");
        assert!(lacks.contains("REPLICA IDENTITY DEFAULT"), "{lacks}");
        let reason = Relation::identity_reason(&lacks);
        assert!(reason.contains("replica.identity.check"), "{reason}");
        assert!(orders(ReplicaIdentity::Full).stream_key().is_empty());
        assert!(Relation::keyless_reason("public.t").contains("message.key.columns"));
    }

    #[test]
    fn a_relation_renamed_to_its_root_keeps_its_columns() {
        let mut rel = orders(ReplicaIdentity::Default);
        rel.publish_as("public".into(), "events".into());
        assert_eq!((rel.id(), rel.name.as_str()), (10, "events"));
        assert!(rel.same_columns(&orders(ReplicaIdentity::Default)));
        let mut wider = orders(ReplicaIdentity::Default);
        wider.columns.pop();
        assert!(!rel.same_columns(&wider));
    }

    #[test]
    fn a_type_is_new_once() {
        let mut types = TypeRegistry::builtin();
        let mood = TypeMessage {
            oid: 90_001,
            namespace: "public".into(),
            name: "mood".into(),
        };
        assert!(Relation::observe_type(&mut types, &mood));
        assert!(!Relation::observe_type(&mut types, &mood));
    }
}
