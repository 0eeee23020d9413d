//! The MySQL source's snapshot chunk reads ([`ChunkReads`]). Not built in
//! this build: every chunk is refused with the reason and the setting that
//! avoids snapshots, so a snapshot is never skipped silently.

use super::stream::MySqlTable;
use crate::error::CaptureError;
use crate::seam::{ChunkReads, ChunkRequest, ChunkTask};

/// What a snapshot of a MySQL source needs and this build lacks.
pub const NOT_BUILT: &str =
    "MySQL snapshot reads are not built in this build; use snapshot.mode = \"no_data\"";

/// The chunk reads of a MySQL source's snapshots.
#[derive(Debug, Default)]
pub struct MySqlChunks;

impl ChunkReads for MySqlChunks {
    type Table = MySqlTable;

    async fn start(&mut self, _req: ChunkRequest) -> Result<ChunkTask<MySqlTable>, CaptureError> {
        Err(CaptureError::Prerequisite(NOT_BUILT.into()))
    }
}
