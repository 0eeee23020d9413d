//! The pipeline's async side of routing: a relation's route, decided once
//! after each Relation message (reading the catalog, creating its topic),
//! and what a change needs read before [`router::records`] maps it.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::record::Record;
use super::router::{self, Mapping, Resolved, Route};
use super::{fill, now_ms, Pipeline};
use crate::config::ReplicaIdentityCheck;
use crate::envelope::{SourcePosition, TableEncoder};
use crate::error::CaptureError;
use crate::naming::check_length;
use crate::outbox::OutboxRouter;
use crate::sources::postgres::control;
use crate::sources::postgres::pgoutput::{LogicalMessage, Relation, TupleData};

impl Pipeline<'_> {
    /// How many event ordinals a change uses ([`router::ordinals`]), its
    /// routes resolved first.
    pub(super) async fn ordinals(&mut self, change: &LogicalMessage) -> Result<u64, CaptureError> {
        if let LogicalMessage::Update { .. } | LogicalMessage::Truncate { .. } = change {
            for &id in router::relations(change) {
                self.route(id).await?;
            }
        }
        router::ordinals(&self.router.encoders, change)
    }

    /// The Kafka records of one change and the event ordinals they use:
    /// what it needs resolved, then mapped ([`router::records`]).
    pub(super) async fn records_for(
        &mut self,
        change: LogicalMessage,
        src: &SourcePosition,
    ) -> Result<(Vec<Record>, u64), CaptureError> {
        let now_ms = now_ms();
        let Some(resolved) = self.resolve(&change, src.tx_id).await? else {
            // One ordinal, as `ordinals` counts a change of no table route.
            return Ok((Vec::new(), 1));
        };
        let mapping = Mapping {
            envelope: &self.router.envelope,
            tombstones: self.cfg.tombstones_on_delete,
            now_ms,
        };
        router::records(&self.router.encoders, change, src, resolved, &mapping)
    }

    /// The async step before [`router::records`]: the routes of the
    /// change's relations, the unchanged TOAST values of a primary-key
    /// change's new row (read from the source once transaction `xid` is
    /// visible), the partitions of a truncated topic. `None` for a change of
    /// a table whose changes are refused (counted here).
    pub(super) async fn resolve(
        &mut self,
        change: &LogicalMessage,
        xid: u32,
    ) -> Result<Option<Resolved>, CaptureError> {
        let mut resolved = Resolved::default();
        match change {
            LogicalMessage::Insert { relation_id, .. }
            | LogicalMessage::Update { relation_id, .. }
            | LogicalMessage::Delete { relation_id, .. } => {
                let need = match self.route(*relation_id).await? {
                    Some(Route::Quarantined(table)) => Err(table.clone()),
                    Some(Route::Table(enc, _)) => Ok(match change {
                        LogicalMessage::Update { old, new, .. } => {
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
            LogicalMessage::Truncate { relation_ids, .. } => {
                for &id in relation_ids {
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
        row: TupleData,
        xid: u32,
    ) -> Result<TupleData, CaptureError> {
        let rel = self
            .router
            .relations
            .get(relation_id)
            .cloned()
            .ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "change for relation {relation_id} before its Relation message"
                ))
            })?;
        let key_idx = key_columns
            .iter()
            .map(|k| rel.columns.iter().position(|c| &c.name == k))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                CaptureError::Protocol(format!(
                    "key columns {key_columns:?} are not all columns of {}.{}",
                    rel.namespace, rel.name
                ))
            })?;
        match fill::read_unavailable(&mut self.source.control, &rel, &key_idx, xid, &row).await? {
            Some(filled) => Ok(filled),
            None => {
                tracing::debug!(table = %format!("{}.{}", rel.namespace, rel.name), "row of a primary-key update is gone from the source; its unchanged TOAST values stay unavailable");
                Ok(row)
            }
        }
    }

    /// How a relation's changes are published, decided on first use after each Relation message.
    pub(super) async fn route(&mut self, relation_id: u32) -> Result<Option<&Route>, CaptureError> {
        if !self.router.encoders.contains_key(&relation_id) {
            let rel = self
                .router
                .relations
                .get(relation_id)
                .cloned()
                .ok_or_else(|| {
                    CaptureError::Protocol(format!(
                        "change for relation {relation_id} before its Relation message"
                    ))
                })?;
            let built = self.build_route(rel).await?;
            self.router.encoders.insert(relation_id, built);
        }
        Ok(self
            .router
            .encoders
            .get(&relation_id)
            .and_then(Option::as_ref))
    }

    /// The primary key of the table `rel` is, and whether the catalog has it
    /// under the Relation's name now (then the key may be remembered by name,
    /// for snapshots and signals). Looked up by the Relation's OID, not its name:
    /// the stream may be behind the catalog, which may have renamed the
    /// table, dropped it, or made another of that name since; and read once
    /// the transaction being streamed is visible, so the catalog is not
    /// behind the stream ([`control::relation_by_oid`]). A table missing then
    /// is gone, and its key comes from the Relation message itself
    /// ([`crate::sources::postgres::replica_identity::key_from_relation`]).
    async fn key_of_table(&self, rel: &Relation) -> Result<(Vec<String>, bool), CaptureError> {
        let found =
            control::relation_by_oid(&self.source.control, rel.id, self.source.tracker.xid())
                .await?;
        if let Some((schema, name, pk)) = found {
            // Key columns renamed since the change: the Relation's own.
            if pk.iter().all(|k| rel.columns.iter().any(|c| &c.name == k)) {
                return Ok((pk, schema == rel.namespace && name == rel.name));
            }
        }
        let key = crate::sources::postgres::replica_identity::key_from_relation(rel);
        tracing::info!(
            table = %format!("{}.{}", rel.namespace, rel.name),
            key = ?key,
            "table no longer in the catalog as the stream names it (dropped or renamed since): keyed by its Relation message"
        );
        Ok((key, false))
    }

    pub(super) async fn build_route(
        &mut self,
        rel: Arc<Relation>,
    ) -> Result<Option<Route>, CaptureError> {
        let qualified = format!("{}.{}", rel.namespace, rel.name);
        if self.cfg.signal_table() == Some(qualified.as_str()) {
            return Ok(Some(Route::Signal(rel)));
        }
        if !self.router.filter.matches(&rel.namespace, &rel.name) {
            return Ok(None);
        }
        if let Some(outbox) = self.cfg.outbox.as_ref().filter(|o| o.table == qualified) {
            let dead_letters = outbox.dead_letter_topic(&self.cfg.topic_prefix);
            let router = OutboxRouter::new(&rel, outbox, &dead_letters)
                .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
            return Ok(Some(Route::Outbox(router, rel)));
        }
        // Set aside until the heartbeat's catalog check releases it (see
        // `pipeline::quarantine`), whatever this Relation message says.
        if self.is_quarantined(&qualified) {
            return Ok(Some(Route::Quarantined(qualified)));
        }
        let key = self.event_key(&rel, &qualified).await?;
        let key = key.as_deref();
        if let Some(route) = self.check_identity(&rel, &qualified, key.unwrap_or_default()) {
            return Ok(Some(route));
        }
        // The Relation's transaction: the catalog is read once it is visible.
        let xid = self.source.tracker.xid();
        let identity = self
            .source
            .schema
            .source_identity(&self.source.control, &qualified, &rel, xid)
            .await?;
        // A table without a key, or one whose `message.key.columns` name no
        // column of it, cannot be captured as it is: set aside, not a stop.
        let enc = match TableEncoder::identified(
            &rel,
            &self.router.types,
            key,
            &self.router.envelope,
            identity.as_ref(),
        ) {
            Ok(enc) => enc,
            Err(e) => {
                let why = match key {
                    None => {
                        crate::sources::postgres::control::keyless_reason(&qualified, &qualified)
                    }
                    Some(_) => e.to_string(),
                };
                self.quarantine(&qualified, why);
                return Ok(Some(Route::Quarantined(qualified)));
            }
        };
        self.claim_topic(&rel, qualified, enc).await
    }

    /// The event key of the table a Relation describes, `None` when it has none.
    async fn event_key(
        &mut self,
        rel: &Relation,
        qualified: &str,
    ) -> Result<Option<Vec<String>>, CaptureError> {
        // `message.key.columns` by name; else the primary key of the table
        // the Relation is (by OID), which start-up's list by name may no
        // longer be: dropped and made again with another key since.
        let overridden = crate::filter::parse_key_columns(self.cfg.message_key_columns.as_deref())
            .ok()
            .and_then(|o| o.get(qualified).cloned());
        let key = match overridden {
            Some(key) => Some(key),
            None => {
                let (key, current) = self.key_of_table(rel).await?;
                let known = self.router.key_columns.get(qualified).filter(|known| {
                    current
                        && known
                            .iter()
                            .all(|k| rel.columns.iter().any(|c| &c.name == k))
                });
                match known {
                    // The table capture keyed at start, still under its
                    // name with no other primary key: keep that key (it may
                    // be a replica identity index's; a primary key dropped
                    // while streaming must refuse the table, not unkey it).
                    // A table made again with another primary key takes it.
                    Some(known) if key.is_empty() || *known == key => Some(known.clone()),
                    _ => {
                        if current && !key.is_empty() {
                            self.router
                                .key_columns
                                .insert(qualified.to_owned(), key.clone());
                        }
                        (!key.is_empty()).then_some(key)
                    }
                }
            }
        };
        Ok(key)
    }

    /// Whether the table's replica identity carries its event key; when not,
    /// under `replica.identity.check = "fail"` the table is set aside.
    fn check_identity(&mut self, rel: &Relation, qualified: &str, key: &[String]) -> Option<Route> {
        let identity_columns = crate::sources::postgres::replica_identity::flagged_columns(rel);
        if let Some(lacks) = crate::sources::postgres::replica_identity::lacks(
            rel.replica_identity,
            &identity_columns,
            key,
        ) {
            let why = crate::sources::postgres::replica_identity::explain(
                qualified, qualified, &lacks, key,
            );
            match self.cfg.replica_identity_check {
                ReplicaIdentityCheck::Fail => {
                    let why = crate::sources::postgres::replica_identity::quarantine_reason(&why);
                    self.quarantine(qualified, why);
                    return Some(Route::Quarantined(qualified.to_owned()));
                }
                ReplicaIdentityCheck::Warn => {
                    tracing::warn!(table = %qualified, "{why} (replica.identity.check = \"warn\": publishing anyway)");
                }
            }
        }
        None
    }

    /// Claims the table's topic for it (set aside when another table holds
    /// it or it is too long), creates the topic, and notes the table captured.
    async fn claim_topic(
        &mut self,
        rel: &Relation,
        qualified: String,
        enc: TableEncoder,
    ) -> Result<Option<Route>, CaptureError> {
        let topic: Arc<str> = enc.topic().into();
        // A table created (or renamed) while capture runs: its topic must
        // not be another table's. Set aside: after the fix (and a restart,
        // for a setting) a snapshot of it brings the targets up to date.
        let claimed = check_length(&topic, &qualified)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                self.router
                    .topic_claims
                    .claim_table(&topic, &rel.namespace, &rel.name)
                    .map_err(|e| e.to_string())
            });
        if let Err(why) = claimed {
            self.quarantine(&qualified, why);
            return Ok(Some(Route::Quarantined(qualified)));
        }
        self.kafka.ensure_topic(&topic).await?;
        self.router
            .tables_by_topic
            .insert(Arc::clone(&topic), qualified.clone());
        // Captured from now on: a later start must not take it for a table
        // added to the include list (snapshot.new.tables).
        self.kafka
            .stage()
            .tables
            .get_or_insert_with(BTreeSet::new)
            .insert(qualified);
        Ok(Some(Route::Table(enc, topic)))
    }
}
