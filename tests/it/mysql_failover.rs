//! A failover under `oncely capture` with `source = "mysql"`: a second
//! MariaDB started by the test itself (its own datadir, port and
//! `server_id`; `log_bin`, `log_slave_updates`, GTID strict mode, full row
//! images and metadata) replicates the test's database from the
//! `scripts/services` MariaDB by GTID. Capture streams from the primary and
//! is SIGKILLed inside a large transaction; the replica catches up and is
//! promoted (replication stopped, written to directly); capture, pointed
//! at it, follows the stored GTIDs onto it (and, killed once more,
//! resumes from the new primary's own offset): each change is in Kafka once,
//! in order, and the sinks (which version rows by the binlog position,
//! whose files start over on the replica) end equal to it.
//!
//! The shared server is never restarted; the replica only applies the
//! test's database (`replicate_wild_do_table`), so other tests' tables
//! are not needed on it. Skipped, saying so, where `mariadbd` is absent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::harness::capture::{kill9, read_committed, wait_for, Seen};
use crate::harness::checks::dead_letters;
use crate::harness::common::{kafka_brokers, unique};
use crate::harness::e2e::{summary, Pipeline};
use crate::harness::relay::Relay;
use crate::mysql_binlog::{admin, capture_opts, server_id};
use crate::mysql_capture::{mariadb_relay, wait_for_end_offset, BINLOG_HELD};

const MARIADBD: &str = "/usr/sbin/mariadbd";
const INSTALL_DB: &str = "mariadb-install-db";

/// The second server: stopped by its PID when dropped. Also the server
/// for tests that change GLOBAL settings, which the shared one must keep.
pub(crate) struct Replica {
    dir: PathBuf,
    pub(crate) port: u16,
    server_id: u32,
    child: Child,
}

impl Replica {
    /// Installs and starts a MariaDB applying `db` of the services'
    /// server. MariaDB's server is one of the services (`scripts/services
    /// up` installs it), so its absence fails the test rather than skips it.
    pub(crate) async fn start(db: &str) -> Result<Self> {
        if !Path::new(MARIADBD).exists() {
            bail!("{MARIADBD} is not installed, so no second MariaDB can be started: run scripts/services up (it installs mariadb-server)");
        }
        let dir = std::env::temp_dir().join(format!("{db}-replica"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let data = dir.join("data");
        let installed = Command::new(INSTALL_DB)
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .args(["--auth-root-authentication-method=normal"])
            .arg(format!("--datadir={}", data.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("install.log"))?)
            .status()
            .context("mariadb-install-db")?;
        if !installed.success() {
            bail!(
                "mariadb-install-db failed: {}",
                std::fs::read_to_string(dir.join("install.log"))?
            );
        }
        let port = crate::harness::common::free_addr().port();
        let id = 2_000_000 + rand::random::<u32>() % 1_000_000;
        let child = Command::new(MARIADBD)
            .args(["--no-defaults", "--user=root", "--bind-address=127.0.0.1"])
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--server-id={id}"))
            .arg(format!("--log-bin={}", data.join("replica-bin").display()))
            .args(["--log-slave-updates", "--gtid-strict-mode=1"])
            .args(["--binlog-format=ROW", "--binlog-row-image=FULL"])
            .args(["--binlog-row-metadata=FULL", "--skip-slave-start"])
            .args(["--innodb-buffer-pool-size=32M", "--performance-schema=OFF"])
            .arg(format!("--replicate-wild-do-table={db}.%"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("error.log"))?)
            .spawn()
            .context("start mariadbd")?;
        let replica = Self {
            dir,
            port,
            server_id: id,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while replica.root().await.is_err() {
            if Instant::now() > deadline {
                bail!("the replica did not start: {}", replica.error_log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(replica)
    }

    pub(crate) fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    pub(crate) async fn root(&self) -> Result<Conn> {
        let opts = OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port)
            .user(Some("root"));
        Ok(Conn::new(Opts::from(opts)).await?)
    }

    /// Replicates from the services' server from its GTID position now,
    /// and gives capture's user the grants it has there.
    async fn follow(&self, primary: &mut Conn) -> Result<()> {
        let pos: String = primary
            .query_first("SELECT @@gtid_binlog_pos")
            .await?
            .unwrap_or_default();
        let source = Opts::from_url(&crate::harness::common::env_var("ONCELY_MARIADB_URL"))?;
        let capture = capture_opts();
        let mut conn = self.root().await?;
        // Local set-up stays out of the binlog: GTIDs of this server in
        // domain 0 would break the strict order of the replicated ones.
        conn.query_drop("SET sql_log_bin = 0").await?;
        conn.query_drop(format!(
            "CREATE USER '{u}'@'%' IDENTIFIED BY '{p}'",
            u = capture.user().unwrap_or_default(),
            p = capture.pass().unwrap_or_default()
        ))
        .await?;
        conn.query_drop(format!(
            "GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{}'@'%'",
            capture.user().unwrap_or_default()
        ))
        .await?;
        conn.exec_drop("SET GLOBAL gtid_slave_pos = ?", (pos,))
            .await?;
        conn.query_drop(format!(
            "CHANGE MASTER TO MASTER_HOST = '{h}', MASTER_PORT = {port}, MASTER_USER = '{u}', \
             MASTER_PASSWORD = '{p}', MASTER_USE_GTID = slave_pos",
            h = source.ip_or_hostname(),
            port = source.tcp_port(),
            u = source.user().unwrap_or_default(),
            p = source.pass().unwrap_or_default(),
        ))
        .await?;
        conn.query_drop("START SLAVE").await?;
        Ok(())
    }

    /// Waits until the replica applied everything the primary has now.
    async fn catch_up(&self, primary: &mut Conn) -> Result<()> {
        let pos: String = primary
            .query_first("SELECT @@gtid_binlog_pos")
            .await?
            .unwrap_or_default();
        let mut conn = self.root().await?;
        let waited: Option<i64> = conn
            .exec_first("SELECT MASTER_GTID_WAIT(?, 30)", (pos.clone(),))
            .await?;
        if waited != Some(0) {
            let status: Vec<mysql_async::Row> = conn.query("SHOW SLAVE STATUS").await?;
            bail!(
                "the replica did not reach {pos}: {status:?}\n{}",
                self.error_log()
            );
        }
        Ok(())
    }
}

impl Drop for Replica {
    /// Stops the server by its PID (SIGTERM, then SIGKILL after 10 s).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        kill9(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Capture's configuration for the server at `port`.
fn capture_config(prefix: &str, db: &str, port: u16, replica_id: u32) -> String {
    let opts = capture_opts();
    format!(
        "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
         database.hostname = \"{host}\"\ndatabase.port = {port}\n\
         database.user = \"{user}\"\ndatabase.password = \"{pass}\"\n\
         database.include.list = \"{db}\"\ndatabase.server.id = {replica_id}\n\
         kafka.bootstrap.servers = \"{brokers}\"\nsnapshot.mode = \"no_data\"\n\
         heartbeat.interval.ms = 500\nbatch.max.events = 1000\n",
        host = opts.ip_or_hostname(),
        user = opts.user().unwrap_or_default(),
        pass = opts.pass().unwrap_or_default(),
        brokers = kafka_brokers(),
    )
}

/// `(op, id)` of a change record.
fn op_and_id(r: &Seen) -> (String, i64) {
    let p = r.payload().expect("a value");
    let row = if p["op"] == "d" {
        &p["before"]
    } else {
        &p["after"]
    };
    (
        p["op"].as_str().unwrap_or_default().to_owned(),
        row["id"].as_i64().expect("an integer id"),
    )
}

async fn wait_for_stream(p: &Pipeline, opened: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.env.capture_log().matches("binlog stream opening").count() <= opened {
        if Instant::now() > deadline {
            bail!("capture did not open its stream:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capture_follows_the_stored_gtids_onto_a_promoted_replica() -> Result<()> {
    let db = unique("oncely_myfail");
    let replica = Replica::start(&db).await?;
    let mut root = admin().await;
    replica.follow(&mut root).await?;
    root.query_drop(format!("CREATE DATABASE {db}")).await?;
    let table = format!("{db}.items");
    root.query_drop(format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, qty int, note varchar(20))"
    ))
    .await?;
    let mut p = Pipeline::with_topics("myfail", "", "", |prefix| {
        vec![format!("{prefix}.{db}.items")]
    })
    .await?;
    // Capture reaches the primary through a relay that can hold its
    // binlog stream back.
    let relay = mariadb_relay().await?;
    p.capture_config = p.env.write_config(
        "capture-mysql.toml",
        &capture_config(&p.env.prefix, &db, relay.addr.port(), server_id()),
    )?;
    let result = failover(&mut root, &replica, &p, &table, &relay).await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    if result.is_err() {
        eprintln!("replica's log:\n{}", replica.error_log());
    }
    drop(replica);
    p.cleanup().await;
    result
}

async fn failover(
    root: &mut Conn,
    replica: &Replica,
    p: &Pipeline,
    table: &str,
    relay: &Relay,
) -> Result<()> {
    let topic = p.topics()[0].clone();
    let mut expected: Vec<(String, i64)> = Vec::new();
    let mut capture = p.spawn_capture()?;
    wait_for_stream(p, 0).await?;
    let sinks = (0..3)
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    for id in 1..=20 {
        root.query_drop(format!("INSERT INTO {table} VALUES ({id}, {id}, 'n')"))
            .await?;
        expected.push(("c".into(), id));
    }
    // A transaction of several rows events, capture killed inside it
    // (its binlog held back meanwhile).
    relay.throttle(BINLOG_HELD);
    root.query_drop("BEGIN").await?;
    for chunk in 0..8 {
        let values: Vec<String> = (0..500)
            .map(|i| format!("({}, {i}, 'big')", 10_000 + chunk * 500 + i))
            .collect();
        root.query_drop(format!("INSERT INTO {table} VALUES {}", values.join(", ")))
            .await?;
    }
    root.query_drop("COMMIT").await?;
    expected.extend((0..4000).map(|i| ("c".to_string(), 10_000 + i)));
    wait_for_end_offset(&topic, 20 + 1500).await?;
    kill9(&mut capture);
    relay.throttle(0);
    let partial = read_committed(std::slice::from_ref(&topic))?
        .iter()
        .filter(|r| r.value.is_some())
        .count();

    // Written on the primary after the kill, then the replica catches up.
    for id in 1..=10 {
        root.query_drop(format!("UPDATE {table} SET qty = qty + 1 WHERE id = {id}"))
            .await?;
        expected.push(("u".into(), id));
    }
    replica.catch_up(root).await?;
    // Promoted: replication stopped, written to directly. Updates of
    // rows the old primary changed last: at smaller binlog offsets (the
    // replica's files started over), newer all the same.
    let mut new_primary = replica.root().await?;
    new_primary.query_drop("STOP SLAVE").await?;
    new_primary.query_drop("RESET SLAVE ALL").await?;
    for id in 1..=10 {
        new_primary
            .query_drop(format!(
                "UPDATE {table} SET qty = qty * 100, note = 'new' WHERE id = {id}"
            ))
            .await?;
        expected.push(("u".into(), id));
    }
    for id in 21..=25 {
        new_primary
            .query_drop(format!("INSERT INTO {table} VALUES ({id}, 0, 'new')"))
            .await?;
        expected.push(("c".into(), id));
    }
    new_primary
        .query_drop(format!("DELETE FROM {table} WHERE id = 15"))
        .await?;
    expected.push(("d".into(), 15));

    std::fs::write(
        &p.capture_config,
        capture_config(&p.env.prefix, p_db(table), replica.port, server_id()),
    )?;
    let opened = p.env.capture_log().matches("binlog stream opening").count();
    let mut capture = p.spawn_capture()?;
    wait_for_stream(p, opened).await?;
    once_in_order(p, &topic, &expected).await?;
    assert!(p.env.capture_log().contains("following the stored GTIDs"));

    // Restarted on the new primary: its own offset, in the new epoch.
    kill9(&mut capture);
    for id in 1..=3 {
        new_primary
            .query_drop(format!("UPDATE {table} SET qty = qty + 7 WHERE id = {id}"))
            .await?;
        expected.push(("u".into(), id));
    }
    let opened = p.env.capture_log().matches("binlog stream opening").count();
    let _capture = p.spawn_capture()?;
    wait_for_stream(p, opened).await?;
    let records = once_in_order(p, &topic, &expected).await?;
    assert_eq!(
        p.env
            .capture_log()
            .matches("following the stored GTIDs")
            .count(),
        1,
        "the restart resumed on the new primary's own offset"
    );
    assert!(
        partial > 20 && partial < 20 + 4000,
        "the kill came inside the large transaction ({partial} records committed then)"
    );
    // From the replica: its server id, the next failover epoch.
    let last = records.last().and_then(Seen::payload).expect("a record");
    assert_eq!(last["source"]["server_id"], replica.server_id);
    assert_eq!(last["source"]["failover_epoch"], 1);
    let first = records[0].payload().expect("a record");
    assert!(first["source"].get("failover_epoch").is_none());

    let report = p.verify_until_equal(Duration::from_secs(60)).await?;
    let letters = dead_letters(&p.env.prefix)?;
    assert!(
        report.is_equal() && letters.is_empty(),
        "{}\ndead letters: {letters:?}\ncapture log:\n{}",
        summary(&report),
        p.env.capture_log()
    );
    drop(sinks);
    Ok(())
}

/// The change records of `topic` once `expected` many are committed,
/// checked to be `expected` in order.
async fn once_in_order(p: &Pipeline, topic: &str, expected: &[(String, i64)]) -> Result<Vec<Seen>> {
    let seen = wait_for(&[topic.to_owned()], Duration::from_secs(60), |s| {
        s.iter().filter(|r| r.value.is_some()).count() >= expected.len()
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", p.env.capture_log()))?;
    let records: Vec<Seen> = seen.into_iter().filter(|r| r.value.is_some()).collect();
    let got: Vec<(String, i64)> = records.iter().map(op_and_id).collect();
    let first_difference = got.iter().zip(expected).position(|(g, e)| g != e);
    assert_eq!(
        (got.len(), first_difference),
        (expected.len(), None),
        "each change once, in order; around the difference: {:?}\ncapture log:\n{}",
        first_difference.map(|i| &got[i.saturating_sub(2)..(i + 3).min(got.len())]),
        p.env.capture_log()
    );
    Ok(records)
}

/// The database of `database.table`.
fn p_db(table: &str) -> &str {
    table.split_once('.').map_or(table, |(db, _)| db)
}

/// A first start's GTIDs are those before exactly its binlog position:
/// with a writer committing as fast as it can, every position the start
/// reads is followed in the binlog by the GTID one past its list's (read
/// apart from the position, the list would often already hold that
/// transaction, and a resume by GTID from it would skip it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_start_s_gtids_are_those_before_its_position_under_writes() -> Result<()> {
    use oncely_capture::testing::mysql::checks::current_position;
    use oncely_capture::testing::mysql::{Gtids, ServerFacts};

    let mut root = admin().await;
    let db = unique("oncely_mygtid");
    root.query_drop(format!("CREATE DATABASE {db}")).await?;
    root.query_drop(format!("CREATE TABLE {db}.t (id int PRIMARY KEY)"))
        .await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, db) = (stop.clone(), db.clone());
        tokio::spawn(async move {
            let mut conn = admin().await;
            let mut id = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                id += 1;
                conn.query_drop(format!("INSERT INTO {db}.t VALUES ({id})"))
                    .await?;
            }
            anyhow::Ok(id)
        })
    };
    let mut cap = Conn::new(capture_opts()).await?;
    let facts = ServerFacts::read(&mut cap).await?;
    let mut samples = Vec::new();
    for _ in 0..300 {
        samples.push(current_position(&mut cap, facts.flavor, &facts.version).await?);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await??;
    let mut checked = 0;
    for at in &samples {
        let Some(Gtids::MariaDb(list)) = &at.gtids else {
            bail!("no GTIDs read at {}:{}", at.file, at.pos);
        };
        let rows: Vec<mysql_async::Row> = root
            .query(format!(
                "SHOW BINLOG EVENTS IN '{}' FROM {} LIMIT 1",
                at.file, at.pos
            ))
            .await?;
        let Some(row) = rows.first() else { continue };
        let (kind, info): (String, String) = (row.get(2).unwrap(), row.get(5).unwrap());
        if kind != "Gtid" {
            continue;
        }
        let next: oncely_capture::testing::mysql::MariaGtid =
            info.rsplit(' ').next().unwrap_or_default().parse()?;
        let before = list.get(next.domain).map_or(0, |g| g.seq);
        assert_eq!(
            before + 1,
            next.seq,
            "at {}:{} the GTIDs read were {list}, but the next transaction there is {next}",
            at.file,
            at.pos
        );
        checked += 1;
    }
    assert!(
        checked > 100 && written > 100,
        "{checked} positions checked, {written} transactions written"
    );
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}
