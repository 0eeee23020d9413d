//! `oncely capture` with `source = "mysql"` against the MariaDB of
//! `scripts/services`: inserts, updates, a primary-key update, deletes, a
//! `FLUSH BINARY LOGS` and a 20,000-row transaction reach
//! `<topic.prefix>.<database>.<table>` once each, in order, in Debezium's
//! MySQL envelope, while capture is SIGKILLed and restarted twice (once
//! inside the large transaction); and a stored position in a purged binlog
//! stops the start with the fix; the three sinks fill their targets from
//! those topics and `oncely verify` says equal; a column dropped and added
//! again between two snapshot passes is numbered anew in the second. The
//! server is shared with other tests: each test has a database, topic
//! prefix and replica id of its own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::{json, Value};

use oncely_capture::testing::sanitize_topic;

use crate::harness::capture::{kill9, read_committed, wait_for, Seen, Spawned};
use crate::harness::checks::dead_letters;
use crate::harness::common::{kafka_brokers, unique};
use crate::harness::e2e::{summary, Pipeline};
use crate::harness::relay::Relay;
use crate::mysql_binlog::{admin, capture_opts, server_id};

/// The columns of a signal table (`signal.data.collection`), as Debezium's.
pub(crate) const SIGNAL_TABLE_COLUMNS: &str =
    "(id varchar(128) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))";

/// One test's database, topics and capture configuration.
pub(crate) struct MySqlCapture {
    pub(crate) db: String,
    prefix: String,
    pub(crate) offsets_topic: String,
    dir: PathBuf,
    pub(crate) config: PathBuf,
}

impl MySqlCapture {
    async fn new(name: &str, root: &mut Conn) -> Result<Self> {
        Self::with_settings(name, root, "snapshot.mode = \"no_data\"\n").await
    }

    /// [`MySqlCapture::with_settings`] plus a signal table `{db}.signals`
    /// (created) named by `signal.data.collection`.
    pub(crate) async fn with_signals(name: &str, root: &mut Conn, settings: &str) -> Result<Self> {
        let settings = format!("{settings}signal.data.collection = \"{{db}}.signals\"\n");
        let env = Self::with_settings(name, root, &settings).await?;
        root.query_drop(format!(
            "CREATE TABLE {}.signals {SIGNAL_TABLE_COLUMNS}",
            env.db
        ))
        .await?;
        Ok(env)
    }

    /// [`MySqlCapture::new`] with `settings` (TOML lines, `{db}` standing
    /// for the test's database) instead of `snapshot.mode = "no_data"`.
    pub(crate) async fn with_settings(name: &str, root: &mut Conn, settings: &str) -> Result<Self> {
        let db = unique(name);
        root.query_drop(format!("CREATE DATABASE {db}")).await?;
        let prefix = db.replace('_', "-");
        let offsets_topic = format!("{prefix}-offsets");
        let dir = std::env::temp_dir().join(&db);
        std::fs::create_dir_all(&dir)?;
        let opts = capture_opts();
        let text = format!(
            "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
             database.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.password = \"{pass}\"\n\
             database.include.list = \"{db}\"\ndatabase.server.id = {id}\n\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"{offsets_topic}\"\n\
             {settings}batch.max.events = 1000\n{heartbeat}",
            host = opts.ip_or_hostname(),
            port = opts.tcp_port(),
            user = opts.user().unwrap_or_default(),
            pass = opts.pass().unwrap_or_default(),
            id = server_id(),
            brokers = kafka_brokers(),
            settings = settings.replace("{db}", &db),
            heartbeat = if settings.contains("heartbeat.interval.ms") {
                ""
            } else {
                "heartbeat.interval.ms = 1000\n"
            },
        );
        let config = dir.join("capture.toml");
        std::fs::write(&config, text)?;
        Ok(Self {
            db,
            prefix,
            offsets_topic,
            dir,
            config,
        })
    }

    /// Points capture at `relay` (in front of MariaDB) instead of the
    /// server itself, from its next start.
    pub(crate) fn through(&self, relay: &Relay) -> Result<()> {
        let text = std::fs::read_to_string(&self.config)?;
        let text: Vec<String> = text
            .lines()
            .map(|line| {
                if line.starts_with("database.hostname = ") {
                    "database.hostname = \"127.0.0.1\"".to_owned()
                } else if line.starts_with("database.port = ") {
                    format!("database.port = {}", relay.addr.port())
                } else {
                    line.to_owned()
                }
            })
            .collect();
        std::fs::write(&self.config, text.join("\n") + "\n")?;
        Ok(())
    }

    pub(crate) fn topic(&self, table: &str) -> String {
        format!("{}.{}.{table}", self.prefix, self.db)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("capture.log")).unwrap_or_default()
    }

    /// Starts capture and waits until its binlog stream is open (a change
    /// committed after that is in its stream).
    pub(crate) async fn start(&self) -> Result<Spawned> {
        let opened = self.log().matches("binlog stream opening").count();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("capture.log"))?;
        let child = Spawned(
            Command::new(env!("CARGO_BIN_EXE_oncely"))
                .args(["capture", "--config"])
                .arg(&self.config)
                .env("RUST_LOG", "info,rdkafka=warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.log().matches("binlog stream opening").count() == opened {
            if Instant::now() > deadline {
                bail!("capture did not open its stream; log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(child)
    }

    /// The change records of `table` committed so far (tombstones left out).
    async fn records(&self, table: &str, at_least: usize) -> Result<Vec<Seen>> {
        let seen = wait_for(&[self.topic(table)], Duration::from_secs(180), |s| {
            s.iter().filter(|r| r.value.is_some()).count() >= at_least
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", self.log()))?;
        Ok(seen.into_iter().filter(|r| r.value.is_some()).collect())
    }
}

/// `(op, id)` of a change record: the key's id, the row's for a keyless one.
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

async fn insert_big_transaction(root: &mut Conn, db: &str) -> Result<()> {
    root.query_drop("BEGIN").await?;
    for chunk in 0..20 {
        let values: Vec<String> = (0..1000)
            .map(|i| format!("({}, {i}, 'big')", 100_000 + chunk * 1000 + i))
            .collect();
        root.query_drop(format!(
            "INSERT INTO {db}.items VALUES {}",
            values.join(", ")
        ))
        .await?;
    }
    root.query_drop("COMMIT").await?;
    Ok(())
}

/// The binlog stream's rate while a test waits to kill capture inside a
/// large transaction: the transaction takes seconds to arrive, so the kill
/// lands inside it however late the test looks (a test that only waited
/// for part of it in Kafka saw it all committed under load).
pub(crate) const BINLOG_HELD: u64 = 16_000;

/// A relay in front of MariaDB for capture's connections.
pub(crate) async fn mariadb_relay() -> Result<Relay> {
    let opts = capture_opts();
    Relay::start(opts.ip_or_hostname(), opts.tcp_port()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_changes_reach_kafka_exactly_once_across_rotation_and_sigkills() -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::new("oncely_mycap", &mut root).await?;
    let relay = mariadb_relay().await?;
    env.through(&relay)?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.items (id int PRIMARY KEY, qty int, note varchar(20))"
    ))
    .await?;
    let mut expected: Vec<(String, i64)> = Vec::new();

    let mut capture = env.start().await?;
    for id in 1..=20 {
        root.query_drop(format!("INSERT INTO {db}.items VALUES ({id}, {id}, 'n')"))
            .await?;
        expected.push(("c".into(), id));
    }
    // Killed once the first changes are in Kafka, before the rest.
    env.records("items", 5).await?;
    kill9(&mut capture);
    for id in 1..=10 {
        root.query_drop(format!(
            "UPDATE {db}.items SET qty = qty + 1 WHERE id = {id}"
        ))
        .await?;
        expected.push(("u".into(), id));
    }
    root.query_drop(format!("UPDATE {db}.items SET id = 1011 WHERE id = 11"))
        .await?;
    expected.push(("d".into(), 11));
    expected.push(("c".into(), 1011));
    for id in 12..=14 {
        root.query_drop(format!("DELETE FROM {db}.items WHERE id = {id}"))
            .await?;
        expected.push(("d".into(), id));
    }
    let mut capture = env.start().await?;
    root.query_drop("FLUSH BINARY LOGS").await?;
    relay.throttle(BINLOG_HELD);
    insert_big_transaction(&mut root, &db).await?;
    expected.extend((0..20_000).map(|i| ("c".to_string(), 100_000 + i)));
    // Killed inside the large transaction: once the topic holds part of
    // it (its end offset counts records of open Kafka transactions too),
    // while the binlog stream is held back so the rest has not arrived.
    let before_big = expected.len() - 20_000;
    wait_for_end_offset(&env.topic("items"), (before_big + 4000) as i64).await?;
    kill9(&mut capture);
    relay.throttle(0);
    let partial = read_committed(&[env.topic("items")])?
        .iter()
        .filter(|r| r.value.is_some())
        .count();
    let _capture = env.start().await?;
    for id in 21..=30 {
        root.query_drop(format!("INSERT INTO {db}.items VALUES ({id}, 0, 'after')"))
            .await?;
        expected.push(("c".into(), id));
    }

    let records = env.records("items", expected.len()).await?;
    let got: Vec<(String, i64)> = records.iter().map(op_and_id).collect();
    assert_eq!(got.len(), expected.len(), "each change once");
    let first_difference = got.iter().zip(&expected).position(|(g, e)| g != e);
    assert_eq!(
        first_difference,
        None,
        "in order, once each; got {:?} around the difference",
        first_difference.map(|i| &got[i.saturating_sub(2)..(i + 3).min(got.len())])
    );
    assert!(
        partial < expected.len() - 10,
        "the kill came inside the large transaction ({partial} records committed then)"
    );

    // Debezium's MySQL envelope.
    let first = records[0].payload().expect("a value");
    assert_eq!(first["op"], "c");
    assert_eq!(first["after"], json!({"id": 1, "qty": 1, "note": "n"}));
    assert_eq!(first["source"]["connector"], "mysql");
    assert_eq!(first["source"]["db"], db.as_str());
    assert_eq!(first["source"]["table"], "items");
    assert!(first["source"]["file"]
        .as_str()
        .is_some_and(|f| !f.is_empty()));
    assert!(first["source"]["pos"].as_i64().is_some_and(|p| p > 0));
    assert_eq!(records[0].key_payload(), Some(&json!({"id": 1})));
    let update = records[20].payload().expect("a value");
    assert_eq!(update["before"]["qty"], 1);
    assert_eq!(update["after"]["qty"], 2);
    // The large transaction spans the rotation's new file.
    let big = records[before_big].payload().expect("a value");
    let small = records[0].payload().expect("a value");
    assert_ne!(big["source"]["file"], small["source"]["file"]);
    let rows: Vec<i64> = records[before_big..before_big + 20_000]
        .iter()
        .map(|r| r.payload().unwrap()["source"]["row"].as_i64().unwrap())
        .collect();
    assert!(rows.iter().any(|&r| r > 0), "rows of one event numbered");
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// A row larger than Kafka takes (a 2 MiB LONGBLOB under a 1 MiB
/// `topic.creation.default.max.message.bytes`) stops capture naming the
/// table, the key, the record's size and the setting, as PostgreSQL's
/// capture does (`capture::topics`): never skipped, never retried in a
/// loop; the row before it is in Kafka, the large one is not.
#[tokio::test]
async fn a_row_larger_than_kafka_takes_stops_mysql_capture_naming_the_setting() -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::with_settings(
        "oncely_mybig",
        &mut root,
        "snapshot.mode = \"no_data\"\ntopic.creation.default.max.message.bytes = 1048576\n",
    )
    .await?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.big (id int PRIMARY KEY, body longblob)"
    ))
    .await?;
    let mut capture = env.start().await?;
    root.query_drop(format!("INSERT INTO {db}.big VALUES (1, 'small')"))
        .await?;
    env.records("big", 1).await?;
    let body: Vec<u8> = (0..2 * 1024 * 1024).map(|_| rand::random::<u8>()).collect();
    root.exec_drop(format!("INSERT INTO {db}.big VALUES (2, ?)"), (body,))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = capture.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            bail!("capture still runs after the large row:\n{}", env.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = env.log();
    assert!(!status.success(), "capture exits non-zero:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("larger than Kafka accepts"))
        .unwrap_or_else(|| panic!("no size error in the log:\n{log}"));
    assert!(line.contains(&format!("{db}.big")), "table named: {line}");
    assert!(
        line.contains("{\"id\":2}") || line.contains("{\\\"id\\\":2}"),
        "key named: {line}"
    );
    assert!(
        line.contains("topic.creation.default.max.message.bytes"),
        "setting named: {line}"
    );
    assert!(
        !log.contains("restarting from the last committed offset"),
        "a definite error is not retried:\n{log}"
    );
    let topic = env.topic("big");
    let seen = tokio::task::spawn_blocking(move || read_committed(&[topic])).await??;
    let ids: Vec<(String, i64)> = seen
        .iter()
        .filter(|r| r.value.is_some())
        .map(op_and_id)
        .collect();
    assert_eq!(ids, [("c".to_string(), 1)]);
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// The state a topic's records leave: each key's last `after`, a delete
/// removing it.
fn final_state(records: &[Seen]) -> BTreeMap<i64, Value> {
    let mut state = BTreeMap::new();
    for r in records.iter().filter(|r| r.value.is_some()) {
        let (op, id) = op_and_id(r);
        match op.as_str() {
            "d" => state.remove(&id),
            _ => state.insert(id, r.payload().expect("a value")["after"].clone()),
        };
    }
    state
}

/// The table's rows as the records' `after` values.
async fn table_state(root: &mut Conn, db: &str) -> Result<BTreeMap<i64, Value>> {
    let rows: Vec<(i64, Option<i64>, Option<String>)> = root
        .query(format!("SELECT id, qty, note FROM {db}.stock"))
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, qty, note)| (id, json!({"id": id, "qty": qty, "note": note})))
        .collect())
}

#[tokio::test]
async fn an_initial_snapshot_killed_midway_under_writes_publishes_each_row_once_and_ends_equal(
) -> Result<()> {
    const ROWS: i64 = 3000;
    let mut root = admin().await;
    let env = MySqlCapture::with_settings(
        "oncely_mysnap",
        &mut root,
        "snapshot.mode = \"initial\"\nincremental.snapshot.chunk.size = 100\n",
    )
    .await?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.stock (id int PRIMARY KEY, qty int, note varchar(20))"
    ))
    .await?;
    root.query_drop("SET SESSION max_recursive_iterations = 100000")
        .await?;
    root.query_drop(format!(
        "INSERT INTO {db}.stock WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) \
         SELECT i, i, 'seed' FROM n"
    ))
    .await?;

    let mut capture = env.start().await?;
    // Writes while the snapshot runs: rows before and after its progress.
    for id in (1..=ROWS).step_by(97) {
        root.query_drop(format!("UPDATE {db}.stock SET qty = -qty WHERE id = {id}"))
            .await?;
    }
    env.records("stock", 600).await?;
    kill9(&mut capture);
    let partial = read_committed(&[env.topic("stock")])?
        .iter()
        .filter(|r| r.op() == Some("r"))
        .count();
    // While capture is down: an update, a delete and an insert on each side.
    root.query_drop(format!(
        "UPDATE {db}.stock SET note = 'down' WHERE id IN (5, {last})",
        last = ROWS - 5
    ))
    .await?;
    root.query_drop(format!(
        "DELETE FROM {db}.stock WHERE id IN (6, {l})",
        l = ROWS - 6
    ))
    .await?;
    root.query_drop(format!(
        "INSERT INTO {db}.stock VALUES ({a}, 1, 'new')",
        a = ROWS + 1
    ))
    .await?;
    let _capture = env.start().await?;
    for id in (2..=ROWS).step_by(89) {
        root.query_drop(format!(
            "UPDATE {db}.stock SET qty = qty + 1000 WHERE id = {id}"
        ))
        .await?;
    }
    let want = table_state(&mut root, &db).await?;
    let records = wait_for(&[env.topic("stock")], Duration::from_secs(240), |seen| {
        final_state(seen) == want
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;

    assert!(
        partial > 0 && partial < ROWS as usize,
        "the kill came inside the snapshot ({partial} of {ROWS} rows read then)"
    );
    let mut reads: BTreeMap<i64, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.op() == Some("r")) {
        *reads.entry(op_and_id(r).1).or_default() += 1;
    }
    let twice: Vec<_> = reads.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows read twice: {twice:?}");
    // A row nothing wrote is in the topic as its snapshot read only.
    let untouched = (1..=ROWS).filter(|id| id % 97 != 1 && id % 89 != 2 && ![5, 6].contains(id));
    let untouched: Vec<i64> = untouched
        .filter(|id| ![ROWS - 5, ROWS - 6].contains(id))
        .collect();
    for id in &untouched {
        assert_eq!(reads.get(id), Some(&1), "row {id} read once");
    }
    let first = records.iter().find(|r| r.op() == Some("r")).unwrap();
    let source = &first.payload().unwrap()["source"];
    assert_eq!(source["connector"], "mysql");
    assert!(
        [
            "true",
            "first",
            "last",
            "first_in_data_collection",
            "last_in_data_collection"
        ]
        .contains(&source["snapshot"].as_str().unwrap_or_default()),
        "{source}"
    );
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// A Debezium `execute-snapshot` signal row in the signal table snapshots
/// a table capture streams (incremental, chunked, while writes go on);
/// one naming no table is refused in the log and changes nothing.
#[tokio::test]
async fn an_execute_snapshot_signal_snapshots_a_streamed_table_under_writes() -> Result<()> {
    const ROWS: i64 = 1500;
    let mut root = admin().await;
    let env = MySqlCapture::with_signals(
        "oncely_mysig",
        &mut root,
        "snapshot.mode = \"no_data\"\nincremental.snapshot.chunk.size = 100\n",
    )
    .await?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.stock (id int PRIMARY KEY, qty int, note varchar(20))"
    ))
    .await?;
    root.query_drop("SET SESSION max_recursive_iterations = 100000")
        .await?;
    root.query_drop(format!(
        "INSERT INTO {db}.stock WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) \
         SELECT i, i, 'seed' FROM n"
    ))
    .await?;
    let _capture = env.start().await?;
    root.query_drop(format!(
        "INSERT INTO {db}.signals VALUES ('nope', 'execute-snapshot', '{{\"data-collections\": [\"{db}.nope\"]}}'), \
         ('snap-1', 'execute-snapshot', '{{\"data-collections\": [\"{db}.stock\"], \"type\": \"incremental\"}}')"
    ))
    .await?;
    for id in (1..=ROWS).step_by(37) {
        root.query_drop(format!("UPDATE {db}.stock SET qty = -qty WHERE id = {id}"))
            .await?;
    }
    root.query_drop(format!(
        "DELETE FROM {db}.stock WHERE id IN (3, {l})",
        l = ROWS - 3
    ))
    .await?;
    let want = table_state(&mut root, &db).await?;
    let records = wait_for(&[env.topic("stock")], Duration::from_secs(180), |seen| {
        final_state(seen) == want
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    let reads = records.iter().filter(|r| r.op() == Some("r")).count();
    assert!(
        reads >= ROWS as usize - 2 - ROWS as usize / 37 - 1,
        "the signal snapshotted the table ({reads} reads)"
    );
    assert!(
        env.log()
            .contains(&format!("no table `{db}`.`nope` on the server")),
        "the bad signal is refused with its reason in the log"
    );
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// A column dropped and added again under its name and type between two
/// snapshot passes of a table in one capture process: the second pass's
/// chunks have the first's shape, but their `c` is another column (number
/// 3, not the dropped 2), which sinks match columns by.
#[tokio::test]
async fn a_column_dropped_and_added_again_between_two_snapshot_passes_is_numbered_anew(
) -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::with_signals(
        "oncely_myreadd",
        &mut root,
        "snapshot.mode = \"no_data\"\nincremental.snapshot.chunk.size = 2\n\
         schema.change.backfill = \"off\"\n",
    )
    .await?;
    let db = env.db.clone();
    let _capture = env.start().await?;
    // Created while capture streams, so the shape facts number its columns.
    root.query_drop(format!("CREATE TABLE {db}.t (id int PRIMARY KEY, c int)"))
        .await?;
    root.query_drop(format!("INSERT INTO {db}.t VALUES (1, 1), (2, 2), (3, 3)"))
        .await?;
    let signal = |id: &str| {
        format!(
            "INSERT INTO {db}.signals VALUES ('{id}', 'execute-snapshot', \
             '{{\"data-collections\": [\"{db}.t\"], \"type\": \"incremental\"}}')"
        )
    };
    root.query_drop(signal("snap-1")).await?;
    let first = env.records("t", 6).await?;
    let numbers: Vec<_> = first
        .iter()
        .filter(|r| r.op() == Some("r"))
        .map(|r| r.after_attnum("c"))
        .collect();
    assert_eq!(numbers, vec![Some("2".to_owned()); 3], "the first pass");
    root.query_drop(format!("ALTER TABLE {db}.t DROP c"))
        .await?;
    root.query_drop(format!("ALTER TABLE {db}.t ADD c int"))
        .await?;
    root.query_drop(format!("UPDATE {db}.t SET c = -id"))
        .await?;
    root.query_drop(signal("snap-2")).await?;
    // 3 inserts, 3 reads, 3 updates, 3 reads; a row's records are in one
    // partition.
    let all = env.records("t", 12).await?;
    let mut reads: BTreeMap<i64, Vec<(i64, Option<String>)>> = BTreeMap::new();
    for r in all.iter().filter(|r| r.op() == Some("r")) {
        let (_, id) = op_and_id(r);
        reads
            .entry(id)
            .or_default()
            .push((r.offset, r.after_attnum("c")));
    }
    let numbers: BTreeMap<i64, Vec<Option<String>>> = reads
        .into_iter()
        .map(|(id, mut seen)| {
            seen.sort();
            (id, seen.into_iter().map(|(_, n)| n).collect())
        })
        .collect();
    let both = vec![Some("2".to_owned()), Some("3".to_owned())];
    assert_eq!(
        numbers,
        (1..=3)
            .map(|id| (id, both.clone()))
            .collect::<BTreeMap<_, _>>(),
        "each row's second read names the column added again (3), not the dropped one (2); \
         capture log:\n{}",
        env.log()
    );
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// The capture user as a grantee (`'user'@'host'`), to grant it a write.
pub(crate) async fn capture_grantee() -> Result<String> {
    let user: String = Conn::new(capture_opts())
        .await?
        .query_first("SELECT CURRENT_USER()")
        .await?
        .unwrap_or_default();
    let (name, host) = user.rsplit_once('@').unwrap_or((&user, "%"));
    Ok(format!("'{name}'@'{host}'"))
}

/// A capture metric's value as `/metrics` at `addr` shows it, if shown.
async fn metric(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = oncely_core::endpoint::get(addr, "/metrics").await.ok()?;
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Polls metric `name` at `addr` until `ok` holds for its value.
async fn wait_metric(
    addr: std::net::SocketAddr,
    name: &str,
    within: Duration,
    ok: impl Fn(f64) -> bool,
) -> Result<f64> {
    let deadline = Instant::now() + within;
    loop {
        let value = metric(addr, name).await;
        if let Some(v) = value.filter(|v| ok(*v)) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{name} at {addr} is {value:?} after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The heartbeat on MySQL: right after a restart it reports the binlog
/// written while capture was down (from the stored position to the
/// server's end, across a `FLUSH BINARY LOGS`) as the bytes the server must
/// keep for it, then, once caught up, only what came after its last commit;
/// and with `heartbeat.action.query` writing a table capture does not
/// capture, an idle capture commits heartbeat offsets.
#[tokio::test]
async fn the_heartbeat_reports_the_binlog_capture_needs_and_commits_when_idle() -> Result<()> {
    const NAME: &str = "oncely_capture_binlog_retained_bytes";
    let addr = crate::harness::common::free_addr();
    let mut root = admin().await;
    let env = MySqlCapture::with_settings(
        "oncely_myhb",
        &mut root,
        &format!(
            "snapshot.mode = \"no_data\"\nmetrics.listen = \"{addr}\"\n\
             table.include.list = \"{{db}}\\\\.orders\"\nheartbeat.interval.ms = 4000\n\
             heartbeat.action.query = \"INSERT INTO {{db}}.beat VALUES (1, NOW(6)) ON DUPLICATE KEY UPDATE at = NOW(6)\"\n"
        ),
    )
    .await?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.orders (id int PRIMARY KEY, pad varchar(250)); \
         CREATE TABLE {db}.beat (id int PRIMARY KEY, at datetime(6))"
    ))
    .await?;
    // The heartbeat row is the capture user's one write.
    let grantee = capture_grantee().await?;
    root.query_drop(format!("GRANT INSERT, UPDATE ON {db}.beat TO {grantee}"))
        .await?;
    let mut capture = env.start().await?;
    root.query_drop(format!("INSERT INTO {db}.orders VALUES (1, 'a')"))
        .await?;
    env.records("orders", 1).await?;
    wait_metric(
        addr,
        "oncely_capture_heartbeats_total",
        Duration::from_secs(30),
        |v| v > 0.0,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    kill9(&mut capture);

    root.query_drop("SET SESSION max_recursive_iterations = 100000")
        .await?;
    root.query_drop(format!(
        "INSERT INTO {db}.orders WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < 1001) \
         SELECT i, REPEAT('x', 250) FROM n"
    ))
    .await?;
    root.query_drop("FLUSH BINARY LOGS").await?;
    root.query_drop(format!("UPDATE {db}.orders SET pad = REPEAT('y', 250)"))
        .await?;
    // 1000 inserted and 1001 updated full images of 250 bytes and more.
    let written = 250.0 * 3000.0;
    let _capture = env.start().await?;
    let first = wait_metric(addr, NAME, Duration::from_secs(4), |v| v > 0.0)
        .await
        .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    assert!(
        first >= written,
        "the first heartbeat after the restart counts the binlog written while capture was down: {first} < {written}"
    );
    // Caught up, the figure is what reached the binlog after the last
    // commit: the last heartbeat's row, and whatever other tests on the
    // shared server wrote in one heartbeat interval, far below the backlog.
    let caught_up = wait_metric(addr, NAME, Duration::from_secs(60), |v| v < written / 2.0)
        .await
        .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    assert!(caught_up > 0.0, "the last heartbeat's own row is behind");
    env.records("orders", 2002).await?;
    let _ = root
        .query_drop(format!("REVOKE INSERT, UPDATE ON {db}.beat FROM {grantee}"))
        .await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// Waits until partition 0 of `topic` ends at `offset` or later (records
/// of open Kafka transactions count).
pub(crate) async fn wait_for_end_offset(topic: &str, offset: i64) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", unique("watermarks"))
        .create()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // The topic appears with capture's first records.
        let high = consumer
            .fetch_watermarks(topic, 0, Duration::from_secs(5))
            .map_or(-1, |(_, high)| high);
        if high >= offset {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{topic} ends at {high}, not yet {offset}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The offset record on `topic` last written (JSON).
fn last_offset(topic: &str) -> Result<(Vec<u8>, Value)> {
    let seen = read_committed(&[topic.to_owned()])?;
    let last = seen
        .into_iter()
        .rev()
        .find(|r| r.value.is_some())
        .ok_or_else(|| anyhow::anyhow!("no offset record on {topic}"))?;
    let key = serde_json::to_vec(&last.key.expect("a key"))?;
    Ok((key, last.value.expect("a value")))
}

#[tokio::test]
async fn a_stored_position_in_a_purged_binlog_stops_the_start_with_the_fix() -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::new("oncely_mypurge", &mut root).await?;
    let db = env.db.clone();
    root.query_drop(format!("CREATE TABLE {db}.items (id int PRIMARY KEY)"))
        .await?;
    let mut capture = env.start().await?;
    root.query_drop(format!("INSERT INTO {db}.items VALUES (1)"))
        .await?;
    env.records("items", 1).await?;
    kill9(&mut capture);

    // The stored record moved to a binlog older than the server keeps
    // (number 0: never on a server whose first binlog is number 1), its
    // order keys with it, as capture would have written it there.
    let (key, mut value) = last_offset(&env.offsets_topic)?;
    let part = &mut value["source"]["mysql"]["position"];
    let file = part["file"].as_str().expect("a binlog file").to_owned();
    let base = file.rsplit_once('.').expect("name.number").0;
    *part = json!({"file": format!("{base}.000000"), "pos": 4});
    value["commit_lsn"] = json!(0);
    value["events"] = json!(0);
    value["complete"] = json!(true);
    value["flush_lsn"] = json!(4);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()?;
    let payload = serde_json::to_vec(&value)?;
    producer
        .send(
            BaseRecord::to(&env.offsets_topic)
                .key(&key)
                .payload(&payload)
                .partition(0),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;

    let before = env.log().len();
    let mut child = Spawned(
        Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(["capture", "--config"])
            .arg(&env.config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(env.dir.join("purged.stderr"))?)
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.0.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("capture did not stop on a purged position");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stderr = std::fs::read_to_string(env.dir.join("purged.stderr"))?;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{base}.000000:4")) && stderr.contains("purged"),
        "{stderr}"
    );
    assert!(
        stderr.contains("new snapshot") && stderr.contains("binlog_expire_logs_seconds"),
        "the fix named: {stderr}"
    );
    assert_eq!(
        env.log().len(),
        before,
        "the first capture's log is untouched"
    );
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}

/// The three sinks fill the warehouse, the index and the cache from the
/// topic MySQL capture writes, across a column added, one widened and one
/// renamed while streaming, and `oncely verify` (`source = "mysql"`,
/// waiting for capture's committed offset) finds every target equal to
/// MariaDB; a row changed afterwards with only capture stopped is then
/// reported, so the comparison is not vacuous. The names are a hostile
/// user's: a database name with `-`, a space and a non-ASCII letter, a
/// table name with a space and a dot, column names with a backtick, a dot,
/// a space, a reserved word and 22 CJK characters (66 bytes: PostgreSQL
/// keeps 63; on main the warehouse left that column null and verify said
/// so).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sinks_fill_every_target_from_mysql_capture_and_verify_says_equal() -> Result<()> {
    let mut root = admin().await;
    let db = format!("{}-ü x", unique("oncely_mye2e"));
    let q = |name: &str| format!("`{}`", name.replace('`', "``"));
    root.query_drop(format!("CREATE DATABASE {}", q(&db)))
        .await?;
    let table = format!("{}.{}", q(&db), q("Order Items.v2"));
    root.query_drop(format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, `select` int, price decimal(10,2), \
         `no``te.ü x` varchar(20), doc json, at datetime(6), {} int)",
        q(&"日".repeat(22))
    ))
    .await?;
    // Keys MariaDB compares without case and trailing spaces ('a' = 'A' =
    // 'a '), which PostgreSQL, Elasticsearch and Redis compare as bytes.
    let ci = format!("{}.{}", q(&db), q("ci keys"));
    root.query_drop(format!(
        "CREATE TABLE {ci} (k varchar(20) COLLATE utf8mb4_general_ci PRIMARY KEY, v int)"
    ))
    .await?;
    let p = mysql_pipeline(
        "mye2e",
        &db,
        &["Order Items.v2", "ci keys"],
        "snapshot.mode = \"no_data\"\n",
    )
    .await?;
    let result = fill_and_verify(&mut root, &p, (&table, &ci)).await;
    let _ = root.query_drop(format!("DROP DATABASE {}", q(&db))).await;
    p.cleanup().await;
    result
}

/// A [`Pipeline`] whose capture reads database `db` of the MariaDB of
/// `scripts/services` (`capture_extra` appended to its config) and whose
/// sinks consume the topics of `tables` in it; the warehouse, index and
/// cache as for PostgreSQL.
pub(crate) async fn mysql_pipeline(
    name: &str,
    db: &str,
    tables: &[&str],
    capture_extra: &str,
) -> Result<Pipeline> {
    let mut p = Pipeline::with_topics(name, "", "", |prefix| {
        tables
            .iter()
            .map(|t| sanitize_topic(&format!("{prefix}.{db}.{t}")))
            .collect()
    })
    .await?;
    let opts = capture_opts();
    p.capture_config = p.env.write_config(
        "capture-mysql.toml",
        &format!(
            "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
             database.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.password = \"{pass}\"\n\
             database.include.list = \"{db}\"\ndatabase.server.id = {id}\n\
             kafka.bootstrap.servers = \"{brokers}\"\n\
             heartbeat.interval.ms = 500\n{capture_extra}",
            prefix = p.env.prefix,
            host = opts.ip_or_hostname(),
            port = opts.tcp_port(),
            user = opts.user().unwrap_or_default(),
            pass = opts.pass().unwrap_or_default(),
            id = server_id(),
            brokers = kafka_brokers(),
        ),
    )?;
    Ok(p)
}

/// Verify's finding repaired on a MySQL source: rows changed with their
/// binlog events skipped (`sql_log_bin = 0`, as a restore or a manual fix
/// can leave them) make every target differ, `oncely verify` says so,
/// `oncely capture snapshot --table` inserts an `execute-snapshot` signal
/// into the signal table in MariaDB, and the running capture's snapshot
/// of the table makes every target equal again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_verify_finds_differing_is_repaired_by_a_snapshot_signal() -> Result<()> {
    let mut root = admin().await;
    let db = unique("oncely_myrepair");
    root.query_drop(format!(
        "CREATE DATABASE {db}; \
         CREATE TABLE {db}.orders (id bigint PRIMARY KEY, qty int, note varchar(20)); \
         CREATE TABLE {db}.signals {SIGNAL_TABLE_COLUMNS}"
    ))
    .await?;
    let grantee = capture_grantee().await?;
    root.query_drop(format!("GRANT INSERT ON {db}.signals TO {grantee}"))
        .await?;
    let p = mysql_pipeline(
        "myrepair",
        &db,
        &["orders"],
        &format!(
            "snapshot.mode = \"no_data\"\nsignal.data.collection = \"{db}.signals\"\nincremental.snapshot.chunk.size = 16\n"
        ),
    )
    .await?;
    let result = repair(&mut root, &p, &db).await;
    let _ = root
        .query_drop(format!("REVOKE INSERT ON {db}.signals FROM {grantee}"))
        .await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    p.cleanup().await;
    result
}

async fn repair(root: &mut Conn, p: &Pipeline, db: &str) -> Result<()> {
    let _capture = p.spawn_capture()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.env.capture_log().contains("binlog stream opening") {
        if Instant::now() > deadline {
            bail!("capture did not open its stream:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _sinks = (0..3)
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    for id in 1..=60 {
        root.query_drop(format!(
            "INSERT INTO {db}.orders VALUES ({id}, {id}, 'n{id}')"
        ))
        .await?;
    }
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "{}", summary(&report));

    // Out of the binlog's sight: no target can follow.
    let mut quiet = admin().await;
    quiet
        .query_drop(format!(
            "SET SESSION sql_log_bin = 0; \
             UPDATE {db}.orders SET qty = -1, note = 'unseen' WHERE id IN (7, 40); \
             INSERT INTO {db}.orders VALUES (61, 61, 'unseen')"
        ))
        .await?;
    drop(quiet);
    let report = p.verify(Duration::from_secs(120)).await?;
    assert_eq!(
        (report.differing(), report.compared()),
        (3, 3),
        "every target differs: {}",
        summary(&report)
    );

    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(&p.capture_config)
        .args(["--table", &format!("{db}.orders")])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(
        report.is_equal(),
        "{}\ncapture log:\n{}",
        summary(&report),
        p.env.capture_log()
    );
    Ok(())
}

/// `tables`: the main table and one with a case-insensitive text key.
async fn fill_and_verify(root: &mut Conn, p: &Pipeline, tables: (&str, &str)) -> Result<()> {
    let (table, ci) = tables;
    let capture = p.spawn_capture()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.env.capture_log().contains("binlog stream opening") {
        if Instant::now() > deadline {
            bail!("capture did not open its stream:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sinks = (0..3)
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    for id in 1..=50 {
        root.query_drop(format!(
            "INSERT INTO {table} VALUES ({id}, {id}, {id}.25, 'n{id}', '{{\"k\": {id}}}', \
             '2024-05-06 07:08:09.{id:06}', -{id})"
        ))
        .await?;
    }
    root.query_drop(format!(
        "UPDATE {table} SET `select` = `select` * 2, `no``te.ü x` = NULL WHERE id <= 10"
    ))
    .await?;
    root.query_drop("FLUSH BINARY LOGS").await?;
    root.query_drop(format!("UPDATE {table} SET id = 1000 WHERE id = 11"))
        .await?;
    root.query_drop(format!("DELETE FROM {table} WHERE id BETWEEN 20 AND 24"))
        .await?;
    // DDL while streaming: a column added, one widened past its old range,
    // one renamed.
    root.query_drop(format!("ALTER TABLE {table} ADD COLUMN extra int"))
        .await?;
    root.query_drop(format!("UPDATE {table} SET extra = id * 3 WHERE id > 40"))
        .await?;
    root.query_drop(format!("ALTER TABLE {table} MODIFY `select` bigint"))
        .await?;
    root.query_drop(format!(
        "UPDATE {table} SET `select` = 5000000000 WHERE id = 45"
    ))
    .await?;
    root.query_drop(format!(
        "ALTER TABLE {table} RENAME COLUMN `no``te.ü x` TO `new.name`"
    ))
    .await?;
    root.query_drop(format!(
        "UPDATE {table} SET `new.name` = 'renamed' WHERE id = 46"
    ))
    .await?;
    for k in ["a", "B", "c ", "d", "É", "f"] {
        root.exec_drop(format!("INSERT INTO {ci} VALUES (?, 1)"), (k,))
            .await?;
    }
    // A key update to a key MariaDB holds equal ('a' to 'A', 'd' to
    // 'd '), one found by another spelling, a delete by one.
    for stmt in [
        "UPDATE {ci} SET k = 'A' WHERE k = 'a'",
        "UPDATE {ci} SET k = 'd ' WHERE k = 'D'",
        "UPDATE {ci} SET v = 2 WHERE k = 'b'",
        "UPDATE {ci} SET v = 3 WHERE k = 'C'",
        "DELETE FROM {ci} WHERE k = 'e'",
    ] {
        root.query_drop(stmt.replace("{ci}", ci)).await?;
    }
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    let letters = dead_letters(&p.env.prefix)?;
    assert!(
        report.is_equal() && letters.is_empty(),
        "{}\ndead letters: {letters:?}\ncapture log:\n{}",
        summary(&report),
        p.env.capture_log()
    );
    assert_eq!(report.compared(), 6, "{}", summary(&report));

    // Capture stopped: a change no target follows is reported in each.
    drop(capture);
    root.query_drop(format!("UPDATE {table} SET `select` = -1 WHERE id = 30"))
        .await?;
    let report = p
        .verify_without_capture_offset(Duration::from_secs(60))
        .await?;
    assert!(!report.is_equal(), "{}", summary(&report));
    drop(sinks);
    Ok(())
}
