//! A real Debezium MariaDB connector (3.5.0.Final, the newest served; the
//! MySQL connector 3.6.1 refuses MariaDB) on the services' MariaDB, as a
//! Kafka Connect plugin (`scripts/services connect`), writes the topic of a
//! table of the MySQL types it maps: a snapshot, then streamed inserts,
//! updates (two of one row and a multi-row insert in one transaction), a
//! binlog rotation (`FLUSH BINARY LOGS`) between changes, a primary-key
//! update and deletes. The three oncely sinks read that topic, versioning
//! rows by binlog file, offset and row (sinks/src/event.rs).
//!
//! `oncely verify` then reads MariaDB itself (`source = "mysql"`: the
//! MySQL source's chunk reads and Debezium's MySQL mapping) and compares
//! it with the warehouse, the index and the cache, which hold what Debezium
//! wrote; there must be no dead letter. The warehouse's columns have the
//! PostgreSQL types a user would choose (`numeric(20,0)` for an unsigned
//! BIGINT under `bigint.unsigned.handling.mode = precise`,
//! `bit varying(n)`, extended WKB `bytea` for spatial values, ...: the
//! third field of [`COLUMNS`]), read from `information_schema`, and
//! answer queries by those types. A value changed and a row deleted
//! in MariaDB afterwards (Debezium stopped, so no target follows) are then
//! reported for every target.

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use oncely_testkit::connect::{Connect, Connector, Source};

use crate::debezium_compat::{every_target_equal, wait_for_records};

use crate::harness::common::{self, env_var, unique};
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

const TABLE: &str = "all_types";

/// A column: its name, MariaDB type, the type the warehouse gives it, and
/// the literals its values cycle through.
type Column = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

const COLUMNS: &[Column] = &[
    ("ti", "tinyint", "smallint", &["-128", "127", "NULL"]),
    ("tu", "tinyint unsigned", "smallint", &["255", "0"]),
    // Debezium's default keeps tinyint(1) an integer.
    ("t1", "tinyint(1)", "smallint", &["1", "0", "NULL"]),
    ("si", "smallint", "smallint", &["-32768", "32767"]),
    ("mi", "mediumint", "integer", &["-8388608", "8388607"]),
    ("iu", "int unsigned", "bigint", &["4294967295", "7"]),
    (
        "bi",
        "bigint",
        "bigint",
        &["-9223372036854775808", "9223372036854775807"],
    ),
    ("f", "float", "real", &["0.1", "-2.5", "3.14159", "NULL"]),
    (
        "d",
        "double",
        "double precision",
        &["0.1", "-2.5e-3", "1e15"],
    ),
    (
        "amount",
        "decimal(12,2)",
        "numeric(12,2)",
        &["0.00", "-9999999999.99", "163.38"],
    ),
    ("vc", "varchar(20)", "text", &["'v'", "''", "'日本語'"]),
    (
        "tx",
        "text",
        "text",
        &["'héllo wörld 🎉'", "'quote''s \"double\"'", "NULL"],
    ),
    (
        "dt",
        "date",
        "date",
        &["'2026-12-05'", "'1900-02-28'", "'1000-01-01'"],
    ),
    (
        "dt3",
        "datetime(3)",
        "timestamp without time zone",
        &["'2026-02-03 04:05:06.789'", "'1960-01-01 00:00:00.001'"],
    ),
    (
        "dt6",
        "datetime(6)",
        "timestamp without time zone",
        &["'2026-11-27 15:10:35.670111'", "'1970-01-01 00:00:00'"],
    ),
    (
        "tm",
        "time(6)",
        "time without time zone",
        &["'00:00:00'", "'23:59:59.999999'", "'12:34:56.5'"],
    ),
    // MariaDB's JSON is a LONGTEXT with a `json_valid` check, which
    // Debezium's MariaDB connector sends as a plain string (no
    // `io.debezium.data.Json`, which MySQL's JSON gets and the warehouse
    // makes `jsonb`): `text`. Verify compares it as JSON, as MariaDB keeps it.
    (
        "js",
        "json",
        "text",
        &[
            "'{\"a\": [1, 2.5, null], \"b\": \"x\"}'",
            "'[]'",
            "'{\"b\": 1e2, \"a\": [1.50], \"a\": {\"x\": 1E-2}}'",
        ],
    ),
    (
        "en",
        "enum('small','medium','large')",
        "text",
        &["'small'", "'large'", "NULL"],
    ),
    ("vb", "varbinary(8)", "bytea", &["0x00ff10", "X''"]),
    ("b1", "bit(1)", "boolean", &["b'1'", "b'0'"]),
    (
        "b12",
        "bit(12)",
        "bit varying(12)",
        &["b'101010111100'", "b'000000000001'"],
    ),
    ("yr", "year", "smallint", &["2155", "1901", "NULL"]),
    ("st", "set('a','b','c')", "text", &["'a,c'", "''", "'b'"]),
    (
        "ts",
        "timestamp(6) NULL",
        "timestamp with time zone",
        &["'2026-12-05 01:02:03.456789'", "NULL"],
    ),
    // Under `bigint.unsigned.handling.mode = precise` (set below).
    (
        "bu",
        "bigint unsigned",
        "numeric(20,0)",
        &["18446744073709551615", "0", "9223372036854775808"],
    ),
    // A zero date is null in a nullable column (Debezium's rule).
    ("zd", "date NULL", "date", &["'0000-00-00'", "'2000-01-01'"]),
    // Spatial values, with and without an SRID: extended WKB.
    (
        "g",
        "geometry NULL",
        "bytea",
        &[
            "ST_GeomFromText('POINT(1 2)', 4326)",
            "ST_GeomFromText('LINESTRING(0 0, 1 1.5)')",
            "NULL",
        ],
    ),
];

/// Rows in the table before Debezium starts (its snapshot).
const SNAPSHOT_ROWS: i64 = 12;

fn insert(id: i64, v: usize) -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let values: Vec<&str> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| c.3[(v + i) % c.3.len()])
        .collect();
    format!(
        "INSERT INTO {TABLE} (id, {}) VALUES ({id}, {})",
        names.join(", "),
        values.join(", ")
    )
}

fn update(id: i64, v: usize) -> String {
    let set: Vec<String> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = {}", c.0, c.3[(v + 2 * i + 1) % c.3.len()]))
        .collect();
    format!("UPDATE {TABLE} SET {} WHERE id = {id}", set.join(", "))
}

fn maria_table() -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|c| format!("{} {}", c.0, c.1)).collect();
    format!(
        "CREATE TABLE {TABLE} (id bigint PRIMARY KEY, {})",
        columns.join(", ")
    )
}

/// Runs one transaction of statements on MariaDB.
async fn run(maria: &mut Conn, statements: Vec<String>) -> Result<()> {
    let sql = format!("BEGIN; {}; COMMIT", statements.join("; "));
    maria.query_drop(&sql).await.context(sql)
}

/// The MariaDB URL's user, password, host and port (root of `scripts/services`).
fn maria_login(url: &str) -> (String, Option<String>, String, u16) {
    let opts = Opts::from_url(url).expect("ONCELY_MARIADB_URL");
    (
        opts.user().unwrap_or("root").to_owned(),
        opts.pass().map(str::to_owned),
        opts.ip_or_hostname().to_owned(),
        opts.tcp_port(),
    )
}

/// The capture configuration verify reads MariaDB by: the MySQL source,
/// the one database, the table, Debezium's topic prefix.
fn mariadb_capture_config(p: &Pipeline, url: &str, database: &str) -> String {
    let (user, password, host, port) = maria_login(url);
    let password = password
        .map(|pw| format!("database.password = \"{pw}\"\n"))
        .unwrap_or_default();
    format!(
        "source = \"mysql\"\ntopic.prefix = \"{}\"\n\
         database.hostname = \"{host}\"\ndatabase.port = {port}\ndatabase.user = \"{user}\"\n{password}\
         database.include.list = \"{database}\"\ntable.include.list = \"{database}\\\\.{TABLE}\"\n\
         bigint.unsigned.handling.mode = \"precise\"\n\
         kafka.bootstrap.servers = \"{}\"\n",
        p.env.prefix,
        common::kafka_brokers()
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
    // The PostgreSQL database holds only the warehouse.
    let mut p = Pipeline::with_topics("dbz_mariadb", "", "", |prefix| {
        vec![format!("{prefix}.{database}.{TABLE}")]
    })
    .await?;
    p.capture_config = p.env.write_config(
        "capture-mariadb.toml",
        &mariadb_capture_config(&p, &url, &database),
    )?;
    let result = exercise(&mut maria, &p, &database, &url).await;
    let _ = maria.query_drop(format!("DROP DATABASE {database}")).await;
    p.cleanup().await;
    result
}

async fn exercise(maria: &mut Conn, p: &Pipeline, database: &str, url: &str) -> Result<()> {
    maria.query_drop(maria_table()).await?;
    run(
        maria,
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
            database,
            server_id: 5000 + rand::random::<u32>() % 1_000_000,
        },
        tables: &[&table],
        settings: &[("bigint.unsigned.handling.mode", "precise")],
        worker: &[("offset.flush.interval.ms", "1000")],
        jvm: &["-Xmx512m"],
    })?;
    wait_for_records(&mut connect, &topic, SNAPSHOT_ROWS).await?;

    let mut expected = SNAPSHOT_ROWS;
    for id in 101..=106 {
        run(maria, vec![insert(id, id as usize)]).await?;
        expected += 1;
    }
    for (n, id) in [1, 2, 3, 101].into_iter().enumerate() {
        run(maria, vec![update(id, n)]).await?;
        expected += 1;
    }
    // One transaction: two updates of one row around a two-row insert (one
    // rows event, rows 0 and 1): the last update must win.
    run(
        maria,
        vec![
            update(6, 1),
            format!("INSERT INTO {TABLE} (id) VALUES (201), (202)"),
            update(6, 4),
        ],
    )
    .await?;
    expected += 4;
    // A rotation: the next changes are in a file whose offsets start again.
    maria.query_drop("FLUSH BINARY LOGS").await?;
    run(maria, vec![update(7, 2), update(201, 3)]).await?;
    expected += 2;
    // A primary-key update (delete, tombstone, create) and deletes (delete
    // and tombstone).
    run(
        maria,
        vec![format!("UPDATE {TABLE} SET id = 1000 WHERE id = 4")],
    )
    .await?;
    expected += 3;
    for id in [5, 102] {
        run(maria, vec![format!("DELETE FROM {TABLE} WHERE id = {id}")]).await?;
        expected += 2;
    }
    wait_for_records(&mut connect, &topic, expected).await?;

    every_target_equal(p, connect).await?;
    warehouse_types_are_natural(p, database).await?;
    differences_are_reported(maria, p).await
}

/// The warehouse's columns have the PostgreSQL types of [`COLUMNS`], and
/// hold the values a PostgreSQL user queries them by.
async fn warehouse_types_are_natural(p: &Pipeline, database: &str) -> Result<()> {
    let table = format!("{database}_{TABLE}");
    let rows = p
        .env
        .client
        .query(
            "SELECT column_name::text, format_type(a.atttypid, a.atttypmod)
             FROM information_schema.columns c
             JOIN pg_attribute a ON a.attrelid = format('%I.%I', c.table_schema, c.table_name)::regclass
               AND a.attname = c.column_name
             WHERE c.table_schema = $1 AND c.table_name = $2",
            &[&WAREHOUSE_SCHEMA, &table],
        )
        .await?;
    let types: std::collections::BTreeMap<String, String> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for (name, _, want, _) in COLUMNS {
        assert_eq!(
            types.get(*name).map(String::as_str),
            Some(*want),
            "warehouse column {name}: {types:?}"
        );
    }
    // Values as a PostgreSQL user queries them; each literal is one a row holds.
    let qualified = format!("{WAREHOUSE_SCHEMA}.{table}");
    for condition in [
        "bu = 18446744073709551615",
        "b12 = B'101010111100'",
        "yr = 2155",
        "st = 'a,c'",
        "js::jsonb @> '{\"b\": 100, \"a\": {\"x\": 0.01}}'",
        // POINT(1 2), SRID 4326, as PostGIS's extended WKB.
        "g = '\\x0101000020e6100000000000000000f03f0000000000000040'::bytea",
        "tm = '23:59:59.999999'",
        "dt6 = '2026-11-27 15:10:35.670111'",
    ] {
        let n: i64 = p
            .env
            .client
            .query_one(
                &format!("SELECT count(*) FROM {qualified} WHERE {condition}"),
                &[],
            )
            .await?
            .get(0);
        assert!(n > 0, "no warehouse row where {condition}");
    }
    Ok(())
}

/// With Debezium stopped, a value changed and a row deleted in MariaDB
/// reach no target: verify (not waiting, the sinks are stopped too) must
/// name both in each of the three.
async fn differences_are_reported(maria: &mut Conn, p: &Pipeline) -> Result<()> {
    run(
        maria,
        vec![
            format!("UPDATE {TABLE} SET dt6 = '2001-02-03 04:05:06.000007' WHERE id = 1"),
            format!("DELETE FROM {TABLE} WHERE id = 2"),
        ],
    )
    .await?;
    let report = oncely::verify::run(&oncely::verify::Options {
        capture: p.capture_config.clone(),
        sinks: p.sinks.clone(),
        wait: false,
        capture_offset: false,
        timeout: std::time::Duration::from_secs(60),
        examples: 5,
        retries: 0,
    })
    .await?;
    assert_eq!(report.targets.len(), 3);
    for target in &report.targets {
        assert_eq!(target.tables.len(), 1, "{}", target.label);
        let t = &target.tables[0];
        assert_eq!(
            (t.changed, t.missing, t.extra),
            (1, 0, 1),
            "{}: {t:?}",
            target.label
        );
        let changed = t.examples.iter().any(|d| {
            matches!(d, oncely::verify::Difference::Changed { key, diff }
                if key["id"] == 1 && diff.column == "dt6")
        });
        assert!(changed, "{}: {:?}", target.label, t.examples);
    }
    Ok(())
}
