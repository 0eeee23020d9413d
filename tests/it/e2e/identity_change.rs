//! A replica identity broken while the pipeline runs (docs/design.md,
//! "Tables, keys and identities"),
//! seen in the targets: capture refuses the broken table's changes from the
//! Relation message on, so the warehouse, the search index and the cache
//! keep exactly what they held before the break (no half-applied key change,
//! no delete without its key), while the other tables go on and stay equal
//! to the source. `tests/it/capture/replica_identity.rs` checks the refusal on
//! the topics; this checks it where users look.
use std::time::Duration;

use anyhow::{Context, Result};
use oncely::verify::Report;

use crate::harness::capture;
use crate::harness::checks::dead_letters;
use crate::harness::e2e::{Fleet, Pipeline};

const SCHEMA: &str = "
    CREATE TABLE people (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text);
    CREATE TABLE other (id int PRIMARY KEY, v text);
    INSERT INTO people SELECT g, 'p' || g || '@x', 'v' || g FROM generate_series(1, 20) g;
    INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 20) g;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_keep_a_refused_table_and_follow_the_others() -> Result<()> {
    let p = Pipeline::new(
        "identity_change",
        SCHEMA,
        &["people", "other"],
        "snapshot.mode = \"initial\"\ntable.include.list = \"public\\\\.(people|other)\"\n",
    )
    .await?;
    let result = drive(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

/// The report of `table` in each target, as (label, missing, changed, extra).
fn counts(report: &Report, table: &str) -> Vec<(String, u64, u64, u64)> {
    report
        .targets
        .iter()
        .flat_map(|t| {
            t.tables
                .iter()
                .filter(|r| r.table.ends_with(table))
                .map(|r| (t.label.clone(), r.missing, r.changed, r.extra))
        })
        .collect()
}

async fn drive(p: &Pipeline) -> Result<()> {
    let mut fleet = Fleet::with_capture(p).await?;
    fleet.spawn_sinks()?;
    let writer = p.env.connect().await?;
    writer
        .batch_execute("UPDATE people SET v = 'early' WHERE id <= 5; UPDATE other SET v = 'early' WHERE id <= 5")
        .await?;
    // The initial snapshot may still be publishing when the stream is caught up.
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "not equal before the break:\n{report}");

    // The identity moves to the email index while streaming: an update of
    // the key or a delete would now carry no id.
    writer
        .batch_execute(
            "ALTER TABLE people REPLICA IDENTITY USING INDEX people_email_key;
             UPDATE people SET id = 100 WHERE id = 1;
             DELETE FROM people WHERE id IN (2, 3);
             UPDATE people SET v = 'late' WHERE id = 4;
             INSERT INTO people VALUES (50, 'p50@x', 'new');
             UPDATE other SET v = 'late' WHERE id <= 10;
             DELETE FROM other WHERE id = 11;
             UPDATE other SET id = 200 WHERE id = 12;
             INSERT INTO other VALUES (51, 'new');",
        )
        .await
        .context("break the identity")?;
    let report = p.verify(Duration::from_secs(180)).await?;
    eprintln!("{report}");
    let log = p.env.capture_log();
    assert!(
        log.contains("table public.people has REPLICA IDENTITY USING INDEX on (email)"),
        "no refusal in the capture log"
    );
    for (label, missing, changed, extra) in counts(&report, "other") {
        assert_eq!(
            (missing, changed, extra),
            (0, 0, 0),
            "{label}: the table whose identity is intact must stay equal:\n{report}"
        );
    }
    // people holds its state from before the break in every target: rows
    // 100 and 50 missing, 4 with its old value, 1, 2 and 3 still there.
    let people = counts(&report, "people");
    assert_eq!(people.len(), 3, "{report}");
    for (label, missing, changed, extra) in people {
        assert_eq!(
            (missing, changed, extra),
            (2, 1, 3),
            "{label}: the refused table must keep what it held:\n{report}"
        );
    }
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(letters.is_empty(), "dead letters: {letters:?}");
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}
