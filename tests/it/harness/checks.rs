//! What the end-to-end tests check besides `oncely verify`: the change
//! events the source counted, what a `read_committed` reader finds on the
//! change topics, consumer groups' committed offsets, dead letters.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::harness::capture::{committed_reader, read_to_end, topics_where};
use crate::harness::common;
use crate::harness::e2e::WAREHOUSE_SCHEMA;

/// SQL that counts the change events each committed change of `tables`
/// makes, in the same transaction, into `expected_events` (a table capture
/// does not capture; read it with [`expected_events`]): one per change, two
/// for a primary-key update (it goes out as a delete of the old key and a
/// create of the new one). The tables' key column is `id`.
pub fn event_counter(tables: &[&str]) -> String {
    let mut sql = String::from(
        "
    CREATE TABLE expected_events (n integer NOT NULL);
    CREATE FUNCTION count_event() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id THEN
            INSERT INTO expected_events VALUES (2);
        ELSE
            INSERT INTO expected_events VALUES (1);
        END IF;
        RETURN NULL;
    END $$;",
    );
    for table in tables {
        sql.push_str(&format!(
            "\n    CREATE TRIGGER count_event AFTER INSERT OR UPDATE OR DELETE ON {table} \
             FOR EACH ROW EXECUTE FUNCTION count_event();"
        ));
    }
    sql
}

/// The change events counted so far by the triggers of [`event_counter`].
pub async fn expected_events(client: &tokio_postgres::Client) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT COALESCE(sum(n), 0)::bigint FROM expected_events",
            &[],
        )
        .await?
        .get(0))
}

/// The partitions of `topics` as `consumer`'s metadata lists them, each
/// added to a list by `add` (with or without a start offset).
fn partitions_of<C: rdkafka::consumer::Consumer>(
    consumer: &C,
    topics: &[String],
    add: impl Fn(&mut rdkafka::TopicPartitionList, &str, i32) -> Result<()>,
) -> Result<rdkafka::TopicPartitionList> {
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for t in metadata
        .topics()
        .iter()
        .filter(|t| topics.iter().any(|w| w == t.name()))
    {
        for p in t.partitions() {
            add(&mut tpl, t.name(), p.id())?;
        }
    }
    Ok(tpl)
}

/// Rows in the warehouse's history table of `table` (schema `public`).
pub async fn history_rows(client: &tokio_postgres::Client, table: &str) -> Result<i64> {
    Ok(client
        .query_one(
            &format!("SELECT count(*) FROM {WAREHOUSE_SCHEMA}.public_{table}_history"),
            &[],
        )
        .await
        .context("read the history table")?
        .get(0))
}

/// What a `read_committed` reader finds on change topics: change events
/// (tombstones left out), and the events seen more than once.
///
/// An event is identified by `(source.commit_lsn, source.event_seq)`:
/// capture gives every event a position of its own (a primary-key update's
/// delete and create take consecutive ordinals), so a position seen twice is
/// a duplicate. MySQL's source block has no such pair: there an event is its
/// rows event's `(file, pos)`, its `row` in that event and its op (a
/// primary-key update's delete and create share the row), see
/// [`event_position`].
/// A truncate goes to every partition of its topic: one copy per partition
/// is expected, so its identity includes the partition.
#[derive(Debug, Default)]
pub struct ChangeScan {
    pub events: u64,
    /// Snapshot rows (`op = r`) among `events`.
    pub reads: u64,
    pub tombstones: u64,
    /// `(commit_lsn, event_seq, op)` of positions seen twice or more, with
    /// the topic of both records (at most 10 listed).
    pub duplicates: Vec<String>,
    pub duplicate_count: u64,
    /// Events without `source.commit_lsn`/`event_seq`/`op`.
    pub unversioned: u64,
}

/// Reads `topics` to their end with `read_committed`, keeping only each
/// event's identity, so memory stays small on long runs.
pub fn scan_changes(topics: &[String]) -> Result<ChangeScan> {
    scan_changes_with(topics, |bytes| Ok(serde_json::from_slice(bytes)?))
}

/// [`scan_changes`] of topics in Confluent's Avro wire format, each value
/// decoded through the registry at `registry_url` (to the JSON converter's
/// form). Runs on a blocking thread of a tokio runtime (it waits for the
/// registry's answers on `handle`).
pub fn scan_avro_changes(
    topics: &[String],
    registry_url: &str,
    handle: tokio::runtime::Handle,
) -> Result<ChangeScan> {
    let registry = oncely_core::avro::registry::RegistryClient::new(registry_url)?;
    scan_changes_with(topics, |bytes| {
        let (id, body) = oncely_core::avro::wire::unframe(bytes)?;
        let codec = handle.block_on(registry.schema(id))?;
        Ok(codec.decode(body)?)
    })
}

/// An event's identity as two numbers: `(commit_lsn, event_seq)`, or for
/// MySQL's source block `(file number << 32 | pos, row << 3 | op)` (a
/// binlog offset fits 32 bits; the op's low bits tell a primary-key
/// update's delete from its create). None without either.
fn event_position(source: &serde_json::Value, op: Option<char>) -> Option<(u64, u64)> {
    if let (Some(lsn), Some(seq)) = (source["commit_lsn"].as_u64(), source["event_seq"].as_u64()) {
        return Some((lsn, seq));
    }
    let file = source["file"].as_str()?;
    let number: u64 = file.rsplit_once('.')?.1.parse().ok()?;
    let pos = source["pos"]
        .as_u64()
        .filter(|p| *p <= u64::from(u32::MAX))?;
    let row = source["row"].as_u64()?;
    let op = match op? {
        'r' => 0,
        'c' => 1,
        'u' => 2,
        'd' => 3,
        _ => 4,
    };
    Some((number << 32 | pos, row << 3 | op))
}

fn scan_changes_with(
    topics: &[String],
    decode: impl Fn(&[u8]) -> Result<serde_json::Value>,
) -> Result<ChangeScan> {
    use std::collections::HashMap;

    use rdkafka::message::Message;
    use serde_json::Value;

    // Identity -> topic index, to describe a duplicate.
    let mut seen: HashMap<(u64, u64, i32), usize> = HashMap::new();
    let mut scan = ChangeScan::default();
    read_to_end("read_committed", topics, Duration::from_secs(300), |m| {
        let Some(bytes) = m.payload() else {
            scan.tombstones += 1;
            return Ok(());
        };
        let value: Value = decode(bytes)?;
        let payload = value.get("payload").unwrap_or(&value);
        let source = &payload["source"];
        let op = payload["op"].as_str().and_then(|o| o.chars().next());
        match (event_position(source, op), op) {
            (Some((lsn, seq)), Some(op)) => {
                scan.events += 1;
                scan.reads += u64::from(op == 'r');
                let topic = topics
                    .iter()
                    .position(|t| t == m.topic())
                    .unwrap_or(usize::MAX);
                let partition = if op == 't' { m.partition() } else { -1 };
                if let Some(first_topic) = seen.insert((lsn, seq, partition), topic) {
                    scan.duplicate_count += 1;
                    if scan.duplicates.len() < 10 {
                        let name = |i: usize| topics.get(i).map_or("?", String::as_str);
                        scan.duplicates.push(format!(
                            "({lsn}, {seq}, {op}): in {}, then in {} at offset {}",
                            name(first_topic),
                            name(topic),
                            m.offset()
                        ));
                    }
                }
            }
            _ => scan.unversioned += 1,
        }
        Ok(())
    })?;
    Ok(scan)
}

/// The partitions of `topics` where `group`'s committed Kafka offset lies
/// before a committed record (transaction markers and aborted records after
/// it do not count), as `topic[partition] committed X, end Y` lines.
pub fn lagging_commits(group: &str, topics: &[String]) -> Result<Vec<String>> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};
    use std::time::Instant;

    let timeout = Duration::from_secs(10);
    let committed: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let tpl = partitions_of(&committed, topics, |tpl, topic, p| {
        tpl.add_partition(topic, p);
        Ok(())
    })?;
    let offsets = committed.committed_offsets(tpl, timeout)?;
    let reader = committed_reader("commit-scan")?;
    let mut lagging = Vec::new();
    for e in offsets.elements() {
        let (_, end) = reader.fetch_watermarks(e.topic(), e.partition(), timeout)?;
        let at = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        if at >= end {
            continue;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition_offset(e.topic(), e.partition(), Offset::Offset(at))?;
        reader.assign(&one)?;
        let deadline = Instant::now() + timeout;
        let behind = loop {
            anyhow::ensure!(
                Instant::now() < deadline,
                "reading {}[{}] timed out",
                e.topic(),
                e.partition()
            );
            match reader.poll(Duration::from_millis(200)) {
                None => {}
                Some(Ok(m)) => break m.offset() < end,
                Some(Err(KafkaError::PartitionEOF(_))) => break false,
                Some(Err(err)) => anyhow::bail!("read {}[{}]: {err}", e.topic(), e.partition()),
            }
        };
        if behind {
            lagging.push(format!(
                "{}[{}] committed {at}, end {end}",
                e.topic(),
                e.partition()
            ));
        }
    }
    Ok(lagging)
}

/// The dead letters of this pipeline's sinks (topics `<prefix>-<sink>-dlq`),
/// as `topic: reason` lines, read with `read_committed` to their end.
pub fn dead_letters(prefix: &str) -> Result<Vec<String>> {
    use rdkafka::message::{Headers, Message};

    let topics = topics_where(|t| t.starts_with(&format!("{prefix}-")) && t.ends_with("-dlq"))?;
    let mut letters = Vec::new();
    read_to_end("read_committed", &topics, Duration::from_secs(60), |m| {
        let reason = m
            .headers()
            .and_then(|h| {
                h.iter()
                    .find(|h| h.key == "oncely.dlq.error")
                    .and_then(|h| h.value)
            })
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        letters.push(format!("{}: {reason}", m.topic()));
        Ok(())
    })?;
    Ok(letters)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::event_position;

    #[test]
    fn a_binlog_event_is_its_file_pos_row_and_op() {
        let at = |file: &str, pos: u64, row: u64| json!({"file": file, "pos": pos, "row": row});
        let delete = event_position(&at("binlog.000007", 4000, 2), Some('d'));
        let create = event_position(&at("binlog.000007", 4000, 2), Some('c'));
        // A primary-key update's two halves share the row, not the identity.
        assert_ne!(delete, create);
        assert_eq!(
            delete,
            event_position(&at("binlog.000007", 4000, 2), Some('d'))
        );
        let distinct = [
            event_position(&at("binlog.000008", 4000, 2), Some('d')),
            event_position(&at("binlog.000007", 4001, 2), Some('d')),
            event_position(&at("binlog.000007", 4000, 3), Some('d')),
        ];
        assert!(distinct.iter().all(|p| p.is_some() && *p != delete));
        assert_eq!(delete, Some((7 << 32 | 4000, 2 << 3 | 3)));
        // commit_lsn/event_seq first; neither: None.
        let pg =
            json!({"commit_lsn": 9, "event_seq": 1, "file": "binlog.000001", "pos": 4, "row": 0});
        assert_eq!(event_position(&pg, Some('c')), Some((9, 1)));
        assert_eq!(event_position(&json!({"file": "binlog"}), Some('c')), None);
    }
}
