//! Target tables made ready for a plan's rows: created, altered, renamed by
//! source attnum, and every row checked against them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::Client;

use super::compat::compatible;
use super::generation::{self, Fit};
use super::group::{group_rows, sorted_rows, wanted_specs};
use super::identity;
use super::plan::{Plan, Step};
use super::rows::{Row, Shape};
use super::table::TableInfo;
use super::types::ColumnSpec;
use super::write::Ready;
use super::PostgresSink;
use crate::error::{RecordFailure, SinkError};
use crate::event::Version;

impl PostgresSink {
    /// Resolves tables (creating and altering them) and checks every row against them.
    pub(super) async fn resolve<'a>(
        &self,
        client: &mut Client,
        plan: &'a Plan,
        rejected: &mut Vec<RecordFailure>,
    ) -> Result<Vec<Ready<'a>>, SinkError> {
        let mut ready = Vec::new();
        for step in &plan.steps {
            match step {
                Step::Rows(tables) => {
                    for (table, rows) in tables {
                        let rows = sorted_rows(rows);
                        if let Some(r) = self.resolve_rows(client, table, rows, rejected).await? {
                            ready.push(r);
                        }
                    }
                }
                Step::Truncate { table, version } => {
                    if let Some(info) = self.catalog.lookup(client, table).await? {
                        let v = (
                            i64::try_from(version.lsn).unwrap_or(i64::MAX),
                            i64::try_from(version.seq).unwrap_or(i64::MAX),
                        );
                        ready.push(Ready::Truncate {
                            table: info,
                            version: v,
                        });
                    }
                }
            }
        }
        for (table, rows) in &plan.history {
            let info = self.catalog.ensure_history(client, table).await?;
            ready.push(Ready::History(info, rows));
        }
        Ok(ready)
    }

    async fn resolve_rows<'a>(
        &self,
        client: &mut Client,
        table: &str,
        rows: Vec<&'a Row>,
        rejected: &mut Vec<RecordFailure>,
    ) -> Result<Option<Ready<'a>>, SinkError> {
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let key: Vec<&'a str> = first.shape.key.iter().map(String::as_str).collect();
        // A source column named like one of the sink's own columns or a
        // retired generation is refused before any DDL, by its name in the
        // source: a field routed to a retired column carries that column's
        // name by now.
        let mut checked = HashSet::new();
        for row in &rows {
            // Rows share their shape: each checked once.
            if checked.insert(Arc::as_ptr(&row.shape) as usize) {
                for column in row.shape.specs.keys() {
                    self.catalog.clash(table, row.shape.source_of(column))?;
                }
            }
        }
        // The table as it was, to tell the columns this batch creates.
        let known = self.catalog.lookup(client, table).await?;
        let mut info = self
            .catalog
            .ensure_target(client, table, &key, &wanted_specs(&rows))
            .await?;
        // The attnums of new columns (and of columns adopted by name).
        if let Some(newest) = identity::newest(rows.iter().map(|r| (&*r.shape, r.version))) {
            if !identity::records(&info, newest).is_empty() {
                let recorded: HashSet<String> = info.ids.keys().cloned().collect();
                info = self
                    .catalog
                    .alter_with(client, table, |current| identity::records(current, newest))
                    .await?;
                // Each column this batch created holds its type from the
                // oldest row of the batch whose type it takes
                // (`oncely.since`): an event of another type older than
                // that is from before a change ([`generation`]). Columns of
                // older versions adopted by name record none.
                let existed =
                    |c: &String| known.as_ref().is_some_and(|t| t.columns.contains_key(c));
                let fresh: Vec<&String> = info
                    .ids
                    .keys()
                    .filter(|c| !recorded.contains(*c) && !existed(c))
                    .collect();
                let since: Vec<(String, Version)> = fresh
                    .into_iter()
                    .filter_map(|c| {
                        let ty = info.columns.get(c)?;
                        let oldest = rows
                            .iter()
                            .filter(|r| {
                                r.shape
                                    .specs
                                    .get(c)
                                    .is_some_and(|s| compatible(s, ty).is_ok())
                            })
                            .map(|r| r.version)
                            .min()?;
                        Some((c.clone(), oldest))
                    })
                    .collect();
                if !since.is_empty() {
                    info = self
                        .catalog
                        .alter_with(client, table, |current| {
                            since
                                .iter()
                                .filter_map(|(c, oldest)| {
                                    let comment = current.comments.get(c)?;
                                    generation::since_of(comment).is_none().then(|| {
                                        generation::since_statement(
                                            &current.qualified,
                                            c,
                                            Some(comment),
                                            *oldest,
                                        )
                                    })
                                })
                                .collect()
                        })
                        .await?;
                }
            }
        }
        let groups = group_rows(&info, rows, rejected);
        Ok(Some(Ready::Rows(info, groups)))
    }

    /// Makes the warehouse follow source type changes its columns cannot
    /// take ([`generation`]): columns are cast or moved to a new generation
    /// ([`Catalog::follow_types`](super::table::Catalog::follow_types)), then
    /// the fields of rows from before a column's generation are renamed to
    /// its retired column (or left out). `None`: the plan as it is.
    pub(super) async fn follow_generations(
        &self,
        client: &mut Client,
        plan: &Plan,
    ) -> Result<Option<Plan>, SinkError> {
        let mut routed: HashMap<(&str, i64), Arc<Shape>> = HashMap::new();
        for step in &plan.steps {
            let Step::Rows(tables) = step else { continue };
            for (table, rows) in tables {
                let Some(mut info) = self.catalog.lookup(client, table).await? else {
                    continue;
                };
                let rows: Vec<&Row> = rows.rows.values().filter(|r| !r.is_delete()).collect();
                let changes = generation_changes(&info, &unsettled(&info, &rows));
                if !changes.is_empty() {
                    info = self.catalog.follow_types(client, table, &changes).await?;
                }
                // Rows share their shape: one translated shape per (shape, routes).
                let mut shapes: HashMap<(usize, Routes), Arc<Shape>> = HashMap::new();
                for row in unsettled(&info, &rows) {
                    let routes = routes(&info, row);
                    if routes.is_empty() {
                        continue;
                    }
                    let key = (Arc::as_ptr(&row.shape) as usize, routes);
                    let shape = shapes
                        .entry(key)
                        .or_insert_with_key(|(_, routes)| {
                            let map: super::rows::NameMap = routes.iter().cloned().collect();
                            Arc::new(row.shape.translated(&map))
                        })
                        .clone();
                    routed.insert((table.as_str(), row.offset), shape);
                }
            }
        }
        if routed.is_empty() {
            return Ok(None);
        }
        Ok(Some(plan.translated(|table, row| {
            routed.get(&(table, row.offset)).cloned()
        })))
    }

    /// Renames (and with `schema.evolution.drop.columns = "drop"` drops)
    /// warehouse columns by source attnum before the rows are written
    /// ([`identity::alterations`]), and returns the plan with fields renamed
    /// to their columns when any is (`None`: the plan as it is).
    pub(super) async fn follow_renames(
        &self,
        client: &mut Client,
        plan: &Plan,
    ) -> Result<Option<Plan>, SinkError> {
        let drop = self.config.drop_columns;
        // Keyed by the shape's address (rows share their shape).
        let mut shapes: HashMap<(&str, usize), Arc<Shape>> = HashMap::new();
        for step in &plan.steps {
            let Step::Rows(tables) = step else { continue };
            for (table, rows) in tables {
                let Some(newest) =
                    identity::newest(rows.rows.values().map(|r| (&*r.shape, r.version)))
                else {
                    continue;
                };
                let Some(mut info) = self.catalog.lookup(client, table).await? else {
                    continue;
                };
                if !identity::alterations(&info, newest, drop).is_empty() {
                    info = self
                        .catalog
                        .alter_with(client, table, |current| {
                            identity::alterations(current, newest, drop)
                        })
                        .await?;
                }
                for row in rows.rows.values() {
                    let key = (table.as_str(), Arc::as_ptr(&row.shape) as usize);
                    if shapes.contains_key(&key) {
                        continue;
                    }
                    let map = identity::targets(&info, &row.shape);
                    if !map.is_empty() {
                        shapes.insert(key, Arc::new(row.shape.translated(&map)));
                    }
                }
            }
        }
        if shapes.is_empty() {
            return Ok(None);
        }
        Ok(Some(plan.translated(|table, row| {
            shapes
                .get(&(table, Arc::as_ptr(&row.shape) as usize))
                .cloned()
        })))
    }
}

/// The rows of `rows` a field of which may not go to its own column of
/// `info`. Rows share their shape, and a field that fits ([`Fit::Live`])
/// at the newest version of its shape's rows fits at every older one: only
/// the shapes of which some field does not are looked at row by row.
fn unsettled<'r>(info: &TableInfo, rows: &[&'r Row]) -> Vec<&'r Row> {
    let mut newest: HashMap<usize, Version> = HashMap::new();
    for r in rows {
        let v = newest.entry(Arc::as_ptr(&r.shape) as usize).or_default();
        *v = (*v).max(r.version);
    }
    let mut fits: HashMap<usize, bool> = HashMap::new();
    rows.iter()
        .copied()
        .filter(|r| {
            let shape = Arc::as_ptr(&r.shape) as usize;
            !*fits.entry(shape).or_insert_with(|| {
                let top = newest[&shape];
                r.shape
                    .specs
                    .iter()
                    .all(|(name, spec)| info.fit(name, spec, top) == Fit::Live)
            })
        })
        .collect()
}

/// The fields of `rows` that are columns of `info` whose type an event
/// newer than it changes ([`Fit::Change`]): per column, the spec of the
/// newest row wanting a change and the oldest version wanting one.
fn generation_changes(info: &TableInfo, rows: &[&Row]) -> Vec<(String, ColumnSpec, Version)> {
    let mut changes: std::collections::BTreeMap<&str, (&ColumnSpec, Version, Version)> =
        std::collections::BTreeMap::new();
    for r in rows {
        for (name, spec) in &r.shape.specs {
            if info.fit(name, spec, r.version) != Fit::Change {
                continue;
            }
            let e = changes.entry(name).or_insert((spec, r.version, r.version));
            if r.version > e.1 {
                (e.0, e.1) = (spec, r.version);
            }
            e.2 = e.2.min(r.version);
        }
    }
    changes
        .into_iter()
        .map(|(name, (spec, _, since))| (name.to_owned(), spec.clone(), since))
        .collect()
}

/// (event field, the retired column it goes to, or `None`: left out).
type Routes = Vec<(String, Option<String>)>;

/// Where the fields of `row` that do not go to their own column go: a
/// retired column (`Some`) or nowhere (`None`), sorted by field.
fn routes(info: &TableInfo, row: &Row) -> Routes {
    row.shape
        .specs
        .iter()
        .filter_map(|(name, spec)| match info.fit(name, spec, row.version) {
            Fit::Retired(column) => Some((name.clone(), Some(column))),
            Fit::Left => Some((name.clone(), None)),
            Fit::Live | Fit::Change => None,
        })
        .collect()
}
