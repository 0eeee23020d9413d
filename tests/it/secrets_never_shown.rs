//! Secrets never shown (docs/design.md, "Threat model"): every way a start can fail with a
//! password or API key in its configuration — a TOML error on the line that
//! holds it, a URL with user info, unreachable or refusing servers, `verify`
//! over such configs — is run as the real binary with debug logs, and its
//! whole output is searched for the secret. Each case also checks the output
//! still says what is wrong, so a silent process cannot pass.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::harness::capture;
use crate::harness::common;

/// The secret of every case; no other text of the test or the tools contains it.
const SECRET: &str = "Sup3rS3cretValue";

struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(common::unique(&format!("secrets_{name}")));
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// Runs `oncely args` for at most `limit` (then kills it) and returns its
    /// stdout and stderr, asserting neither holds the secret and the output
    /// contains every one of `expect`.
    fn run(&self, args: &[&str], limit: Duration, expect: &[&str]) -> Result<String> {
        let out = self.dir.join("out.log");
        let file = std::fs::File::create(&out)?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(args)
            .env("RUST_LOG", "debug")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("spawn oncely")?;
        let deadline = Instant::now() + limit;
        while child.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read_to_string(&out)?;
        if text.contains(SECRET) {
            let line = text.lines().find(|l| l.contains(SECRET)).unwrap_or("");
            bail!("`oncely {}` showed the secret:\n{line}", args.join(" "));
        }
        for e in expect {
            if !text.contains(e) {
                bail!(
                    "`oncely {}` did not say {e:?}:\n{}",
                    args.join(" "),
                    tail(&text)
                );
            }
        }
        Ok(text)
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A capture config for the test server (nothing here gets as far as
/// reading a table), publishing to `brokers`, with `extra` appended.
fn capture_config(brokers: &str, extra: &str) -> String {
    let (host, port) = url_parts(&common::pg_url());
    format!(
        "name = \"secrets\"\ntopic.prefix = \"secrets\"\n\
         database.hostname = \"{host}\"\ndatabase.port = {port}\ndatabase.user = \"postgres\"\n\
         database.dbname = \"postgres\"\nkafka.bootstrap.servers = \"{brokers}\"\n{extra}"
    )
}

/// Host and port of a `postgres://user@host:port/db` URL.
fn url_parts(url: &str) -> (String, u16) {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or(rest);
    let hostport = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "5432"));
    (host.to_owned(), port.parse().unwrap_or(5432))
}

fn runner_head(group: &str, kafka_extra: &str) -> String {
    format!(
        "bootstrap.servers = \"{}\"\ngroup.id = \"{group}\"\ntopics = [\"secrets.public.t\"]\n\
         [kafka]\n{kafka_extra}",
        common::kafka_brokers()
    )
}

#[test]
fn a_toml_error_on_the_password_line_does_not_quote_it() -> Result<()> {
    let case = Case::new("toml")?;
    let capture = case.file(
        "capture.toml",
        &capture_config(
            &common::kafka_brokers(),
            &format!("database.password = \"{SECRET}\" trailing\n"),
        ),
    )?;
    case.run(
        &["capture", "--config", path(&capture)],
        Duration::from_secs(20),
        &["line 8, column", "capture.toml"],
    )?;
    let sink = case.file(
        "sink.toml",
        &format!(
            "{}[sink]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\npassword = \"{SECRET}\" x\n",
            runner_head("secrets-toml", "")
        ),
    )?;
    case.run(
        &["sink", "--config", path(&sink)],
        Duration::from_secs(20),
        &["not valid TOML", "line"],
    )?;
    // verify reads both files: each error must stay as safe there.
    case.run(
        &[
            "verify",
            "--capture",
            path(&capture),
            "--sink",
            path(&sink),
            "--no-wait",
        ],
        Duration::from_secs(20),
        &["line 8, column"],
    )?;
    Ok(())
}

#[test]
fn urls_with_user_info_are_shown_without_the_password() -> Result<()> {
    let case = Case::new("urls")?;
    // Nothing listens on port 1: each sink fails to connect, saying where.
    let targets = [
        (
            "elasticsearch",
            format!("url = \"http://elastic:{SECRET}@127.0.0.1:1\"\n"),
            "127.0.0.1:1",
        ),
        (
            "postgres",
            format!("url = \"postgres://writer:{SECRET}@127.0.0.1:1/wh\"\n"),
            "127.0.0.1",
        ),
        (
            "redis",
            format!("url = \"redis://:{SECRET}@127.0.0.1:1\"\n"),
            "127.0.0.1",
        ),
    ];
    let capture = case.file(
        "capture.toml",
        &capture_config(
            &common::kafka_brokers(),
            &format!("database.password = \"{SECRET}\"\n"),
        ),
    )?;
    for (kind, url, place) in targets {
        let sink = case.file(
            &format!("sink-{kind}.toml"),
            &format!(
                "{}[sink]\nkind = \"{kind}\"\n{url}",
                runner_head(&common::unique("secrets-url"), "")
            ),
        )?;
        case.run(
            &["sink", "--config", path(&sink)],
            Duration::from_secs(25),
            &[place],
        )?;
        case.run(
            &[
                "verify",
                "--capture",
                path(&capture),
                "--sink",
                path(&sink),
                "--no-wait",
            ],
            Duration::from_secs(25),
            &[place],
        )?;
    }
    Ok(())
}

/// A Slack-style webhook keeps its secret in the URL's path and query: the
/// http sink's failing requests (nothing listens on port 1) name the host,
/// never the path, in every log line and error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_url_is_shown_without_its_path() -> Result<()> {
    use oncely_testkit::kafka::{create_topic, envelope, key, produce, Out};
    let case = Case::new("webhook")?;
    let topic = common::unique("secrets_webhook");
    create_topic(&topic, 1).await;
    let record = Out {
        key: Some(key(1)),
        value: Some(envelope(1, 100, 0, 1)),
        partition: Some(0),
    };
    produce(&topic, &[record]).await;
    let sink = case.file(
        "sink.toml",
        &format!(
            "bootstrap.servers = \"{}\"\ngroup.id = \"{}\"\ntopics = [\"{topic}\"]\n\
             [sink]\nkind = \"http\"\n\
             url = \"http://127.0.0.1:1/services/T000/B000/{SECRET}?token={SECRET}\"\n",
            common::kafka_brokers(),
            common::unique("secrets-webhook")
        ),
    )?;
    case.run(
        &["sink", "--config", path(&sink)],
        Duration::from_secs(25),
        &["http://127.0.0.1:1/***", "request failed"],
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_reported_without_them() -> Result<()> {
    let case = Case::new("auth")?;
    // The SASL listener of the test services refuses this password.
    let Ok(brokers) = std::env::var("ONCELY_KAFKA_SASL_BROKERS") else {
        bail!("ONCELY_KAFKA_SASL_BROKERS is not set: run `eval \"$(scripts/services env)\"`");
    };
    let user = std::env::var("ONCELY_KAFKA_SASL_USERNAME").unwrap_or_else(|_| "oncely".into());
    let sasl = format!(
        "\"security.protocol\" = \"sasl_plaintext\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\
         \"sasl.username\" = \"{user}\"\n\"sasl.password\" = \"{SECRET}\"\n"
    );
    let sink = case.file(
        "sink.toml",
        &format!(
            "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{}\"\ntopics = [\"secrets.public.t\"]\n\
             [kafka]\n{sasl}[sink]\nkind = \"stdout\"\n",
            common::unique("secrets-auth")
        ),
    )?;
    case.run(
        &["sink", "--config", path(&sink)],
        Duration::from_secs(20),
        &["uthentication"],
    )?;
    // Capture's producer with the same refused credentials, and the source
    // password in its config (trusted by the test server, so capture gets as
    // far as Kafka), on a database of its own.
    let env = capture::CaptureEnv::new("secrets_auth").await?;
    let text = env
        .config(&format!(
            "database.password = \"{SECRET}\"\n[kafka.producer]\n{sasl}"
        ))
        .replace(
            &format!("kafka.bootstrap.servers = \"{}\"", common::kafka_brokers()),
            &format!("kafka.bootstrap.servers = \"{brokers}\""),
        );
    let capture = case.file("capture.toml", &text)?;
    let result = case.run(
        &["capture", "--config", path(&capture)],
        Duration::from_secs(30),
        &["uthentication"],
    );
    env.cleanup().await;
    result?;
    Ok(())
}
