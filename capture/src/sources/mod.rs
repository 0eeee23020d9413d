//! The databases capture reads, each behind the source seam
//! (docs/design.md, "Architecture: the source seam").

pub(crate) mod postgres;
pub(crate) use postgres::Postgres;

// Parts of it (re-exports, the decoder's and envelope's own readers) are
// reached only through the testing facade, which the service tests turn on:
// without the `testing` feature, in the library and its unit tests alike,
// nothing else names them.
#[cfg_attr(not(feature = "testing"), allow(dead_code, unused_imports))]
pub mod mysql;
pub(crate) use mysql::MySql;

#[cfg(test)]
mod boundary_tests;
