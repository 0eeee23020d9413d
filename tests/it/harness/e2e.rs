//! The whole pipeline as separate processes: a captured database, `oncely
//! capture`, and one `oncely sink` per target (PostgreSQL warehouse,
//! Elasticsearch, Redis), each with names of its own so tests run side by
//! side on shared services; and `oncely verify` over all of them.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use elasticsearch::http::transport::Transport;
use elasticsearch::indices::IndicesDeleteParts;
use elasticsearch::Elasticsearch;
use oncely::verify::{self, Report};
use rand::Rng;

use crate::harness::capture::{kill9, CaptureEnv, Spawned};
use crate::harness::common;

/// The three targets, in the order of [`Pipeline::sinks`].
pub const SINKS: [&str; 3] = ["postgres", "elasticsearch", "redis"];

/// The warehouse schema (in the test's own database).
pub const WAREHOUSE_SCHEMA: &str = "wh";

pub struct Pipeline {
    pub env: CaptureEnv,
    pub capture_config: PathBuf,
    /// Config paths, in [`SINKS`] order.
    pub sinks: Vec<PathBuf>,
    /// Prefix of this pipeline's Redis keys.
    pub redis_prefix: String,
    /// The change topics the sinks consume.
    topic_names: Vec<String>,
}

impl Pipeline {
    /// A database with `schema` (SQL) holding `tables`, and the configs of
    /// capture (`capture_extra` appended) and the three sinks.
    pub async fn new(
        name: &str,
        schema: &str,
        tables: &[&str],
        capture_extra: &str,
    ) -> Result<Self> {
        let names: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
        Self::with_topics(name, schema, capture_extra, |prefix| {
            names
                .iter()
                .map(|t| format!("{prefix}.public.{t}"))
                .collect()
        })
        .await
    }

    /// [`Self::new`] for tables outside `public` or with unusual names: the
    /// sinks consume `topics(prefix)` (the capture config's `{prefix}` is
    /// replaced by the topic prefix first).
    pub async fn with_topics(
        name: &str,
        schema: &str,
        capture_extra: &str,
        topics: impl FnOnce(&str) -> Vec<String>,
    ) -> Result<Self> {
        let env = CaptureEnv::new(name).await?;
        env.client.batch_execute(schema).await?;
        let capture_extra = capture_extra.replace("{prefix}", &env.prefix);
        let capture_config = env.write_config(
            "capture.toml",
            &env.config(&format!("heartbeat.interval.ms = 500\n{capture_extra}")),
        )?;
        let topics: Vec<String> = topics(&env.prefix);
        let redis_prefix = env.dbname.clone();
        let runner =
            |kind: &str, records: usize| runner_config(&env.prefix, &topics, kind, records);
        let pg = env.write_config(
            "sink-postgres.toml",
            &format!(
                "{}[sink]\nkind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"{WAREHOUSE_SCHEMA}\"\n",
                runner("postgres", 500),
                crate::harness::capture::db_url(&env.dbname),
            ),
        )?;
        let es = env.write_config(
            "sink-elasticsearch.toml",
            &format!(
                // The default `json.handling.mode` (text): the conformance
                // tables hold JSON scalars and arrays of scalars.
                "{}[sink]\nkind = \"elasticsearch\"\nurl = \"{}\"\n",
                runner("elasticsearch", 500),
                common::es_url(),
            ),
        )?;
        let redis = env.write_config(
            "sink-redis.toml",
            &format!(
                "{}[sink]\nkind = \"redis\"\nurl = \"{}\"\nlayout = \"hash\"\n\
                 key.pattern = \"{redis_prefix}:{{table}}:{{key}}\"\nversion.key.prefix = \"{redis_prefix}:v:\"\n\
                 positions.key.prefix = \"{redis_prefix}:pos:\"\nkeyset.key.prefix = \"{redis_prefix}:ks:\"\nfence.key.prefix = \"{redis_prefix}:fence:\"\n",
                runner("redis", 500),
                common::redis_url(),
            ),
        )?;
        Ok(Self {
            env,
            capture_config,
            sinks: vec![pg, es, redis],
            redis_prefix,
            topic_names: topics,
        })
    }

    pub fn topics(&self) -> Vec<String> {
        self.topic_names.clone()
    }

    pub fn spawn_capture(&self) -> Result<Spawned> {
        self.env.spawn_capture(&self.capture_config)
    }

    /// Starts the sink of config `i` (the three of [`SINKS`] first), its log
    /// appended to `<config name>.log` beside the config.
    pub fn spawn_sink(&self, i: usize) -> Result<Spawned> {
        self.spawn_sink_with(i, &[])
    }

    /// [`Self::spawn_sink`] with more arguments for `oncely sink`.
    pub fn spawn_sink_with(&self, i: usize, args: &[&str]) -> Result<Spawned> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.sinks[i].with_extension("log"))?;
        Ok(Spawned(
            Command::new(env!("CARGO_BIN_EXE_oncely"))
                .args(["sink", "--config"])
                .arg(&self.sinks[i])
                .args(args)
                .env("RUST_LOG", "info,rdkafka=warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        ))
    }

    /// Starts another runner of sink config `i`, in the same consumer group
    /// with a static member id of its own (`<group>-<instance>`; the config's
    /// own runner is instance 1): config and log `<config name>-<instance>.*`.
    pub fn spawn_sink_instance(&self, i: usize, instance: usize) -> Result<Spawned> {
        if instance == 1 {
            return self.spawn_sink(i);
        }
        let group = self.sink_group(i)?;
        let text = std::fs::read_to_string(&self.sinks[i])?;
        let own = format!("\"group.instance.id\" = \"{group}-1\"");
        anyhow::ensure!(
            text.contains(&own),
            "{} has no {own}",
            self.sinks[i].display()
        );
        let text = text.replace(
            &own,
            &format!("\"group.instance.id\" = \"{group}-{instance}\""),
        );
        let stem = self.sinks[i]
            .file_stem()
            .and_then(|s| s.to_str())
            .context("config name")?
            .to_owned();
        let config = self.sinks[i].with_file_name(format!("{stem}-{instance}.toml"));
        std::fs::write(&config, text)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(config.with_extension("log"))?;
        Ok(Spawned(
            Command::new(env!("CARGO_BIN_EXE_oncely"))
                .args(["sink", "--config"])
                .arg(&config)
                .env("RUST_LOG", "info,rdkafka=warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        ))
    }

    /// The `group.id` of sink config `i`.
    pub fn sink_group(&self, i: usize) -> Result<String> {
        // The harness writes it as `group.id = "<group>"` (see `runner_config`).
        let text = std::fs::read_to_string(&self.sinks[i])?;
        text.lines()
            .find_map(|l| l.strip_prefix("group.id = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .map(str::to_owned)
            .context("group.id")
    }

    /// Appends `lines` to sink config `i`: its `[sink]` table comes last, so
    /// they become keys of that table (e.g. `history.enabled = true`).
    pub fn extend_sink_config(&self, i: usize, lines: &str) -> Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.sinks[i])?;
        writeln!(f, "{lines}")?;
        Ok(())
    }

    /// Puts `lines` before the `[sink]` table of sink config `i`: they
    /// become runner keys (e.g. `schema.registry.url`).
    pub fn prepend_sink_runner_keys(&self, i: usize, lines: &str) -> Result<()> {
        let path = &self.sinks[i];
        let text = std::fs::read_to_string(path)?;
        std::fs::write(path, format!("{lines}\n{text}"))?;
        Ok(())
    }

    pub fn sink_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.sinks[i].with_extension("log")).unwrap_or_default()
    }

    /// Adds a sink config `sink-<name>.toml`: the runner keys of the others
    /// (group `<prefix>-<name>`), then `sink_table` (the `[sink]` table).
    pub fn add_sink(&mut self, name: &str, sink_table: &str) -> Result<PathBuf> {
        let path = self.env.write_config(
            &format!("sink-{name}.toml"),
            &format!("{}{sink_table}", self.runner_config(name, 500)),
        )?;
        self.sinks.push(path.clone());
        Ok(path)
    }

    /// Two more sinks: an index that soft-deletes (`elasticsearch-soft`,
    /// indices `<topic>-soft`) and a cache in the JSON layout (`redis-json`);
    /// returns the JSON cache's key prefix (`<redis_prefix>:json`).
    pub fn add_soft_index_and_json_cache(&mut self) -> Result<String> {
        self.add_sink(
            "elasticsearch-soft",
            &format!(
                // `flattened` JSON: verify reads that form back too (the
                // main index has the default, text).
                "[sink]\nkind = \"elasticsearch\"\nurl = \"{}\"\nindex.pattern = \"{{topic}}-soft\"\ndelete.mode = \"soft\"\njson.handling.mode = \"flattened\"\n",
                common::es_url()
            ),
        )?;
        let json_prefix = format!("{}:json", self.redis_prefix);
        self.add_sink(
            "redis-json",
            &format!(
                "[sink]\nkind = \"redis\"\nurl = \"{}\"\nlayout = \"json\"\nkey.pattern = \"{json_prefix}:{{table}}:{{key}}\"\n\
                 version.key.prefix = \"{json_prefix}:v:\"\npositions.key.prefix = \"{json_prefix}:pos:\"\n\
                 keyset.key.prefix = \"{json_prefix}:ks:\"\n",
                common::redis_url()
            ),
        )?;
        Ok(json_prefix)
    }

    fn runner_config(&self, kind: &str, records: usize) -> String {
        runner_config(&self.env.prefix, &self.topics(), kind, records)
    }

    /// `oncely verify` as a library call, waiting up to `timeout` for the targets.
    pub async fn verify(&self, timeout: Duration) -> Result<Report> {
        self.verify_waiting(timeout, true).await
    }

    /// [`Self::verify`] again every 2 s until every copy is equal or
    /// `within` has passed; the last report either way. verify waits for
    /// capture's committed position, not for a snapshot still publishing
    /// (an initial one, a schema-change backfill): tests that compare right
    /// after one use this.
    pub async fn verify_until_equal(&self, within: Duration) -> Result<Report> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let report = self.verify(Duration::from_secs(120)).await?;
            if report.is_equal() || std::time::Instant::now() > deadline {
                return Ok(report);
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// [`Self::verify`] for topics another producer wrote (a real Debezium
    /// connector): no capture offset to wait for (`--no-capture-offset`).
    pub async fn verify_without_capture_offset(&self, timeout: Duration) -> Result<Report> {
        self.verify_waiting(timeout, false).await
    }

    async fn verify_waiting(&self, timeout: Duration, capture_offset: bool) -> Result<Report> {
        verify::run(&verify::Options {
            capture: self.capture_config.clone(),
            sinks: self.sinks.clone(),
            wait: true,
            capture_offset,
            timeout,
            examples: 5,
            retries: 0,
        })
        .await
        .context("verify")
    }

    /// `oncely verify` as a process, with `args` after the config files: its
    /// exit status and standard output.
    pub fn verify_cli(&self, args: &[&str]) -> Result<(std::process::ExitStatus, String)> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncely"));
        cmd.arg("verify").arg("--capture").arg(&self.capture_config);
        for s in &self.sinks {
            cmd.arg("--sink").arg(s);
        }
        let out = cmd
            .args(args)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::inherit())
            .output()?;
        Ok((
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }

    /// Removes what this pipeline left in Elasticsearch and Redis, then the
    /// slot and the database. Stop capture first.
    pub async fn cleanup(self) {
        // The walsender of a killed capture can take a while to notice under
        // load, and the slot can only be dropped once it is gone. A fresh
        // connection: a PostgreSQL restart may have closed `env.client`.
        if let Ok(client) = self.env.connect().await {
            for _ in 0..300 {
                let active = client
                    .query_opt(
                        "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                        &[&self.env.slot],
                    )
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.get::<_, bool>(0));
                if !active {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let es = es();
        // Each topic's index, and the `-soft` ones of tests with a soft-delete sink.
        let indices: Vec<String> = self
            .topics()
            .into_iter()
            .map(|t| t.to_lowercase())
            .flat_map(|t| [format!("{t}-soft"), t])
            .collect();
        let names: Vec<&str> = indices.iter().map(String::as_str).collect();
        let _ = es
            .indices()
            .delete(IndicesDeleteParts::Index(&names))
            .ignore_unavailable(true)
            .send()
            .await;
        if let Ok(mut conn) = redis_conn().await {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}:*", self.redis_prefix))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            for chunk in keys.chunks(500) {
                let _ = redis::cmd("UNLINK")
                    .arg(chunk)
                    .query_async::<()>(&mut conn)
                    .await;
            }
        }
        self.env.cleanup().await;
    }
}

/// Capture (0) and the sinks (1..=3) as processes, restarted when killed or exited.
pub struct Fleet<'a> {
    p: &'a Pipeline,
    pub procs: Vec<Option<Spawned>>,
    pub kills: [usize; 4],
    pub exits: [usize; 4],
}

impl<'a> Fleet<'a> {
    /// Nothing running yet: `spawn` each process.
    pub fn new(p: &'a Pipeline) -> Self {
        Fleet {
            p,
            procs: (0..4).map(|_| None).collect(),
            kills: [0; 4],
            exits: [0; 4],
        }
    }

    /// Capture started and its slot active (changes committed before are
    /// snapshot rows, not events); the sinks not yet ([`Fleet::spawn_sinks`]).
    pub async fn with_capture(p: &'a Pipeline) -> Result<Fleet<'a>> {
        let mut fleet = Fleet::new(p);
        fleet.spawn(0)?;
        p.env.wait_slot_active().await?;
        Ok(fleet)
    }

    /// Starts the three sinks.
    pub fn spawn_sinks(&mut self) -> Result<()> {
        for i in 1..4 {
            self.spawn(i)?;
        }
        Ok(())
    }

    pub fn name(i: usize) -> &'static str {
        if i == 0 {
            "capture"
        } else {
            SINKS[i - 1]
        }
    }

    pub fn spawn(&mut self, i: usize) -> Result<()> {
        self.procs[i] = Some(if i == 0 {
            self.p.spawn_capture()?
        } else {
            self.p.spawn_sink(i - 1)?
        });
        Ok(())
    }

    /// Restarts processes that exited on their own (e.g. capture finding its
    /// slot still held by the walsender of a killed predecessor, or a process
    /// giving up while a service restarts), as a supervisor would.
    pub fn supervise(&mut self) -> Result<()> {
        for i in 0..self.procs.len() {
            let exited = match self.procs[i].as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            };
            if exited {
                self.exits[i] += 1;
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    pub fn kill_random(&mut self) -> Result<()> {
        self.kill(rand::rng().random_range(0..self.procs.len()))
    }

    /// SIGKILLs process `i` and starts it again.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.procs[i].take() {
            kill9(&mut child);
        }
        self.kills[i] += 1;
        self.spawn(i)
    }

    pub fn summary(&self) -> String {
        (0..4)
            .map(|i| {
                format!(
                    "{} killed {}x, exited {}x",
                    Self::name(i),
                    self.kills[i],
                    self.exits[i]
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The runner keys of a pipeline's sink: group `<prefix>-<kind>` consuming `topics`.
fn runner_config(prefix: &str, topics: &[String], kind: &str, records: usize) -> String {
    let group = format!("{prefix}-{kind}");
    let list = topics
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // Static membership gets a restarted sink its partitions back at once; a
    // short metadata refresh lets it see topics capture creates later.
    format!(
        "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{group}\"\ntopics = [{list}]\n\
         batch.max.records = {records}\nbatch.max.ms = 20\nshutdown.timeout.ms = 10000\n\
         errors.deadletterqueue.topic.name = \"{group}-dlq\"\n\
         retry.backoff.ms = 50\nretry.backoff.max.ms = 1000\n\
         [kafka]\n\"group.instance.id\" = \"{group}-1\"\n\"session.timeout.ms\" = 6000\n\
         \"topic.metadata.refresh.interval.ms\" = 2000\n",
        brokers = common::kafka_brokers(),
    )
}

pub fn es() -> Elasticsearch {
    Elasticsearch::new(Transport::single_node(&common::es_url()).expect("es transport"))
}

pub async fn redis_conn() -> Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(common::redis_url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// A report's tables that differ, as lines, for assertion messages.
pub fn summary(report: &Report) -> String {
    report.to_string()
}
