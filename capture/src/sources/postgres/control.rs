//! The control connection: checks that the database can be captured, and
//! sets up the publication and the slot, failing with a message that says
//! what to change when it cannot.

use std::time::{Duration, Instant};

use pgwire_replication::Lsn;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::filter::{parse_key_columns, TableFilter};
use crate::naming::quote_ident;

mod publication;
mod row_filter;

pub use crate::seam::{CapturedTable, Selected};
pub use publication::{ensure_publication, PUBLISHED_COLUMN};

/// The primary key columns of the relation whose OID is the SQL expression
/// `$relation`, in key order, as `text[]` (empty when it has none): the one
/// place every catalog query takes a table's key from.
macro_rules! primary_key_sql {
    ($relation:literal) => {
        concat!(
            "COALESCE((SELECT array_agg(a.attname::text ORDER BY k.ord)
               FROM pg_index i
               CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = ",
            $relation,
            " AND i.indisprimary), '{}')"
        )
    };
}

/// The slot as the server reports it.
#[derive(Debug, Clone)]
pub struct SlotState {
    pub confirmed_flush_lsn: u64,
}

/// Connection settings for the captured database (host, port, user, database,
/// password when set), for every connection oncely opens to it besides the
/// stream; TLS comes from [`connect_with`].
pub fn pg_config(cfg: &CaptureConfig, application_name: &str) -> tokio_postgres::Config {
    let mut pg = tokio_postgres::Config::new();
    pg.host(&cfg.database_hostname)
        .port(cfg.port())
        .user(&cfg.database_user)
        .dbname(&cfg.database_dbname)
        .application_name(application_name);
    if !cfg.database_password.expose().is_empty() {
        pg.password(cfg.database_password.expose());
    }
    pg
}

/// Opens the control connection. The connection task ends when the client drops.
pub async fn connect(cfg: &CaptureConfig) -> Result<Client, CaptureError> {
    Ok(connect_with(cfg, &pg_config(cfg, "oncely-capture-control"), "control").await?)
}

/// Connects to the captured database with `pg` (from [`pg_config`], with
/// options added) under `database.sslmode` and its files: `oncely-core`'s
/// one PostgreSQL connection builder. `what` names the connection in logs.
pub async fn connect_with(
    cfg: &CaptureConfig,
    pg: &tokio_postgres::Config,
    what: &'static str,
) -> Result<Client, oncely_core::postgres::ConnectError> {
    cfg.tls().connector()?.connect(pg, what).await
}

/// `wal_level` must be `logical` for a logical slot to decode anything.
pub async fn check_wal_level(client: &Client) -> Result<(), CaptureError> {
    let row = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(CaptureError::pg("read wal_level"))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(CaptureError::Prerequisite(format!(
            "wal_level is `{level}`, but capture needs `logical`: set `wal_level = logical` in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
        )));
    }
    Ok(())
}

/// Lists the tables that `table.include.list`/`exclude.list` select, with
/// their key columns. A table with neither a primary key nor configured key
/// columns is an error (`oncely verify` cannot compare it; capture
/// quarantines it instead, through [`selected_tables`]). Partitions are never
/// captured on their own: a partitioned table is captured at its root (the
/// top of its tree), and an include list that selects a partition but not
/// its root stops start-up.
pub async fn captured_tables(
    client: &Client,
    cfg: &CaptureConfig,
) -> Result<Vec<CapturedTable>, CaptureError> {
    let Selected { tables, keyless } = selected_tables(client, cfg).await?;
    if let Some(first) = keyless.first() {
        return Err(CaptureError::Prerequisite(keyless_reason(
            &keyless.join(", "),
            first,
        )));
    }
    Ok(tables)
}

/// What a table without a key lacks, and the fix; `tables` names it (or
/// them), `example` one of them.
pub fn keyless_reason(tables: &str, example: &str) -> String {
    format!(
        "table(s) {tables} have no primary key, so their events would have no key: add a primary key, name key columns in `message.key.columns` (e.g. \"{example}:id\"), or leave them out with `table.exclude.list`"
    )
}

/// [`captured_tables`], with the tables that have no key listed apart
/// instead of refused.
pub async fn selected_tables(
    client: &Client,
    cfg: &CaptureConfig,
) -> Result<Selected, CaptureError> {
    let filter = TableFilter::new(&cfg.table_include_list.0, &cfg.table_exclude_list.0)
        .map_err(|e| CaptureError::Prerequisite(format!("table.include.list: {e}")))?;
    let overrides = parse_key_columns(cfg.message_key_columns.as_deref())
        .map_err(|e| CaptureError::Prerequisite(format!("message.key.columns: {e}")))?;
    check_partitions_excluded(client, &filter).await?;
    let rows = client
        .query(
            concat!(
                "SELECT n.nspname::text, c.relname::text, ",
                primary_key_sql!("c.oid"),
                " AS pk, c.relkind = 'p'
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
                   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                   AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'
                 ORDER BY 1, 2"
            ),
            &[],
        )
        .await
        .map_err(CaptureError::pg("list tables"))?;
    let mut tables = Vec::new();
    let mut keyless = Vec::new();
    for row in rows {
        let schema: String = row.get(0);
        let name: String = row.get(1);
        if !filter.matches(&schema, &name) {
            continue;
        }
        let pk: Vec<String> = row.get(2);
        let partitioned: bool = row.get(3);
        let qualified = format!("{schema}.{name}");
        let (key_columns, key_overridden) = match overrides.get(&qualified) {
            Some(cols) => (cols.clone(), true),
            None => (pk, false),
        };
        if key_columns.is_empty() {
            keyless.push(qualified);
            continue;
        }
        tables.push(CapturedTable {
            schema,
            name,
            key_columns,
            key_overridden,
            partitioned,
        });
    }
    if tables.is_empty() && keyless.is_empty() {
        tracing::warn!("table.include.list selects no existing table; capture will publish nothing until one is created");
    }
    Ok(Selected { tables, keyless })
}

/// Stops start-up when the table filter selects a partition whose root it
/// does not select: the partition's changes are published under its root
/// (`publish_via_partition_root`), so capturing it alone cannot work. A root
/// left out by `table.exclude.list` leaves its partitions out too.
async fn check_partitions_excluded(
    client: &Client,
    filter: &TableFilter,
) -> Result<(), CaptureError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text, rn.nspname::text, r.relname::text
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
             JOIN pg_namespace rn ON rn.oid = r.relnamespace
             WHERE c.relispartition AND c.relkind IN ('r', 'p')
             ORDER BY 1, 2",
            &[],
        )
        .await
        .map_err(CaptureError::pg("list partitions"))?;
    let mut alone = Vec::new();
    for row in rows {
        let (schema, name, root_schema, root): (String, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if filter.matches(&schema, &name) && !filter.included(&root_schema, &root) {
            alone.push((format!("{schema}.{name}"), format!("{root_schema}.{root}")));
        }
    }
    let Some((first, first_root)) = alone.first() else {
        return Ok(());
    };
    Err(CaptureError::Prerequisite(format!(
        "table.include.list selects partition(s) {} without their partitioned table: partitions are captured through their root, as one table (topic, key and snapshot of the root). Include the root instead (e.g. \"{}\" rather than \"{}\"), or leave the partition out",
        alone
            .iter()
            .map(|(p, r)| format!("{p} (of {r})"))
            .collect::<Vec<_>>()
            .join(", "),
        first_root.replace('.', "\\\\."),
        first.replace('.', "\\\\."),
    )))
}

/// The top of the partition tree that relation `relid` belongs to, when it is
/// a partition (`None` for any other relation, or one that is gone), read
/// once `xid`, the stream's transaction its Relation came in, is visible
/// ([`read_visible`]): a table attached or detached in that transaction and
/// written after must not go to the topic it had before.
pub async fn partition_root(
    client: &Client,
    relid: u32,
    xid: Option<u32>,
) -> Result<Option<(String, String)>, CaptureError> {
    let sql = format!(
        "SELECT {XID_VISIBLE}, rn.nspname::text, r.relname::text \
         FROM {XID_SNAPSHOT} \
         LEFT JOIN (pg_class c JOIN pg_class r ON r.oid = pg_partition_root(c.oid) \
                    JOIN pg_namespace rn ON rn.oid = r.relnamespace) \
           ON c.oid = $2 AND c.relispartition"
    );
    let rows = read_visible(client, &sql, &[&relid], xid, "read partition root").await?;
    Ok(rows.first().and_then(|r| {
        let schema: Option<String> = r.get(1);
        let name: Option<String> = r.get(2);
        schema.zip(name)
    }))
}

/// A one-row subquery `w`: the statement's snapshot (`w.snap`) and the
/// transaction whose 32-bit xid is `$1` (a bigint), widened with the epoch of
/// the snapshot's xmax (`w.xid`). `pg_visible_in_snapshot(w.xid::text::xid8,
/// w.snap)` then tells whether the statement sees that transaction: the
/// walsender sends a commit a moment before new snapshots see it, so a read
/// that must be at least as new as a streamed transaction checks it in the
/// same statement and runs again until it is true.
pub(crate) const XID_SNAPSHOT: &str = "(SELECT s.snap, x.xmax - (((((x.xmax % 4294967296) - $1::bigint) % 4294967296) + 4294967296 + 2147483648) % 4294967296 - 2147483648) AS xid \
     FROM (SELECT pg_current_snapshot() AS snap) s, \
     LATERAL (SELECT pg_snapshot_xmax(s.snap)::text::bigint AS xmax) x) w";

/// The first column of a statement read by [`read_visible`]: whether it
/// sees the transaction of [`XID_SNAPSHOT`] (true without one).
pub(crate) const XID_VISIBLE: &str =
    "COALESCE(pg_visible_in_snapshot(w.xid::text::xid8, w.snap), true)";

/// How long a streamed transaction may take to become visible to the
/// control connection before [`read_visible`] gives up (retriably).
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The rows of `sql`, a catalog read that must be at least as new as the
/// stream's transaction `xid` (none: as the catalog is now): `sql` reads
/// from [`XID_SNAPSHOT`] (`$1`, the xid; `params` are `$2..`) and its first
/// column is [`XID_VISIBLE`], in at least one row (a `LEFT JOIN` to the
/// read). The walsender sends a transaction a moment before other sessions
/// see it committed, so the statement runs again, with backoff, until it
/// sees `xid`; still not after 30 s: [`CaptureError::SourceRead`]
/// (retriable). `what` names the read in a database error.
pub(crate) async fn read_visible(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    xid: Option<u32>,
    what: &'static str,
) -> Result<Vec<Row>, CaptureError> {
    let xid = xid.map(i64::from);
    let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 1);
    all.push(&xid);
    all.extend_from_slice(params);
    let deadline = Instant::now() + VISIBLE_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        let rows = client
            .query(sql, &all)
            .await
            .map_err(CaptureError::pg(what))?;
        if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(rows);
        }
        if Instant::now() > deadline {
            return Err(CaptureError::SourceRead(format!(
                "transaction {} sent by the replication stream is still not visible after {VISIBLE_TIMEOUT:?}",
                xid.unwrap_or_default()
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Returns once the control connection sees the stream's transaction `xid`
/// ([`read_visible`] of the check alone): a catalog read in a later
/// statement is at least as new, since each statement takes a new snapshot.
pub(crate) async fn wait_visible(client: &Client, xid: Option<u32>) -> Result<(), CaptureError> {
    let sql = format!("SELECT {XID_VISIBLE} FROM {XID_SNAPSHOT}");
    read_visible(
        client,
        &sql,
        &[],
        xid,
        "check that a transaction is visible",
    )
    .await?;
    Ok(())
}

/// The first server version with failover slots.
pub const FAILOVER_SLOTS_VERSION: i32 = 170_000;

/// The server's WAL write position now.
pub async fn current_wal_lsn(client: &Client) -> Result<u64, CaptureError> {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(CaptureError::pg("read the current WAL position"))?;
    parse_lsn(Some(row.get::<_, &str>(0)))
}

/// `server_version_num` as people write it (`150014` -> `15.14`).
fn server_version_text(num: i32) -> String {
    format!("{}.{}", num / 10_000, num % 10_000)
}

/// Checks the slot (plugin, database) or creates it.
pub async fn ensure_slot(client: &Client, cfg: &CaptureConfig) -> Result<SlotState, CaptureError> {
    let name = &cfg.slot_name;
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(CaptureError::pg("read server version"))?
        .get(0);
    let failover_supported = version >= FAILOVER_SLOTS_VERSION;
    if cfg.slot_failover && !failover_supported {
        return Err(CaptureError::Prerequisite(format!(
            "slot.failover = true needs PostgreSQL 17 or later (failover slots), but this server is version {}: set slot.failover = false, or upgrade the server",
            server_version_text(version)
        )));
    }
    let failover_column = if failover_supported {
        "failover"
    } else {
        "false"
    };
    let row = client
        .query_opt(
            &format!(
                "SELECT plugin::text, slot_type::text, database::text, confirmed_flush_lsn::text, {failover_column}
                 FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[name],
        )
        .await
        .map_err(CaptureError::pg("read slot"))?;
    match row {
        Some(row) => check_slot(cfg, &row),
        None => create_slot(client, cfg, failover_supported).await,
    }
}

/// Checks an existing slot is capture's kind: logical, `pgoutput`, on the
/// configured database, and a failover slot when `slot.failover` asks.
fn check_slot(cfg: &CaptureConfig, row: &Row) -> Result<SlotState, CaptureError> {
    let name = &cfg.slot_name;
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let database: Option<String> = row.get(2);
    let confirmed: Option<String> = row.get(3);
    let failover: Option<bool> = row.get(4);
    if cfg.slot_failover && failover != Some(true) {
        return Err(CaptureError::Prerequisite(format!(
            "replication slot `{name}` is not a failover slot, but slot.failover = true: make it one on a replication connection (psql \"dbname={} replication=database\" -c 'ALTER_REPLICATION_SLOT {} (FAILOVER true)'), or set slot.failover = false",
            cfg.database_dbname,
            quote_ident(name)
        )));
    }
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(CaptureError::Prerequisite(format!(
            "replication slot `{name}` is a {slot_type} slot with plugin `{}`, but capture needs a logical slot with plugin `pgoutput`: choose another slot.name, or drop it (SELECT pg_drop_replication_slot('{name}')) if nothing else uses it",
            plugin.unwrap_or_default()
        )));
    }
    if database.as_deref() != Some(cfg.database_dbname.as_str()) {
        return Err(CaptureError::Prerequisite(format!(
            "replication slot `{name}` belongs to database `{}`, not `{}`: choose another slot.name",
            database.unwrap_or_default(),
            cfg.database_dbname
        )));
    }
    Ok(SlotState {
        confirmed_flush_lsn: parse_lsn(confirmed.as_deref())?,
    })
}

/// Creates the missing slot when `slot.create` allows, as a failover slot
/// when the server has them and `slot.failover` asks.
async fn create_slot(
    client: &Client,
    cfg: &CaptureConfig,
    failover_supported: bool,
) -> Result<SlotState, CaptureError> {
    let name = &cfg.slot_name;
    if !cfg.slot_create {
        return Err(CaptureError::Prerequisite(format!(
            "replication slot `{name}` does not exist and slot.create is false: create it with SELECT pg_create_logical_replication_slot('{name}', 'pgoutput'), or set slot.create = true"
        )));
    }
    let created = if failover_supported {
        client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, $2)",
                &[name, &cfg.slot_failover],
            )
            .await
    } else {
        client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[name],
            )
            .await
    };
    let row = created
        .map_err(|e| {
            privilege_or(e, &format!("creating replication slot `{name}` needs the REPLICATION attribute: ALTER ROLE {} REPLICATION", quote_ident(&cfg.database_user)), "create slot")
        })?;
    let lsn: String = row.get(0);
    tracing::info!(slot = %name, lsn = %lsn, failover = cfg.slot_failover, "created replication slot");
    Ok(SlotState {
        confirmed_flush_lsn: parse_lsn(Some(&lsn))?,
    })
}

/// Bytes of WAL the slot keeps the server from recycling.
pub async fn slot_retained_wal(client: &Client, slot: &str) -> Result<Option<i64>, CaptureError> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(CaptureError::pg("read slot lag"))?;
    Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)))
}

/// Primary key columns of one table, in key order (empty when it has none).
pub async fn primary_key(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Vec<String>, CaptureError> {
    let row = client
        .query_one(
            concat!(
                "SELECT ",
                primary_key_sql!("format('%I.%I', $1::text, $2::text)::regclass")
            ),
            &[&schema, &table],
        )
        .await
        .map_err(CaptureError::pg("read primary key"))?;
    Ok(row.get(0))
}

/// A relation as the catalog has it, looked up by OID (a partition's: its
/// root's), once `xid`, the stream's transaction its Relation came in, is
/// visible ([`read_visible`]; else `DROP CONSTRAINT t_pkey, ADD PRIMARY KEY
/// (other)` and the writes of its transaction were keyed by the old key):
/// its schema, name and primary key columns (empty when it has none).
/// `None` when no relation has that OID (dropped since).
pub async fn relation_by_oid(
    client: &Client,
    oid: u32,
    xid: Option<u32>,
) -> Result<Option<(String, String, Vec<String>)>, CaptureError> {
    let sql = format!(
        "SELECT {XID_VISIBLE}, r.* FROM {XID_SNAPSHOT} \
         LEFT JOIN (SELECT n.nspname::text, c.relname::text, {pk} \
                    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                    WHERE c.oid = COALESCE(pg_partition_root($2::oid::regclass), $2::oid)) r ON true",
        pk = primary_key_sql!("c.oid"),
    );
    let rows = read_visible(client, &sql, &[&oid], xid, "read a relation's primary key").await?;
    Ok(rows.first().and_then(|r| {
        let schema: Option<String> = r.get(1);
        schema.map(|schema| (schema, r.get(2), r.get(3)))
    }))
}

pub fn parse_lsn(text: Option<&str>) -> Result<u64, CaptureError> {
    match text {
        None => Ok(0),
        Some(t) => Lsn::parse(t)
            .map(|l| l.as_u64())
            .map_err(|e| CaptureError::Protocol(format!("bad LSN {t:?}: {e:?}"))),
    }
}

/// A privilege failure becomes a prerequisite message; anything else stays a database error.
fn privilege_or(e: tokio_postgres::Error, message: &str, context: &'static str) -> CaptureError {
    if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        CaptureError::Prerequisite(format!("{message} ({e})"))
    } else {
        CaptureError::pg(context)(e)
    }
}

/// Checks that the signal table (`signal.data.collection`) exists with the
/// columns signals use, so it can join the publication.
pub async fn signal_table(client: &Client, qualified: &str) -> Result<CapturedTable, CaptureError> {
    let (schema, name) = crate::snapshot::split_table(qualified).ok_or_else(|| {
        CaptureError::Prerequisite(format!(
            "signal.data.collection {qualified:?} must be schema.table"
        ))
    })?;
    let create = format!(
        "CREATE TABLE {}.{} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048) NULL)",
        quote_ident(schema),
        quote_ident(name)
    );
    let columns: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&schema, &name],
        )
        .await
        .map_err(CaptureError::pg("read signal table"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if columns.is_empty() {
        return Err(CaptureError::Prerequisite(format!(
            "signal.data.collection names {qualified}, which does not exist: create it ({create}) or remove the setting"
        )));
    }
    if let Some(missing) = ["id", "type", "data"]
        .iter()
        .find(|c| !columns.iter().any(|have| have == *c))
    {
        return Err(CaptureError::Prerequisite(format!(
            "signal table {qualified} has no column `{missing}`; signals need id, type and data, e.g. {create}"
        )));
    }
    let key_columns = primary_key(client, schema, name).await?;
    Ok(CapturedTable {
        schema: schema.to_string(),
        name: name.to_string(),
        key_columns,
        key_overridden: false,
        partitioned: false,
    })
}
