//! PostgreSQL as a source: the pgoutput stream, the control connection
//! (checks, publication, slot, catalog reads), replica identities, the
//! type registry and text values, and snapshot chunk SQL. Everything that
//! speaks PostgreSQL's protocols or catalog lives here; the source-independent
//! core is to reach it only through the seam (docs/design.md, "Architecture:
//! the source seam").

pub mod chunk;
pub mod control;
mod copy;
mod envelope;
mod error;
pub(crate) mod fill;
pub mod filter;
pub mod pgoutput;
mod quarantine;
pub mod replica_identity;
pub(crate) mod schema;
mod signal;
pub(crate) mod start;
pub(crate) mod stream;
pub(crate) mod tables;
pub mod value;

use stream::SourceStream;
use tokio_postgres::Client;

use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::offset::SourceOffset;
use crate::schema_change::SchemaHistory;
use crate::seam::{CheckedSource, Retained, Source, SourceEvent};

/// PostgreSQL as the pipeline's source: the pgoutput stream of the slot,
/// the control connection, COPY chunk reads.
pub(crate) struct Postgres;

impl Source for Postgres {
    type Table = pgoutput::Relation;
    type Stream = SourceStream;
    type Control = Client;
    type Chunks = chunk::PgChunks;
    type Tables<'a> = tables::SourceTables<'a>;

    async fn check(cfg: &CaptureConfig) -> Result<CheckedSource<Self>, CaptureError> {
        start::check_source(cfg).await
    }

    async fn open_stream(
        cfg: &CaptureConfig,
        from: &SourceOffset,
    ) -> Result<SourceStream, CaptureError> {
        stream::connect(cfg, from.flush_lsn).await
    }

    fn warning(cfg: &CaptureConfig) -> Option<String> {
        let control = control::pg_config(cfg, "oncely-capture-control");
        cfg.tls().unverified_credentials(&control)
    }

    fn chunks(cfg: &CaptureConfig, _stream: &SourceStream) -> chunk::PgChunks {
        chunk::PgChunks::new(cfg)
    }

    async fn next_event(stream: &mut SourceStream) -> Result<SourceEvent<Self>, CaptureError> {
        stream::next_event(stream).await
    }

    fn stop(stream: &mut SourceStream) {
        stream.stop();
    }

    fn tables<'a>(
        control: &'a Client,
        history: &'a SchemaHistory,
        xid: Option<u32>,
    ) -> tables::SourceTables<'a> {
        tables::SourceTables::at(control, history, xid)
    }

    async fn heartbeat(
        control: &mut Client,
        _stream: &Self::Stream,
        cfg: &CaptureConfig,
    ) -> Option<Retained> {
        if let Some(query) = &cfg.heartbeat_action_query {
            if let Err(e) = control.batch_execute(query).await {
                tracing::warn!(error = %e, "heartbeat.action.query failed");
            }
        }
        match control::slot_retained_wal(control, &cfg.slot_name).await {
            Ok(bytes) => bytes.map(Retained::SlotWal),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read slot lag");
                None
            }
        }
    }
}
