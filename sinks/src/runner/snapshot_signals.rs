//! What the runner asks of the capture that writes a topic when it recovers
//! a gap by an incremental snapshot (see [`super::gap`]).

use async_trait::async_trait;

use crate::error::SinkError;
use crate::event::Version;

/// A snapshot asked for by a gap recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// The source database (`source.db` of the topic's events: some sinks
    /// name their key sets by it).
    pub database: String,
    /// `(schema, table)` of every source table whose records the topic carries.
    pub tables: Vec<(String, String)>,
    /// A source position read before the signal was inserted: every row the
    /// snapshot publishes and every change streamed after the signal has a
    /// version at or after it.
    pub before: Version,
    /// Opaque to the runner: what [`SnapshotSignals::finished`] needs (e.g.
    /// the source position after the signal's commit).
    pub token: u64,
    /// The id of the signal inserted (empty when none was): capture records
    /// in its offset whether it took it.
    pub signal: String,
}

/// Asks the capture that writes a topic for an incremental snapshot of the
/// topic's tables (through its signal table), and tells when it is done.
/// `oncely sink` builds one from `gap.capture.config`.
#[async_trait]
pub trait SnapshotSignals: Send + Sync + 'static {
    /// Requests the snapshot of `topic`'s tables. Transient errors are
    /// retried; an empty `tables` is refused by the runner.
    async fn request(&self, topic: &str) -> Result<SnapshotRequest, SinkError>;

    /// True once capture has published every snapshot row of `request`.
    /// Transient errors are asked again; a fatal one (capture refused the
    /// snapshot) fails the recovery: the partition is set aside with the
    /// error, never reported recovered.
    async fn finished(&self, request: &SnapshotRequest) -> Result<bool, SinkError>;
}
