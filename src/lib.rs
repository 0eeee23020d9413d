//! oncely: every committed PostgreSQL change, through Kafka, into the stores that mirror it,
//! exactly once in effect. This facade re-exports the three crates, and holds
//! [`verify`], the comparison of the source with every target behind `oncely verify`,
//! and [`status`], the health of a pipeline behind `oncely status`.
pub use oncely_capture as capture;
pub use oncely_dedup as dedup;
pub use oncely_sinks as sinks;

pub mod status;
pub mod verify;
