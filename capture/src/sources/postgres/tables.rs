//! PostgreSQL's answers to what the router asks about a table
//! ([`TableCatalog`]), read from `pg_catalog` on the control connection.

use tokio_postgres::Client;

use super::control;
use super::pgoutput::Relation;
use super::value::TypeRegistry;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::pipeline::SchemaWatch;
use crate::seam::{CatalogTable, TableCatalog};

/// What the router asks PostgreSQL about a table ([`TableCatalog`]): the
/// catalog, read through the control connection once the streamed
/// transaction `xid` is visible, so it is never behind the stream; a
/// table's identity with the column names the schema history knew.
pub(crate) struct SourceTables<'a> {
    control: &'a Client,
    schema: &'a SchemaWatch,
    xid: Option<u32>,
}

impl<'a> SourceTables<'a> {
    /// The catalog as of the streamed transaction `xid` (none outside one).
    pub(crate) fn at(control: &'a Client, schema: &'a SchemaWatch, xid: Option<u32>) -> Self {
        Self {
            control,
            schema,
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
        self.schema
            .source_identity(self.control, qualified, rel, self.xid)
            .await
    }

    async fn learn_types(&mut self, types: &mut TypeRegistry) -> Result<(), CaptureError> {
        types.load_user_types_of(self.control, self.xid).await
    }
}
