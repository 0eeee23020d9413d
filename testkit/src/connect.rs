//! Kafka Connect standalone running one of Debezium's connectors as a child
//! process, with jars from `scripts/services connect`: the PostgreSQL
//! connector on the class path (`ONCELY_CONNECT_LIB`), the MariaDB one as an
//! isolated plugin (`ONCELY_CONNECT_PLUGINS`, its own Debezium version). One
//! home for starting it: the root tests' `debezium_compat` and
//! `debezium_mariadb` and examples/bench_vs_debezium start Debezium here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use anyhow::{bail, Context, Result};

/// The heap and collector flags Kafka's `connect-standalone.sh` starts the
/// worker with (`KAFKA_HEAP_OPTS`, `KAFKA_JVM_PERFORMANCE_OPTS` defaults).
pub const STANDALONE_JVM: &[&str] = &[
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
];

/// Where Debezium reads and writes, and what it is told beyond its defaults.
pub struct Connector<'a> {
    /// Configs, the offset file and the logs go here.
    pub dir: &'a Path,
    pub brokers: &'a str,
    /// The connector's name and `topic.prefix`.
    pub prefix: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub user: &'a str,
    pub password: Option<&'a str>,
    /// Which connector, and what only it is told.
    pub source: Source<'a>,
    /// `schema.table` (PostgreSQL) or `database.table` (MariaDB) names for
    /// `table.include.list`.
    pub tables: &'a [&'a str],
    /// Connector settings after the base ones (a later key wins).
    pub settings: &'a [(&'a str, &'a str)],
    /// Worker settings after the base ones.
    pub worker: &'a [(&'a str, &'a str)],
    /// JVM flags before the class path.
    pub jvm: &'a [&'a str],
}

/// The database Debezium reads, and what its connector needs beyond the
/// connection.
pub enum Source<'a> {
    /// `PostgresConnector` over pgoutput, on the caller's slot and
    /// publication.
    Postgres {
        dbname: &'a str,
        slot: &'a str,
        publication: &'a str,
    },
    /// `MariaDbConnector` as a replica with `server_id`, reading `database`;
    /// its schema history goes to a file in the connector's folder.
    MariaDb { database: &'a str, server_id: u32 },
}

/// The running worker; killed when dropped.
pub struct Connect {
    child: Child,
    log: PathBuf,
}

/// `ONCELY_CONNECT_LIB`, the folder of Connect and Debezium jars.
pub fn connect_lib() -> Result<String> {
    std::env::var("ONCELY_CONNECT_LIB").context(
        "ONCELY_CONNECT_LIB is not set: run `scripts/services connect` (Kafka Connect and \
         Debezium jars) and `eval \"$(scripts/services env)\"`",
    )
}

/// `ONCELY_CONNECT_PLUGINS`, the plugin.path folder holding Debezium's
/// MariaDB connector.
pub fn connect_plugins() -> Result<String> {
    std::env::var("ONCELY_CONNECT_PLUGINS").context(
        "ONCELY_CONNECT_PLUGINS is not set: run `scripts/services connect` (it fetches \
         Debezium's MariaDB connector too) and `eval \"$(scripts/services env)\"`",
    )
}

fn properties(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

impl Connect {
    pub fn start(c: &Connector) -> Result<Self> {
        let lib = connect_lib()?;
        let log = c.dir.join("connect.log");
        let offsets = c.dir.join("connect.offsets");
        let offsets = offsets.to_string_lossy();
        let worker = c.dir.join("connect-worker.properties");
        let mut text = properties(&[
            ("bootstrap.servers", c.brokers),
            (
                "key.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("offset.storage.file.filename", &offsets),
            ("listeners", "http://127.0.0.1:0"),
            ("plugin.discovery", "only_scan"),
        ]);
        if matches!(c.source, Source::MariaDb { .. }) {
            text.push_str(&properties(&[("plugin.path", &connect_plugins()?)]));
        }
        text.push_str(&properties(c.worker));
        std::fs::write(&worker, text)?;
        let tables = c.tables.join(",");
        let port = c.port.to_string();
        let mut text = properties(&[
            ("name", c.prefix),
            ("database.hostname", c.host),
            ("database.port", &port),
            ("database.user", c.user),
            ("topic.prefix", c.prefix),
            ("table.include.list", &tables),
        ]);
        text.push_str(&source_properties(&c.source, c.dir));
        if let Some(password) = c.password {
            text.push_str(&properties(&[("database.password", password)]));
        }
        text.push_str(&properties(c.settings));
        let connector = c.dir.join("connect-debezium.properties");
        std::fs::write(&connector, text)?;
        let log4j = c.dir.join("connect-log4j2.properties");
        std::fs::write(
            &log4j,
            format!(
                "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = file\n\
                 appender.file.type = File\nappender.file.name = file\n\
                 appender.file.fileName = {}\nappender.file.layout.type = PatternLayout\n\
                 appender.file.layout.pattern = [%d] %p %m (%c)%n\n",
                log.display()
            ),
        )?;
        let out = std::fs::File::create(c.dir.join("connect.out"))?;
        let child = Command::new("java")
            .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
            .args(c.jvm)
            .arg("-cp")
            .arg(class_path(&lib, &c.source)?)
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(&worker)
            .arg(&connector)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start java (Kafka Connect standalone)")?;
        Ok(Self { child, log })
    }

    /// The JVM's process id (for `/proc` figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the log's errors if the JVM exited or the task died.
    pub fn check(&mut self) -> Result<()> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if let Some(status) = self.child.try_wait()? {
            bail!("Kafka Connect exited ({status}):\n{}", errors(&log));
        }
        if log.contains("Task is being killed") {
            bail!("the Debezium task died:\n{}", errors(&log));
        }
        Ok(())
    }
}

/// The worker's class path: every jar of `lib`, but for the MariaDB
/// connector, which brings its own Debezium as a plugin, the jars of the
/// PostgreSQL connector's Debezium (two Debeziums on one class path clash
/// while Connect scans for plugins).
fn class_path(lib: &str, source: &Source) -> Result<std::ffi::OsString> {
    if let Source::Postgres { .. } = source {
        return Ok(Path::new(lib).join("*").into_os_string());
    }
    let mut jars: Vec<PathBuf> = std::fs::read_dir(lib)
        .with_context(|| format!("read {lib}"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.ends_with(".jar") && !name.starts_with("debezium-")
        })
        .collect();
    jars.sort();
    Ok(std::env::join_paths(jars)?)
}

/// Debezium's defaults, but for what the servers here need. PostgreSQL:
/// pgoutput (they have no decoderbufs), the caller's slot and publication.
/// MariaDB: the replica's server id, the database, and a file schema history
/// (no history topic to clean up).
fn source_properties(source: &Source, dir: &Path) -> String {
    match source {
        Source::Postgres {
            dbname,
            slot,
            publication,
        } => properties(&[
            (
                "connector.class",
                "io.debezium.connector.postgresql.PostgresConnector",
            ),
            ("database.dbname", dbname),
            ("slot.name", slot),
            ("publication.name", publication),
            ("publication.autocreate.mode", "filtered"),
            ("plugin.name", "pgoutput"),
        ]),
        Source::MariaDb {
            database,
            server_id,
        } => {
            let history = dir.join("connect-schema-history.dat");
            properties(&[
                (
                    "connector.class",
                    "io.debezium.connector.mariadb.MariaDbConnector",
                ),
                ("database.server.id", &server_id.to_string()),
                ("database.include.list", database),
                (
                    "schema.history.internal",
                    "io.debezium.storage.file.history.FileSchemaHistory",
                ),
                (
                    "schema.history.internal.file.filename",
                    &history.to_string_lossy(),
                ),
            ])
        }
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn errors(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("ERROR") || l.starts_with("Caused by"))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n")
}
