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
    Debezium,
}

impl Tool {
    pub fn short(self) -> &'static str {
        match self {
            Tool::Oncely => "onc",
            Tool::Debezium => "dbz",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Tool::Oncely => "oncely",
            Tool::Debezium => "Debezium",
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

/// What one run works on.
pub struct Spec<'a> {
    pub services: &'a Services,
    pub mode: Mode,
    pub db: &'a str,
    pub slot: &'a str,
    pub publication: &'a str,
    /// Topic prefix, private to this tool and run.
    pub prefix: &'a str,
    /// Source changes (or snapshot rows): events/s and µs/event are per change.
    pub changes: i64,
    /// Kafka records expected (tombstones included).
    pub records: i64,
}

pub struct Measured {
    pub tool: Tool,
    /// "1st" or "2nd" in its pair.
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
enum Running {
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
    fn pid(&self) -> u32 {
        match self {
            Running::Oncely { child, .. } => child.id(),
            Running::Debezium(c) => c.pid(),
        }
    }

    fn check(&mut self) -> Result<()> {
        match self {
            Running::Oncely { child, .. } => match child.try_wait()? {
                Some(status) => bail!("oncely capture exited ({status}); see its stderr"),
                None => Ok(()),
            },
            Running::Debezium(c) => c.check(),
        }
    }
}

fn start(tool: Tool, s: &Spec, dir: &std::path::Path) -> Result<Running> {
    let svc = s.services;
    match tool {
        Tool::Oncely => {
            let metrics_port = 20000 + (rand::random::<u16>() % 20000);
            let config = dir.join("capture.toml");
            std::fs::write(
                &config,
                format!(
                    "topic.prefix = \"{prefix}\"\ndatabase.hostname = \"{host}\"\n\
                     database.port = {port}\ndatabase.user = \"{user}\"\n\
                     database.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
                     publication.name = \"{publication}\"\n\
                     publication.autocreate.mode = \"disabled\"\n\
                     table.include.list = \"public.orders\"\nsnapshot.mode = \"{mode}\"\n\
                     kafka.bootstrap.servers = \"{brokers}\"\n\
                     offset.storage.topic = \"{prefix}-offsets\"\n\
                     metrics.listen = \"127.0.0.1:{metrics_port}\"\n",
                    prefix = s.prefix,
                    host = svc.host,
                    port = svc.port,
                    user = svc.user,
                    db = s.db,
                    slot = s.slot,
                    publication = s.publication,
                    mode = s.mode.snapshot_mode(),
                    brokers = svc.brokers,
                ),
            )?;
            let bin = bench_support::oncely_binary()?;
            let child = bench_support::spawn_capture(Command::new(&bin), &config)?;
            Ok(Running::Oncely {
                child,
                metrics_port,
            })
        }
        Tool::Debezium => {
            let password = svc
                .pg
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned());
            let extra = std::env::var("BENCH_DBZ_WORKER").unwrap_or_default();
            let worker: Vec<(&str, &str)> = extra
                .split(';')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim()))
                .collect();
            let connect = Connect::start(&Connector {
                dir,
                brokers: &svc.brokers,
                prefix: s.prefix,
                host: &svc.host,
                port: svc.port,
                user: &svc.user,
                password: password.as_deref(),
                source: Source::Postgres {
                    dbname: s.db,
                    slot: s.slot,
                    publication: s.publication,
                },
                tables: &["public.orders"],
                settings: &[
                    ("snapshot.mode", s.mode.snapshot_mode()),
                    ("publication.autocreate.mode", "disabled"),
                ],
                worker: &worker,
                jvm: STANDALONE_JVM,
            })?;
            Ok(Running::Debezium(connect))
        }
    }
}

fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Runs `tool` alone until Kafka holds all of `s.records`.
pub async fn run(tool: Tool, s: &Spec<'_>, position: &'static str) -> Result<Measured> {
    let dir = std::env::temp_dir().join(s.prefix);
    std::fs::create_dir_all(&dir)?;
    let topic = format!("{}.public.orders", s.prefix);
    let offsets = Offsets::new(&s.services.brokers)?;
    let timeout: u64 = std::env::var("BENCH_TIMEOUT")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(3600);
    let load_before = load1();
    let started = Instant::now();
    let mut running = start(tool, s, &dir)?;
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
                    && ends.high - ends.low >= s.records;
                settled = match (committed, settled) {
                    (true, Some(at)) => break at,
                    (true, None) => Some(Instant::now()),
                    (false, _) => None,
                };
                events
            }
            Running::Debezium(_) => {
                let have = ends.high - ends.low;
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
