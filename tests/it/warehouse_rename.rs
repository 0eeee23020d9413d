//! The warehouse follows RENAME COLUMN and DROP COLUMN by source attnum
//! (docs/capture.md, "Schema changes"): capture names each field's attnum,
//! the warehouse records it in the column's comment and maps fields to
//! columns by it.
//!
//! `renamed_columns_are_renamed_and_old_events_land_in_them`: with the
//! backfill off (so rows untouched after the DDL have only events under the
//! old name), `RENAME a TO b; ADD COLUMN a` must leave the warehouse with
//! `b` holding every row's old value and a new, distinct `a`; then every
//! event is replayed by a new consumer group into the emptied table (the
//! old-name events arriving after the rename): they must land in `b`, not
//! in the new `a`, and add no column.
//!
//! `a_rename_while_capture_is_stopped_keeps_old_events_in_the_renamed_column`:
//! capture restarted after a rename still ties the older, not yet published
//! old-name events to the column (through the former names its
//! schema-change records carry); replayed after the warehouse renamed the
//! column they must land in it and add no old-name column.
//!
//! `attnums_are_read_once_the_relations_transaction_is_visible`: the
//! walsender sends a transaction a moment before other sessions see it
//! committed; capture's catalog read for a Relation must wait for it, or
//! the fields of `RENAME a TO b; ADD COLUMN a` get the old catalog's
//! attnums (the new `a` the old `a`'s, `b` none).
//!
//! `dropped_columns_follow_the_setting`: `schema.evolution.drop.columns`
//! `drop` removes the column, the default `keep` keeps it.
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use oncely_capture::testing::{identity, ColumnDef};
use oncely_capture::testing::{Column, Relation, ReplicaIdentity};

use crate::harness::capture;
use crate::harness::capture::{kill9, CaptureEnv, Spawned};
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

async fn count(p: &Pipeline, schema: &str, table: &str) -> i64 {
    p.env
        .client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.public_{table} WHERE NOT __oncely_deleted"),
            &[],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(-1)
}

async fn wait_rows(p: &Pipeline, schema: &str, table: &str, rows: i64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(p, schema, table).await != rows {
        if Instant::now() > deadline {
            bail!(
                "{schema}.public_{table} has {} rows, not {rows}; logs in {}",
                count(p, schema, table).await,
                p.env.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The source columns of a warehouse table (the sink's own left out), in order.
async fn columns(p: &Pipeline, schema: &str, table: &str) -> Result<Vec<String>> {
    let rows = p
        .env
        .client
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 AND column_name NOT LIKE '\\_\\_oncely%' \
             ORDER BY column_name",
            &[&schema, &format!("public_{table}")],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

async fn assert_equal(p: &Pipeline) -> Result<()> {
    let report = p.verify_until_equal(Duration::from_secs(60)).await?;
    assert!(
        report.is_equal(),
        "targets differ; logs in {}:\n{report}",
        p.env.dir.display()
    );
    Ok(())
}

fn stop(child: &mut Spawned) {
    kill9(&mut child.0);
}

/// Empties the warehouse table and starts the warehouse sink again under a
/// new consumer group, so every event is applied once more after the
/// warehouse already renamed its columns; waits for `rows` rows.
async fn replay_into_emptied(p: &mut Pipeline, table: &str, rows: i64) -> Result<Spawned> {
    let w = WAREHOUSE_SCHEMA;
    p.env
        .client
        .batch_execute(&format!("DELETE FROM {w}.public_{table}"))
        .await?;
    let sink_table = format!(
        "[sink]\nkind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"{w}\"\n",
        capture::db_url(&p.env.dbname)
    );
    p.add_sink("replay", &sink_table)?;
    p.sinks.remove(0);
    let replay = p.spawn_sink(0)?;
    wait_rows(p, w, table, rows).await?;
    Ok(replay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_columns_are_renamed_and_old_events_land_in_them() -> Result<()> {
    let mut p = Pipeline::new(
        "wh_rename",
        "CREATE TABLE ren (id int PRIMARY KEY, v int, a text)",
        &["ren"],
        "snapshot.mode = \"initial\"\nschema.change.backfill = \"off\"\n",
    )
    .await?;
    // Only the warehouse.
    p.sinks.truncate(1);
    let result = rename(&mut p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn rename(p: &mut Pipeline) -> Result<()> {
    let w = WAREHOUSE_SCHEMA;
    let db = p.env.connect().await?;
    db.batch_execute("INSERT INTO ren SELECT n, n, 's' || n FROM generate_series(1, 20) n")
        .await?;
    let mut capture = p.spawn_capture()?;
    let mut sink = p.spawn_sink(0)?;
    wait_rows(p, w, "ren", 20).await?;
    assert_eq!(columns(p, w, "ren").await?, ["a", "id", "v"]);

    // Rows 6..=20 get no event after the DDL (no backfill): only their
    // old-name events say what `b` holds.
    db.batch_execute(
        "ALTER TABLE ren RENAME COLUMN a TO b; ALTER TABLE ren ADD COLUMN a text;\
         INSERT INTO ren SELECT n, n, 'n' || n, 'A' || n FROM generate_series(21, 30) n;\
         UPDATE ren SET a = 'u' || id WHERE id <= 5",
    )
    .await?;
    wait_rows(p, w, "ren", 30).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while p
        .env
        .client
        .query_one(
            &format!("SELECT count(*) FROM {w}.public_ren WHERE a IS NOT NULL"),
            &[],
        )
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
        < 15
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(columns(p, w, "ren").await?, ["a", "b", "id", "v"]);
    assert_equal(p).await?;

    // Every event again, into the emptied table, by a new group: the
    // old-name events come after the warehouse renamed the column.
    stop(&mut sink);
    let mut replay = replay_into_emptied(p, "ren", 30).await?;
    let old_values: i64 = db
        .query_one(
            &format!("SELECT count(*) FROM {w}.public_ren WHERE b = 's' || id AND id BETWEEN 6 AND 20 AND a IS NULL"),
            &[],
        )
        .await?
        .get(0);
    assert_eq!(
        old_values, 15,
        "rows 6..=20 hold their old-name values in b"
    );
    assert_eq!(columns(p, w, "ren").await?, ["a", "b", "id", "v"]);
    assert_equal(p).await?;
    stop(&mut replay);
    stop(&mut capture);
    Ok(())
}

/// A rename committed while capture is stopped, after rows it has not
/// published yet: at start capture sees the new name in the catalog (and
/// publishes the rename) before it streams those rows, whose Relation still
/// says `a`. Their field must still carry `a`'s attnum, or the warehouse
/// adds a column `a` beside the renamed `b` when the events are applied
/// after the rename (seen under SIGKILLs in ddl_under_sigkills).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_while_capture_is_stopped_keeps_old_events_in_the_renamed_column() -> Result<()> {
    let mut p = Pipeline::new(
        "wh_ren_stopped",
        "CREATE TABLE ren_stopped (id int PRIMARY KEY, v int, a text)",
        &["ren_stopped"],
        "snapshot.mode = \"initial\"\nschema.change.backfill = \"off\"\n",
    )
    .await?;
    p.sinks.truncate(1);
    let result = rename_while_stopped(&mut p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn rename_while_stopped(p: &mut Pipeline) -> Result<()> {
    let w = WAREHOUSE_SCHEMA;
    let db = p.env.connect().await?;
    db.batch_execute("INSERT INTO ren_stopped SELECT n, n, 's' || n FROM generate_series(1, 10) n")
        .await?;
    let mut capture = p.spawn_capture()?;
    let mut sink = p.spawn_sink(0)?;
    wait_rows(p, w, "ren_stopped", 10).await?;
    stop(&mut capture);
    db.batch_execute(
        "INSERT INTO ren_stopped SELECT n, n, 's' || n FROM generate_series(11, 20) n;\
         ALTER TABLE ren_stopped RENAME COLUMN a TO b;\
         INSERT INTO ren_stopped SELECT n, n, 's' || n FROM generate_series(21, 30) n",
    )
    .await?;
    let mut capture = p.spawn_capture()?;
    wait_rows(p, w, "ren_stopped", 30).await?;
    stop(&mut sink);
    let mut replay = replay_into_emptied(p, "ren_stopped", 30).await?;
    let in_b: i64 = db
        .query_one(
            &format!("SELECT count(*) FROM {w}.public_ren_stopped WHERE b = 's' || id"),
            &[],
        )
        .await?
        .get(0);
    assert_eq!(
        columns(p, w, "ren_stopped").await?,
        ["b", "id", "v"],
        "no column for the old name"
    );
    assert_eq!(in_b, 30, "every row's value is in b");
    assert_equal(p).await?;
    stop(&mut replay);
    stop(&mut capture);
    Ok(())
}

/// The failure seen under load in `renamed_columns_are_renamed_and_old_events_land_in_them`:
/// capture read the attnums of the DDL transaction's Relation `[id, v, b, a]`
/// before that transaction was visible to its control connection, so the
/// events said `a` = attnum 3 (the renamed column) and `b` = none; the
/// warehouse then wrote the new `a` into the old column and added an empty
/// `b` (rows untouched after the DDL lost their value in `b`). Here the
/// DDL's transaction is held open, as it is in that moment, while the
/// Relation it sends is resolved; committed half a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attnums_are_read_once_the_relations_transaction_is_visible() -> Result<()> {
    let env = CaptureEnv::new("wh_ren_visible").await?;
    let result = attnums_wait(&env).await;
    if result.is_err() {
        eprintln!("database {}", env.dbname);
    }
    env.cleanup().await;
    result
}

async fn attnums_wait(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute("CREATE TABLE vis (id int PRIMARY KEY, v int, a text)")
        .await?;
    let oid: u32 = env
        .client
        .query_one("SELECT 'public.vis'::regclass::oid", &[])
        .await?
        .get(0);
    let ddl = env.connect().await?;
    ddl.batch_execute(
        "BEGIN; ALTER TABLE vis RENAME COLUMN a TO b; ALTER TABLE vis ADD COLUMN a text",
    )
    .await?;
    let xid: i64 = ddl
        .query_one("SELECT (txid_current() % 4294967296)::bigint", &[])
        .await?
        .get(0);
    let column = |name: &str, type_oid: u32| Column {
        is_key: name == "id",
        name: name.into(),
        type_oid,
        type_modifier: -1,
    };
    // The Relation pgoutput sends with the DDL's transaction.
    let rel = Relation {
        id: oid,
        namespace: "public".into(),
        name: "vis".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            column("id", 23),
            column("v", 23),
            column("b", 25),
            column("a", 25),
        ],
    };
    // The columns capture last published (before the DDL).
    let def = |attnum: i16, name: &str, type_name: &str| ColumnDef {
        attnum,
        name: name.into(),
        type_name: type_name.into(),
        not_null: attnum == 1,
        has_default: false,
    };
    let known = vec![
        def(1, "id", "integer"),
        def(2, "v", "integer"),
        def(3, "a", "text"),
    ];
    let reader = env.connect().await?;
    let xid = u32::try_from(xid)?;
    let read =
        tokio::spawn(async move { identity(&reader, &rel, Some(&known), &[], Some(xid)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ddl.batch_execute("COMMIT").await?;
    let found = read.await??.context("no identity for the table")?;
    assert_eq!(
        found.attnums,
        [Some(1), Some(2), Some(3), Some(4)],
        "attnums of [id, v, b, a] after RENAME a TO b; ADD COLUMN a"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_columns_follow_the_setting() -> Result<()> {
    let mut p = Pipeline::new(
        "wh_drop",
        "CREATE TABLE dropt (id int PRIMARY KEY, v int, old text)",
        &["dropt"],
        "snapshot.mode = \"initial\"\n",
    )
    .await?;
    p.sinks.truncate(1);
    p.extend_sink_config(0, "schema.evolution.drop.columns = \"drop\"")?;
    p.add_sink(
        "keep",
        &format!(
            "[sink]\nkind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"wh_keep\"\n",
            capture::db_url(&p.env.dbname)
        ),
    )?;
    let result = drop_columns(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drop_columns(p: &Pipeline) -> Result<()> {
    let db = &p.env.client;
    db.batch_execute("INSERT INTO dropt SELECT n, n, 'o' || n FROM generate_series(1, 20) n")
        .await?;
    let mut capture = p.spawn_capture()?;
    let mut drop_sink = p.spawn_sink(0)?;
    let mut keep_sink = p.spawn_sink(1)?;
    wait_rows(p, WAREHOUSE_SCHEMA, "dropt", 20).await?;
    wait_rows(p, "wh_keep", "dropt", 20).await?;
    db.batch_execute(
        "ALTER TABLE dropt DROP COLUMN old;\
         INSERT INTO dropt SELECT n, n FROM generate_series(21, 25) n",
    )
    .await?;
    wait_rows(p, WAREHOUSE_SCHEMA, "dropt", 25).await?;
    wait_rows(p, "wh_keep", "dropt", 25).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while columns(p, WAREHOUSE_SCHEMA, "dropt").await? != ["id", "v"] {
        if Instant::now() > deadline {
            bail!(
                "drop: columns {:?}",
                columns(p, WAREHOUSE_SCHEMA, "dropt").await?
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(columns(p, "wh_keep", "dropt").await?, ["id", "old", "v"]);
    let kept: i64 = db
        .query_one(
            "SELECT count(*) FROM wh_keep.public_dropt WHERE old = 'o' || id",
            &[],
        )
        .await
        .context("kept values")?
        .get(0);
    assert_eq!(kept, 20, "keep: old rows keep their values");
    assert_equal(p).await?;
    stop(&mut drop_sink);
    stop(&mut keep_sink);
    stop(&mut capture);
    Ok(())
}
