//! Generated columns (docs/capture.md): PostgreSQL 18 publishes
//! *stored* generated columns when the publication asks for them
//! (`publish_generated_columns = stored`, which capture sets), so every
//! target mirrors them — through the initial snapshot, the stream, and a
//! column added later, whose values appear in every existing row without a
//! row event (capture's schema-change backfill covers it). Virtual generated
//! columns (PostgreSQL 18) are never published. Older servers publish no
//! generated column at all: the targets leave them out and `oncely verify`
//! skips them.
//!
//! `scripts/test` runs this file against PostgreSQL 15 and again with
//! `ONCELY_PG_URL` pointing at PostgreSQL 18, so both rules are checked.
use std::time::Duration;

use anyhow::{Context, Result};
use redis::AsyncCommands;

use crate::harness::capture;
use crate::harness::checks::dead_letters;
use crate::harness::common;
use crate::harness::e2e::{redis_conn, Fleet, Pipeline, WAREHOUSE_SCHEMA};

const ROWS: i64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_generated_columns_are_mirrored_where_the_server_publishes_them() -> Result<()> {
    let admin = capture::connect(&common::pg_url()).await?;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    let publishes = version >= 180_000;
    // PostgreSQL 18 makes a generated column virtual unless told STORED.
    let virtual_column = if publishes {
        ", v integer GENERATED ALWAYS AS (a + 1) VIRTUAL"
    } else {
        ""
    };
    let schema = format!(
        "CREATE TABLE gen (id integer PRIMARY KEY, a integer NOT NULL, body text,
                           s integer GENERATED ALWAYS AS (a * 2) STORED{virtual_column});
         INSERT INTO gen (id, a, body) SELECT g, g, 'row ' || g FROM generate_series(1, {ROWS}) g;"
    );
    let p = Pipeline::new(
        "generated",
        &schema,
        &["gen"],
        "snapshot.mode = \"initial\"\npublication.autocreate.mode = \"filtered\"\n",
    )
    .await?;
    let result = drive(&p, publishes).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drive(p: &Pipeline, publishes: bool) -> Result<()> {
    let mut fleet = Fleet::with_capture(p).await?;
    fleet.spawn_sinks()?;
    let writer = p.env.connect().await?;
    writer
        .batch_execute(&format!(
            "UPDATE gen SET a = a + 100 WHERE id % 3 = 0;
             DELETE FROM gen WHERE id % 7 = 0;
             INSERT INTO gen (id, a, body) SELECT g, g, 'late ' || g FROM generate_series({}, {}) g;",
            ROWS + 1,
            ROWS + 10
        ))
        .await
        .context("stream changes")?;
    // A stored generated column added later: PostgreSQL rewrites every row
    // without a row event, so only the backfill brings its values.
    writer
        .batch_execute(
            "ALTER TABLE gen ADD COLUMN t bigint GENERATED ALWAYS AS (a::bigint * 3) STORED",
        )
        .await
        .context("add a generated column")?;
    writer
        .batch_execute("UPDATE gen SET body = body || '!' WHERE id % 5 = 0")
        .await?;

    // The initial snapshot and, on 18, the backfill of `t` may still be
    // publishing when the stream is caught up.
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    eprintln!("{report}");
    let differing: Vec<String> = report
        .targets
        .iter()
        .flat_map(|t| {
            t.tables
                .iter()
                .filter(|r| !r.is_equal())
                .map(|r| format!("{} {}", t.label, r.table))
        })
        .collect();
    assert!(
        differing.is_empty(),
        "targets differ: {differing:?}\n{report}"
    );
    assert_eq!(report.compared(), 3, "{report}");
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(letters.is_empty(), "dead letters: {letters:?}");

    // verify compares the columns pgoutput sends; check the generated ones
    // directly too, so a rule that left them out everywhere cannot pass.
    let columns: Vec<String> = p
        .env
        .client
        .query(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = $1 AND table_name = 'public_gen' ORDER BY ordinal_position",
            &[&WAREHOUSE_SCHEMA],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        !columns.iter().any(|c| c == "v"),
        "a virtual column was mirrored: {columns:?}"
    );
    let mut redis = redis_conn().await?;
    let key = format!("{}:gen:9", p.redis_prefix);
    let cached_s: Option<String> = redis.hget(&key, "s").await?;
    let cached_t: Option<String> = redis.hget(&key, "t").await?;
    if publishes {
        assert!(
            columns.iter().any(|c| c == "s") && columns.iter().any(|c| c == "t"),
            "stored generated columns missing in the warehouse: {columns:?}"
        );
        let wrong: i64 = p
            .env
            .client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {WAREHOUSE_SCHEMA}.public_gen
                     WHERE NOT __oncely_deleted AND (s IS DISTINCT FROM a * 2 OR t IS DISTINCT FROM a * 3)"
                ),
                &[],
            )
            .await?
            .get(0);
        assert_eq!(wrong, 0, "warehouse rows with wrong generated values");
        // Row 9 was updated to a = 109.
        assert_eq!(cached_s.as_deref(), Some("218"), "cache field s of {key}");
        assert_eq!(cached_t.as_deref(), Some("327"), "cache field t of {key}");
    } else {
        assert!(
            !columns.iter().any(|c| c == "s" || c == "t"),
            "PostgreSQL < 18 publishes no generated column, yet the warehouse has one: {columns:?}"
        );
        assert_eq!((cached_s, cached_t), (None, None), "cache fields of {key}");
    }
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}
