//! The whole pipeline as processes: capture, the three sinks, verify.
mod avro;
mod avro_ops;
mod compaction;
mod faults;
mod fields;
pub(crate) mod gap;
mod identity;
mod identity_change;
mod masking;
mod propagate;
mod row_filter;
mod scale_out;
mod snapshot_toast;
mod truncate;
mod two_captures;
mod type_change;
mod type_generation;
