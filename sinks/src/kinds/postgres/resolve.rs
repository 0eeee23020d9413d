//! Target tables made ready for a plan's rows: created, altered, renamed by
//! source attnum, and every row checked against them.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::Client;

use super::group::{group_rows, sorted_rows, wanted_specs};
use super::identity;
use super::plan::{Plan, Step};
use super::rows::{Row, Shape};
use super::write::Ready;
use super::PostgresSink;
use crate::error::{RecordFailure, SinkError};

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
        let mut info = self
            .catalog
            .ensure_target(client, table, &key, &wanted_specs(&rows))
            .await?;
        // The attnums of new columns (and of columns adopted by name).
        if let Some(newest) = identity::newest(rows.iter().map(|r| (&*r.shape, r.version))) {
            if !identity::records(&info, newest).is_empty() {
                info = self
                    .catalog
                    .alter_with(client, table, |current| identity::records(current, newest))
                    .await?;
            }
        }
        let groups = group_rows(&info, rows, rejected);
        Ok(Some(Ready::Rows(info, groups)))
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
        Ok(Some(plan.translated(|table, shape| {
            shapes.get(&(table, Arc::as_ptr(shape) as usize)).cloned()
        })))
    }
}
