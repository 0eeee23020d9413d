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

use oncely_core::sql::{quote_ident as quote, quote_literal as literal};

use super::config::DropColumns;
use super::rows::{NameMap, Shape};
use super::source_ids::{ColumnId, TableId};
use super::table::TableInfo;
use crate::event::Version;

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
    let Some(recorded) = &info.source else {
        // Recorded after the table's columns exist (`records`).
        return out;
    };
    if recorded.oid != source.oid {
        if at > recorded.at {
            // A new source table under this name: its attnums start afresh
            // (adopted by name by `records`).
            for column in info.ids.keys() {
                out.push(format!("COMMENT ON COLUMN {q}.{} IS NULL", quote(column)));
            }
            let table = TableId {
                oid: source.oid,
                at,
                dropped: Vec::new(),
            };
            out.push(comment_table(q, &table));
        }
        // Else an older table's event: nothing of it is renamed or dropped.
        return out;
    }
    let ids = &info.ids;
    let mut table = recorded.clone();
    let mut renames: Vec<(String, String, i16)> = Vec::new();
    for (name, spec) in &newest.specs {
        let Some(attnum) = spec.attnum else { continue };
        if let Some(current) = info.column_of(attnum) {
            if current != name && at > ids[current].at {
                renames.push((current.to_owned(), name.clone(), attnum));
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
        let id = ColumnId {
            attnum: *attnum,
            at,
        };
        // The version from which the column holds its type
        // (`oncely.since`, [`super::generation`]) is no name: kept.
        match info
            .comments
            .get(current)
            .and_then(|c| super::generation::since_of(c))
        {
            Some(since) => out.push(super::generation::since_statement(
                q,
                to,
                Some(&id.comment()),
                since,
            )),
            None => out.push(comment_column(q, to, &id)),
        }
    }
    if drop == DropColumns::Drop {
        let mut dropped_now = false;
        for (name, id) in ids {
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

    const OID: u32 = 16_385;

    /// A warehouse table `t` with columns (name, recorded attnum at version 10).
    fn table(columns: &[(&str, Option<i16>)], dropped: &[i16]) -> TableInfo {
        let mut info = TableInfo {
            qualified: "\"wh\".\"t\"".into(),
            key: vec!["id".into()],
            source: Some(TableId {
                oid: OID,
                at: Version::new(10, 0),
                dropped: dropped.to_vec(),
            }),
            ..TableInfo::default()
        };
        for (name, attnum) in columns {
            info.columns.insert((*name).into(), "text".into());
            if let Some(attnum) = attnum {
                info.by_attnum.insert(*attnum, (*name).into());
                info.ids.insert(
                    (*name).into(),
                    ColumnId {
                        attnum: *attnum,
                        at: Version::new(10, 0),
                    },
                );
            }
        }
        info
    }

    fn renames(ddl: &[String]) -> Vec<&str> {
        ddl.iter()
            .filter(|s| s.contains("RENAME") || s.contains("DROP COLUMN"))
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn a_newer_event_renames_an_older_one_does_not() {
        let info = table(&[("id", Some(1)), ("a", Some(2))], &[]);
        let newer = Shape::with_attnums(&[("id", 1), ("b", 2), ("a", 3)], OID, &[]);
        let ddl = alterations(&info, (&newer, Version::new(20, 0)), DropColumns::Keep);
        assert_eq!(
            renames(&ddl),
            [
                "ALTER TABLE \"wh\".\"t\" RENAME COLUMN \"a\" TO \"__oncely_renaming_2\"",
                "ALTER TABLE \"wh\".\"t\" RENAME COLUMN \"__oncely_renaming_2\" TO \"b\""
            ]
        );
        assert!(ddl
            .iter()
            .any(|s| s.ends_with("'oncely.attnum=2 oncely.at=20/0'")));
        // An event older than the column's name renames nothing.
        let older = Shape::with_attnums(&[("id", 1), ("b", 2)], OID, &[]);
        assert!(alterations(&info, (&older, Version::new(5, 0)), DropColumns::Keep).is_empty());
    }

    #[test]
    fn fields_go_to_the_column_of_their_attnum() {
        // After RENAME a TO b; ADD COLUMN a.
        let info = table(&[("id", Some(1)), ("b", Some(2)), ("a", Some(3))], &[]);
        let old = Shape::with_attnums(&[("id", 1), ("a", 2)], OID, &[]);
        let map = targets(&info, &old);
        assert_eq!(map.get("a"), Some(&Some("b".to_owned())));
        assert_eq!(map.len(), 1);
        let new = Shape::with_attnums(&[("id", 1), ("b", 2), ("a", 3)], OID, &[]);
        assert!(targets(&info, &new).is_empty());
        // Another source table (dropped and created again): by name.
        let other = Shape::with_attnums(&[("id", 1), ("a", 2)], OID + 1, &[]);
        assert!(targets(&info, &other).is_empty());
        let translated = old.translated(&map);
        assert_eq!(
            translated.values.as_deref(),
            Some(&["b".to_owned(), "id".to_owned()][..])
        );
        assert_eq!(translated.source_of("b"), "a");
    }

    #[test]
    fn swapped_names_go_through_temporary_names() {
        let info = table(&[("id", Some(1)), ("x", Some(2)), ("y", Some(3))], &[]);
        let swapped = Shape::with_attnums(&[("id", 1), ("x", 3), ("y", 2)], OID, &[]);
        let ddl = alterations(&info, (&swapped, Version::new(20, 0)), DropColumns::Keep);
        let r = renames(&ddl);
        assert_eq!(r.len(), 4, "{r:?}");
        assert!(
            r[..2].iter().all(|s| s.contains("TO \"__oncely_renaming_")),
            "{r:?}"
        );
    }

    #[test]
    fn only_recorded_columns_the_source_dropped_are_dropped() {
        let info = table(&[("id", Some(1)), ("old", Some(2)), ("legacy", None)], &[]);
        let after = Shape::with_attnums(&[("id", 1)], OID, &[2, 4]);
        let at = Version::new(20, 0);
        assert!(alterations(&info, (&after, at), DropColumns::Keep).is_empty());
        let ddl = alterations(&info, (&after, at), DropColumns::Drop);
        assert_eq!(
            renames(&ddl),
            ["ALTER TABLE \"wh\".\"t\" DROP COLUMN \"old\""]
        );
        assert!(
            ddl.iter().any(|s| s.contains("oncely.dropped=2")),
            "{ddl:?}"
        );
        // Absent but not dropped (a publication column list): kept.
        let narrower = Shape::with_attnums(&[("id", 1)], OID, &[]);
        assert!(alterations(&info, (&narrower, at), DropColumns::Drop).is_empty());
        // An older event still carrying the dropped column adds nothing back.
        let dropped = table(&[("id", Some(1))], &[2]);
        let old = Shape::with_attnums(&[("id", 1), ("old", 2)], OID, &[]);
        assert_eq!(targets(&dropped, &old).get("old"), Some(&None));
    }

    #[test]
    fn a_new_source_table_forgets_the_recorded_attnums() {
        let info = table(&[("id", Some(1)), ("a", Some(2))], &[]);
        let recreated = Shape::with_attnums(&[("id", 1), ("b", 2)], OID + 1, &[]);
        let ddl = alterations(&info, (&recreated, Version::new(20, 0)), DropColumns::Keep);
        assert!(renames(&ddl).is_empty(), "{ddl:?}");
        assert!(ddl.iter().any(|s| s.contains("\"a\" IS NULL")), "{ddl:?}");
        assert!(ddl
            .iter()
            .any(|s| s.contains(&format!("oncely.source.oid={}", OID + 1))));
        // An older event of the new table changes nothing.
        assert!(alterations(&info, (&recreated, Version::new(5, 0)), DropColumns::Keep).is_empty());
    }

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
