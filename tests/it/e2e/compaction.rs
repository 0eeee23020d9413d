//! A sink that lags behind log compaction still deletes: on a compacted
//! change topic Kafka keeps only the newest record of each key, so a deleted
//! row's delete event is removed and its tombstone is all that is left.
//! Capture puts the source position (and, on tombstones, the table) in
//! headers of every record, and the sinks apply such a tombstone as a
//! versioned delete. The test stops the three sinks, deletes rows, waits for
//! the broker's log cleaner to remove the delete events, starts the sinks
//! again and requires every target equal to the source.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use crate::harness::capture::terminate;
use crate::harness::common;
use crate::harness::e2e::Pipeline;

const ROWS: i32 = 40;
const DELETED: i32 = 20;

/// What one record of the topic says, for the checks.
struct Entry {
    key: i64,
    op: Option<String>,
    position: Option<String>,
    table: Option<String>,
    commit_lsn: Option<u64>,
    event_seq: Option<u64>,
}

/// Every record of `topic` (one partition), read_committed, to its end.
fn read_all(topic: &str) -> Result<Vec<Entry>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique("compaction-scan"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    loop {
        ensure!(Instant::now() < deadline, "reading {topic} timed out");
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
            Some(Err(e)) => bail!("read {topic}: {e}"),
            Some(Ok(m)) => {
                let key: Value = serde_json::from_slice(m.key().context("keyless record")?)?;
                let key = key.get("payload").unwrap_or(&key)["id"]
                    .as_i64()
                    .context("key id")?;
                let header = |name: &str| {
                    m.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == name)
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                };
                let value: Option<Value> = m.payload().map(serde_json::from_slice).transpose()?;
                let payload = value.as_ref().map(|v| v.get("payload").unwrap_or(v));
                let source = payload.map(|p| &p["source"]);
                out.push(Entry {
                    key,
                    op: payload.and_then(|p| p["op"].as_str()).map(str::to_owned),
                    position: header("oncely.position"),
                    table: header("oncely.schema")
                        .zip(header("oncely.table"))
                        .map(|(s, t)| format!("{s}.{t}")),
                    commit_lsn: source.and_then(|s| s["commit_lsn"].as_u64()),
                    event_seq: source.and_then(|s| s["event_seq"].as_u64()),
                });
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sinks_lagging_behind_compaction_apply_tombstones_as_deletes() -> Result<()> {
    let p = Pipeline::new(
        "e2e_compaction",
        "CREATE TABLE t (id integer PRIMARY KEY, v text NOT NULL, n numeric(10,2));",
        &["t"],
        "",
    )
    .await?;
    let result = body(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn body(p: &Pipeline) -> Result<()> {
    let topic = p.env.topic("t");
    // The change topic, compacted eagerly: segments roll every 100 ms and
    // are cleaned at once; tombstones stay for a day.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?;
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.001")
        .set("min.compaction.lag.ms", "0")
        .set("delete.retention.ms", "86400000");
    for r in admin.create_topics(&[new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }

    let _capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO t SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, {ROWS}) g"
        ))
        .await?;
    let mut sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    let report = p.verify(Duration::from_secs(120)).await?;
    ensure!(report.is_equal(), "before the deletes:\n{report}");

    // The sinks stop, having applied every insert; rows are deleted and
    // others updated while they are away.
    for s in &mut sinks {
        terminate(s, Duration::from_secs(30))?;
    }
    p.env
        .client
        .batch_execute(&format!(
            "DELETE FROM t WHERE id <= {DELETED}; UPDATE t SET v = v || '-u' WHERE id > {DELETED};"
        ))
        .await?;

    // Every record of the topic says where it comes from; a tombstone names
    // the position of the delete before it, and its table.
    let entries = tokio::task::spawn_blocking({
        let topic = topic.clone();
        move || read_all(&topic)
    })
    .await??;
    let mut delete_positions: HashMap<i64, String> = HashMap::new();
    for e in &entries {
        let position = e
            .position
            .as_deref()
            .context("a record without oncely.position")?;
        match e.op.as_deref() {
            Some(op) => {
                ensure!(
                    Some(position.to_owned())
                        == e.commit_lsn
                            .zip(e.event_seq)
                            .map(|(l, s)| format!("{l}/{s}")),
                    "header {position} differs from the envelope's position (op {op})"
                );
                if op == "d" {
                    delete_positions.insert(e.key, position.to_owned());
                }
            }
            None => {
                ensure!(
                    delete_positions.get(&e.key).map(String::as_str) == Some(position),
                    "tombstone of {} at {position}, its delete at {:?}",
                    e.key,
                    delete_positions.get(&e.key)
                );
                ensure!(
                    e.table.as_deref() == Some("public.t"),
                    "tombstone table {:?}",
                    e.table
                );
            }
        }
    }
    ensure!(
        delete_positions.len() == DELETED as usize,
        "{} deletes in the topic",
        delete_positions.len()
    );

    // Updates keep appending, so segments roll and the cleaner runs, until
    // no delete event is left: only the tombstones of the deleted rows.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut round = 0;
    loop {
        round += 1;
        p.env
            .client
            .execute(
                "UPDATE t SET n = n + 1 WHERE id = $1",
                &[&(DELETED + 1 + round % (ROWS - DELETED))],
            )
            .await?;
        let entries = tokio::task::spawn_blocking({
            let topic = topic.clone();
            move || read_all(&topic)
        })
        .await??;
        let deletes = entries
            .iter()
            .filter(|e| e.op.as_deref() == Some("d"))
            .count();
        let tombstones = entries.iter().filter(|e| e.op.is_none()).count();
        if deletes == 0 && tombstones == DELETED as usize {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the log cleaner left {deletes} delete events ({tombstones} tombstones) on {topic}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The sinks come back and see only tombstones for the deleted rows.
    for (i, s) in sinks.iter_mut().enumerate() {
        *s = p.spawn_sink(i)?;
    }
    let report = p.verify(Duration::from_secs(180)).await?;
    ensure!(
        report.is_equal(),
        "rows deleted behind compaction are still in a target:\n{report}"
    );
    Ok(())
}

/// Capture writes the headers sinks read: one set of names on both sides
/// (capture's are the wire contract's, `oncely_core::wire`).
#[test]
fn capture_and_sinks_name_the_headers_alike() {
    use oncely_core::wire as capture;
    use oncely_sinks::event as sinks;
    assert_eq!(capture::HEADER_POSITION, sinks::HEADER_POSITION);
    assert_eq!(capture::HEADER_SCHEMA, sinks::HEADER_SCHEMA);
    assert_eq!(capture::HEADER_TABLE, sinks::HEADER_TABLE);
}
