//! oncely-core: the one home of what capture, the sinks and verify share.
//!
//! Today: [`secret`] (values that never print themselves, `${env:..}` and
//! `${file:..}` references, URLs and configuration errors told without the
//! secrets in them). The architecture issue moves the wire contract,
//! identifier quoting, connection setup, backoff and the HTTP listener here.

pub mod secret;

pub use secret::{redact_url, toml_error, Secret, SecretError};
