//! Values a change does not carry, read from the source by key.
//!
//! The create of a primary-key update carries unchanged TOASTed columns as
//! "unchanged" (pgoutput sends them as `u`), and no target holds a row under
//! the new key to keep them from. Capture reads them from the source table by
//! the new key over the control connection instead. The value read is at
//! least as new as the change (the read waits until the change's transaction
//! is visible): any later change either carries its own value or leaves the
//! column unchanged, so every target ends with the source's value (see
//! docs/design.md, "Values that are not in the change").

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Format, IsNull, ToSql, Type};
use tokio_postgres::Client;

use super::control::XID_SNAPSHOT;
use super::pgoutput::Relation;
use crate::change::{Datum, RowImage};
use crate::error::CaptureError;
use crate::naming::quote_ident;
use crate::seam::UnchangedValues;

/// The control connection reads what a change left out.
impl UnchangedValues for Client {
    type Table = Relation;

    async fn read_unchanged(
        &mut self,
        table: &Relation,
        key_idx: &[usize],
        xid: u32,
        row: &RowImage,
    ) -> Result<Option<RowImage>, CaptureError> {
        read_unavailable(self, table, key_idx, xid, row).await
    }
}

/// The session settings of the replication connection, so values read here
/// render exactly as the stream's (the snapshot connection uses the same).
const SESSION: &str = "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; \
     SET LOCAL IntervalStyle = 'postgres'; SET LOCAL extra_float_digits = 3; \
     SET LOCAL standard_conforming_strings = on; SET LOCAL bytea_output = 'hex'";

/// How long to wait for a committed transaction to become visible to new
/// snapshots (PostgreSQL can send a commit a moment before that).
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the columns of `row` that are [`Datum::Unchanged`] from the
/// table of `rel`, by the key values of `row` (columns `key_idx`), once the
/// transaction `xid` that wrote `row` is visible. Returns the completed row,
/// or `None` when no row has that key any more (a later change deleted it or
/// changed its key, and its own events cover the targets).
async fn read_unavailable(
    client: &mut Client,
    rel: &Relation,
    key_idx: &[usize],
    xid: u32,
    row: &RowImage,
) -> Result<Option<RowImage>, CaptureError> {
    let missing: Vec<usize> = row
        .0
        .iter()
        .enumerate()
        .filter(|(_, v)| matches!(v, Datum::Unchanged))
        .map(|(i, _)| i)
        .collect();
    if missing.is_empty() {
        return Ok(Some(row.clone()));
    }
    let keys = key_params(rel, key_idx, row)?;
    let sql = read_query(rel, key_idx, &missing);
    let xid = i64::from(xid);
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&xid];
    params.extend(keys.iter().map(|k| k as &(dyn ToSql + Sync)));

    let pg = |context| CaptureError::pg(context);
    let tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .map_err(pg("begin TOAST read"))?;
    tx.batch_execute(SESSION)
        .await
        .map_err(pg("set TOAST read session"))?;
    let Some(found) = read_when_visible(&tx, rel, &sql, &params, xid).await? else {
        return Ok(None);
    };
    tx.commit().await.map_err(pg("end TOAST read"))?;
    let Some(found) = found else {
        return Ok(None);
    };
    let mut filled = row.clone();
    for (n, &i) in missing.iter().enumerate() {
        filled.0[i] = match found.get::<_, Option<String>>(n + 2) {
            Some(v) => Datum::Text(Bytes::from(v)),
            None => Datum::Null,
        };
    }
    Ok(Some(filled))
}

/// The key values of `row` (columns `key_idx`) as parameters of the read.
fn key_params(
    rel: &Relation,
    key_idx: &[usize],
    row: &RowImage,
) -> Result<Vec<TextParam>, CaptureError> {
    let mut keys = Vec::with_capacity(key_idx.len());
    for &i in key_idx {
        match row.0.get(i) {
            Some(Datum::Text(t)) => keys.push(TextParam(t.clone())),
            other => {
                return Err(CaptureError::Protocol(format!(
                    "key column {} of {}.{} is {other:?}, not a text value: cannot read the row's unchanged TOAST values",
                    rel.columns.get(i).map_or("?", |c| c.name.as_str()),
                    rel.namespace,
                    rel.name
                )))
            }
        }
    }
    Ok(keys)
}

/// Runs the read (`sql`, [`read_query`]) until transaction `xid` is visible
/// to its snapshot, waiting up to [`VISIBLE_TIMEOUT`]: `Some(Some(row))`
/// with the values read, `Some(None)` when no row has the key any more, and
/// `None` when the table or column is gone (the read is given up).
async fn read_when_visible(
    tx: &tokio_postgres::Transaction<'_>,
    rel: &Relation,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    xid: i64,
) -> Result<Option<Option<tokio_postgres::Row>>, CaptureError> {
    let deadline = Instant::now() + VISIBLE_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        let rows = match tx.query(sql, params).await {
            Ok(rows) => rows,
            Err(e) if gone(&e) => {
                // The table or the column no longer exists: its value is gone
                // from the source too; the targets keep what they have.
                static GONE: oncely_core::log_limit::LogLimit =
                    oncely_core::log_limit::LogLimit::new(Duration::from_secs(10), 5);
                if let Some(suppressed) = GONE.admit() {
                    tracing::warn!(table = %format!("{}.{}", rel.namespace, rel.name), error = %e, suppressed, "cannot read unchanged TOAST values of a primary-key update: the table or column is gone; the values stay unavailable (at most 5 such lines per 10 s)");
                }
                return Ok(None);
            }
            Err(e) => return Err(CaptureError::pg("read unchanged TOAST values")(e)),
        };
        let Some(first) = rows.first() else {
            return Err(CaptureError::SourceRead(
                "the TOAST read returned no visibility row".into(),
            ));
        };
        if first.get::<_, bool>(0) {
            return Ok(Some(
                first
                    .get::<_, Option<bool>>(1)
                    .is_some()
                    .then(|| first.clone()),
            ));
        }
        if Instant::now() > deadline {
            return Err(CaptureError::SourceRead(format!(
                "transaction {xid} sent by the replication stream is still not visible after {VISIBLE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Whether the read failed because the table or a column no longer exists.
fn gone(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::UNDEFINED_COLUMN
    )
}

/// The read of columns `missing` of the row keyed by `$2..`, in the same
/// statement (so the same snapshot) as the check that transaction `$1` is
/// visible ([`XID_SNAPSHOT`]).
/// Values come in their text output form (`format('%s')` calls the type's
/// output function, as pgoutput does; a cast to text would not, e.g. for
/// boolean or char(n)).
fn read_query(rel: &Relation, key_idx: &[usize], missing: &[usize]) -> String {
    let column = |i: usize| quote_ident(&rel.columns[i].name);
    let values: Vec<String> = missing
        .iter()
        .map(|&i| {
            let c = column(i);
            format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END")
        })
        .collect();
    let filter: Vec<String> = key_idx
        .iter()
        .enumerate()
        .map(|(n, &i)| format!("{} = ${}", column(i), n + 2))
        .collect();
    format!(
        "SELECT pg_visible_in_snapshot(w.xid::text::xid8, w.snap), r.* \
         FROM {XID_SNAPSHOT} \
         LEFT JOIN LATERAL (SELECT true, {} FROM {}.{} WHERE {} LIMIT 1) r ON true",
        values.join(", "),
        quote_ident(&rel.namespace),
        quote_ident(&rel.name),
        filter.join(" AND "),
    )
}

/// A parameter sent in text format, for the server to parse as the type it
/// infers (the key column's): the key values come from pgoutput as text.
#[derive(Debug)]
struct TextParam(Bytes);

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    tokio_postgres::types::to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::postgres::pgoutput::{Column, ReplicaIdentity};

    #[test]
    fn the_query_quotes_names_and_binds_keys() {
        let col = |name: &str| Column {
            is_key: false,
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
        };
        let rel = Relation {
            id: 1,
            namespace: "my schema".into(),
            name: "t\"x".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![col("tenant"), col("id"), col("big")],
        };
        let sql = read_query(&rel, &[0, 1], &[2]);
        assert!(
            sql.contains(r#"FROM "my schema"."t""x" WHERE "tenant" = $2 AND "id" = $3 LIMIT 1"#),
            "{sql}"
        );
        assert!(
            sql.contains(r#"CASE WHEN "big" IS NULL THEN NULL ELSE format('%s', "big") END"#),
            "{sql}"
        );
    }
}
