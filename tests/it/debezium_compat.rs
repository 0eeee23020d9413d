//! A real Debezium 3.6.1.Final PostgreSQL connector (Kafka Connect 4.1.1
//! standalone, a child process; jars from `scripts/services connect`, found
//! through `ONCELY_CONNECT_LIB`) writes the topic of a table of every type it
//! maps, with its default settings, then with `decimal.handling.mode=string`
//! and with `time.precision.mode=connect`: a snapshot, then streamed inserts,
//! updates (one leaving a TOASTed column unchanged), a primary-key update and
//! deletes. The three oncely sinks read that topic, and `oncely verify`
//! (without a capture offset: Debezium writes none) must find the warehouse,
//! the index and the cache equal to the source, with no dead letter.
//!
//! The values are ones Debezium carries exactly in all three settings: times
//! and timestamps in milliseconds (`connect` has no more), intervals without
//! months (Debezium's microseconds count a month as 30.4375 days), `numeric[]`
//! without trailing zeros (Debezium's precise arrays drop them), `varbit`
//! without leading zeros (Debezium sends no length). docs/debezium.md
//! lists what else it changes.
//!
//! Once more with Debezium writing Avro: Apicurio Registry's Kafka Connect
//! converter (a plugin from `scripts/services connect`, found through
//! `ONCELY_CONNECT_AVRO_PLUGINS`) as key and value converter, in Confluent's
//! wire format, registering through the same registry whose Confluent API the
//! sinks read (`ONCELY_REGISTRY_URL`).
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use oncely_testkit::connect::{Connect, Connector, Source};

use crate::harness::capture::raw_records;
use crate::harness::checks::dead_letters;
use crate::harness::common;
use crate::harness::e2e::{summary, Pipeline};

const TABLE: &str = "all_types";

/// Columns and the SQL literals their values cycle through.
const COLUMNS: &[(&str, &str, &[&str])] = &[
    ("b", "boolean", &["true", "false", "NULL"]),
    ("i2", "smallint", &["0", "-32768", "32767"]),
    ("i4", "integer", &["-2147483648", "2147483647", "42"]),
    (
        "i8",
        "bigint",
        &["-9223372036854775808", "9223372036854775807", "NULL"],
    ),
    ("f4", "real", &["1.5", "-3.25e-5", "3.4028235e38"]),
    ("f8", "double precision", &["0.1", "-2.5e-3", "1e15"]),
    (
        "n122",
        "numeric(12,2)",
        &["0.00", "-9999999999.99", "163.38"],
    ),
    (
        "n",
        "numeric",
        &[
            "0.00000000000000000001",
            "123456789012345678901234567890.123456789",
            "-7",
        ],
    ),
    ("m", "money", &["12.34", "-0.99", "1000000.00"]),
    (
        "t",
        "text",
        &[
            "''",
            "'héllo wörld 🎉'",
            "'quote''s \"double\" \\backslash'",
            "NULL",
        ],
    ),
    ("vc", "varchar(20)", &["'v'", "repeat('x', 20)"]),
    ("ch", "char(5)", &["'ab'", "'abcde'"]),
    (
        "j",
        "json",
        &["'{\"a\": [1, 2.50, null], \"b\": \"x\"}'", "'[]'"],
    ),
    (
        "jb",
        "jsonb",
        &["'{\"z\": 1, \"a\": {\"n\": [true, false]}}'", "NULL"],
    ),
    ("x", "xml", &["'<a x=\"1\">t</a>'", "'<b/>'"]),
    (
        "u",
        "uuid",
        &[
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
            "gen_random_uuid()",
        ],
    ),
    ("e", "mood", &["'sad'", "'happy'", "NULL"]),
    (
        "by",
        "bytea",
        &["'\\x00ff10'", "'\\x'", "decode(md5('b'), 'hex')"],
    ),
    (
        "tz",
        "timestamptz",
        &[
            "'2026-11-27 15:10:35.670111+02'",
            "'1970-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59.999999+00'",
        ],
    ),
    (
        "ts",
        "timestamp",
        &[
            "'2000-01-01 00:00:00'",
            "'1969-12-31 23:59:59.999'",
            "'2262-04-11 23:47:16'",
        ],
    ),
    (
        "ts3",
        "timestamp(3)",
        &["'2026-02-03 04:05:06.789'", "'1960-01-01 00:00:00.001'"],
    ),
    (
        "d",
        "date",
        &["'2026-01-01'", "'1900-02-28'", "'0001-01-01'"],
    ),
    (
        "tm",
        "time",
        &["'00:00:00'", "'23:59:59.999'", "'12:34:56.5'"],
    ),
    ("tm3", "time(3)", &["'01:02:03.456'", "'23:59:59.999'"]),
    ("ttz", "timetz", &["'12:00:00+05:30'", "'00:00:00-12'"]),
    (
        "iv",
        "interval",
        &["'3 days 04:05:06.789'", "'-1 hour'", "'0'"],
    ),
    ("ip", "inet", &["'192.168.0.1/24'", "'10.0.0.1'"]),
    ("net", "cidr", &["'10.0.0.0/8'", "'2001:db8::/32'"]),
    ("mac", "macaddr", &["'08:00:2b:01:02:03'"]),
    ("bits", "bit(8)", &["B'10101010'", "B'00000001'"]),
    ("vb", "varbit", &["B'1'", "B'1101'"]),
    ("r", "int4range", &["'[1,10)'", "'empty'", "'(,5]'"]),
    ("pt", "point", &["'(1.5,-2)'"]),
    ("dom", "posint", &["5", "2147483647"]),
    ("ia", "integer[]", &["'{1,2,NULL}'", "'{}'"]),
    ("ta", "text[]", &["'{\"a b\",\"c,d\",\"\",NULL}'", "'{x}'"]),
    ("na", "numeric[]", &["'{1.1,2.5}'"]),
    ("ua", "uuid[]", &["ARRAY[gen_random_uuid()]"]),
    ("ea", "mood[]", &["'{sad,happy}'", "'{}'"]),
];

/// Rows in the table before Debezium starts (its snapshot).
const SNAPSHOT_ROWS: i64 = 12;

fn schema() -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|(c, t, _)| format!("{c} {t}")).collect();
    let mut sql = format!(
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
         CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
         CREATE TABLE {TABLE} (id bigint PRIMARY KEY, {}, big text);
         ALTER TABLE {TABLE} ALTER COLUMN big SET STORAGE EXTERNAL;\n",
        columns.join(", ")
    );
    for id in 1..=SNAPSHOT_ROWS {
        sql.push_str(&insert(id, id as usize));
        sql.push_str(";\n");
    }
    sql
}

fn insert(id: i64, v: usize) -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|(c, _, _)| *c).collect();
    let values: Vec<&str> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (_, _, vals))| vals[(v + i) % vals.len()])
        .collect();
    format!(
        "INSERT INTO {TABLE} (id, {}, big) VALUES ({id}, {}, \
         (SELECT string_agg(md5(g::text || '{id}'), '') FROM generate_series(1, 200) g))",
        names.join(", "),
        values.join(", ")
    )
}

fn update(id: i64, v: usize) -> String {
    let sets: Vec<String> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (c, _, vals))| format!("{c} = {}", vals[(v + 2 * i + 1) % vals.len()]))
        .collect();
    // `big` is left out: unchanged TOAST, `__debezium_unavailable_value`.
    format!("UPDATE {TABLE} SET {} WHERE id = {id}", sets.join(", "))
}

/// Starts Debezium on the pipeline's database, slot and topic prefix.
fn start_connect(
    p: &Pipeline,
    settings: &[(&str, &str)],
    worker: &[(&str, &str)],
) -> Result<Connect> {
    let password = pg_password();
    let brokers = common::kafka_brokers();
    let table = format!("public.{TABLE}");
    Connect::start(&Connector {
        dir: &p.env.dir,
        brokers: &brokers,
        prefix: &p.env.prefix,
        host: &p.env.pg_host,
        port: p.env.pg_port,
        user: &p.env.pg_user,
        password: password.as_deref(),
        source: Source::Postgres {
            dbname: &p.env.dbname,
            slot: &p.env.slot,
            publication: &p.env.slot,
        },
        tables: &[&table],
        settings,
        worker,
        jvm: &["-Xmx512m"],
    })
}

fn pg_password() -> Option<String> {
    let url: tokio_postgres::Config = common::pg_url().parse().ok()?;
    url.get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
}

/// The number of records in `topic` (all partitions).
pub(crate) fn records_in(topic: &str) -> Result<i64> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut total = 0;
    for t in metadata.topics() {
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            total += high - low;
        }
    }
    Ok(total)
}

/// Waits until `topic` holds `n` records, while Connect lives.
pub(crate) async fn wait_for_records(connect: &mut Connect, topic: &str, n: i64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        connect.check()?;
        let topic_name = topic.to_owned();
        let have = tokio::task::spawn_blocking(move || records_in(&topic_name))
            .await?
            .unwrap_or(0);
        if have >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{topic} holds {have} records, expected {n}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Connect JVMs are heavy: one at a time.
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How Debezium writes keys and values.
enum Format {
    /// Connect's JSON converter with schemas (the worker's default).
    Json,
    /// Apicurio's Avro converter through the registry at this Confluent API.
    Avro(String),
}

/// Apicurio's Avro converter, writing what Confluent's would: the 4-byte
/// content id (the id the Confluent API serves) after the magic byte, no
/// headers, subjects `<topic>-key` / `<topic>-value` in the default group.
fn avro_converter_settings(registry: &str) -> Vec<(String, String)> {
    // The converter speaks the registry's own v2 API beside the Confluent one.
    let base = registry.trim_end_matches('/');
    let base = base.strip_suffix("/apis/ccompat/v7").unwrap_or(base);
    let mut out = Vec::new();
    for side in ["key", "value"] {
        let c = format!("{side}.converter");
        out.push((
            c.clone(),
            "io.apicurio.registry.utils.converter.AvroConverter".into(),
        ));
        for (k, v) in [
            ("apicurio.registry.url", format!("{base}/apis/registry/v2")),
            ("apicurio.registry.auto-register", "true".into()),
            ("apicurio.registry.as-confluent", "true".into()),
            ("apicurio.registry.use-id", "contentId".into()),
            ("apicurio.registry.headers.enabled", "false".into()),
        ] {
            out.push((format!("{c}.{k}"), v));
        }
    }
    out
}

async fn run(name: &str, settings: &[(&str, &str)]) -> Result<()> {
    run_as(name, settings, Format::Json).await
}

async fn run_as(name: &str, settings: &[(&str, &str)], format: Format) -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    // The capture config only describes the source to `oncely verify`:
    // Debezium's default interval encoding is microseconds, so verify
    // compares intervals as oncely's `numeric` mode would send them.
    let p = Pipeline::new(
        name,
        &schema(),
        &[TABLE],
        "interval.handling.mode = \"numeric\"\n",
    )
    .await?;
    let result = exercise(&p, settings, &format).await;
    p.cleanup().await;
    result
}

fn as_refs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

async fn exercise(p: &Pipeline, settings: &[(&str, &str)], format: &Format) -> Result<()> {
    let topic = p.env.topic(TABLE);
    let mut worker = vec![("offset.flush.interval.ms".to_owned(), "1000".to_owned())];
    let mut settings: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Format::Avro(registry) = format {
        let plugins = std::env::var("ONCELY_CONNECT_AVRO_PLUGINS").context(
            "ONCELY_CONNECT_AVRO_PLUGINS is not set: run `scripts/services connect` (it fetches \
             Apicurio's Avro converter) and `eval \"$(scripts/services env)\"`",
        )?;
        worker.push(("plugin.path".into(), plugins));
        settings.extend(avro_converter_settings(registry));
        for i in 0..p.sinks.len() {
            p.prepend_sink_runner_keys(i, &format!("schema.registry.url = \"{registry}\""))?;
        }
    }
    let mut connect = start_connect(p, &as_refs(&settings), &as_refs(&worker))?;
    wait_for_records(&mut connect, &topic, SNAPSHOT_ROWS).await?;
    if let Format::Avro(registry) = format {
        in_confluent_wire_format(&topic, registry).await?;
    }

    // Streamed changes, one transaction each: inserts, updates (big left
    // unchanged), a primary-key update (delete, tombstone, create) and deletes
    // (delete and tombstone).
    let mut expected = SNAPSHOT_ROWS;
    for id in 101..=110 {
        p.env.client.batch_execute(&insert(id, id as usize)).await?;
        expected += 1;
    }
    for (n, id) in [1, 2, 3, 101, 102, 1].into_iter().enumerate() {
        p.env.client.batch_execute(&update(id, n)).await?;
        expected += 1;
    }
    // The create of a primary-key update gets no TOASTed value from
    // Debezium when the update left it unchanged (pgoutput does not send it,
    // and unlike oncely's capture Debezium does not read it): so it changes.
    p.env
        .client
        .batch_execute(&format!(
            "UPDATE {TABLE} SET id = 1000, big = big || 'x' WHERE id = 4"
        ))
        .await?;
    expected += 3;
    for id in [5, 103] {
        p.env
            .client
            .batch_execute(&format!("DELETE FROM {TABLE} WHERE id = {id}"))
            .await?;
        expected += 2;
    }
    wait_for_records(&mut connect, &topic, expected).await?;

    every_target_equal(p, connect).await
}

/// The first records of `topic` are Avro in Confluent's wire format, their
/// ids known to the registry's Confluent API as schemas of Debezium's
/// envelope: so the sinks below read Avro, not a JSON fallback.
async fn in_confluent_wire_format(topic: &str, registry: &str) -> Result<()> {
    let name = topic.to_owned();
    let records = tokio::task::spawn_blocking(move || raw_records(&name, 3)).await??;
    let client = oncely_core::avro::registry::RegistryClient::new(registry)?;
    for (key, value) in &records {
        ensure!(
            key[0] == 0 && value[0] == 0,
            "not Confluent's wire format: key {:?}, value {:?}",
            &key[..key.len().min(8)],
            &value[..value.len().min(8)]
        );
        let (id, body) = oncely_core::avro::wire::unframe(value)?;
        let payload = client
            .schema(id)
            .await
            .with_context(|| format!("value schema id {id}"))?
            .decode(body)?;
        ensure!(payload["op"] == "r", "a snapshot read: {payload}");
        ensure!(payload["after"]["id"].is_i64(), "{payload}");
        let (id, body) = oncely_core::avro::wire::unframe(key)?;
        let key = client.schema(id).await?.decode(body)?;
        ensure!(key["id"].is_i64(), "{key}");
    }
    Ok(())
}

/// The three sinks read what Debezium wrote; `oncely verify` (without a
/// capture offset) must find every target equal to the source, with no dead
/// letter and Debezium still running.
pub(crate) async fn every_target_equal(p: &Pipeline, mut connect: Connect) -> Result<()> {
    let mut sinks = Vec::new();
    for i in 0..3 {
        sinks.push(p.spawn_sink(i)?);
    }
    let report = p
        .verify_without_capture_offset(Duration::from_secs(120))
        .await?;
    connect.check()?;
    drop(sinks);
    drop(connect);
    let letters = dead_letters(&p.env.prefix)?;
    if !report.is_equal() || !letters.is_empty() {
        let logs: Vec<String> = (0..3)
            .map(|i| {
                p.sink_log(i)
                    .lines()
                    .filter(|l| l.contains("ERROR") || l.contains("WARN"))
                    .take(10)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        bail!(
            "{}\ndead letters: {letters:?}\nsink logs:\n{}",
            summary(&report),
            logs.join("\n")
        );
    }
    assert_eq!(report.compared(), 3, "{}", summary(&report));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_defaults_reach_every_target_equal() -> Result<()> {
    run("dbz_defaults", &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_string_decimals_reach_every_target_equal() -> Result<()> {
    run("dbz_string", &[("decimal.handling.mode", "string")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_connect_time_precision_reaches_every_target_equal() -> Result<()> {
    run("dbz_connect", &[("time.precision.mode", "connect")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_avro_through_the_registry_reaches_every_target_equal() -> Result<()> {
    let registry = common::registry_url();
    run_as("dbz_avro", &[], Format::Avro(registry)).await
}
