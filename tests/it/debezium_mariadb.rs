//! A real Debezium MariaDB connector (3.5.0.Final, the newest served; the
//! MySQL connector 3.6.1 refuses MariaDB) on the services' MariaDB, as a
//! Kafka Connect plugin (`scripts/services connect`), writes the topic of a
//! table of the MySQL types it maps: a snapshot, then streamed inserts,
//! updates (two of one row and a multi-row insert in one transaction), a
//! binlog rotation (`FLUSH BINARY LOGS`) between changes, a primary-key
//! update and deletes. The three oncely sinks read that topic, versioning
//! rows by binlog file, offset and row (sinks/src/event.rs).
//!
//! `oncely verify` reads PostgreSQL sources only, so the test keeps a
//! PostgreSQL mirror: a schema named like the MariaDB database holding the
//! same rows in the PostgreSQL types Debezium's mapping corresponds to (its
//! topic name is the one Debezium writes, `<prefix>.<database>.<table>`).
//! Every statement runs on both; verify then compares the mirror with the
//! warehouse, the index and the cache, which hold what Debezium wrote from
//! MariaDB, and there must be no dead letter.

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use oncely_testkit::connect::{Connect, Connector, Source};

use crate::debezium_compat::{every_target_equal, wait_for_records};

use crate::harness::common::{self, env_var, unique};
use crate::harness::e2e::Pipeline;

const TABLE: &str = "all_types";

/// A column: its name, MariaDB type, the PostgreSQL type of the mirror, and
/// the (MariaDB, PostgreSQL) literals its values cycle through.
type Column = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const COLUMNS: &[Column] = &[
    (
        "ti",
        "tinyint",
        "smallint",
        &[("-128", "-128"), ("127", "127"), ("NULL", "NULL")],
    ),
    (
        "tu",
        "tinyint unsigned",
        "smallint",
        &[("255", "255"), ("0", "0")],
    ),
    (
        "si",
        "smallint",
        "smallint",
        &[("-32768", "-32768"), ("32767", "32767")],
    ),
    (
        "mi",
        "mediumint",
        "integer",
        &[("-8388608", "-8388608"), ("8388607", "8388607")],
    ),
    (
        "iu",
        "int unsigned",
        "bigint",
        &[("4294967295", "4294967295"), ("7", "7")],
    ),
    (
        "bi",
        "bigint",
        "bigint",
        &[
            ("-9223372036854775808", "-9223372036854775808"),
            ("9223372036854775807", "9223372036854775807"),
        ],
    ),
    (
        "d",
        "double",
        "double precision",
        &[("0.1", "0.1"), ("-2.5e-3", "-2.5e-3"), ("1e15", "1e15")],
    ),
    (
        "amount",
        "decimal(12,2)",
        "numeric(12,2)",
        &[
            ("0.00", "0.00"),
            ("-9999999999.99", "-9999999999.99"),
            ("163.38", "163.38"),
        ],
    ),
    (
        "vc",
        "varchar(20)",
        "varchar(20)",
        &[("'v'", "'v'"), ("''", "''"), ("'日本語'", "'日本語'")],
    ),
    (
        "tx",
        "text",
        "text",
        &[
            ("'héllo wörld 🎉'", "'héllo wörld 🎉'"),
            ("'quote''s \"double\"'", "'quote''s \"double\"'"),
            ("NULL", "NULL"),
        ],
    ),
    (
        "dt",
        "date",
        "date",
        &[
            ("'2026-12-05'", "'2026-12-05'"),
            ("'1900-02-28'", "'1900-02-28'"),
            ("'1000-01-01'", "'1000-01-01'"),
        ],
    ),
    (
        "dt3",
        "datetime(3)",
        "timestamp(3)",
        &[
            ("'2026-02-03 04:05:06.789'", "'2026-02-03 04:05:06.789'"),
            ("'1960-01-01 00:00:00.001'", "'1960-01-01 00:00:00.001'"),
        ],
    ),
    (
        "dt6",
        "datetime(6)",
        "timestamp(6)",
        &[
            (
                "'2026-11-27 15:10:35.670111'",
                "'2026-11-27 15:10:35.670111'",
            ),
            ("'1970-01-01 00:00:00'", "'1970-01-01 00:00:00'"),
        ],
    ),
    (
        "tm",
        "time(6)",
        "time(6)",
        &[
            ("'00:00:00'", "'00:00:00'"),
            ("'23:59:59.999999'", "'23:59:59.999999'"),
            ("'12:34:56.5'", "'12:34:56.5'"),
        ],
    ),
    (
        "js",
        "json",
        "jsonb",
        &[
            (
                "'{\"a\": [1, 2.5, null], \"b\": \"x\"}'",
                "'{\"a\": [1, 2.5, null], \"b\": \"x\"}'",
            ),
            ("'[]'", "'[]'"),
        ],
    ),
    (
        "en",
        "enum('small','medium','large')",
        "size",
        &[
            ("'small'", "'small'"),
            ("'large'", "'large'"),
            ("NULL", "NULL"),
        ],
    ),
    (
        "vb",
        "varbinary(8)",
        "bytea",
        &[("0x00ff10", "'\\x00ff10'"), ("X''", "'\\x'")],
    ),
    (
        "b1",
        "bit(1)",
        "boolean",
        &[("b'1'", "true"), ("b'0'", "false")],
    ),
    (
        "b12",
        "bit(12)",
        "bit(12)",
        &[
            ("b'101010111100'", "B'101010111100'"),
            ("b'000000000001'", "B'000000000001'"),
        ],
    ),
    (
        "yr",
        "year",
        "integer",
        &[("2155", "2155"), ("1901", "1901"), ("NULL", "NULL")],
    ),
    (
        "st",
        "set('a','b','c')",
        "text",
        &[("'a,c'", "'a,c'"), ("''", "''"), ("'b'", "'b'")],
    ),
    (
        "ts",
        "timestamp(6) NULL",
        "timestamptz",
        &[
            (
                "'2026-12-05 01:02:03.456789'",
                "'2026-12-05 01:02:03.456789+00'",
            ),
            ("NULL", "NULL"),
        ],
    ),
    (
        "bu",
        "bigint unsigned",
        "bigint",
        &[("9223372036854775807", "9223372036854775807"), ("0", "0")],
    ),
    // A zero date is null in a nullable column (Debezium's rule).
    (
        "zd",
        "date NULL",
        "date",
        &[("'0000-00-00'", "NULL"), ("'2000-01-01'", "'2000-01-01'")],
    ),
];

/// Rows in the table before Debezium starts (its snapshot).
const SNAPSHOT_ROWS: i64 = 12;

/// One statement for each database.
struct Both {
    maria: String,
    pg: String,
}

fn insert(id: i64, v: usize) -> Both {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let pick = |i: usize, vals: &'static [(&'static str, &'static str)]| vals[(v + i) % vals.len()];
    let maria: Vec<&str> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| pick(i, c.3).0)
        .collect();
    let pg: Vec<&str> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| pick(i, c.3).1)
        .collect();
    let names = names.join(", ");
    Both {
        maria: format!(
            "INSERT INTO {TABLE} (id, {names}) VALUES ({id}, {})",
            maria.join(", ")
        ),
        pg: format!(
            "INSERT INTO {TABLE} (id, {names}) VALUES ({id}, {})",
            pg.join(", ")
        ),
    }
}

fn update(id: i64, v: usize) -> Both {
    let set = |side: fn(&(&'static str, &'static str)) -> &'static str| -> String {
        COLUMNS
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} = {}", c.0, side(&c.3[(v + 2 * i + 1) % c.3.len()])))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Both {
        maria: format!("UPDATE {TABLE} SET {} WHERE id = {id}", set(|p| p.0)),
        pg: format!("UPDATE {TABLE} SET {} WHERE id = {id}", set(|p| p.1)),
    }
}

fn same(sql: String) -> Both {
    Both {
        maria: sql.clone(),
        pg: sql,
    }
}

/// The mirror's DDL (in the schema named like the MariaDB database).
fn mirror_schema(database: &str) -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|c| format!("{} {}", c.0, c.2)).collect();
    format!(
        "CREATE SCHEMA {database}; SET search_path = {database};
         CREATE TYPE size AS ENUM ('small', 'medium', 'large');
         CREATE TABLE {TABLE} (id bigint PRIMARY KEY, {});
         RESET search_path;\n",
        columns.join(", ")
    )
}

fn maria_table() -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|c| format!("{} {}", c.0, c.1)).collect();
    format!(
        "CREATE TABLE {TABLE} (id bigint PRIMARY KEY, {})",
        columns.join(", ")
    )
}

struct Sources<'a> {
    maria: Conn,
    p: &'a Pipeline,
    database: &'a str,
}

impl Sources<'_> {
    /// Runs one transaction of statements on both databases.
    async fn run(&mut self, statements: Vec<Both>) -> Result<()> {
        let maria: Vec<&str> = statements.iter().map(|s| s.maria.as_str()).collect();
        let pg: Vec<&str> = statements.iter().map(|s| s.pg.as_str()).collect();
        self.maria
            .query_drop(format!("BEGIN; {}; COMMIT", maria.join("; ")))
            .await
            .with_context(|| format!("MariaDB: {}", maria.join("; ")))?;
        self.p
            .env
            .client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL search_path = {}; {}; COMMIT",
                self.database,
                pg.join("; ")
            ))
            .await
            .with_context(|| format!("PostgreSQL: {}", pg.join("; ")))?;
        Ok(())
    }
}

/// The MariaDB URL's user and password (root of `scripts/services`).
fn maria_login(url: &str) -> (String, Option<String>, String, u16) {
    let opts = Opts::from_url(url).expect("ONCELY_MARIADB_URL");
    (
        opts.user().unwrap_or("root").to_owned(),
        opts.pass().map(str::to_owned),
        opts.ip_or_hostname().to_owned(),
        opts.tcp_port(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_mariadb_topics_reach_every_target_equal() -> Result<()> {
    let _turn = crate::debezium_compat::ONE_AT_A_TIME.lock().await;
    let url = env_var("ONCELY_MARIADB_URL");
    let database = unique("dbzm").to_lowercase().replace('-', "_");
    let mut maria = Conn::new(Opts::from_url(&url)?).await?;
    maria
        .query_drop(format!("CREATE DATABASE {database}; USE {database}"))
        .await?;
    let p = Pipeline::with_topics(
        "dbz_mariadb",
        &mirror_schema(&database),
        &format!("table.include.list = \"{database}\\\\.{TABLE}\"\n"),
        |prefix| vec![format!("{prefix}.{database}.{TABLE}")],
    )
    .await?;
    let mut sources = Sources {
        maria,
        p: &p,
        database: &database,
    };
    let result = exercise(&mut sources, &url).await;
    let _ = sources
        .maria
        .query_drop(format!("DROP DATABASE {database}"))
        .await;
    p.cleanup().await;
    result
}

async fn exercise(sources: &mut Sources<'_>, url: &str) -> Result<()> {
    let p = sources.p;
    let database = sources.database.to_owned();
    sources.maria.query_drop(maria_table()).await?;
    sources
        .run(
            (1..=SNAPSHOT_ROWS)
                .map(|id| insert(id, id as usize))
                .collect(),
        )
        .await?;
    let topic = p.topics()[0].clone();
    let (user, password, host, port) = maria_login(url);
    let table = format!("{database}.{TABLE}");
    let mut connect = Connect::start(&Connector {
        dir: &p.env.dir,
        brokers: &common::kafka_brokers(),
        prefix: &p.env.prefix,
        host: &host,
        port,
        user: &user,
        password: password.as_deref(),
        source: Source::MariaDb {
            database: &database,
            server_id: 5000 + rand::random::<u32>() % 1_000_000,
        },
        tables: &[&table],
        settings: &[],
        worker: &[("offset.flush.interval.ms", "1000")],
        jvm: &["-Xmx512m"],
    })?;
    wait_for_records(&mut connect, &topic, SNAPSHOT_ROWS).await?;

    let mut expected = SNAPSHOT_ROWS;
    for id in 101..=106 {
        sources.run(vec![insert(id, id as usize)]).await?;
        expected += 1;
    }
    for (n, id) in [1, 2, 3, 101].into_iter().enumerate() {
        sources.run(vec![update(id, n)]).await?;
        expected += 1;
    }
    // One transaction: two updates of one row around a two-row insert (one
    // rows event, rows 0 and 1): the last update must win.
    sources
        .run(vec![
            update(6, 1),
            same(format!("INSERT INTO {TABLE} (id) VALUES (201), (202)")),
            update(6, 4),
        ])
        .await?;
    expected += 4;
    // A rotation: the next changes are in a file whose offsets start again.
    sources.maria.query_drop("FLUSH BINARY LOGS").await?;
    sources.run(vec![update(7, 2), update(201, 3)]).await?;
    expected += 2;
    // A primary-key update (delete, tombstone, create) and deletes (delete
    // and tombstone).
    sources
        .run(vec![same(format!(
            "UPDATE {TABLE} SET id = 1000 WHERE id = 4"
        ))])
        .await?;
    expected += 3;
    for id in [5, 102] {
        sources
            .run(vec![same(format!("DELETE FROM {TABLE} WHERE id = {id}"))])
            .await?;
        expected += 2;
    }
    wait_for_records(&mut connect, &topic, expected).await?;

    every_target_equal(p, connect).await
}
