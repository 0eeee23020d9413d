//! PostgreSQL's side of schema changes ([`SchemaCatalog`]): the captured
//! tables' columns from `pg_attribute`, and a Relation's identity (its OID,
//! each column's attnum, the dropped ones) read once the streamed
//! transaction is visible.

use tokio_postgres::Client;

use super::control::{read_visible, PUBLISHED_COLUMN, XID_SNAPSHOT, XID_VISIBLE};
use super::pgoutput::Relation;
use crate::envelope::SourceIdentity;
use crate::error::CaptureError;
use crate::naming::quote_ident;
use crate::schema_change::{match_attnums, ColumnDef, FormerName, TableSchemas};
use crate::seam::SchemaCatalog;
use crate::snapshot::split_table;

impl SchemaCatalog for Client {
    type Table = Relation;

    async fn columns(&self, tables: &[String]) -> Result<TableSchemas, CaptureError> {
        load(self, tables)
            .await
            .map_err(CaptureError::pg("read the captured tables' columns"))
    }

    async fn identity(
        &self,
        rel: &Relation,
        known: Option<&[ColumnDef]>,
        former: &[FormerName],
        xid: Option<u32>,
    ) -> Result<Option<SourceIdentity>, CaptureError> {
        identity(self, rel, known, former, xid).await
    }
}

/// The columns of `tables` (`schema.table` names) as the catalog has them
/// now; a table that no longer exists is left out.
async fn load(client: &Client, tables: &[String]) -> Result<TableSchemas, tokio_postgres::Error> {
    let (names, regclasses): (Vec<&str>, Vec<String>) = tables
        .iter()
        .filter_map(|t| {
            let (schema, name) = split_table(t)?;
            Some((
                t.as_str(),
                format!("{}.{}", quote_ident(schema), quote_ident(name)),
            ))
        })
        .unzip();
    let rows = client
        .query(
            &format!(
                "SELECT t.name, a.attnum, a.attname::text, format_type(a.atttypid, a.atttypmod), \
                        a.attnotnull, a.atthasdef OR a.atthasmissing \
                 FROM unnest($1::text[], $2::text[]) AS t(name, rel) \
                 JOIN pg_attribute a ON a.attrelid = to_regclass(t.rel) \
                 WHERE a.attnum > 0 AND NOT a.attisdropped AND {PUBLISHED_COLUMN} \
                 ORDER BY t.name, a.attnum"
            ),
            &[&names, &regclasses],
        )
        .await?;
    let mut out = TableSchemas::new();
    for r in rows {
        out.entry(r.get::<_, String>(0))
            .or_default()
            .push(ColumnDef {
                attnum: r.get(1),
                name: r.get(2),
                type_name: r.get(3),
                not_null: r.get(4),
                has_default: r.get(5),
            });
    }
    Ok(out)
}

/// The [`SourceIdentity`] of `rel`, the Relation of table `table`
/// (`schema.table`, a partition's root): its oid and dropped columns as the
/// catalog has them now, and each column's attnum matched by name
/// ([`match_attnums`]) against the catalog's columns, `known` (the
/// columns last published, which the stream may still be at when the
/// catalog is ahead of it) and `former` names (for a Relation older than
/// both, replayed after a restart).
///
/// `xid`: the stream's transaction the Relation came in. The walsender
/// sends a transaction a moment before other sessions see it committed, so
/// the catalog is read in the same statement (the same snapshot) as the
/// check that `xid` is visible, and again until it is: a catalog behind the
/// stream would give the fields of `RENAME a TO b; ADD COLUMN a` the old
/// attnums (`a` the renamed column's, `b` none), and the warehouse would
/// write the new `a` into the old column. A DDL committed in an earlier
/// transaction is visible by then: its lock on the table outlives its
/// commit's visibility, and this transaction changed the table after it.
pub async fn identity(
    client: &Client,
    rel: &Relation,
    known: Option<&[ColumnDef]>,
    former: &[FormerName],
    xid: Option<u32>,
) -> Result<Option<SourceIdentity>, CaptureError> {
    // By the Relation's OID (a partition's: its root's, which the pipeline
    // names it by), not by name: the catalog may have renamed the table
    // since, or dropped it and made another of that name. No xid (a
    // snapshot chunk's Relation, read from the catalog itself): visible.
    let sql = format!(
        "SELECT {XID_VISIBLE}, c.oid, a.attnum, a.attname::text, a.attisdropped \
         FROM {XID_SNAPSHOT} \
         LEFT JOIN (pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 \
                    AND c.oid = COALESCE(pg_partition_root($2::oid::regclass), $2::oid)) ON true"
    );
    let rows = read_visible(
        client,
        &sql,
        &[&rel.id],
        xid,
        "read the table's column attnums",
    )
    .await?;
    // Without the table (dropped since): the one row of the LEFT JOIN.
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| r.get::<_, Option<u32>>(1).is_some())
        .collect();
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut candidates: Vec<(i16, &str)> = known
        .unwrap_or_default()
        .iter()
        .map(|c| (c.attnum, c.name.as_str()))
        .chain(former.iter().map(|f| (f.attnum, f.name.as_str())))
        .collect();
    let mut dropped = Vec::new();
    for r in &rows {
        if r.get::<_, bool>(4) {
            dropped.push(r.get::<_, i16>(2));
        } else {
            candidates.push((r.get(2), r.get(3)));
        }
    }
    let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
    let attnums = match_attnums(&names, &candidates);
    // A column the catalog already dropped that this (older) Relation still
    // has is not reported dropped by it.
    dropped.retain(|d| !attnums.contains(&Some(*d)));
    dropped.sort_unstable();
    Ok(Some(SourceIdentity {
        table_oid: first.get(1),
        attnums,
        dropped,
    }))
}
