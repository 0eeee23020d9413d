//! What other crates read of a capture without running one: its stored
//! offset, the source tables it captures and how their values convert, the
//! snapshot filter check a signal is refused by, the consumer context its
//! Kafka readers use, and the producer settings it sends with (the snapshot
//! benchmark's Kafka floor sends with the same), and the column policy
//! (which columns are published, masked how). `verify`, `status` and the
//! signal commands of the `oncely` binary use these, so that they read a
//! capture the way it reads itself.

pub use crate::envelope::{checked_action, Characters, ColumnAction, ColumnPolicy, Mask};
pub use crate::kafka::{CaptureContext, PRODUCER_SETTINGS};
pub use crate::naming::quote_ident;
pub use crate::offset::{read_stored_offset, SourceOffset};
pub use crate::schema_change::topic as schema_change_topic;
pub use crate::snapshot::signal::check_filter;
pub use crate::sources::postgres::chunk::FILTER_SEARCH_PATH;
pub use crate::sources::postgres::control::{
    captured_tables, connect_with, pg_config, selected_tables, CapturedTable, PUBLISHED_COLUMN,
};
pub use crate::sources::postgres::value::{to_json, IntervalHandlingMode, TypeRegistry, ValueKind};

/// The MySQL/MariaDB source's reads (`source = "mysql"`): its catalog and
/// key-ordered chunk reads, its cells and Debezium's MySQL type mapping,
/// and the offset record's MySQL part with the server's binlog state it is
/// checked against (`oncely status`).
pub mod mysql {
    pub use crate::sources::mysql::filter::check as check_filter_on;
    pub use crate::sources::mysql::mapping::{field_schema, to_json, MappingConfig};
    pub use crate::sources::mysql::{
        binlog_bytes_between, BinlogCoordinates, Cell, ColumnShape, Flavor, MySqlCatalog,
        MySqlOffset, MySqlSourceError, Position, Resume, ServerFacts, ServerIdentity,
        SnapshotReader, TableShape,
    };
}
