//! Each start-up misconfiguration stops capture with a message that names
//! the problem and the fix (real PostgreSQL and Kafka).
use std::process::Command;

use crate::harness::capture::CaptureEnv;
use crate::harness::common;

/// Runs `oncely capture` to completion and returns (success, stderr).
fn run_capture(env: &CaptureEnv, extra: &str) -> anyhow::Result<(bool, String)> {
    let path = env.write_config(
        &format!("capture-{}.toml", rand::random::<u32>()),
        &env.config(extra),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigurations_are_explained() -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_misconf").await?;
    env.client
        .batch_execute(
            "CREATE TABLE keyed (id int PRIMARY KEY, v text);
             CREATE TABLE keyless (v text);
             CREATE PUBLICATION only_keyed FOR TABLE keyed;",
        )
        .await?;

    // A table without a primary key and no message.key.columns is set
    // aside, not a stop: `capture_quarantine` tests it.

    // The publication lacks a captured table and may not be changed.
    let (ok, err) = run_capture(
        &env,
        "publication.name = \"only_keyed\"\npublication.autocreate.mode = \"disabled\"\nmessage.key.columns = \"public.keyless:v\"\n",
    )?;
    assert!(!ok);
    assert!(
        err.contains("does not include")
            && err.contains("public.keyless")
            && err.contains("ALTER PUBLICATION"),
        "{err}"
    );

    // A missing publication with autocreate disabled.
    let (ok, err) = run_capture(
        &env,
        "publication.name = \"nope\"\npublication.autocreate.mode = \"disabled\"\ntable.include.list = \"public.keyed\"\n",
    )?;
    assert!(!ok);
    assert!(
        err.contains("`nope` does not exist") && err.contains("CREATE PUBLICATION"),
        "{err}"
    );

    // The slot exists with another output plugin.
    let other = format!("{}_td", env.slot);
    env.client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
            &[&other],
        )
        .await?;
    let text = env
        .config("table.include.list = \"public.keyed\"\n")
        .replace(
            &format!("slot.name = \"{}\"", env.slot),
            &format!("slot.name = \"{other}\""),
        );
    let path = env.write_config("other-plugin.toml", &text)?;
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "--config"])
        .arg(&path)
        .output()?;
    let (ok, err) = (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    env.client
        .query_one("SELECT pg_drop_replication_slot($1)", &[&other])
        .await?;
    assert!(!ok);
    assert!(
        err.contains("test_decoding") && err.contains("pgoutput"),
        "{err}"
    );

    // A config key that does not exist.
    let (ok, err) = run_capture(&env, "slot.nmae = \"typo\"\n")?;
    assert!(!ok);
    assert!(err.contains("nmae"), "{err}");
    env.cleanup().await;
    Ok(())
}

/// A throwaway server with `wal_level = replica`, owned by the `postgres`
/// user when the tests run as root.
struct ReplicaServer {
    dir: std::path::PathBuf,
    port: u16,
    as_postgres: bool,
}

impl ReplicaServer {
    /// Starts the server; a port taken between choosing and binding it
    /// (another test, a client's ephemeral port) is tried again with another.
    fn start() -> anyhow::Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once() {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("three tries"))
    }

    fn start_once() -> anyhow::Result<Self> {
        let bin = std::path::Path::new("/usr/lib/postgresql/15/bin");
        let dir = std::env::temp_dir().join(common::unique("oncely_walcheck"));
        let port = common::free_addr().port();
        let as_postgres = Command::new("id").arg("-u").output()?.stdout == b"0\n";
        std::fs::create_dir_all(&dir)?;
        if as_postgres {
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()?;
        }
        let server = ReplicaServer {
            dir,
            port,
            as_postgres,
        };
        server.run(
            bin.join("initdb"),
            &["-D", &server.data(), "-A", "trust", "-U", "postgres"],
        )?;
        let opts = format!(
            "-c wal_level=replica -c listen_addresses=127.0.0.1 -p {port} -k {}",
            server.dir.display()
        );
        let log = format!("{}/log", server.dir.display());
        server
            .run(
                bin.join("pg_ctl"),
                &["-D", &server.data(), "-w", "-l", &log, "-o", &opts, "start"],
            )
            .map_err(|e| {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                e.context(format!("server log:\n{log}"))
            })?;
        Ok(server)
    }

    fn data(&self) -> String {
        format!("{}/data", self.dir.display())
    }

    fn run(&self, program: std::path::PathBuf, args: &[&str]) -> anyhow::Result<()> {
        let status = if self.as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .output()?
        } else {
            Command::new(&program).args(args).output()?
        };
        anyhow::ensure!(
            status.status.success(),
            "{} failed: {}",
            program.display(),
            String::from_utf8_lossy(&status.stderr)
        );
        Ok(())
    }
}

impl Drop for ReplicaServer {
    fn drop(&mut self) {
        let _ = self.run(
            std::path::PathBuf::from("/usr/lib/postgresql/15/bin/pg_ctl"),
            &["-D", &self.data(), "-m", "immediate", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn wal_level_other_than_logical_is_explained() -> anyhow::Result<()> {
    let server = ReplicaServer::start()?;
    let dir = std::env::temp_dir().join(common::unique("walcheck_cfg"));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("capture.toml");
    std::fs::write(
        &path,
        format!(
            "topic.prefix = \"walcheck\"\ndatabase.hostname = \"127.0.0.1\"\ndatabase.port = {}\n\
             database.user = \"postgres\"\ndatabase.dbname = \"postgres\"\n\
             kafka.bootstrap.servers = \"{}\"\n",
            server.port,
            common::kafka_brokers()
        ),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "--config"])
        .arg(&path)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("wal_level is `replica`") && err.contains("wal_level = logical"),
        "{err}"
    );
    Ok(())
}
