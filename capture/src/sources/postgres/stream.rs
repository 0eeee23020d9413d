//! The replication stream: pgoutput from the slot, from a position Kafka
//! holds, confirmed only up to what Kafka holds; on a server without
//! publication row filters, filtered by capture (`filter.rs`).

use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};

use super::filter::StreamFilter;
use super::pgoutput::{self, LogicalMessage, Relation, TypeMessage};
use crate::change::StreamEvent;
use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::seam::Slot;

/// The replication stream, and the row filters capture applies to it
/// where the publication cannot.
pub(crate) struct SourceStream {
    client: ReplicationClient,
    filter: Option<StreamFilter>,
}

impl SourceStream {
    /// The next event (cancel-safe).
    pub(crate) async fn recv(&mut self) -> Result<Option<ReplicationEvent>, CaptureError> {
        match &mut self.filter {
            None => Ok(self.client.recv().await?),
            Some(filter) => filter.recv(&mut self.client).await,
        }
    }

    /// Ends the stream (CopyDone).
    pub(crate) fn stop(&self) {
        self.client.stop();
    }
}

/// Opens the stream at `from`, which a committed offset record names.
pub(crate) async fn connect(cfg: &CaptureConfig, from: u64) -> Result<SourceStream, CaptureError> {
    let filter = StreamFilter::open(cfg).await?;
    let repl = ReplicationConfig::new(
        cfg.database_hostname.clone(),
        cfg.database_user.clone(),
        cfg.database_password.expose().to_string(),
        cfg.database_dbname.clone(),
        cfg.slot_name.clone(),
        cfg.publication_name.clone(),
    )
    .with_port(cfg.port())
    // `database.sslmode` and its files, as every other connection to the source.
    .with_tls(cfg.tls().replication(&cfg.database_hostname))
    .with_start_lsn(Lsn::from_u64(from))
    // Until we confirm more, report only what Kafka already holds.
    .with_ack_lsn(Lsn::from_u64(from))
    .with_status_interval(Duration::from_millis(
        crate::config::DEFAULT_STATUS_INTERVAL_MS,
    ))
    // Text values render the same on every server: UTC, ISO dates, full float precision.
    .with_options(
        "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3",
    )
    .with_application_name(format!("oncely-{}", cfg.connector_name()));
    let mut client = ReplicationClient::connect(repl).await?;
    client.wait_started().await?;
    Ok(SourceStream { client, filter })
}

/// The slot releases WAL only up to what a committed offset record holds.
impl Slot for SourceStream {
    fn confirm(&mut self, flush_lsn: u64) {
        self.client.update_applied_lsn(Lsn::from_u64(flush_lsn));
    }
}

/// The stream's next event as the core reads it: pgoutput decoded, its
/// rows moved into the event (none copied).
pub(crate) async fn next_event(
    stream: &mut SourceStream,
) -> Result<StreamEvent<Relation, TypeMessage>, CaptureError> {
    match stream.recv().await? {
        Some(event) => stream_event(event),
        None => Err(CaptureError::from(pgwire_replication::PgWireError::Task(
            "replication stream ended".into(),
        ))),
    }
}

/// One replication event as the core's stream event.
fn stream_event(
    event: ReplicationEvent,
) -> Result<StreamEvent<Relation, TypeMessage>, CaptureError> {
    Ok(match event {
        ReplicationEvent::Begin {
            final_lsn,
            xid,
            commit_time_micros,
        } => StreamEvent::Begin {
            commit: final_lsn.as_u64(),
            xid,
            commit_ts_us: commit_time_micros,
        },
        ReplicationEvent::Commit { lsn, end_lsn, .. } => StreamEvent::Commit {
            commit: lsn.as_u64(),
            end: end_lsn.as_u64(),
        },
        ReplicationEvent::XLogData {
            wal_start, data, ..
        } => pgoutput::decode(data)
            .map_err(|e| CaptureError::Protocol(e.to_string()))?
            .into_event(wal_start.as_u64()),
        ReplicationEvent::Message {
            transactional,
            lsn,
            prefix,
            content,
        } => LogicalMessage::Message {
            transactional,
            lsn: lsn.as_u64(),
            prefix,
            content,
        }
        .into_event(lsn.as_u64()),
        ReplicationEvent::KeepAlive { wal_end, .. } => StreamEvent::KeepAlive {
            position: wal_end.as_u64(),
        },
        ReplicationEvent::StoppedAt { .. } => StreamEvent::Nothing,
    })
}
