//! The snapshot driver without services: chunk reads from a fake source,
//! the committer over the in-memory Kafka, the watermarks and changes of
//! the stream written by the test.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::committer::Committer;
use super::memory::{committer, keys, Log, MemoryKafka, Step};
use super::signal::Checked;
use super::snapshot::ChunkEncoding;
use super::snapshot_runtime::{chunk_read, ChunkReads, ChunkTask, SnapshotDriver};
use crate::change::{Datum, OldRow, RowChange, RowImage, TestTable};
use crate::envelope::{
    ColumnShape, ColumnType, EnvelopeConfig, SnapshotMarker, SourceIdentity, SourcePosition,
    TableEncoder, TableShape, Unrepresentable, PARAM_ATTNUM,
};
use crate::error::CaptureError;
use crate::metrics::CaptureMetrics;
use crate::offset::{SourceOffset, SIGNALS_KEPT};
use crate::seam::{ChunkError, ChunkRequest, ChunkRows};
use crate::snapshot::signal::SignalAction;
use crate::snapshot::{request, watermark_content, SnapshotKind, TableProgress, Watermark};

const TABLE: &str = "public.t";

/// A source whose chunk reads return the results queued, in order, and
/// that keeps what it was asked.
#[derive(Default)]
struct FakeChunks {
    results: VecDeque<Result<ChunkRows<TestTable>, ChunkError>>,
    asked: Vec<ChunkRequest>,
}

impl ChunkReads for FakeChunks {
    type Table = TestTable;

    async fn start(&mut self, req: ChunkRequest) -> Result<ChunkTask<TestTable>, CaptureError> {
        self.asked.push(req);
        let result = self
            .results
            .pop_front()
            .unwrap_or_else(|| Err(ChunkError::Table("no read queued".into())));
        Ok(tokio::spawn(async move { result }))
    }
}

/// `public.t`: an integer key `id` and a text `v`.
fn relation() -> TestTable {
    TestTable {
        namespace: "public",
        name: "t",
        ahead_of_stream: false,
        columns: vec![("id".into(), 23), ("v".into(), 25)],
    }
}

/// A column the envelope writes as a JSON number (`id`) or string.
#[derive(Debug)]
struct TestColumn {
    number: bool,
}

impl ColumnType for TestColumn {
    fn field_schema(&self, field: &str, optional: bool) -> serde_json::Value {
        let ty = if self.number { "int32" } else { "string" };
        serde_json::json!({"type": ty, "optional": optional, "field": field})
    }

    fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        if self.number {
            out.extend_from_slice(text.as_bytes());
        } else {
            out.extend_from_slice(serde_json::Value::from(text).to_string().as_bytes());
        }
        Ok(())
    }

    fn refusal_help(&self) -> (&'static str, &'static str) {
        ("", "")
    }
}

fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(id: u32) -> RowImage {
    RowImage(vec![text(&id.to_string()), text("v")])
}

/// A chunk of rows keyed `ids`; `more` when rows follow it.
fn rows(ids: &[u32], more: bool) -> ChunkRows<TestTable> {
    ChunkRows {
        relation: relation(),
        key_idx: vec![0],
        rows: ids.iter().map(|id| row(*id)).collect(),
        more,
        estimate: Some(10),
        invisible: Vec::new(),
    }
}

fn encoding() -> ChunkEncoding {
    encoding_of(None)
}

/// [`encoding`] of a table whose columns are the source columns
/// `identity`, which the records' schemas name.
fn encoding_of(identity: Option<&SourceIdentity>) -> ChunkEncoding {
    let envelope = EnvelopeConfig {
        topic_prefix: "app".into(),
        topic_mapping: Default::default(),
        database: "db".into(),
        schemas_enable: identity.is_some(),
        columns: Default::default(),
    };
    let column = |name: &str, number| ColumnShape {
        name: name.into(),
        ty: Arc::new(TestColumn { number }),
    };
    let shape = TableShape {
        namespace: "public".into(),
        name: "t".into(),
        columns: vec![column("id", true), column("v", false)],
        key: vec![0],
    };
    let encoder = TableEncoder::from_shape(&shape, &envelope, identity).expect("an encoder");
    let topic: Arc<str> = encoder.topic().into();
    ChunkEncoding {
        encoder,
        topic,
        partitions: None,
    }
}

/// A committer at LSN 0x100 with a snapshot of `tables` queued.
fn with_snapshot(kind: SnapshotKind, tables: &[&str]) -> (Committer<MemoryKafka>, Log) {
    let mut offset = SourceOffset::start(0x100);
    let queued = tables.iter().map(|t| TableProgress::new(t, None)).collect();
    request(&mut offset.snapshot, "snap-1".into(), kind, queued);
    committer(1_000, offset)
}

fn driver() -> SnapshotDriver<TestTable> {
    SnapshotDriver::new(3, CaptureMetrics::new("test"))
}

fn key_columns(table: &str) -> Option<Vec<String>> {
    (table == TABLE).then(|| vec!["id".to_owned()])
}

/// The high watermark's position in the stream.
fn high_at(lsn: u64) -> SourcePosition {
    SourcePosition {
        tx_id: 7,
        lsn,
        commit_lsn: lsn,
        event_seq: 1,
        commit_ts_ms: 1_000,
        snapshot: SnapshotMarker::False,
    }
}

/// Launches a chunk and lets its read finish.
async fn launch_and_read(
    snap: &mut SnapshotDriver<TestTable>,
    kafka: &mut Committer<MemoryKafka>,
    source: &mut FakeChunks,
) {
    snap.launch(kafka, key_columns, source).await.unwrap();
    let read = chunk_read(snap).await;
    snap.on_chunk_read(kafka, read).unwrap();
}

/// The high watermark of the oldest chunk in flight.
fn high_watermark(snap: &SnapshotDriver<TestTable>) -> String {
    let id = &snap.inflight.front().expect("a chunk in flight").id;
    watermark_content(id, Watermark::High)
}

/// Delivers the oldest chunk's high watermark at `lsn`; whether it published.
async fn at_high_watermark(
    snap: &mut SnapshotDriver<TestTable>,
    kafka: &mut Committer<MemoryKafka>,
    lsn: u64,
) -> bool {
    let content = high_watermark(snap);
    let Some(ready) = snap.take_ready(kafka, content.as_bytes()).await.unwrap() else {
        return false;
    };
    snap.publish(kafka, ready, &encoding(), &high_at(lsn))
        .await
        .unwrap();
    true
}

/// The keys (as the envelope writes them) of the records sent so far.
fn sent_ids(log: &Log) -> Vec<String> {
    keys(&log.steps())
        .into_iter()
        .map(|k| {
            let v: serde_json::Value = serde_json::from_str(&k).expect("a JSON key");
            // With its schema, the key is the payload's.
            v.get("payload").unwrap_or(&v)["id"].to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_chunk_publishes_at_its_high_watermark_less_the_rows_the_stream_changed() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Initial, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1, 2, 3], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert_eq!(source.asked.len(), 1);
    assert_eq!(
        source.asked[0].after, None,
        "the first chunk starts the table"
    );
    assert_eq!(source.asked[0].size, 3);

    // The stream deletes row 2 while the chunk is in flight.
    let rel = relation();
    let old = RowImage(vec![text("2"), Datum::Null]);
    let delete = RowChange::Delete {
        table: 1,
        old: OldRow::Key(&old),
    };
    snap.mark_dirty(delete, |id| (id == 1).then_some(&rel));
    // A low watermark publishes nothing.
    let id = snap.inflight[0].id.clone();
    let low = watermark_content(&id, Watermark::Low);
    assert!(snap
        .take_ready(&mut kafka, low.as_bytes())
        .await
        .unwrap()
        .is_none());
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x200).await);

    assert_eq!(sent_ids(&log), ["1", "3"], "row 2 is the stream's");
    assert!(
        kafka.position().snapshot.is_none(),
        "the last chunk of the last table ends the snapshot"
    );
    assert!(snap.finished(kafka.position()));
    // Nothing left to launch.
    snap.launch(&mut kafka, key_columns, &mut source)
        .await
        .unwrap();
    assert_eq!(source.asked.len(), 1);
}

#[tokio::test]
async fn the_next_chunk_is_read_ahead_after_the_last_key_read() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1, 2, 3], true)));
    source.results.push_back(Ok(rows(&[4], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    // Read ahead before the first chunk is published.
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert_eq!(source.asked.len(), 2);
    assert_eq!(source.asked[1].after, Some(vec![Some("3".to_owned())]));
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x200).await);
    let current = kafka
        .position()
        .snapshot
        .as_ref()
        .unwrap()
        .current()
        .unwrap();
    assert_eq!(current.last_key, Some(vec![Some("3".to_owned())]));
    assert_eq!(current.rows, 3);
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x300).await);
    assert_eq!(sent_ids(&log), ["1", "2", "3", "4"]);
    assert!(kafka.position().snapshot.is_none());
}

#[tokio::test]
async fn a_chunk_whose_columns_were_read_past_its_position_is_read_again() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    // Its columns came from a catalog past DDL the stream had not reached
    // at the chunk's high watermark (MySQL's information_schema).
    let mut ahead = rows(&[1, 2], false);
    ahead.relation.ahead_of_stream = true;
    source.results.push_back(Ok(ahead));
    source.results.push_back(Ok(rows(&[1, 2], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert!(!at_high_watermark(&mut snap, &mut kafka, 0x200).await);
    assert!(sent_ids(&log).is_empty(), "nothing of it is published");

    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert_eq!(source.asked[1].after, None, "read again from the same key");
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x300).await);
    assert_eq!(sent_ids(&log), ["1", "2"]);
}

/// The encoder of a chunk of `rel` whose columns are source columns
/// `attnums`, got as the pipeline gets it: the driver's cached one, else
/// one built for them (counted in `built`) and kept.
fn chunk_encoding(
    snap: &mut SnapshotDriver<TestTable>,
    rel: &TestTable,
    attnums: [i16; 2],
    built: &mut usize,
) -> ChunkEncoding {
    let identity = SourceIdentity {
        table_oid: 16_384,
        attnums: attnums.map(Some).to_vec(),
        dropped: Vec::new(),
    };
    let (encoder, topic) = match snap.cached_encoder(rel, Some(&identity)) {
        Some(cached) => cached,
        None => {
            *built += 1;
            let e = encoding_of(Some(&identity));
            snap.cache_encoder(rel, Some(identity), &e.encoder, &e.topic);
            (e.encoder, e.topic)
        }
    };
    ChunkEncoding {
        encoder,
        topic,
        partitions: None,
    }
}

/// The source column number each record's schema gives `v`.
fn sent_v_attnums(log: &Log) -> Vec<String> {
    log.steps()
        .iter()
        .filter_map(|s| match s {
            Step::Send {
                value: Some(value), ..
            } => serde_json::from_slice::<serde_json::Value>(value).ok(),
            _ => None,
        })
        .filter(|v| v.get("schema").is_some())
        .map(|v| v["schema"]["fields"][1]["fields"][1]["parameters"][PARAM_ATTNUM].to_string())
        .collect()
}

/// `v` dropped and added again under its name and type between two chunks
/// (`ALTER TABLE t DROP v; ALTER TABLE t ADD v text`): the second chunk's
/// table has the first's shape, but its `v` is another column, which sinks
/// tell by its number. Its records name the new number; a third chunk with
/// nothing changed reuses the encoder.
#[tokio::test]
async fn a_chunk_of_the_same_shape_with_other_column_numbers_is_encoded_with_its_own() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1], true)));
    source.results.push_back(Ok(rows(&[2], true)));
    source.results.push_back(Ok(rows(&[3], false)));
    let mut built = 0;
    for (lsn, attnums) in [(0x200, [1, 2]), (0x300, [1, 3]), (0x400, [1, 3])] {
        launch_and_read(&mut snap, &mut kafka, &mut source).await;
        let content = high_watermark(&snap);
        let ready = snap
            .take_ready(&mut kafka, content.as_bytes())
            .await
            .unwrap()
            .expect("the chunk is ready");
        assert!(ready.rows.relation == relation(), "one shape");
        let encoding = chunk_encoding(&mut snap, &ready.rows.relation, attnums, &mut built);
        snap.publish(&mut kafka, ready, &encoding, &high_at(lsn))
            .await
            .unwrap();
    }
    assert_eq!(sent_ids(&log), ["1", "2", "3"]);
    assert_eq!(
        sent_v_attnums(&log),
        ["\"2\"", "\"3\"", "\"3\""],
        "the second chunk's `v` is column 3, not the dropped column 2"
    );
    assert_eq!(built, 2, "built again only when the numbers changed");
}

#[tokio::test]
async fn a_chunk_whose_select_missed_a_streamed_transaction_is_read_again() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    // Transaction 42 came through the stream before the launch, yet the
    // chunk's SELECT saw it in progress.
    snap.note_begin(42);
    let mut missed = rows(&[1, 2], false);
    missed.invisible = vec![42];
    source.results.push_back(Ok(missed));
    source.results.push_back(Ok(rows(&[1, 2], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert!(!at_high_watermark(&mut snap, &mut kafka, 0x200).await);
    assert!(sent_ids(&log).is_empty(), "nothing of it is published");
    assert!(kafka.position().snapshot.is_some());

    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert_eq!(source.asked.len(), 2);
    assert_eq!(source.asked[1].after, None, "read again from the same key");
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x300).await);
    assert_eq!(sent_ids(&log), ["1", "2"]);
}

#[tokio::test]
async fn a_paused_snapshot_reads_nothing_and_its_chunk_in_flight_is_read_again() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1], false)));
    source.results.push_back(Ok(rows(&[1], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    let content = high_watermark(&snap);

    let signal = |kind: &str| super::signal::SignalRow::new("s-1", kind);
    snap.on_signal(
        &mut kafka,
        &signal("pause-snapshot"),
        Checked::Other(SignalAction::PauseSnapshot),
    );
    assert!(kafka.position().snapshot.as_ref().unwrap().paused);
    assert!(snap
        .take_ready(&mut kafka, content.as_bytes())
        .await
        .unwrap()
        .is_none());
    snap.launch(&mut kafka, key_columns, &mut source)
        .await
        .unwrap();
    assert_eq!(source.asked.len(), 1, "a paused snapshot reads nothing");

    snap.on_signal(
        &mut kafka,
        &signal("resume-snapshot"),
        Checked::Other(SignalAction::ResumeSnapshot),
    );
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert_eq!(source.asked.len(), 2, "read again once resumed");
    assert!(at_high_watermark(&mut snap, &mut kafka, 0x300).await);
    assert_eq!(sent_ids(&log), ["1"]);
}

#[tokio::test]
async fn a_table_that_cannot_be_read_is_skipped_and_the_next_one_goes_on() {
    let (mut kafka, _log) = with_snapshot(SnapshotKind::Incremental, &["public.gone", TABLE]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    // `public.gone` has no key columns: skipped before any read.
    source
        .results
        .push_back(Err(ChunkError::Table("no such table".into())));
    snap.launch(&mut kafka, key_columns, &mut source)
        .await
        .unwrap();
    let progress = kafka.position().snapshot.as_ref().unwrap();
    assert_eq!(progress.current().unwrap().table, TABLE);
    assert!(source.asked.is_empty());
    // A read that fails for the table skips it too.
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    assert!(kafka.position().snapshot.is_none());
    assert!(snap.finished(kafka.position()));
}

#[tokio::test]
async fn a_released_table_is_snapshotted_and_its_stale_rows_removed_at_the_end() {
    let (mut kafka, log) = committer(1_000, SourceOffset::start(0x100));
    let mut snap = driver();
    snap.quarantine(&mut kafka, TABLE, "no key".into());
    assert!(kafka.position().quarantined.contains_key(TABLE));
    snap.fixes.note(TABLE.into(), 0x180);
    snap.release(&mut kafka, TABLE);
    assert!(kafka.position().quarantined.is_empty());
    assert_eq!(kafka.position().stale_before.get(TABLE), Some(&0x180));
    let progress = kafka.position().snapshot.as_ref().unwrap();
    assert_eq!(progress.current().unwrap().table, TABLE);

    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    let content = high_watermark(&snap);
    let ready = snap
        .take_ready(&mut kafka, content.as_bytes())
        .await
        .unwrap()
        .unwrap();
    assert!(snap.removes_stale(&ready, kafka.position()));
    let encoding = ChunkEncoding {
        partitions: Some(2),
        ..encoding()
    };
    snap.publish(&mut kafka, ready, &encoding, &high_at(0x200))
        .await
        .unwrap();
    // The row, then a truncate on each partition, versioned at the fix.
    let sent: Vec<_> = log
        .steps()
        .into_iter()
        .filter_map(|s| match s {
            super::memory::Step::Send { key, partition, .. } => Some((key.is_some(), partition)),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [(true, None), (false, Some(0)), (false, Some(1))]);
    assert!(kafka.position().stale_before.is_empty());
}

#[tokio::test]
async fn a_quarantined_table_leaves_the_snapshot_and_its_chunk_is_abandoned() {
    let (mut kafka, log) = with_snapshot(SnapshotKind::Incremental, &[TABLE, "public.u"]);
    let mut snap = driver();
    let mut source = FakeChunks::default();
    source.results.push_back(Ok(rows(&[1], false)));
    launch_and_read(&mut snap, &mut kafka, &mut source).await;
    let content = high_watermark(&snap);
    snap.quarantine(&mut kafka, TABLE, "a topic another table holds".into());
    assert!(snap
        .take_ready(&mut kafka, content.as_bytes())
        .await
        .unwrap()
        .is_none());
    assert!(sent_ids(&log).is_empty());
    let progress = kafka.position().snapshot.as_ref().unwrap();
    assert_eq!(progress.current().unwrap().table, "public.u");
}

/// A gap recovery reads whether capture took its execute-snapshot signal
/// from the offset record: the outcome is staged with the signal's own
/// transaction, refused ones with the reason, the last few kept.
#[tokio::test]
async fn an_execute_snapshot_signal_s_outcome_is_in_the_staged_offset() {
    let (mut kafka, _log) = committer(1_000, SourceOffset::start(0x100));
    let mut snap = driver();
    let signal = |id: &str| super::signal::SignalRow::new(id, "execute-snapshot");
    let reason = "public.t: is quarantined (no primary key)";
    snap.on_signal(
        &mut kafka,
        &signal("gap-1"),
        Checked::Refused(reason.into()),
    );
    assert!(kafka.position().snapshot.is_none(), "nothing queued");
    snap.on_signal(
        &mut kafka,
        &signal("gap-2"),
        Checked::ExecuteSnapshot(vec![TableProgress::new(TABLE, None)]),
    );
    let staged = kafka.position();
    assert_eq!(
        staged.signal("gap-1").map(|s| s.refused.as_deref()),
        Some(Some(reason))
    );
    assert_eq!(
        staged.signal("gap-2").map(|s| s.refused.as_deref()),
        Some(None)
    );
    assert_eq!(staged.signal("gap-3"), None);

    for i in 3..=SIGNALS_KEPT + 2 {
        snap.on_signal(
            &mut kafka,
            &signal(&format!("gap-{i}")),
            Checked::Refused(reason.into()),
        );
    }
    let staged = kafka.position();
    assert_eq!(staged.signals.len(), SIGNALS_KEPT);
    assert_eq!(staged.signal("gap-2"), None, "the oldest dropped");
    assert!(staged.signal("gap-3").is_some());
}
