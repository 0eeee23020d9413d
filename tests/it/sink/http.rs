//! The webhook sink (`kind = "http"`) against a real local HTTP receiver and
//! real Kafka and Redis, `oncely sink` run as a process:
//!
//! * SIGKILLed at random while events flow: every event reaches the receiver,
//!   none is applied twice (the receiver honours `Idempotency-Key`), each
//!   key's events are applied in order, and the repeats the window could not
//!   hold back stay within the documented bound (the batches in flight: at
//!   most `batch.max.records` per partition and kill).
//! * Restarted from older Kafka offsets (a new group reading from the start),
//!   the Redis window skips everything: not one request.
//! * A 4xx answer is a dead letter naming status and body; a 429 with
//!   `Retry-After` is retried, not sooner than asked; the auth header is sent.
//! * It passes the conformance kit (`oncely_sinks::conformance`) with a
//!   receiver that honours `Idempotency-Key` and folds changes into rows.
//! * Over TLS, the server is trusted through `tls.ca.file`; without it the
//!   certificate is refused and the sink stops (non-zero exit), sending nothing.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncely_core::wire::UNAVAILABLE_VALUE;
use oncely_sinks::conformance;
use oncely_testkit::kafka::{
    brokers, committed, create_topic, envelope, header, key, produce, produce_steadily, read_topic,
    unique, wait_until, Out,
};
use oncely_testkit::tls;
use oncely_testkit::webhook::{Answer, Receiver};
use rand::Rng;

use crate::harness::common::redis_url;
use crate::harness::runner::*;

const PARTITIONS: i32 = 3;
const KILLS: usize = 6;
/// `batch.max.records` of `runner_keys`.
const BATCH: u64 = 25;

/// A static member with a short session, so a restarted runner gets its
/// partitions back at once instead of after the killed one's session expired.
fn config_body(group: &str, topic: &str, prefix: &str, receiver: &Receiver) -> String {
    format!(
        "{}[kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n[dedup]\nstore = \"redis\"\nredis.url = \"{}\"\nredis.key.prefix = \"{prefix}\"\n\
         [sink]\nkind = \"http\"\nurl = \"{}\"\nmax.concurrency = 4\n",
        runner_keys(&brokers(), group, topic),
        redis_url(),
        receiver.url()
    )
}

/// A runner process that is SIGKILLed if the test ends (or fails) with it still running.
struct Running(std::process::Child);

impl Running {
    fn spawn(config: &std::path::Path, log: &std::path::Path) -> Self {
        Self(spawn_runner(config, log))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The `lsn` of an applied key `<topic>/<lsn>/<seq>`.
fn lsn(key: &str) -> u64 {
    key.split('/')
        .nth(1)
        .and_then(|l| l.parse().ok())
        .expect("lsn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_webhook_once_across_sigkills_and_replays() {
    let (topic, group) = (unique("hook"), unique("g"));
    create_topic(&topic, PARTITIONS).await;
    let receiver = Receiver::start().await;
    let dir = scratch(&unique("hook"));
    let prefix = format!("oncely:test:{}:", unique("w"));
    let config = write_config(
        &dir,
        "sink",
        &config_body(&group, &topic, &prefix, &receiver),
    );
    let log = dir.join("runner.log");

    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_steadily(
        &topic,
        (40, PARTITIONS),
        (15, Duration::from_millis(30)),
        stop.clone(),
    );
    for kill in 0..KILLS {
        let wanted = receiver.applied_count() + rand::rng().random_range(30..120);
        let mut child = Running::spawn(&config, &log);
        wait_until(
            &format!("progress before kill {kill}"),
            Duration::from_secs(60),
            || receiver.applied_count() >= wanted,
        )
        .await;
        sigkill(&mut child.0).await;
    }
    stop.store(true, Ordering::SeqCst);
    let total = producer.await.expect("producer");
    let mut last = Running::spawn(&config, &log);
    wait_until("every event applied", Duration::from_secs(90), || {
        receiver.applied_count() as u64 >= total
    })
    .await;
    wait_until("offsets committed", Duration::from_secs(30), || {
        futures::executor::block_on(committed(&group, &topic, PARTITIONS))
            .iter()
            .sum::<i64>() as u64
            == total
    })
    .await;
    sigterm(&last.0);
    assert!(wait_exit(&mut last.0, Duration::from_secs(30))
        .await
        .success());

    // Every event once: produce_steadily gives event n the position (1000 + n)/0.
    let applied = receiver.applied();
    let mut lsns: Vec<u64> = applied.iter().map(|k| lsn(k)).collect();
    lsns.sort_unstable();
    let expected: Vec<u64> = (1000..1000 + total).collect();
    assert_eq!(lsns, expected, "each produced event applied, none twice");
    // Each key's events applied in order (event n is row n % 40).
    let mut last_of_row: HashMap<u64, u64> = HashMap::new();
    for k in &applied {
        let l = lsn(k);
        let row = (l - 1000) % 40;
        if let Some(prev) = last_of_row.insert(row, l) {
            assert!(prev < l, "row {row}: event {l} applied after {prev}");
        }
    }
    // The repeats the window did not hold back: only batches in flight at a kill.
    let bound = KILLS as u64 * PARTITIONS as u64 * BATCH;
    let duplicates = receiver.duplicates();
    assert!(
        duplicates <= bound,
        "{duplicates} repeated requests, more than the documented bound {bound}"
    );
    eprintln!("{total} events, {duplicates} repeats (bound {bound})");

    // A restart from older offsets: a new group reads everything again; the
    // Redis window holds every identity, so the webhook sees no request.
    let before = receiver.request_count();
    let replay_group = unique("g_replay");
    let replay = write_config(
        &dir,
        "replay",
        &config_body(&replay_group, &topic, &prefix, &receiver),
    );
    let mut child = Running::spawn(&replay, &log);
    wait_until(
        "the replay to commit the end",
        Duration::from_secs(60),
        || {
            futures::executor::block_on(committed(&replay_group, &topic, PARTITIONS))
                .iter()
                .sum::<i64>() as u64
                == total
        },
    )
    .await;
    sigterm(&child.0);
    assert!(wait_exit(&mut child.0, Duration::from_secs(30))
        .await
        .success());
    assert_eq!(
        receiver.request_count(),
        before,
        "a replay from older offsets sent requests the window held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_is_a_dead_letter_and_a_429_waits_for_retry_after() {
    let (topic, group, dlq) = (unique("hook4xx"), unique("g"), unique("dlq"));
    create_topic(&topic, 1).await;
    let receiver = Receiver::start().await;
    let records: Vec<Out> = (0..10u64)
        .map(|id| Out {
            key: Some(key(id)),
            value: Some(envelope(id, 500 + id, 0, id)),
            partition: Some(0),
        })
        .collect();
    let rejected = format!("{topic}/503/0");
    let throttled = format!("{topic}/506/0");
    receiver.always(&rejected, Answer::new(422, "unknown customer 7"));
    receiver.first(
        &throttled,
        vec![Answer::new(429, "slow down").header("Retry-After", "2")],
    );
    produce(&topic, &records).await;
    let dir = scratch(&unique("hook4xx"));
    let body = format!(
        "{}errors.deadletterqueue.topic.name = \"{dlq}\"\n\
         [sink]\nkind = \"http\"\nurl = \"{}\"\nauth.value = \"${{env:ONCELY_TEST_WEBHOOK_AUTH}}\"\n",
        runner_keys(&brokers(), &group, &topic),
        receiver.url()
    );
    let config = write_config(&dir, "sink", &body);
    let mut child = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(["sink", "--config"])
            .arg(&config)
            .env("ONCELY_TEST_WEBHOOK_AUTH", "Bearer s3cret")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("runner.log")).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    wait_until("9 events applied", Duration::from_secs(60), || {
        receiver.applied_count() >= 9
    })
    .await;
    let letters = read_topic(&dlq, 1, 1).await;
    sigterm(&child.0);
    assert!(wait_exit(&mut child.0, Duration::from_secs(30))
        .await
        .success());

    assert_eq!(
        letters.len(),
        1,
        "exactly the rejected event is a dead letter"
    );
    let reason = header(&letters[0], oncely_sinks::runner::HEADER_ERROR).expect("reason");
    assert!(
        reason.contains("422") && reason.contains("unknown customer 7"),
        "{reason}"
    );
    assert_eq!(
        header(&letters[0], oncely_sinks::runner::HEADER_OFFSET).as_deref(),
        Some("3")
    );
    assert!(!receiver.applied().contains(&rejected));

    let requests = receiver.requests();
    let tries: Vec<_> = requests.iter().filter(|r| r.key == throttled).collect();
    assert!(tries.len() >= 2, "the 429 was retried");
    assert_eq!((tries[0].status, tries[1].status), (429, 200));
    let waited = tries[1].at.duration_since(tries[0].at);
    assert!(
        waited >= Duration::from_millis(1900),
        "retried after {waited:?}, before Retry-After: 2"
    );
    assert!(requests
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer s3cret")));
    let first = requests
        .iter()
        .find(|r| r.status == 200)
        .expect("a delivery");
    assert_eq!(first.body["op"], "u");
    assert_eq!(first.body["idempotency_key"], first.key.as_str());
    assert!(first.body["after"]["id"].is_u64(), "{}", first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_trusts_the_ca_file_and_refuses_an_unknown_server() {
    let (topic, dir) = (unique("hooktls"), scratch(&unique("hooktls")));
    create_topic(&topic, 1).await;
    let certs = tls::server_certs(&dir).expect("test certificates");
    let (ca, cert, key_file) = (certs.ca, certs.cert, certs.key);
    let receiver = Receiver::start_tls(&cert, &key_file).await;
    let records: Vec<Out> = (0..5u64)
        .map(|id| Out {
            key: Some(key(id)),
            value: Some(envelope(id, 700 + id, 0, id)),
            partition: Some(0),
        })
        .collect();
    produce(&topic, &records).await;
    let config = |group: &str, ca_line: &str| {
        let body = format!(
            "{}[sink]\nkind = \"http\"\nurl = \"{}\"\n{ca_line}",
            runner_keys(&brokers(), group, &topic),
            receiver.url()
        );
        write_config(&dir, group, &body)
    };
    // Without the CA: refused, fatal, nothing delivered.
    let mut untrusting = Running::spawn(&config(&unique("g"), ""), &dir.join("untrusting.log"));
    let status = wait_exit(&mut untrusting.0, Duration::from_secs(60)).await;
    assert!(
        !status.success(),
        "an untrusted certificate must stop the sink"
    );
    let log = std::fs::read_to_string(dir.join("untrusting.log")).expect("log");
    assert!(log.contains("sink.tls.ca.file"), "{log}");
    assert_eq!(receiver.request_count(), 0);
    // With it: every event delivered.
    let ca_line = format!("tls.ca.file = \"{}\"\n", ca.display());
    let mut trusting = Running::spawn(&config(&unique("g"), &ca_line), &dir.join("trusting.log"));
    wait_until("5 events over TLS", Duration::from_secs(60), || {
        receiver.applied_count() >= 5
    })
    .await;
    sigterm(&trusting.0);
    assert!(wait_exit(&mut trusting.0, Duration::from_secs(30))
        .await
        .success());
}

/// The webhook sink as a conformance [`Target`]: the "target" is a receiver
/// that applies each `Idempotency-Key` once and folds the changes into rows
/// (an unavailable value keeps the column, a delete removes the row).
struct WebhookTarget {
    receiver: Receiver,
}

#[async_trait::async_trait]
impl conformance::Target for WebhookTarget {
    async fn sink(&self) -> Result<Arc<dyn oncely_sinks::Sink>, oncely_sinks::SinkError> {
        let text = format!(
            "bootstrap.servers = \"unused:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n\
             [sink]\nkind = \"http\"\nurl = \"{}\"\n",
            self.receiver.url()
        );
        let (_, config) = oncely_sinks::kinds::parse_config(&text).expect("config");
        config.build().await
    }

    async fn rows(&self, topic: &str) -> Result<conformance::Rows, oncely_sinks::error::BoxError> {
        let mut rows = conformance::Rows::new();
        for body in self.receiver.applied_bodies() {
            if body["topic"] != topic {
                continue;
            }
            let id = body["key"]["id"].as_u64().ok_or("no key id")?;
            match body["op"].as_str() {
                Some("d") => {
                    rows.remove(&id);
                }
                _ => {
                    let row = rows.entry(id).or_default();
                    for (column, value) in body["after"].as_object().ok_or("no after")? {
                        if value != UNAVAILABLE_VALUE {
                            row.insert(column.clone(), value.clone());
                        }
                    }
                }
            }
        }
        Ok(rows)
    }
}

#[tokio::test]
async fn the_webhook_sink_passes_the_conformance_kit() {
    let target = WebhookTarget {
        receiver: Receiver::start().await,
    };
    conformance::check(&target, &unique("conf"))
        .await
        .expect("conforms");
}
