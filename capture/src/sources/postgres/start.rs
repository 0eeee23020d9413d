//! PostgreSQL's start-up checks: the database can be captured
//! (`wal_level`, the tables the filters select, the outbox and signal
//! tables), the publication and the slot exist, user types are loaded, and
//! the tables that cannot be captured as they are are set aside.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::value::TypeRegistry;
use super::{control, replica_identity};
use crate::config::{CaptureConfig, ReplicaIdentityCheck};
use crate::error::CaptureError;
use crate::seam::CheckedSource;

/// Checks the database can be captured, ensures the publication and the
/// slot, loads user types, and sets aside what cannot be captured as it is.
/// The stream resumes no earlier than the slot's confirmed position.
pub(crate) async fn check_source(
    cfg: &CaptureConfig,
) -> Result<CheckedSource<super::Postgres>, CaptureError> {
    let control = control::connect(cfg).await?;
    control::check_wal_level(&control).await?;
    let control::Selected { tables, keyless } = control::selected_tables(&control, cfg).await?;
    if let Some(outbox) = &cfg.outbox {
        if !tables.iter().any(|t| t.qualified() == outbox.table) {
            return Err(CaptureError::Prerequisite(format!(
                "outbox.table {} is not among the captured tables: create it (with a primary key) and make table.include.list match it",
                outbox.table
            )));
        }
    }
    let mut published = tables.clone();
    if let Some(signal) = cfg.signal_table() {
        published.push(control::signal_table(&control, signal).await?);
    }
    control::ensure_publication(&control, cfg, &published).await?;
    let set_aside = set_aside_at_start(cfg, &control, &tables, &keyless).await?;
    let slot = control::ensure_slot(&control, cfg).await?;
    let mut types = TypeRegistry::builtin().with_interval_mode(cfg.interval_handling_mode);
    types
        .load_user_types(&control)
        .await
        .map_err(CaptureError::pg("load user types"))?;
    Ok(CheckedSource {
        control,
        tables,
        set_aside,
        // The slot is both where a fresh start streams from and the
        // earliest position it can still give.
        start_at: slot.confirmed_flush_lsn,
        earliest: slot.confirmed_flush_lsn,
        types,
    })
}

/// Tables that cannot be captured as they are: set aside (quarantined),
/// never a stop of the others (see `pipeline::quarantine`): keyless tables,
/// and those whose replica identity lacks the key under
/// `replica.identity.check = "fail"`.
async fn set_aside_at_start(
    cfg: &CaptureConfig,
    control: &Client,
    tables: &[control::CapturedTable],
    keyless: &[String],
) -> Result<BTreeMap<String, String>, CaptureError> {
    // The outbox publishes only inserts: its old rows never matter.
    let checked: Vec<&control::CapturedTable> = tables
        .iter()
        .filter(|t| cfg.outbox.as_ref().is_none_or(|o| o.table != t.qualified()))
        .collect();
    let mut set_aside: BTreeMap<String, String> = keyless
        .iter()
        .map(|t| (t.clone(), control::keyless_reason(t, t)))
        .collect();
    for (table, why) in replica_identity::problems(control, &checked).await? {
        match cfg.replica_identity_check {
            ReplicaIdentityCheck::Fail => {
                set_aside
                    .entry(table)
                    .or_insert_with(|| replica_identity::quarantine_reason(&why));
            }
            ReplicaIdentityCheck::Warn => {
                tracing::warn!("{why} (replica.identity.check = \"warn\": capturing it anyway)")
            }
        }
    }
    Ok(set_aside)
}
