//! Which warehouse column is which source column (docs/design.md, "Schema
//! changes"). Capture names each field's source `attnum` (`__oncely.attnum`)
//! and the table's oid and dropped attnums (`__oncely.table.oid`,
//! `__oncely.dropped.attnums` on the row struct); PostgreSQL keeps an
//! attnum across RENAME and ALTER TYPE and never reuses it. The warehouse
//! records them in comments:
//!
//! | object | comment |
//! | --- | --- |
//! | column | `oncely.attnum=<n> oncely.at=<lsn>/<seq>`: the source column and the version of the change that named it |
//! | table | `oncely.source.oid=<oid> oncely.at=<lsn>/<seq> oncely.dropped=<n>,...` |
//!
//! and maps fields to columns **by attnum**, so a rename renames the column
//! (only when the event is newer than the column's name: an older event
//! carrying the old name writes into the renamed column) and a new column
//! named like an old one becomes its own column. Columns without a recorded
//! attnum (created by an older version, or events without attnums: schemas
//! off, Debezium topics) are matched by name, as before.

use std::collections::HashMap;

use serde_json::Value;

use super::config::DropColumns;
use super::plan::Shape;
use super::table::{literal, quote, TableInfo};
use crate::event::{row_struct, Version};

/// Row-struct parameter: the source table's oid.
pub const PARAM_TABLE_OID: &str = "__oncely.table.oid";
/// Row-struct parameter: the source table's dropped attnums.
pub const PARAM_DROPPED_ATTNUMS: &str = "__oncely.dropped.attnums";

/// The source table an event's schema names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    pub oid: u32,
    /// Attnums of the table's dropped columns, sorted.
    pub dropped: Vec<i16>,
}

/// The source table of a value schema, when capture sent it.
pub fn source_table(schema: Option<&Value>) -> Option<SourceTable> {
    let params = row_struct(schema)?.get("parameters")?;
    let oid = params.get(PARAM_TABLE_OID)?.as_str()?.parse().ok()?;
    let mut dropped: Vec<i16> = params
        .get(PARAM_DROPPED_ATTNUMS)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .split(',')
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    dropped.sort_unstable();
    Some(SourceTable { oid, dropped })
}

/// A column's recorded source column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnId {
    pub attnum: i16,
    /// The version of the change that gave the column its name.
    pub at: Version,
}

/// A table's recorded source table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableId {
    pub oid: u32,
    /// The version of the change that recorded the oid.
    pub at: Version,
    /// Source columns the sink dropped (`schema.evolution.drop.columns =
    /// "drop"`): older events carrying them must not add them again.
    pub dropped: Vec<i16>,
}

fn words(comment: &str) -> HashMap<&str, &str> {
    comment
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn version(text: &str) -> Option<Version> {
    let (lsn, seq) = text.split_once('/')?;
    Some(Version::new(lsn.parse().ok()?, seq.parse().ok()?))
}

impl ColumnId {
    pub fn parse(comment: &str) -> Option<Self> {
        let w = words(comment);
        Some(Self {
            attnum: w.get("oncely.attnum")?.parse().ok()?,
            at: version(w.get("oncely.at")?)?,
        })
    }

    fn comment(&self) -> String {
        format!("oncely.attnum={} oncely.at={}", self.attnum, self.at)
    }
}

impl TableId {
    pub fn parse(comment: &str) -> Option<Self> {
        let w = words(comment);
        Some(Self {
            oid: w.get("oncely.source.oid")?.parse().ok()?,
            at: version(w.get("oncely.at")?)?,
            dropped: w
                .get("oncely.dropped")
                .unwrap_or(&"")
                .split(',')
                .filter_map(|a| a.parse().ok())
                .collect(),
        })
    }

    fn comment(&self) -> String {
        let dropped: Vec<String> = self.dropped.iter().map(i16::to_string).collect();
        format!(
            "oncely.source.oid={} oncely.at={} oncely.dropped={}",
            self.oid,
            self.at,
            dropped.join(",")
        )
    }
}

fn comment_column(table: &str, column: &str, id: &ColumnId) -> String {
    format!(
        "COMMENT ON COLUMN {table}.{} IS {}",
        quote(column),
        literal(&id.comment())
    )
}

fn comment_table(table: &str, id: &TableId) -> String {
    format!("COMMENT ON TABLE {table} IS {}", literal(&id.comment()))
}

/// The newest row's shape among `rows` (shape, version) that names its
/// source table: the names it carries are the current ones.
pub fn newest<'s>(
    rows: impl Iterator<Item = (&'s Shape, Version)>,
) -> Option<(&'s Shape, Version)> {
    rows.filter(|(s, _)| s.source.is_some())
        .max_by_key(|(_, v)| *v)
}

/// Event column name -> target column: `Some(name)` (itself when unchanged),
/// or `None` for a field the sink leaves out (a column it dropped).
pub type NameMap = HashMap<String, Option<String>>;

/// Whether a shape's attnums apply to `info`: the event names a source
/// table and it is the one the table recorded.
fn applies(info: &TableInfo, shape: &Shape) -> bool {
    matches!((&info.source, &shape.source), (Some(t), Some(s)) if t.oid == s.oid)
}

/// Where each field of `shape` goes in `info` (after the renames): by
/// attnum when both sides know it, else by name. Empty when every field
/// goes to the column of its own name.
pub fn targets(info: &TableInfo, shape: &Shape) -> NameMap {
    let mut map = NameMap::new();
    if !applies(info, shape) {
        return map;
    }
    let dropped = info
        .source
        .as_ref()
        .map(|t| t.dropped.as_slice())
        .unwrap_or_default();
    for (name, spec) in &shape.specs {
        let Some(attnum) = spec.attnum else {
            continue;
        };
        let target = match info.column_of(attnum) {
            Some(column) => Some(column.to_owned()),
            None if dropped.contains(&attnum) => None,
            // A column of this name that is another source column: this
            // field's own column is gone (older event of a column since
            // dropped in the source while the warehouse kept no record).
            None if info.ids.get(name).is_some_and(|id| id.attnum != attnum) => None,
            None => continue,
        };
        if target.as_deref() != Some(name.as_str()) {
            map.insert(name.clone(), target);
        }
    }
    map
}

/// The DDL that makes `info` follow the newest shape `newest` (at version
/// `at`) before its rows are written: a new source table under the same
/// name forgets the recorded attnums; a column whose attnum the event
/// names differently (and the event is newer than the name) is renamed,
/// a column in the way moved aside; with `drop`, columns of attnums the
/// source dropped are dropped. Empty when nothing is to be done.
pub fn alterations(
    info: &TableInfo,
    (newest, at): (&Shape, Version),
    drop: DropColumns,
) -> Vec<String> {
    let q = &info.qualified;
    let Some(source) = &newest.source else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut ids = info.ids.clone();
    let mut table = info.source.clone();
    if let Some(t) = &table {
        if t.oid != source.oid {
            if at <= t.at {
                // An older table's event: nothing of it is renamed or dropped.
                return out;
            }
            for column in ids.keys() {
                out.push(format!("COMMENT ON COLUMN {q}.{} IS NULL", quote(column)));
            }
            ids.clear();
            table = Some(TableId {
                oid: source.oid,
                at,
                dropped: Vec::new(),
            });
            out.push(comment_table(q, table.as_ref().expect("set")));
        }
    }
    let Some(mut table) = table else {
        // Recorded after the table's columns exist (`records`).
        return out;
    };
    let by_attnum: HashMap<i16, &String> = ids.iter().map(|(n, id)| (id.attnum, n)).collect();
    let mut renames: Vec<(String, String, i16)> = Vec::new();
    for (name, spec) in &newest.specs {
        let Some(attnum) = spec.attnum else { continue };
        if let Some(current) = by_attnum.get(&attnum) {
            if *current != name && at > ids[*current].at {
                renames.push(((*current).clone(), name.clone(), attnum));
            }
        }
    }
    let from: Vec<&String> = renames.iter().map(|r| &r.0).collect();
    let mut moves = Vec::new();
    for (_, to, _) in &renames {
        if info.columns.contains_key(to) && !from.contains(&to) {
            // In the way: a column of another (dropped or unnamed) source column.
            let aside = match ids.get(to) {
                Some(id) => format!("{to}__attnum_{}", id.attnum),
                None => format!("{to}__unmatched"),
            };
            tracing::warn!(table = %q, column = %to, moved_to = %aside, "a renamed source column takes the name of a warehouse column of another source column: that one is renamed aside");
            moves.push(format!(
                "ALTER TABLE {q} RENAME COLUMN {} TO {}",
                quote(to),
                quote(&aside)
            ));
        }
    }
    out.extend(moves);
    // Through temporary names, so swaps and chains never collide.
    for (current, _, attnum) in &renames {
        out.push(format!(
            "ALTER TABLE {q} RENAME COLUMN {} TO {}",
            quote(current),
            quote(&format!("__oncely_renaming_{attnum}"))
        ));
    }
    for (current, to, attnum) in &renames {
        tracing::info!(table = %q, from = %current, to = %to, attnum, "renaming a warehouse column");
        out.push(format!(
            "ALTER TABLE {q} RENAME COLUMN {} TO {}",
            quote(&format!("__oncely_renaming_{attnum}")),
            quote(to)
        ));
        out.push(comment_column(
            q,
            to,
            &ColumnId {
                attnum: *attnum,
                at,
            },
        ));
    }
    if drop == DropColumns::Drop {
        let mut dropped_now = false;
        for (name, id) in &ids {
            if source.dropped.contains(&id.attnum) && at > id.at && !info.key.contains(name) {
                tracing::info!(table = %q, column = %name, attnum = id.attnum, "dropping a warehouse column dropped in the source");
                out.push(format!("ALTER TABLE {q} DROP COLUMN {}", quote(name)));
                table.dropped.push(id.attnum);
                dropped_now = true;
            }
        }
        if dropped_now {
            table.dropped.sort_unstable();
            out.push(comment_table(q, &table));
        }
    }
    out
}

/// The comments recording what `info` does not know yet of the newest
/// shape: the table's source oid, and the attnum of each column its fields
/// fill that has none (new columns, and columns of older versions adopted
/// by name).
pub fn records(info: &TableInfo, (newest, at): (&Shape, Version)) -> Vec<String> {
    let q = &info.qualified;
    let Some(source) = &newest.source else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match &info.source {
        None => out.push(comment_table(
            q,
            &TableId {
                oid: source.oid,
                at,
                dropped: Vec::new(),
            },
        )),
        Some(t) if t.oid != source.oid => return out,
        Some(_) => {}
    }
    for (name, spec) in &newest.specs {
        let Some(attnum) = spec.attnum else { continue };
        if info.column_of(attnum).is_some()
            || info.ids.contains_key(name)
            || !info.columns.contains_key(name)
        {
            continue;
        }
        out.push(comment_column(q, name, &ColumnId { attnum, at }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip() {
        let c = ColumnId {
            attnum: 3,
            at: Version::new(100, 2),
        };
        assert_eq!(ColumnId::parse(&c.comment()), Some(c));
        let t = TableId {
            oid: 16385,
            at: Version::new(7, 0),
            dropped: vec![2, 5],
        };
        assert_eq!(TableId::parse(&t.comment()), Some(t));
        assert_eq!(ColumnId::parse("a comment of someone else"), None);
    }
}
