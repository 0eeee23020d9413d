//! Writing a [`Plan`] in one transaction with the batch's position: set-based
//! statements (`unnest` of one array per column), never a round trip per row.
//!
//! * Upserts and tombstones: `INSERT ... SELECT FROM unnest(...) ON CONFLICT (key)
//!   DO UPDATE ... WHERE (stored lsn, seq) < (incoming lsn, seq)`; a delete keeps the
//!   stored columns and sets the tombstone flag; an unavailable column keeps its value.
//! * Hard deletes: `DELETE ... USING unnest(...)` guarded by the same version test.
//! * History: `INSERT ... ON CONFLICT (lsn, seq) DO NOTHING`.
//!
//! When a statement fails with a data or integrity error (SQLSTATE class 22/23), the
//! transaction is rolled back and the plan is tried again one row per savepoint, in
//! a transaction that is always rolled back, only to name the records to dead-letter.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::types::{IsNull, ToSql, Type, WrongType};

use oncely_core::sql::quote_ident as quote;

use super::config::TruncateMode;
use super::error::{classify, Class};
use super::plan::HistoryRow;
use super::rows::Row;
use super::statement::{group_statement, unnest, Group, Modes, Params};
use super::table::TableInfo;
use super::types::Conv;
use crate::error::RecordFailure;

/// A step ready to write: table metadata resolved.
#[derive(Debug)]
pub enum Ready<'a> {
    /// Groups of one target table.
    Rows(std::sync::Arc<TableInfo>, Vec<Group<'a>>),
    /// A truncate of an existing table.
    Truncate {
        /// The table.
        table: std::sync::Arc<TableInfo>,
        /// Version of the truncate.
        version: (i64, i64),
    },
    /// History rows of one history table.
    History(std::sync::Arc<TableInfo>, &'a [HistoryRow]),
}

/// The batch being written: its records (rows refer to them) and its partition (for history rows).
pub struct Origin<'a> {
    /// The batch's records.
    pub records: &'a [crate::sink::Record],
    /// Kafka topic.
    pub topic: &'a str,
    /// Kafka partition.
    pub partition: i32,
}

/// Runs every step in `tx`; the first error is returned as is.
pub async fn write_all(
    tx: &Transaction<'_>,
    steps: &[Ready<'_>],
    modes: Modes,
    origin: &Origin<'_>,
) -> Result<(), tokio_postgres::Error> {
    for step in steps {
        match step {
            Ready::Rows(info, groups) => {
                for g in groups {
                    write_group(tx, info, g, &g.rows, origin.records, modes).await?;
                }
            }
            Ready::Truncate { table, version } => truncate(tx, table, *version, modes).await?,
            Ready::History(info, rows) => {
                let rows: Vec<&HistoryRow> = rows.iter().collect();
                history(tx, info, &rows, origin).await?;
            }
        }
    }
    Ok(())
}

/// Tries every row alone (each under a savepoint) and names those refused with a
/// data or integrity error. The caller rolls `tx` back.
pub async fn find_rejected(
    tx: &mut Transaction<'_>,
    steps: &[Ready<'_>],
    modes: Modes,
    origin: &Origin<'_>,
) -> Result<Vec<RecordFailure>, tokio_postgres::Error> {
    let mut failures = Vec::new();
    for step in steps {
        match step {
            Ready::Rows(info, groups) => {
                for g in groups {
                    for row in &g.rows {
                        let sp = tx.savepoint("oncely_row").await?;
                        match write_group(&sp, info, g, &[*row], origin.records, modes).await {
                            Ok(()) => sp.commit().await?,
                            Err(e) if classify(&e) == Class::Record => {
                                failures.push(RecordFailure::new(row.offset, reason(info, &e)));
                                sp.rollback().await?;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            Ready::Truncate { table, version } => truncate(tx, table, *version, modes).await?,
            Ready::History(info, rows) => {
                for row in rows.iter() {
                    let sp = tx.savepoint("oncely_row").await?;
                    match history(&sp, info, &[row], origin).await {
                        Ok(()) => sp.commit().await?,
                        Err(e) if classify(&e) == Class::Record => {
                            failures.push(RecordFailure::new(row.offset, reason(info, &e)));
                            sp.rollback().await?;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    Ok(failures)
}

fn reason(info: &TableInfo, e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{} refused the row: {} (SQLSTATE {})",
            info.qualified,
            db.message(),
            db.code().code()
        ),
        None => format!("{} refused the row: {e}", info.qualified),
    }
}

async fn write_group(
    tx: &Transaction<'_>,
    info: &TableInfo,
    group: &Group<'_>,
    rows: &[&Row],
    records: &[crate::sink::Record],
    modes: Modes,
) -> Result<(), tokio_postgres::Error> {
    let (sql, params, _) = group_statement(info, group, rows, records, modes);
    run(tx, &sql, &params).await
}

/// One parameter already encoded in the binary format of its type.
#[derive(Debug)]
struct Encoded {
    ty: Type,
    bytes: Option<Bytes>,
}

impl Encoded {
    fn new(param: &(dyn ToSql + Sync), ty: Type) -> Option<Self> {
        let mut buf = BytesMut::new();
        let bytes = match param.to_sql_checked(&ty, &mut buf).ok()? {
            IsNull::Yes => None,
            IsNull::No => Some(buf.freeze()),
        };
        Some(Self { ty, bytes })
    }
}

impl ToSql for Encoded {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.bytes {
            Some(b) => {
                out.extend_from_slice(b);
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    /// Only as the type it was encoded for.
    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty != self.ty {
            return Err(Box::new(WrongType::new::<Self>(ty.clone())));
        }
        self.to_sql(ty, out)
    }
}

/// The statement of one group of rows (without the position), built and its
/// parameters encoded ahead of `apply` (see `Prepared` in the module), with
/// what it was built from, to check that `apply` resolved the same group.
#[derive(Debug)]
pub struct Prebuilt {
    info: Arc<TableInfo>,
    columns: Vec<String>,
    convs: Vec<Conv>,
    delete: bool,
    offsets: Vec<i64>,
    sql: String,
    params: Vec<Encoded>,
}

impl Prebuilt {
    /// Builds and encodes the statement of `group` of table `info`; `None` if a
    /// parameter cannot be encoded (`apply` then builds it and reports the error).
    pub fn new(
        info: Arc<TableInfo>,
        group: &Group<'_>,
        records: &[crate::sink::Record],
        modes: Modes,
    ) -> Option<Self> {
        let (sql, params, types) = group_statement(&info, group, &group.rows, records, modes);
        let params = params
            .iter()
            .zip(types)
            .map(|(p, ty)| Encoded::new(p.as_ref(), ty))
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            columns: group.columns.iter().map(|c| (*c).to_owned()).collect(),
            convs: group.convs.clone(),
            delete: group.delete,
            offsets: group.rows.iter().map(|r| r.offset).collect(),
            info,
            sql,
            params,
        })
    }

    /// Whether this is the statement of `group` of the table as `info` describes it now.
    fn matches(&self, info: &Arc<TableInfo>, group: &Group<'_>) -> bool {
        Arc::ptr_eq(&self.info, info)
            && self.delete == group.delete
            && self.convs == group.convs
            && self
                .columns
                .iter()
                .map(String::as_str)
                .eq(group.columns.iter().copied())
            && self
                .offsets
                .iter()
                .copied()
                .eq(group.rows.iter().map(|r| r.offset))
    }
}

/// Writes one group of rows and the batch's position as **one statement**
/// (the upsert in a `WITH`, the position upsert as its main query): atomic on
/// its own, so it runs without `BEGIN`/`COMMIT` and their two round trips.
/// For batches whose plan is exactly one group, the common case.
/// Uses `prebuilt` when it is the statement of this very group and table
/// (returns whether it did).
pub async fn write_group_with_position(
    client: &deadpool_postgres::Client,
    (info, group, prebuilt): (&Arc<TableInfo>, &Group<'_>, Option<&Prebuilt>),
    origin: &Origin<'_>,
    modes: Modes,
    (positions_table, batch): (&str, &crate::sink::Batch),
) -> Result<bool, tokio_postgres::Error> {
    let built;
    let prebuilt = prebuilt.filter(|p| p.matches(info, group));
    let (data, mut params): (&str, Vec<&(dyn ToSql + Sync)>) = match prebuilt {
        Some(p) => (&p.sql, p.params.iter().map(|e| e as _).collect()),
        None => {
            built = group_statement(info, group, &group.rows, origin.records, modes);
            (&built.0, built.1.iter().map(|p| p.as_ref() as _).collect())
        }
    };
    let n = params.len();
    let sql = format!(
        "WITH data AS ({data}) {}",
        position_sql(positions_table, [n + 1, n + 2, n + 3, n + 4])
    );
    let (group_id, topic, partition, next) = (
        batch.group(),
        batch.topic(),
        batch.partition(),
        batch.next_offset(),
    );
    let position: [&(dyn ToSql + Sync); 4] = [&group_id, &topic, &partition, &next];
    params.extend(position);
    let stmt = client.prepare_cached(&sql).await?;
    client.execute(&stmt, &params).await?;
    Ok(prebuilt.is_some())
}

async fn run<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &Params<'_>,
) -> Result<(), tokio_postgres::Error> {
    let stmt = client.prepare_cached(sql).await?;
    let refs: Vec<&(dyn ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect();
    client.execute(&stmt, &refs).await?;
    Ok(())
}

async fn truncate(
    tx: &Transaction<'_>,
    info: &TableInfo,
    (lsn, seq): (i64, i64),
    modes: Modes,
) -> Result<(), tokio_postgres::Error> {
    let q = &info.qualified;
    let (l, s, d, n) = (
        quote(&info.meta.lsn),
        quote(&info.meta.seq),
        quote(&info.meta.deleted),
        quote(&info.meta.unavailable),
    );
    let applied = |rows: u64| {
        tracing::info!(table = %q, rows, version = ?(lsn, seq), "postgres truncate applied");
    };
    match modes.truncate {
        TruncateMode::Ignore => Ok(()),
        // Not a TRUNCATE statement: capture sends a truncate to every
        // partition of a topic, and the copy read from one partition may
        // come after rows newer than it read from another. Rows older than
        // the truncate go, without tombstones; newer ones stay.
        TruncateMode::Truncate => {
            let sql = format!("DELETE FROM {q} WHERE ({l}, {s}) < ($1, $2)");
            tx.execute(&sql, &[&lsn, &seq]).await.map(applied)
        }
        TruncateMode::Delete => {
            let sql = format!(
                "UPDATE {q} SET {d} = true, {l} = $1, {s} = $2, {n} = NULL WHERE ({l}, {s}) < ($1, $2)"
            );
            tx.execute(&sql, &[&lsn, &seq]).await.map(applied)
        }
    }
}

async fn history(
    tx: &Transaction<'_>,
    info: &TableInfo,
    rows: &[&HistoryRow],
    origin: &Origin<'_>,
) -> Result<(), tokio_postgres::Error> {
    let mut cols: BTreeMap<&str, Vec<Option<String>>> = BTreeMap::new();
    for r in rows {
        cols.entry("1op").or_default().push(Some(r.op.to_owned()));
        cols.entry("2key").or_default().push(r.key.clone());
        cols.entry("3before").or_default().push(r.before.clone());
        cols.entry("4after").or_default().push(r.after.clone());
        cols.entry("5source")
            .or_default()
            .push(Some(r.source.clone()));
    }
    let mut params: Params = cols.into_values().map(|v| Box::new(v) as _).collect();
    let lsn: Vec<i64> = rows
        .iter()
        .map(|r| i64::try_from(r.version.lsn).unwrap_or(i64::MAX))
        .collect();
    let seq: Vec<i64> = rows
        .iter()
        .map(|r| i64::try_from(r.version.seq).unwrap_or(i64::MAX))
        .collect();
    let ts: Vec<Option<i64>> = rows.iter().map(|r| r.ts_ms).collect();
    let offsets: Vec<i64> = rows.iter().map(|r| r.offset).collect();
    params.push(Box::new(lsn));
    params.push(Box::new(seq));
    params.push(Box::new(ts));
    params.push(Box::new(offsets));
    params.push(Box::new(origin.topic.to_owned()));
    params.push(Box::new(origin.partition));
    let sql = format!(
        "INSERT INTO {} (lsn, seq, op, key, before, after, source, ts_ms, kafka_topic, kafka_partition, kafka_offset) \
         SELECT u.l, u.s, u.c0, u.c1::jsonb, u.c2::jsonb, u.c3::jsonb, u.c4::jsonb, u.ts, $10, $11, u.o FROM {} \
         ON CONFLICT (lsn, seq) DO NOTHING",
        info.qualified,
        unnest(&["text"; 5], &[("l", "int8"), ("s", "int8"), ("ts", "int8"), ("o", "int8")]),
    );
    run(tx, &sql, &params).await
}

/// The upsert of a position, its group, topic, partition and next offset
/// bound to the parameters numbered `p`.
fn position_sql(positions_table: &str, p: [usize; 4]) -> String {
    format!(
        "INSERT INTO {positions_table} (group_id, topic, partition, next_offset, updated_at) \
         VALUES (${}, ${}, ${}, ${}, now()) ON CONFLICT (group_id, topic, partition) \
         DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
        p[0], p[1], p[2], p[3]
    )
}

/// Stores the batch's position in the same transaction.
pub async fn store_position(
    tx: &Transaction<'_>,
    positions_table: &str,
    batch: &crate::sink::Batch,
) -> Result<(), tokio_postgres::Error> {
    let sql = position_sql(positions_table, [1, 2, 3, 4]);
    let stmt = tx.prepare_cached(&sql).await?;
    tx.execute(
        &stmt,
        &[
            &batch.group(),
            &batch.topic(),
            &batch.partition(),
            &batch.next_offset(),
        ],
    )
    .await
    .map(|_| ())
}
