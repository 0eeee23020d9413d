//! State shared by the poll thread and the partition workers, and the topic filter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::dlq::DeadLetters;
use crate::config::RunnerConfig;
use crate::error::{RunnerError, SinkError};
use crate::metrics::Metrics;
use crate::retry::Backoff;
use crate::sink::{Sink, TopicPartition};

/// Decides which topics are skipped: heartbeats, the capture offsets topic, the dead-letter topic.
pub(crate) struct TopicFilter {
    heartbeat_prefix: String,
    patterns: Vec<regex::Regex>,
    dlq: Option<String>,
}

impl TopicFilter {
    pub(crate) fn new(config: &RunnerConfig) -> Result<Self, RunnerError> {
        let patterns = config
            .ignore_topics
            .iter()
            .enumerate()
            .map(|(i, p)| {
                regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                    RunnerError::Config(crate::ConfigError::new(
                        format!("ignore.topics[{i}]"),
                        e.to_string(),
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            heartbeat_prefix: config.heartbeat_prefix.clone(),
            patterns,
            dlq: config.dlq_topic.clone(),
        })
    }

    /// True when records of `topic` are skipped (never reach the sink).
    pub(crate) fn is_ignored(&self, topic: &str) -> bool {
        (!self.heartbeat_prefix.is_empty() && topic.starts_with(&self.heartbeat_prefix))
            || self.dlq.as_deref() == Some(topic)
            || self.patterns.iter().any(|p| p.is_match(topic))
    }
}

/// State shared by the poll thread and the partition workers.
pub(crate) struct Shared {
    pub(crate) config: RunnerConfig,
    pub(crate) group: Arc<str>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) metrics: Metrics,
    pub(crate) dlq: Option<Arc<DeadLetters>>,
    pub(crate) handle: Handle,
    pub(crate) filter: TopicFilter,
    /// Runner-wide stop: the caller's token, or a fatal error.
    pub(crate) stop: CancellationToken,
    pub(crate) budget: Arc<Semaphore>,
    pub(crate) budget_total: u32,
    pub(crate) fatal: Mutex<Option<SinkError>>,
    /// Per partition: the next offset after the last applied record, and whether it still needs a commit.
    pub(crate) positions: Mutex<HashMap<TopicPartition, (i64, bool)>>,
}

impl Shared {
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.config.retry_backoff_ms),
            Duration::from_millis(self.config.retry_backoff_max_ms),
        )
    }

    /// Records that everything before `next_offset` is applied (or skipped).
    pub(crate) fn record_progress(&self, topic: &str, partition: i32, next_offset: i64) {
        let mut positions = self
            .positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        positions.insert(TopicPartition::new(topic, partition), (next_offset, true));
    }

    /// Positions not yet committed, marked as committed.
    pub(crate) fn dirty_positions(&self) -> HashMap<TopicPartition, i64> {
        let mut positions = self
            .positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        positions
            .iter_mut()
            .filter(|(_, (_, dirty))| *dirty)
            .map(|(tp, (offset, dirty))| {
                *dirty = false;
                (tp.clone(), *offset)
            })
            .collect()
    }

    /// Removes and returns the positions of `tps` (on revocation and shutdown).
    pub(crate) fn take_positions(&self, tps: &[TopicPartition]) -> HashMap<TopicPartition, i64> {
        let mut positions = self
            .positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tps.iter()
            .filter_map(|tp| positions.remove(tp).map(|(offset, _)| (tp.clone(), offset)))
            .collect()
    }

    /// Stops the runner because of `e`; the first fatal error wins.
    pub(crate) fn fail(&self, e: SinkError) {
        tracing::error!("stopping: {e:#}");
        let mut fatal = self.fatal.lock().unwrap_or_else(PoisonError::into_inner);
        fatal.get_or_insert(e);
        self.stop.cancel();
    }

    pub(crate) fn take_fatal(&self) -> Option<SinkError> {
        self.fatal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_offsets_dlq_and_configured_topics_are_ignored() {
        let mut config = RunnerConfig::new("k:9092", "g", vec!["cdc.public.t".into()]);
        config.dlq_topic = Some("dead".into());
        config.ignore_topics.push("audit\\..*".into());
        let filter = TopicFilter::new(&config).expect("valid");
        assert!(filter.is_ignored("__debezium-heartbeat.cdc"));
        assert!(filter.is_ignored("oncely-offsets"));
        assert!(filter.is_ignored("oncely-offsets-shop"));
        assert!(filter.is_ignored("dead"));
        assert!(filter.is_ignored("audit.log"));
        assert!(!filter.is_ignored("cdc.public.t"));
        assert!(
            !filter.is_ignored("xoncely-offsets-2"),
            "patterns match whole names"
        );
        assert!(!filter.is_ignored("xaudit.log"));
    }
}
