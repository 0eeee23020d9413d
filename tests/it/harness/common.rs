//! Helpers shared by the root package's integration tests: where the services
//! are (from the environment that `scripts/services env` prints), unique names,
//! and restarting a service for fault tests.

use std::path::PathBuf;
use std::process::Command;

/// The value of an environment variable set by `scripts/services env`.
/// Panics with a hint when it is missing: tests never skip silently.
pub fn env_var(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!("{name} is not set: run `eval \"$(scripts/services env)\"` or scripts/test"),
    }
}

/// `postgres://postgres@127.0.0.1:15432/postgres` by default.
pub fn pg_url() -> String {
    env_var("ONCELY_PG_URL")
}

/// `127.0.0.1:19092` by default.
pub fn kafka_brokers() -> String {
    env_var("ONCELY_KAFKA_BROKERS")
}

/// `http://127.0.0.1:19200` by default.
pub fn es_url() -> String {
    env_var("ONCELY_ES_URL")
}

/// `redis://127.0.0.1:16379` by default.
pub fn redis_url() -> String {
    env_var("ONCELY_REDIS_URL")
}

/// The schema registry's Confluent-compatible API,
/// `http://127.0.0.1:18081/apis/ccompat/v7` by default.
pub fn registry_url() -> String {
    env_var("ONCELY_REGISTRY_URL")
}

/// A fresh lower-case name such as `prefix_3f9a0c1b2d4e5f60`, valid as a
/// PostgreSQL identifier, slot name, Kafka topic, Elasticsearch index or key.
pub use oncely_testkit::kafka::unique;

/// Path of `scripts/services` in this checkout.
pub fn services_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/services")
}

/// Restarts one service started by `scripts/services` (`pg`, `kafka`, `es`,
/// `redis` or `mariadb`) and waits until it is ready again. Blocking: call it from
/// `tokio::task::spawn_blocking` in async tests.
pub fn restart_service(name: &str) -> anyhow::Result<()> {
    let status = Command::new(services_script())
        .arg("restart")
        .arg(name)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "scripts/services restart {name} failed ({status}); this test restarts services, so they \
         must have been started by this checkout's scripts/services (run it through scripts/test, \
         or `scripts/services up` from this checkout first)"
    );
    Ok(())
}

/// A local address nothing listens on: one the kernel just handed out
/// (bound once, then released). A random port could be the ephemeral port
/// of any open connection, and a test would then fail on a taken address.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}
