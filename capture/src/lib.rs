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
pub mod pgoutput;
pub mod pipeline;
pub mod replica_identity;
pub mod schema_change;
pub mod secret;
pub mod snapshot;
pub mod source;
pub mod sources;
pub mod value;
