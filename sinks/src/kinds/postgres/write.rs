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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use deadpool_postgres::{GenericClient, Transaction};
use serde_json::Value;
use tokio_postgres::types::{IsNull, ToSql, Type, WrongType};

use super::config::{DeleteMode, TruncateMode};
use super::error::{classify, Class};
use super::plan::{column_values, HistoryRow, Row};
use super::table::{literal, quote, TableInfo};
use super::types::{to_text_as, ColumnSpec, Conv, Temporal};
use crate::error::RecordFailure;

/// Rows of one table that share a column list: one statement.
#[derive(Debug)]
pub struct Group<'a> {
    /// Columns written (key columns first).
    pub columns: Vec<&'a str>,
    /// How each column's text becomes its value.
    pub convs: Vec<Conv>,
    /// The rows; deletes when `delete` is set.
    pub rows: Vec<&'a Row>,
    /// A group of deletes.
    pub delete: bool,
}

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

/// How writes behave.
#[derive(Debug, Clone, Copy)]
pub struct Modes {
    /// `delete.mode`.
    pub delete: DeleteMode,
    /// `truncate.mode`.
    pub truncate: TruncateMode,
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

type Params<'a> = Vec<Box<dyn ToSql + Sync + Send + 'a>>;

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

/// The version as two bigints (LSNs and ordinals beyond `i64::MAX` are rejected when planning).
pub fn version_params(row: &Row) -> (i64, i64) {
    (
        i64::try_from(row.version.lsn).unwrap_or(i64::MAX),
        i64::try_from(row.version.seq).unwrap_or(i64::MAX),
    )
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

/// The statement writing `rows` of `group`, its parameters and their types
/// (as the statement's casts make them).
fn group_statement<'a>(
    info: &TableInfo,
    group: &Group<'_>,
    rows: &[&Row],
    records: &'a [crate::sink::Record],
    modes: Modes,
) -> (String, Params<'a>, Vec<Type>) {
    let hard = group.delete && modes.delete == DeleteMode::Hard;
    let mut params: Params = Vec::with_capacity(group.columns.len() + 4);
    let mut types: Vec<&'static str> = Vec::with_capacity(group.columns.len());
    let columns = column_values(&group.columns, rows, records);
    for ((col, conv), values) in group.columns.iter().zip(&group.convs).zip(&columns) {
        let actual = info.columns.get(*col).map_or("text", String::as_str);
        let (ty, param) = column_param(values, actual, *conv);
        types.push(ty);
        params.push(param);
    }
    let mut param_types: Vec<Type> = types.iter().map(|t| array_type(t)).collect();
    let (lsns, seqs): (Vec<i64>, Vec<i64>) = rows.iter().map(|r| version_params(r)).unzip();
    params.push(Box::new(lsns));
    params.push(Box::new(seqs));
    param_types.extend([Type::INT8_ARRAY, Type::INT8_ARRAY]);
    let sql = if hard {
        delete_sql(info, group, &types)
    } else {
        let deleted: Vec<bool> = rows.iter().map(|r| r.is_delete()).collect();
        let unavailable: Vec<Option<String>> = rows
            .iter()
            .map(|r| {
                let unavailable = &r.shape.unavailable;
                (!unavailable.is_empty()).then(|| {
                    Value::Array(
                        unavailable
                            .iter()
                            .map(|c| Value::from(c.as_str()))
                            .collect(),
                    )
                    .to_string()
                })
            })
            .collect();
        // Plain upserts (no deletes, nothing unavailable) set the flag and
        // the list as constants: two arrays fewer to send and unnest.
        let keep = group.delete || rows.iter().any(|r| !r.shape.unavailable.is_empty());
        if keep {
            params.push(Box::new(deleted));
            params.push(Box::new(unavailable));
            param_types.extend([Type::BOOL_ARRAY, Type::TEXT_ARRAY]);
        }
        upsert_sql(info, group, &types, keep)
    };
    (sql, params, param_types)
}

/// The array type of the element type named in a statement's `$n::<name>[]` casts.
fn array_type(element: &str) -> Type {
    match element {
        "int8" => Type::INT8_ARRAY,
        "float8" => Type::FLOAT8_ARRAY,
        "bool" => Type::BOOL_ARRAY,
        _ => Type::TEXT_ARRAY,
    }
}

/// One column's values as an array parameter: typed (`int8[]`, `float8[]`, `bool[]`)
/// when every value fits a plain cast to the target type, else text.
fn column_param<'v>(
    values: &[Option<&'v Value>],
    actual: &str,
    conv: Conv,
) -> (&'static str, Box<dyn ToSql + Sync + Send + 'v>) {
    if conv == Conv::Cast {
        match actual {
            "bigint" | "integer" | "smallint" => {
                let ints: Option<Vec<Option<i64>>> = values
                    .iter()
                    .map(|v| v.map_or(Some(None), |v| v.as_i64().map(Some)))
                    .collect();
                if let Some(ints) = ints {
                    return ("int8", Box::new(ints));
                }
            }
            "double precision" | "real" => {
                let floats: Option<Vec<Option<f64>>> = values
                    .iter()
                    .map(|v| v.map_or(Some(None), |v| v.as_f64().map(Some)))
                    .collect();
                if let Some(floats) = floats {
                    return ("float8", Box::new(floats));
                }
            }
            "boolean" => {
                let bools: Option<Vec<Option<bool>>> = values
                    .iter()
                    .map(|v| v.map_or(Some(None), |v| v.as_bool().map(Some)))
                    .collect();
                if let Some(bools) = bools {
                    return ("bool", Box::new(bools));
                }
            }
            _ => {}
        }
    }
    let each = match conv {
        Conv::Each(t) if actual.ends_with("[]") => Some(t),
        _ => None,
    };
    let texts: Vec<Option<Cow<'v, str>>> = values
        .iter()
        .map(|v| {
            v.and_then(|v| to_text_as(v, actual, each))
                .map(|t| conv.pg_text(t, actual))
        })
        .collect();
    ("text", Box::new(texts))
}

/// `unnest($1::<t0>[], ...) AS u(c0, ...)` for the value columns, plus the given typed extras.
fn unnest(types: &[&str], extras: &[(&str, &str)]) -> String {
    let n = types.len();
    let mut args: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, ty)| format!("${}::{ty}[]", i + 1))
        .collect();
    let mut names: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    for (i, (name, ty)) in extras.iter().enumerate() {
        args.push(format!("${}::{ty}[]", n + i + 1));
        names.push((*name).to_owned());
    }
    format!("unnest({}) AS u({})", args.join(", "), names.join(", "))
}

fn exprs(info: &TableInfo, group: &Group<'_>) -> Vec<String> {
    group
        .columns
        .iter()
        .zip(&group.convs)
        .enumerate()
        .map(|(i, (c, conv))| {
            let actual = info.columns.get(*c).map_or("text", String::as_str);
            ColumnSpec {
                ddl: actual.to_owned().into(),
                conv: *conv,
                inferred: false,
                attnum: None,
            }
            .select_expr(&format!("u.c{i}"), actual)
        })
        .collect()
}

/// The conversion for a column whose event carries no schema: by the target column's
/// type, so schemaless events still fill columns typed by earlier events.
pub fn conv_for_type(actual: &str) -> Conv {
    match actual {
        "timestamp without time zone" => Conv::EpochMicros,
        "date" => Conv::EpochDays,
        "time without time zone" => Conv::MicrosOfDay,
        "interval" => Conv::Micros,
        "timestamp with time zone" => Conv::Zoned,
        "bytea" => Conv::Base64,
        "date[]" => Conv::Each(Temporal::Days),
        "timestamp without time zone[]" => Conv::Each(Temporal::Micros),
        "time without time zone[]" => Conv::Each(Temporal::MicrosOfDay),
        _ => Conv::Cast,
    }
}

/// `keep`: the group is deletes or has unavailable values. Then a column listed in
/// a row's unavailable columns (or any column of a delete) keeps its stored value,
/// and the flag and list come as arrays; without it every listed column is
/// overwritten and they are constants.
fn upsert_sql(info: &TableInfo, group: &Group<'_>, types: &[&str], keep: bool) -> String {
    let columns = &group.columns;
    let q = &info.qualified;
    let (lsn, seq, del, unav) = (
        quote(&info.meta.lsn),
        quote(&info.meta.seq),
        quote(&info.meta.deleted),
        quote(&info.meta.unavailable),
    );
    let names: Vec<String> = columns.iter().map(|c| quote(c)).collect();
    let keys: Vec<String> = info.key.iter().map(|c| quote(c)).collect();
    let mut set: Vec<String> = columns
        .iter()
        .filter(|c| !info.key.iter().any(|k| k == **c))
        .map(|c| {
            let qc = quote(c);
            if keep {
                format!(
                    "{qc} = CASE WHEN EXCLUDED.{del} OR EXCLUDED.{unav} ? {} THEN t.{qc} ELSE EXCLUDED.{qc} END",
                    literal(c)
                )
            } else {
                format!("{qc} = EXCLUDED.{qc}")
            }
        })
        .collect();
    set.extend([
        format!("{lsn} = EXCLUDED.{lsn}"),
        format!("{seq} = EXCLUDED.{seq}"),
        format!("{del} = EXCLUDED.{del}"),
        format!("{unav} = EXCLUDED.{unav}"),
    ]);
    let (flags, extras): (&str, &[(&str, &str)]) = if keep {
        (
            "u.d, u.n::jsonb",
            &[("l", "int8"), ("s", "int8"), ("d", "bool"), ("n", "text")],
        )
    } else {
        ("false, NULL::jsonb", &[("l", "int8"), ("s", "int8")])
    };
    format!(
        "INSERT INTO {q} AS t ({}, {lsn}, {seq}, {del}, {unav}) \
         SELECT {}, u.l, u.s, {flags} FROM {} \
         ON CONFLICT ({}) DO UPDATE SET {} \
         WHERE (t.{lsn}, t.{seq}) < (EXCLUDED.{lsn}, EXCLUDED.{seq})",
        names.join(", "),
        exprs(info, group).join(", "),
        unnest(types, extras),
        keys.join(", "),
        set.join(", "),
    )
}

fn delete_sql(info: &TableInfo, group: &Group<'_>, types: &[&str]) -> String {
    let columns = &group.columns;
    let (lsn, seq) = (quote(&info.meta.lsn), quote(&info.meta.seq));
    let exprs = exprs(info, group);
    let on: Vec<String> = columns
        .iter()
        .zip(exprs)
        .map(|(c, e)| format!("t.{} = {e}", quote(c)))
        .collect();
    format!(
        "DELETE FROM {} AS t USING {} WHERE {} AND (t.{lsn}, t.{seq}) < (u.l, u.s)",
        info.qualified,
        unnest(types, &[("l", "int8"), ("s", "int8")]),
        on.join(" AND "),
    )
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
