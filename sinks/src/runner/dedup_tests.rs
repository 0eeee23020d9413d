use std::sync::Mutex;

use serde_json::json;

use super::*;
use crate::event::decode_value;
use crate::metrics::Metrics;

/// Records the offsets it is given; fails the next `fail` applies (after recording).
#[derive(Default)]
struct Recording {
    applied: Mutex<Vec<i64>>,
    fail: Mutex<u32>,
}

#[async_trait]
impl Sink for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let mut applied = self.applied.lock().expect("lock");
        applied.extend(batch.records().iter().map(|r| r.offset));
        let mut fail = self.fail.lock().expect("lock");
        if *fail > 0 {
            *fail -= 1;
            return Err(SinkError::retriable("acknowledged, then the process died"));
        }
        Ok(())
    }
}

fn record(offset: i64, lsn: u64, seq: u64, event_id: &str) -> Record {
    let value = json!({
        "before": null,
        "after": {"id": 1, "event_id": event_id},
        "source": {"commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "t"},
        "op": "c",
    })
    .to_string();
    let payload = decode_value(Some(value.as_bytes())).expect("decode");
    Record::new(offset, Some(json!({"id": 1})), payload)
}

fn batch(records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from("t"), 0), records, next)
}

fn dedup(inner: Arc<Recording>, field: Option<&str>) -> (DedupSink, Metrics) {
    let identity = field.map_or(Identity::Position, |f| Identity::Field(f.to_owned()));
    dedup_by(inner, identity)
}

fn dedup_by(inner: Arc<Recording>, identity: Identity) -> (DedupSink, Metrics) {
    let metrics = Metrics::new().expect("metrics");
    let window = Arc::new(MemoryWindow::new(1000, Duration::from_secs(60)));
    let sink = DedupSink::new(inner, window, identity, metrics.dedup_skipped.clone());
    (sink, metrics)
}

/// A record whose `event-id` header is `id` (`None`: no header).
fn headed(offset: i64, lsn: u64, id: Option<&str>) -> Record {
    record(offset, lsn, 0, "unused").with_identity_header(id.map(|i| i.as_bytes().to_vec()))
}

fn skipped(m: &Metrics) -> u64 {
    m.dedup_skipped.with_label_values(&["recording", "t"]).get()
}

#[tokio::test]
async fn a_redelivered_batch_is_skipped_and_counted() {
    let inner = Arc::new(Recording::default());
    let (sink, metrics) = dedup(inner.clone(), None);
    let first = batch(vec![record(0, 10, 0, "a"), record(1, 10, 1, "b")]);
    sink.apply(&first).await.expect("first");
    // Redelivered from an older offset, with one new record behind.
    let again = batch(vec![
        record(0, 10, 0, "a"),
        record(1, 10, 1, "b"),
        record(2, 11, 0, "c"),
    ]);
    sink.apply(&again).await.expect("again");
    assert_eq!(*inner.applied.lock().expect("lock"), [0, 1, 2]);
    assert_eq!(skipped(&metrics), 2);
    assert_eq!(
        again.skipped(),
        2,
        "noted on the batch, so not counted as applied"
    );
    sink.apply(&again).await.expect("all held");
    assert_eq!(again.skipped(), 3, "each apply notes its own count");
}

#[tokio::test]
async fn one_identity_twice_in_a_batch_is_applied_once() {
    let inner = Arc::new(Recording::default());
    let (sink, metrics) = dedup(inner.clone(), None);
    // A delete and the tombstone decoded as that delete share the position.
    sink.apply(&batch(vec![record(0, 10, 0, "a"), record(1, 10, 0, "a")]))
        .await
        .expect("apply");
    assert_eq!(*inner.applied.lock().expect("lock"), [0]);
    assert_eq!(skipped(&metrics), 1);
}

#[tokio::test]
async fn nothing_is_remembered_before_the_sink_returns_ok() {
    let inner = Arc::new(Recording::default());
    *inner.fail.lock().expect("lock") = 1;
    let (sink, _) = dedup(inner.clone(), None);
    let b = batch(vec![record(0, 10, 0, "a")]);
    sink.apply(&b).await.expect_err("fails once");
    sink.apply(&b).await.expect("retried");
    sink.apply(&b).await.expect("redelivered");
    // The documented repeat: the failed attempt and its retry; then skipped.
    assert_eq!(*inner.applied.lock().expect("lock"), [0, 0]);
}

#[tokio::test]
async fn identity_field_names_the_event() {
    let inner = Arc::new(Recording::default());
    let (sink, metrics) = dedup(inner.clone(), Some("after.event_id"));
    sink.apply(&batch(vec![record(0, 10, 0, "evt-1")]))
        .await
        .expect("first");
    // Same outbox event id, written again by the application at another position.
    sink.apply(&batch(vec![
        record(1, 20, 0, "evt-1"),
        record(2, 20, 1, "evt-2"),
    ]))
    .await
    .expect("second");
    assert_eq!(*inner.applied.lock().expect("lock"), [0, 2]);
    assert_eq!(skipped(&metrics), 1);
}

#[tokio::test]
async fn identity_header_names_the_event_and_a_missing_header_is_rejected() {
    let inner = Arc::new(Recording::default());
    let (sink, metrics) = dedup_by(inner.clone(), Identity::Header("event-id".into()));
    sink.apply(&batch(vec![headed(0, 10, Some("e-1"))]))
        .await
        .expect("first");
    // The same event id at another position (re-published): skipped; a new id applied.
    let b = batch(vec![headed(1, 20, Some("e-1")), headed(2, 21, Some("e-2"))]);
    sink.apply(&b).await.expect("second");
    assert_eq!(*inner.applied.lock().expect("lock"), [0, 2]);
    assert_eq!((skipped(&metrics), b.skipped()), (1, 1));

    // Missing, empty or oversized: rejected by offset with the header named, nothing applied.
    let long = "x".repeat(MAX_IDENTITY_HEADER_BYTES + 1);
    let b = batch(vec![
        headed(3, 30, None),
        headed(4, 31, Some("e-3")),
        headed(5, 32, Some("")),
        headed(6, 33, Some(&long)),
    ]);
    let e = sink.apply(&b).await.expect_err("rejected");
    let failures = e.rejected().expect("per record");
    let offsets: Vec<i64> = failures.iter().map(|f| f.offset).collect();
    assert_eq!(offsets, [3, 5, 6]);
    assert!(failures[0].reason.contains("no `event-id` header"), "{e}");
    assert!(failures[1].reason.contains("empty"), "{e}");
    assert!(failures[2].reason.contains("257 bytes"), "{e}");
    assert_eq!(
        *inner.applied.lock().expect("lock"),
        [0, 2],
        "nothing applied"
    );

    // A plain tombstone has no identity either way and passes.
    let tombstone = Record::new(7, Some(json!({"id": 1})), crate::event::Payload::Tombstone);
    assert_eq!(header_identity("t", &tombstone, "event-id"), Ok(None));
    let binary = record(8, 40, 0, "u").with_identity_header(Some(vec![0xff, 0x00]));
    assert_eq!(
        header_identity("t", &binary, "event-id"),
        Ok(Some("t/event-id=0xff00".into()))
    );
}

#[test]
fn identity_header_and_field_exclude_each_other() {
    let both = DedupConfig {
        identity_field: Some("after.event_id".into()),
        identity_header: Some("event-id".into()),
        ..Default::default()
    };
    let e = both.validate().expect_err("both");
    assert_eq!(e.key, "dedup.identity.header");
    assert!(e.to_string().contains("not both"), "{e}");
    let blank = DedupConfig {
        identity_header: Some(" ".into()),
        ..Default::default()
    };
    assert_eq!(
        blank.validate().expect_err("blank").key,
        "dedup.identity.header"
    );
    let header = DedupConfig {
        identity_header: Some("event-id".into()),
        ..Default::default()
    };
    header.validate().expect("valid");
    assert_eq!(header.identity(), Identity::Header("event-id".into()));
    assert_eq!(DedupConfig::default().identity(), Identity::Position);
}

#[test]
fn config_is_checked_with_the_key_named() {
    let bad = |c: DedupConfig| c.validate().expect_err("invalid").key;
    assert_eq!(
        bad(DedupConfig {
            store: DedupStore::Redis,
            ..Default::default()
        }),
        "dedup.redis.url"
    );
    assert_eq!(
        bad(DedupConfig {
            ttl_ms: Some(0),
            ..Default::default()
        }),
        "dedup.ttl.ms"
    );
    assert_eq!(
        bad(DedupConfig {
            identity_field: Some("after.".into()),
            ..Default::default()
        }),
        "dedup.identity.field"
    );
    assert_eq!(
        bad(DedupConfig {
            max_bytes: Some(10),
            ..Default::default()
        }),
        "dedup.max.bytes"
    );
    assert_eq!(
        bad(DedupConfig {
            store: DedupStore::Redis,
            redis_url: Some(oncely_core::Secret::new("redis://r:6379")),
            max_bytes: Some(1 << 20),
            ..Default::default()
        }),
        "dedup.max.bytes"
    );
}

#[test]
fn the_dedup_table_parses_with_bare_dotted_keys() {
    let text = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n\
                [dedup]\nstore = \"redis\"\nredis.url = \"redis://r:6379\"\nttl.ms = 5000\n\
                identity.field = \"after.event_id\"\n[sink]\nkind = \"stdout\"\n";
    let (runner, _) = crate::kinds::parse_config(text).expect("valid");
    let d = runner.dedup.expect("dedup");
    assert_eq!(d.store, DedupStore::Redis);
    assert_eq!(d.ttl_ms, Some(5000));
    assert_eq!(d.identity_field.as_deref(), Some("after.event_id"));
    let e = crate::kinds::parse_config(&text.replace(
        "identity.field = \"after.event_id\"",
        "identity.field = \"after.event_id\"\nidentity.header = \"event-id\"",
    ))
    .expect_err("both");
    assert!(e.to_string().contains("dedup.identity.header"), "{e}");
    let e = crate::kinds::parse_config(&text.replace("ttl.ms", "tll.ms")).expect_err("typo");
    assert!(e.message.contains("tll"), "{e}");
}

/// Owns its positions: applies each record once by itself.
struct Owning;

#[async_trait]
impl Sink for Owning {
    fn name(&self) -> &str {
        "owning"
    }
    fn owns_positions(&self) -> bool {
        true
    }
    async fn apply(&self, _: &Batch) -> Result<(), SinkError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_position_owning_sink_is_refused_and_none_leaves_the_sink_alone() {
    let metrics = Metrics::new().expect("metrics");
    let e = wrap(
        Arc::new(Owning),
        &DedupConfig::default(),
        "g",
        metrics.dedup_skipped.clone(),
    )
    .await
    .err()
    .expect("refused");
    assert!(
        e.is_fatal() && e.to_string().contains("owns its positions"),
        "{e}"
    );
    let off = DedupConfig {
        store: DedupStore::None,
        ..Default::default()
    };
    let inner: Arc<dyn Sink> = Arc::new(Recording::default());
    let same = wrap(inner.clone(), &off, "g", metrics.dedup_skipped.clone())
        .await
        .expect("none");
    assert!(Arc::ptr_eq(&inner, &same));
}

/// A record of a topic a real Debezium connector wrote: `op` `r` rows of one
/// snapshot share `source.lsn` and `source.sequence`.
fn debezium(offset: i64, id: u64, op: &str, snapshot: &str, lsn: u64) -> Record {
    let value = json!({
        "before": null,
        "after": {"id": id},
        "source": {"connector": "postgresql", "snapshot": snapshot, "lsn": lsn,
            "sequence": format!("[null,\"{lsn}\"]"), "schema": "public", "table": "t"},
        "op": op,
    })
    .to_string();
    let payload = decode_value(Some(value.as_bytes())).expect("decode");
    Record::new(offset, Some(json!({"id": id})), payload)
}

fn debezium_batch(partition: i32, records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from("t"), partition), records, next)
}

#[test]
fn debezium_events_sharing_an_lsn_have_distinct_identities_and_a_redelivery_the_same() {
    let snapshot = debezium_batch(
        0,
        vec![
            debezium(0, 1, "r", "first", 500),
            debezium(1, 2, "r", "true", 500),
            debezium(2, 3, "r", "last", 500),
        ],
    );
    let ids: Vec<String> = snapshot
        .records()
        .iter()
        .map(|r| event_identity("t", r, None).expect("identity"))
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        3,
        "one snapshot's rows: {ids:?}"
    );
    // The same rows at the same offsets of another partition are other records.
    let other = debezium_batch(1, vec![debezium(0, 4, "r", "first", 500)]);
    assert_ne!(
        event_identity("t", &other.records()[0], None),
        Some(ids[0].clone())
    );
    // The same record read again (a replay from an older offset) is a repeat.
    let again = debezium_batch(0, vec![debezium(1, 2, "r", "true", 500)]);
    assert_eq!(
        event_identity("t", &again.records()[0], None),
        Some(ids[1].clone())
    );
}

#[test]
fn a_streamed_debezium_change_at_the_snapshot_lsn_is_newer_than_the_snapshot_row() {
    // The first WAL record after the snapshot point starts at that point.
    let row = debezium(0, 1, "r", "last", 500);
    let change = debezium(1, 1, "u", "false", 500);
    let (row, change) = (row.event().expect("row"), change.event().expect("change"));
    assert!(
        crate::event::replaces(change.version, row.version),
        "{} must replace {}",
        change.version,
        row.version
    );
    assert!(!crate::event::replaces(row.version, change.version));
}

#[tokio::test]
async fn every_row_of_a_debezium_snapshot_passes_the_position_window() {
    let inner = Arc::new(Recording::default());
    let (sink, metrics) = dedup(inner.clone(), None);
    let rows: Vec<Record> = (0..5)
        .map(|i| debezium(i, i as u64, "r", "true", 500))
        .collect();
    let b = debezium_batch(0, rows);
    sink.apply(&b).await.expect("apply");
    sink.apply(&b).await.expect("redelivered");
    assert_eq!(*inner.applied.lock().expect("lock"), [0, 1, 2, 3, 4]);
    assert_eq!(skipped(&metrics), 5, "the redelivery only");
}
