//! One tool's run: start it on a prepared database, watch Kafka until every
//! record is there, read its CPU and peak memory from `/proc`, stop it.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::bench_support::{self, Offsets, Services};
use oncely_testkit::connect::{Connect, Connector, Source, STANDALONE_JVM};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tool {
    Oncely,
    /// Debezium at its defaults.
    Debezium,
    /// Debezium with bigger batches: [`TUNED_CONNECTOR`] and [`TUNED_WORKER`].
    DebeziumTuned,
}

/// Connector settings of `debezium-tuned`: four times the records per
/// poll (default 2,048) and queued (default 8,192).
pub const TUNED_CONNECTOR: &[(&str, &str)] =
    &[("max.batch.size", "8192"), ("max.queue.size", "32768")];

/// Worker settings of `debezium-tuned`: the producer's batches 1 MB (default
/// 16 KB), waiting up to 20 ms to fill them, with a 128 MB buffer (default
/// 32).
pub const TUNED_WORKER: &[(&str, &str)] = &[
    ("producer.batch.size", "1048576"),
    ("producer.linger.ms", "20"),
    ("producer.buffer.memory", "134217728"),
];

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::Oncely, Tool::Debezium, Tool::DebeziumTuned];

    pub fn short(self) -> &'static str {
        match self {
            Tool::Oncely => "onc",
            Tool::Debezium => "dbz",
            Tool::DebeziumTuned => "dbt",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Tool::Oncely => "oncely",
            Tool::Debezium => "Debezium",
            Tool::DebeziumTuned => "Debezium tuned",
        }
    }
    /// Its name in `BENCH_TOOLS`.
    pub fn key(self) -> &'static str {
        match self {
            Tool::Oncely => "oncely",
            Tool::Debezium => "debezium",
            Tool::DebeziumTuned => "debezium-tuned",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Stream,
    Snapshot,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Snapshot => "snapshot",
        }
    }
    /// The same value in both tools' configurations.
    fn snapshot_mode(self) -> &'static str {
        match self {
            Mode::Stream => "no_data",
            Mode::Snapshot => "initial",
        }
    }
}

/// Where a tool reads, beyond the database's name.
pub enum Db<'a> {
    /// The tool's own slot, and the publication.
    Postgres { slot: &'a str, publication: &'a str },
    /// The tool's own replica server id on the services' MariaDB.
    MariaDb { server_id: u32 },
}

/// What one run works on.
pub struct Spec<'a> {
    pub services: &'a Services,
    pub mode: Mode,
    /// The PostgreSQL or MariaDB database holding `orders`.
    pub db: &'a str,
    pub source: Db<'a>,
    /// Topic prefix, private to this tool and run.
    pub prefix: &'a str,
    /// Source changes (or snapshot rows): events/s and µs/event are per change.
    pub changes: i64,
    /// Kafka records expected (tombstones included).
    pub records: i64,
}

impl Spec<'_> {
    /// The topic of `orders`.
    pub fn topic(&self) -> String {
        match self.source {
            Db::Postgres { .. } => format!("{}.public.orders", self.prefix),
            Db::MariaDb { .. } => format!("{}.{}.orders", self.prefix, self.db),
        }
    }
}

pub struct Measured {
    pub tool: Tool,
    /// "1st", "2nd" ... in its round.
    pub position: &'static str,
    pub changes: i64,
    pub startup_secs: f64,
    pub drain_secs: f64,
    /// CPU of the whole process (start-up included) when done.
    pub cpu_secs: f64,
    /// CPU when its first record was seen.
    pub cpu_at_first: f64,
    pub peak_rss_kb: u64,
    /// 1-minute load average before → after.
    pub load: String,
}

impl Measured {
    pub fn rate(&self) -> f64 {
        self.changes as f64 / self.drain_secs
    }
    /// Whole process, start-up included.
    pub fn cpu_us_per_event(&self) -> f64 {
        self.cpu_secs * 1e6 / self.changes as f64
    }
    /// From the first record to the last only.
    pub fn drain_cpu_us_per_event(&self) -> f64 {
        (self.cpu_secs - self.cpu_at_first) * 1e6 / self.changes as f64
    }
}

/// The started tool, killed when dropped.
pub enum Running {
    Oncely { child: Child, metrics_port: u16 },
    Debezium(Connect),
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Oncely { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Running {
    pub fn pid(&self) -> u32 {
        match self {
            Running::Oncely { child, .. } => child.id(),
            Running::Debezium(c) => c.pid(),
        }
    }

    pub fn check(&mut self) -> Result<()> {
        match self {
            Running::Oncely { child, .. } => match child.try_wait()? {
                Some(status) => bail!("oncely capture exited ({status}); see its stderr"),
                None => Ok(()),
            },
            Running::Debezium(c) => c.check(),
        }
    }
}

/// Starts `tool` on `s` with its files in `dir`; `worker` adds Connect
/// worker settings (the priming of a MariaDB backlog flushes offsets often).
pub fn start(
    tool: Tool,
    s: &Spec,
    dir: &std::path::Path,
    worker: &[(&str, &str)],
) -> Result<Running> {
    match tool {
        Tool::Oncely => {
            let metrics_port = bench_support::free_port()?;
            let config = dir.join("capture.toml");
            std::fs::write(&config, oncely_config(s, metrics_port)?)?;
            let bin = bench_support::oncely_binary()?;
            let child = bench_support::spawn_capture(Command::new(&bin), &config)?;
            Ok(Running::Oncely {
                child,
                metrics_port,
            })
        }
        Tool::Debezium | Tool::DebeziumTuned => start_debezium(tool, s, dir, worker),
    }
}

/// `oncely capture`'s configuration: its defaults, but for the source and
/// what keeps runs apart.
fn oncely_config(s: &Spec, metrics_port: u16) -> Result<String> {
    let svc = s.services;
    let common = format!(
        "topic.prefix = \"{prefix}\"\nsnapshot.mode = \"{mode}\"\n\
         kafka.bootstrap.servers = \"{brokers}\"\n\
         offset.storage.topic = \"{prefix}-offsets\"\n\
         metrics.listen = \"127.0.0.1:{metrics_port}\"\n",
        prefix = s.prefix,
        mode = s.mode.snapshot_mode(),
        brokers = svc.brokers,
    );
    let source = match s.source {
        Db::Postgres { slot, publication } => format!(
            "database.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\n\
             slot.name = \"{slot}\"\npublication.name = \"{publication}\"\n\
             publication.autocreate.mode = \"disabled\"\n\
             table.include.list = \"public.orders\"\n",
            host = svc.host,
            port = svc.port,
            user = svc.user,
            db = s.db,
        ),
        Db::MariaDb { server_id } => {
            let m = svc.mariadb()?;
            let password = m
                .password
                .as_ref()
                .map(|p| format!("database.password = \"{p}\"\n"))
                .unwrap_or_default();
            format!(
                "source = \"mysql\"\ndatabase.hostname = \"{host}\"\n\
                 database.port = {port}\ndatabase.user = \"{user}\"\n{password}\
                 database.server.id = {server_id}\n\
                 database.include.list = \"{db}\"\n\
                 table.include.list = \"{db}\\\\.orders\"\n",
                host = m.host,
                port = m.port,
                user = m.user,
                db = s.db,
            )
        }
    };
    Ok(format!("{common}{source}"))
}

fn start_debezium(
    tool: Tool,
    s: &Spec,
    dir: &std::path::Path,
    worker: &[(&str, &str)],
) -> Result<Running> {
    let svc = s.services;
    let extra = std::env::var("BENCH_DBZ_WORKER").unwrap_or_default();
    let mut workers: Vec<(&str, &str)> = Vec::new();
    let mut settings = vec![("snapshot.mode", s.mode.snapshot_mode())];
    if tool == Tool::DebeziumTuned {
        workers.extend_from_slice(TUNED_WORKER);
        settings.extend_from_slice(TUNED_CONNECTOR);
    }
    workers.extend(
        extra
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim())),
    );
    workers.extend_from_slice(worker);
    let pg_password = svc
        .pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let table = format!("{}.orders", s.db);
    let connect = match s.source {
        Db::Postgres { slot, publication } => {
            settings.push(("publication.autocreate.mode", "disabled"));
            Connect::start(&Connector {
                dir,
                brokers: &svc.brokers,
                prefix: s.prefix,
                host: &svc.host,
                port: svc.port,
                user: &svc.user,
                password: pg_password.as_deref(),
                source: Source::Postgres {
                    dbname: s.db,
                    slot,
                    publication,
                },
                tables: &["public.orders"],
                settings: &settings,
                worker: &workers,
                jvm: STANDALONE_JVM,
            })?
        }
        Db::MariaDb { server_id } => {
            let m = svc.mariadb()?;
            Connect::start(&Connector {
                dir,
                brokers: &svc.brokers,
                prefix: s.prefix,
                host: &m.host,
                port: m.port,
                user: &m.user,
                password: m.password.as_deref(),
                source: Source::MariaDb {
                    database: s.db,
                    server_id,
                },
                tables: &[&table],
                settings: &settings,
                worker: &workers,
                jvm: STANDALONE_JVM,
            })?
        }
    };
    Ok(Running::Debezium(connect))
}

fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// The folder of a tool's files in a run (its config, Connect's offsets and
/// schema history): the same for a priming and the run after it.
pub fn dir(prefix: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs `tool` alone until Kafka holds all of `s.records` (beyond those its
/// topic held before: a priming's).
pub async fn run(tool: Tool, s: &Spec<'_>, position: &'static str) -> Result<Measured> {
    let dir = dir(s.prefix)?;
    let topic = s.topic();
    let offsets = Offsets::new(&s.services.brokers)?;
    let before = tokio::task::block_in_place(|| offsets.ends(&topic))?;
    let already = before.high - before.low;
    let timeout: u64 = std::env::var("BENCH_TIMEOUT")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(3600);
    let load_before = load1();
    let started = Instant::now();
    let mut running = start(tool, s, &dir, &[])?;
    let pid = running.pid();
    let mut first: Option<(Instant, f64)> = None;
    // oncely: the poll at which its records all looked committed (checked twice).
    let mut settled: Option<Instant> = None;
    let mut polls = 0u64;
    let done = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        polls += 1;
        if polls.is_multiple_of(10) {
            running.check()?;
        }
        if started.elapsed() > Duration::from_secs(timeout) {
            bail!(
                "{}: not all {} records in {topic} after {timeout}s (see {})",
                tool.name(),
                s.records,
                dir.display()
            );
        }
        let ends = tokio::task::block_in_place(|| offsets.ends(&topic))?;
        let seen = match &running {
            // Commit markers take offsets: count what capture published, then
            // wait for the last transaction to commit (stable offset = end).
            Running::Oncely { metrics_port, .. } => {
                let events = bench_support::scrape(*metrics_port, "oncely_capture_events_total")
                    .await
                    .unwrap_or(0.0) as i64;
                let committed = events >= s.records
                    && ends.stable == ends.high
                    && ends.high - ends.low - already >= s.records;
                settled = match (committed, settled) {
                    (true, Some(at)) => break at,
                    (true, None) => Some(Instant::now()),
                    (false, _) => None,
                };
                events
            }
            Running::Debezium(_) => {
                let have = ends.high - ends.low - already;
                if have >= s.records {
                    break Instant::now();
                }
                have
            }
        };
        if seen > 0 && first.is_none() {
            first = Some((Instant::now(), bench_support::cpu_seconds(pid)));
        }
    };
    let cpu_secs = bench_support::cpu_seconds(pid);
    let peak_rss_kb = bench_support::rss_kb(pid, "VmHWM:");
    drop(running);
    let (first, cpu_at_first) = first.unwrap_or((done, cpu_secs));
    Ok(Measured {
        tool,
        position,
        changes: s.changes,
        startup_secs: (first - started).as_secs_f64(),
        drain_secs: (done - first).as_secs_f64(),
        cpu_secs,
        cpu_at_first,
        peak_rss_kb,
        load: format!("{load_before} → {}", load1()),
    })
}
