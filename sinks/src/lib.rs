//! oncely-sinks: the [`Sink`] trait, the Kafka consumer [`Runner`] that feeds it,
//! change-event decoding, and the sinks that ship with oncely.
//!
//! A user implements [`Sink`] (see its contract), builds a [`RunnerConfig`] and
//! calls [`Runner::run_until_signal`]. The `oncely sink --config sink.toml`
//! command does the same for the sinks of [`kinds`].

pub mod config;
pub mod conformance;
pub mod debezium;
pub mod error;
pub mod event;
pub mod fields;
pub mod kinds;
pub mod metrics;
pub mod naming;
pub mod native;
pub mod runner;
pub mod sink;
pub mod verify_reader;

pub use config::{OffsetReset, RunnerConfig};
pub use error::{ConfigError, RecordFailure, RunnerError, SinkError};
pub use event::{ChangeEvent, Op, Payload, Version, VersionOrigin};
pub use runner::Runner;
pub use sink::{Batch, Positions, Record, Sink, TopicPartition};
