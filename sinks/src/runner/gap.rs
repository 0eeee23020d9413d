//! Recovering a gap by an incremental snapshot (`gap.recovery = "snapshot"`).
//!
//! ```text
//!  gap found at assignment ──► request a snapshot of the topic's tables
//!                              (before = source position ahead of the signal)
//!                          ──► remove the tables' rows older than `before`
//!                              (a truncate event at `before`, position = log start)
//!                          ──► partition resumes at the log start, "recovering"
//!  capture finished it     ──► healthy
//! ```
//!
//! The invariant: every row the source holds once the snapshot is done
//! reaches the target with a version at or after `before` — a snapshot row
//! (its chunk's high watermark, after the signal) or a change streamed after
//! the signal. So a row still older than `before` is one the source deleted
//! inside the records Kafka lost, and removing every such row up front
//! leaves, once the snapshot is applied, exactly the source. Removal is the
//! version-guarded truncate each sink already applies for capture's
//! truncate copies (newer rows stay; a row it removes that the source still
//! holds comes back with its snapshot row), so it may run before the
//! snapshot rows arrive, on any partition.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::shared::Shared;
use super::snapshot_signals::{SnapshotRequest, SnapshotSignals};
use crate::error::SinkError;
use crate::event::{ChangeEvent, Op, Payload, Version, VersionOrigin};
use crate::sink::{Batch, Record, TopicPartition};

/// How often a recovering partition asks whether capture finished its snapshot.
const FINISHED_POLL: Duration = Duration::from_secs(1);

/// The truncate event that removes `table`'s rows older than `before`.
fn removal(
    offset: i64,
    database: &str,
    (schema, table): &(String, String),
    before: Version,
) -> Record {
    let mut source = Map::new();
    source.insert("db".into(), Value::String(database.to_owned()));
    source.insert("schema".into(), Value::String(schema.clone()));
    source.insert("table".into(), Value::String(table.clone()));
    source.insert("snapshot".into(), Value::String("false".into()));
    let event = ChangeEvent {
        op: Op::Truncate,
        before: None,
        after: None,
        source,
        ts_ms: None,
        message: None,
        version: before,
        version_origin: VersionOrigin::CommitLsn,
        schema: None,
    };
    Record::new(offset, None, Payload::Change(Box::new(event)))
}

impl Shared {
    /// Recovers `tp`, which needs `next` while Kafka's log starts at
    /// `log_start`: requests the snapshot, removes what it will not bring
    /// back, stores the log start as the position (sinks owning positions),
    /// and watches for the snapshot's end. Runs before the partition's
    /// worker starts, so nothing else applies to it meanwhile.
    pub(crate) async fn recover_gap(
        self: &Arc<Self>,
        signals: &Arc<dyn SnapshotSignals>,
        tp: &TopicPartition,
        log_start: i64,
    ) -> Result<SnapshotRequest, SinkError> {
        let request = signals.request(&tp.topic).await?;
        if request.tables.is_empty() {
            return Err(SinkError::fatal(format!(
                "{tp}: gap.recovery = \"snapshot\" found no source table that writes this topic; snapshot its table by hand (`oncely capture snapshot --table <schema.table>`) and start the sink with --resume-after-gap"
            )));
        }
        // The removal takes the place of the record just before the log
        // start: applying it stores the log start as the position.
        let records = request
            .tables
            .iter()
            .map(|t| removal(log_start - 1, &request.database, t, request.before))
            .collect();
        let mut batch = Batch::new(
            self.group.clone(),
            (Arc::from(tp.topic.as_str()), tp.partition),
            records,
            log_start,
        );
        self.sink.prepare(&mut batch);
        self.sink.apply(&batch).await?;
        Ok(request)
    }

    /// Marks `tp` recovering until capture reports the snapshot done.
    pub(crate) fn watch_recovery(
        self: &Arc<Self>,
        signals: Arc<dyn SnapshotSignals>,
        tp: TopicPartition,
        request: SnapshotRequest,
    ) {
        let tables: Vec<String> = request
            .tables
            .iter()
            .map(|(s, t)| format!("{s}.{t}"))
            .collect();
        let why = format!(
            "{tp}: recovering from a gap: the records Kafka deleted are replaced by an incremental snapshot of {} (gap.recovery = \"snapshot\"); rows older than source position {} were removed",
            tables.join(", "),
            request.before
        );
        tracing::warn!("{why}");
        self.recovering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(tp.clone(), why);
        let shared = Arc::clone(self);
        self.handle.spawn(async move {
            loop {
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(FINISHED_POLL) => {}
                }
                match signals.finished(&request).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) if !e.is_retriable() => {
                        return shared.recovery_failed(&tp, &request, &tables, &e)
                    }
                    Err(e) => tracing::warn!(%tp, "cannot tell whether the recovery snapshot is done: {e}"),
                }
            }
            tracing::info!(%tp, tables = %tables.join(", "), "gap recovered: the snapshot is done");
            shared
                .recovering
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&tp);
            let partition = tp.partition.to_string();
            let _ = shared
                .metrics
                .gap_offsets
                .remove_label_values(&[tp.topic.as_str(), partition.as_str()]);
        });
    }
}

impl Shared {
    /// The recovery of `tp` cannot end (capture refused its snapshot): the
    /// removal already ran, so the target misses rows until the tables are
    /// snapshotted. Set aside like a gap, never reported recovered; the
    /// worker goes on applying the stream, so a snapshot taken by hand
    /// after the fix repairs the target.
    fn recovery_failed(
        &self,
        tp: &TopicPartition,
        request: &SnapshotRequest,
        tables: &[String],
        e: &SinkError,
    ) {
        self.recovering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(tp);
        let by_hand: Vec<String> = tables
            .iter()
            .map(|t| format!("`oncely capture snapshot --table {t}`"))
            .collect();
        self.set_aside(
            tp,
            format!(
                "{tp}: the gap recovery failed: {e}. Rows older than source position {} were removed from the target and no snapshot brings back those the source still holds, so the target misses rows (its changes are still applied). Fix: remove capture's reason, then snapshot by hand ({}) and restart the sink once it is done (docs: Operating, gaps)",
                request.before,
                by_hand.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::memory::MemorySink;
    use crate::runner::worker_tests::shared;

    /// A capture that refused the recovery snapshot: `finished` fails for good.
    struct Refused;

    #[async_trait::async_trait]
    impl SnapshotSignals for Refused {
        async fn request(&self, _topic: &str) -> Result<SnapshotRequest, SinkError> {
            Err(SinkError::retriable("not asked in this test"))
        }

        async fn finished(&self, _request: &SnapshotRequest) -> Result<bool, SinkError> {
            Err(SinkError::fatal(
                "capture refused the recovery snapshot: public.t is quarantined",
            ))
        }
    }

    /// A refused recovery is not retried forever, nor reported recovered:
    /// the partition is set aside (so `/readyz` and `oncely status` say
    /// why) and keeps its gap gauge.
    #[tokio::test]
    async fn a_refused_recovery_sets_the_partition_aside() {
        let shared = shared(Arc::new(MemorySink::default()));
        let tp = TopicPartition::new("cdc.public.t", 0);
        shared
            .metrics
            .gap_offsets
            .with_label_values(&["cdc.public.t", "0"])
            .set(5);
        let request = SnapshotRequest {
            database: "d".into(),
            tables: vec![("public".into(), "t".into())],
            before: Version::new(700, 0),
            token: 800,
            signal: "gap-1".into(),
        };
        shared.watch_recovery(Arc::new(Refused), tp.clone(), request);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !shared.is_set_aside(&tp) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the refused recovery never set the partition aside"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        shared.liveness.joined();
        let why = shared.readiness().expect_err("not ready");
        assert!(why.contains("public.t is quarantined"), "{why}");
        assert!(why.contains("oncely capture snapshot"), "{why}");
        assert!(shared.recovering.lock().unwrap().is_empty());
        assert_eq!(
            shared
                .metrics
                .gap_offsets
                .with_label_values(&["cdc.public.t", "0"])
                .get(),
            5
        );
    }

    #[test]
    fn the_removal_is_a_truncate_at_the_snapshot_start() {
        let r = removal(
            41,
            "shop",
            &("public".into(), "t".into()),
            Version::new(700, 0),
        );
        assert_eq!(r.offset, 41);
        let e = r.event().expect("a change");
        assert_eq!(e.op, Op::Truncate);
        assert_eq!((e.schema_name(), e.table()), (Some("public"), Some("t")));
        assert_eq!(e.source.get("db"), Some(&Value::String("shop".into())));
        assert_eq!(e.version, Version::new(700, 0));
        assert!(!e.is_snapshot());
    }
}
