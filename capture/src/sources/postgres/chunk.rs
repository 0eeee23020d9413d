//! Reading one chunk on the snapshot connection: the table's shape from the
//! catalog, low watermark, SELECT, high watermark.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::copy::CopyRows;
use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::seam::{ChunkReads, ChunkTask};
use crate::snapshot::{
    chunk_query, quote_literal, watermark_content, KeyColumn, Watermark, WATERMARK_PREFIX,
};
use crate::sources::postgres::control::PUBLISHED_COLUMN;
use crate::sources::postgres::pgoutput::{
    Column, Relation, ReplicaIdentity, TupleData, TupleValue,
};

pub use crate::seam::{ChunkError, ChunkRequest};

/// What a chunk read: its rows follow the table's Relation.
pub type ChunkRows = crate::seam::ChunkRows<Relation>;

/// Opens the snapshot connection, with the session settings the replication
/// connection uses, so values read here render exactly as the stream's.
pub async fn connect(cfg: &CaptureConfig) -> Result<Client, CaptureError> {
    let mut pg = crate::sources::postgres::control::pg_config(cfg, "oncely-capture-snapshot");
    pg.options(
        "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3 -c standard_conforming_strings=on -c bytea_output=hex",
    );
    Ok(crate::sources::postgres::control::connect_with(cfg, &pg, "snapshot").await?)
}

/// PostgreSQL's chunk reads: on a connection of their own, opened on the
/// first chunk, so SELECTs never wait behind control queries.
pub(crate) struct PgChunks {
    cfg: CaptureConfig,
    conn: Option<Arc<Client>>,
}

impl PgChunks {
    pub(crate) fn new(cfg: &CaptureConfig) -> Self {
        PgChunks {
            cfg: cfg.clone(),
            conn: None,
        }
    }
}

impl ChunkReads for PgChunks {
    type Table = Relation;

    async fn start(&mut self, req: ChunkRequest) -> Result<ChunkTask<Relation>, CaptureError> {
        let conn = match &self.conn {
            Some(c) => Arc::clone(c),
            None => {
                let c = Arc::new(connect(&self.cfg).await?);
                self.conn = Some(Arc::clone(&c));
                c
            }
        };
        Ok(tokio::spawn(async move { read_chunk(&conn, &req).await }))
    }
}

/// Reads one chunk. The watermarks are transactions of their own (autocommit),
/// committed before and after the SELECT; the SELECT runs in a read-only
/// REPEATABLE READ transaction whose in-progress transactions come back
/// with the rows ([`ChunkRows::invisible`]).
pub async fn read_chunk(client: &Client, req: &ChunkRequest) -> Result<ChunkRows, ChunkError> {
    let Shape {
        relation,
        key,
        key_idx,
        estimate,
    } = load_shape(client, req).await?;
    if req.filter.is_some() {
        filtered_key_is_built_in(&relation, &key_idx, req)?;
    }
    emit(client, &watermark_content(&req.id, Watermark::Low)).await?;
    let columns: Vec<String> = relation.columns.iter().map(|c| c.name.clone()).collect();
    let sql = chunk_query(
        &req.schema,
        &req.table,
        &columns,
        &key,
        req.after.as_deref(),
        req.filter.as_deref(),
        req.size + 1,
    );
    let (rows, invisible) = read_rows(client, req, &sql, &relation).await?;
    let more = rows.len() > req.size;
    let mut rows = rows;
    rows.truncate(req.size);
    emit(client, &watermark_content(&req.id, Watermark::High)).await?;
    Ok(ChunkRows {
        relation,
        key_idx,
        rows,
        more,
        estimate,
        invisible,
    })
}

/// What the chunk's SELECT gives: its rows and the transactions in progress
/// when it read them.
type SelectResult = Result<(Vec<TupleData>, Vec<u32>), ChunkError>;

/// Runs the chunk's SELECT, again while a table rewrite commits under it.
async fn read_rows(
    client: &Client,
    req: &ChunkRequest,
    sql: &str,
    relation: &Relation,
) -> SelectResult {
    let mut attempt = 0;
    loop {
        // A table-rewriting ALTER TABLE is not MVCC-safe: a snapshot taken
        // before it commits sees the rewritten table empty, and an empty
        // chunk ends the table's snapshot. The storage files read before the
        // snapshot and after the SELECT (which holds a lock no rewrite can
        // pass) tell whether one committed in between; then read again.
        let files_before = storage_files(client, relation.id).await?;
        let (read, files_after) = read_once(client, req, sql, relation).await?;
        attempt += 1;
        match files_after {
            Some(after) if after != files_before && attempt < MAX_REWRITE_RETRIES => {
                tracing::info!(
                    table = %format!("{}.{}", req.schema, req.table),
                    "the table was rewritten while its chunk was read; reading the chunk again"
                );
            }
            _ => return read,
        }
    }
}

/// One read of the chunk in its own transaction: the rows (or why not), and
/// the table's storage files after a successful SELECT.
async fn read_once(
    client: &Client,
    req: &ChunkRequest,
    sql: &str,
    relation: &Relation,
) -> Result<(SelectResult, Option<String>), ChunkError> {
    // One REPEATABLE READ transaction: its snapshot, taken by the first
    // statement, is the one the SELECT reads with. A filter is the user's
    // SQL: besides read-only, its statements are cancelled past
    // FILTERED_CHUNK_TIMEOUT, and its names resolve among the built-in
    // functions and operators only (FILTER_SEARCH_PATH).
    let begin = if req.filter.is_some() {
        format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL search_path = {FILTER_SEARCH_PATH}",
            FILTERED_CHUNK_TIMEOUT.as_millis()
        )
    } else {
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY".to_owned()
    };
    client
        .batch_execute(&begin)
        .await
        .map_err(CaptureError::pg("begin snapshot chunk"))?;
    let read = select(
        client,
        sql,
        req.filter.is_some(),
        relation.columns.len(),
        req.size,
    )
    .await;
    let files_after = match &read {
        Ok(_) => Some(storage_files(client, relation.id).await?),
        Err(_) => None,
    };
    // Read-only: ending it either way changes nothing.
    let end = if read.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client
        .batch_execute(end)
        .await
        .map_err(CaptureError::pg("end snapshot chunk"))?;
    Ok((read, files_after))
}

/// How long one statement of a filtered chunk may run (`statement_timeout`,
/// set for its transaction only): a filter is the user's SQL, and one
/// that runs away is cancelled, its table skipped with the reason.
pub const FILTERED_CHUNK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The `search_path` a snapshot filter is resolved and run with. Its
/// allowlisted function names and its operators would otherwise resolve
/// along the capture role's search_path, where anyone with CREATE on one of
/// its schemas can add a `length(integer)` or an `=(integer, numeric)` that
/// matches the filter's arguments better than the built-in one, and so runs
/// as the capture role. Only superusers create objects in `pg_catalog`;
/// functions and operators are never looked up in `pg_temp`, listed last so
/// that its tables and types are not looked up first either.
pub const FILTER_SEARCH_PATH: &str = "pg_catalog, pg_temp";

/// The first OID `initdb` leaves to user objects (`FirstNormalObjectId`):
/// types below it are built in.
const FIRST_USER_OID: u32 = 16384;

/// A filtered chunk compares its key with the built-in operators only
/// ([`FILTER_SEARCH_PATH`]): for a key of a type from an extension or a
/// user (`citext`, a domain), those would compare otherwise than the key's
/// own order, which `ORDER BY` follows, and rows could be skipped.
fn filtered_key_is_built_in(
    relation: &Relation,
    key_idx: &[usize],
    req: &ChunkRequest,
) -> Result<(), ChunkError> {
    for &i in key_idx {
        let column = &relation.columns[i];
        if column.type_oid >= FIRST_USER_OID {
            return Err(ChunkError::Table(format!(
                "a filtered snapshot of {}.{} needs a key of built-in types, and key column {:?} has a type of an extension or a user (OID {}): snapshot it without a filter",
                req.schema, req.table, column.name, column.type_oid
            )));
        }
    }
    Ok(())
}

/// Rewrites in a row before a chunk gives up telling them apart (and reads
/// what its last snapshot sees, as before).
const MAX_REWRITE_RETRIES: u32 = 20;

/// The storage files (`pg_relation_filenode`) of a table, or of a
/// partitioned table's leaves: a rewrite gives the table a new one. Catalog
/// lookups see the latest committed state, also inside a REPEATABLE READ
/// transaction.
async fn storage_files(client: &Client, table: u32) -> Result<String, CaptureError> {
    let rows = client
        .simple_query(&format!(
            "SELECT string_agg(pg_relation_filenode(r)::text, ',' ORDER BY r::oid) \
             FROM (SELECT {table}::oid::regclass AS r \
                   UNION SELECT relid FROM pg_partition_tree({table}::oid::regclass) WHERE isleaf) x"
        ))
        .await
        .map_err(CaptureError::pg("read the table's storage files"))?;
    Ok(rows
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or_default().to_owned()),
            _ => None,
        })
        .unwrap_or_default())
}

/// The snapshot's in-progress transactions, then the chunk's rows (at most
/// `size + 1`, of `columns` values), inside the caller's transaction.
async fn select(
    client: &Client,
    sql: &str,
    filtered: bool,
    columns: usize,
    size: usize,
) -> Result<(Vec<TupleData>, Vec<u32>), ChunkError> {
    let snapshot = client
        .simple_query("SELECT pg_current_snapshot()::text")
        .await
        .map_err(CaptureError::pg("read the chunk's snapshot"))?;
    let invisible = snapshot
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(in_progress),
            _ => None,
        })
        .unwrap_or_default();
    let refused = |e: tokio_postgres::Error| match e.code() {
        // The server refused the SELECT itself (a filter that no longer
        // compiles, a column type without ordering): retrying cannot help.
        // Neither the query (it holds the filter's literals and the last
        // key) nor, for a filtered chunk, the server's message (a failed
        // cast quotes the value it failed on) is said: the SQLSTATE is.
        Some(code) if !e.is_closed() => ChunkError::Table(refusal(
            code,
            e.as_db_error().map(|d| d.message()),
            filtered,
        )),
        _ => ChunkError::Capture(CaptureError::pg("read snapshot chunk")(e)),
    };
    let rows = if filtered {
        cursor_rows(client, sql, size).await.map_err(refused)?
    } else {
        match copy_rows(client, sql, columns, size).await {
            Ok(rows) => rows,
            Err(CopyFailed::Postgres(e)) => return Err(refused(e)),
            // Never seen; the rows are not guessed at: the pipeline restarts
            // and the chunk is read again.
            Err(CopyFailed::Format(e)) => {
                return Err(ChunkError::Capture(CaptureError::Protocol(format!(
                    "snapshot chunk: {e}"
                ))))
            }
        }
    };
    Ok((rows, invisible))
}

/// Why the server refused a chunk's SELECT, without the query's or the
/// rows' values: the SQLSTATE, and the server's message only for an
/// unfiltered chunk (whose SELECT is capture's own).
fn refusal(
    code: &tokio_postgres::error::SqlState,
    message: Option<&str>,
    filtered: bool,
) -> String {
    use tokio_postgres::error::SqlState;
    match (filtered, message) {
        (true, _) if *code == SqlState::QUERY_CANCELED => format!(
            "the filtered chunk query was cancelled after {} s (statement_timeout; SQLSTATE {})",
            FILTERED_CHUNK_TIMEOUT.as_secs(),
            code.code()
        ),
        (true, _) | (false, None) => format!(
            "chunk query failed with SQLSTATE {}{}",
            code.code(),
            if filtered {
                " (the filter's error text is not logged: it can hold row values)"
            } else {
                ""
            }
        ),
        (false, Some(message)) => {
            format!(
                "chunk query failed with SQLSTATE {}: {message}",
                code.code()
            )
        }
    }
}

/// The rows of `sql` through a cursor, fetched with the simple protocol.
/// The SELECT holds the user's filter, so it goes through the extended
/// protocol, which runs one statement only; a cursor declared that way and
/// fetched with the simple protocol still gives the rows as text (the
/// extended protocol of tokio-postgres asks for binary results). The cursor
/// ends with the transaction.
async fn cursor_rows(
    client: &Client,
    sql: &str,
    size: usize,
) -> Result<Vec<TupleData>, tokio_postgres::Error> {
    client
        .execute(
            &format!("DECLARE oncely_chunk NO SCROLL CURSOR FOR {sql}"),
            &[],
        )
        .await?;
    let messages = client.simple_query("FETCH ALL FROM oncely_chunk").await?;
    let mut rows = Vec::with_capacity(size + 1);
    for m in messages {
        if let SimpleQueryMessage::Row(row) = m {
            let values = (0..row.len())
                .map(|i| match row.get(i) {
                    Some(v) => TupleValue::Text(Bytes::copy_from_slice(v.as_bytes())),
                    None => TupleValue::Null,
                })
                .collect();
            rows.push(TupleData(values));
        }
    }
    Ok(rows)
}

enum CopyFailed {
    Postgres(tokio_postgres::Error),
    Format(super::copy::CopyFormatError),
}

/// The rows of `sql` by `COPY (sql) TO STDOUT` in text format: each value
/// as the type's output function renders it under the session's settings,
/// byte for byte what a plain SELECT and pgoutput give, with much less work
/// per row (one message per row; values are slices of it, see
/// [`CopyRows`]). Only for a query without the user's filter: inside COPY's
/// parentheses a filter could close them and send the rows to a server
/// file instead.
async fn copy_rows(
    client: &Client,
    sql: &str,
    columns: usize,
    size: usize,
) -> Result<Vec<TupleData>, CopyFailed> {
    let copy = client
        .copy_out(format!("COPY ({sql}) TO STDOUT").as_str())
        .await
        .map_err(CopyFailed::Postgres)?;
    futures::pin_mut!(copy);
    let mut rows = CopyRows::new(columns, size + 1);
    while let Some(data) = copy.next().await {
        let data = data.map_err(CopyFailed::Postgres)?;
        rows.push(data).map_err(CopyFailed::Format)?;
    }
    rows.finish().map_err(CopyFailed::Format)
}

/// The in-progress transactions of a `pg_snapshot` text (`xmin:xmax:xip,...`),
/// as the 32-bit xids pgoutput's Begin carries (the low half of each xid8).
pub(crate) fn in_progress(snapshot: &str) -> Vec<u32> {
    snapshot
        .splitn(3, ':')
        .nth(2)
        .unwrap_or_default()
        .split(',')
        .filter_map(|x| x.trim().parse::<u64>().ok())
        .map(|x| x as u32)
        .collect()
}

async fn emit(client: &Client, content: &str) -> Result<(), CaptureError> {
    client
        .batch_execute(&format!(
            "SELECT pg_logical_emit_message(true, {}, {})",
            quote_literal(WATERMARK_PREFIX),
            quote_literal(content)
        ))
        .await
        .map_err(CaptureError::pg("emit snapshot watermark"))
}

/// A table as a chunk reads it.
struct Shape {
    /// Columns as pgoutput would describe them (dropped columns left out,
    /// generated ones as [`PUBLISHED_COLUMN`] says).
    relation: Relation,
    /// Key columns with their types.
    key: Vec<KeyColumn>,
    /// Their positions in `relation.columns`.
    key_idx: Vec<usize>,
    /// The planner's row count.
    estimate: Option<u64>,
}

async fn load_shape(client: &Client, req: &ChunkRequest) -> Result<Shape, ChunkError> {
    let rows = client
        .query(
            &format!(
                "SELECT c.oid, c.relreplident::text, c.reltuples::float8,
                        a.attname::text, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod),
                        COALESCE(a.attnum = ANY(i.indkey::int2[]), false)
                 FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                                     AND NOT a.attisdropped AND {PUBLISHED_COLUMN}
                 LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
                 WHERE n.nspname = $1 AND c.relname = $2
                 ORDER BY a.attnum"
            ),
            &[&req.schema, &req.table],
        )
        .await
        .map_err(CaptureError::pg("read table shape"))?;
    let qualified = format!("{}.{}", req.schema, req.table);
    let Some(first) = rows.first() else {
        return Err(ChunkError::Table(format!(
            "table {qualified} does not exist (any more)"
        )));
    };
    let id: u32 = first.get(0);
    let identity: String = first.get(1);
    let reltuples: f64 = first.get(2);
    let mut columns = Vec::with_capacity(rows.len());
    let mut types = Vec::with_capacity(rows.len());
    for r in &rows {
        columns.push(Column {
            is_key: r.get(7),
            name: r.get(3),
            type_oid: r.get(4),
            type_modifier: r.get(5),
        });
        types.push(r.get::<_, String>(6));
    }
    let mut key = Vec::with_capacity(req.key_columns.len());
    let mut key_idx = Vec::with_capacity(req.key_columns.len());
    for name in &req.key_columns {
        let Some(i) = columns.iter().position(|c| &c.name == name) else {
            return Err(ChunkError::Table(format!(
                "table {qualified} has no key column {name:?} any more"
            )));
        };
        key.push(KeyColumn {
            name: name.clone(),
            type_name: types[i].clone(),
        });
        key_idx.push(i);
    }
    let relation = Relation {
        id,
        namespace: req.schema.clone(),
        name: req.table.clone(),
        replica_identity: identity
            .bytes()
            .next()
            .and_then(ReplicaIdentity::from_byte)
            .unwrap_or(ReplicaIdentity::Default),
        columns,
    };
    // reltuples is -1 for a table never vacuumed or analyzed.
    let estimate = (reltuples >= 0.0).then_some(reltuples as u64);
    Ok(Shape {
        relation,
        key,
        key_idx,
        estimate,
    })
}

#[cfg(test)]
mod tests {
    use tokio_postgres::error::SqlState;

    use super::{filtered_key_is_built_in, refusal, ChunkError, ChunkRequest};
    use crate::sources::postgres::pgoutput::{Column, Relation, ReplicaIdentity};

    #[test]
    fn a_snapshots_in_progress_transactions_as_32_bit_xids() {
        use super::in_progress;
        assert_eq!(in_progress("10:20:"), Vec::<u32>::new());
        assert_eq!(in_progress("10:20:12,15"), vec![12, 15]);
        // xid8 with an epoch: pgoutput's Begin carries the low 32 bits.
        assert_eq!(in_progress("4294967306:4294967310:4294967307"), vec![11]);
        assert_eq!(in_progress("garbage"), Vec::<u32>::new());
    }

    #[test]
    fn a_filtered_chunk_needs_a_key_of_built_in_types() {
        let column = |name: &str, type_oid| Column {
            is_key: true,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        let relation = Relation {
            id: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            // int4, text, and a citext from an extension.
            columns: vec![
                column("id", 23),
                column("code", 25),
                column("email", 16_390),
            ],
        };
        let req = ChunkRequest {
            id: "c".into(),
            schema: "public".into(),
            table: "t".into(),
            key_columns: vec![],
            after: None,
            filter: Some("id > 1".into()),
            size: 10,
        };
        assert!(filtered_key_is_built_in(&relation, &[0, 1], &req).is_ok());
        match filtered_key_is_built_in(&relation, &[0, 2], &req) {
            Err(ChunkError::Table(why)) => {
                assert!(
                    why.contains("\"email\"") && why.contains("without a filter"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_filtered_chunk_says_its_sqlstate_and_no_value() {
        let message = Some("invalid input syntax for type integer: \"hunter2\"");
        let filtered = refusal(&SqlState::INVALID_TEXT_REPRESENTATION, message, true);
        assert!(filtered.contains("22P02"), "{filtered}");
        assert!(!filtered.contains("hunter2"), "{filtered}");
        let cancelled = refusal(&SqlState::QUERY_CANCELED, None, true);
        assert!(cancelled.contains("statement_timeout"), "{cancelled}");
        // Capture's own SELECT: the server's message helps and holds no filter.
        let own = refusal(&SqlState::UNDEFINED_FUNCTION, Some("no ordering"), false);
        assert!(
            own.contains("no ordering") && own.contains("42883"),
            "{own}"
        );
    }
}
