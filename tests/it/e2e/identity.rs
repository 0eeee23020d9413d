//! Primary-key updates of rows whose TOASTed column stays unchanged, through
//! the whole pipeline: capture (SIGKILLed several times mid-load) on
//! three-partition topics, the warehouse (with its history table), the
//! search index and the cache. Every target must end equal to the source —
//! the rows under new keys carry the real TOASTed values — and the history
//! table must hold every event, which needs every event to have a position
//! `(commit_lsn, event_seq)` of its own.
use std::time::Duration;

use anyhow::Result;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::harness::capture;
use crate::harness::capture::{kill9, terminate};
use crate::harness::checks::{event_counter, expected_events, history_rows, scan_changes};
use crate::harness::common;
use crate::harness::e2e::{Pipeline, SINKS};

const ROWS: i64 = 200;
const TRANSACTIONS: usize = 60;
const MIN_KILLS: usize = 4;

/// `body` is stored out of line (EXTERNAL), so updates that leave it alone
/// send it as "unchanged"; the events each committed change makes are
/// counted ([`event_counter`]).
fn schema() -> String {
    format!(
        "CREATE TABLE docs (id bigint PRIMARY KEY, rev int NOT NULL, title text, body text);
    ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;{}",
        event_counter(&["docs"])
    )
}

/// Transactions of primary-key updates (some rows renamed twice in one
/// transaction, some deleted right after), plain updates that leave the body
/// alone, and a few body changes. Returns how many rows changed key.
async fn workload(c: tokio_postgres::Client) -> Result<u64> {
    let mut live: Vec<i64> = (1..=ROWS).collect();
    let mut next_id = 1_000_000i64;
    let mut renamed = 0;
    for _ in 0..TRANSACTIONS {
        let mut sql = String::from("BEGIN;");
        live.shuffle(&mut rand::rng());
        let n = rand::rng().random_range(3..12).min(live.len());
        for slot in live.iter_mut().take(n) {
            let old = *slot;
            next_id += 1;
            sql.push_str(&format!(
                "UPDATE docs SET id = {next_id}, rev = rev + 1 WHERE id = {old};"
            ));
            renamed += 1;
            *slot = next_id;
            match rand::rng().random_range(0..10) {
                // Renamed again in the same transaction.
                0..=1 => {
                    let again = next_id + 500_000;
                    sql.push_str(&format!(
                        "UPDATE docs SET id = {again}, title = 'twice' WHERE id = {next_id};"
                    ));
                    renamed += 1;
                    *slot = again;
                }
                // A plain update under the new key, body unchanged.
                2..=3 => sql.push_str(&format!(
                    "UPDATE docs SET rev = rev + 1, title = 'moved' WHERE id = {next_id};"
                )),
                _ => {}
            }
        }
        if rand::rng().random_bool(0.3) {
            let id = live[live.len() - 1];
            sql.push_str(&format!(
                "UPDATE docs SET body = repeat(md5(random()::text), 200) WHERE id = {id};"
            ));
        }
        sql.push_str("COMMIT;");
        c.batch_execute(&sql).await?;
        // Some rows renamed in this transaction are deleted in the next one.
        if rand::rng().random_bool(0.4) {
            if let Some(id) = live.first().copied() {
                c.execute("DELETE FROM docs WHERE id = $1", &[&id]).await?;
                live.remove(0);
            }
        }
        let pause = rand::rng().random_range(20..120);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(renamed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_key_updates_with_unchanged_toast_reach_every_target_and_the_history_holds_every_event(
) -> Result<()> {
    let p = Pipeline::new(
        "e2e_identity",
        &schema(),
        &["docs"],
        "table.include.list = \"public\\\\.docs\"\npublication.autocreate.mode = \"filtered\"\n\
         topic.creation.default.partitions = 3\nbatch.max.events = 50\nbatch.max.ms = 20\n",
    )
    .await?;
    p.extend_sink_config(0, "history.enabled = true")?;
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO docs SELECT g, 0, 'doc ' || g, repeat(md5(g::text), 200) FROM generate_series(1, {ROWS}) g"
        ))
        .await?;
    let topics = p.topics();
    capture::wait_for(&topics, Duration::from_secs(120), |seen| !seen.is_empty()).await?;
    assert_eq!(
        partitions(&topics[0])?,
        3,
        "topic.creation.default.partitions"
    );
    let mut sinks = (0..SINKS.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;

    let writer = tokio::spawn(workload(p.env.connect().await?));
    let mut kills = 0;
    while kills < MIN_KILLS || !writer.is_finished() {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(400..1500))).await;
        kill9(&mut capture);
        kills += 1;
        capture = p.spawn_capture()?;
        anyhow::ensure!(kills < 100, "the writer did not finish");
    }
    let renamed = writer.await??;

    let report = p.verify(Duration::from_secs(240)).await?;
    eprintln!("{report}");
    assert!(
        report.is_equal(),
        "targets differ after {kills} capture kills; logs in {}:\n{report}",
        p.env.dir.display()
    );
    assert_eq!(report.compared(), SINKS.len(), "{report}");

    // Each committed change in Kafka once, each event at a position of its own.
    let expected = expected_events(&p.env.client).await?;
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    eprintln!("topics: {scan:?}; expected {expected} events; {renamed} key changes; {kills} kills");
    assert_eq!(
        scan.unversioned, 0,
        "events without commit_lsn/event_seq/op"
    );
    // verify waited until the warehouse applied every record, history included.
    let history = history_rows(&p.env.client, "docs").await?;
    assert_eq!(
        history as u64, scan.events,
        "the history table holds every event"
    );
    assert_eq!(
        scan.duplicate_count, 0,
        "events sharing a (commit_lsn, event_seq), e.g. {:?}",
        scan.duplicates
    );
    assert_eq!(
        scan.events, expected as u64,
        "events in Kafka vs changes committed"
    );

    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "capture exit {status}");
    for s in sinks.iter_mut() {
        kill9(s);
    }
    p.cleanup().await;
    Ok(())
}

/// How many partitions `topic` has.
fn partitions(topic: &str) -> Result<usize> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len()))
}
