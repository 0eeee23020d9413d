//! Capture against real PostgreSQL and Kafka (`scripts/test` runs this module
//! again on PostgreSQL 17 and 18: `cargo test --test it -- capture::`).
mod config_errors;
mod events;
mod failover_slot;
mod faults;
mod generated_columns;
mod gone_tables;
mod identity;
mod outbox;
mod partitions;
mod replica_identity;
mod snapshot;
mod snapshot_keys;
mod snapshot_rewrite;
mod tls;
mod topics;
