//! The databases capture reads, each behind the source seam
//! (docs/design.md, "Architecture: the source seam").

pub mod postgres;

#[cfg(test)]
mod boundary_tests;
