//! The sinks crate's integration tests, one binary: each sink against its
//! real service, the runner against Kafka, and the wire contract's fixtures.
//! Kafka helpers come from the `oncely-testkit` crate.
mod debezium_fixtures;
mod elasticsearch;
mod golden_fixtures;
mod native_iso;
mod postgres;
mod postgres_tls;
mod redis_fence;
mod redis_secure;
mod redis_sink;
mod runner_dedup;
mod runner_kafka;
// Needs the `failpoints` feature (`scripts/test` sets it).
#[cfg(feature = "failpoints")]
mod runner_panic;
