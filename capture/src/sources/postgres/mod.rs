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
