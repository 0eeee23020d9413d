//! The pipeline's async side of routing: the router's routes built on a
//! relation's first change, with the source's catalog answering what the
//! router asks ([`TableCatalog`](crate::seam::TableCatalog)) and the pipeline doing what a new route
//! asks of it (a quarantine, a topic); and what a change needs read before
//! [`Router::records`](super::router::Router::records) maps it.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::record::Record;
use super::router::{self, Followup, Mapping, Resolved, Route};
use super::TypeNote;
use super::{now_ms, Pipeline};
use crate::change::{Change, RowImage, StreamTable};
use crate::envelope::SourcePosition;
use crate::error::CaptureError;
use crate::seam::Source;
use crate::seam::UnchangedValues;

impl<S: Source> Pipeline<'_, S> {
    /// How many event ordinals a change uses ([`router::ordinals`]), its
    /// routes built first.
    pub(super) async fn ordinals(&mut self, change: &Change) -> Result<u64, CaptureError> {
        if let Change::Update { .. } | Change::Truncate { .. } = change {
            for &id in change.tables() {
                self.route(id).await?;
            }
        }
        self.router.ordinals(change)
    }

    /// The Kafka records of one change and the event ordinals they use:
    /// what it needs resolved, then mapped ([`router::records`]).
    pub(super) async fn records_for(
        &mut self,
        change: Change,
        src: &SourcePosition,
    ) -> Result<(Vec<Record>, u64), CaptureError> {
        let now_ms = now_ms();
        let Some(resolved) = self.resolve(&change, src.tx_id).await? else {
            // One ordinal, as `ordinals` counts a change of no table route.
            return Ok((Vec::new(), 1));
        };
        let mapping = Mapping {
            envelope: self.router.envelope(),
            tombstones: self.cfg.tombstones_on_delete,
            skipped: self.cfg.skipped_operations,
            now_ms,
        };
        self.router.records(change, src, resolved, &mapping)
    }

    /// The async step before [`router::records`]: the routes of the
    /// change's relations, the unchanged TOAST values of a primary-key
    /// change's new row (read from the source once transaction `xid` is
    /// visible), the partitions of a truncated topic. `None` for a change of
    /// a table whose changes are refused (counted here).
    pub(super) async fn resolve(
        &mut self,
        change: &Change,
        xid: u32,
    ) -> Result<Option<Resolved>, CaptureError> {
        let mut resolved = Resolved::default();
        match change {
            Change::Insert {
                table: relation_id, ..
            }
            | Change::Update {
                table: relation_id, ..
            }
            | Change::Delete {
                table: relation_id, ..
            } => {
                let need = match self.route(*relation_id).await? {
                    Some(Route::Quarantined(table)) => Err(table.clone()),
                    Some(Route::Table(enc, _)) => Ok(match change {
                        Change::Update { old, new, .. } => {
                            router::create_needs_source(enc, old.as_ref(), new)
                        }
                        _ => None,
                    }),
                    _ => Ok(None),
                };
                let need = match need {
                    Ok(need) => need,
                    Err(table) => {
                        let counter = &self.metrics.refused_changes;
                        counter.with_label_values(&[table.as_str()]).inc();
                        return Ok(None);
                    }
                };
                if let Some((key_columns, row)) = need {
                    let filled = self
                        .read_unavailable(*relation_id, &key_columns, row, xid)
                        .await?;
                    resolved.created = Some(filled);
                }
            }
            Change::Truncate { tables } => {
                for &id in tables {
                    let Some(Route::Table(_, topic)) = self.route(id).await? else {
                        continue;
                    };
                    let topic = Arc::clone(topic);
                    let count = self.kafka.partition_count(&topic).await?;
                    resolved.partitions.insert(id, count);
                }
            }
            _ => {}
        }
        Ok(Some(resolved))
    }

    /// `row` with its unchanged TOAST values read from the source table by
    /// its key (`key_columns`), once transaction `xid` is visible; `row` as it
    /// is when no row has that key any more (a later change deleted it or
    /// changed its key again, and its own events bring the targets there).
    pub(super) async fn read_unavailable(
        &mut self,
        relation_id: u32,
        key_columns: &[String],
        row: RowImage,
        xid: u32,
    ) -> Result<RowImage, CaptureError> {
        let rel = self.router.relation_of(relation_id)?;
        let key_idx = key_columns
            .iter()
            .map(|k| (0..rel.width()).position(|i| rel.column_name(i) == k))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "key columns {key_columns:?} are not all columns of {}.{}",
                    rel.namespace(),
                    rel.name()
                ))
            })?;
        let control = &mut self.source.control;
        match control.read_unchanged(&rel, &key_idx, xid, &row).await? {
            Some(filled) => Ok(filled),
            None => {
                tracing::debug!(table = %format!("{}.{}", rel.namespace(), rel.name()), "row of a primary-key update is gone from the source; its unchanged TOAST values stay unavailable");
                Ok(row)
            }
        }
    }

    /// A Relation message: the router takes it; one that changed its
    /// table's columns follows DDL, so the catalog is compared now rather
    /// than at the next heartbeat.
    pub(super) async fn on_relation(&mut self, rel: S::Table) -> Result<(), CaptureError> {
        let mut tables = self.source.tables();
        let changed = self.router.on_relation(rel, &mut tables).await?;
        drop(tables);
        if changed {
            self.check_schemas().await?;
        }
        Ok(())
    }

    /// A Type message: the router learns a type created after start-up.
    pub(super) async fn on_type(&mut self, t: TypeNote<S>) -> Result<(), CaptureError> {
        let mut tables = self.source.tables();
        self.router.on_type(&t, &mut tables).await
    }

    /// How a relation's changes are published, built on first use after
    /// each Relation message ([`router::Router::build`]).
    pub(super) async fn route(
        &mut self,
        relation_id: u32,
    ) -> Result<Option<&Route<S::Table>>, CaptureError> {
        if !self.router.has_route(relation_id) {
            let quarantined = &self.kafka.position().quarantined;
            let mut tables = self.source.tables();
            let followup = self
                .router
                .build(relation_id, &mut tables, |t| quarantined.contains_key(t))
                .await?;
            drop(tables);
            self.follow_up(followup).await?;
        }
        self.router.route(relation_id)
    }

    /// Does what a newly built route asks: the quarantine of a table set
    /// aside; the topic of a captured table, and the table noted captured
    /// (a later start must not take it for one added to the include list).
    async fn follow_up(&mut self, followup: Followup) -> Result<(), CaptureError> {
        match followup {
            Followup::Nothing => {}
            Followup::SetAside { table, reason } => self.quarantine(&table, reason),
            Followup::Captured { table, topic } => {
                self.kafka.ensure_topic(&topic).await?;
                self.kafka
                    .stage()
                    .tables
                    .get_or_insert_with(BTreeSet::new)
                    .insert(table);
            }
        }
        Ok(())
    }
}
