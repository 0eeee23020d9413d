//! How a change becomes Kafka records. The pipeline first resolves what a
//! change needs from outside (its relations' routes, the unchanged TOAST
//! values of a primary-key change's new row, a truncated topic's
//! partitions: see `Pipeline::resolve`); the mapping here is then pure and
//! synchronous, and unit-tested.

use std::collections::HashMap;
use std::sync::Arc;

use super::record::Record;
use crate::envelope::{
    EnvelopeConfig, EnvelopeError, Op, SourcePosition, TableEncoder, HEADER_POSITION,
};
use crate::error::CaptureError;
use crate::filter::TableFilter;
use crate::naming::TopicClaims;
use crate::outbox::OutboxRouter;
use crate::sources::postgres::pgoutput::{
    LogicalMessage, OldTuple, Relation, RelationCache, TupleData, TupleValue,
};
use crate::sources::postgres::value::TypeRegistry;

/// How the changes of one relation become records.
pub(super) enum Route {
    /// A captured table: Debezium envelopes on its topic.
    Table(TableEncoder, Arc<str>),
    /// The outbox table: inserts become routed domain events; nothing else is published.
    Outbox(OutboxRouter, Arc<Relation>),
    /// The signal table: inserts are commands; nothing is published.
    Signal(Arc<Relation>),
    /// A table set aside (`schema.table`): it cannot be captured as it is
    /// (see `pipeline::quarantine`); nothing of it is published.
    Quarantined(String),
}

/// Per relation: how its changes are published, or `None` when not captured.
pub(super) type Routes = HashMap<u32, Option<Route>>;

/// The routing state, one component of the pipeline: the relations the
/// stream described, how each publishes (its encoder and topic), key
/// columns, the table filter and which table owns which topic.
pub(super) struct Router {
    /// The table whose changes a topic carries, to name it in errors.
    pub(super) tables_by_topic: HashMap<Arc<str>, String>,
    /// Which table owns which topic: a table that appears while capture
    /// runs must not take a topic another table writes to.
    pub(super) topic_claims: TopicClaims,
    pub(super) envelope: EnvelopeConfig,
    pub(super) filter: TableFilter,
    pub(super) key_columns: HashMap<String, Vec<String>>,
    pub(super) types: TypeRegistry,
    pub(super) relations: RelationCache,
    /// Per relation: how its changes are published, or `None` when not captured.
    pub(super) encoders: Routes,
}

/// The route of `relation_id`, resolved before.
pub(super) fn route(routes: &Routes, relation_id: u32) -> Result<Option<&Route>, CaptureError> {
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
    pub(super) created: Option<TupleData>,
    /// Partitions of each truncated table's topic, by relation id.
    pub(super) partitions: HashMap<u32, i32>,
}

/// What the mapping takes from the configuration, and the time.
pub(super) struct Mapping<'a> {
    pub(super) envelope: &'a EnvelopeConfig,
    /// `tombstones.on.delete`.
    pub(super) tombstones: bool,
    pub(super) now_ms: i64,
}

/// When an update of a table changes its key and its new row lacks unchanged
/// TOAST values the old row does not carry: the new row to complete from
/// the source, and the key columns to find it by. (`None` too when a key
/// cannot be encoded: the mapping refuses that change.)
pub(super) fn create_needs_source(
    enc: &TableEncoder,
    old: Option<&OldTuple>,
    new: &TupleData,
) -> Option<(Vec<String>, TupleData)> {
    if !has_unchanged_toast(new) {
        return None;
    }
    let new_key = enc.key(new).ok()?;
    changed_key(enc, old, &new_key).ok()??;
    let after = match old {
        Some(OldTuple::Full(full)) => fill_unchanged_toast(new, full),
        _ => None,
    }
    .unwrap_or_else(|| new.clone());
    has_unchanged_toast(&after)
        .then(|| (enc.key_column_names().map(str::to_owned).collect(), after))
}

/// The Kafka records of one change (none when its table is not captured),
/// and how many event ordinals they use from `src.event_seq` on (as
/// [`ordinals`] counts them).
pub(super) fn records(
    routes: &Routes,
    change: LogicalMessage,
    src: &SourcePosition,
    resolved: Resolved,
    m: &Mapping<'_>,
) -> Result<(Vec<Record>, u64), CaptureError> {
    match change {
        LogicalMessage::Insert { relation_id, new } => {
            Ok((insert(route(routes, relation_id)?, &new, src, m)?, 1))
        }
        LogicalMessage::Update {
            relation_id,
            old,
            new,
        } => {
            let Some(Route::Table(enc, topic)) = route(routes, relation_id)? else {
                return Ok((Vec::new(), 1));
            };
            update(enc, topic, old, new, src, resolved, m)
        }
        LogicalMessage::Delete { relation_id, old } => {
            let Some(Route::Table(enc, topic)) = route(routes, relation_id)? else {
                return Ok((Vec::new(), 1));
            };
            Ok((delete(enc, topic, &old, src, m)?, 1))
        }
        LogicalMessage::Truncate { relation_ids, .. } => {
            truncate(routes, &relation_ids, src, &resolved, m)
        }
        LogicalMessage::Message {
            prefix, content, ..
        } => {
            let (topic, key, value) =
                crate::envelope::message_record(m.envelope, true, &prefix, &content, src, m.now_ms);
            let mut record = Record::change(&topic.as_str().into(), key, value, src);
            record.ensure_topic = true;
            Ok((vec![record], 1))
        }
        other => Err(CaptureError::Protocol(format!(
            "unexpected message in a transaction: {other:?}"
        ))),
    }
}

/// An insert: a create event, or the outbox's routed event (or its dead letter).
fn insert(
    route: Option<&Route>,
    new: &TupleData,
    src: &SourcePosition,
    m: &Mapping<'_>,
) -> Result<Vec<Record>, CaptureError> {
    let mut out = Vec::new();
    match route {
        Some(Route::Table(enc, topic)) => {
            let key = enc.key(new).map_err(refusable(1))?;
            let value = enc.value(Op::Create, None, Some(new), src, m.now_ms);
            out.push(Record::change(
                topic,
                key,
                value.map_err(refusable(1))?,
                src,
            ));
        }
        Some(Route::Outbox(router, rel)) => match router.route_or_dead_letter(new, rel) {
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
    old: Option<OldTuple>,
    new: TupleData,
    src: &SourcePosition,
    resolved: Resolved,
    m: &Mapping<'_>,
) -> Result<(Vec<Record>, u64), CaptureError> {
    let now = m.now_ms;
    let mut out = Vec::new();
    let new_key = enc.key(&new).map_err(refusable(1))?;
    let full = match &old {
        Some(OldTuple::Full(full)) => fill_unchanged_toast(&new, full),
        _ => None,
    };
    let Some(old_key) = changed_key(enc, old.as_ref(), &new_key)? else {
        let before = match &old {
            Some(OldTuple::Full(full)) => Some(full),
            _ => None,
        };
        let after = full.as_ref().unwrap_or(&new);
        let value = enc.value(Op::Update, before, Some(after), src, now);
        out.push(Record::change(
            topic,
            new_key,
            value.map_err(refusable(1))?,
            src,
        ));
        return Ok((out, 1));
    };
    // A primary-key change: the old row is gone, a new one exists.
    // No target holds a row under the new key to keep unchanged
    // TOAST values from, so the create carries them: from the old
    // row (REPLICA IDENTITY FULL), else as read from the source.
    let after = resolved.created.or(full).unwrap_or(new);
    let before = old.as_ref().map(OldTuple::tuple);
    let deleted = enc.value(Op::Delete, before, None, src, now);
    out.push(Record::change(
        topic,
        old_key.clone(),
        deleted.map_err(refusable(2))?,
        src,
    ));
    if m.tombstones {
        // The delete's position, as every tombstone.
        out.push(Record::tombstone(topic, old_key, src, enc));
    }
    // The create is an event of its own, with the next ordinal.
    let created_at = SourcePosition {
        event_seq: src.event_seq + 1,
        ..*src
    };
    let created = enc.value(Op::Create, None, Some(&after), &created_at, now);
    out.push(Record::change(
        topic,
        new_key,
        created.map_err(refusable(2))?,
        &created_at,
    ));
    Ok((out, 2))
}

/// A delete event, and its tombstone when `tombstones.on.delete` says so.
fn delete(
    enc: &TableEncoder,
    topic: &Arc<str>,
    old: &OldTuple,
    src: &SourcePosition,
    m: &Mapping<'_>,
) -> Result<Vec<Record>, CaptureError> {
    let mut out = Vec::new();
    let key = enc.key(old.tuple()).map_err(refusable(1))?;
    let value = enc.value(Op::Delete, Some(old.tuple()), None, src, m.now_ms);
    out.push(Record::change(
        topic,
        key.clone(),
        value.map_err(refusable(1))?,
        src,
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
fn truncate(
    routes: &Routes,
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
pub(super) fn ordinals(routes: &Routes, change: &LogicalMessage) -> Result<u64, CaptureError> {
    match change {
        LogicalMessage::Update {
            relation_id,
            old,
            new,
        } => match route(routes, *relation_id)? {
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
        LogicalMessage::Truncate { relation_ids, .. } => {
            let mut tables = 0;
            for &id in relation_ids {
                if let Some(Route::Table(..)) = route(routes, id)? {
                    tables += 1;
                }
            }
            Ok(tables.max(1))
        }
        _ => Ok(1),
    }
}

/// The relations a change's records depend on.
pub(super) fn relations(change: &LogicalMessage) -> &[u32] {
    match change {
        LogicalMessage::Insert { relation_id, .. }
        | LogicalMessage::Update { relation_id, .. }
        | LogicalMessage::Delete { relation_id, .. } => std::slice::from_ref(relation_id),
        LogicalMessage::Truncate { relation_ids, .. } => relation_ids,
        _ => &[],
    }
}

/// With REPLICA IDENTITY FULL the old row carries the values of unchanged
/// TOASTed columns, so the new row can be complete instead of marked unavailable.
pub(super) fn fill_unchanged_toast(new: &TupleData, old: &TupleData) -> Option<TupleData> {
    if !has_unchanged_toast(new) || new.0.len() != old.0.len() {
        return None;
    }
    let filled = new
        .0
        .iter()
        .zip(&old.0)
        .map(|(n, o)| match (n, o) {
            (
                TupleValue::UnchangedToast,
                TupleValue::Text(_) | TupleValue::Binary(_) | TupleValue::Null,
            ) => o.clone(),
            _ => n.clone(),
        })
        .collect();
    Some(TupleData(filled))
}

/// The old key of an update that changed its row's key (`None` when the key
/// stayed, or the old key is not in the change).
fn changed_key(
    enc: &TableEncoder,
    old: Option<&OldTuple>,
    new_key: &[u8],
) -> Result<Option<Vec<u8>>, CaptureError> {
    let Some(old) = old else {
        return Ok(None);
    };
    let old_key = enc.key(old.tuple()).map_err(refusable(1))?;
    Ok((old_key != new_key).then_some(old_key))
}

fn has_unchanged_toast(row: &TupleData) -> bool {
    row.0
        .iter()
        .any(|v| matches!(v, TupleValue::UnchangedToast))
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
