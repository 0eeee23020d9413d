//! The databases capture reads, each behind the source seam
//! (docs/design.md, "Architecture: the source seam").

pub(crate) mod postgres;
pub(crate) use postgres::Postgres;

// Parts of it are reached only through the testing facade and verify's
// catalog (re-exports, the snapshot reader until chunk reads use it).
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
pub mod mysql;
pub(crate) use mysql::MySql;

#[cfg(test)]
mod boundary_tests;
