//! Row filters (`table.filter`) evaluated by capture, on a server without
//! publication row filters (PostgreSQL 13 and 14): the stream carries every
//! change of a filtered table, and capture keeps what PostgreSQL 15's
//! publication would have sent.
//!
//! ```text
//!  slot --events--> [held from a transaction's first filtered change
//!                    to its Commit (or HELD_ROWS changes)]
//!                        | one pipelined query per filtered table:
//!                        | the images' filter columns as typed rows
//!                        v
//!                   decide(): as is, dropped, UPDATE as DELETE or INSERT --> pipeline
//! ```
//!
//! The invariant: the events the pipeline sees are a function of the WAL
//! alone. The filter is one boolean expression of immutable built-in
//! functions (refused otherwise at start, as PostgreSQL 15 refuses it), run
//! on the change's own values, so a replay after a kill drops and rewrites
//! the same events and the tracker's event ordinals stay those of the first
//! run.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use pgwire_replication::{ReplicationClient, ReplicationEvent};
use tokio_postgres::{Client, Statement};

use super::chunk::FILTER_SEARCH_PATH;
use super::pgoutput::{self, tag, LogicalMessage, OldTuple, Relation, TupleData, TupleValue};
use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::naming::quote_ident;

/// The first server version with publication row filters.
pub const ROW_FILTER_VERSION: i32 = 150_000;

/// A held transaction is evaluated once it holds this many filtered
/// changes, or this many events in all, even before its Commit: what a
/// huge transaction holds in memory stays bounded.
const HELD_ROWS: usize = 5_000;
const HELD_EVENTS: usize = 50_000;

/// The temporary view a filter is parsed into at start (rolled back).
const PROBE: &str = "oncely_row_filter_probe";

/// What the server makes of a filter on its table, parsed into a
/// temporary view: the columns it reads, those outside the replica
/// identity, and what PostgreSQL 15 would refuse in a publication filter
/// (a function or operator that is user-defined or not immutable, a
/// user-defined type or collation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterProbe {
    pub columns: Vec<String>,
    pub outside_identity: Vec<String>,
    pub refused: Vec<String>,
}

/// The probe's catalog read: the view's rule records the columns it reads
/// in `pg_depend`, and its stored tree names every function, operator,
/// type and collation it uses (built-in ones are pinned, so `pg_depend`
/// leaves them out).
const PROBE_SQL: &str = r"
WITH r AS (SELECT oid, ev_action::text AS tree FROM pg_rewrite
           WHERE ev_class = 'pg_temp.oncely_row_filter_probe'::regclass),
     t AS (SELECT c.oid, c.relreplident FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = $1 AND c.relname = $2),
     cols AS (SELECT DISTINCT a.attnum, a.attname::text AS name,
                     (t.relreplident = 'f' OR EXISTS (
                         SELECT 1 FROM pg_index i
                         WHERE i.indrelid = t.oid
                           AND ((t.relreplident = 'd' AND i.indisprimary)
                                OR (t.relreplident = 'i' AND i.indisreplident))
                           AND a.attnum = ANY(i.indkey::int2[]))) AS held
              FROM r, t, pg_depend d
              JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
              WHERE d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                AND d.refobjid = t.oid AND d.refobjsubid > 0),
     ids AS (SELECT DISTINCT m[1] AS kind, m[2]::oid AS id FROM r,
             regexp_matches(r.tree, ':(funcid|opfuncid|opno|vartype|consttype|resulttype|[a-z]*collid) (\d+)', 'g') m)
SELECT ARRAY(SELECT name FROM cols ORDER BY attnum),
       ARRAY(SELECT name FROM cols WHERE NOT held ORDER BY attnum),
       ARRAY(SELECT what FROM (
           SELECT 'function ' || p.oid::regprocedure::text
                  || CASE WHEN p.oid >= 16384 THEN ' (user-defined)' ELSE ' (not immutable)' END AS what
           FROM ids JOIN pg_proc p ON p.oid = ids.id
           WHERE ids.kind IN ('funcid', 'opfuncid') AND (p.oid >= 16384 OR p.provolatile <> 'i')
           UNION
           SELECT 'operator ' || ids.id::regoperator::text || ' (user-defined)'
           FROM ids WHERE ids.kind = 'opno' AND ids.id >= 16384
           UNION
           SELECT 'type ' || ids.id::regtype::text || ' (user-defined)'
           FROM ids WHERE ids.kind IN ('vartype', 'consttype', 'resulttype') AND ids.id >= 16384
           UNION
           SELECT 'collation ' || c.collname::text || ' (user-defined)'
           FROM ids JOIN pg_collation c ON c.oid = ids.id
           WHERE ids.kind LIKE '%collid' AND ids.id >= 16384) w ORDER BY what)";

/// Parses `filter` on `schema.table` into a temporary view, in a
/// transaction that is rolled back, with the search path filters run with.
pub async fn probe(
    client: &Client,
    schema: &str,
    table: &str,
    filter: &str,
) -> Result<FilterProbe, CaptureError> {
    let qualified = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let created = client
        .batch_execute(&format!(
            "BEGIN READ WRITE; SET LOCAL search_path = {FILTER_SEARCH_PATH}; \
             CREATE TEMP VIEW {PROBE} AS SELECT 1 FROM {qualified} WHERE ({filter})"
        ))
        .await;
    let read = match created {
        Ok(()) => match client.query_one(PROBE_SQL, &[&schema, &table]).await {
            Ok(row) => immutable(client, &qualified, table, filter, row).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    client
        .batch_execute("ROLLBACK")
        .await
        .map_err(CaptureError::pg("end row filter probe"))?;
    match read {
        Ok(probed) => Ok(probed),
        // The server's reason (no such column, a syntax error) holds no row value.
        Err(e) if e.as_db_error().is_some() => Err(CaptureError::Prerequisite(format!(
            "table.filter of {schema}.{table} does not work as a row filter: {} (SQLSTATE {})",
            e.as_db_error().map(|d| d.message()).unwrap_or_default(),
            e.code().map(|c| c.code()).unwrap_or_default()
        ))),
        Err(e) => Err(CaptureError::pg("row filter probe")(e)),
    }
}

/// The probe's answer, with what the tree does not name: a type's input
/// or output function that a cast through text calls (`timestamptz` to
/// `text` reads the session's TimeZone). An index predicate must be
/// immutable by the rule PostgreSQL 15 applies to a publication filter, so
/// the filter is made one on an empty copy of the table (rolled back).
async fn immutable(
    client: &Client,
    qualified: &str,
    table: &str,
    filter: &str,
    row: tokio_postgres::Row,
) -> Result<FilterProbe, tokio_postgres::Error> {
    let mut probed = FilterProbe {
        columns: row.get(0),
        outside_identity: row.get(1),
        refused: row.get(2),
    };
    if !probed.refused.is_empty() {
        return Ok(probed);
    }
    let copy = quote_ident(table);
    let indexed = client
        .batch_execute(&format!(
            "CREATE TEMP TABLE {copy} (LIKE {qualified}); \
             CREATE INDEX ON pg_temp.{copy} ((1)) WHERE ({filter})"
        ))
        .await;
    match indexed {
        Ok(()) => Ok(probed),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_OBJECT_DEFINITION) => {
            probed.refused.push(
                "a function that is not immutable (a cast through text of a type whose text depends on the session, such as timestamptz)"
                    .to_owned(),
            );
            Ok(probed)
        }
        Err(e) => Err(e),
    }
}

/// What PostgreSQL 15's publication sends of a change, by whether the
/// filter holds for its old row (`None`: the change carries none) and its
/// new row (`None`: a delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop,
    AsIs,
    /// An UPDATE moving the row out of the filter: a DELETE of the old row.
    AsDelete,
    /// An UPDATE moving the row into the filter: an INSERT of the new row.
    AsInsert,
}

/// The publication's decision table: an INSERT is sent when its new row
/// matches, a DELETE when its old row does; an UPDATE without an old row
/// (its key unchanged under the default identity) is judged by its new
/// row; with both, as an update when both match, as a delete when only
/// the old does, as an insert when only the new does.
pub fn decide(old: Option<bool>, new: Option<bool>) -> Verdict {
    match (old, new) {
        (None, Some(true)) | (Some(true), None) | (Some(true), Some(true)) => Verdict::AsIs,
        (Some(true), Some(false)) => Verdict::AsDelete,
        (Some(false), Some(true)) => Verdict::AsInsert,
        _ => Verdict::Drop,
    }
}

/// One filtered table as the stream describes it now: its filter's query,
/// prepared on first use.
struct Evaluator {
    relation: Relation,
    filter: String,
    /// The positions of the filter's columns in the relation.
    columns: Vec<usize>,
    statement: tokio::sync::OnceCell<Statement>,
}

impl Evaluator {
    /// `SELECT` of the filter over the images' columns, each passed as a
    /// `text[]` and cast to the column's type, in the images' order.
    async fn statement(&self, client: &Client) -> Result<&Statement, CaptureError> {
        self.statement
            .get_or_try_init(|| async {
                let (oids, mods): (Vec<u32>, Vec<i32>) = self
                    .columns
                    .iter()
                    .map(|&i| {
                        let c = &self.relation.columns[i];
                        (c.type_oid, c.type_modifier)
                    })
                    .unzip();
                let types: Vec<String> = client
                    .query(
                        "SELECT format_type(t, m) FROM unnest($1::oid[], $2::int4[])
                         WITH ORDINALITY AS u(t, m, n) ORDER BY n",
                        &[&oids, &mods],
                    )
                    .await
                    .map_err(CaptureError::pg("read row filter column types"))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let sql = self.sql(&types);
                client.prepare(&sql).await.map_err(|e| {
                    CaptureError::Prerequisite(format!(
                        "the row filter of {}.{} does not evaluate on the stream's rows: {}",
                        self.relation.namespace,
                        self.relation.name,
                        e.as_db_error()
                            .map_or_else(|| e.to_string(), |d| d.message().to_owned())
                    ))
                })
            })
            .await
    }

    fn sql(&self, types: &[String]) -> String {
        let width = self.columns.len().max(1);
        let arrays: Vec<String> = (1..=width).map(|i| format!("${i}::text[]")).collect();
        let slots: Vec<String> = (1..=width).map(|i| format!("\"oncely {i}\"")).collect();
        let typed: Vec<String> = self
            .columns
            .iter()
            .zip(types)
            .enumerate()
            .map(|(k, (&i, ty))| {
                format!(
                    "\"oncely {}\"::{ty} AS {}",
                    k + 1,
                    quote_ident(&self.relation.columns[i].name)
                )
            })
            .collect();
        let typed = if typed.is_empty() {
            "NULL AS \"oncely none\"".to_owned()
        } else {
            typed.join(", ")
        };
        format!(
            "SELECT coalesce(({}), false) FROM unnest({}) WITH ORDINALITY AS \"oncely rows\"({}, \"oncely ordinal\"), \
             LATERAL (SELECT {typed}) AS {} ORDER BY \"oncely rows\".\"oncely ordinal\"",
            self.filter,
            arrays.join(", "),
            slots.join(", "),
            quote_ident(&self.relation.name)
        )
    }

    /// Whether the filter holds for each of `images`: one query.
    async fn run(&self, client: &Client, images: &[&TupleData]) -> Result<Vec<bool>, CaptureError> {
        let statement = self.statement(client).await?;
        let mut arrays: Vec<Vec<Option<&str>>> = Vec::new();
        for &i in &self.columns {
            let mut values = Vec::with_capacity(images.len());
            for image in images {
                values.push(match image.0.get(i) {
                    Some(TupleValue::Text(b)) => Some(std::str::from_utf8(b).map_err(|_| {
                        CaptureError::Protocol("a filtered column's value is not UTF-8".into())
                    })?),
                    Some(TupleValue::Binary(_)) => {
                        return Err(CaptureError::Protocol(
                            "a filtered column's value came in binary format".into(),
                        ))
                    }
                    _ => None,
                });
            }
            arrays.push(values);
        }
        if arrays.is_empty() {
            arrays.push(vec![None; images.len()]);
        }
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = arrays
            .iter()
            .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = client
            .query(statement, &params)
            .await
            .map_err(CaptureError::pg("evaluate row filter"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

/// A change of a filtered table, held until its transaction is evaluated.
struct HeldRow {
    eval: Arc<Evaluator>,
    msg: LogicalMessage,
}

struct Held {
    event: ReplicationEvent,
    row: Option<HeldRow>,
}

/// The stream's filter on a server without publication row filters.
pub(crate) struct StreamFilter {
    eval: Client,
    /// Per filtered table (`schema.table`): its filter and the columns it reads.
    filters: HashMap<String, (String, Vec<String>)>,
    /// The filtered relations, by the stream's id.
    relations: HashMap<u32, Arc<Evaluator>>,
    held: Vec<Held>,
    held_rows: usize,
    /// The held events are complete (a Commit, or the bound reached).
    due: bool,
    ready: VecDeque<ReplicationEvent>,
}

impl StreamFilter {
    /// `Some` when `table.filter` filters a table and the server has no
    /// publication row filters: a connection of its own, whose session
    /// runs read-only, resolves names in `pg_catalog` only and reads text
    /// values as the stream writes them.
    pub(crate) async fn open(cfg: &CaptureConfig) -> Result<Option<Self>, CaptureError> {
        if cfg.table_filter.is_empty() {
            return Ok(None);
        }
        let mut pg = super::control::pg_config(cfg, "oncely-capture-row-filter");
        pg.options(format!(
            "-c search_path={} -c default_transaction_read_only=on -c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3 -c statement_timeout={}",
            FILTER_SEARCH_PATH.replace(' ', ""),
            super::chunk::FILTERED_CHUNK_TIMEOUT.as_millis()
        ));
        let eval = super::control::connect_with(cfg, &pg, "row filter").await?;
        let version: i32 = eval
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(CaptureError::pg("read server version"))?
            .get(0);
        if version >= ROW_FILTER_VERSION {
            return Ok(None);
        }
        let mut filters = HashMap::new();
        for (table, filter) in &cfg.table_filter {
            let Some((schema, name)) = crate::snapshot::split_table(table) else {
                continue;
            };
            // A filter of a table that does not exist filters nothing, as
            // on 15 (start-up probes only the captured tables).
            let exists: Option<String> = eval
                .query_one(
                    "SELECT to_regclass($1)::text",
                    &[&format!("{}.{}", quote_ident(schema), quote_ident(name))],
                )
                .await
                .map_err(CaptureError::pg("look up a filtered table"))?
                .get(0);
            if exists.is_none() {
                continue;
            }
            let probed = probe(&eval, schema, name, filter).await?;
            filters.insert(table.clone(), (filter.clone(), probed.columns));
        }
        tracing::info!(
            tables = filters.len(),
            "the server has no publication row filters (PostgreSQL 15+): capture evaluates table.filter on the stream"
        );
        Ok(Some(StreamFilter {
            eval,
            filters,
            relations: HashMap::new(),
            held: Vec::new(),
            held_rows: 0,
            due: false,
            ready: VecDeque::new(),
        }))
    }

    /// The next event as the publication would have filtered it.
    /// Cancel-safe: what was read is kept in `self`, and an evaluation
    /// cut short runs again.
    pub(crate) async fn recv(
        &mut self,
        client: &mut ReplicationClient,
    ) -> Result<Option<ReplicationEvent>, CaptureError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if self.due {
                self.evaluate().await?;
                continue;
            }
            match client.recv().await? {
                Some(event) => self.take(event)?,
                // What is held is a transaction cut short: never complete.
                None => return Ok(None),
            }
        }
    }

    /// Holds `event` from its transaction's first filtered change on.
    fn take(&mut self, event: ReplicationEvent) -> Result<(), CaptureError> {
        let row = match &event {
            ReplicationEvent::XLogData { data, .. } => self.inspect(data)?,
            _ => None,
        };
        let commit = matches!(event, ReplicationEvent::Commit { .. });
        if row.is_none() && self.held.is_empty() {
            self.ready.push_back(event);
            return Ok(());
        }
        self.held_rows += usize::from(row.is_some());
        self.held.push(Held { event, row });
        self.due = commit || self.held_rows >= HELD_ROWS || self.held.len() >= HELD_EVENTS;
        Ok(())
    }

    /// Notes a Relation; decodes a change of a filtered table.
    fn inspect(&mut self, data: &Bytes) -> Result<Option<HeldRow>, CaptureError> {
        let decode = |data: &Bytes| {
            pgoutput::decode(data.clone()).map_err(|e| CaptureError::Protocol(e.to_string()))
        };
        match data.first() {
            Some(&tag::RELATION) => {
                if let LogicalMessage::Relation(relation) = decode(data)? {
                    self.note_relation(relation)?;
                }
                Ok(None)
            }
            Some(&(tag::INSERT | tag::UPDATE | tag::DELETE)) if data.len() >= 5 => {
                let id = u32::from_be_bytes([data[1], data[2], data[3], data[4]]);
                let Some(eval) = self.relations.get(&id) else {
                    return Ok(None);
                };
                Ok(Some(HeldRow {
                    eval: Arc::clone(eval),
                    msg: decode(data)?,
                }))
            }
            _ => Ok(None),
        }
    }

    fn note_relation(&mut self, relation: Relation) -> Result<(), CaptureError> {
        let key = format!("{}.{}", relation.namespace, relation.name);
        let Some((filter, names)) = self.filters.get(&key) else {
            self.relations.remove(&relation.id);
            return Ok(());
        };
        let columns = names
            .iter()
            .map(|name| {
                relation.columns.iter().position(|c| &c.name == name).ok_or_else(|| {
                    CaptureError::Prerequisite(format!(
                        "the row filter of {key} reads column {name}, which the table no longer has: change table.filter and restart capture"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.relations.insert(
            relation.id,
            Arc::new(Evaluator {
                filter: filter.clone(),
                columns,
                relation,
                statement: tokio::sync::OnceCell::new(),
            }),
        );
        Ok(())
    }

    /// Evaluates the held changes (one pipelined query per table) and
    /// releases the held events as the publication would have sent them.
    async fn evaluate(&mut self) -> Result<(), CaptureError> {
        let images = held_images(&self.held);
        let mut tables: Vec<(Arc<Evaluator>, Vec<&TupleData>)> = Vec::new();
        let mut slots = Vec::with_capacity(images.len());
        for (eval, image) in &images {
            let at = match tables.iter().position(|(e, _)| Arc::ptr_eq(e, eval)) {
                Some(at) => at,
                None => {
                    tables.push((Arc::clone(eval), Vec::new()));
                    tables.len() - 1
                }
            };
            slots.push((at, tables[at].1.len()));
            tables[at].1.push(image);
        }
        let eval = &self.eval;
        let results =
            futures::future::try_join_all(tables.iter().map(|(e, rows)| e.run(eval, rows))).await?;
        let mut matches = slots.into_iter().map(|(t, i)| results[t][i]);
        for held in std::mem::take(&mut self.held) {
            let Some(row) = held.row else {
                self.ready.push_back(held.event);
                continue;
            };
            let (old, new) = match &row.msg {
                LogicalMessage::Insert { .. } => (None, matches.next()),
                LogicalMessage::Delete { .. } => (matches.next(), None),
                LogicalMessage::Update { old, .. } => {
                    let old = old.as_ref().and_then(|_| matches.next());
                    (old, matches.next())
                }
                _ => (None, None),
            };
            if let Some(event) = publish(held.event, &row.msg, decide(old, new)) {
                self.ready.push_back(event);
            }
        }
        self.held_rows = 0;
        self.due = false;
        Ok(())
    }
}

/// The images each held change is judged by, in order: an insert's new
/// row, a delete's old row, an update's old row (if sent) then its new row
/// with the unchanged TOAST values the old row holds filled in.
fn held_images(held: &[Held]) -> Vec<(Arc<Evaluator>, TupleData)> {
    let mut images = Vec::new();
    for row in held.iter().filter_map(|h| h.row.as_ref()) {
        let eval = || Arc::clone(&row.eval);
        match &row.msg {
            LogicalMessage::Insert { new, .. } => images.push((eval(), new.clone())),
            LogicalMessage::Delete { old, .. } => images.push((eval(), old.row().clone())),
            LogicalMessage::Update { old, new, .. } => {
                if let Some(old) = old {
                    images.push((eval(), old.row().clone()));
                }
                images.push((eval(), filled(new, old.as_ref())));
            }
            _ => {}
        }
    }
    images
}

/// `new` with its unchanged TOAST values taken from a full old row, as
/// PostgreSQL 15 evaluates and sends an UPDATE's new row.
fn filled(new: &TupleData, old: Option<&OldTuple>) -> TupleData {
    let Some(OldTuple::Full(old)) = old else {
        return new.clone();
    };
    TupleData(
        new.0
            .iter()
            .zip(&old.0)
            .map(|(n, o)| match n {
                TupleValue::Unchanged => o.clone(),
                n => n.clone(),
            })
            .collect(),
    )
}

/// The event the publication would have sent for `msg`, if any.
fn publish(
    event: ReplicationEvent,
    msg: &LogicalMessage,
    verdict: Verdict,
) -> Option<ReplicationEvent> {
    let rewritten = match (verdict, msg) {
        (Verdict::Drop, _) => return None,
        (Verdict::AsIs, _) => return Some(event),
        (
            Verdict::AsDelete,
            LogicalMessage::Update {
                relation_id,
                old: Some(old),
                ..
            },
        ) => LogicalMessage::Delete {
            relation_id: *relation_id,
            old: old.clone(),
        },
        (
            Verdict::AsInsert,
            LogicalMessage::Update {
                relation_id,
                old,
                new,
            },
        ) => LogicalMessage::Insert {
            relation_id: *relation_id,
            new: filled(new, old.as_ref()),
        },
        _ => return Some(event),
    };
    match event {
        ReplicationEvent::XLogData {
            wal_start,
            wal_end,
            server_time_micros,
            ..
        } => Some(ReplicationEvent::XLogData {
            wal_start,
            wal_end,
            server_time_micros,
            data: Bytes::from(pgoutput::encode(&rewritten)),
        }),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, publish, Verdict};
    use crate::sources::postgres::pgoutput::{
        self, LogicalMessage, OldTuple, TupleData, TupleValue,
    };
    use bytes::Bytes;
    use pgwire_replication::{Lsn, ReplicationEvent};

    #[test]
    fn the_publications_decision_table() {
        // INSERT: the new row; DELETE: the old row.
        assert_eq!(decide(None, Some(true)), Verdict::AsIs);
        assert_eq!(decide(None, Some(false)), Verdict::Drop);
        assert_eq!(decide(Some(true), None), Verdict::AsIs);
        assert_eq!(decide(Some(false), None), Verdict::Drop);
        // UPDATE with both rows.
        assert_eq!(decide(Some(true), Some(true)), Verdict::AsIs);
        assert_eq!(decide(Some(true), Some(false)), Verdict::AsDelete);
        assert_eq!(decide(Some(false), Some(true)), Verdict::AsInsert);
        assert_eq!(decide(Some(false), Some(false)), Verdict::Drop);
        assert_eq!(decide(None, None), Verdict::Drop);
    }

    fn text(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn xlog(msg: &LogicalMessage) -> ReplicationEvent {
        ReplicationEvent::XLogData {
            wal_start: Lsn::from_u64(7),
            wal_end: Lsn::from_u64(9),
            server_time_micros: 1,
            data: Bytes::from(pgoutput::encode(msg)),
        }
    }

    fn decoded(event: Option<ReplicationEvent>) -> Option<LogicalMessage> {
        match event? {
            ReplicationEvent::XLogData { data, .. } => Some(pgoutput::decode(data).unwrap()),
            _ => None,
        }
    }

    #[test]
    fn an_update_leaving_the_filter_is_its_old_rows_delete_and_one_entering_its_filled_insert() {
        let old = OldTuple::Full(TupleData(vec![text("1"), text("eu"), text("big")]));
        let update = LogicalMessage::Update {
            relation_id: 5,
            old: Some(old.clone()),
            new: TupleData(vec![text("1"), text("us"), TupleValue::Unchanged]),
        };
        assert_eq!(
            decoded(publish(xlog(&update), &update, Verdict::AsDelete)),
            Some(LogicalMessage::Delete {
                relation_id: 5,
                old
            })
        );
        assert_eq!(
            decoded(publish(xlog(&update), &update, Verdict::AsInsert)),
            Some(LogicalMessage::Insert {
                relation_id: 5,
                new: TupleData(vec![text("1"), text("us"), text("big")]),
            })
        );
        assert_eq!(
            decoded(publish(xlog(&update), &update, Verdict::AsIs)),
            Some(update.clone())
        );
        assert!(publish(xlog(&update), &update, Verdict::Drop).is_none());
    }
}
