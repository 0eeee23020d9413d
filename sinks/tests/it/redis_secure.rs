//! The `redis` sink with AUTH and TLS against a real `redis-server` that this
//! test starts on spare ports (its own process and data directory, never the
//! shared Redis): a plain port requiring the default user's password, and a
//! TLS port with a certificate of a CA made here (`oncely_testkit::tls`), plus an ACL user.
//! Passwords come from `${env:..}` and `${file:..}` references.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_core::Secret;
use oncely_sinks::event::decode_value;
use oncely_sinks::kinds::redis::{RedisConfig, RedisSink};
use oncely_sinks::{Batch, Record, Sink, SinkError};
use oncely_testkit::kafka::unique;
use oncely_testkit::tls;
use serde_json::json;

const DEFAULT_PASSWORD: &str = "default-secret-0f3a";
const ACL_USER: &str = "oncely";
const ACL_PASSWORD: &str = "acl-secret-77c1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A redis-server of this test; killed and its directory removed on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    plain: u16,
    tls: u16,
}

impl Server {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(unique("oncely_redis_secure"));
        std::fs::create_dir_all(&dir).expect("dir");
        tls::server_certs(&dir).expect("test certificates");
        let (plain, tls) = (free_port(), free_port());
        let acl = format!("user {ACL_USER} on >{ACL_PASSWORD} ~* &* +@all");
        let child = Command::new("redis-server")
            .current_dir(&dir)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--port", &plain.to_string(), "--tls-port", &tls.to_string()])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
            .args(["--requirepass", DEFAULT_PASSWORD])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (Debian's redis-server, built with TLS)");
        let server = Self {
            child,
            dir,
            plain,
            tls,
        };
        server.add_acl_user(&acl);
        server
    }

    /// Waits for the plain port, then creates the ACL user.
    fn add_acl_user(&self, acl: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = format!("redis://:{DEFAULT_PASSWORD}@127.0.0.1:{}", self.plain);
        loop {
            let attempt = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| {
                    let mut cmd = redis::cmd("ACL");
                    cmd.arg("SETUSER");
                    for part in acl.split(' ').skip(1) {
                        cmd.arg(part);
                    }
                    cmd.query::<()>(&mut c)
                });
            match attempt {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis-server not ready: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(url: String) -> RedisConfig {
    let mut c = RedisConfig::new(url);
    c.reconnect_retries = 0;
    c.connect_timeout_ms = 3_000;
    c
}

fn batch() -> Batch {
    let value = json!({"before": null, "op": "c", "after": {"id": 1, "note": "secured"},
        "source": {"schema": "public", "table": "t", "commit_lsn": 10, "event_seq": 0}});
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("envelope");
    let record = Record::new(0, Some(json!({"id": 1})), payload);
    Batch::new(Arc::from("g"), (Arc::from("topic"), 0), vec![record], 1)
}

/// Connects, applies one row, and reads it back through `check` (a client of the same server).
async fn applies(cfg: &RedisConfig, check: &redis::Client) {
    cfg.validate().expect("valid config");
    let sink = RedisSink::connect(cfg).await.expect("connect");
    sink.apply(&batch()).await.expect("apply");
    let mut conn = check
        .get_multiplexed_async_connection()
        .await
        .expect("check connection");
    let note: Option<String> = redis::cmd("HGET")
        .arg("t:1")
        .arg("note")
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(note.as_deref(), Some("secured"));
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .expect("FLUSHALL");
}

fn fatal(result: Result<RedisSink, SinkError>, what: &str) {
    match result {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => assert!(e.is_fatal(), "{what}: not fatal: {e:?}"),
    }
}

#[tokio::test]
async fn auth_with_secrets_and_tls_with_a_ca_file() {
    let server = Server::start();
    let plain_check = redis::Client::open(format!(
        "redis://:{DEFAULT_PASSWORD}@127.0.0.1:{}",
        server.plain
    ))
    .expect("check client");

    // AUTH as the default user, the password from a file.
    let secret_file = server.dir.join("password");
    std::fs::write(&secret_file, format!("{DEFAULT_PASSWORD}\n")).expect("secret file");
    let mut cfg = config(format!("redis://127.0.0.1:{}", server.plain));
    // A configuration file's reference is resolved when it is read; here, by hand.
    let from_file = Secret::new(format!("${{file:{}}}", secret_file.display()));
    cfg.password = Some(from_file.resolve().expect("secret file"));
    assert!(!format!("{cfg:?}").contains(DEFAULT_PASSWORD));
    applies(&cfg, &plain_check).await;

    // No password, a wrong password, a wrong ACL user: fatal.
    fatal(
        RedisSink::connect(&config(format!("redis://127.0.0.1:{}", server.plain))).await,
        "no password",
    );
    cfg.password = Some(Secret::new("wrong"));
    fatal(RedisSink::connect(&cfg).await, "wrong password");

    // TLS (the plain check client cannot tell: the row must arrive all the same),
    // as the ACL user, the password from the environment.
    let var = unique("ONCELY_TEST_REDIS_PASSWORD").to_uppercase();
    std::env::set_var(&var, ACL_PASSWORD);
    let ca = server.dir.join("ca.crt").display().to_string();
    for host in ["127.0.0.1", "localhost"] {
        let mut cfg = config(format!("rediss://{host}:{}", server.tls));
        cfg.tls_ca_file = Some(ca.clone());
        cfg.username = Some(ACL_USER.into());
        let from_env = Secret::new(format!("${{env:{var}}}"));
        cfg.password = Some(from_env.resolve().expect("variable set"));
        applies(&cfg, &plain_check).await;
    }
    // The TLS port speaks only TLS: a plain client there gets no answer.
    let mut plain_on_tls = config(format!("redis://127.0.0.1:{}", server.tls));
    plain_on_tls.password = Some(Secret::new(DEFAULT_PASSWORD));
    plain_on_tls.response_timeout_ms = 1_000;
    assert!(RedisSink::connect(&plain_on_tls).await.is_err());

    // A CA that did not sign the server's certificate: refused, fatal.
    let other = tls::unrelated_ca(&server.dir).expect("another CA");
    let mut cfg = config(format!("rediss://127.0.0.1:{}", server.tls));
    cfg.tls_ca_file = Some(other.display().to_string());
    cfg.password = Some(Secret::new(DEFAULT_PASSWORD));
    fatal(RedisSink::connect(&cfg).await, "unknown CA");
    std::env::remove_var(&var);
}
