//! Schema changes while streaming from MariaDB (docs/mysql.md, docs/design.md
//! "Schema changes"), the MySQL side of `ddl_under_sigkills` and on its
//! load-and-kill loop: one table per change (a column added, dropped,
//! added with a default that fills existing rows without row events,
//! renamed with `RENAME COLUMN` and with `CHANGE`, renamed and then added
//! again under its old name, `INT` widened to `BIGINT` with values beyond
//! 2^32, `VARCHAR(10)` to `VARCHAR(200)` with longer values), rows written
//! between the changes and during them, while capture and the three sinks
//! are SIGKILLed at random; some changes are followed by a kill of capture
//! before the next row event (at once, or once it has had time to read the
//! DDL and move its offset past it), the moment a schema history that is
//! not tied to binlog positions gets wrong. Then `oncely verify` must find
//! every copy equal with nothing dead-lettered, the warehouse must hold each
//! renamed column under its new name with the values written under the old
//! one (and keep the dropped one: `schema.evolution.drop.columns = "keep"`),
//! and the schema-change topic must name each change once, as what it is.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde_json::Value;

use crate::harness::capture;
use crate::harness::chaos::{
    assert_all_equal, count_changes, schema_changes, warehouse_columns, Load,
};
use crate::harness::common::unique;
use crate::harness::e2e::{Fleet, Pipeline, WAREHOUSE_SCHEMA};
use crate::mysql_binlog::admin;
use crate::mysql_capture::mysql_pipeline;

/// Every table has `id` (key) and `v` (the load's column, never changed by
/// DDL) beside the columns its changes touch: (table, those columns).
const TABLES: &[(&str, &str)] = &[
    ("widen_int", "a int"),
    ("widen_text", "s varchar(10)"),
    ("add_col", "x int"),
    ("add_default", "x int"),
    // A column after the dropped one: its position changes, not its name.
    ("drop_col", "old varchar(20), tail int"),
    ("rename_col", "b varchar(20)"),
    ("change_col", "c varchar(20)"),
    ("rename_readd", "r varchar(20)"),
];

/// When capture is killed around a change.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// No kill of its own: the DDL runs on a connection of its own while
    /// the load writes (and the random kills go on).
    DuringLoad,
    /// Capture killed right after the DDL, before any further write.
    KillAtOnce,
    /// Capture killed once it has had a heartbeat's time to read the DDL
    /// and store an offset past it, before any further write.
    KillAfterQuiet,
}

/// The changes, in order: (table, DDL, statements right after it, moment).
const STEPS: &[(&str, &str, &[&str], Moment)] = &[
    (
        "widen_int",
        "ALTER TABLE widen_int MODIFY a bigint",
        &["UPDATE widen_int SET a = 5000000000 + id WHERE id % 3 = 0"],
        Moment::KillAfterQuiet,
    ),
    (
        "widen_text",
        "ALTER TABLE widen_text MODIFY s varchar(200)",
        &["UPDATE widen_text SET s = CONCAT(REPEAT('w', 150), id) WHERE id % 3 = 0"],
        Moment::DuringLoad,
    ),
    (
        "add_col",
        "ALTER TABLE add_col ADD COLUMN c int",
        &["UPDATE add_col SET c = id * 7 WHERE id % 4 = 0"],
        Moment::KillAtOnce,
    ),
    (
        // Existing rows filled without row events: the backfill's.
        "add_default",
        "ALTER TABLE add_default ADD COLUMN d int NOT NULL DEFAULT 7",
        &[],
        Moment::KillAfterQuiet,
    ),
    (
        "drop_col",
        "ALTER TABLE drop_col DROP COLUMN old",
        &["UPDATE drop_col SET tail = -id WHERE id % 3 = 0"],
        Moment::KillAfterQuiet,
    ),
    (
        "rename_col",
        "ALTER TABLE rename_col RENAME COLUMN b TO b2",
        &[],
        Moment::KillAfterQuiet,
    ),
    (
        "change_col",
        "ALTER TABLE change_col CHANGE c c2 varchar(40)",
        &[],
        Moment::DuringLoad,
    ),
    (
        "rename_readd",
        "ALTER TABLE rename_readd RENAME COLUMN r TO r2",
        &[],
        Moment::KillAtOnce,
    ),
    (
        "rename_readd",
        "ALTER TABLE rename_readd ADD COLUMN r varchar(20)",
        &["UPDATE rename_readd SET r = CONCAT('new', id) WHERE id % 2 = 0"],
        Moment::KillAfterQuiet,
    ),
];

const SEED_ROWS: i64 = 60;

/// The columns whose values the warehouse must hold as MariaDB does,
/// compared as text: the renamed ones (values written under the old name),
/// the one added under a renamed column's old name, the widened ones, and
/// the one that moved up when the column before it was dropped.
const CARRIED: &[(&str, &str)] = &[
    ("rename_col", "b2"),
    ("change_col", "c2"),
    ("rename_readd", "r2"),
    ("rename_readd", "r"),
    ("widen_int", "a"),
    ("widen_text", "s"),
    ("drop_col", "tail"),
    ("add_default", "d"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_targets_stay_equal_through_ddl_while_streaming_under_sigkills() -> Result<()> {
    let mut root = admin().await;
    let db = unique("oncely_myddlk");
    root.query_drop(format!("CREATE DATABASE {db}")).await?;
    let names: Vec<&str> = TABLES.iter().map(|t| t.0).collect();
    let p = mysql_pipeline(
        "myddlk",
        &db,
        &names,
        "snapshot.mode = \"initial\"\nbatch.max.events = 200\nbatch.max.ms = 20\n",
    )
    .await?;
    let result = drive(&p, &db, &names).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    p.cleanup().await;
    result
}

/// A connection to MariaDB using `db`.
async fn connect(db: &str) -> Result<Conn> {
    let mut conn = admin().await;
    conn.query_drop(format!("USE {db}")).await?;
    Ok(conn)
}

async fn drive(p: &Pipeline, db: &str, names: &[&str]) -> Result<()> {
    let mut ddl = connect(db).await?;
    for (table, column) in TABLES {
        ddl.query_drop(format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, {column})"
        ))
        .await?;
        let values: Vec<String> = (1..=SEED_ROWS)
            .map(|n| {
                let seeds: Vec<String> = column
                    .split(", ")
                    .map(|c| {
                        if c.contains("varchar") {
                            format!("'s{n}'")
                        } else {
                            n.to_string()
                        }
                    })
                    .collect();
                format!("({n}, {n}, {})", seeds.join(", "))
            })
            .collect();
        ddl.query_drop(format!("INSERT INTO {table} VALUES {}", values.join(", ")))
            .await
            .context("seed")?;
    }

    let mut fleet = Fleet::new(p);
    fleet.spawn(0)?;
    let topics = p.topics();
    p.env
        .wait_for(&topics, Duration::from_secs(120), |seen| {
            topics.iter().all(|t| seen.iter().any(|r| &r.topic == t))
        })
        .await?;
    fleet.spawn_sinks()?;
    let mut load = Load::new(connect(db).await?, names, SEED_ROWS);
    // Rows mirrored before any DDL.
    load.run(&mut fleet, Duration::from_secs(10)).await?;

    for (table, statement, after, moment) in STEPS {
        let what = || format!("DDL of {table} ({statement})");
        match moment {
            Moment::DuringLoad => {
                let alter = async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    ddl.query_drop(*statement).await.with_context(what)
                };
                tokio::try_join!(alter, load.run(&mut fleet, Duration::from_secs(1)))?;
            }
            Moment::KillAtOnce | Moment::KillAfterQuiet => {
                ddl.query_drop(*statement).await.with_context(what)?;
                if matches!(moment, Moment::KillAfterQuiet) {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                }
                fleet.kill(0)?;
            }
        }
        for s in *after {
            ddl.query_drop(*s).await.with_context(what)?;
        }
        load.run(&mut fleet, Duration::from_secs(2)).await?;
    }
    load.run(&mut fleet, Duration::from_secs(8)).await?;
    eprintln!(
        "mysql_ddl_under_sigkills: {} ({} rows inserted)",
        fleet.summary(),
        load.next
    );
    assert_all_equal(p, &fleet, TABLES.len()).await?;

    // Renamed columns under their new names only (the old name of
    // `rename_readd` is a new column), the dropped column kept.
    for (table, has, lacks) in [
        ("rename_col", &["b2"][..], &["b"][..]),
        ("change_col", &["c2"], &["c"]),
        ("rename_readd", &["r2", "r"], &[]),
        ("drop_col", &["old"], &[]),
        ("add_col", &["c"], &[]),
        ("add_default", &["d"], &[]),
    ] {
        let columns = warehouse_columns(p, &format!("{db}_{table}")).await?;
        for c in has {
            assert!(
                columns.iter().any(|x| x == c),
                "warehouse columns of {table}: {columns:?}"
            );
        }
        for c in lacks {
            assert!(
                !columns.iter().any(|x| x == c),
                "warehouse columns of {table}: {columns:?}"
            );
        }
    }
    for (table, column) in CARRIED {
        let source = source_values(&mut ddl, table, column).await?;
        let warehouse = warehouse_values(p, db, table, column).await?;
        assert!(
            source.values().any(Option::is_some),
            "{table}.{column} holds values"
        );
        assert_eq!(warehouse, source, "{table}.{column} in the warehouse");
    }
    // The renamed column holds the seed values written under the old name.
    let kept = source_values(&mut ddl, "rename_col", "b2").await?;
    assert!(
        kept.iter()
            .filter(|(id, _)| **id <= SEED_ROWS)
            .all(|(id, b)| b.as_deref() == Some(format!("s{id}").as_str())),
        "{kept:?}"
    );

    // The schema-change topic: each change once, as what it is.
    let changes = schema_changes(p).await?;
    for (table, kind) in [
        ("widen_int", "alter_type"),
        ("widen_text", "alter_type"),
        ("add_col", "add"),
        ("add_default", "add"),
        ("drop_col", "drop"),
        ("rename_col", "rename"),
        ("change_col", "rename"),
        ("change_col", "alter_type"),
        ("rename_readd", "rename"),
        ("rename_readd", "add"),
    ] {
        assert_eq!(
            count_changes(&changes, &format!("{db}.{table}"), kind),
            1,
            "{table} {kind}: {changes:?}"
        );
    }
    for (table, from, to) in [
        ("rename_col", "b", "b2"),
        ("change_col", "c", "c2"),
        ("rename_readd", "r", "r2"),
    ] {
        let rename = changes
            .iter()
            .find(|(t, c)| t == &format!("{db}.{table}") && c["kind"] == "rename")
            .map(|(_, c)| (c["from"].clone(), c["to"].clone()));
        assert_eq!(
            rename,
            Some((Value::from(from), Value::from(to))),
            "{changes:?}"
        );
    }
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}

/// `id -> column` of a MariaDB table, as text.
async fn source_values(
    conn: &mut Conn,
    table: &str,
    column: &str,
) -> Result<BTreeMap<i64, Option<String>>> {
    let rows: Vec<(i64, Option<String>)> = conn
        .query(format!("SELECT id, CAST({column} AS CHAR) FROM {table}"))
        .await?;
    Ok(rows.into_iter().collect())
}

/// `id -> column` of the warehouse's copy of a table (its live rows), as text.
async fn warehouse_values(
    p: &Pipeline,
    db: &str,
    table: &str,
    column: &str,
) -> Result<BTreeMap<i64, Option<String>>> {
    let rows = p
        .env
        .client
        .query(
            &format!(
                "SELECT id::bigint, {column}::text FROM {WAREHOUSE_SCHEMA}.{db}_{table} \
                 WHERE NOT __oncely_deleted"
            ),
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
