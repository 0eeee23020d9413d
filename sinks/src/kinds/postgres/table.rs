//! Target tables: what exists (cached from the catalog), and the DDL that creates
//! missing tables, adds missing columns, widens columns an event describes as
//! wider ([`super::compat::widened`]) and changes the type of a column to
//! another family that also takes its old values ([`super::compat::retyped`]),
//! and moves a column to a new generation when neither works
//! ([`super::generation`], [`Catalog::follow_types`]).
//! Columns are never narrowed; renames and drops follow the source by attnum
//! ([`super::identity`]).
//!
//! Every target table has, beside the source columns:
//!
//! | column | meaning |
//! | --- | --- |
//! | `__oncely_lsn`, `__oncely_seq` | the version of the last applied change (commit LSN, ordinal) |
//! | `__oncely_deleted` | true once a delete (or a truncate) applied: a tombstone |
//! | `__oncely_unavailable` | JSON array of columns whose value was unavailable (unchanged TOAST) in the last change; their stored value was kept |
//!
//! DDL runs in its own short transaction under a transaction-level advisory lock
//! on the table's name, so several workers or runners creating one table queue up.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::{Client, GenericClient};
use oncely_core::sql::quote_ident as quote;

use super::compat::{retyped, widened};
use super::error::{classify, to_sink_error, Class};
use super::generation::{self, fit, next_generation, Fit, Live, Retired};
use super::source_ids::{ColumnId, TableId};
use super::types::ColumnSpec;
use crate::error::SinkError;
use crate::event::Version;

/// Version column: commit LSN (its default name).
pub const LSN: &str = "__oncely_lsn";
/// Version column: ordinal in the transaction (its default name).
pub const SEQ: &str = "__oncely_seq";
/// Tombstone flag (its default name).
pub const DELETED: &str = "__oncely_deleted";
/// Columns kept from the stored row in the last change (its default name).
pub const UNAVAILABLE_COLUMNS: &str = "__oncely_unavailable";

/// The names of the sink's own columns: `meta.column.prefix` followed by
/// `lsn`, `seq`, `deleted`, `unavailable`. A source column may not have one
/// of them (see [`MetaColumns::clash`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaColumns {
    pub lsn: String,
    pub seq: String,
    pub deleted: String,
    pub unavailable: String,
}

impl Default for MetaColumns {
    fn default() -> Self {
        Self::new(super::config::DEFAULT_META_COLUMN_PREFIX)
    }
}

impl MetaColumns {
    pub fn new(prefix: &str) -> Self {
        Self {
            lsn: format!("{prefix}lsn"),
            seq: format!("{prefix}seq"),
            deleted: format!("{prefix}deleted"),
            unavailable: format!("{prefix}unavailable"),
        }
    }

    /// The prefix the names share (`meta.column.prefix`), which also starts
    /// the names of retired column generations ([`super::generation`]).
    pub fn prefix(&self) -> &str {
        self.lsn.strip_suffix("lsn").unwrap_or_default()
    }

    /// The four names.
    pub fn all(&self) -> [&str; 4] {
        [&self.lsn, &self.seq, &self.deleted, &self.unavailable]
    }

    /// A quarantine when source column `column` of `table` has the name of
    /// one of these: `CREATE TABLE` would fail (SQLSTATE 42701), or worse, the
    /// sink would write its bookkeeping into the source's column.
    pub fn clash(&self, table: &str, column: &str) -> Result<(), SinkError> {
        if self.all().contains(&column) {
            return Err(SinkError::quarantine(format!(
                "source column {column:?} of the table mirrored into {table} has the name of one of the warehouse sink's own columns ({}): set sink.meta.column.prefix to a prefix no source column starts with (e.g. meta.column.prefix = \"_oncely_meta_\"); tables the sink created before keep their old column names, so a new prefix needs a new target.schema or table.name.format",
                self.all().join(", ")
            )));
        }
        // `<prefix>g<N>_<name>` is the name of a retired column generation
        // (`generation::retired_name`): a source column of that name would be
        // taken for one, its values read as another column's old ones.
        let retired = column
            .strip_prefix(self.prefix())
            .and_then(|rest| rest.strip_prefix('g'))
            .and_then(|rest| rest.split_once('_'))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if retired {
            return Err(SinkError::quarantine(format!(
                "source column {column:?} of the table mirrored into {table} has the name of a retired column generation of the warehouse sink ({}g<N>_<column>): set sink.meta.column.prefix to a prefix no source column starts with (e.g. meta.column.prefix = \"_oncely_meta_\"); tables the sink created before keep their old column names, so a new prefix needs a new target.schema or table.name.format",
                self.prefix()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod clash_tests {
    use super::*;

    #[test]
    fn source_columns_named_like_meta_or_retired_columns_are_quarantined() {
        let meta = MetaColumns::default();
        for column in ["__oncely_deleted", "__oncely_g1_x", "__oncely_g12_flag"] {
            let err = meta.clash("w.t", column).expect_err(column);
            assert!(err.is_quarantine(), "{column}: {err}");
        }
        for column in ["x", "__oncely_g_x", "__oncely_gx_y", "__oncely_g1", "g1_x"] {
            assert!(meta.clash("w.t", column).is_ok(), "{column}");
        }
        let other = MetaColumns::new("_m_");
        assert!(other.clash("w.t", "_m_g2_code").is_err());
        assert!(other.clash("w.t", "__oncely_g1_x").is_ok());
    }
}

/// An existing table: its columns (name -> `format_type`) and primary key.
#[derive(Debug, Clone, Default)]
pub struct TableInfo {
    /// Schema-qualified, quoted name.
    pub qualified: String,
    /// Column name -> type as `format_type` prints it.
    pub columns: HashMap<String, String>,
    /// Primary-key column names, sorted.
    pub key: Vec<String>,
    /// The sink's own columns.
    pub meta: Arc<MetaColumns>,
    /// Column name -> its recorded source column (column comment).
    pub ids: HashMap<String, ColumnId>,
    /// The recorded source table (table comment).
    pub source: Option<TableId>,
    /// Recorded attnum -> column name (`ids` inverted).
    pub by_attnum: HashMap<i16, String>,
    /// Column name -> its comment, as it is.
    pub comments: HashMap<String, String>,
    /// Retired column generations ([`super::generation`]).
    pub retired: Vec<Retired>,
}

impl TableInfo {
    /// Column `column` as events are checked against it: its type and the
    /// version from which it holds it (`oncely.since`, else `oncely.at`);
    /// `None` when the table has no such column or it is a retired one.
    pub fn live(&self, column: &str) -> Option<Live<'_>> {
        let ty = self.columns.get(column)?;
        if self.retired.iter().any(|r| r.column == column) {
            return None;
        }
        let comment = self.comments.get(column).map(String::as_str);
        Some(Live {
            ty,
            since: comment
                .and_then(generation::since_of)
                .or_else(|| self.ids.get(column).map(|id| id.at)),
            key: self.key.iter().any(|k| k == column),
        })
    }

    /// The retired generations of live column `column`, newest first.
    pub fn retired_of(&self, column: &str) -> Vec<&Retired> {
        let attnum = self.ids.get(column).map(|id| id.attnum);
        let mut out: Vec<&Retired> = self
            .retired
            .iter()
            .filter(|r| r.of(column, attnum, self.meta.prefix()))
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.generation));
        out
    }

    /// Where a field of `spec` of a row at `version` goes ([`generation::fit`]).
    pub fn fit(&self, column: &str, spec: &ColumnSpec, version: Version) -> Fit {
        match self.live(column) {
            Some(live) => fit(spec, version, live, &self.retired_of(column)),
            None => Fit::Live,
        }
    }

    /// The column recorded as source column `attnum`.
    pub fn column_of(&self, attnum: i16) -> Option<&str> {
        self.by_attnum.get(&attnum).map(String::as_str)
    }

    /// Whether the table has every `wanted` column and the sink's own columns
    /// (then [`Catalog::ensure_target`] returns it unchanged).
    pub fn has_columns(&self, wanted: &BTreeMap<&str, ColumnSpec>) -> bool {
        wanted
            .keys()
            .chain(self.meta.all().iter())
            .all(|c| self.columns.contains_key(*c))
    }

    /// A quarantine when this table, wanted as a mirror table, is a history
    /// table the sink created (key `(lsn, seq)`, `kafka_offset`, none of the
    /// sink's row columns): one source table's mirror name is another's
    /// history name. The process's claims ([`crate::naming::TargetClaims`])
    /// catch that when it saw both tables; this catches it after a restart
    /// too, before any DDL or row touches the table.
    pub fn refuse_history(&self) -> Result<(), SinkError> {
        let history = self.key == ["lsn", "seq"]
            && self.columns.contains_key("kafka_offset")
            && !self.columns.contains_key(&self.meta.lsn);
        if history {
            return Err(SinkError::quarantine(format!(
                "the warehouse table {} is the history table of another source table, and a source table's rows would be mirrored into it: change sink.table.name.format or sink.history.table.name.format so that no mirror table is named like a history table (e.g. a history suffix no source table name ends with)",
                self.qualified
            )));
        }
        Ok(())
    }

    /// A quarantine when this table, wanted as a history table, is a
    /// mirror table (it has the sink's version column): the other way round
    /// of [`TableInfo::refuse_history`].
    pub fn refuse_mirror(&self) -> Result<(), SinkError> {
        if self.columns.contains_key(&self.meta.lsn) {
            return Err(SinkError::quarantine(format!(
                "the warehouse table {} mirrors another source table, and a source table's history would be appended to it: change sink.table.name.format or sink.history.table.name.format so that no history table is named like a mirror table (e.g. a history suffix no source table name ends with)",
                self.qualified
            )));
        }
        Ok(())
    }

    /// The columns `wanted` describes as wider than they are, or of another
    /// type that takes their values ([`retyped`]): (column, its type now,
    /// the type holding both).
    pub fn widenings(&self, wanted: &BTreeMap<&str, ColumnSpec>) -> Vec<(String, String, String)> {
        wanted
            .iter()
            .filter_map(|(name, spec)| {
                let actual = self.columns.get(*name)?;
                let to = widened(spec, actual).or_else(|| retyped(spec, actual))?;
                Some(((*name).to_owned(), actual.clone(), to))
            })
            .collect()
    }
}

/// Cache of target tables, shared by all workers.
pub struct Catalog {
    schema: String,
    meta: Arc<MetaColumns>,
    tables: Mutex<HashMap<String, Arc<TableInfo>>>,
    /// Type changes whose cast failed on values the column holds
    /// (qualified table, column, type): not tried again by this process;
    /// the rows wanting them are type conflicts (dead letters).
    refused: Mutex<HashSet<(String, String, String)>>,
}

impl Catalog {
    /// An empty cache for tables in `schema`, with the sink's own columns named by `meta`.
    pub fn new(schema: &str, meta: MetaColumns) -> Self {
        Self {
            schema: schema.to_owned(),
            meta: Arc::new(meta),
            tables: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashSet::new()),
        }
    }

    /// Schema-qualified, quoted name of `table`.
    pub fn qualified(&self, table: &str) -> String {
        format!("{}.{}", quote(&self.schema), quote(table))
    }

    /// A quarantine when source column `column` of `table` is named like
    /// one of the sink's own columns or a retired generation
    /// ([`MetaColumns::clash`]).
    pub fn clash(&self, table: &str, column: &str) -> Result<(), SinkError> {
        self.meta.clash(&self.qualified(table), column)
    }

    /// Forgets every cached table (after an error that may come from a changed catalog).
    pub fn invalidate(&self) {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The cached table, without asking the server.
    pub fn cached(&self, table: &str) -> Option<Arc<TableInfo>> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(table)
            .cloned()
    }

    /// The table as it exists now, or `None` (cached once found).
    pub async fn lookup(
        &self,
        client: &Client,
        table: &str,
    ) -> Result<Option<Arc<TableInfo>>, SinkError> {
        if let Some(t) = self.cached(table) {
            return Ok(Some(t));
        }
        let info = load(client, &self.qualified(table), &self.meta).await?;
        Ok(info.map(|info| {
            let info = Arc::new(info);
            self.tables
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(table.to_owned(), info.clone());
            info
        }))
    }

    /// Creates the target table or adds the `wanted` columns it lacks, and
    /// widens the columns `wanted` describes as wider; returns it as it is then.
    pub async fn ensure_target(
        &self,
        client: &mut Client,
        table: &str,
        key: &[&str],
        wanted: &BTreeMap<&str, ColumnSpec>,
    ) -> Result<Arc<TableInfo>, SinkError> {
        if let Some(t) = self.lookup(client, table).await? {
            t.refuse_history()?;
            if t.has_columns(wanted) {
                if self.changes(&t, wanted).is_empty() {
                    return Ok(t);
                }
                return self.widen(client, table, wanted).await;
            }
        }
        let q = self.qualified(table);
        let m = &self.meta;
        let mut columns: Vec<String> = wanted
            .iter()
            .map(|(name, spec)| {
                let not_null = if key.contains(name) { " NOT NULL" } else { "" };
                format!("{} {}{not_null}", quote(name), spec.ddl)
            })
            .collect();
        columns.push(format!("{} bigint NOT NULL", quote(&m.lsn)));
        columns.push(format!("{} bigint NOT NULL", quote(&m.seq)));
        columns.push(format!(
            "{} boolean NOT NULL DEFAULT false",
            quote(&m.deleted)
        ));
        columns.push(format!("{} jsonb", quote(&m.unavailable)));
        let keys: Vec<String> = key.iter().map(|k| quote(k)).collect();
        let mut ddl_text = format!(
            "CREATE TABLE IF NOT EXISTS {q} ({}, PRIMARY KEY ({}));",
            columns.join(", "),
            keys.join(", ")
        );
        // A table created by someone else gets the sink's columns too (rows
        // already there count as version 0, older than any change).
        for (name, ddl) in [
            (m.lsn.as_str(), "bigint NOT NULL DEFAULT 0"),
            (m.seq.as_str(), "bigint NOT NULL DEFAULT 0"),
            (m.deleted.as_str(), "boolean NOT NULL DEFAULT false"),
            (m.unavailable.as_str(), "jsonb"),
        ] {
            ddl_text_push(&mut ddl_text, &q, name, ddl);
        }
        for (name, spec) in wanted {
            ddl_text_push(&mut ddl_text, &q, name, &spec.ddl);
        }
        let t = self.run_ddl(client, table, &ddl_text).await?;
        if self.changes(&t, wanted).is_empty() {
            return Ok(t);
        }
        self.widen(client, table, wanted).await
    }

    /// [`TableInfo::widenings`] of `t` less the type changes refused before.
    fn changes(
        &self,
        t: &TableInfo,
        wanted: &BTreeMap<&str, ColumnSpec>,
    ) -> Vec<(String, String, String)> {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        t.widenings(wanted)
            .into_iter()
            .filter(|(column, _, to)| {
                !refused.contains(&(t.qualified.clone(), column.clone(), to.clone()))
            })
            .collect()
    }

    /// Alters the columns of `table` that `wanted` describes as wider or of
    /// another type taking their values, each to the type holding both,
    /// decided again under the DDL lock from the catalog as it is then:
    /// another worker may have changed it meanwhile, and deciding from a
    /// stale cache could narrow what it did. Each column is cast
    /// (`USING column::type`: PostgreSQL's own conversion, the one the
    /// source's `ALTER ... TYPE` made) under a savepoint: a cast that fails
    /// on a value the column holds (a data error) leaves that column as it
    /// is, logged and not tried again, and its rows stay type conflicts;
    /// rows of the backfill capture sends after the source's change rewrite
    /// the values of the others.
    async fn widen(
        &self,
        client: &mut Client,
        table: &str,
        wanted: &BTreeMap<&str, ColumnSpec>,
    ) -> Result<Arc<TableInfo>, SinkError> {
        let q = self.qualified(table);
        let tx = begin_locked(client, &q).await?;
        let current = load(&tx, &q, &self.meta)
            .await?
            .ok_or_else(|| SinkError::retriable(format!("{q} vanished before its DDL")))?;
        for (column, from, to) in self.changes(&current, wanted) {
            tracing::info!(table = %q, column = %column, from = %from, to = %to, "changing the type of a warehouse column");
            let c = quote(&column);
            let ddl = format!(
                "SAVEPOINT oncely_retype; ALTER TABLE {q} ALTER COLUMN {c} TYPE {to} USING {c}::{to}"
            );
            match tx.batch_execute(&ddl).await {
                Ok(()) => {}
                Err(e) if classify(&e) == Class::Record => {
                    tracing::warn!(table = %q, column = %column, from = %from, to = %to, error = %e,
                        "a value the warehouse column holds does not cast to the new type: the column is left as it is and rows of the new type are dead-lettered; alter the column yourself, then snapshot the table");
                    tx.batch_execute("ROLLBACK TO SAVEPOINT oncely_retype")
                        .await
                        .map_err(|e| to_sink_error("roll back a failed type change", e))?;
                    self.refused
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert((q.clone(), column, to));
                }
                Err(e) => return Err(to_sink_error(&format!("change the type of {c} of {q}"), e)),
            }
        }
        tx.commit()
            .await
            .map_err(|e| to_sink_error("commit DDL", e))?;
        self.reload(client, table).await
    }

    /// Makes the columns of `table` follow type changes newer than their
    /// type ([`Fit::Change`]): each (column, the spec of the newest row
    /// wanting it, the oldest version wanting it), decided again under the
    /// DDL lock from the catalog as it is then (another worker may have done
    /// it). A one-way change ([`retyped`]) casts the column (`USING
    /// column::type`); a change neither way, or a cast failing on a value the
    /// column holds (under a savepoint), moves the column to a new
    /// generation ([`generation::move_statements`]). One transaction: a
    /// process killed half-way leaves the table as it was. The column then
    /// records the version from which it holds its type (`oncely.since`).
    pub async fn follow_types(
        &self,
        client: &mut Client,
        table: &str,
        changes: &[(String, ColumnSpec, Version)],
    ) -> Result<Arc<TableInfo>, SinkError> {
        let q = self.qualified(table);
        let tx = begin_locked(client, &q).await?;
        let current = load(&tx, &q, &self.meta)
            .await?
            .ok_or_else(|| SinkError::retriable(format!("{q} vanished before its DDL")))?;
        for (column, spec, since) in changes {
            if current.fit(column, spec, *since) != Fit::Change {
                continue;
            }
            let Some(live) = current.live(column) else {
                continue;
            };
            let comment = current.comments.get(column).map(String::as_str);
            let c = quote(column);
            if let Some(to) = retyped(spec, live.ty) {
                tracing::info!(table = %q, column = %column, from = %live.ty, to = %to, "changing the type of a warehouse column");
                let ddl = format!(
                    "SAVEPOINT oncely_retype; ALTER TABLE {q} ALTER COLUMN {c} TYPE {to} USING {c}::{to}; {}",
                    generation::since_statement(&q, column, comment, *since)
                );
                match tx.batch_execute(&ddl).await {
                    Ok(()) => continue,
                    Err(e) if classify(&e) == Class::Record => {
                        tracing::info!(table = %q, column = %column, to = %to, error = %e,
                            "a value the warehouse column holds does not cast to the new type: the column moves to a new generation instead");
                        tx.batch_execute("ROLLBACK TO SAVEPOINT oncely_retype")
                            .await
                            .map_err(|e| to_sink_error("roll back a failed type change", e))?;
                    }
                    Err(e) => {
                        return Err(to_sink_error(&format!("change the type of {c} of {q}"), e))
                    }
                }
            }
            let attnum = current.ids.get(column).map(|id| id.attnum);
            let generations = current
                .retired_of(column)
                .iter()
                .map(|r| r.generation)
                .collect::<Vec<_>>();
            let (n, retired) = next_generation(
                self.meta.prefix(),
                column,
                generations.into_iter(),
                |name| current.columns.contains_key(name),
            );
            tracing::info!(table = %q, column = %column, from = %live.ty, to = %spec.ddl, retired = %retired,
                "the warehouse column cannot follow the source's type by a cast: it moves to a new generation, its old values kept in the retired column");
            let ddl = generation::move_statements(
                &q,
                (column, comment, attnum),
                (n, &retired),
                &spec.ddl,
                *since,
            );
            tx.batch_execute(&ddl.join(";\n"))
                .await
                .map_err(|e| to_sink_error(&format!("move {c} of {q} to a new generation"), e))?;
        }
        tx.commit()
            .await
            .map_err(|e| to_sink_error("commit DDL", e))?;
        self.reload(client, table).await
    }

    /// Whether the columns of table `info` differ from what the catalog
    /// says now (another process changed them while a batch was written);
    /// forgets the cached tables when they do.
    pub async fn changed(&self, client: &Client, info: &TableInfo) -> Result<bool, SinkError> {
        let now = load(client, &info.qualified, &self.meta).await?;
        let changed = now.is_none_or(|t| t.columns != info.columns);
        if changed {
            self.invalidate();
        }
        Ok(changed)
    }

    /// Runs `decide(info)` as it is under the table's DDL lock (another
    /// worker may have changed it since it was cached) and the statements it
    /// returns; `table` as it is then. Used for the attnum bookkeeping
    /// ([`super::identity`]): renames, drops, comments.
    pub async fn alter_with(
        &self,
        client: &mut Client,
        table: &str,
        decide: impl Fn(&TableInfo) -> Vec<String>,
    ) -> Result<Arc<TableInfo>, SinkError> {
        let q = self.qualified(table);
        let tx = begin_locked(client, &q).await?;
        let current = load(&tx, &q, &self.meta)
            .await?
            .ok_or_else(|| SinkError::retriable(format!("{q} vanished before its DDL")))?;
        let statements = decide(&current);
        if !statements.is_empty() {
            tx.batch_execute(&statements.join(";\n"))
                .await
                .map_err(|e| to_sink_error(&format!("rename, drop or record columns of {q}"), e))?;
        }
        tx.commit()
            .await
            .map_err(|e| to_sink_error("commit DDL", e))?;
        self.reload(client, table).await
    }

    /// Creates the history table `table` when missing.
    pub async fn ensure_history(
        &self,
        client: &mut Client,
        table: &str,
    ) -> Result<Arc<TableInfo>, SinkError> {
        if let Some(t) = self.lookup(client, table).await? {
            t.refuse_mirror()?;
            return Ok(t);
        }
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {} (lsn bigint NOT NULL, seq bigint NOT NULL, op text NOT NULL, \
             key jsonb, before jsonb, after jsonb, source jsonb NOT NULL, ts_ms bigint, \
             kafka_topic text NOT NULL, kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (lsn, seq))",
            self.qualified(table)
        );
        self.run_ddl(client, table, &ddl).await
    }

    /// `table` read again from the catalog after its DDL.
    async fn reload(&self, client: &Client, table: &str) -> Result<Arc<TableInfo>, SinkError> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(table);
        self.lookup(client, table).await?.ok_or_else(|| {
            SinkError::retriable(format!(
                "{} vanished right after its DDL",
                self.qualified(table)
            ))
        })
    }

    async fn run_ddl(
        &self,
        client: &mut Client,
        table: &str,
        ddl: &str,
    ) -> Result<Arc<TableInfo>, SinkError> {
        let q = self.qualified(table);
        let tx = begin_locked(client, &q).await?;
        tx.batch_execute(ddl)
            .await
            .map_err(|e| to_sink_error(&format!("create or alter {q}"), e))?;
        tx.commit()
            .await
            .map_err(|e| to_sink_error("commit DDL", e))?;
        self.reload(client, table).await
    }
}

/// A transaction holding the DDL lock of the table `qualified` (a
/// transaction-level advisory lock on its name).
async fn begin_locked<'c>(
    client: &'c mut Client,
    qualified: &str,
) -> Result<deadpool_postgres::Transaction<'c>, SinkError> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| to_sink_error("begin DDL", e))?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&qualified])
        .await
        .map_err(|e| to_sink_error("lock for DDL", e))?;
    Ok(tx)
}

fn ddl_text_push(ddl: &mut String, table: &str, column: &str, ty: &str) {
    ddl.push_str(&format!(
        "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {} {ty};",
        quote(column)
    ));
}

async fn load(
    client: &impl GenericClient,
    qualified: &str,
    meta: &Arc<MetaColumns>,
) -> Result<Option<TableInfo>, SinkError> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    coalesce(a.attnum = ANY(i.indkey), false), \
                    col_description(a.attrelid, a.attnum), obj_description(a.attrelid, 'pg_class') \
             FROM pg_attribute a \
             LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            &[&qualified],
        )
        .await
        .map_err(|e| to_sink_error(&format!("read the columns of {qualified}"), e))?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut info = TableInfo {
        qualified: qualified.to_owned(),
        meta: Arc::clone(meta),
        ..TableInfo::default()
    };
    for r in rows {
        let name: String = r.get(0);
        if r.get::<_, bool>(2) {
            info.key.push(name.clone());
        }
        let comment = r.get::<_, Option<&str>>(3);
        let ty: String = r.get(1);
        if let Some(retired) = comment.and_then(|c| Retired::parse(&name, &ty, c)) {
            // A retired generation is no source column (its attnum is the live column's).
            info.retired.push(retired);
        } else if let Some(id) = comment.and_then(ColumnId::parse) {
            info.ids.insert(name.clone(), id);
            info.by_attnum.insert(id.attnum, name.clone());
        }
        if let Some(c) = comment {
            info.comments.insert(name.clone(), c.to_owned());
        }
        if info.source.is_none() {
            info.source = r.get::<_, Option<&str>>(4).and_then(TableId::parse);
        }
        info.columns.insert(name, ty);
    }
    info.key.sort();
    Ok(Some(info))
}
