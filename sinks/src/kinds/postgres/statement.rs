//! The SQL of a group of rows and its parameters: one array per column,
//! typed when every value fits a plain cast, else text converted in SQL.

use std::borrow::Cow;

use serde_json::Value;
use tokio_postgres::types::{ToSql, Type};

use oncely_core::sql::{quote_ident as quote, quote_literal as literal};

use super::config::{DeleteMode, TruncateMode};
use super::rows::{column_values, Row};
use super::table::TableInfo;
use super::types::{to_text_as, ColumnSpec, Conv, Temporal};

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

/// How writes behave.
#[derive(Debug, Clone, Copy)]
pub struct Modes {
    /// `delete.mode`.
    pub delete: DeleteMode,
    /// `truncate.mode`.
    pub truncate: TruncateMode,
}

pub(super) type Params<'a> = Vec<Box<dyn ToSql + Sync + Send + 'a>>;

/// The version as two bigints (LSNs and ordinals beyond `i64::MAX` are rejected when planning).
pub fn version_params(row: &Row) -> (i64, i64) {
    (
        i64::try_from(row.version.lsn).unwrap_or(i64::MAX),
        i64::try_from(row.version.seq).unwrap_or(i64::MAX),
    )
}

/// The statement writing `rows` of `group`, its parameters and their types
/// (as the statement's casts make them).
pub(super) fn group_statement<'a>(
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
pub(super) fn unnest(types: &[&str], extras: &[(&str, &str)]) -> String {
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
