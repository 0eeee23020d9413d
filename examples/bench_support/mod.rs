//! What the benchmark programs share: the local services' addresses, fresh
//! databases, and the release `oncely` binary they start as a process.
//! (A folder, not `examples/*.rs`, so cargo does not build it as an example.)
#![allow(dead_code)] // each bench uses a part

pub mod floor;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tokio_postgres::{Client, NoTls};

/// The services `scripts/services env` describes.
pub struct Services {
    pub pg_url: String,
    pub pg: tokio_postgres::Config,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub brokers: String,
}

/// An environment variable `scripts/services env` exports.
pub fn env(key: &str) -> Result<String> {
    std::env::var(key).with_context(|| format!("{key}: eval \"$(scripts/services env)\""))
}

impl Services {
    /// PostgreSQL and Kafka from `ONCELY_PG_URL` and `ONCELY_KAFKA_BROKERS`.
    pub fn from_env() -> Result<Self> {
        let pg_url = env("ONCELY_PG_URL")?;
        let pg: tokio_postgres::Config = pg_url.parse().context("ONCELY_PG_URL")?;
        let host = match pg.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let user = pg.get_user().unwrap_or("postgres").to_string();
        Ok(Self {
            pg_url,
            pg,
            host,
            port,
            user,
            brokers: env("ONCELY_KAFKA_BROKERS")?,
        })
    }

    /// A client on the server's default database (for CREATE/DROP DATABASE).
    pub async fn admin(&self) -> Result<Client> {
        let (client, conn) = tokio_postgres::connect(&self.pg_url, NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// A client on database `name`.
    pub async fn connect(&self, name: &str) -> Result<Client> {
        let mut cfg = self.pg.clone();
        cfg.dbname(name);
        let (client, conn) = cfg.connect(NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Creates database `name` and returns a client on it.
    pub async fn create_database(&self, admin: &Client, name: &str) -> Result<Client> {
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("create database {name}"))?;
        self.connect(name).await
    }
}

/// The MariaDB `scripts/services` runs (`ONCELY_MARIADB_URL`: root, who
/// may create databases and take the snapshot's lock).
pub struct MariaDb {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
}

impl Services {
    /// MariaDB, from `ONCELY_MARIADB_URL`.
    pub fn mariadb(&self) -> Result<MariaDb> {
        let url = env("ONCELY_MARIADB_URL")?;
        let opts = mysql_async::Opts::from_url(&url).context("ONCELY_MARIADB_URL")?;
        Ok(MariaDb {
            host: opts.ip_or_hostname().to_owned(),
            port: opts.tcp_port(),
            user: opts.user().unwrap_or("root").to_owned(),
            password: opts.pass().map(str::to_owned),
            url,
        })
    }
}

impl MariaDb {
    /// A connection, on database `db` if given.
    pub async fn connect(&self, db: Option<&str>) -> Result<mysql_async::Conn> {
        let opts = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&self.url)?)
            .db_name(db);
        mysql_async::Conn::new(opts)
            .await
            .with_context(|| format!("connect to MariaDB at {}:{}", self.host, self.port))
    }
}

/// How capture writes keys and values: the benchmarks compare them in one
/// run (`BENCH_FORMATS`, comma separated; default all three).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Avro through the schema registry (`ONCELY_REGISTRY_URL`).
    Avro,
    /// Connect's JSON with the schema inline (`schemas.enable = true`).
    Json,
    /// Connect's JSON without it (`schemas.enable = false`).
    JsonNoSchema,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::Avro, Format::Json, Format::JsonNoSchema];

    pub fn name(self) -> &'static str {
        match self {
            Format::Avro => "avro",
            Format::Json => "json",
            Format::JsonNoSchema => "json-noschema",
        }
    }

    /// `BENCH_FORMATS`, e.g. `avro,json`; all three when unset.
    pub fn from_env() -> Result<Vec<Format>> {
        let Ok(list) = std::env::var("BENCH_FORMATS") else {
            return Ok(Self::ALL.to_vec());
        };
        list.split(',')
            .filter(|f| !f.is_empty())
            .map(
                |f| match Self::ALL.into_iter().find(|a| a.name() == f.trim()) {
                    Some(a) => Ok(a),
                    None => bail!("BENCH_FORMATS: {f:?} is not avro, json or json-noschema"),
                },
            )
            .collect()
    }

    /// Capture's top-level config lines for this format.
    pub fn capture_config(self) -> Result<String> {
        Ok(match self {
            Format::Avro => format!(
                "schemas.enable = true\nkey.converter = \"avro\"\nvalue.converter = \"avro\"\n\
                 schema.registry.url = \"{}\"\n",
                env("ONCELY_REGISTRY_URL")?
            ),
            Format::Json => "schemas.enable = true\n".into(),
            Format::JsonNoSchema => "schemas.enable = false\n".into(),
        })
    }
}

/// `BENCH_ROUNDS`: how many times each comparison repeats, interleaved
/// (default 1).
pub fn rounds() -> Result<usize> {
    Ok(std::env::var("BENCH_ROUNDS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("BENCH_ROUNDS")?
        .unwrap_or(1))
}

/// A random tag that keeps a run's databases, slots and topics apart.
pub fn tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// `target/release/oncely`, next to this example's own binary, or
/// `$BENCH_ONCELY` (to compare two builds).
pub fn oncely_binary() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("BENCH_ONCELY") {
        return Ok(path.into());
    }
    std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("oncely"))
        .context("locate target/release/oncely (cargo build --release --bin oncely)")
}

/// Starts `oncely capture --config <config>` through `command` (the binary
/// of [`oncely_binary`], or a profiler in front of it), quiet.
pub fn spawn_capture(
    mut command: std::process::Command,
    config: &std::path::Path,
) -> Result<std::process::Child> {
    command
        .args(["capture", "--config"])
        .arg(config)
        .env(
            "RUST_LOG",
            std::env::var("BENCH_CAPTURE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("run target/release/oncely (cargo build --release --bin oncely first)")
}

/// Reads one metric (exact name, with or without labels) from a Prometheus endpoint.
pub async fn scrape(port: u16, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A local port nothing listens on: one the kernel just handed out (a
/// random one could be the ephemeral port of any open connection).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A `/proc/<pid>/status` size field (`VmRSS:`, `VmHWM:`) in kB; 0 when gone.
pub fn rss_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU seconds of a process so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are 14th and 15th overall.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A topic's offsets summed over its partitions.
pub struct Ends {
    pub low: i64,
    pub high: i64,
    /// The last stable offset: `high` unless a transaction is open.
    pub stable: i64,
}

/// Reads topic end offsets, as a plain and as a `read_committed` reader sees them.
pub struct Offsets {
    plain: rdkafka::consumer::BaseConsumer,
    committed: rdkafka::consumer::BaseConsumer,
}

impl Offsets {
    pub fn new(brokers: &str) -> Result<Self> {
        use rdkafka::config::ClientConfig;
        let consumer = |isolation: &str| {
            ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("isolation.level", isolation)
                .create()
        };
        Ok(Self {
            plain: consumer("read_uncommitted")?,
            committed: consumer("read_committed")?,
        })
    }

    /// Blocking; all zero while the topic does not exist.
    pub fn ends(&self, topic: &str) -> Result<Ends> {
        use rdkafka::consumer::Consumer;
        let timeout = std::time::Duration::from_secs(10);
        let metadata = self.plain.fetch_metadata(Some(topic), timeout)?;
        let mut ends = Ends {
            low: 0,
            high: 0,
            stable: 0,
        };
        for t in metadata.topics().iter().filter(|t| t.error().is_none()) {
            for p in t.partitions() {
                let (low, high) = self.plain.fetch_watermarks(topic, p.id(), timeout)?;
                let (_, stable) = self.committed.fetch_watermarks(topic, p.id(), timeout)?;
                ends.low += low;
                ends.high += high;
                ends.stable += stable;
            }
        }
        Ok(ends)
    }
}

/// Deletes every topic whose name starts with `prefix`.
pub async fn delete_topics(brokers: &str, prefix: &str) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, std::time::Duration::from_secs(10))?;
    let names: Vec<&str> = metadata
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| n.starts_with(prefix))
        .collect();
    if !names.is_empty() {
        for r in admin.delete_topics(&names, &AdminOptions::new()).await? {
            r.map_err(|(topic, e)| anyhow::anyhow!("delete topic {topic}: {e}"))?;
        }
    }
    Ok(())
}
