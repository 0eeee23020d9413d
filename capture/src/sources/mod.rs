//! Source databases capture reads from, each behind the source seam.

// The source seam wires it in; until then only its tests use it.
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
pub mod mysql;
