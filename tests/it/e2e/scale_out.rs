//! Sinks scaled out and in under load (docs/design.md, "Sinks"): each prebuilt sink
//! (warehouse with its history table, search index, cache) runs as two
//! runners in one consumer group (static members) on three-partition topics
//! while a writer commits inserts, updates, primary-key updates and deletes.
//! One runner of each group is SIGKILLed, a third joins 5 s later, and the
//! killed one comes back after another 10 s. Then every copy must equal the
//! source (`oncely verify`), every group's committed Kafka offsets must reach
//! the topics' ends within a bound (a refused commit during the rebalances
//! must be sent again, idle partition or not), and the history table must
//! hold every event exactly once.
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::harness::capture;
use crate::harness::capture::{kill9, terminate, Spawned};
use crate::harness::checks::{
    dead_letters, event_counter, expected_events, history_rows, lagging_commits, scan_changes,
};
use crate::harness::e2e::{Pipeline, SINKS};

const ROWS: i64 = 300;
/// How long the writer runs.
const LOAD: Duration = Duration::from_secs(25);
/// How long committed offsets may lag once the targets are equal.
const COMMIT_BOUND: Duration = Duration::from_secs(30);

/// The items, and the events each committed change makes counted
/// ([`event_counter`]).
fn schema() -> String {
    format!(
        "CREATE TABLE items (id bigint PRIMARY KEY, rev int NOT NULL, note text);{}",
        event_counter(&["items"])
    )
}

/// Transactions of inserts, updates, primary-key updates and deletes for
/// `LOAD`; the number of transactions.
async fn workload(c: tokio_postgres::Client) -> Result<u64> {
    let mut live: Vec<i64> = (1..=ROWS).collect();
    let mut next_id = ROWS;
    let started = Instant::now();
    let mut transactions = 0;
    while started.elapsed() < LOAD {
        let mut sql = String::from("BEGIN;");
        for _ in 0..rand::rng().random_range(1..6) {
            live.shuffle(&mut rand::rng());
            match rand::rng().random_range(0..10) {
                0..=2 => {
                    next_id += 1;
                    sql.push_str(&format!("INSERT INTO items VALUES ({next_id}, 0, 'new');"));
                    live.push(next_id);
                }
                3..=5 if !live.is_empty() => sql.push_str(&format!(
                    "UPDATE items SET rev = rev + 1, note = md5(random()::text) WHERE id = {};",
                    live[0]
                )),
                6..=7 if !live.is_empty() => {
                    next_id += 1;
                    sql.push_str(&format!(
                        "UPDATE items SET id = {next_id}, rev = rev + 1 WHERE id = {};",
                        live[0]
                    ));
                    live[0] = next_id;
                }
                _ if live.len() > 50 => {
                    sql.push_str(&format!("DELETE FROM items WHERE id = {};", live[0]));
                    live.remove(0);
                }
                _ => {}
            }
        }
        sql.push_str("COMMIT;");
        c.batch_execute(&sql).await?;
        transactions += 1;
        let pause = rand::rng().random_range(5..30);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(transactions)
}

/// Runner `instance` of each of the three sinks.
fn spawn_all(p: &Pipeline, instance: usize) -> Result<Vec<Spawned>> {
    (0..SINKS.len())
        .map(|i| p.spawn_sink_instance(i, instance))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_killed_and_added_under_load_leave_equal_copies_and_caught_up_offsets() -> Result<()>
{
    let p = Pipeline::new(
        "e2e_scale_out",
        &schema(),
        &["items"],
        "table.include.list = \"public\\\\.items\"\npublication.autocreate.mode = \"filtered\"\n\
         topic.creation.default.partitions = 3\nbatch.max.events = 50\nbatch.max.ms = 20\n",
    )
    .await?;
    p.extend_sink_config(0, "history.enabled = true")?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO items SELECT g, 0, 'seed' FROM generate_series(1, {ROWS}) g"
        ))
        .await?;
    let topics = p.topics();
    capture::wait_for(&topics, Duration::from_secs(120), |seen| !seen.is_empty()).await?;

    let mut first = spawn_all(&p, 1)?;
    let second = spawn_all(&p, 2)?;
    let writer = tokio::spawn(workload(p.env.connect().await?));
    tokio::time::sleep(Duration::from_secs(5)).await;
    for runner in first.iter_mut() {
        kill9(runner);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let third = spawn_all(&p, 3)?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let first = spawn_all(&p, 1)?;
    let transactions = writer.await??;

    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(
        report.is_equal(),
        "targets differ after the scale-out; logs in {}:\n{report}",
        p.env.dir.display()
    );
    assert_eq!(report.compared(), SINKS.len(), "{report}");

    // Every group's committed offsets at the topics' ends, within a bound.
    let deadline = Instant::now() + COMMIT_BOUND;
    for (i, kind) in SINKS.iter().enumerate() {
        let group = p.sink_group(i)?;
        loop {
            let lagging = tokio::task::spawn_blocking({
                let (group, topics) = (group.clone(), topics.clone());
                move || lagging_commits(&group, &topics)
            })
            .await??;
            if lagging.is_empty() {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "group {group} ({kind}) has not committed the topics' ends within {COMMIT_BOUND:?}: {lagging:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    // The history holds every event, once.
    let expected = expected_events(&p.env.client).await?;
    let scan = tokio::task::spawn_blocking({
        let topics = topics.clone();
        move || scan_changes(&topics)
    })
    .await??;
    eprintln!("{transactions} transactions; topics: {scan:?}; expected {expected} streamed events");
    assert_eq!(scan.duplicate_count, 0, "{:?}", scan.duplicates);
    let history = history_rows(&p.env.client, "items").await?;
    assert_eq!(
        history as u64, scan.events,
        "the history table holds every event"
    );
    // The table was empty when capture started: the seed is streamed too.
    assert_eq!(
        scan.events, expected as u64,
        "events in Kafka vs changes committed"
    );
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(letters.is_empty(), "no dead letters: {letters:#?}");

    let mut capture = capture;
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "capture exit {status}");
    drop((first, second, third));
    p.cleanup().await;
    Ok(())
}
