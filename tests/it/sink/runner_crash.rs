//! SIGKILL the `oncely sink` process mid-stream, again and again, against real Kafka.
//!
//! * A sink that owns its positions (`journal`): every record applied exactly once.
//! * A sink that does not (`file`): every record at least once, each runner applies
//!   its partitions contiguously from the committed offset, and that offset never
//!   lies past what was applied — so repeats come only from uncommitted tails.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncely_testkit::kafka::{brokers, create_topic, produce_steadily, unique, wait_until};
use rand::Rng;
use serde_json::Value;

use crate::harness::runner::*;

const KILLS: usize = 12;
const PARTITIONS: i32 = 3;

/// Kills runners started from `config` `KILLS` times, each after it applied a random
/// number of new records (as counted by `applied`), then lets a last runner finish.
async fn kill_repeatedly(
    config: &Path,
    log: &Path,
    topic: &str,
    applied: impl Fn() -> usize,
) -> u64 {
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = produce_steadily(
        topic,
        (50, PARTITIONS),
        (20, Duration::from_millis(40)),
        stop_producing.clone(),
    );
    for kill in 0..KILLS {
        let before = applied();
        let wanted = before + rand::rng().random_range(40..160);
        let mut child = spawn_runner(config, log);
        wait_until(
            &format!("progress before kill {kill}"),
            Duration::from_secs(60),
            || applied() >= wanted,
        )
        .await;
        sigkill(&mut child).await;
    }
    stop_producing.store(true, Ordering::SeqCst);
    let total = producer.await.expect("producer");
    // The killed runners may have applied everything already: wait for the
    // last one to be consuming too, so that the SIGTERM below stops a runner
    // rather than a process still starting.
    let started = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches(" consuming ")
            .count()
    };
    let before = started();
    let mut last = spawn_runner(config, log);
    wait_until(
        "the last runner to catch up",
        Duration::from_secs(120),
        || started() > before && applied() >= total as usize,
    )
    .await;
    sigterm(&last);
    let status = wait_exit(&mut last, Duration::from_secs(30)).await;
    assert!(status.success(), "graceful stop exits 0, got {status}");
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_owning_sink_sees_every_record_exactly_once_across_sigkills() {
    let (topic, group) = (unique("crash_own"), unique("g"));
    create_topic(&topic, PARTITIONS).await;
    let dir = scratch(&unique("crash_own"));
    let journal = dir.join("journal.jsonl");
    let body = format!(
        "{}[kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n\
         [sink]\nkind = \"journal\"\npath = \"{}\"\n",
        runner_keys(&brokers(), &group, &topic),
        journal.display()
    );
    let config = write_config(&dir, "sink", &body);
    let total = kill_repeatedly(&config, &dir.join("runner.log"), &topic, || {
        journal_counts(&journal, &group).len()
    })
    .await;
    let counts = journal_counts(&journal, &group);
    assert_eq!(counts.len() as u64, total, "every produced record applied");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "records applied more than once: {twice:?}"
    );
}

/// One line of the `file` sink with `assignments = true`.
enum Line {
    Assigned { partition: i32, start: i64 },
    Applied { partition: i32, offset: i64 },
}

fn file_lines(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        }; // torn by a kill
        if let Some(a) = v.get("assigned") {
            let partition = a
                .get("partition")
                .and_then(Value::as_i64)
                .expect("partition") as i32;
            out.push(Line::Assigned {
                partition,
                start: a.get("start").and_then(Value::as_i64).expect("start"),
            });
        } else {
            let partition = v
                .get("partition")
                .and_then(Value::as_i64)
                .expect("partition") as i32;
            out.push(Line::Applied {
                partition,
                offset: v.get("offset").and_then(Value::as_i64).expect("offset"),
            });
        }
    }
    out
}

fn distinct_applied(path: &Path) -> usize {
    let mut seen = std::collections::HashSet::new();
    for l in file_lines(path) {
        if let Line::Applied { partition, offset } = l {
            seen.insert((partition, offset));
        }
    }
    seen.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_committed_sink_duplicates_exactly_the_uncommitted_tail() {
    let (topic, group) = (unique("crash_kafka"), unique("g"));
    create_topic(&topic, PARTITIONS).await;
    let dir = scratch(&unique("crash_kafka"));
    let out = dir.join("out.jsonl");
    let body = format!(
        "{}[kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n\
         [sink]\nkind = \"file\"\npath = \"{}\"\nrows = false\nassignments = true\n",
        runner_keys(&brokers(), &group, &topic),
        out.display()
    );
    let config = write_config(&dir, "sink", &body);
    let total = kill_repeatedly(&config, &dir.join("runner.log"), &topic, || {
        distinct_applied(&out)
    })
    .await;

    // Replay the file per partition. Each assignment starts at the committed offset,
    // which may lie below what a killed runner had already applied (its uncommitted
    // tail) but never above it (no gap). Within one assignment records arrive
    // contiguously from that start, so a record is applied twice only when an
    // assignment started at or below it after a kill — and a successor killed before
    // it re-applied its whole tail leaves fewer repeats, not more.
    let mut top: HashMap<i32, i64> = HashMap::new();
    let mut next: HashMap<i32, i64> = HashMap::new();
    let mut applied: HashMap<(i32, i64), u32> = HashMap::new();
    let mut repeated_by_restarts = 0;
    for line in file_lines(&out) {
        match line {
            Line::Assigned { partition, start } => {
                let top = top.get(&partition).copied().unwrap_or(-1);
                assert!(
                    start <= top + 1,
                    "partition {partition}: assignment starts at {start}, past the \
                     highest applied offset {top}: records {}..{start} skipped",
                    top + 1
                );
                next.insert(partition, start);
            }
            Line::Applied { partition, offset } => {
                let expected = next.get(&partition).copied();
                assert_eq!(
                    Some(offset),
                    expected,
                    "partition {partition}: applied offset {offset} where the runner \
                     should have been at {expected:?} (assignment line missing, gap, or \
                     a record applied twice by one runner)"
                );
                next.insert(partition, offset + 1);
                let n = applied.entry((partition, offset)).or_insert(0);
                *n += 1;
                if *n > 1 {
                    repeated_by_restarts += 1;
                }
                let top = top.entry(partition).or_insert(-1);
                *top = (*top).max(offset);
            }
        }
    }
    assert_eq!(
        applied.len() as u64,
        total,
        "every produced record applied at least once"
    );
    assert!(
        repeated_by_restarts > 0,
        "the kills should have left uncommitted tails that were applied again"
    );
}
