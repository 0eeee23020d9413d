//! The databases capture reads, each behind the source seam
//! (docs/design.md, "Architecture: the source seam").

pub(crate) mod postgres;
pub(crate) use postgres::Postgres;

// The source seam wires it in; until then only its tests use it.
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
pub mod mysql;

#[cfg(test)]
mod boundary_tests;
