//! PostgreSQL's answers to a signal's checks of the tables it names
//! ([`SnapshotTableChecks`]): a table's primary key, and whether a snapshot
//! filter is a boolean expression of its columns, asked of the server on
//! the control connection.

use tokio_postgres::Client;

use super::chunk::FILTER_SEARCH_PATH;
use super::control;
use crate::error::CaptureError;
use crate::naming::quote_ident;
use crate::seam::SnapshotTableChecks;
use crate::snapshot::signal::check_filter_on;

impl SnapshotTableChecks for Client {
    async fn primary_key(
        &self,
        schema: &str,
        name: &str,
    ) -> Result<Result<Vec<String>, String>, CaptureError> {
        primary_key(self, schema, name).await
    }

    async fn check_filter(
        &self,
        filter: &str,
        schema: &str,
        name: &str,
    ) -> Result<Result<(), String>, CaptureError> {
        check_filter(self, filter, schema, name).await
    }
}

/// The primary key of `schema.name` (`Ok(Err(reason))` when the server
/// says it cannot be read, such as no such table).
async fn primary_key(
    control: &Client,
    schema: &str,
    name: &str,
) -> Result<Result<Vec<String>, String>, CaptureError> {
    let mut looks = 0;
    loop {
        match control::primary_key(control, schema, name).await {
            Ok(pk) => return Ok(Ok(pk)),
            // A table created in the signal's own transaction: the
            // walsender sends a transaction once its commit is in the WAL, a
            // moment before the committing backend leaves the proc array, so
            // for that moment other sessions do not see the table yet.
            Err(e) if undefined_table(&e) && looks < TABLE_LOOKS => {
                looks += 1;
                tokio::time::sleep(TABLE_LOOK_PAUSE).await;
            }
            Err(e) => return definite(e).map(|r| r.map(|()| Vec::new())),
        }
    }
}

/// Whether `filter` works as a snapshot filter of `schema.name`
/// (`Ok(Err(reason))` when not).
async fn check_filter(
    control: &Client,
    filter: &str,
    schema: &str,
    name: &str,
) -> Result<Result<(), String>, CaptureError> {
    if let Err(why) = check_filter_on(filter, schema, name) {
        return Ok(Err(why));
    }
    // Prepared, never executed: the extended protocol parses one statement
    // only, and the result type says whether the filter is a boolean
    // expression of the table's columns.
    let probe = format!(
        "SELECT ({filter}) FROM {}.{} LIMIT 0",
        quote_ident(schema),
        quote_ident(name)
    );
    // Resolved as the chunk will resolve it (FILTER_SEARCH_PATH), in a
    // transaction of its own so the setting goes with it.
    match prepare_filter_probe(control, &probe).await? {
        Err(e) => filter_refused(e),
        Ok(statement) => {
            let ty = statement.columns().first().map(|c| c.type_().clone());
            if ty != Some(tokio_postgres::types::Type::BOOL) {
                return Ok(Err(format!(
                    "the filter is not a boolean expression (its type is {})",
                    ty.map_or_else(|| "unknown".to_owned(), |t| t.name().to_owned())
                )));
            }
            Ok(Ok(()))
        }
    }
}

/// Why the server refused to prepare a filter's probe. Class 42 messages
/// (no such column, operator or function) name identifiers; others, such
/// as a data exception (class 22), quote the filter's literals: only the
/// SQLSTATE is said.
fn filter_refused(e: tokio_postgres::Error) -> Result<Result<(), String>, CaptureError> {
    match e.code() {
        Some(code) if code.code().starts_with("42") => {
            definite(CaptureError::pg("check snapshot filter")(e))
                .map(|r| r.map_err(|why| format!("the filter does not work: {why}")))
        }
        Some(code) => Ok(Err(format!(
            "the filter does not work: SQLSTATE {}",
            code.code()
        ))),
        None => Err(CaptureError::pg("check snapshot filter")(e)),
    }
}

/// Prepares (never runs) a filter's probe with the search_path its chunks
/// run with, so a name the chunk could not resolve is refused here.
async fn prepare_filter_probe(
    control: &Client,
    probe: &str,
) -> Result<Result<tokio_postgres::Statement, tokio_postgres::Error>, CaptureError> {
    control
        .batch_execute(&format!(
            "BEGIN READ ONLY; SET LOCAL search_path = {FILTER_SEARCH_PATH}"
        ))
        .await
        .map_err(CaptureError::pg("check snapshot filter"))?;
    let prepared = control.prepare(probe).await;
    control
        .batch_execute("ROLLBACK")
        .await
        .map_err(CaptureError::pg("check snapshot filter"))?;
    Ok(prepared)
}

/// How often a signal's table that does not exist is looked up again, and
/// how long apart (see `check_snapshot_table`).
const TABLE_LOOKS: u32 = 10;
const TABLE_LOOK_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

fn undefined_table(e: &CaptureError) -> bool {
    e.as_pg().is_some_and(|source| {
        source.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
    })
}

/// A server's answer (no such table, syntax error) becomes a reason; a lost
/// connection stays an error.
fn definite(e: CaptureError) -> Result<Result<(), String>, CaptureError> {
    match e.as_pg() {
        Some(source) if source.code().is_some() => Ok(Err(source
            .as_db_error()
            .map_or_else(|| source.to_string(), |d| d.message().to_string()))),
        _ => Err(e),
    }
}
