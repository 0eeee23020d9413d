//! Internals the root crate's service tests drive directly (catalog reads at
//! a transaction id, chunk reads, stray offset records), compiled only with
//! the `testing` feature, which only the root crate's dev-dependency turns
//! on. These tests need a database and the test harness of `tests/it`, so
//! they cannot be unit tests here; nothing else may use this module.

pub use crate::filter::TableFilter;
pub use crate::naming::sanitize_topic;
pub use crate::offset::{read_last_offset, SourceOffset};
pub use crate::schema_change::ColumnDef;
pub use crate::snapshot::{chunk_query, KeyColumn};
/// The MySQL/MariaDB source's parts, which the source seam has not wired in
/// yet: its service tests read a real server's binlog through them.
pub use crate::sources::mysql;
pub use crate::sources::postgres::chunk;
pub use crate::sources::postgres::control::{partition_root, relation_by_oid};
pub use crate::sources::postgres::pgoutput::{Column, Relation, ReplicaIdentity, TupleValue};
pub use crate::sources::postgres::schema::identity;
pub use crate::sources::postgres::value::PgTypeKind;
