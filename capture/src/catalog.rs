//! What other crates read of a capture without running one: its stored
//! offset, the source tables it captures and how their values convert, the
//! snapshot filter check a signal is refused by, the consumer context its
//! Kafka readers use, and the producer settings it sends with (the snapshot
//! benchmark's Kafka floor sends with the same). `verify`, `status` and the
//! signal commands of the `oncely` binary use these, so that they read a
//! capture the way it reads itself.

pub use crate::kafka::{CaptureContext, PRODUCER_SETTINGS};
pub use crate::naming::quote_ident;
pub use crate::offset::{read_stored_offset, SourceOffset};
pub use crate::schema_change::topic as schema_change_topic;
pub use crate::snapshot::signal::check_filter;
pub use crate::sources::postgres::control::{
    captured_tables, connect_with, pg_config, selected_tables, CapturedTable, PUBLISHED_COLUMN,
};
pub use crate::sources::postgres::value::{to_json, IntervalHandlingMode, TypeRegistry, ValueKind};
