//! oncely-core: the one home of what capture, the sinks and verify share.
//!
//! Today: [`secret`] (values that never print themselves, `${env:..}` and
//! `${file:..}` references, URLs and configuration errors told without the
//! secrets in them), [`endpoint`] (the HTTP listener of `/metrics`,
//! `/healthz` and `/readyz`) and [`log_limit`] (rate-limited warnings). The architecture issue moves the wire
//! contract, identifier quoting, connection setup and backoff here.

pub mod endpoint;
pub mod log_limit;
pub mod secret;

pub use secret::{redact_url, toml_error, Secret, SecretError};
