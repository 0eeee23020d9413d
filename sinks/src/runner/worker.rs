//! One partition's worker: collects ordered batches, decodes, applies with retries,
//! dead-letters what can never be applied, and reports the position reached.
//!
//! A worker lives from the assignment of its partition to its revocation (or
//! the runner's stop). It applies one batch at a time, so batches of a
//! partition never overlap; workers of different partitions run concurrently.
//!
//! A worker is two stages: the *decoder* (a task of its own) collects the
//! next batch and decodes its envelopes while the *applier* writes the
//! previous one, handing over through a channel of one batch. The decoder also
//! calls [`Sink::prepare`](crate::Sink::prepare) on the decoded batch, so the
//! sink's own CPU work on it overlaps the previous write too; both run on a
//! blocking thread, keeping the runtime's workers free for the applier's I/O.
//! Decoding is CPU work on this side and applying mostly waits for the target,
//! so overlapping them keeps the target busy. Order is unchanged: batches are applied in the
//! order they were collected, and a decoded batch still holds its records'
//! byte budget until it is applied. On stop, the applier finishes the batch it
//! is writing and drops any batch already decoded behind it (nothing of it is
//! acknowledged, so it is read again).
//!
//! A batch closes when it is full, when `batch.max.ms` has passed since its
//! first record, or as soon as no further record is waiting while the applier
//! is idle: an idle sink gets each change without waiting for the timer, and a
//! busy one gets ever larger batches (group commit), so latency is low at low
//! load and throughput high at high load.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::decoder::{Decoded, Decoder, Incoming, Pending};
use super::dlq::{cap_reason, DeadLetter, MAX_REASON_BYTES};
use super::shared::Shared;
use crate::error::{RecordFailure, SinkError};
use crate::sink::{Batch, TopicPartition};
use oncely_core::backoff::{retry, Backoff, RetryOutcome};

/// Why a batch was not finished.
enum Unfinished {
    /// Stopped while waiting to retry: not acknowledged, so redelivered later.
    Abandoned,
    /// The runner must stop.
    Fatal(SinkError),
    /// Only this partition stops (`SinkError::Quarantined`).
    Quarantined(String),
}

/// Tokens a worker obeys: `stop` = finish the current batch then exit; `abandon` = stop retrying.
pub(crate) struct Control {
    pub stop: CancellationToken,
    pub abandon: CancellationToken,
}

pub(crate) struct Worker {
    shared: Arc<Shared>,
    topic: Arc<str>,
    partition: i32,
    rx: mpsc::Receiver<Incoming>,
    control: Control,
    backoff: Backoff,
}

/// The applying stage of a worker.
struct Applier {
    shared: Arc<Shared>,
    topic: Arc<str>,
    partition: i32,
    control: Control,
    backoff: Backoff,
    pending: Arc<Pending>,
}

impl Worker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        tp: (Arc<str>, i32),
        rx: mpsc::Receiver<Incoming>,
        control: Control,
    ) -> Self {
        let backoff = shared.backoff();
        Self {
            shared,
            topic: tp.0,
            partition: tp.1,
            rx,
            control,
            backoff,
        }
    }

    /// Runs until stopped, abandoned or failed; a fatal error is handed to the runner.
    pub(crate) async fn run(self) {
        let (tx, mut queue) = mpsc::channel(1);
        // The decoder stops with the worker, or when the applier gives up.
        let decoder_stop = self.control.stop.child_token();
        let pending = Arc::new(Pending::default());
        let decoder = Decoder {
            shared: self.shared.clone(),
            topic: self.topic.clone(),
            partition: self.partition,
            rx: self.rx,
            stop: decoder_stop.clone(),
            pending: pending.clone(),
        };
        // A task of its own, so decoding runs in parallel with the applier's
        // own work instead of only while it waits.
        let decoding = tokio::spawn(decoder.run(tx));
        let mut applier = Applier {
            shared: self.shared,
            topic: self.topic,
            partition: self.partition,
            control: self.control,
            backoff: self.backoff,
            pending,
        };
        // A panic while applying (in the sink) must stop the runner, never
        // leave the partition without a worker: caught here, with `queue`
        // still open, so the runner is stopping before the decoder sees the
        // applier gone (and before the poll thread sees the channel closed).
        let applied = AssertUnwindSafe(applier.run(&mut queue))
            .catch_unwind()
            .await;
        let tp = TopicPartition::new(&*applier.topic, applier.partition);
        if let Err(panic) = applied {
            applier
                .shared
                .worker_panicked(&tp, "applying a batch", &*panic);
        }
        decoder_stop.cancel();
        // Ends a decoder blocked on handing over a batch.
        drop(queue);
        if let Err(e) = decoding.await {
            applier
                .shared
                .worker_died(&tp, "collecting or decoding a batch", e);
        }
    }
}

impl Applier {
    /// Applies decoded batches in order until the queue closes, the worker is
    /// stopped, or a batch cannot be finished. The caller drops `queue` after
    /// this returns, which ends a decoder blocked on sending.
    async fn run(&mut self, queue: &mut mpsc::Receiver<Decoded>) {
        let mut freeing: Option<tokio::task::JoinHandle<()>> = None;
        while let Some(mut decoded) = queue.recv().await {
            let next_offset = decoded.batch.next_offset();
            let outcome = self.process(&mut decoded).await;
            self.pending.batches.fetch_sub(1, Ordering::AcqRel);
            self.pending.finished.notify_one();
            // Freeing a batch (its records' decoded JSON, the prepared plan) is
            // thousands of deallocations: on a blocking thread, so that the next
            // batch's write does not wait for it (the target idled meanwhile).
            // Its byte budget is released there too.
            let previous = freeing.replace(tokio::task::spawn_blocking(move || drop(decoded)));
            let flow = self.settle(outcome, next_offset);
            if let Some(previous) = previous {
                let _ = previous.await; // long done: it started a batch ago
            }
            if flow.is_break() {
                break;
            }
        }
        if let Some(last) = freeing {
            let _ = last.await;
        }
    }

    /// Records the progress of a processed batch; `Break` when the applier must stop.
    fn settle(&self, outcome: Result<(), Unfinished>, next_offset: i64) -> ControlFlow<()> {
        match outcome {
            Ok(()) => self
                .shared
                .record_progress(&self.topic, self.partition, next_offset),
            Err(Unfinished::Abandoned) => return ControlFlow::Break(()),
            Err(Unfinished::Fatal(e)) => {
                self.shared.fail(e);
                return ControlFlow::Break(());
            }
            Err(Unfinished::Quarantined(reason)) => {
                let tp = crate::sink::TopicPartition::new(&*self.topic, self.partition);
                self.shared.quarantine(&tp, &reason);
                return ControlFlow::Break(());
            }
        }
        if self.control.stop.is_cancelled() {
            return ControlFlow::Break(()); // a batch decoded behind this one is read again later
        }
        ControlFlow::Continue(())
    }

    /// Dead-letters undecodable records, then applies the rest.
    async fn process(&mut self, decoded: &mut Decoded) -> Result<(), Unfinished> {
        let started = Instant::now();
        for u in &decoded.undecodable {
            let topic = self.topic.clone();
            let letter = DeadLetter {
                topic: &topic,
                partition: self.partition,
                offset: u.offset,
                key: u.key.as_deref(),
                value: u.value.as_deref(),
                reason: &u.error.to_string(),
            };
            self.dead_letter(&letter).await?;
        }
        let batch = &mut decoded.batch;
        self.apply(batch).await?;
        let m = &self.shared.metrics;
        let sink = self.shared.sink.name();
        // What the dedup window skipped counts in `dedup_skipped` only.
        let applied = batch.len().saturating_sub(batch.skipped());
        m.events_applied
            .with_label_values(&[sink, &self.topic])
            .inc_by(applied as u64);
        m.batch_duration
            .with_label_values(&[sink])
            .observe((decoded.decode_time + started.elapsed()).as_secs_f64());
        Ok(())
    }

    /// Applies the batch, retrying transient errors and dead-lettering rejected records.
    async fn apply(&mut self, batch: &mut Batch) -> Result<(), Unfinished> {
        loop {
            let sink = self.shared.sink.clone();
            let metrics = self.shared.metrics.clone();
            let (topic, partition) = (self.topic.clone(), self.partition);
            let attempt = retry(
                &mut self.backoff,
                &self.control.abandon,
                || sink.apply(batch),
                SinkError::is_retriable,
                |e, delay| {
                    metrics.retries.with_label_values(&[sink.name()]).inc();
                    tracing::warn!(%topic, partition, "apply failed, retrying in {delay:?}: {e:#}");
                },
            )
            .await;
            match attempt {
                Ok(()) => return Ok(()),
                Err(RetryOutcome::Cancelled(_)) => return Err(Unfinished::Abandoned),
                Err(RetryOutcome::Failed(SinkError::Rejected(failures))) => {
                    self.dead_letter_rejected(batch, &failures).await?;
                    let offsets: Vec<i64> = failures.iter().map(|f| f.offset).collect();
                    batch.remove_offsets(&offsets);
                }
                Err(RetryOutcome::Failed(SinkError::Quarantined { message })) => {
                    return Err(Unfinished::Quarantined(message))
                }
                Err(RetryOutcome::Failed(e)) => return Err(Unfinished::Fatal(e)),
            }
        }
    }

    async fn dead_letter_rejected(
        &mut self,
        batch: &Batch,
        failures: &[RecordFailure],
    ) -> Result<(), Unfinished> {
        if failures.is_empty() {
            return Err(Unfinished::Fatal(SinkError::fatal(format!(
                "sink `{}` rejected a batch without naming a record",
                self.shared.sink.name()
            ))));
        }
        for f in failures {
            let Some(record) = batch.record_at(f.offset) else {
                return Err(Unfinished::Fatal(SinkError::fatal(format!(
                    "sink `{}` rejected offset {} which is not in the batch",
                    self.shared.sink.name(),
                    f.offset
                ))));
            };
            let topic = self.topic.clone();
            let letter = DeadLetter {
                topic: &topic,
                partition: self.partition,
                offset: f.offset,
                key: record.raw_key(),
                value: record.raw_value(),
                reason: &f.reason,
            };
            self.dead_letter(&letter).await?;
        }
        Ok(())
    }

    /// Writes one dead letter, retrying transient Kafka errors; without a dead-letter
    /// topic the record stops the runner.
    async fn dead_letter(&mut self, letter: &DeadLetter<'_>) -> Result<(), Unfinished> {
        let Some(dlq) = self.shared.dlq.clone() else {
            return Err(Unfinished::Fatal(SinkError::fatal(format!(
                "record {}[{}]@{} cannot be applied ({}) and `errors.deadletterqueue.topic.name` is not set",
                letter.topic,
                letter.partition,
                letter.offset,
                cap_reason(letter.reason, MAX_REASON_BYTES)
            ))));
        };
        // Per record, so rate-limited; every one is in the topic and the metric.
        static DEAD_LETTERING: oncely_core::log_limit::LogLimit =
            oncely_core::log_limit::LogLimit::new(Duration::from_secs(10), 10);
        if let Some(suppressed) = DEAD_LETTERING.admit() {
            tracing::warn!(
                topic = letter.topic,
                partition = letter.partition,
                offset = letter.offset,
                suppressed,
                "dead-lettering record (at most 10 such lines per 10 s; `suppressed` counts those not logged): {}",
                // A reason can quote a whole value: the log gets what the header gets.
                cap_reason(letter.reason, MAX_REASON_BYTES)
            );
        }
        let attempt = retry(
            &mut self.backoff,
            &self.control.abandon,
            || dlq.send(letter),
            SinkError::is_retriable,
            |e, delay| tracing::warn!("dead-letter write failed, retrying in {delay:?}: {e:#}"),
        )
        .await;
        match attempt {
            Ok(()) => {
                self.shared
                    .metrics
                    .dead_letters
                    .with_label_values(&[letter.topic])
                    .inc();
                Ok(())
            }
            Err(RetryOutcome::Cancelled(_)) => Err(Unfinished::Abandoned),
            Err(RetryOutcome::Failed(e)) => Err(Unfinished::Fatal(e)),
        }
    }
}
