//! Schema changes under load (docs/design.md, "Schema changes"): one table per DDL kind, each with
//! rows mirrored in the warehouse, the search index and the cache before
//! the change, driven through capture and the three sinks while a chaos
//! loop SIGKILLs a random process every second or two. After the changes
//! and more load, `oncely verify` must report every copy equal and no sink
//! may have dead-lettered anything: every change below is one the targets
//! absorb (docs/capture.md, "Schema changes"). The schema-change topic must name each
//! change once, as what it is (a rename as a rename), however often capture
//! was killed.
//!
//! The warehouse renames a renamed column (matched by attnum) and keeps a
//! dropped one (the default `schema.evolution.drop.columns = "keep"`).
//!
//! Kinds: ALTER TYPE widening (int -> bigint with values beyond int,
//! numeric(10,2) -> numeric(12,4) with values of four decimals), narrowing
//! (bigint -> int, values that fit), with `USING` (values rewritten without
//! row events), ADD COLUMN with a default (rows filled without row events)
//! and without, DROP COLUMN, RENAME COLUMN, SET NOT NULL, DDL in the same
//! transaction as DML, DDL while capture is stopped, and DDL while a
//! snapshot of that table runs.
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::harness::capture;
use crate::harness::chaos::{
    assert_all_equal, count_changes, schema_changes, warehouse_columns, Load,
};
use crate::harness::e2e::{Fleet, Pipeline};

/// Every table has `id` (key) and `v` (the load's column, never changed by
/// DDL) beside the columns its DDL changes.
const TABLES: &[(&str, &str, &str)] = &[
    // (table, extra columns, the DDL applied to it)
    (
        "widen_int",
        "a integer",
        "ALTER TABLE widen_int ALTER COLUMN a TYPE bigint;\
         UPDATE widen_int SET a = 3000000000 + id WHERE id % 3 = 0",
    ),
    (
        "widen_num",
        "amount numeric(10,2)",
        "ALTER TABLE widen_num ALTER COLUMN amount TYPE numeric(12,4);\
         UPDATE widen_num SET amount = 1.2345 + id WHERE id % 3 = 0",
    ),
    (
        "narrow",
        "n bigint",
        "ALTER TABLE narrow ALTER COLUMN n TYPE integer",
    ),
    (
        "using_expr",
        "q integer",
        "ALTER TABLE using_expr ALTER COLUMN q TYPE bigint USING q * 10",
    ),
    (
        "add_default",
        "x integer",
        "ALTER TABLE add_default ADD COLUMN c integer DEFAULT 7",
    ),
    (
        "add_plain",
        "x integer",
        "ALTER TABLE add_plain ADD COLUMN d text",
    ),
    (
        "drop_col",
        "old text",
        "ALTER TABLE drop_col DROP COLUMN old",
    ),
    (
        "rename_col",
        "b text",
        "ALTER TABLE rename_col RENAME COLUMN b TO b2",
    ),
    (
        "not_null",
        "nn text DEFAULT 'x'",
        "ALTER TABLE not_null ALTER COLUMN nn SET NOT NULL",
    ),
    (
        "in_tx",
        "x integer",
        "BEGIN; UPDATE in_tx SET v = v + 1 WHERE id % 2 = 0;\
         ALTER TABLE in_tx ADD COLUMN e integer DEFAULT 3;\
         UPDATE in_tx SET e = 30 WHERE id % 5 = 0; COMMIT",
    ),
];

/// Changed while capture is stopped.
const STOPPED: (&str, &str, &str) = (
    "while_stopped",
    "x integer",
    "ALTER TABLE while_stopped ADD COLUMN g integer DEFAULT 9;\
     ALTER TABLE while_stopped RENAME COLUMN x TO x2",
);

/// Changed while a signalled snapshot of it runs.
const SNAPSHOTTED: (&str, &str, &str) = (
    "during_snapshot",
    "x integer",
    "ALTER TABLE during_snapshot ADD COLUMN f integer DEFAULT 5",
);

const SEED_ROWS: i64 = 80;
/// Small chunks: the signalled snapshot spans the DDL.
const CHUNK: usize = 10;

fn all_tables() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut t = TABLES.to_vec();
    t.push(STOPPED);
    t.push(SNAPSHOTTED);
    t
}

fn schema() -> String {
    let mut sql = String::from(
        "CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));",
    );
    for (table, extra, _) in all_tables() {
        sql.push_str(&format!(
            "CREATE TABLE {table} (id integer PRIMARY KEY, v integer NOT NULL, {extra});"
        ));
    }
    sql
}

/// The seed value of a table's extra column for row `n`.
fn seed_value(table: &str, n: i64) -> String {
    match table {
        "widen_num" => format!("{}.{:02}", n, n % 100),
        "narrow" => (n * 1000).to_string(),
        "drop_col" | "rename_col" | "not_null" => format!("'s{n}'"),
        _ => n.to_string(),
    }
}

fn extra_column(extra: &str) -> &str {
    extra.split_whitespace().next().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_stay_equal_through_every_ddl_kind_under_sigkills() -> Result<()> {
    let tables = all_tables();
    let names: Vec<&str> = tables.iter().map(|t| t.0).collect();
    let include = format!("public\\\\.({})", names.join("|"));
    let p = Pipeline::new(
        "ddl_under_sigkills",
        &schema(),
        &names,
        &format!(
            "snapshot.mode = \"initial\"\nincremental.snapshot.chunk.size = {CHUNK}\n\
             batch.max.events = 200\nbatch.max.ms = 20\n\
             signal.data.collection = \"public.oncely_signal\"\n\
             table.include.list = \"{include}\"\npublication.autocreate.mode = \"filtered\"\n"
        ),
    )
    .await?;
    let result = drive(&p, &tables).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drive(p: &Pipeline, tables: &[(&str, &str, &str)]) -> Result<()> {
    let names: Vec<&str> = tables.iter().map(|t| t.0).collect();
    let mut seed = String::new();
    for (table, extra, _) in tables {
        let column = extra_column(extra);
        for n in 1..=SEED_ROWS {
            seed.push_str(&format!(
                "INSERT INTO {table} (id, v, {column}) VALUES ({n}, {n}, {});",
                seed_value(table, n)
            ));
        }
    }
    p.env.client.batch_execute(&seed).await.context("seed")?;

    let mut fleet = Fleet::with_capture(p).await?;
    let topics = p.topics();
    capture::wait_for(&topics, Duration::from_secs(120), |seen| {
        topics.iter().all(|t| seen.iter().any(|r| &r.topic == t))
    })
    .await?;
    fleet.spawn_sinks()?;
    let mut load = Load::new(p.env.connect().await?, &names, SEED_ROWS);
    // Rows mirrored before any DDL.
    load.run(&mut fleet, Duration::from_secs(15)).await?;

    // DDL while capture is stopped.
    if let Some(mut child) = fleet.procs[0].take() {
        capture::kill9(&mut child);
    }
    load.source
        .batch_execute(STOPPED.2)
        .await
        .context("DDL while stopped")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.spawn(0)?;

    // DDL while a snapshot of that table runs (chunks of 10 rows of 80+).
    load.source
        .execute(
            "INSERT INTO oncely_signal VALUES ('ddl-snapshot', 'execute-snapshot', $1)",
            &[&format!(
                "{{\"data-collections\": [\"public.{}\"]}}",
                SNAPSHOTTED.0
            )],
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    load.source
        .batch_execute(SNAPSHOTTED.2)
        .await
        .context("DDL during snapshot")?;

    // Every other kind, one after the other under load.
    for (table, _, ddl) in TABLES {
        load.source
            .batch_execute(ddl)
            .await
            .with_context(|| format!("DDL of {table}"))?;
        load.run(&mut fleet, Duration::from_secs(2)).await?;
    }
    load.run(&mut fleet, Duration::from_secs(10)).await?;
    eprintln!(
        "ddl_under_sigkills: {} ({} rows inserted)",
        fleet.summary(),
        load.next
    );
    assert_all_equal(p, &fleet, tables.len()).await?;

    // The warehouse holds the renamed columns under their new names (no
    // unwritten old-name column beside them, also when a capture restarted
    // after the rename replays old-name events: capture ties those to the
    // column by its former names) and kept the dropped one
    // (`schema.evolution.drop.columns` = keep).
    for (table, has, lacks) in [
        ("rename_col", "b2", "b"),
        ("while_stopped", "x2", "x"),
        ("drop_col", "old", ""),
    ] {
        let columns = warehouse_columns(p, &format!("public_{table}")).await?;
        assert!(
            columns.iter().any(|c| c == has),
            "warehouse columns of {table}: {columns:?}"
        );
        assert!(
            !columns.iter().any(|c| c == lacks),
            "warehouse columns of {table}: {columns:?}"
        );
    }

    // The schema-change topic: each change once, as what it is.
    let changes = schema_changes(p).await?;
    for (table, kind) in [
        ("widen_int", "alter_type"),
        ("widen_num", "alter_type"),
        ("narrow", "alter_type"),
        ("using_expr", "alter_type"),
        ("add_default", "add"),
        ("add_plain", "add"),
        ("drop_col", "drop"),
        ("rename_col", "rename"),
        ("not_null", "nullability"),
        ("in_tx", "add"),
        ("while_stopped", "add"),
        ("while_stopped", "rename"),
        ("during_snapshot", "add"),
    ] {
        assert_eq!(
            count_changes(&changes, &format!("public.{table}"), kind),
            1,
            "{table} {kind}: {changes:?}"
        );
    }
    let rename = changes
        .iter()
        .find(|(t, c)| t == "public.rename_col" && c["kind"] == "rename")
        .map(|(_, c)| c.clone());
    assert_eq!(
        rename
            .as_ref()
            .map(|c| (c["from"].clone(), c["to"].clone())),
        Some((Value::from("b"), Value::from("b2")))
    );
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}
