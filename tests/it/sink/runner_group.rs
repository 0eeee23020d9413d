//! Two `oncely sink` processes in one consumer group: the second joins while the first
//! runs, then the first stops. Partitions move both ways, nothing is lost, and the
//! position-owning `journal` sink applies every record exactly once.
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncely_sinks::kinds::journal::read_journal;
use oncely_testkit::kafka;
use oncely_testkit::kafka::{brokers, create_topic, produce_steadily, unique, wait_until};

use crate::harness::runner::*;

const PARTITIONS: i32 = 4;

/// Log text without ANSI colour codes.
fn plain_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Partitions of `topic` this runner's log says were assigned to it, in order of assignment.
fn assigned(log: &Path, topic: &str) -> Vec<i32> {
    let marker = format!("tp={topic}[");
    plain_log(log)
        .lines()
        .filter(|l| l.contains("partition assigned"))
        .filter_map(|l| {
            let rest = &l[l.find(&marker)? + marker.len()..];
            rest[..rest.find(']')?].parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_two_runners_without_loss_or_duplicates() {
    let (topic, group) = (unique("group"), unique("g"));
    create_topic(&topic, PARTITIONS).await;
    let dir = scratch(&unique("group"));
    let journal = dir.join("journal.jsonl");
    let body = format!(
        "{}[kafka]\n\"session.timeout.ms\" = 6000\n[sink]\nkind = \"journal\"\npath = \"{}\"\n",
        runner_keys(&brokers(), &group, &topic),
        journal.display()
    );
    let config = write_config(&dir, "sink", &body);
    let (log_a, log_b) = (dir.join("a.log"), dir.join("b.log"));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_steadily(
        &topic,
        (64, PARTITIONS),
        (20, Duration::from_millis(40)),
        stop.clone(),
    );
    let applied = || journal_counts(&journal, &group).len();

    let mut a = spawn_runner(&config, &log_a);
    wait_until("runner A applies records", Duration::from_secs(60), || {
        applied() >= 200
    })
    .await;
    let mut b = spawn_runner(&config, &log_b);
    wait_until("runner B gets partitions", Duration::from_secs(60), || {
        !assigned(&log_b, &topic).is_empty()
    })
    .await;
    let first_share: BTreeSet<i32> = assigned(&log_b, &topic).into_iter().collect();
    assert!(
        first_share.len() < PARTITIONS as usize,
        "B shares the partitions with A: {first_share:?}"
    );
    let mark = applied();
    wait_until(
        "both runners make progress",
        Duration::from_secs(60),
        || applied() >= mark + 300,
    )
    .await;

    sigterm(&a);
    let status = wait_exit(&mut a, Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "runner A stops gracefully with 0, got {status}"
    );
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    wait_until("B takes A's partitions", Duration::from_secs(60), || {
        assigned(&log_b, &topic)
            .into_iter()
            .collect::<BTreeSet<_>>()
            == all
    })
    .await;
    let mark = applied();
    wait_until("B alone makes progress", Duration::from_secs(60), || {
        applied() >= mark + 200
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    let total = producer.await.expect("producer") as usize;
    wait_until("B catches up", Duration::from_secs(120), || {
        applied() >= total
    })
    .await;
    sigterm(&b);
    let status = wait_exit(&mut b, Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "runner B stops gracefully with 0, got {status}"
    );

    let counts = journal_counts(&journal, &group);
    assert_eq!(counts.len(), total, "every produced record applied");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "records applied more than once: {twice:?}"
    );
}

/// Records of `topic` the journal holds for `group`.
fn applied_of(path: &Path, group: &str, topic: &str) -> usize {
    read_journal(path)
        .expect("read journal")
        .into_iter()
        .filter(|e| e.group == group && e.topic == topic)
        .map(|e| e.records.len())
        .sum()
}

/// A static member (`group.instance.id`) SIGKILLed and started again within
/// the session timeout rejoins without a rebalance: the broker hands it the
/// assignment the group made before, and a topic created while it was down
/// (listed in `topics`, existing now) belongs to no one. The runner must
/// notice the unowned partitions and make the group assign them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_static_member_gets_a_topic_created_while_it_was_down() {
    let (first, second, group) = (unique("static_a"), unique("static_b"), unique("g"));
    create_topic(&first, 2).await;
    let dir = scratch(&unique("static"));
    let journal = dir.join("journal.jsonl");
    let body = format!(
        "bootstrap.servers = \"{}\"\ngroup.id = \"{group}\"\ntopics = [\"{first}\", \"{second}\"]\n\
         batch.max.records = 25\nbatch.max.ms = 20\nshutdown.timeout.ms = 10000\n\
         [kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n\
         \"topic.metadata.refresh.interval.ms\" = 1000\n\
         [sink]\nkind = \"journal\"\npath = \"{}\"\n",
        brokers(),
        journal.display()
    );
    let config = write_config(&dir, "sink", &body);
    let log = dir.join("runner.log");
    let records = |n: u64, start: u64| -> Vec<kafka::Out> {
        (start..start + n)
            .map(|i| kafka::Out {
                key: Some(kafka::key(i)),
                value: Some(kafka::envelope(i, 100 + i, 0, i)),
                partition: None,
            })
            .collect()
    };
    let mut runner = spawn_runner(&config, &log);
    kafka::produce(&first, &records(20, 0)).await;
    wait_until(
        "the first topic is applied",
        Duration::from_secs(60),
        || applied_of(&journal, &group, &first) == 20,
    )
    .await;
    sigkill(&mut runner).await;
    // While it is down: the second topic appears, with records.
    create_topic(&second, 2).await;
    kafka::produce(&second, &records(20, 100)).await;
    let mut runner = spawn_runner(&config, &log);
    kafka::produce(&first, &records(10, 20)).await;
    wait_until(
        "the restarted member applies the topic created while it was down",
        Duration::from_secs(60),
        || applied_of(&journal, &group, &second) == 20,
    )
    .await;
    wait_until(
        "and the first topic goes on",
        Duration::from_secs(30),
        || applied_of(&journal, &group, &first) == 30,
    )
    .await;
    sigterm(&runner);
    let status = wait_exit(&mut runner, Duration::from_secs(30)).await;
    assert!(status.success(), "stops with 0, got {status}");
    assert!(
        plain_log(&log).contains("partitions of subscribed topics nobody owns"),
        "the runner says why it asked for a rebalance"
    );
}
