//! PostgreSQL's answers to the quarantine's checks ([`QuarantineChecks`]),
//! read on the control connection: the tables the filters select, their
//! replica identities, the publication and the server's WAL end.

use tokio_postgres::Client;

use super::{control, replica_identity};
use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::seam::{CapturedTable, QuarantineChecks, Selected};

impl QuarantineChecks for Client {
    async fn selected(&mut self, cfg: &CaptureConfig) -> Result<Selected, CaptureError> {
        control::selected_tables(self, cfg).await
    }

    fn keyless_reason(&self, table: &str) -> String {
        control::keyless_reason(table, table)
    }

    async fn identity_problem(
        &mut self,
        table: &CapturedTable,
    ) -> Result<Option<String>, CaptureError> {
        let problems = replica_identity::problems(self, &[table]).await?;
        Ok(problems
            .into_iter()
            .next()
            .map(|(_, why)| replica_identity::quarantine_reason(&why)))
    }

    async fn publish(
        &mut self,
        cfg: &CaptureConfig,
        table: &CapturedTable,
    ) -> Result<(), CaptureError> {
        control::ensure_publication(self, cfg, std::slice::from_ref(table)).await
    }

    async fn position_now(&mut self) -> Result<u64, CaptureError> {
        control::current_wal_lsn(self).await
    }
}
