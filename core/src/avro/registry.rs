//! The schema registry client (placeholder while the codec lands).
