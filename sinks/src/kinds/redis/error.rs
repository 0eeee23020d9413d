//! Redis errors as the runner's three kinds, classified by error kind and
//! server error code — never by message text.
//!
//! | Redis says | kind |
//! | --- | --- |
//! | authentication failed, `NOAUTH`, `NOPERM` (ACL), invalid client config | fatal: retrying cannot fix credentials or a bad URL |
//! | a server certificate refused by TLS verification (`rediss://`) | fatal: retrying cannot fix a certificate or CA file |
//! | `CROSSSLOT`, `MOVED`, `ASK` | fatal: a cluster is not supported (one script touches keys of many slots) |
//! | I/O, timeouts, `LOADING`, `TRYAGAIN`, `READONLY` (fail-over), `OOM`, `BUSY`, anything else | retriable |
//!
//! `NOSCRIPT` never reaches the runner: the sink loads the script and calls again.
//! Per-record failures (`WRONGTYPE` on a row key) are reported by the script
//! itself, not as errors.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::SinkError;

/// Server error codes that mean "this will never work with this configuration".
const FATAL_CODES: &[&str] = &["NOAUTH", "WRONGPASS", "NOPERM"];

/// The runner's view of a Redis error met while doing `context`.
pub fn classify(context: &str, e: RedisError) -> SinkError {
    let message = format!("redis: {context}");
    if is_fatal(&e) {
        SinkError::fatal_from(message, e)
    } else {
        SinkError::retriable_from(message, e)
    }
}

/// True for errors retrying cannot fix (see the module docs).
pub fn is_fatal(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => true,
        ErrorKind::Server(
            ServerErrorKind::NoPerm
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => true,
        _ => {
            e.code().is_some_and(|c| FATAL_CODES.contains(&c))
                || oncely_core::tls::is_certificate_error(e)
        }
    }
}

/// True when the server does not know the script's SHA (after a restart or `SCRIPT FLUSH`).
pub fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
