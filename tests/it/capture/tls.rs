//! Capture from a database that accepts its user only over TLS.
//!
//! `scripts/services up` provisions two roles on the test server that
//! `pg_hba.conf` refuses without TLS (`hostnossl ... reject`): `oncely_tls`
//! (a password, over `hostssl`) and `oncely_tls_cert` (`clientcert=verify-full`:
//! a client certificate signed by the test CA). As them, every connection
//! oncely opens to the source — the control, snapshot and signal
//! connections, the replication stream, `oncely verify`'s reader — must use
//! TLS, and the ways it cannot must be said clearly and at once:
//! `sslmode = "disable"` names the key to set, a CA that did not sign the
//! server's certificate gives rustls's reason.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use oncely_testkit::tls::unrelated_ca;

use crate::harness::capture::{kill9, wait_for, CaptureEnv, Seen};
use crate::harness::common;
use crate::harness::e2e::Pipeline;

const SCHEMA: &str = "CREATE TABLE items (id int PRIMARY KEY, note text, qty int);
     INSERT INTO items SELECT g, 'before ' || g, g FROM generate_series(1, 40) g;
     CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));";

/// Capture keys shared by the tests: an initial snapshot, the signal table,
/// a publication of the captured tables (the TLS roles are no superusers).
const CAPTURE: &str =
    "snapshot.mode = \"initial\"\nsignal.data.collection = \"public.oncely_signal\"\n\
     table.include.list = \"public\\\\.items\"\npublication.autocreate.mode = \"filtered\"\n";

const CHANGES: &str = "INSERT INTO items VALUES (100, 'streamed', 1);
     UPDATE items SET note = 'updated', qty = qty + 1 WHERE id <= 5;
     DELETE FROM items WHERE id BETWEEN 30 AND 33;";

/// The TLS roles and files `scripts/services env` exports.
struct Tls {
    ca: String,
    user: String,
    cert_user: String,
    sslcert: String,
}

impl Tls {
    fn from_env() -> Self {
        // The password and the key path are read by capture itself through
        // `${env:..}` references; check here that they are set.
        common::env_var("ONCELY_PG_TLS_PASSWORD");
        common::env_var("ONCELY_PG_SSLKEY");
        Tls {
            ca: common::env_var("ONCELY_PG_SSLROOTCERT"),
            user: common::env_var("ONCELY_PG_TLS_USER"),
            cert_user: common::env_var("ONCELY_PG_CERT_USER"),
            sslcert: common::env_var("ONCELY_PG_SSLCERT"),
        }
    }

    /// The password role's keys, verifying the server fully.
    fn password_keys(&self) -> String {
        format!(
            "database.password = \"${{env:ONCELY_PG_TLS_PASSWORD}}\"\n\
             database.sslmode = \"verify-full\"\ndatabase.sslrootcert = \"{}\"\n",
            self.ca
        )
    }

    /// The certificate role's keys; the key file through a reference.
    fn cert_keys(&self) -> String {
        format!(
            "database.sslmode = \"verify-full\"\ndatabase.sslrootcert = \"{}\"\n\
             database.sslcert = \"{}\"\ndatabase.sslkey = \"${{env:ONCELY_PG_SSLKEY}}\"\n",
            self.ca, self.sslcert
        )
    }
}

/// `env`'s capture config as `user` with the TLS `keys`.
fn config_as(env: &CaptureEnv, user: &str, keys: &str, extra: &str) -> String {
    env.config(&format!("{extra}\n{keys}")).replace(
        &format!("database.user = \"{}\"\n", env.pg_user),
        &format!("database.user = \"{user}\"\n"),
    )
}

/// Makes `role` the owner of the test's tables (a filtered publication
/// needs it) and lets it create the publication.
async fn hand_over(env: &CaptureEnv, role: &str) -> Result<()> {
    env.client
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE {db} TO {role};
             ALTER TABLE items OWNER TO {role};
             ALTER TABLE oncely_signal OWNER TO {role};",
            db = env.dbname
        ))
        .await?;
    Ok(())
}

/// The connections `role` holds to the test's database: (backend type, ssl,
/// client certificate DN).
async fn connections(env: &CaptureEnv, role: &str) -> Result<Vec<(String, bool, String)>> {
    let rows = env
        .client
        .query(
            "SELECT a.backend_type, s.ssl, coalesce(s.client_dn, '')
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.usename = $1 AND a.datname = $2",
            &[&role, &env.dbname],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Every connection of `role` is TLS, the replication stream among them;
/// with `dn`, each presented that client certificate.
async fn assert_all_tls(env: &CaptureEnv, role: &str, dn: Option<&str>) -> Result<()> {
    let seen = connections(env, role).await?;
    ensure!(
        seen.iter().any(|(kind, _, _)| kind == "walsender"),
        "no replication connection of {role}: {seen:?}"
    );
    ensure!(
        seen.iter().all(|(_, ssl, _)| *ssl),
        "a connection of {role} is not TLS: {seen:?}"
    );
    if let Some(dn) = dn {
        ensure!(
            seen.iter().all(|(_, _, client)| client == dn),
            "a connection of {role} without the client certificate {dn}: {seen:?}"
        );
    }
    Ok(())
}

fn signal(config: &Path, extra_env: &[(&str, &str)]) -> Result<(bool, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(config)
        .args(["--table", "public.items"])
        .envs(extra_env.iter().copied())
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn incremental_reads(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|r| {
            r.op() == Some("r")
                && r.payload()
                    .is_some_and(|p| p["source"]["snapshot"] == "incremental")
        })
        .count()
}

fn has_note(seen: &[Seen], note: &str) -> bool {
    seen.iter()
        .any(|r| r.payload().is_some_and(|p| p["after"]["note"] == note))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_snapshot_signal_and_verify_as_a_hostssl_only_user() -> Result<()> {
    let tls = Tls::from_env();
    let p = Pipeline::new("cap_tls", SCHEMA, &["items"], CAPTURE).await?;
    let result = pipeline_over_tls(&p, &tls).await;
    p.cleanup().await;
    result
}

async fn pipeline_over_tls(p: &Pipeline, tls: &Tls) -> Result<()> {
    hand_over(&p.env, &tls.user).await?;
    std::fs::write(
        &p.capture_config,
        config_as(
            &p.env,
            &tls.user,
            &tls.password_keys(),
            &format!("heartbeat.interval.ms = 500\n{CAPTURE}"),
        ),
    )?;
    let mut capture = p.spawn_capture()?;
    let mut sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    let topics = p.topics();
    // The initial snapshot, then streamed changes.
    wait_for(&topics, Duration::from_secs(120), |seen| {
        seen.iter().any(|r| {
            r.payload()
                .is_some_and(|p| p["source"]["snapshot"] == "last")
        })
    })
    .await
    .with_context(|| p.env.capture_log())?;
    p.env.client.batch_execute(CHANGES).await?;
    wait_for(&topics, Duration::from_secs(120), |seen| {
        has_note(seen, "streamed")
    })
    .await
    .with_context(|| p.env.capture_log())?;
    assert_all_tls(&p.env, &tls.user, None).await?;

    // A signalled snapshot through `oncely capture snapshot` (its own
    // connection, as the same user).
    let (ok, stderr) = signal(&p.capture_config, &[])?;
    ensure!(ok, "oncely capture snapshot failed: {stderr}");
    let rows: i64 = p
        .env
        .client
        .query_one("SELECT count(*) FROM items", &[])
        .await?
        .get(0);
    wait_for(&topics, Duration::from_secs(180), |seen| {
        incremental_reads(seen) == rows as usize
    })
    .await
    .with_context(|| p.env.capture_log())?;

    // `oncely verify` reads the source over TLS as the same user.
    let report = p.verify(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "targets differ:\n{report}");
    ensure!(
        report.targets.len() == 3
            && report
                .targets
                .iter()
                .all(|t| t.tables.iter().any(|t| t.table == "public.items")),
        "verify did not compare items in every target:\n{report}"
    );
    kill9(&mut capture);
    for sink in &mut sinks {
        kill9(sink);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_with_a_client_certificate() -> Result<()> {
    let tls = Tls::from_env();
    let env = CaptureEnv::new("cap_tls_cert").await?;
    let result = client_certificate(&env, &tls).await;
    env.cleanup().await;
    result
}

async fn client_certificate(env: &CaptureEnv, tls: &Tls) -> Result<()> {
    env.client.batch_execute(SCHEMA).await?;
    hand_over(env, &tls.cert_user).await?;
    let config = env.write_config(
        "capture.toml",
        &config_as(env, &tls.cert_user, &tls.cert_keys(), CAPTURE),
    )?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active()
        .await
        .with_context(|| env.capture_log())?;
    let topics = [env.topic("items")];
    wait_for(&topics, Duration::from_secs(120), |seen| {
        seen.iter().filter(|r| r.op() == Some("r")).count() == 40
    })
    .await
    .with_context(|| env.capture_log())?;
    env.client.batch_execute(CHANGES).await?;
    wait_for(&topics, Duration::from_secs(120), |seen| {
        has_note(seen, "streamed")
    })
    .await
    .with_context(|| env.capture_log())?;
    let dn = format!("/CN={}", tls.cert_user);
    assert_all_tls(env, &tls.cert_user, Some(&dn)).await?;
    let (ok, stderr) = signal(&config, &[])?;
    ensure!(ok, "oncely capture snapshot failed: {stderr}");
    wait_for(&topics, Duration::from_secs(180), |seen| {
        incremental_reads(seen) == 37
    })
    .await
    .with_context(|| env.capture_log())?;
    kill9(&mut capture);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_connections_and_wrong_cas_are_refused_at_once_with_the_reason() -> Result<()> {
    let tls = Tls::from_env();
    let env = CaptureEnv::new("cap_tls_refused").await?;
    let result = refusals(&env, &tls).await;
    env.cleanup().await;
    result
}

async fn refusals(env: &CaptureEnv, tls: &Tls) -> Result<()> {
    env.client.batch_execute(SCHEMA).await?;
    hand_over(env, &tls.user).await?;
    // A start that retried for ever would still run after a minute.
    let limit = Duration::from_secs(60);
    let password = "database.password = \"${env:ONCELY_PG_TLS_PASSWORD}\"\n";

    // `sslmode = disable` against `hostssl` only: the server requires SSL,
    // and the message names the key to set.
    let disable = format!("{password}database.sslmode = \"disable\"\n");
    let text = config_as(env, &tls.user, &disable, CAPTURE);
    let (ok, stderr) = env.run_capture_with(&text, limit)?;
    ensure!(!ok, "capture started without TLS:\n{stderr}");
    for part in ["requires SSL", "database.sslmode", "no encryption"] {
        ensure!(stderr.contains(part), "no {part:?} in:\n{stderr}");
    }
    // The signal CLI and verify say the same.
    let config = env.write_config("disable.toml", &text)?;
    let (ok, stderr) = signal(&config, &[])?;
    ensure!(
        !ok && stderr.contains("requires SSL") && stderr.contains("database.sslmode"),
        "oncely capture snapshot without TLS: {stderr}"
    );
    let verify = oncely::verify::run(&oncely::verify::Options {
        capture: config.clone(),
        sinks: Vec::new(),
        wait: false,
        timeout: Duration::from_secs(10),
        examples: 1,
        retries: 0,
        capture_offset: true,
    })
    .await;
    match verify {
        Ok(report) => anyhow::bail!("verify connected without TLS:\n{report}"),
        Err(e) => ensure!(
            e.to_string().contains("requires SSL") && e.to_string().contains("database.sslmode"),
            "verify without TLS: {e}"
        ),
    }

    // A CA that did not sign the server's certificate: refused, with
    // rustls's reason, under each mode that checks the chain.
    let other = unrelated_ca(&env.dir)?;
    for mode in ["require", "verify-ca", "verify-full"] {
        let keys = format!(
            "{password}database.sslmode = \"{mode}\"\ndatabase.sslrootcert = \"{}\"\n",
            other.display()
        );
        let text = config_as(env, &tls.user, &keys, CAPTURE);
        let (ok, stderr) = env.run_capture_with(&text, limit)?;
        ensure!(!ok, "{mode}: capture trusted an unknown CA:\n{stderr}");
        for part in [
            "certificate was refused",
            "UnknownIssuer",
            "database.sslrootcert",
        ] {
            ensure!(stderr.contains(part), "{mode}: no {part:?} in:\n{stderr}");
        }
    }

    // The certificate role without its certificate: the server's refusal, at once.
    let keys = format!(
        "database.sslmode = \"verify-full\"\ndatabase.sslrootcert = \"{}\"\n",
        tls.ca
    );
    let text = config_as(env, &tls.cert_user, &keys, CAPTURE);
    let (ok, stderr) = env.run_capture_with(&text, limit)?;
    ensure!(
        !ok,
        "capture connected without a client certificate:\n{stderr}"
    );
    ensure!(
        stderr.contains("client certificate"),
        "no reason in:\n{stderr}"
    );
    Ok(())
}
