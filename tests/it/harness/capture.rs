//! Test harness for capture: a fresh database per test, a capture process
//! that can be SIGKILLed, and a `read_committed` reader of its topics.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use tokio_postgres::{Client, NoTls};

use crate::harness::common;

/// A database of its own, with a unique slot, topic prefix and offsets topic.
pub struct CaptureEnv {
    pub dbname: String,
    pub prefix: String,
    pub slot: String,
    pub offsets_topic: String,
    pub dir: PathBuf,
    pub client: Client,
    pub pg_host: String,
    pub pg_port: u16,
    pub pg_user: String,
    /// The `RUST_LOG` filter capture runs with: `$ONCELY_TEST_CAPTURE_LOG`
    /// or `info,rdkafka=warn`. A test wanting more sets it here, never in the
    /// environment, which every test of this process shares.
    pub capture_log: String,
}

impl CaptureEnv {
    pub async fn new(name: &str) -> Result<Self> {
        let admin = connect(&common::pg_url()).await?;
        let dbname = common::unique(name);
        admin
            .batch_execute(&format!("CREATE DATABASE {dbname}"))
            .await?;
        let url: tokio_postgres::Config = common::pg_url().parse()?;
        let pg_host = match url.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_string(),
        };
        let pg_port = url.get_ports().first().copied().unwrap_or(5432);
        let pg_user = url.get_user().unwrap_or("postgres").to_string();
        let client = connect(&db_url(&dbname)).await?;
        let dir = std::env::temp_dir().join(&dbname);
        std::fs::create_dir_all(&dir)?;
        Ok(CaptureEnv {
            prefix: dbname.replace('_', "-"),
            slot: dbname.clone(),
            offsets_topic: format!("{}-offsets", dbname.replace('_', "-")),
            dbname,
            dir,
            client,
            pg_host,
            pg_port,
            pg_user,
            capture_log: std::env::var("ONCELY_TEST_CAPTURE_LOG")
                .unwrap_or_else(|_| "info,rdkafka=warn".into()),
        })
    }

    /// A new connection to this test's database.
    pub async fn connect(&self) -> Result<Client> {
        connect(&db_url(&self.dbname)).await
    }

    /// The capture config; `extra` lines are appended (later keys win only
    /// where TOML allows, so pass keys not set here). Unless `extra` sets
    /// `snapshot.mode`, it is `no_data`: tests that count streamed events
    /// create their tables before capture starts and want no snapshot rows.
    pub fn config(&self, extra: &str) -> String {
        let mode = if extra.contains("snapshot.mode") {
            ""
        } else {
            "snapshot.mode = \"no_data\"\n"
        };
        format!(
            "{mode}{}",
            self.config_as(&self.prefix, &self.slot, &self.offsets_topic, extra)
        )
    }

    /// A config for another connector on this database: its own topic
    /// prefix (and connector name), slot and offsets topic.
    pub fn config_as(&self, prefix: &str, slot: &str, offsets: &str, extra: &str) -> String {
        format!(
            "topic.prefix = \"{prefix}\"\n\
             database.hostname = \"{host}\"\ndatabase.port = {port}\ndatabase.user = \"{user}\"\n\
             database.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"{offsets}\"\n{extra}\n",
            host = self.pg_host,
            port = self.pg_port,
            user = self.pg_user,
            db = self.dbname,
            brokers = common::kafka_brokers(),
        )
    }

    pub fn write_config(&self, file: &str, text: &str) -> Result<PathBuf> {
        let path = self.dir.join(file);
        std::fs::write(&path, text)?;
        Ok(path)
    }

    pub fn topic(&self, table: &str) -> String {
        format!("{}.public.{table}", self.prefix)
    }

    /// Starts `oncely capture` with a config, its log appended to `capture.log`
    /// (at [`Self::capture_log`]).
    /// The process is killed when the returned guard drops, so a failing test
    /// leaves nothing running.
    pub fn spawn_capture(&self, config: &PathBuf) -> Result<Spawned> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("capture.log"))?;
        Ok(Spawned(
            Command::new(env!("CARGO_BIN_EXE_oncely"))
                .args(["capture", "--config"])
                .arg(config)
                .env("RUST_LOG", &self.capture_log)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        ))
    }

    /// Runs `oncely capture` with `config(extra)` until it exits: (success,
    /// stderr). One still running after `timeout` is killed and reported as
    /// a failure whose text says so (a start-up that should have been refused).
    pub fn run_capture(&self, extra: &str, timeout: Duration) -> Result<(bool, String)> {
        self.run_capture_with(&self.config(extra), timeout)
    }

    /// [`Self::run_capture`] with a whole config `text`.
    pub fn run_capture_with(&self, text: &str, timeout: Duration) -> Result<(bool, String)> {
        let n = rand::random::<u32>();
        let path = self.write_config(&format!("capture-{n}.toml"), text)?;
        let err_path = self.dir.join(format!("capture-{n}.stderr"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(["capture", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err_path)?)
            .spawn()?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if Instant::now() > deadline {
                kill9(&mut child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        Ok(match status {
            Some(s) => (s.success(), stderr),
            None => (
                false,
                format!("capture was still running after {timeout:?}:\n{stderr}"),
            ),
        })
    }

    /// Waits until the capture's slot exists and is in use (streaming).
    /// A slot is also "active" while `pg_create_logical_replication_slot`
    /// builds it, and a change committed then is before its start: only a
    /// walsender holding it means the stream runs. Building a slot waits for
    /// every transaction running on the server (other tests' too): up to 2 min.
    pub async fn wait_slot_active(&self) -> Result<()> {
        self.wait_named_slot_active(&self.slot).await
    }

    /// [`Self::wait_slot_active`] for another connector's slot on this database.
    pub async fn wait_named_slot_active(&self, slot: &str) -> Result<()> {
        for _ in 0..1200 {
            let row = self.client.query_opt(ACTIVE_SLOT, &[&slot]).await?;
            if row.map(|r| r.get::<_, bool>(0)).unwrap_or(false) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "slot {slot} never became active; log:\n{}",
            self.capture_log()
        )
    }

    /// [`wait_for`], its error carrying this capture's log, so a timeout
    /// under load says what capture was doing.
    pub async fn wait_for(
        &self,
        topics: &[String],
        timeout: Duration,
        done: impl Fn(&[Seen]) -> bool,
    ) -> Result<Vec<Seen>> {
        let waited = wait_for(topics, timeout, done).await;
        if let Err(e) = &waited {
            self.report_uncaptured(&format!("{e:#}"));
        }
        waited.with_context(|| format!("capture log:\n{}", self.capture_log()))
    }

    /// Writes a failed wait and the tail of capture's log straight to
    /// stderr, past the test harness's capture: a failure in CI is then
    /// explained beside the test's FAILED line, not only in the summary.
    pub fn report_uncaptured(&self, what: &str) {
        use std::io::Write;
        let log = self.capture_log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        let what: String = what.chars().take(4000).collect();
        let _ = writeln!(
            std::io::stderr(),
            "---- {}: {what}\n---- the last lines of its capture log:\n{tail}\n----",
            self.dbname
        );
    }

    pub fn capture_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("capture.log")).unwrap_or_default()
    }

    /// The slot's confirmed flush position.
    pub async fn confirmed_flush(&self) -> Result<u64> {
        let row = self
            .client
            .query_one(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Drops a slot of this database, waiting for its walsender to go.
    pub async fn drop_slot(&self, slot: &str) {
        let admin = match connect(&common::pg_url()).await {
            Ok(c) => c,
            Err(_) => return,
        };
        for attempt in 0..50 {
            // A test's capture guard often outlives its cleanup call: after
            // 5 s its walsender is ended, or the slot (and the WAL it holds)
            // would outlive the test.
            if attempt >= 25 {
                let _ = admin
                    .execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active",
                        &[&slot],
                    )
                    .await;
            }
            let r = admin
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
                    &[&slot],
                )
                .await;
            let gone = admin
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .map(|r| r.is_none())
                .unwrap_or(false);
            if r.is_ok() && gone {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Drops every slot of this database (waiting for their walsenders to
    /// go) and the database.
    pub async fn cleanup(self) {
        self.drop_slot(&self.slot).await;
        let others = self
            .client
            .query(
                "SELECT slot_name::text FROM pg_replication_slots WHERE database = $1",
                &[&self.dbname],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect())
            .unwrap_or_else(|_| Vec::new());
        for slot in others {
            self.drop_slot(&slot).await;
        }
        let admin = match connect(&common::pg_url()).await {
            Ok(c) => c,
            Err(_) => return,
        };
        drop(self.client);
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.dbname
            ))
            .await;
    }
}

/// Whether a walsender (not the backend creating it) holds the slot.
pub const ACTIVE_SLOT: &str = "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)";

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct Spawned(pub Child);

impl std::ops::Deref for Spawned {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn db_url(dbname: &str) -> String {
    let base = common::pg_url();
    match base.rfind('/') {
        Some(i) if base[..i].contains("@") || base[..i].ends_with(|c: char| c.is_ascii_digit()) => {
            format!("{}/{dbname}", &base[..i])
        }
        _ => format!("{base}/{dbname}"),
    }
}

pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Sends SIGKILL (no chance to clean up) and reaps the process.
pub fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends SIGTERM and waits for the exit status.
pub fn terminate(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let pid = child.id() as i32;
    // SAFETY-free: the `kill` command avoids a libc dependency.
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            kill9(child);
            bail!("process {pid} did not exit within {timeout:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One record as a `read_committed` consumer sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Value>,
    pub value: Option<Value>,
}

impl Seen {
    /// The payload of a `{schema, payload}` value, or the value itself.
    pub fn payload(&self) -> Option<&Value> {
        self.value.as_ref().map(|v| v.get("payload").unwrap_or(v))
    }

    pub fn key_payload(&self) -> Option<&Value> {
        self.key.as_ref().map(|v| v.get("payload").unwrap_or(v))
    }

    pub fn op(&self) -> Option<&str> {
        self.payload().and_then(|p| p["op"].as_str())
    }

    /// The source column number (`__oncely.attnum`) the value's schema
    /// gives `column` of its row (`after`); `None` without a schema.
    pub fn after_attnum(&self, column: &str) -> Option<String> {
        let after = self.value.as_ref()?["schema"]["fields"]
            .as_array()?
            .iter()
            .find(|f| f["field"] == "after")?;
        let field = after["fields"]
            .as_array()?
            .iter()
            .find(|f| f["field"] == column)?;
        field["parameters"]["__oncely.attnum"]
            .as_str()
            .map(str::to_owned)
    }
}

/// A `read_committed` consumer of a group of its own (`<group>_<random>`)
/// that commits nothing and reports each partition's end.
pub fn committed_reader(group: &str) -> Result<BaseConsumer> {
    reader(group, "read_committed")
}

/// A consumer of a unique group in `group`'s name that reports partition
/// ends and reads as `isolation` says (`read_committed` or
/// `read_uncommitted`).
fn reader(group: &str, isolation: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .set("group.id", common::unique(group))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .create()?)
}

/// The topics in Kafka whose names `wanted` accepts.
pub fn topics_where(wanted: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let metadata = committed_reader("topics")?.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| wanted(name))
        .collect())
}

/// Hands `each` every record of every partition of `topics` (those that
/// exist) from its start to where an `isolation` reader ends now; fails
/// once `within` has passed.
///
/// One topic at a time, each with its own consumer: librdkafka's
/// end-of-partition event names the partition number but not its topic,
/// and comes again for a partition when records arrive after it, so
/// counting events could end a read of several topics (or of one while it
/// is written) before some partition was read. With one topic assigned,
/// the set of partition numbers that reached their end says it exactly.
pub fn read_to_end(
    isolation: &str,
    topics: &[String],
    within: Duration,
    mut each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let metadata = committed_reader("topics")?.fetch_metadata(None, Duration::from_secs(10))?;
    for topic in topics {
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            continue;
        };
        let partitions: std::collections::HashSet<i32> =
            found.partitions().iter().map(|p| p.id()).collect();
        if partitions.is_empty() {
            continue;
        }
        let consumer = reader("reader", isolation)?;
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let mut ended = std::collections::HashSet::new();
        while ended != partitions {
            if Instant::now() > deadline {
                bail!("reading {topic} did not reach its end in {within:?} (partitions ended: {ended:?})");
            }
            match consumer.poll(Duration::from_millis(500)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    ended.insert(p);
                }
                Some(Err(e)) => bail!("read {topic}: {e}"),
                Some(Ok(m)) => each(&m)?,
            }
        }
    }
    Ok(())
}

/// The raw keys and values of the first `n` records of `topic` (partition 0)
/// that have both.
pub fn raw_records(topic: &str, n: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let consumer = committed_reader("raw")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        if Instant::now() > deadline {
            bail!("read {} of {n} records of {topic}", out.len());
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                out.push((k.to_vec(), v.to_vec()));
            }
        }
    }
    Ok(out)
}

/// Everything committed on `topics`, read from the start.
pub fn read_committed(topics: &[String]) -> Result<Vec<Seen>> {
    let parse = |b: Option<&[u8]>| -> Result<Option<Value>> {
        Ok(match b {
            None => None,
            Some(b) => Some(serde_json::from_slice(b)?),
        })
    };
    let mut out = Vec::new();
    read_to_end("read_committed", topics, Duration::from_secs(60), |m| {
        out.push(Seen {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            key: parse(m.key())?,
            value: parse(m.payload())?,
        });
        Ok(())
    })?;
    Ok(out)
}

/// Reads until `done` holds for the records seen, or fails after `timeout`.
pub async fn wait_for(
    topics: &[String],
    timeout: Duration,
    done: impl Fn(&[Seen]) -> bool,
) -> Result<Vec<Seen>> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let t = topics.to_vec();
        // A read that stalls (a broker slow under the suite's load) is
        // tried again with a new consumer until the deadline.
        let stalled = match tokio::task::spawn_blocking(move || read_committed(&t)).await? {
            Ok(read) => {
                seen = read;
                None
            }
            Err(e) => Some(e),
        };
        if stalled.is_none() && done(&seen) {
            return Ok(seen);
        }
        if Instant::now() > deadline {
            let last = stalled.map_or(String::new(), |e| format!("; the last read failed: {e:#}"));
            bail!(
                "condition not met within {timeout:?}; {} records seen{last}: {seen:#?}",
                seen.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
