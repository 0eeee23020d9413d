//! oncely-capture: a PostgreSQL database's committed changes into Kafka,
//! exactly once. Events and the source offset that covers them are written
//! in one Kafka transaction; the slot is confirmed only up to what a
//! committed offset record holds. See `pipeline` for the flow.

pub mod config;
pub mod envelope;
pub mod error;
pub mod filter;
pub mod health;
pub mod kafka;
pub mod metrics;
pub mod naming;
pub mod offset;
pub mod outbox;
pub mod pipeline;
pub mod schema_change;
mod seam;
pub mod secret;
pub mod snapshot;
pub mod sources;

// The PostgreSQL modules under their former paths, which the root crate and
// the tests name.
pub use sources::postgres::control as source;
pub use sources::postgres::{pgoutput, replica_identity, value};
