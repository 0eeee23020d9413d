//! A partition worker that panics fails the runner loudly (the real Kafka of
//! `scripts/services`, a panic injected with the `sink-decode-batch` failpoint).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oncely_sinks::{Batch, Runner, RunnerConfig, RunnerError, Sink, SinkError};
use oncely_testkit::kafka::*;
use tokio_util::sync::CancellationToken;

/// Records the (partition, offset) of every applied record.
#[derive(Default)]
struct Applied(Mutex<Vec<(i32, i64)>>);

impl Applied {
    fn of(&self, partition: i32) -> usize {
        let seen = self.0.lock().expect("lock");
        seen.iter().filter(|(p, _)| *p == partition).count()
    }
}

#[async_trait]
impl Sink for Applied {
    fn name(&self) -> &str {
        "applied"
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let mut seen = self.0.lock().expect("lock");
        seen.extend(
            batch
                .records()
                .iter()
                .map(|r| (batch.partition(), r.offset)),
        );
        Ok(())
    }
}

/// A panic while one partition's batch is decoded: the runner returns an
/// error naming the partition and the panic, nothing of that partition is
/// applied or committed (a restart resumes there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_one_partitions_decoding_stops_the_runner_with_an_error() {
    let (topic, group) = (unique("panic"), unique("g"));
    create_topic(&topic, 2).await;
    let out: Vec<Out> = (0..10u64)
        .map(|i| Out {
            key: Some(key(i)),
            value: Some(envelope(i, 100 + i, 0, i)),
            partition: Some((i % 2) as i32),
        })
        .collect();
    fail::cfg("sink-decode-batch", &format!("return({topic}/1)")).expect("failpoint");
    produce(&topic, &out).await;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut config = RunnerConfig::new(brokers(), &group, vec![topic.clone()]);
    config.batch_max_ms = 5;
    config.metrics_listen = Some(addr.to_string());
    let sink = Arc::new(Applied::default());
    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    let runner = Runner::new(config, sink.clone()).expect("valid config");
    let mut task = tokio::spawn(runner.run(stop));
    let ended = tokio::time::timeout(Duration::from_secs(30), &mut task).await;
    fail::remove("sink-decode-batch");
    let result = match ended {
        Ok(joined) => joined.expect("join"),
        Err(_) => {
            let ready = oncely_core::endpoint::get(addr, "/readyz").await;
            panic!(
                "the runner still runs 30 s after partition 1's decoding panicked: \
                 /readyz answers {ready:?}; applied of partition 0: {}, of partition 1: {}",
                sink.of(0),
                sink.of(1)
            );
        }
    };
    match &result {
        Err(RunnerError::Internal(told)) => assert!(
            told.contains(&format!("{topic}[1]"))
                && told.contains("injected panic (failpoint sink-decode-batch)"),
            "{told}"
        ),
        other => panic!("not an internal error naming the worker: {other:?}"),
    }
    assert_eq!(sink.of(1), 0, "nothing of the panicked partition applied");
    assert_eq!(
        committed(&group, &topic, 2).await[1],
        -1,
        "nothing of the panicked partition committed"
    );
}
