//! Rows of a plan checked against their table and grouped into statements:
//! one group per column list and conversions, so each group is one
//! `INSERT ... SELECT FROM unnest(...)`.

use std::collections::BTreeMap;

use super::compat::{self, compatible};
use super::plan::TableRows;
use super::rows::{Row, Shape};
use super::statement::{conv_for_type, Group};
use super::table::TableInfo;
use super::types;
use crate::error::RecordFailure;

/// A table's rows of a plan in offset order.
pub(super) fn sorted_rows(rows: &TableRows) -> Vec<&Row> {
    let mut rows: Vec<&Row> = rows.rows.values().collect();
    rows.sort_by_key(|r| r.offset);
    rows
}

/// The column specs `rows` need in their table: per column the first row's
/// spec, widened by later rows' wider ones (a batch can hold rows from before
/// and after a type change; the column must hold both).
pub(super) fn wanted_specs<'a>(rows: &[&'a Row]) -> BTreeMap<&'a str, types::ColumnSpec> {
    let mut wanted: BTreeMap<&str, types::ColumnSpec> = BTreeMap::new();
    let mut seen: Option<&Shape> = None;
    for r in rows {
        if seen.is_some_and(|s| std::ptr::eq(s, &*r.shape)) {
            continue;
        }
        seen = Some(&r.shape);
        for (name, spec) in &r.shape.specs {
            match wanted.entry(name) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(spec.clone());
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    let merged = compat::wider(e.get(), spec);
                    e.insert(merged);
                }
            }
        }
    }
    wanted
}

/// Checks `rows` against their table `info` (key columns, version range, column
/// types; failures go to `rejected`) and groups the others by column list.
pub(super) fn group_rows<'a>(
    info: &TableInfo,
    rows: Vec<&'a Row>,
    rejected: &mut Vec<RecordFailure>,
) -> Vec<Group<'a>> {
    let Some(first) = rows.first() else {
        return Vec::new();
    };
    let key: Vec<&'a str> = first.shape.key.iter().map(String::as_str).collect();
    let info_key: Vec<&str> = info.key.iter().map(String::as_str).collect();
    let mut groups: Vec<Group<'a>> = Vec::new();
    // Rows of one table nearly always share their shape (columns, specs,
    // unavailable set): the checks of a row like the previous accepted one
    // are not repeated, and it joins the same group.
    let mut previous: Option<(usize, usize)> = None;
    'rows: for row in rows {
        if let Some((g, i)) = previous {
            if same_shape(groups[g].rows[i], row) {
                groups[g].rows.push(row);
                continue;
            }
        }
        let shape: &'a Shape = &row.shape;
        if !shape
            .key
            .iter()
            .map(String::as_str)
            .eq(info_key.iter().copied())
        {
            let row_key: Vec<&str> = shape.key.iter().map(String::as_str).collect();
            rejected.push(RecordFailure::new(
                row.offset,
                format!(
                    "{} has primary key ({}) but the record's key has columns ({})",
                    info.qualified,
                    info.key.join(", "),
                    row_key.join(", ")
                ),
            ));
            continue;
        }
        if i64::try_from(row.version.lsn).is_err() || i64::try_from(row.version.seq).is_err() {
            rejected.push(RecordFailure::new(
                row.offset,
                format!("version {} does not fit in bigint", row.version),
            ));
            continue;
        }
        for (name, spec) in &shape.specs {
            if let Some(actual) = info.columns.get(name) {
                if let Err(conflict) = compatible(spec, actual) {
                    rejected.push(RecordFailure::new(
                        row.offset,
                        format!("column `{name}` of {}: {conflict}", info.qualified),
                    ));
                    continue 'rows;
                }
            }
        }
        let mut columns = key.clone();
        if let Some(values) = &shape.values {
            let mut rest: Vec<&'a str> = values
                .iter()
                .chain(shape.unavailable.iter())
                .map(String::as_str)
                .filter(|c| !key.contains(c) && info.columns.contains_key(*c))
                .collect();
            rest.sort();
            columns.extend(rest);
        }
        let convs: Vec<types::Conv> = columns
            .iter()
            .map(|c| match shape.specs.get(*c) {
                Some(spec) if !spec.inferred => spec.conv,
                _ => conv_for_type(info.columns.get(*c).map_or("text", String::as_str)),
            })
            .collect();
        let delete = row.is_delete();
        let same = |g: &Group<'a>| g.delete == delete && g.columns == columns && g.convs == convs;
        let g = match groups.iter().position(same) {
            Some(g) => g,
            None => {
                groups.push(Group {
                    columns,
                    convs,
                    rows: Vec::new(),
                    delete,
                });
                groups.len() - 1
            }
        };
        groups[g].rows.push(row);
        previous = Some((g, groups[g].rows.len() - 1));
    }
    groups
}

/// Whether two rows of a table have the same columns, column specs and
/// unavailable columns, so that the checks and group of one hold for the other.
/// (Key columns and the version's range are checked per row by the caller
/// only on a shape change; a version outside bigint is rare enough to recheck.)
fn same_shape(a: &Row, b: &Row) -> bool {
    i64::try_from(b.version.lsn).is_ok()
        && i64::try_from(b.version.seq).is_ok()
        && (std::sync::Arc::ptr_eq(&a.shape, &b.shape) || same_columns(&a.shape, &b.shape))
}

/// Equal shapes apart from how they were found (the reuse matcher).
fn same_columns(a: &Shape, b: &Shape) -> bool {
    a.key == b.key && a.values == b.values && a.unavailable == b.unavailable && a.specs == b.specs
}
