//! Truncates mirrored in every target, through the whole pipeline on
//! three-partition topics: capture puts a copy of each truncate on every
//! partition, and the warehouse, the search index (hard and soft deletes) and
//! the cache (hash and JSON layouts) each remove the rows older than the
//! truncate and keep the rows written after it — in the same source
//! transaction and in the next one — while every sink is SIGKILLed in the
//! middle of applying the truncate and started again. Then `oncely verify`
//! finds every target equal to the source and no sink dead-lettered anything.
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::harness::capture::{kill9, Spawned};
use crate::harness::checks::dead_letters;
use crate::harness::e2e::Pipeline;

/// Rows before the first truncate.
const ROWS: i64 = 400;

/// What a sink's log says once it applied a copy of a truncate: the moment
/// to kill it, with the copies of the other partitions likely still to come.
fn applied_a_truncate(p: &Pipeline, i: usize) -> bool {
    let log = p.sink_log(i);
    log.contains("truncate applied")
}

/// Kills sink `i` once it applied a copy of a truncate (or after `timeout`)
/// and starts it again.
async fn kill_during_truncate(
    p: &Pipeline,
    i: usize,
    sink: &mut Spawned,
    timeout: Duration,
    seen: usize,
) -> Result<Spawned> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let copies = p.sink_log(i).matches("truncate applied").count();
        if copies > seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kill9(sink);
    p.spawn_sink(i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncates_reach_every_target_through_sigkills() -> Result<()> {
    let mut p = Pipeline::new(
        "e2e_truncate",
        "CREATE TABLE t (id bigint PRIMARY KEY, v text, n int);",
        &["t"],
        "topic.creation.default.partitions = 3\n",
    )
    .await?;
    // The warehouse deletes (instead of tombstoning) the rows a truncate removes.
    p.extend_sink_config(0, "truncate.mode = \"truncate\"")?;
    p.add_soft_index_and_json_cache()?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks: Vec<Spawned> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_>>()?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO t SELECT g, 'first', 0 FROM generate_series(1, {ROWS}) g;
             UPDATE t SET n = 1 WHERE id % 3 = 0;"
        ))
        .await?;
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "before the truncates:\n{report}");

    // A truncate inside a transaction, rows before and after it in the same
    // transaction, rows in the next one; each sink killed while it applies
    // the truncate's copies.
    p.env
        .client
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO t SELECT g, 'same tx, before', 0 FROM generate_series({}, {}) g;
             UPDATE t SET n = 2 WHERE id % 5 = 0;
             TRUNCATE t;
             INSERT INTO t SELECT g, 'same tx, after', 0 FROM generate_series(1, 60) g;
             COMMIT;
             INSERT INTO t SELECT g, 'next tx', 0 FROM generate_series(61, 150) g;
             UPDATE t SET n = 3 WHERE id % 7 = 0;
             DELETE FROM t WHERE id % 11 = 0;",
            ROWS + 1,
            ROWS + 100
        ))
        .await?;
    for (i, sink) in sinks.iter_mut().enumerate() {
        let restarted = kill_during_truncate(&p, i, sink, Duration::from_secs(60), 0).await?;
        *sink = restarted;
    }
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "after the first truncate:\n{report}");
    assert_eq!(report.compared(), p.sinks.len(), "{report}");

    // A truncate in a transaction of its own, new rows in the next one.
    let before: Vec<usize> = (0..p.sinks.len())
        .map(|i| p.sink_log(i).matches("truncate applied").count())
        .collect();
    p.env
        .client
        .batch_execute(
            "TRUNCATE t;
             INSERT INTO t SELECT g, 'after the second', 0 FROM generate_series(100, 180) g;",
        )
        .await?;
    for (i, sink) in sinks.iter_mut().enumerate() {
        let restarted =
            kill_during_truncate(&p, i, sink, Duration::from_secs(60), before[i]).await?;
        *sink = restarted;
    }
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "after the second truncate:\n{report}");
    for i in 0..p.sinks.len() {
        assert!(
            applied_a_truncate(&p, i),
            "sink {} applied truncates:\n{}",
            p.sinks[i].display(),
            p.sink_log(i)
        );
    }
    let source: i64 = p
        .env
        .client
        .query_one("SELECT count(*) FROM t", &[])
        .await?
        .get(0);
    assert_eq!(
        source, 81,
        "the source holds the rows after the last truncate"
    );

    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await?
    .context("read dead letters")?;
    assert!(letters.is_empty(), "no dead letters: {letters:#?}");
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}
