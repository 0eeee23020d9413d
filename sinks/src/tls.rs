//! TLS client settings: one definition for capture, the sinks and verify, in `oncely-core`.

pub use oncely_core::tls::*;
