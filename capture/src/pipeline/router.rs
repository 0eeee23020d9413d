//! The router, one component of the pipeline: how each table the stream
//! describes (a relation) is published. It owns the relations, their routes
//! (encoder and topic), key columns, the table filter and which table owns
//! which topic; a route is built on a relation's first change after each
//! description of it (PostgreSQL: a Relation message), reading the
//! description through [`RoutedTable`] and asking the source what it needs
//! through [`TableCatalog`] (`crate::seam`), so the router's rules are
//! unit-tested with a test source's tables and a fake catalog.
//!
//! ```text
//!  a table described --on_relation--> relations (a partition as its root), its route forgotten
//!  first change -----build---------> signal | outbox | not captured | set aside | table route
//!                                        key (catalog, key.columns), identity, topic claim
//!  each change ------records-------> Kafka records (pure, synchronous: below)
//! ```
//!
//! How a change becomes Kafka records: the pipeline first resolves what a
//! change needs from outside (its relations' routes, the unchanged TOAST
//! values of a primary-key change's new row, a truncated topic's
//! partitions: see `Pipeline::resolve`); the mapping here is then pure and
//! synchronous, and unit-tested.

use std::collections::HashMap;
use std::sync::Arc;

use super::record::Record;
use crate::change::{Change, Datum, OldImage, RowImage, StreamTable};
use crate::config::{CaptureConfig, Converter, ReplicaIdentityCheck, SkippedOperations};
use crate::envelope::{
    EnvelopeConfig, EnvelopeError, HeadsApart, Op, SourcePosition, TableEncoder, HEADER_POSITION,
};
use crate::error::CaptureError;
use crate::filter::TableFilter;
use crate::naming::{check_length, TopicClaims, TopicClash};
use crate::outbox::{OutboxConfig, OutboxRouter};
use crate::seam::{RoutedTable, TableCatalog};

/// How the changes of one relation become records; `T` is how the source's
/// stream describes a table.
pub(super) enum Route<T> {
    /// A captured table: Debezium envelopes on its topic.
    Table(TableEncoder, Arc<str>),
    /// The outbox table: inserts become routed domain events; nothing else is published.
    Outbox(OutboxRouter, Arc<T>),
    /// The signal table: inserts are commands; nothing is published.
    Signal(Arc<T>),
    /// A table set aside (`schema.table`): it cannot be captured as it is
    /// (see `pipeline::quarantine`); nothing of it is published.
    Quarantined(String),
}

/// Per relation: how its changes are published, or `None` when not captured.
pub(super) type Routes<T> = HashMap<u32, Option<Route<T>>>;

/// What a newly built route asks of the rest of the pipeline.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Followup {
    Nothing,
    /// The table cannot be captured as it is: it is quarantined for
    /// `reason`, which names the fix.
    SetAside {
        table: String,
        reason: String,
    },
    /// The table claimed `topic`: the topic is created, and the table noted
    /// as captured (a later start must not take it for a table added to the
    /// include list, `snapshot.new.tables`).
    Captured {
        table: String,
        topic: Arc<str>,
    },
}

/// The routing state: the relations the stream described, how each
/// publishes (its encoder and topic), key columns, the table filter and
/// which table owns which topic. Private: the pipeline asks through methods.
/// `T` is how the source's stream describes a table ([`RoutedTable`]).
pub(super) struct Router<T: RoutedTable> {
    /// The table whose changes a topic carries, to name it in errors.
    tables_by_topic: HashMap<Arc<str>, String>,
    /// Which table owns which topic: a table that appears while capture
    /// runs must not take a topic another table writes to.
    topic_claims: TopicClaims,
    envelope: EnvelopeConfig,
    /// The parts the producer converts to Avro, which encoders write
    /// apart from their schema heads.
    heads_apart: HeadsApart,
    filter: TableFilter,
    /// Each table's event key, by `schema.table`, as start-up, signals,
    /// quarantine releases and routes learnt it.
    key_columns: HashMap<String, Vec<String>>,
    types: T::Types,
    /// The stream's latest description of each table, by its stream id.
    relations: HashMap<u32, Arc<T>>,
    routes: Routes<T>,
    rules: Rules,
}

/// What the configuration says of routes besides the filter and topic names.
struct Rules {
    /// `signal.data.collection`.
    signal_table: Option<String>,
    /// The outbox table's settings and its dead-letter topic.
    outbox: Option<(OutboxConfig, String)>,
    /// `message.key.columns`, by `schema.table`.
    key_overrides: HashMap<String, Vec<String>>,
    /// `replica.identity.check`.
    identity_check: ReplicaIdentityCheck,
}

impl<T: RoutedTable> Router<T> {
    /// The router of `cfg`'s tables, with the topics start-up claimed, the
    /// key columns it read and the types it knows.
    pub(super) fn new(
        cfg: &CaptureConfig,
        topic_claims: TopicClaims,
        key_columns: HashMap<String, Vec<String>>,
        types: T::Types,
    ) -> Result<Self, CaptureError> {
        let filter = cfg
            .captured_tables_filter()
            .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        let rules = Rules {
            signal_table: cfg.signal_table().map(str::to_owned),
            outbox: cfg.outbox.clone().map(|o| {
                let dead_letters = o.dead_letter_topic(&cfg.topic_prefix);
                (o, dead_letters)
            }),
            // Validated at start-up; a setting that does not parse keys nothing.
            key_overrides: crate::filter::parse_key_columns(cfg.message_key_columns.as_deref())
                .unwrap_or_default(),
            identity_check: cfg.replica_identity_check,
        };
        let columns = cfg
            .column_policy()
            .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
        refuse_key_masking(&key_columns, &columns)?;
        Ok(Self {
            tables_by_topic: HashMap::new(),
            topic_claims,
            envelope: EnvelopeConfig {
                topic_prefix: cfg.topic_prefix.clone(),
                topic_mapping: cfg.topic_name_mapping.clone(),
                database: cfg.database_dbname.clone(),
                schemas_enable: cfg.schemas_enable,
                columns,
            },
            heads_apart: HeadsApart {
                key: cfg.schemas_enable && cfg.key_converter == Converter::Avro,
                value: cfg.schemas_enable && cfg.value_converter == Converter::Avro,
            },
            filter,
            key_columns,
            types,
            relations: HashMap::new(),
            routes: HashMap::new(),
            rules,
        })
    }

    pub(super) fn envelope(&self) -> &EnvelopeConfig {
        &self.envelope
    }

    pub(super) fn heads_apart(&self) -> HeadsApart {
        self.heads_apart
    }

    pub(super) fn types(&self) -> &T::Types {
        &self.types
    }

    /// Whether table `schema.name` passes the include and exclude lists.
    pub(super) fn captures(&self, schema: &str, name: &str) -> bool {
        self.filter.matches(schema, name)
    }

    /// The event key of `table` (`schema.table`), when known.
    pub(super) fn key_columns(&self, table: &str) -> Option<&Vec<String>> {
        self.key_columns.get(table)
    }

    /// Remembers `table`'s event key, for snapshots and signals.
    pub(super) fn learn_key(&mut self, table: String, key: Vec<String>) {
        self.key_columns.insert(table, key);
    }

    /// Reserves `topic` for table `schema.name`, unless another table holds it.
    pub(super) fn claim_table(
        &mut self,
        topic: &str,
        schema: &str,
        name: &str,
    ) -> Result<(), TopicClash> {
        self.topic_claims.claim_table(topic, schema, name)
    }

    /// The table whose changes `topic` carries, when one does.
    pub(super) fn table_of_topic(&self, topic: &str) -> Option<&String> {
        self.tables_by_topic.get(topic)
    }

    /// The stream's latest description of relation `relation_id`.
    pub(super) fn relation(&self, relation_id: u32) -> Option<&Arc<T>> {
        self.relations.get(&relation_id)
    }

    /// [`Router::relation`], which a change of it must have had before.
    pub(super) fn relation_of(&self, relation_id: u32) -> Result<Arc<T>, CaptureError> {
        self.relations.get(&relation_id).cloned().ok_or_else(|| {
            CaptureError::Protocol(format!(
                "change for relation {relation_id} before its Relation message"
            ))
        })
    }

    /// A Relation message: `rel` replaces what the stream said of its
    /// table, whose route is built again on its next change. A partition is
    /// named as its root, through which it is published (one under its own
    /// name is WAL decoded before the publication published via the root),
    /// as the catalog has it once the Relation's transaction is visible: a
    /// table that transaction attached or detached keeps no root it had
    /// before. Whether its columns differ from the ones known before (it
    /// follows DDL, which the schema watch compares at once).
    pub(super) async fn on_relation<C>(
        &mut self,
        mut rel: T,
        catalog: &mut C,
    ) -> Result<bool, CaptureError>
    where
        C: TableCatalog<Table = T>,
    {
        if let Some((schema, root)) = catalog.published_as(&rel).await? {
            tracing::debug!(partition = %format!("{}.{}", rel.namespace(), rel.name()), root = %format!("{schema}.{root}"), "partition's changes go to its root");
            rel.publish_as(schema, root);
        }
        let noted = catalog.described(&rel);
        let id = rel.id();
        self.routes.remove(&id);
        let changed = noted
            || self
                .relations
                .get(&id)
                .is_some_and(|old| !old.same_columns(&rel));
        self.relations.insert(id, Arc::new(rel));
        Ok(changed)
    }

    /// A Type message: a type created after start-up (an enum, a domain, an
    /// array of them) is read from the catalog, and every route built again
    /// (their encoders may hold its columns as unknown).
    pub(super) async fn on_type<C>(
        &mut self,
        t: &T::TypeNote,
        catalog: &mut C,
    ) -> Result<(), CaptureError>
    where
        C: TableCatalog<Types = T::Types>,
    {
        if T::observe_type(&mut self.types, t) {
            catalog.learn_types(&mut self.types).await?;
            self.routes.clear();
        }
        Ok(())
    }

    /// Whether relation `relation_id`'s route is built.
    pub(super) fn has_route(&self, relation_id: u32) -> bool {
        self.routes.contains_key(&relation_id)
    }

    /// The route of `relation_id`, built before ([`Router::build`]).
    pub(super) fn route(&self, relation_id: u32) -> Result<Option<&Route<T>>, CaptureError> {
        route(&self.routes, relation_id)
    }

    /// Forgets the routes that set `table` aside: released from
    /// quarantine, its routes are built again on its next change.
    pub(super) fn release(&mut self, table: &str) {
        self.routes
            .retain(|_, r| !matches!(r, Some(Route::Quarantined(t)) if t == table));
    }

    /// The Kafka records of one change, its routes built ([`records`]).
    pub(super) fn records(
        &self,
        change: Change,
        src: &SourcePosition,
        resolved: Resolved,
        m: &Mapping<'_>,
    ) -> Result<(Vec<Record>, u64), CaptureError> {
        records(&self.routes, change, src, resolved, m)
    }

    /// How many event ordinals a change uses, its routes built ([`ordinals`]).
    pub(super) fn ordinals(&self, change: &Change) -> Result<u64, CaptureError> {
        ordinals(&self.routes, change)
    }

    /// Builds and keeps relation `relation_id`'s route (on its first change
    /// after each Relation message), asking `catalog` what it needs;
    /// `quarantined` says whether a table is set aside now. What the rest
    /// of the pipeline must do for it is returned.
    pub(super) async fn build<C>(
        &mut self,
        relation_id: u32,
        catalog: &mut C,
        quarantined: impl Fn(&str) -> bool,
    ) -> Result<Followup, CaptureError>
    where
        C: TableCatalog<Table = T>,
    {
        let rel = self.relation_of(relation_id)?;
        let qualified = format!("{}.{}", rel.namespace(), rel.name());
        let (route, followup) = match self.configured_route(&rel, &qualified)? {
            Some(route) => (route, Followup::Nothing),
            // Set aside until the heartbeat's catalog check releases it (see
            // `pipeline::quarantine`), whatever this Relation message says.
            None if quarantined(&qualified) => {
                (Some(Route::Quarantined(qualified)), Followup::Nothing)
            }
            None => self.table_route(rel, qualified, catalog).await?,
        };
        self.routes.insert(relation_id, route);
        Ok(followup)
    }

    /// The route the configuration alone decides: the signal table's, the
    /// outbox's, or none for a table the filter leaves out. `None` for a
    /// table to capture.
    fn configured_route(
        &self,
        rel: &Arc<T>,
        qualified: &str,
    ) -> Result<Option<Option<Route<T>>>, CaptureError> {
        if self.rules.signal_table.as_deref() == Some(qualified) {
            return Ok(Some(Some(Route::Signal(Arc::clone(rel)))));
        }
        if !self.filter.matches(rel.namespace(), rel.name()) {
            return Ok(Some(None));
        }
        let outbox = self.rules.outbox.as_ref();
        if let Some((outbox, dead_letters)) = outbox.filter(|(o, _)| o.table == qualified) {
            refuse_outbox_masking(&**rel, &self.envelope.columns)?;
            let router = OutboxRouter::new(&**rel, outbox, dead_letters)
                .map_err(|e| CaptureError::Prerequisite(e.to_string()))?;
            return Ok(Some(Some(Route::Outbox(router, Arc::clone(rel)))));
        }
        Ok(None)
    }

    /// A captured table's route: its event key, a replica identity that
    /// carries it, its encoder, its topic claimed; or set aside when one of
    /// them fails.
    async fn table_route<C>(
        &mut self,
        rel: Arc<T>,
        qualified: String,
        catalog: &mut C,
    ) -> Result<(Option<Route<T>>, Followup), CaptureError>
    where
        C: TableCatalog<Table = T>,
    {
        let key = self.event_key(&rel, &qualified, catalog).await?;
        let key = key.as_deref();
        if let Some(why) = self.identity_lacks_key(&rel, &qualified, key.unwrap_or_default()) {
            return Ok(set_aside(qualified, why));
        }
        let identity = catalog.identity(&qualified, &rel).await?;
        // A table without a key, or one whose `message.key.columns` name no
        // column of it, cannot be captured as it is: set aside, not a stop.
        let encoder = rel.encoder(&self.types, key, &self.envelope, identity.as_ref());
        match encoder.map(|e| e.with_heads_apart(self.heads_apart)) {
            Ok(enc) => Ok(self.claim_topic(&rel, qualified, enc)),
            Err(e) => {
                let why = match key {
                    None => T::keyless_reason(&qualified),
                    Some(_) => e.to_string(),
                };
                Ok(set_aside(qualified, why))
            }
        }
    }

    /// The event key of the table a Relation describes, `None` when it has none.
    async fn event_key<C>(
        &mut self,
        rel: &T,
        qualified: &str,
        catalog: &mut C,
    ) -> Result<Option<Vec<String>>, CaptureError>
    where
        C: TableCatalog<Table = T>,
    {
        // `message.key.columns` by name; else the primary key of the table
        // the Relation is (by its id), which start-up's list by name may no
        // longer be: dropped and made again with another key since.
        if let Some(key) = self.rules.key_overrides.get(qualified) {
            return Ok(Some(key.clone()));
        }
        let (key, current) = key_of_table(rel, catalog).await?;
        let known = self
            .key_columns
            .get(qualified)
            .filter(|known| current && known.iter().all(|k| has_column(rel, k)));
        Ok(match known {
            // The table capture keyed at start, still under its name with
            // no other primary key: keep that key (it may be a replica
            // identity index's; a primary key dropped while streaming must
            // refuse the table, not unkey it). A table made again with
            // another primary key takes it.
            Some(known) if key.is_empty() || *known == key => Some(known.clone()),
            _ => {
                if current && !key.is_empty() {
                    self.key_columns.insert(qualified.to_owned(), key.clone());
                }
                (!key.is_empty()).then_some(key)
            }
        })
    }

    /// Why the table must be set aside when its replica identity does not
    /// carry its event key under `replica.identity.check = "fail"` (under
    /// `"warn"` that is logged, and the table published).
    fn identity_lacks_key(&self, rel: &T, qualified: &str, key: &[String]) -> Option<String> {
        let why = rel.identity_lacks(qualified, key)?;
        match self.rules.identity_check {
            ReplicaIdentityCheck::Fail => Some(T::identity_reason(&why)),
            ReplicaIdentityCheck::Warn => {
                tracing::warn!(table = %qualified, "{why} (replica.identity.check = \"warn\": publishing anyway)");
                None
            }
        }
    }

    /// Claims the table's topic for it: set aside when another table holds
    /// it or it is too long.
    fn claim_topic(
        &mut self,
        rel: &T,
        qualified: String,
        enc: TableEncoder,
    ) -> (Option<Route<T>>, Followup) {
        let topic: Arc<str> = enc.topic().into();
        // A table created (or renamed) while capture runs: its topic must
        // not be another table's. Set aside: after the fix (and a restart,
        // for a setting) a snapshot of it brings the targets up to date.
        let claimed = check_length(&topic, &qualified)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                self.topic_claims
                    .claim_table(&topic, rel.namespace(), rel.name())
                    .map_err(|e| e.to_string())
            });
        if let Err(why) = claimed {
            return set_aside(qualified, why);
        }
        self.tables_by_topic
            .insert(Arc::clone(&topic), qualified.clone());
        let route = Route::Table(enc, Arc::clone(&topic));
        (
            Some(route),
            Followup::Captured {
                table: qualified,
                topic,
            },
        )
    }
}

/// The route of a table set aside for `reason`, and the quarantine it asks for.
fn set_aside<T>(table: String, reason: String) -> (Option<Route<T>>, Followup) {
    (
        Some(Route::Quarantined(table.clone())),
        Followup::SetAside { table, reason },
    )
}

/// The primary key of the table `rel` is, and whether the catalog has it
/// under the Relation's name now (then the key may be remembered by name,
/// for snapshots and signals). Looked up by the Relation's id, not its name
/// (see [`TableCatalog`]). A table missing then is gone, and its key comes
/// from the Relation message itself
/// ([`RoutedTable::stream_key`]).
async fn key_of_table<T, C>(rel: &T, catalog: &mut C) -> Result<(Vec<String>, bool), CaptureError>
where
    T: RoutedTable,
    C: TableCatalog<Table = T>,
{
    if let Some(found) = catalog.current(rel).await? {
        // Key columns renamed since the change: the Relation's own.
        let pk = found.primary_key;
        if pk.iter().all(|k| has_column(rel, k)) {
            let same_name = found.schema == rel.namespace() && found.name == rel.name();
            return Ok((pk, same_name));
        }
    }
    let key = rel.stream_key();
    tracing::info!(
        table = %format!("{}.{}", rel.namespace(), rel.name()),
        key = ?key,
        "table no longer in the catalog as the stream names it (dropped or renamed since): keyed by its Relation message"
    );
    Ok((key, false))
}

/// Whether the stream's description of a table has a column `name`.
fn has_column(rel: &impl StreamTable, name: &str) -> bool {
    (0..rel.width()).any(|i| rel.column_name(i) == name)
}

/// A key column excluded or masked, for the tables whose keys start-up
/// read, refuses the start (a table whose key only its first change tells
/// is set aside then, by its encoder).
fn refuse_key_masking(
    key_columns: &HashMap<String, Vec<String>>,
    policy: &crate::envelope::ColumnPolicy,
) -> Result<(), CaptureError> {
    for (table, key) in key_columns {
        let Some((schema, name)) = table.split_once('.') else {
            continue;
        };
        for column in key {
            let checked = crate::envelope::checked_action(
                policy,
                schema,
                name,
                column,
                true,
                crate::envelope::Characters::Unbounded,
            );
            if let Err(reason) = checked {
                return Err(CaptureError::Prerequisite(format!(
                    "{reason} (key of {table}: {})",
                    key.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// The outbox publishes its rows' payloads as they are: a column setting
/// that names one of its columns is refused, not silently ignored.
fn refuse_outbox_masking(
    rel: &impl StreamTable,
    policy: &crate::envelope::ColumnPolicy,
) -> Result<(), CaptureError> {
    let touched = (0..rel.width()).map(|i| rel.column_name(i)).find(|c| {
        policy.action(rel.namespace(), rel.name(), c) != crate::envelope::ColumnAction::Keep
    });
    match touched {
        Some(c) => Err(CaptureError::Prerequisite(format!(
            "column {} of the outbox table {}.{} is excluded or masked by the column.* settings; the outbox publishes its rows as written: leave its columns out of column.include.list/column.exclude.list/column.mask/column.truncate, and write only what may be published into it",
            c, rel.namespace(), rel.name()
        ))),
        None => Ok(()),
    }
}

/// The route of `relation_id`, resolved before.
pub(super) fn route<T>(
    routes: &Routes<T>,
    relation_id: u32,
) -> Result<Option<&Route<T>>, CaptureError> {
    routes
        .get(&relation_id)
        .map(Option::as_ref)
        .ok_or_else(|| CaptureError::Protocol(format!("relation {relation_id} has no route")))
}

/// What the resolving step read for one change.
#[derive(Default)]
pub(super) struct Resolved {
    /// The new row of a primary-key change, its unchanged TOAST values read
    /// from the source ([`create_needs_source`]).
    pub(super) created: Option<RowImage>,
    /// Partitions of each truncated table's topic, by relation id.
    pub(super) partitions: HashMap<u32, i32>,
}

/// What the mapping takes from the configuration, and the time.
pub(super) struct Mapping<'a> {
    pub(super) envelope: &'a EnvelopeConfig,
    /// `tombstones.on.delete`.
    pub(super) tombstones: bool,
    /// `skipped.operations`: skipped changes make no record but keep their
    /// ordinals, so every other event's position is the same whatever is
    /// skipped.
    pub(super) skipped: SkippedOperations,
    pub(super) now_ms: i64,
}

/// When an update of a table changes its key and its new row lacks unchanged
/// TOAST values the old row does not carry: the new row to complete from
/// the source, and the key columns to find it by. (`None` too when a key
/// cannot be encoded: the mapping refuses that change.)
pub(super) fn create_needs_source(
    enc: &TableEncoder,
    old: Option<&OldImage>,
    new: &RowImage,
) -> Option<(Vec<String>, RowImage)> {
    if !has_unchanged_toast(new) {
        return None;
    }
    let new_key = enc.key(new).ok()?;
    changed_key(enc, old, &new_key).ok()??;
    let after = match old {
        Some(OldImage::Full(full)) => fill_unchanged_toast(new, full),
        _ => None,
    }
    .unwrap_or_else(|| new.clone());
    has_unchanged_toast(&after)
        .then(|| (enc.key_column_names().map(str::to_owned).collect(), after))
}

/// The Kafka records of one change (none when its table is not captured),
/// and how many event ordinals they use from `src.event_seq` on (as
/// [`ordinals`] counts them).
pub(super) fn records<T: StreamTable>(
    routes: &Routes<T>,
    change: Change,
    src: &SourcePosition,
    resolved: Resolved,
    m: &Mapping<'_>,
) -> Result<(Vec<Record>, u64), CaptureError> {
    match change {
        Change::Insert { table, new } => Ok((insert(route(routes, table)?, &new, src, m)?, 1)),
        Change::Update { table, old, new } => {
            let Some(Route::Table(enc, topic)) = route(routes, table)? else {
                return Ok((Vec::new(), 1));
            };
            update(enc, topic, old, new, src, resolved, m)
        }
        Change::Delete { table, old } => {
            let Some(Route::Table(enc, topic)) = route(routes, table)? else {
                return Ok((Vec::new(), 1));
            };
            Ok((delete(enc, topic, &old, src, m)?, 1))
        }
        Change::Truncate { tables } => truncate(routes, &tables, src, &resolved, m),
        Change::Message { prefix, content } => {
            let (topic, key, value) =
                crate::envelope::message_record(m.envelope, true, &prefix, &content, src, m.now_ms);
            let mut record = Record::change(&topic.as_str().into(), key, value, src, None);
            record.ensure_topic = true;
            Ok((vec![record], 1))
        }
    }
}

/// An insert: a create event, or the outbox's routed event (or its dead letter).
fn insert<T: StreamTable>(
    route: Option<&Route<T>>,
    new: &RowImage,
    src: &SourcePosition,
    m: &Mapping<'_>,
) -> Result<Vec<Record>, CaptureError> {
    let mut out = Vec::new();
    match route {
        Some(Route::Table(..)) if m.skipped.create => {}
        Some(Route::Table(enc, topic)) => {
            let key = enc.key(new).map_err(refusable(1))?;
            let value = enc.value(Op::Create, None, Some(new), src, m.now_ms);
            out.push(Record::change(
                topic,
                key,
                value.map_err(refusable(1))?,
                src,
                Some(enc),
            ));
        }
        Some(Route::Outbox(router, rel)) => match router.route_or_dead_letter(new, &**rel) {
            Ok(ev) => {
                let mut record = Record::new(&ev.topic.as_str().into(), Some(ev.key), ev.value);
                record.headers = vec![("id", ev.id), ("type", ev.kind)];
                record.ensure_topic = true;
                out.push(record);
            }
            // A row no restart could route: its dead letter, in this
            // transaction, takes the event's place (and its ordinal).
            Err(dl) => out.push(Record::dead_letter(*dl)),
        },
        Some(Route::Signal(_) | Route::Quarantined(_)) | None => {}
    }
    Ok(out)
}

/// An update: one update event, or, when the key changed, a delete (and
/// its tombstone) and a create with the next ordinal.
fn update(
    enc: &TableEncoder,
    topic: &Arc<str>,
    old: Option<OldImage>,
    new: RowImage,
    src: &SourcePosition,
    resolved: Resolved,
    m: &Mapping<'_>,
) -> Result<(Vec<Record>, u64), CaptureError> {
    let now = m.now_ms;
    let mut out = Vec::new();
    let new_key = enc.key(&new).map_err(refusable(1))?;
    let full = match &old {
        Some(OldImage::Full(full)) => fill_unchanged_toast(&new, full),
        _ => None,
    };
    let Some(old_key) = changed_key(enc, old.as_ref(), &new_key)? else {
        let before = match &old {
            Some(OldImage::Full(full)) => Some(full),
            _ => None,
        };
        if m.skipped.update {
            return Ok((out, 1));
        }
        let after = full.as_ref().unwrap_or(&new);
        let value = enc.value(Op::Update, before, Some(after), src, now);
        out.push(Record::change(
            topic,
            new_key,
            value.map_err(refusable(1))?,
            src,
            Some(enc),
        ));
        return Ok((out, 1));
    };
    // A primary-key change: the old row is gone, a new one exists.
    // No target holds a row under the new key to keep unchanged
    // TOAST values from, so the create carries them: from the old
    // row (REPLICA IDENTITY FULL), else as read from the source.
    let after = resolved.created.or(full).unwrap_or(new);
    let before = old.as_ref().map(OldImage::row);
    if !m.skipped.delete {
        let deleted = enc.value(Op::Delete, before, None, src, now);
        out.push(Record::change(
            topic,
            old_key.clone(),
            deleted.map_err(refusable(2))?,
            src,
            Some(enc),
        ));
        if m.tombstones {
            // The delete's position, as every tombstone.
            out.push(Record::tombstone(topic, old_key, src, enc));
        }
    }
    // The create is an event of its own, with the next ordinal.
    let created_at = SourcePosition {
        event_seq: src.event_seq + 1,
        ..*src
    };
    if m.skipped.create {
        return Ok((out, 2));
    }
    let created = enc.value(Op::Create, None, Some(&after), &created_at, now);
    out.push(Record::change(
        topic,
        new_key,
        created.map_err(refusable(2))?,
        &created_at,
        Some(enc),
    ));
    Ok((out, 2))
}

/// A delete event, and its tombstone when `tombstones.on.delete` says so.
fn delete(
    enc: &TableEncoder,
    topic: &Arc<str>,
    old: &OldImage,
    src: &SourcePosition,
    m: &Mapping<'_>,
) -> Result<Vec<Record>, CaptureError> {
    let mut out = Vec::new();
    if m.skipped.delete {
        return Ok(out);
    }
    let key = enc.key(old.row()).map_err(refusable(1))?;
    let value = enc.value(Op::Delete, Some(old.row()), None, src, m.now_ms);
    out.push(Record::change(
        topic,
        key.clone(),
        value.map_err(refusable(1))?,
        src,
        Some(enc),
    ));
    if m.tombstones {
        out.push(Record::tombstone(topic, key, src, enc));
    }
    Ok(out)
}

/// One event per captured table, each with an ordinal of its own. A
/// truncate has no key, and a sink orders records per partition only: one
/// copy on each partition, after every earlier change of that partition and
/// before every later one. Partitions were counted when the change was
/// resolved, so partitions added to the topic since are covered too.
fn truncate<T>(
    routes: &Routes<T>,
    relation_ids: &[u32],
    src: &SourcePosition,
    resolved: &Resolved,
    m: &Mapping<'_>,
) -> Result<(Vec<Record>, u64), CaptureError> {
    let mut out = Vec::new();
    let mut tables = 0;
    for &relation_id in relation_ids {
        let Some(Route::Table(enc, topic)) = route(routes, relation_id)? else {
            continue;
        };
        let at = SourcePosition {
            event_seq: src.event_seq + tables,
            ..*src
        };
        tables += 1;
        if m.skipped.truncate {
            continue;
        }
        let value = enc.truncate_value(&at, m.now_ms);
        let partitions = resolved.partitions.get(&relation_id).copied();
        for partition in 0..partitions.unwrap_or(0) {
            let mut record = Record::new(topic, None, Some(value.clone()));
            record.partition = Some(partition);
            record
                .headers
                .push((HEADER_POSITION, crate::envelope::position_header(&at)));
            out.push(record);
        }
    }
    Ok((out, tables.max(1)))
}

/// How many event ordinals a change uses: as many as the events
/// [`records`] makes of it, and at least one. Decided from the change and the
/// routes alone (no value encoded, nothing read), so a skipped change counts
/// the same as when it was published.
pub(super) fn ordinals<T>(routes: &Routes<T>, change: &Change) -> Result<u64, CaptureError> {
    match change {
        Change::Update { table, old, new } => match route(routes, *table)? {
            Some(Route::Table(enc, _)) if old.is_some() => {
                // A key that cannot be encoded refuses the change, as one
                // ordinal (as `records` counts it).
                let new_key = match enc.key(new) {
                    Err(e) if e.is_unrepresentable() => return Ok(1),
                    key => key.map_err(encode_err)?,
                };
                Ok(match changed_key(enc, old.as_ref(), &new_key) {
                    Ok(Some(_)) => 2,
                    Ok(None) | Err(CaptureError::ValueRefused(_)) => 1,
                    Err(e) => return Err(e),
                })
            }
            _ => Ok(1),
        },
        Change::Truncate { tables: ids } => {
            let mut tables = 0;
            for &id in ids {
                if let Some(Route::Table(..)) = route(routes, id)? {
                    tables += 1;
                }
            }
            Ok(tables.max(1))
        }
        _ => Ok(1),
    }
}

/// With REPLICA IDENTITY FULL the old row carries the values of unchanged
/// TOASTed columns, so the new row can be complete instead of marked unavailable.
pub(super) fn fill_unchanged_toast(new: &RowImage, old: &RowImage) -> Option<RowImage> {
    if !has_unchanged_toast(new) || new.0.len() != old.0.len() {
        return None;
    }
    let filled = new
        .0
        .iter()
        .zip(&old.0)
        .map(|(n, o)| match (n, o) {
            (Datum::Unchanged, Datum::Text(_) | Datum::Binary(_) | Datum::Null) => o.clone(),
            _ => n.clone(),
        })
        .collect();
    Some(RowImage(filled))
}

/// The old key of an update that changed its row's key (`None` when the key
/// stayed, or the old key is not in the change).
fn changed_key(
    enc: &TableEncoder,
    old: Option<&OldImage>,
    new_key: &[u8],
) -> Result<Option<Vec<u8>>, CaptureError> {
    let Some(old) = old else {
        return Ok(None);
    };
    let old_key = enc.key(old.row()).map_err(refusable(1))?;
    Ok((old_key != new_key).then_some(old_key))
}

fn has_unchanged_toast(row: &RowImage) -> bool {
    row.0.iter().any(|v| matches!(v, Datum::Unchanged))
}

fn encode_err(e: EnvelopeError) -> CaptureError {
    CaptureError::Encode(e)
}

/// [`encode_err`], except that a value its field cannot carry refuses the
/// change ([`CaptureError::ValueRefused`]), which takes `ordinals` event
/// ordinals all the same.
pub(super) fn refusable(ordinals: u64) -> impl FnOnce(EnvelopeError) -> CaptureError {
    move |e| match e {
        EnvelopeError::Unrepresentable { ref table, .. } => {
            CaptureError::ValueRefused(Box::new(crate::error::RefusedValue {
                table: table.clone(),
                reason: e.to_string(),
                ordinals,
            }))
        }
        other => encode_err(other),
    }
}
