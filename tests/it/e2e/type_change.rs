//! Column type changes that are not widenings, seen in every target:
//! `int` → `text` (then values that are no numbers), `int` →
//! `numeric(12,2)` (then fractions) and `date` → `timestamptz`. `ALTER
//! ... TYPE` rewrites the table without a row event, so the targets can be
//! equal only after capture backfills the table; the warehouse must take
//! the new type, the search index a mapping that takes the new values, the
//! cache the new form of rows the change did not touch. Each ends equal to
//! the source (`oncely verify`) with no dead letter and no manual step,
//! also with the sinks SIGKILLed while the backfill runs, and with capture
//! SIGKILLed right after the change (the backfill it owes is found again).
use std::time::Duration;

use anyhow::{Context, Result};

use crate::harness::capture;
use crate::harness::checks::dead_letters;
use crate::harness::e2e::{self, Fleet, Pipeline};
use elasticsearch::indices::IndicesGetAliasParts;

const TABLES: [&str; 3] = ["codes", "amounts", "dates"];

const SCHEMA: &str = "
    CREATE TABLE codes (id int PRIMARY KEY, v int NOT NULL, code int);
    CREATE TABLE amounts (id int PRIMARY KEY, v int NOT NULL, amount int);
    CREATE TABLE dates (id int PRIMARY KEY, v int NOT NULL, at date);
    INSERT INTO codes SELECT g, g, g * 10 FROM generate_series(1, 100) g;
    INSERT INTO amounts SELECT g, g, g * 3 FROM generate_series(1, 100) g;
    INSERT INTO dates SELECT g, g, date '2024-01-01' + g FROM generate_series(1, 100) g;
";

/// The three changes, then rows only the new types can hold.
const CHANGE: &str = "
    ALTER TABLE codes ALTER COLUMN code TYPE text;
    ALTER TABLE amounts ALTER COLUMN amount TYPE numeric(12,2);
    ALTER TABLE dates ALTER COLUMN at TYPE timestamptz;
    INSERT INTO codes SELECT g, g, 'c-' || g FROM generate_series(101, 110) g;
    UPDATE codes SET code = 'x' || id WHERE id <= 5;
    INSERT INTO amounts SELECT g, g, g + 0.25 FROM generate_series(101, 110) g;
    UPDATE amounts SET amount = id + 0.5 WHERE id <= 5;
    INSERT INTO dates SELECT g, g, timestamptz '2024-03-01 12:34:56+00' + g * interval '1 hour'
        FROM generate_series(101, 110) g;
    UPDATE dates SET at = at + interval '90 minutes' WHERE id <= 5;
";

/// Which processes are SIGKILLed around the change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kill {
    None,
    /// The three sinks, as soon as capture queued the backfill.
    SinksDuringBackfill,
    /// Capture, right after the DDL commits.
    CaptureAfterChange,
}

async fn run(name: &str, kill: Kill) -> Result<()> {
    let include = format!("public\\\\.({})", TABLES.join("|"));
    let p = Pipeline::new(
        name,
        SCHEMA,
        &TABLES,
        &format!(
            "snapshot.mode = \"initial\"\nincremental.snapshot.chunk.size = 10\n\
             table.include.list = \"{include}\"\n"
        ),
    )
    .await?;
    let result = drive(&p, kill).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drive(p: &Pipeline, kill: Kill) -> Result<()> {
    let mut fleet = Fleet::with_capture(p).await?;
    fleet.spawn_sinks()?;
    let writer = p.env.connect().await?;
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "not equal before the change:\n{report}");

    writer
        .batch_execute(CHANGE)
        .await
        .context("change the types")?;
    if kill == Kill::CaptureAfterChange {
        if let Some(mut child) = fleet.procs[0].take() {
            capture::kill9(&mut child);
        }
        fleet.kills[0] += 1;
    }
    if kill == Kill::SinksDuringBackfill {
        // The sinks are killed as soon as capture queued the backfill: while
        // they apply the new schema, move the index generations and write
        // the backfill's rows.
        let started = std::time::Instant::now();
        while !p.env.capture_log().contains("backfill=Some") {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "capture queued no backfill"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 1..4 {
            if let Some(mut child) = fleet.procs[i].take() {
                capture::kill9(&mut child);
            }
            fleet.kills[i] += 1;
        }
    }
    // Load on the untouched column while the backfill runs.
    for round in 0..20 {
        writer
            .batch_execute(&format!(
                "UPDATE codes SET v = v + 1 WHERE id % 20 = {round};
                 UPDATE amounts SET v = v + 1 WHERE id % 20 = {round};
                 UPDATE dates SET v = v + 1 WHERE id % 20 = {round};"
            ))
            .await
            .context("load")?;
        if round == 5 {
            match kill {
                Kill::SinksDuringBackfill => fleet.spawn_sinks()?,
                Kill::CaptureAfterChange => fleet.spawn(0)?,
                Kill::None => {}
            }
        }
        if round > 5 {
            // A capture started while its killed predecessor's walsender
            // still held the slot exits: start it again, as a supervisor would.
            fleet.supervise()?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    if kill != Kill::None {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            fleet.supervise()?;
        }
    }
    let report = p.verify_until_equal(Duration::from_secs(90)).await?;
    eprintln!("{report}");
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(
        letters.is_empty(),
        "{} dead letters, e.g. {:?}",
        letters.len(),
        &letters[..letters.len().min(3)]
    );
    assert!(
        report.is_equal(),
        "targets differ after the type changes ({}); logs in {}:\n{report}",
        fleet.summary(),
        p.env.dir.display()
    );
    assert_eq!(report.compared(), TABLES.len() * 3, "{report}");
    // The indexes of `codes` and `amounts` (mapped `long` before: it refuses
    // `c-101`, truncates `101.25`) are now aliases of their second
    // generation; `dates` (mapped `date`) kept its index.
    for (table, generation) in [
        ("codes", Some("g2")),
        ("amounts", Some("g2")),
        ("dates", None),
    ] {
        let index = format!("{}.public.{table}", p.env.prefix);
        let response = e2e::es()
            .indices()
            .get_alias(IndicesGetAliasParts::Index(&[&index]))
            .send()
            .await?;
        let aliases: serde_json::Value = response.json().await?;
        let concrete = generation.map_or(index.clone(), |g| format!("{index}-{g}"));
        assert!(
            aliases.get(&concrete).is_some() && aliases.as_object().is_some_and(|a| a.len() == 1),
            "{table}: {concrete} expected behind {index}: {aliases}"
        );
    }
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_follow_type_changes_that_are_not_widenings() -> Result<()> {
    run("type_change", Kill::None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_follow_type_changes_with_sinks_killed_during_the_backfill() -> Result<()> {
    run("type_change_kill", Kill::SinksDuringBackfill).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_follow_type_changes_with_capture_killed_right_after_the_change() -> Result<()> {
    run("type_change_capture", Kill::CaptureAfterChange).await
}
