//! What capture's topics take and hold, against real PostgreSQL and Kafka:
//! records up to the configured message size (and a named, definite error
//! beyond it), one offsets topic per connector, read alone, internal topics
//! of one partition, truncates on every partition of a multi-partition topic.
use std::collections::BTreeSet;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::capture;
use crate::harness::capture::{kill9, read_committed, terminate, wait_for, CaptureEnv, Spawned};
use crate::harness::checks::scan_changes;
use crate::harness::common;
use crate::harness::e2e;
use crate::harness::e2e::Pipeline;

/// A SQL expression of `mib` MiB of random hex text (md5 chains do not
/// compress, and `SET STORAGE EXTERNAL` keeps PostgreSQL from compressing it).
fn random_text(mib: usize) -> String {
    format!(
        "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, {}) g)",
        mib * 1024 * 1024 / 32
    )
}

/// Waits for a process to exit, up to `timeout`.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("process still running after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `text` without its `offset.storage.topic` line: the connector's default topic.
fn default_offsets(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("offset.storage.topic"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn kafka_client() -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", common::kafka_brokers());
    client
}

fn admin() -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?)
}

async fn create_topic(name: &str, partitions: i32, config: &[(&str, &str)]) -> Result<()> {
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    let results = admin()?
        .create_topics([&topic], &AdminOptions::new())
        .await?;
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    Ok(())
}

async fn delete_topics(names: &[String]) {
    if let Ok(admin) = admin() {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    }
}

// ---------------------------------------------------------------------------
// Message sizes
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_mb_row_reaches_every_target_and_a_30_mb_one_is_dead_lettered_by_the_index(
) -> Result<()> {
    let schema = "CREATE TABLE big (id bigint PRIMARY KEY, note text, body text);
                  ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL;";
    // 20 MiB of text is a record of 20 MiB and more: above the 16 MiB default.
    let mut p = Pipeline::new(
        "cap_big_row",
        schema,
        &["big"],
        "topic.creation.default.max.message.bytes = 67108864\n",
    )
    .await?;
    // Elasticsearch holds the 20 MiB row but not a 30 MiB one: its
    // indexing-pressure limit (10% of the test cluster's 1 GiB heap, and a
    // document costs about four times its size) refuses that document
    // however idle the node is. The sink dead-letters it, saying why, and
    // goes on.
    let es_dlq = format!("{}-elasticsearch-dlq", p.env.prefix);
    // A second warehouse whose table refuses the row (a CHECK on body's
    // length, added once the table exists; a narrowed column type would not
    // do: the sink alters a column back to the source's type when that type
    // takes every value of the column's): the dead letter is larger than the
    // dead-letter producer's default message.max.bytes (1 MB) and must
    // still be written.
    // The harness gives every sink the dead-letter topic `<group>-dlq`.
    let dlq = format!("{}-narrow-dlq", p.env.prefix);
    let topic = p.env.topic("big");
    let narrow = p.add_sink(
        "narrow",
        &format!(
            "[sink]\nkind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"narrow\"\n",
            capture::db_url(&p.env.dbname)
        ),
    )?;
    ensure!(
        std::fs::read_to_string(&narrow)?.contains(&dlq),
        "the harness no longer names the dead-letter topic {dlq}"
    );

    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<Spawned> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_, _>>()?;
    p.env
        .client
        .batch_execute("INSERT INTO big VALUES (1, 'small', 'x')")
        .await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    while p
        .env
        .client
        .query_opt("SELECT 1 FROM narrow.public_big WHERE id = 1", &[])
        .await
        .ok()
        .flatten()
        .is_none()
    {
        ensure!(
            Instant::now() < deadline,
            "the narrow warehouse never got row 1"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.env
        .client
        .batch_execute(
            "ALTER TABLE narrow.public_big ADD CONSTRAINT body_short CHECK (length(body) <= 10)",
        )
        .await?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO big VALUES (2, 'large', {});
             INSERT INTO big VALUES (3, 'larger', {});
             UPDATE big SET note = 'after' WHERE id = 1;",
            random_text(20),
            random_text(30),
        ))
        .await?;
    // The narrow warehouse and the index are not mirrors of rows 2 and 3:
    // leave them out of verify.
    p.sinks.pop();
    p.sinks.remove(1);
    let report = p.verify(Duration::from_secs(300)).await?;
    assert!(report.is_equal(), "targets equal the source:\n{report}");
    assert_eq!(report.compared(), 2, "{report}");
    let size: i64 = p
        .env
        .client
        .query_one(
            "SELECT length(body)::bigint FROM wh.public_big WHERE id = 2",
            &[],
        )
        .await?
        .get(0);
    assert!(size >= 20 * 1024 * 1024, "{size}");

    // The dead letter of the refused 20 MiB row: written, without its value,
    // saying so and where the original is; the narrow sink went on.
    let letters = tokio::task::spawn_blocking({
        let dlq = dlq.clone();
        move || dead_letters(&dlq, Duration::from_secs(180))
    })
    .await??;
    let large: Vec<_> = letters.iter().filter(|l| l.omitted.is_some()).collect();
    assert_eq!(large.len(), 1, "{letters:?}");
    assert!(large[0].value_len.is_none(), "{letters:?}");
    assert!(large[0].omitted.unwrap() > 20 * 1024 * 1024, "{letters:?}");
    assert_eq!(large[0].topic.as_deref(), Some(topic.as_str()));
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let note: Option<String> = p
            .env
            .client
            .query_opt("SELECT note FROM narrow.public_big WHERE id = 1", &[])
            .await?
            .map(|r| r.get(0));
        if note.as_deref() == Some("after") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the narrow sink stopped: {note:?}\n{}",
            std::fs::read_to_string(narrow.with_extension("log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The index: the 30 MiB row dead-lettered with the reason and the fix,
    // the 20 MiB row and the later change of row 1 applied.
    let letters = tokio::task::spawn_blocking({
        let es_dlq = es_dlq.clone();
        move || dead_letters(&es_dlq, Duration::from_secs(180))
    })
    .await??;
    let large: Vec<_> = letters.iter().filter(|l| l.omitted.is_some()).collect();
    assert_eq!(large.len(), 1, "{letters:?}");
    let error = large[0].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("es_rejected_execution_exception")
            && error.contains("indexing_pressure.memory.limit"),
        "{error}"
    );
    let index = topic.to_lowercase();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let found = e2e::es()
            .search(elasticsearch::SearchParts::Index(&[&index]))
            .body(serde_json::json!({
                "query": {"terms": {"note.keyword": ["after", "large", "larger"]}},
                "_source": ["note"],
            }))
            .send()
            .await?
            .json::<serde_json::Value>()
            .await?;
        let mut notes: Vec<&str> = found["hits"]["hits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["_source"]["note"].as_str())
            .collect();
        notes.sort_unstable();
        if notes == ["after", "large"] {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the index never got the change after the large row: {found}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    drop(sinks);
    drop(capture);
    delete_topics(&[dlq, es_dlq]).await;
    p.cleanup().await;
    Ok(())
}

#[derive(Debug)]
struct Letter {
    topic: Option<String>,
    error: Option<String>,
    value_len: Option<usize>,
    omitted: Option<usize>,
}

/// Reads a dead-letter topic until it holds the record of a value left out.
fn dead_letters(topic: &str, timeout: Duration) -> Result<Vec<Letter>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique("dlq"))
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()?;
    let deadline = Instant::now() + timeout;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let header = |name: &str| -> Option<String> {
            m.headers().and_then(|h| {
                h.iter()
                    .find(|x| x.key == name)
                    .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
            })
        };
        out.push(Letter {
            topic: header(oncely_sinks::runner::HEADER_TOPIC),
            error: header(oncely_sinks::runner::HEADER_ERROR),
            value_len: m.payload().map(<[u8]>::len),
            omitted: header(oncely_sinks::runner::HEADER_VALUE_OMITTED)
                .and_then(|v| v.parse().ok()),
        });
        if out.iter().any(|l| l.omitted.is_some()) {
            return Ok(out);
        }
    }
    bail!("no dead letter with an omitted value within {timeout:?}: {out:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_larger_than_the_limit_stops_capture_with_a_named_error() -> Result<()> {
    let env = CaptureEnv::new("cap_too_large").await?;
    env.client
        .batch_execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, body text);
             ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL;",
        )
        .await?;

    // 1. Larger than the configured limit: the producer refuses it.
    let path = env.write_config(
        "capture.toml",
        &env.config("topic.creation.default.max.message.bytes = 1048576\ntable.include.list = \"public.big\"\n"),
    )?;
    let mut capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    let topic = env.topic("big");
    env.client
        .batch_execute("INSERT INTO big VALUES (1, 'small')")
        .await?;
    wait_for(std::slice::from_ref(&topic), Duration::from_secs(60), |s| {
        !s.is_empty()
    })
    .await?;
    env.client
        .batch_execute(&format!("INSERT INTO big VALUES (2, {});", random_text(2)))
        .await?;
    let status = wait_exit(&mut capture, Duration::from_secs(120)).await;
    let log = env.capture_log();
    let status = status.map_err(|e| anyhow::anyhow!("{e}; log:\n{log}"))?;
    assert!(!status.success(), "capture exits non-zero:\n{log}");
    assert_named(
        &log,
        "public.big",
        "{\"id\":2}",
        "topic.creation.default.max.message.bytes",
    )?;
    // The row before it is in Kafka, the large one is not.
    let seen = tokio::task::spawn_blocking({
        let t = vec![topic.clone()];
        move || read_committed(&t)
    })
    .await??;
    let ids: Vec<i64> = seen
        .iter()
        .filter_map(|s| s.payload()?["after"]["id"].as_i64())
        .collect();
    assert_eq!(ids, vec![1], "{seen:?}");

    // 2. A topic that exists with a smaller max.message.bytes: the broker
    // refuses it, capture's own limit (the 16 MiB default) would not.
    let prefix2 = format!("{}-b", env.prefix);
    let slot2 = format!("{}_b", env.slot);
    let topic2 = format!("{prefix2}.public.big");
    create_topic(&topic2, 1, &[("max.message.bytes", "1048576")]).await?;
    let path2 = env.write_config(
        "capture-b.toml",
        &format!(
            "snapshot.mode = \"no_data\"\n{}",
            env.config_as(
                &prefix2,
                &slot2,
                &format!("{prefix2}-offsets"),
                "table.include.list = \"public.big\"\n"
            )
        ),
    )?;
    std::fs::write(env.dir.join("capture.log"), "")?;
    let mut capture2 = env.spawn_capture(&path2)?;
    wait_slot(&env, &slot2).await?;
    env.client
        .batch_execute(&format!("INSERT INTO big VALUES (3, {});", random_text(2)))
        .await?;
    let status = wait_exit(&mut capture2, Duration::from_secs(120)).await;
    let log = env.capture_log();
    let status = status.map_err(|e| anyhow::anyhow!("{e}; log:\n{log}"))?;
    assert!(!status.success(), "capture exits non-zero:\n{log}");
    assert_named(&log, "public.big", "{\"id\":3}", "max.message.bytes")?;
    assert!(log.contains("the broker refused it"), "{log}");

    drop(capture);
    drop(capture2);
    env.drop_slot(&slot2).await;
    delete_topics(&[topic, topic2]).await;
    env.cleanup().await;
    Ok(())
}

/// The log names table, key, size and setting, and shows no restart loop.
fn assert_named(log: &str, table: &str, key: &str, setting: &str) -> Result<()> {
    let line = log
        .lines()
        .find(|l| l.contains("larger than Kafka accepts"))
        .ok_or_else(|| anyhow::anyhow!("no size error in the log:\n{log}"))?;
    ensure!(line.contains(table), "table named: {line}");
    let escaped = key.replace('"', "\\\"");
    ensure!(
        line.contains(key) || line.contains(&escaped),
        "key named: {line}"
    );
    let size: usize = line
        .split("is a record of ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("size named: {line}"))?;
    ensure!(size > 2 * 1024 * 1024, "the size of the record: {line}");
    ensure!(line.contains(setting), "setting named: {line}");
    ensure!(
        !log.contains("restarting from the last committed offset"),
        "a definite error is not retried:\n{log}"
    );
    Ok(())
}

async fn wait_slot(env: &CaptureEnv, slot: &str) -> Result<()> {
    for _ in 0..300 {
        let row = env.client.query_opt(capture::ACTIVE_SLOT, &[&slot]).await?;
        if row.map(|r| r.get::<_, bool>(0)).unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "slot {slot} never became active; log:\n{}",
        env.capture_log()
    )
}

// ---------------------------------------------------------------------------
// Offsets topic per connector
// ---------------------------------------------------------------------------

/// Whether a transaction is open on partition 0 of `topic`: its last stable
/// offset (what `read_committed` readers reach) is behind its end.
fn open_transaction(topic: &str) -> Result<bool> {
    let ends = |isolation: &str| -> Result<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_brokers())
            .set("group.id", common::unique("lso"))
            .set("isolation.level", isolation)
            .create()?;
        Ok(consumer
            .fetch_watermarks(topic, 0, Duration::from_secs(10))?
            .1)
    };
    Ok(ends("read_committed")? < ends("read_uncommitted")?)
}

/// The end of partition 0 of `topic` as a `read_committed` reader sees it
/// (0 while the topic does not exist).
async fn committed_end(topic: &str) -> Result<i64> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_brokers())
            .set("group.id", common::unique("lso"))
            .set("isolation.level", "read_committed")
            .create()?;
        Ok(consumer
            .fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .map_or(0, |(_, high)| high))
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connector_does_not_hide_the_offsets_of_another() -> Result<()> {
    let env = CaptureEnv::new("cap_two_offsets").await?;
    env.client
        .batch_execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, v text);
             CREATE TABLE small (id bigint PRIMARY KEY, v text);",
        )
        .await?;
    let (prefix_a, slot_a) = (format!("{}-a", env.prefix), format!("{}_a", env.slot));
    let (prefix_b, slot_b) = (format!("{}-b", env.prefix), format!("{}_b", env.slot));
    // Connector a: small Kafka transactions, and a long transaction timeout
    // so a killed instance's open transaction stays open for the whole test.
    let config_a = env.write_config(
        "capture-a.toml",
        &default_offsets(&format!(
            "snapshot.mode = \"no_data\"\n{}",
            env.config_as(
                &prefix_a,
                &slot_a,
                "-",
                "table.include.list = \"public.big\"\nbatch.max.events = 50\nheartbeat.interval.ms = 500\n\
                 [kafka.producer]\n\"transaction.timeout.ms\" = \"600000\"\n",
            )
        )),
    )?;
    let config_b = env.write_config(
        "capture-b.toml",
        &default_offsets(&format!(
            "snapshot.mode = \"no_data\"\n{}",
            env.config_as(
                &prefix_b,
                &slot_b,
                "-",
                "table.include.list = \"public.small\"\nheartbeat.interval.ms = 500\n"
            )
        )),
    )?;
    let offsets_a = oncely_capture::config::CaptureConfig::load(&config_a)?.offsets_topic();
    let offsets_b = oncely_capture::config::CaptureConfig::load(&config_b)?.offsets_topic();
    assert_ne!(
        offsets_a, offsets_b,
        "one offsets topic per connector by default"
    );
    let mut b = env.spawn_capture(&config_b)?;
    wait_slot(&env, &slot_b).await?;
    let mut a = env.spawn_capture(&config_a)?;
    wait_slot(&env, &slot_a).await?;
    const BIG: i64 = 30_000;
    env.client
        .batch_execute(&format!(
            "INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, {BIG}) g"
        ))
        .await?;
    // Kill a until its offsets topic is left with an open transaction (it
    // usually is: a commit runs in the background almost all the time).
    let topic_big = format!("{prefix_a}.public.big");
    let mut open = false;
    for attempt in 0..40 {
        // a is inside the big transaction once more of it is in Kafka.
        let start = committed_end(&topic_big).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while committed_end(&topic_big).await? < start + 200 {
            ensure!(
                Instant::now() < deadline,
                "a does not publish:\n{}",
                env.capture_log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(20 + 37 * attempt)).await;
        kill9(&mut a);
        let t = offsets_a.clone();
        if tokio::task::spawn_blocking(move || open_transaction(&t)).await?? {
            open = true;
            break;
        }
        a = env.spawn_capture(&config_a)?;
        wait_slot(&env, &slot_a).await?;
    }
    assert!(open, "never killed connector a inside a commit");

    // b publishes, restarts (SIGKILL) and publishes again: it must read its
    // newest offset, not one hidden behind a's open transaction.
    for round in 0..3 {
        let first = round * 100 + 1;
        env.client
            .batch_execute(&format!(
                "INSERT INTO small SELECT g, 'r{round}' FROM generate_series({first}, {}) g",
                first + 99
            ))
            .await?;
        let want = (round as usize + 1) * 100;
        wait_for(
            &[format!("{prefix_b}.public.small")],
            Duration::from_secs(120),
            |seen| seen.len() >= want,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}; log:\n{}", env.capture_log()))?;
        // Until b's slot is confirmed past those changes: a stale offset then
        // shows as a gap, not only as republished changes.
        let before = confirmed(&env, &slot_b).await?;
        for _ in 0..100 {
            if confirmed(&env, &slot_b).await? > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        kill9(&mut b);
        b = env.spawn_capture(&config_b)?;
        wait_slot(&env, &slot_b).await?;
    }
    env.client
        .batch_execute("INSERT INTO small SELECT g, 'last' FROM generate_series(301, 310) g")
        .await?;
    let seen_b = wait_for(
        &[format!("{prefix_b}.public.small")],
        Duration::from_secs(120),
        |seen| seen.len() >= 310,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; log:\n{}", env.capture_log()))?;
    assert!(b.try_wait()?.is_none(), "b runs:\n{}", env.capture_log());
    let ids: Vec<i64> = seen_b
        .iter()
        .filter_map(|s| s.payload()?["after"]["id"].as_i64())
        .collect();
    let distinct: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), 310, "each change of b exactly once");
    assert_eq!(distinct.len(), 310);
    let log = env.capture_log();
    assert!(!log.contains("never published"), "no gap error:\n{log}");

    // a resumes and finishes its transaction: each change exactly once.
    a = env.spawn_capture(&config_a)?;
    wait_slot(&env, &slot_a).await?;
    let end: i64 = env
        .client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let stored =
            oncely_capture::testing::read_last_offset(kafka_client(), &offsets_a, &prefix_a)
                .await?;
        if stored.is_some_and(|o| o.flush_lsn >= end as u64) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "a did not finish:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let topics = vec![topic_big.clone()];
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    assert_eq!(scan.duplicate_count, 0, "{scan:?}");
    assert_eq!(scan.events, BIG as u64, "{scan:?}");
    terminate(&mut a, Duration::from_secs(30))?;
    terminate(&mut b, Duration::from_secs(30))?;
    env.drop_slot(&slot_a).await;
    env.drop_slot(&slot_b).await;
    delete_topics(&[
        offsets_a,
        offsets_b,
        topic_big,
        format!("{prefix_b}.public.small"),
    ])
    .await;
    env.cleanup().await;
    Ok(())
}

async fn confirmed(env: &CaptureEnv, slot: &str) -> Result<i64> {
    Ok(env
        .client
        .query_one(
            "SELECT COALESCE((confirmed_flush_lsn - '0/0')::bigint, 0) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_reads_only_its_own_offsets_topic_and_at_once() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let env = CaptureEnv::new("cap_own_offsets").await?;
    let cfg = oncely_capture::config::CaptureConfig::parse(
        &default_offsets(&env.config("")),
        "capture.toml",
    )?;
    // The shared name development versions used, which any connector may
    // still be configured with (offset.storage.topic = "oncely-offsets").
    let shared = "oncely-offsets";
    if let Err(e) = create_topic(shared, 1, &[("cleanup.policy", "compact")]).await {
        ensure!(e.to_string().contains("already exists"), "{e}");
    }
    let producer: BaseProducer = kafka_client()
        .set("transactional.id", common::unique("cap_open_a"))
        .set("transaction.timeout.ms", "20000")
        .create()?;
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout)?;
    // Committed there: an offset under this connector's name.
    let stray = oncely_capture::catalog::SourceOffset::start(42).to_bytes();
    let key = oncely_capture::catalog::SourceOffset::key(cfg.connector_name());
    producer.begin_transaction()?;
    producer
        .send(
            BaseRecord::to(shared)
                .partition(0)
                .key(&key)
                .payload(&stray),
        )
        .map_err(|(e, _)| e)?;
    producer.commit_transaction(timeout)?;
    // Then connector a, killed inside a commit, leaves a transaction open.
    producer.begin_transaction()?;
    producer
        .send(
            BaseRecord::to(shared)
                .partition(0)
                .key("{\"connector\":\"a\"}")
                .payload("{}"),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(timeout)?;
    // As a SIGKILL leaves it: neither committed nor aborted.
    std::mem::forget(producer);

    // This connector starts for the first time: its own topic is made (as
    // start-up makes it) and holds nothing.
    create_topic(&cfg.offsets_topic(), 1, &[("cleanup.policy", "compact")]).await?;
    let t = Instant::now();
    let stored = oncely_capture::catalog::read_stored_offset(&cfg).await?;
    let took = t.elapsed();
    ensure!(
        stored.is_none(),
        "only its own topic is read, not {shared}: {stored:?}"
    );
    ensure!(took < Duration::from_secs(10), "read in {took:?}");
    delete_topics(&[cfg.offsets_topic()]).await;
    env.cleanup().await;
    Ok(())
}

/// A connector under steady load commits a transaction every few
/// milliseconds: the reader of its offsets topic (`oncely status`, `oncely
/// verify`, a restart) must still end at once, at the end it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steadily_written_offsets_topic_is_read_at_once() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let env = CaptureEnv::new("cap_steady_offsets").await?;
    let cfg = oncely_capture::config::CaptureConfig::parse(&env.config(""), "capture.toml")?;
    let topic = cfg.offsets_topic();
    create_topic(&topic, 1, &[("cleanup.policy", "compact")]).await?;
    let key = oncely_capture::catalog::SourceOffset::key(cfg.connector_name());
    let stop = Arc::new(AtomicBool::new(false));
    // As capture commits under load: one offset record per transaction,
    // back to back, each a little further.
    let writer = {
        let (stop, topic) = (Arc::clone(&stop), topic.clone());
        std::thread::spawn(move || -> Result<u64> {
            let producer: BaseProducer = kafka_client()
                .set("transactional.id", common::unique("cap_steady"))
                .create()?;
            let timeout = Duration::from_secs(30);
            producer.init_transactions(timeout)?;
            let mut lsn = 0;
            while !stop.load(Ordering::Relaxed) {
                lsn += 1;
                let value = oncely_capture::catalog::SourceOffset::start(lsn).to_bytes();
                producer.begin_transaction()?;
                producer
                    .send(
                        BaseRecord::to(&topic)
                            .partition(0)
                            .key(&key)
                            .payload(&value),
                    )
                    .map_err(|(e, _)| e)?;
                producer.commit_transaction(timeout)?;
            }
            Ok(lsn)
        })
    };
    // Some history to read through first.
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_end(&topic).await? < 300 {
        ensure!(Instant::now() < deadline, "the writer is too slow");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut reads = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let stored = oncely_capture::catalog::read_stored_offset(&cfg).await;
        let failed = stored.is_err();
        reads.push((t.elapsed(), stored.map(|o| o.map(|o| o.flush_lsn))));
        if failed {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    delete_topics(&[topic]).await;
    env.cleanup().await;
    for (took, stored) in reads {
        let stored = stored?;
        ensure!(
            took < Duration::from_secs(10) && stored.is_some_and(|lsn| lsn > 0 && lsn <= written),
            "read {stored:?} in {took:?} ({written} written)"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_above_the_brokers_limit_refuses_start_up() -> Result<()> {
    let env = CaptureEnv::new("cap_txn_timeout").await?;
    env.client
        .batch_execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        .await?;
    // The broker's transaction.max.timeout.ms is 15 minutes by default.
    let (ok, log) = env.run_capture(
        "[kafka.producer]\n\"transaction.timeout.ms\" = \"3600000\"\n",
        Duration::from_secs(60),
    )?;
    ensure!(!ok, "start-up refused:\n{log}");
    ensure!(
        log.contains("transaction.timeout.ms\" = 3600000")
            && log.contains("transaction.max.timeout.ms"),
        "the setting and the broker's limit are named:\n{log}"
    );
    delete_topics(std::slice::from_ref(&env.offsets_topic)).await;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_topic_with_several_partitions_refuses_start_up() -> Result<()> {
    let env = CaptureEnv::new("cap_internal_parts").await?;
    env.client
        .batch_execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, v text);
             INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g;",
        )
        .await?;
    // Made beforehand with three partitions: the offset record of a key
    // would land on any of them, and start-up reads partition 0 only.
    create_topic(&env.offsets_topic, 3, &[("cleanup.policy", "compact")]).await?;
    let (ok, log) = env.run_capture("snapshot.mode = \"initial\"\n", Duration::from_secs(60))?;
    ensure!(!ok, "start-up refused:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("partitions"))
        .unwrap_or_default();
    ensure!(
        line.contains(&format!("`{}`", env.offsets_topic))
            && line.contains("3 partitions")
            && line.contains("offset.storage.topic"),
        "the topic, its partition count and the fix are named:\n{log}"
    );
    ensure!(
        committed_end(&env.topic("t")).await? == 0,
        "nothing published"
    );

    // The schema-change topic alike, with the offsets topic right.
    let offsets = format!("{}-one", env.offsets_topic);
    let schema_topic = format!("{}.schema-changes", env.prefix);
    create_topic(&schema_topic, 2, &[("cleanup.policy", "compact")]).await?;
    let text = env.config("").replace(
        &format!("\"{}\"", env.offsets_topic),
        &format!("\"{offsets}\""),
    );
    let (ok, log) = env.run_capture_with(&text, Duration::from_secs(60))?;
    ensure!(!ok, "start-up refused:\n{log}");
    ensure!(
        log.contains(&format!("`{schema_topic}`")) && log.contains("2 partitions"),
        "the schema-change topic named:\n{log}"
    );
    delete_topics(&[env.offsets_topic.clone(), offsets, schema_topic]).await;
    env.cleanup().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Truncate on a multi-partition topic
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_reaches_every_partition_and_the_warehouse_equals_the_source() -> Result<()> {
    let mut p = Pipeline::new(
        "cap_truncate_parts",
        "CREATE TABLE t (id bigint PRIMARY KEY, v text);",
        &["t"],
        "topic.creation.default.partitions = 3\n",
    )
    .await?;
    p.sinks.truncate(1); // the warehouse
                         // And one with truncate.mode = "truncate": the copy of a truncate read
                         // from one partition must not remove rows newer than it that another
                         // partition already applied.
    p.add_sink(
        "postgres-truncate",
        &format!(
            "[sink]\nkind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"wh_truncate\"\ntruncate.mode = \"truncate\"\n",
            capture::db_url(&p.env.dbname)
        ),
    )?;
    let topic = p.env.topic("t");
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sink = p.spawn_sink(0)?;
    let truncating = p.spawn_sink(1)?;
    p.env
        .client
        .batch_execute(
            "INSERT INTO t SELECT g, 'first' FROM generate_series(1, 300) g;
             BEGIN;
             INSERT INTO t SELECT g, 'same tx, before' FROM generate_series(301, 400) g;
             TRUNCATE t;
             INSERT INTO t SELECT g, 'same tx, after' FROM generate_series(1, 50) g;
             COMMIT;
             INSERT INTO t SELECT g, 'next tx' FROM generate_series(51, 120) g;
             UPDATE t SET v = 'updated' WHERE id % 7 = 0;",
        )
        .await?;
    // Kill the sink while it works through the truncate, then start it again.
    let wh = p.env.connect().await?;
    for _ in 0..600 {
        let applied = wh
            .query_opt(
                "SELECT count(*) FROM wh.public_t WHERE __oncely_deleted",
                &[],
            )
            .await
            .ok()
            .flatten()
            .map_or(0, |r| r.get::<_, i64>(0));
        if applied > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill9(&mut sink);
    let restarted = p.spawn_sink(0)?;
    let report = p.verify(Duration::from_secs(180)).await?;
    assert!(
        report.is_equal(),
        "the warehouses equal the source:\n{report}"
    );
    assert_eq!(report.compared(), 2, "{report}");

    // The truncate is on every partition, once each.
    let seen = tokio::task::spawn_blocking({
        let t = vec![topic.clone()];
        move || read_committed(&t)
    })
    .await??;
    let mut partitions: Vec<i32> = seen
        .iter()
        .filter(|s| s.op() == Some("t"))
        .map(|s| s.partition)
        .collect();
    partitions.sort();
    assert_eq!(partitions, vec![0, 1, 2], "one truncate per partition");
    let truncates: BTreeSet<String> = seen
        .iter()
        .filter(|s| s.op() == Some("t"))
        .map(|s| {
            s.payload()
                .map(|p| p["source"].to_string())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        truncates.len(),
        1,
        "the same truncate on each: {truncates:?}"
    );
    let topics = vec![topic];
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    assert_eq!(scan.duplicate_count, 0, "{scan:?}");
    drop(restarted);
    drop(truncating);
    drop(capture);
    p.cleanup().await;
    Ok(())
}
