//! `postgres`: the warehouse sink. Mirrors each captured table into a target table so
//! that, after any crash, every target row equals its source row; optionally appends
//! every change to a history table. It **owns its positions**.
//!
//! # How a batch is applied
//!
//! 1. **Plan** ([`plan`]; ahead of `apply` in [`Sink::prepare`], while the
//!    previous batch is written, else in `apply`): per target table, the changes of the batch collapse to the
//!    newest per key (an unavailable TOAST value of the newest is filled from an
//!    older change of the same batch when one carried it); a truncate splits the
//!    batch so that what came before it is written before it.
//! 2. **Schema** ([`table`]): missing target tables are created from the event's
//!    columns ([`types`] maps Connect schemas to PostgreSQL types), new columns are
//!    added, renamed source columns renamed and, with
//!    `schema.evolution.drop.columns = "drop"`, dropped ones dropped, matched by
//!    source attnum ([`identity`]); nothing is narrowed. A typed column whose source
//!    type changed to one it cannot be cast to moves to a new generation, the
//!    old one kept as a retired column that events from before the change
//!    still write ([`generation`]). A value whose type an existing column
//!    cannot take otherwise (schemas off, key columns) is a per-record failure
//!    (dead letter) naming the column and both types.
//! 3. **Write** ([`write`]): one transaction holds set-based statements — one
//!    `INSERT ... SELECT FROM unnest(...) ON CONFLICT (key) DO UPDATE ... WHERE
//!    (stored lsn, seq) < (incoming lsn, seq)` per table and column list, the
//!    history inserts (`ON CONFLICT (lsn, seq) DO NOTHING`) — **and the batch's
//!    position** in the positions table, keyed by (group, topic, partition). On
//!    assignment the runner seeks to the stored positions, so each record is
//!    applied once; the version guard also makes replays of older changes harmless.
//!    A batch that is one such statement (one table, one column list) is written
//!    as a single statement with its position, without `BEGIN`/`COMMIT`; when
//!    the catalog already knows its table as needed, `prepare` builds that
//!    statement and encodes its arrays ahead (see `Prepared`).
//!
//! # Rows, deletes, truncates, TOAST
//!
//! * A delete keeps a **tombstone**: `__oncely_deleted = true` with the delete's
//!   version (other columns keep their last values), so a replayed older insert
//!   cannot resurrect the row. Query live rows with `WHERE NOT __oncely_deleted`.
//!   `delete.mode = "hard"` removes the row instead and loses that protection.
//! * `truncate.mode`: `delete` (default) turns every older row into a tombstone;
//!   `truncate` deletes every older row, tombstones too (losing the
//!   protection); `ignore`. Both are version-guarded, so the copy of a
//!   truncate that capture puts on each partition of a topic is applied
//!   once per partition without touching rows newer than the truncate.
//! * A column carrying `__debezium_unavailable_value` (unchanged TOAST) keeps the
//!   stored value; on a row not stored yet it is NULL.
//!
//! # Limits
//!
//! * Versions of Debezium-written topics fall back to `source.lsn` (see
//!   [`crate::event`]); their history rows are keyed by that LSN and the
//!   record's partition and offset ([`crate::ChangeEvent::unique_position`]).
//! * Tables without a primary key (null record key) cannot be upserted: such records
//!   are dead-lettered unless only history is enabled.
//!
//! # TLS
//!
//! `sslmode` follows libpq: `disable` (default), `prefer` (TLS if offered,
//! certificate not checked), `require` (TLS, certificate not checked — or its
//! chain when `sslrootcert` is set), `verify-ca` (chain to a CA of
//! `sslrootcert`), `verify-full` (chain and host name); `sslcert` and `sslkey`
//! present a client certificate. TLS is rustls, set up by `oncely-core`'s
//! PostgreSQL connection builder (`oncely_core::postgres`); the URL must not
//! carry its own `sslmode`.

mod compat;
mod config;
mod connect;
mod error;
mod generation;
mod group;
mod identity;
mod plan;
mod resolve;
mod rows;
mod source_ids;
mod statement;
mod table;
mod types;
mod verify_reader;
mod write;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Client, Pool};
use tokio_postgres::error::SqlState;

pub use config::{expand_name, DeleteMode, DropColumns, PostgresConfig, TruncateMode};
pub use connect::{connector, place_of};
pub use table::{MetaColumns, DELETED, LSN, SEQ, UNAVAILABLE_COLUMNS};
pub use verify_reader::PostgresVerifyReader;

use self::error::{classify, pool_error, to_sink_error, Class};
use self::group::{group_rows, sorted_rows, wanted_specs};
use self::plan::{plan, Plan, Step};
use self::statement::Modes;
use self::table::Catalog;
use self::write::{
    find_rejected, store_position, write_all, write_group_with_position, Origin, Prebuilt, Ready,
};
use crate::error::{RecordFailure, SinkError};
use crate::naming::{Owner, TargetClaims};

/// The settings naming the sink's tables, for collision messages.
const TABLE_FORMAT: &str = "sink.table.name.format";
const HISTORY_FORMAT: &str = "sink.history.table.name.format";
const POSITIONS_TABLE: &str = "sink.positions.table";
use crate::sink::{Batch, Positions, Sink, TopicPartition};

#[async_trait]
impl super::SinkKind for PostgresConfig {
    fn validate(&self) -> Result<(), crate::error::ConfigError> {
        PostgresConfig::validate(self)
    }
    fn field_selection(
        &self,
    ) -> Result<Option<crate::fields::FieldSelection>, crate::error::ConfigError> {
        crate::fields::FieldSelection::parse(&self.fields_include, &self.fields_exclude)
    }
    async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(PostgresSink::connect(self).await?))
    }
    async fn verify_reader(
        &self,
        ctx: &crate::verify_reader::VerifyContext<'_>,
    ) -> Option<
        Result<Box<dyn crate::verify_reader::VerifyReader>, crate::verify_reader::VerifyReadError>,
    > {
        let Some(types) = ctx.types else {
            return Some(Err(crate::verify_reader::VerifyReadError::Config(
                "reading the warehouse needs capture's type mapping".into(),
            )));
        };
        let reader = PostgresVerifyReader::connect(self, ctx, types).await;
        Some(reader.map(|m| Box::new(m) as Box<dyn crate::verify_reader::VerifyReader>))
    }
}

/// What [`Sink::prepare`] stores in a batch: its plan and, for a batch that is
/// one group of rows of a table the catalog already knows as needed (the usual
/// case), its statement with the parameters already encoded — the array
/// building and encoding that otherwise runs in `apply`, between two writes,
/// while the target waits. `apply` still resolves the table and groups the
/// rows, and uses the statement only when that gives the very group it was
/// built from, with the same table metadata; otherwise it builds its own.
struct Prepared {
    plan: Plan,
    statement: Option<Prebuilt>,
}

/// The `postgres` sink (see the module docs).
pub struct PostgresSink {
    pool: Pool,
    catalog: Catalog,
    config: PostgresConfig,
    positions: String,
    /// Batches written with the statement built in `prepare`.
    prebuilt_used: AtomicU64,
    /// `host:port/db` for errors: where, never who (no user or password).
    place: String,
    /// Which source table each target table belongs to (`${schema}_${table}`
    /// makes `a_b.c` and `a.b_c` one table), history tables and the positions
    /// table included (`public.orders_history` would mirror into the history
    /// table of `public.orders`, `oncely.positions` into the positions table).
    claims: TargetClaims,
}

impl PostgresSink {
    /// Refuses a batch whose table's mirror or history table another source
    /// table writes to, or is the positions table (claimed at connect): each
    /// table the sink creates is claimed.
    fn claim_tables(&self, batch: &Batch) -> Result<(), SinkError> {
        for (_, schema, table) in batch.table_runs() {
            // A name too long is the record's failure (in the plan).
            let name = |format: &str| expand_name(format, batch.topic(), schema, table);
            if self.config.upsert_enabled {
                if let Some(target) = name(&self.config.table_name_format) {
                    self.claims.claim(&target, schema, table)?;
                }
            }
            if self.config.history_enabled {
                if let Some(target) = name(&self.config.history_table_name_format) {
                    let owner =
                        Owner::of_source("the history table", schema, table, HISTORY_FORMAT);
                    self.claims.claim_as(&target, owner)?;
                }
            }
        }
        Ok(())
    }

    /// How many batches were written with the statement built ahead in
    /// [`Sink::prepare`] (diagnostics and tests).
    pub fn prebuilt_statements_used(&self) -> u64 {
        self.prebuilt_used.load(Ordering::Relaxed)
    }

    fn modes(&self) -> Modes {
        Modes {
            delete: self.config.delete_mode,
            truncate: self.config.truncate_mode,
        }
    }

    /// The statement of a batch whose plan is one group of one table already
    /// known to the catalog as it needs it (no DDL), built and encoded ahead
    /// of `apply` (see [`Prepared`]); `None` for anything else.
    fn prebuild(&self, plan: &Plan, records: &[crate::sink::Record]) -> Option<Prebuilt> {
        if !plan.rejected.is_empty() || !plan.history.is_empty() {
            return None;
        }
        let [Step::Rows(tables)] = plan.steps.as_slice() else {
            return None;
        };
        let [(table, rows)] = tables.iter().collect::<Vec<_>>()[..] else {
            return None;
        };
        let rows = sorted_rows(rows);
        let info = self.catalog.cached(table)?;
        let wanted = wanted_specs(&rows);
        if !info.has_columns(&wanted) || !info.widenings(&wanted).is_empty() {
            return None;
        }
        if let Some(newest) = identity::newest(rows.iter().map(|r| (&*r.shape, r.version))) {
            let drop = self.config.drop_columns;
            if !identity::alterations(&info, newest, drop).is_empty()
                || !identity::records(&info, newest).is_empty()
                || rows.iter().enumerate().any(|(i, r)| {
                    // Rows nearly always share their shape: each is checked once.
                    (i == 0 || !Arc::ptr_eq(&rows[i - 1].shape, &r.shape))
                        && !identity::targets(&info, &r.shape).is_empty()
                })
            {
                return None;
            }
        }
        let mut rejected = Vec::new();
        let groups = group_rows(&info, rows, &mut rejected);
        let ([group], true) = (groups.as_slice(), rejected.is_empty()) else {
            return None;
        };
        Prebuilt::new(info.clone(), group, records, self.modes())
    }

    async fn write(
        &self,
        client: &mut Client,
        steps: &[Ready<'_>],
        batch: &Batch,
        prebuilt: Option<&Prebuilt>,
    ) -> Result<(), tokio_postgres::Error> {
        let origin = Origin {
            topic: batch.topic(),
            partition: batch.partition(),
            records: batch.records(),
        };
        // One group (one table, one column list): a single statement, atomic
        // without a transaction.
        if let [Ready::Rows(info, groups)] = steps {
            if let [group] = groups.as_slice() {
                let target = (self.positions.as_str(), batch);
                let used = write_group_with_position(
                    client,
                    (info, group, prebuilt),
                    &origin,
                    self.modes(),
                    target,
                )
                .await?;
                if used {
                    self.prebuilt_used.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
        }
        let tx = client.transaction().await?;
        // The position is sent right behind the data statements instead of
        // after their replies (one round trip less); it is still only kept by
        // the commit, which waits for both. When a data statement fails, the
        // position's "transaction aborted" error is not the one returned.
        let (data, position) = tokio::join!(
            write_all(&tx, steps, self.modes(), &origin),
            store_position(&tx, &self.positions, batch)
        );
        data?;
        position?;
        tx.commit().await
    }

    /// After a data or integrity error: which records are refused (never commits).
    async fn isolate(
        &self,
        client: &mut Client,
        steps: &[Ready<'_>],
        batch: &Batch,
    ) -> Result<Vec<RecordFailure>, tokio_postgres::Error> {
        let origin = Origin {
            topic: batch.topic(),
            partition: batch.partition(),
            records: batch.records(),
        };
        let mut tx = client.transaction().await?;
        let failures = find_rejected(&mut tx, steps, self.modes(), &origin).await?;
        tx.rollback().await?;
        Ok(failures)
    }
}

#[async_trait]
impl Sink for PostgresSink {
    fn name(&self) -> &str {
        "postgres"
    }

    fn owns_positions(&self) -> bool {
        true
    }

    async fn load_positions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.place))?;
        let topics: Vec<&str> = partitions.iter().map(|tp| tp.topic.as_str()).collect();
        let rows = client
            .query(
                &format!(
                    "SELECT topic, partition, next_offset FROM {} WHERE group_id = $1 AND topic = ANY($2)",
                    self.positions
                ),
                &[&group, &topics],
            )
            .await
            .map_err(|e| to_sink_error("load positions", e))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    TopicPartition::new(r.get::<_, String>(0), r.get(1)),
                    r.get(2),
                )
            })
            .filter(|(tp, _)| partitions.contains(tp))
            .collect())
    }

    /// Plans the batch (see [`plan`]) ahead of `apply`, and builds its statement
    /// when it can (see [`Prepared`]); tables are resolved in `apply`.
    fn prepare(&self, batch: &mut Batch) {
        let plan = plan(&self.config, batch);
        let statement = self.prebuild(&plan, batch.records());
        batch.set_prepared(Prepared { plan, statement });
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        self.claim_tables(batch)?;
        let inline;
        let prepared = batch.prepared::<Prepared>();
        let plan = match prepared {
            Some(p) => &p.plan,
            None => {
                inline = plan(&self.config, batch);
                &inline
            }
        };
        let mut prebuilt = prepared.and_then(|p| p.statement.as_ref());
        let mut rejected = plan.rejected.clone();
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.place))?;
        let translated = self.follow_renames(&mut client, plan).await?;
        let plan = match &translated {
            Some(t) => {
                prebuilt = None;
                t
            }
            None => plan,
        };
        // Type changes the columns must follow, and events from before a
        // column's generation routed to its retired column.
        let routed = self.follow_generations(&mut client, plan).await?;
        let plan = match &routed {
            Some(t) => {
                prebuilt = None;
                t
            }
            None => plan,
        };
        let steps = self.resolve(&mut client, plan, &mut rejected).await?;
        if !rejected.is_empty() {
            return Err(SinkError::Rejected(rejected));
        }
        let Err(e) = self.write(&mut client, &steps, batch, prebuilt).await else {
            return Ok(());
        };
        if matches!(e.code(), Some(c) if *c == SqlState::UNDEFINED_TABLE
            || *c == SqlState::UNDEFINED_COLUMN
            || *c == SqlState::INVALID_COLUMN_REFERENCE)
        {
            self.catalog.invalidate();
        }
        if classify(&e) != Class::Record {
            return Err(to_sink_error("write the batch", e));
        }
        // A value refused by a column another process moved to a new
        // generation (or retyped) after this one read the catalog: the batch
        // is routed again from the catalog as it is now, never dead-lettered.
        for step in &steps {
            if let Ready::Rows(info, _) = step {
                if self.catalog.changed(&client, info).await? {
                    return Err(SinkError::retriable(format!(
                        "the columns of {} changed while the batch was written: {e}",
                        info.qualified
                    )));
                }
            }
        }
        match self.isolate(&mut client, &steps, batch).await {
            Ok(failures) if !failures.is_empty() => Err(SinkError::Rejected(failures)),
            Ok(_) => Err(to_sink_error(
                "write the batch (no single record fails alone)",
                e,
            )),
            Err(e2) => Err(to_sink_error("find the refused records", e2)),
        }
    }

    async fn shutdown(&self) -> Result<(), SinkError> {
        self.pool.close();
        Ok(())
    }
}
