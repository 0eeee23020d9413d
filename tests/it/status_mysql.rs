//! `oncely status` on a MariaDB source (`source = "mysql"`), against the
//! MariaDB of `scripts/services`. No MySQL capture commits offsets yet, so
//! the test writes the connector's offset record itself, built with
//! capture's own types (the offset record's MySQL part), into a fresh
//! connector's offsets topic, and checks: the stored position and the
//! server's are shown, lag in bytes is 0 when caught up, grows with writes
//! and counts across a `FLUSH BINARY LOGS`, a position in a purged binlog
//! or of another server without GTIDs is down, naming the fix, and one of
//! another server holding its GTIDs degraded (capture takes it over). The purge is an
//! invented older file name, so no binlog another test may read is purged.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use oncely_capture::catalog::SourceOffset;
use oncely_capture::config::CaptureConfig;
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::{
    MySqlOffset, Position, ServerFacts, ServerIdentity, ShapeFacts,
};
use oncely_testkit::kafka::{create_topic_with, produce, Out};
use serde_json::Value;

use crate::harness::common::{kafka_brokers, unique};
use crate::mysql_binlog::{admin, capture_opts};

/// `oncely status --capture <config> [args]`: exit code and stdout.
fn status(config: &Path, args: &[&str]) -> Result<(i32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("status")
        .arg("--capture")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

fn status_json(config: &Path) -> Result<(i32, Value)> {
    let (code, out) = status(config, &["--json"])?;
    let json = serde_json::from_str(&out).with_context(|| format!("not JSON:\n{out}"))?;
    Ok((code, json))
}

/// Stores `position` of `server`, committed at `ts_ms`, as the connector's
/// offset record, as capture writes it (core fields and MySQL part agree).
async fn store(cfg: &CaptureConfig, position: &Position, server: &ServerIdentity, ts_ms: i64) {
    let part = MySqlOffset::new(
        position.clone(),
        server.clone(),
        &ShapeFacts::default(),
        |_, _| true,
    );
    let mut record = SourceOffset {
        ts_ms,
        ..SourceOffset::start(part.order_key().expect("order key"))
    };
    part.store(&mut record).expect("the part agrees");
    produce(
        &cfg.offsets_topic(),
        &[Out {
            key: Some(SourceOffset::key(cfg.connector_name())),
            value: Some(record.to_bytes()),
            partition: Some(0),
        }],
    )
    .await;
}

/// The capture configuration of the least-privileged capture user.
fn capture_config(prefix: &str, database: &str) -> String {
    let opts = capture_opts();
    let password = opts
        .pass()
        .map(|pw| format!("database.password = \"{pw}\"\n"))
        .unwrap_or_default();
    format!(
        "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
         database.hostname = \"{}\"\ndatabase.port = {}\ndatabase.user = \"{}\"\n{password}\
         database.include.list = \"{database}\"\n\
         kafka.bootstrap.servers = \"{}\"\n",
        opts.ip_or_hostname(),
        opts.tcp_port(),
        opts.user().unwrap_or_default(),
        kafka_brokers()
    )
}

/// A binlog name older than `oldest` (its sequence minus one, same width).
fn older_file(oldest: &str) -> String {
    let (base, ext) = oldest.rsplit_once('.').expect("binlog.NNNNNN");
    let seq: u64 = ext.parse().expect("numeric extension");
    format!(
        "{base}.{:0width$}",
        seq.saturating_sub(1),
        width = ext.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_mariadb_shows_the_binlog_position_lag_and_refusals() -> Result<()> {
    let database = unique("status_my");
    let prefix = database.replace('_', "-");
    let mut root = admin().await;
    root.query_drop(format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id int PRIMARY KEY, v text)"
    ))
    .await?;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("capture.toml");
    std::fs::write(&config, capture_config(&prefix, &database))?;
    let cfg = CaptureConfig::load(&config)?;
    create_topic_with(&cfg.offsets_topic(), 1, &[("cleanup.policy", "compact")]).await;
    let result = exercise(&mut root, &config, &cfg, &database).await;
    delete_topic(&cfg.offsets_topic()).await;
    let _ = root.query_drop(format!("DROP DATABASE {database}")).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn exercise(root: &mut Conn, config: &Path, cfg: &CaptureConfig, db: &str) -> Result<()> {
    let (code, none) = status_json(config)?;
    ensure!(code == 2, "no stored offset is down: {none:#}");
    ensure!(
        none["problems"].to_string().contains("committed no offset"),
        "{none:#}"
    );
    ensure!(none["source"] == "mysql", "{none:#}");

    let mut cap = Conn::new(capture_opts()).await?;
    let facts = ServerFacts::read(&mut cap).await?;
    let server = facts.server.clone();
    let end = || async {
        let mut c = Conn::new(capture_opts()).await?;
        anyhow::Ok(current_position(&mut c, facts.flavor, &facts.version).await?)
    };
    let committed = oncely_core::clock::now_ms() - 3_000;

    // Caught up: stored at the server's end. Other tests' writes would move
    // the end between the store and the status (for over a minute under
    // the DDL chaos test): a global read lock holds their commits for the
    // moment; a write racing the lock still means trying again.
    let mut caught_up = None;
    for _ in 0..20 {
        let mut quiet = admin().await;
        quiet.query_drop("FLUSH TABLES WITH READ LOCK").await?;
        let at = end().await;
        let shown = match &at {
            Ok(at) => {
                store(cfg, at, &server, committed).await;
                status_json(config).and_then(|json| Ok((json, status(config, &[])?)))
            }
            Err(_) => Ok(((0, Value::Null), (0, String::new()))),
        };
        quiet.query_drop("UNLOCK TABLES").await?;
        drop(quiet);
        let (at, ((code, j), text)) = (at?, shown?);
        let stored = &j["capture"]["stored_position"];
        ensure!(
            stored["file"] == at.file.as_str() && stored["pos"] == at.pos,
            "the stored position shown: {j:#}"
        );
        ensure!(
            stored["gtids"].as_str() == at.gtids.as_ref().map(|g| g.to_string()).as_deref(),
            "{j:#}"
        );
        let lag = j["capture"]["lag_bytes"].as_u64().context("lag_bytes")?;
        if j["server"]["position"]["file"] == at.file.as_str()
            && j["server"]["position"]["pos"] == at.pos
        {
            ensure!(code == 0 && j["health"] == "healthy", "{j:#}");
            ensure!(lag == 0 && j["capture"]["lag_seconds"] == 0.0, "{j:#}");
            ensure!(j["capture"]["stored_file_on_server"] == true, "{j:#}");
            ensure!(
                j["capture"]["stored_server"]["server_id"] == server.id
                    && j["server"]["server_id"] == server.id,
                "{j:#}"
            );
            caught_up = Some((at, text));
            break;
        }
        ensure!(lag > 0, "the server moved on, so lag is not 0: {j:#}");
    }
    let Some((stored, (code, text))) = caught_up else {
        bail!("the server's binlog never stood still long enough to be caught up");
    };
    eprintln!("{text}");
    ensure!(
        code == 0
            && text.contains(&format!("stored position {}:{}", stored.file, stored.pos))
            && text.contains("  0 bytes of binlog behind the server, 0.0 s")
            && text.ends_with("status: healthy\n"),
        "{text}"
    );

    // Writes after the stored position: bytes behind, and the seconds since
    // the stored commit.
    root.query_drop(format!(
        "INSERT INTO {db}.t SELECT seq, REPEAT('x', 100) FROM seq_1_to_100"
    ))
    .await?;
    let (code, j) = status_json(config)?;
    let lag = j["capture"]["lag_bytes"].as_u64().context("lag_bytes")?;
    ensure!(code == 0, "lag alone is not a problem: {j:#}");
    ensure!(lag >= 100 * 100, "100 rows of 100 bytes behind: {j:#}");
    ensure!(
        j["capture"]["lag_seconds"].as_f64() >= Some(3.0),
        "seconds since the stored commit: {j:#}"
    );
    let server_at = &j["server"]["position"];
    if server_at["file"] == stored.file.as_str() {
        ensure!(
            server_at["pos"].as_u64() == Some(stored.pos + lag),
            "in one file, lag is the offsets' difference: {j:#}"
        );
    }

    // Across a rotation: the rest of the stored file, then the new one.
    root.query_drop("FLUSH BINARY LOGS").await?;
    root.query_drop(format!(
        "INSERT INTO {db}.t VALUES (101, 'after the flush')"
    ))
    .await?;
    let (code, j) = status_json(config)?;
    let across = j["capture"]["lag_bytes"].as_u64().context("lag_bytes")?;
    let server_at = &j["server"]["position"];
    ensure!(
        code == 0 && server_at["file"] != stored.file.as_str(),
        "{j:#}"
    );
    ensure!(
        across >= lag + server_at["pos"].as_u64().context("pos")?,
        "every file after the stored one counts: {across} < {lag} + the new file's offset: {j:#}"
    );

    // A position in a binlog the server no longer has.
    let oldest = j["server"]["oldest_binlog"]
        .as_str()
        .context("oldest binlog")?
        .to_owned();
    let purged = Position::at(older_file(&oldest), 4);
    store(cfg, &purged, &server, committed).await;
    let (code, j) = status_json(config)?;
    ensure!(code == 2 && j["health"] == "down", "{j:#}");
    let problems = j["problems"].to_string();
    ensure!(
        problems.contains(&format!(
            "the stored position {}:4 is no longer on the server (oldest binlog: {oldest})",
            purged.file
        )) && problems.contains("Take a new snapshot"),
        "the purge named with its fix: {j:#}"
    );
    ensure!(
        j["capture"]["stored_file_on_server"] == false && j["capture"]["lag_bytes"].is_null(),
        "{j:#}"
    );
    let (code, text) = status(config, &[])?;
    ensure!(
        code == 2
            && text.contains("NOT ON THE SERVER")
            && text.contains("DOWN: capture cannot resume"),
        "{text}"
    );

    // A position of another server whose GTIDs this one holds: capture
    // takes it over at its next start (a failover), so not down.
    let other = ServerIdentity {
        id: server.id.wrapping_add(1),
        uuid: None,
    };
    let with_gtids = end().await?;
    ensure!(with_gtids.gtids.is_some(), "GTIDs at the binlog end");
    store(cfg, &with_gtids, &other, committed).await;
    let (code, j) = status_json(config)?;
    ensure!(
        code == 1
            && j["health"] == "degraded"
            && j["problems"]
                .to_string()
                .contains("follows its GTIDs onto this one"),
        "{j:#}"
    );
    // Without GTIDs nothing tells what of this server Kafka holds.
    let without = Position {
        gtids: None,
        ..end().await?
    };
    store(cfg, &without, &other, committed).await;
    let (code, j) = status_json(config)?;
    ensure!(code == 2, "{j:#}");
    ensure!(
        j["problems"].to_string().contains(&format!(
            "binlog of server_id {}, but this server is server_id {}",
            other.id, server.id
        )),
        "{j:#}"
    );
    ensure!(
        j["capture"]["stored_server"]["server_id"] == other.id
            && j["capture"]["lag_bytes"].is_null(),
        "{j:#}"
    );
    Ok(())
}

/// A capture user without `REPLICATION CLIENT` (MariaDB: `BINLOG
/// MONITOR`) cannot read the binlog's end or list the binlogs: status
/// still reports what it can (the stored position, the server, the
/// sinks' part) and names the missing grant as one problem, down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_replication_client_names_the_grant_and_reports_the_rest() -> Result<()> {
    let database = unique("status_nocl");
    let prefix = database.replace('_', "-");
    let mut root = admin().await;
    let opts = capture_opts();
    let user = format!("{database}_u");
    let host = opts.ip_or_hostname().to_owned();
    root.query_drop(format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id int PRIMARY KEY, v text); \
         CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw'; \
         GRANT REPLICATION SLAVE, SELECT ON *.* TO '{user}'@'{host}'"
    ))
    .await?;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("capture.toml");
    let text = capture_config(&prefix, &database)
        .lines()
        .filter(|l| !l.starts_with("database.user") && !l.starts_with("database.password"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + &format!("database.user = \"{user}\"\ndatabase.password = \"pw\"\n");
    std::fs::write(&config, text)?;
    let cfg = CaptureConfig::load(&config)?;
    create_topic_with(&cfg.offsets_topic(), 1, &[("cleanup.policy", "compact")]).await;
    let result = async {
        let mut cap = Conn::new(capture_opts()).await?;
        let facts = ServerFacts::read(&mut cap).await?;
        let at = current_position(&mut cap, facts.flavor, &facts.version).await?;
        store(&cfg, &at, &facts.server, oncely_core::clock::now_ms()).await;
        let (code, j) = status_json(&config)?;
        ensure!(code == 2, "a missing grant is down: {j:#}");
        let problems = j["problems"].as_array().cloned().unwrap_or_default();
        let named: Vec<&Value> = problems
            .iter()
            .filter(|p| p.to_string().contains("REPLICATION CLIENT"))
            .collect();
        ensure!(named.len() == 1, "the grant named once: {j:#}");
        ensure!(
            named[0]
                .to_string()
                .contains(&format!("GRANT REPLICATION CLIENT ON *.* TO {user}")),
            "with the fix: {j:#}"
        );
        ensure!(
            j["capture"]["stored_position"]["file"] == at.file.as_str()
                && j["server"]["server_id"] == facts.server.id
                && j["server"]["position"].is_null()
                && j["capture"]["lag_bytes"].is_null(),
            "what it can read is reported: {j:#}"
        );
        let (code, text) = status(&config, &[])?;
        ensure!(
            code == 2 && text.contains("binlog end unreadable") && text.contains(&at.file),
            "{text}"
        );
        anyhow::Ok(())
    }
    .await;
    delete_topic(&cfg.offsets_topic()).await;
    let _ = root
        .query_drop(format!(
            "DROP USER '{user}'@'{host}'; DROP DATABASE {database}"
        ))
        .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn delete_topic(topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: Result<AdminClient<DefaultClientContext>, _> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create();
    if let Ok(admin) = admin {
        let _ = admin.delete_topics(&[topic], &AdminOptions::new()).await;
    }
}
