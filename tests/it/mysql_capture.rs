//! `oncely capture` with `source = "mysql"` against the MariaDB of
//! `scripts/services`: inserts, updates, a primary-key update, deletes, a
//! `FLUSH BINARY LOGS` and a 20,000-row transaction reach
//! `<topic.prefix>.<database>.<table>` once each, in order, in Debezium's
//! MySQL envelope, while capture is SIGKILLed and restarted twice (once
//! inside the large transaction); and a stored position in a purged binlog
//! stops the start with the fix. The server is shared with other tests:
//! each test has a database, topic prefix and replica id of its own.

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

use crate::harness::capture::{kill9, read_committed, wait_for, Seen, Spawned};
use crate::harness::common::{kafka_brokers, unique};
use crate::mysql_binlog::{admin, capture_opts, server_id};

/// One test's database, topics and capture configuration.
struct MySqlCapture {
    db: String,
    prefix: String,
    offsets_topic: String,
    dir: PathBuf,
    config: PathBuf,
}

impl MySqlCapture {
    async fn new(name: &str, root: &mut Conn) -> Result<Self> {
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
             snapshot.mode = \"no_data\"\nbatch.max.events = 1000\nheartbeat.interval.ms = 1000\n",
            host = opts.ip_or_hostname(),
            port = opts.tcp_port(),
            user = opts.user().unwrap_or_default(),
            pass = opts.pass().unwrap_or_default(),
            id = server_id(),
            brokers = kafka_brokers(),
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

    fn topic(&self, table: &str) -> String {
        format!("{}.{}.{table}", self.prefix, self.db)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("capture.log")).unwrap_or_default()
    }

    /// Starts capture and waits until its binlog stream is open (a change
    /// committed after that is in its stream).
    async fn start(&self) -> Result<Spawned> {
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

#[tokio::test]
async fn mysql_changes_reach_kafka_exactly_once_across_rotation_and_sigkills() -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::new("oncely_mycap", &mut root).await?;
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
    insert_big_transaction(&mut root, &db).await?;
    expected.extend((0..20_000).map(|i| ("c".to_string(), 100_000 + i)));
    // Killed inside the large transaction: once the topic holds part of
    // it (its end offset counts records of open Kafka transactions too).
    let before_big = expected.len() - 20_000;
    wait_for_end_offset(&env.topic("items"), (before_big + 4000) as i64).await?;
    kill9(&mut capture);
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

/// Waits until partition 0 of `topic` ends at `offset` or later.
async fn wait_for_end_offset(topic: &str, offset: i64) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", unique("watermarks"))
        .create()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(5))?;
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
