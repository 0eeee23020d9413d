//! The outbox event router against real PostgreSQL and Kafka: inserted
//! outbox rows become routed, keyed events exactly once across SIGKILLs;
//! deleting outbox rows publishes nothing.
use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::capture;
use crate::harness::capture::{kill9, terminate, wait_for, CaptureEnv};
use crate::harness::common;

/// (topic, key, payload, id header, type header) of a committed record.
type Routed = (String, String, String, String, String);

/// Every committed record of `topics`.
fn read_routed(topics: &[String]) -> anyhow::Result<Vec<Routed>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique("outbox_reader"))
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        tpl.add_partition_offset(t, 0, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut eof = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while eof < topics.len() && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let text =
                    |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value))
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                out.push((
                    m.topic().to_string(),
                    text(m.key()),
                    text(m.payload()),
                    header("id"),
                    header("type"),
                ));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => eof += 1,
            Some(Err(e)) => anyhow::bail!("read: {e}"),
            None => {}
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_rows_become_routed_events_exactly_once() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_outbox").await?;
    env.client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                                  aggregatetype text NOT NULL, aggregateid text NOT NULL,
                                  type text NOT NULL, payload jsonb);",
        )
        .await?;
    let routed_prefix = format!("{}.outbox", env.prefix);
    let config = env.write_config(
        "capture.toml",
        &env.config(&format!(
            "batch.max.ms = 20\n[outbox]\ntable = \"public.outbox\"\nroute.topic.replacement = \"{routed_prefix}.${{routedByValue}}\"\n"
        )),
    )?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    // 200 events in transactions of 1-3 rows, each transaction deleting its
    // rows again; capture is killed at random moments.
    let writer = env.connect().await?;
    let mut expected: HashMap<String, (String, String, String)> = HashMap::new();
    let mut kills = 0;
    for n in 0..100 {
        let aggregate = if n % 2 == 0 { "order" } else { "customer" };
        let rows = writer
            .query(
                "WITH ins AS (
                   INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                   SELECT $1, ($2::int + g)::text, 'Created', jsonb_build_object('n', $2::int + g)
                   FROM generate_series(0, 1) g RETURNING id::text, aggregateid, payload::text)
                 SELECT * FROM ins",
                &[&aggregate, &(n * 10)],
            )
            .await?;
        for r in &rows {
            expected.insert(
                r.get(0),
                (format!("{routed_prefix}.{aggregate}"), r.get(1), r.get(2)),
            );
        }
        writer.batch_execute("DELETE FROM outbox").await?;
        if n % 15 == 7 {
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(100..600))).await;
            kill9(&mut capture);
            kills += 1;
            capture = env.spawn_capture(&config)?;
        }
    }
    let topics = vec![
        format!("{routed_prefix}.order"),
        format!("{routed_prefix}.customer"),
    ];
    let want = expected.len();
    // Wait until both routed topics exist and hold everything.
    wait_for(&topics, Duration::from_secs(90), |s| s.len() >= want).await?;
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success());
    let seen = read_routed(&topics)?;
    assert!(kills >= 5);
    assert_eq!(
        seen.len(),
        want,
        "each outbox insert exactly once, deletes publish nothing"
    );
    let mut ids = std::collections::HashSet::new();
    for (topic, key, payload, id, kind) in &seen {
        assert!(ids.insert(id.clone()), "event {id} published twice");
        let (want_topic, want_key, want_payload) = expected
            .get(id)
            .unwrap_or_else(|| panic!("unknown event id {id:?}"));
        assert_eq!(topic, want_topic);
        assert_eq!(key, want_key);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(payload)?,
            serde_json::from_str::<serde_json::Value>(want_payload)?
        );
        assert_eq!(kind, "Created");
    }
    // The outbox table's own topic carries nothing.
    let own = capture::read_committed(&[env.topic("outbox")])?;
    assert!(
        own.is_empty(),
        "outbox table changes leaked to its own topic"
    );
    env.cleanup().await;
    Ok(())
}
