//! oncely-capture: a PostgreSQL database's committed changes into Kafka,
//! exactly once. Events and the source offset that covers them are written
//! in one Kafka transaction; the slot is confirmed only up to what a
//! committed offset record holds. See `pipeline` for the flow.
//!
//! The public surface is [`run`], its [`config`], [`metrics`], [`health`],
//! [`error`], and the [`catalog`] the root crate's `verify`, `status` and
//! signal commands read; everything else is private to the crate, so the
//! compiler reports what nothing uses.

pub(crate) mod avro;
pub mod catalog;
pub(crate) mod change;
pub mod config;
pub(crate) mod envelope;
pub mod error;
pub(crate) mod filter;
#[cfg(test)]
mod function_length_tests;
pub mod health;
pub(crate) mod json;
pub(crate) mod kafka;
pub mod metrics;
pub(crate) mod naming;
pub(crate) mod offset;
pub(crate) mod outbox;
pub(crate) mod pipeline;
pub(crate) mod schema_change;
mod seam;
pub(crate) mod secret;
pub(crate) mod snapshot;
pub(crate) mod sources;
#[cfg(feature = "testing")]
pub mod testing;

pub use pipeline::run;
