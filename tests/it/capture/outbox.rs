//! The outbox event router against real PostgreSQL and Kafka: inserted
//! outbox rows become routed, keyed events exactly once across SIGKILLs;
//! deleting outbox rows publishes nothing.
use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::capture;
use crate::harness::capture::{kill9, terminate, wait_for, CaptureEnv};

/// (topic, key, payload, id header, type header) of a committed record.
type Routed = (String, String, String, String, String);

/// Every committed record of `topics`.
fn read_routed(topics: &[String]) -> anyhow::Result<Vec<Routed>> {
    let mut out = Vec::new();
    capture::read_to_end("read_committed", topics, Duration::from_secs(60), |m| {
        let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
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
        Ok(())
    })?;
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

/// (key, value, headers) of every committed record of partition 0 of `topic`.
type Letter = (Option<String>, String, HashMap<String, String>);

fn read_letters(topic: &str) -> anyhow::Result<Vec<Letter>> {
    let consumer = capture::committed_reader("outbox_dlq")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| {
                                let v = String::from_utf8_lossy(x.value.unwrap_or_default());
                                (x.key.to_string(), v.into_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    headers,
                ));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
            Some(Err(e)) => anyhow::bail!("read {topic}: {e}"),
            None => {}
        }
    }
    anyhow::bail!("reading {topic} did not reach its end")
}

/// Waits until `topic` holds `want` committed records, failing at once when
/// capture exits.
async fn wait_alive(
    env: &CaptureEnv,
    capture: &mut std::process::Child,
    topic: &str,
    want: usize,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = capture.try_wait()? {
            anyhow::bail!(
                "capture exited ({status}) before {topic} held {want} records; log:\n{}",
                env.capture_log()
            );
        }
        let t = vec![topic.to_owned()];
        let seen = tokio::task::spawn_blocking(move || capture::read_committed(&t)).await??;
        if seen.len() >= want {
            anyhow::ensure!(seen.len() == want, "{} records on {topic}", seen.len());
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{topic} holds {} of {want} records; log:\n{}",
            seen.len(),
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_outbox_row_is_a_dead_letter_and_capture_goes_on() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_outbox_dlq").await?;
    env.client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                                  aggregatetype text, aggregateid text,
                                  type text NOT NULL, payload jsonb);
             CREATE TABLE t (id bigint PRIMARY KEY, v text);",
        )
        .await?;
    let routed_prefix = format!("{}.outbox", env.prefix);
    let config = env.write_config(
        "capture.toml",
        &env.config(&format!(
            "batch.max.ms = 20\n[outbox]\ntable = \"public.outbox\"\nroute.topic.replacement = \"{routed_prefix}.${{routedByValue}}\"\n"
        )),
    )?;
    // The default dead-letter topic: `<topic.prefix>.outbox-dlq`.
    let dlq = format!("{}.outbox-dlq", env.prefix);
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    // A null aggregate id (no key), then a type too long for a topic name,
    // then a good event and another table's rows.
    let long_type = "L".repeat(300);
    env.client
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             VALUES ('order', NULL, 'Created', '{\"n\":1}')",
        )
        .await?;
    env.client
        .execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             VALUES ($1, '7', 'Created', '{\"n\":2}')",
            &[&long_type],
        )
        .await?;
    env.client
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             VALUES ('order', '8', 'Created', '{\"n\":3}');
             INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g;",
        )
        .await?;
    wait_alive(&env, &mut capture, &env.topic("t"), 20).await?;
    wait_alive(&env, &mut capture, &format!("{routed_prefix}.order"), 1).await?;

    // A kill and a restart publish nothing twice.
    kill9(&mut capture);
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(21, 30) g")
        .await?;
    wait_alive(&env, &mut capture, &env.topic("t"), 30).await?;
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "log:\n{}", env.capture_log());

    let letters = read_letters(&dlq)?;
    assert_eq!(letters.len(), 2, "each bad row once: {letters:?}");
    for (key, value, headers) in &letters {
        assert_eq!(
            headers.get("oncely.dlq.table").map(String::as_str),
            Some("public.outbox"),
            "{headers:?}"
        );
        assert!(headers.contains_key("oncely.dlq.fix"), "{headers:?}");
        let row: serde_json::Value = serde_json::from_str(value)?;
        assert_eq!(row["type"], "Created", "the row as it was: {value}");
        let error = &headers["oncely.dlq.error"];
        match row["payload"].as_str() {
            Some("{\"n\": 1}") => {
                assert!(error.contains("aggregateid"), "{error}");
                assert_eq!(key, &None);
            }
            Some("{\"n\": 2}") => {
                assert!(error.contains("249"), "{error}");
                assert_eq!(row["aggregatetype"], long_type.as_str());
                assert_eq!(key.as_deref(), Some("7"));
            }
            other => panic!("unexpected dead letter {other:?}: {value}"),
        }
    }
    let log = env.capture_log();
    assert!(
        !log.contains(&long_type),
        "row values are never logged:\n{log}"
    );
    assert!(
        log.contains("outbox-dlq"),
        "the dead letters are logged:\n{log}"
    );
    env.cleanup().await;
    Ok(())
}
