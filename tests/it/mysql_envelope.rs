//! Regenerates `tests/fixtures/mysql/debezium_every_type.json`: Debezium's
//! MariaDB connector (the Connect worker of `scripts/services connect`)
//! captures the table of every type the mapping covers (the one of
//! `mysql_snapshot.rs`), a snapshot of its three rows and then a streamed
//! update, delete and insert; the same rows are read by oncely's snapshot
//! reader and binlog decoder. Each record is stored with the cells oncely
//! read (the envelope's input) and Debezium's key and value, with what
//! varies per run normalised. The unit test `sources::mysql::envelope`
//! builds oncely's records from those cells and compares them field for
//! field. Run it when the mapping or the envelope changes on purpose:
//!
//! ```sh
//! eval "$(scripts/services env)"
//! cargo test --test it mysql_envelope -- --ignored
//! ```
//!
//! Before it writes the file it checks, on the unnormalised records, that
//! the source fields oncely derives from a binlog change (`file`, `pos`,
//! `row`, `gtid`, `server_id`, `thread`, `ts_ms`) or from the snapshot's
//! position are the ones Debezium wrote. Regenerating gives the same file
//! byte for byte while the mapping and Debezium's release stay the same.

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use oncely_capture::testing::mysql::checks::current_position;
use oncely_capture::testing::mysql::envelope::{
    change_source, shape_json, source_json, MySqlSource, Snapshot, SNAPSHOT_SERVER_ID,
};
use oncely_capture::testing::mysql::{
    BinlogChange, BinlogReader, ResumeBy, ServerFacts, SnapshotReader, SnapshotSettings,
};
use oncely_testkit::connect::{Connect, Connector, Source};
use serde_json::{json, Value};

use crate::debezium_compat::{wait_for_records, ONE_AT_A_TIME};
use crate::harness::common::{self, env_var, unique};
use crate::mysql_binlog::{capture_opts, read_until, server_id};
use crate::mysql_snapshot::{EVERY_ROW, EVERY_TYPE};

const PREFIX: &str = "shop";
const DATABASE: &str = "inventory";

/// One Debezium run: the fixture's name and the connector's mapping
/// settings (Debezium's keys, oncely's too).
struct Variant {
    file: &'static str,
    modes: &'static [(&'static str, &'static str)],
}

/// Default modes, and the non-default decimal and BIGINT UNSIGNED modes
/// (`time.precision.mode = connect` is left out: Debezium refuses the
/// table's negative TIME values under it).
const VARIANTS: [Variant; 2] = [
    Variant {
        file: "debezium_every_type.json",
        modes: &[],
    },
    Variant {
        file: "debezium_every_type_modes.json",
        modes: &[
            ("decimal.handling.mode", "string"),
            ("bigint.unsigned.handling.mode", "precise"),
        ],
    },
];

fn fixture_path(file: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mysql")
        .join(file)
}

/// Debezium's record as JSON (`null` for a tombstone's value).
fn parse(bytes: Option<&[u8]>) -> Value {
    bytes.map_or(Value::Null, |b| {
        serde_json::from_slice(b).expect("Debezium writes JSON")
    })
}

/// Replaces what differs per run in a Debezium value: times, the server
/// and thread ids, the GTID, the binlog file and offset.
fn normalise(value: &mut Value) {
    let Some(payload) = value.get_mut("payload").and_then(Value::as_object_mut) else {
        return;
    };
    for (k, v) in [
        ("ts_ms", 1_000_i64),
        ("ts_us", 1_000_000),
        ("ts_ns", 1_000_000_000),
    ] {
        if payload.contains_key(k) {
            payload.insert(k.into(), json!(v));
        }
    }
    let Some(source) = payload.get_mut("source").and_then(Value::as_object_mut) else {
        return;
    };
    for (k, v) in [
        ("ts_ms", json!(2_000)),
        ("ts_us", json!(2_000_000)),
        ("ts_ns", json!(2_000_000_000_i64)),
        ("server_id", json!(1)),
        ("file", json!("binlog.000001")),
        ("pos", json!(4)),
    ] {
        source.insert(k.into(), v);
    }
    for (k, v) in [("thread", json!(7)), ("gtid", json!("0-1-100"))] {
        if !source[k].is_null() {
            source.insert(k.into(), v);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "regenerates the Debezium fixtures; needs the Connect worker (scripts/services connect)"]
async fn regenerate_debezium_fixtures() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    for variant in &VARIANTS {
        regenerate(variant).await?;
    }
    Ok(())
}

async fn regenerate(variant: &Variant) -> Result<()> {
    let url = env_var("ONCELY_MARIADB_URL");
    let db = unique("oncely_dbzenv").to_lowercase().replace('-', "_");
    let prefix = unique("dbzenv").to_lowercase().replace('-', "_");
    let mut root = Conn::new(Opts::from_url(&url)?).await?;
    root.query_drop(format!("CREATE DATABASE {db}; USE {db}"))
        .await?;
    root.query_drop("SET SESSION time_zone = '+00:00', SESSION sql_mode = ''")
        .await?;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    let result = exercise(&mut root, &url, (&db, &prefix), &dir, variant).await;
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    result
}

async fn exercise(
    root: &mut Conn,
    url: &str,
    (db, prefix): (&str, &str),
    dir: &std::path::Path,
    variant: &Variant,
) -> Result<()> {
    root.query_drop(EVERY_TYPE).await?;
    root.query_drop(EVERY_ROW).await?;
    // Debezium's snapshot dies on a YEAR 0000 (the MariaDB JDBC driver
    // throws IllegalArgumentException reading it): the snapshot gets none,
    // the streamed update below writes one.
    root.query_drop("UPDATE every_type SET yr = 1901 WHERE yr = 0")
        .await?;

    // Oncely's snapshot of the rows, and its position for the stream.
    let tables = [(db.to_string(), "every_type".to_string())];
    let mut snap =
        SnapshotReader::begin(Opts::from_url(url)?, &SnapshotSettings::default(), &tables).await?;
    let chunk = snap.read_chunk(db, "every_type", None, 100).await?;
    let shape = snap.shape(db, "every_type").context("shape")?;
    let start = snap.position().clone();
    snap.finish().await?;

    let opts = Opts::from_url(url)?;
    let topic = format!("{prefix}.{db}.every_type");
    let table = format!("{db}.every_type");
    let mut connect = Connect::start(&Connector {
        dir,
        brokers: &common::kafka_brokers(),
        prefix,
        host: opts.ip_or_hostname(),
        port: opts.tcp_port(),
        user: opts.user().unwrap_or("root"),
        password: opts.pass(),
        source: Source::MariaDb {
            database: db,
            server_id: 5000 + rand::random::<u32>() % 1_000_000,
        },
        tables: &[&table],
        settings: variant.modes,
        worker: &[("offset.flush.interval.ms", "1000")],
        jvm: &["-Xmx512m"],
    })?;
    wait_for_records(&mut connect, &topic, 3).await?;

    let columns: String = root
        .query_first(format!(
            "SELECT GROUP_CONCAT(column_name ORDER BY ordinal_position) FROM \
             information_schema.columns WHERE table_schema = '{db}' AND table_name = 'every_type' \
             AND column_name <> 'id'"
        ))
        .await?
        .context("columns")?;
    root.query_drop(
        "UPDATE every_type SET vc = 'changed', f = 0.1, yr = 0, ts6 = '2001-02-03 04:05:06.7' WHERE id = 1",
    )
    .await?;
    root.query_drop("DELETE FROM every_type WHERE id = 3")
        .await?;
    root.query_drop(format!(
        "INSERT INTO every_type SELECT 4, {columns} FROM every_type WHERE id = 1"
    ))
    .await?;
    // 3 snapshot reads, an update, a delete and its tombstone, an insert.
    wait_for_records(&mut connect, &topic, 7).await?;
    let records = oncely_testkit::kafka::read_topic(&topic, 1, 7).await;
    drop(connect);

    let mut cap = Conn::new(capture_opts()).await?;
    let facts = ServerFacts::read(&mut cap).await?;
    let _ = current_position(&mut cap, facts.flavor, &facts.version).await?;
    let mut reader = BinlogReader::open(
        capture_opts(),
        server_id(),
        facts.flavor,
        &start,
        ResumeBy::FilePosition,
        crate::mysql_binlog::only(db),
    )
    .await?;
    let streamed: Vec<_> = read_until(&mut reader, db, 4, false)
        .await
        .into_iter()
        .filter_map(|c| match c {
            BinlogChange::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    reader.close().await.ok();
    anyhow::ensure!(streamed.len() == 3, "{streamed:#?}");

    let rename = |v: &Value| -> Value {
        let text = v.to_string().replace(prefix, PREFIX).replace(db, DATABASE);
        serde_json::from_str(&text).expect("JSON")
    };
    let mut out = Vec::new();
    let values: Vec<_> = records
        .iter()
        .map(|m| {
            use rdkafka::Message as _;
            (parse(m.key()), parse(m.payload()))
        })
        .filter(|(_, v)| !v.is_null())
        .collect();
    anyhow::ensure!(values.len() == 6, "{values:#?}");
    for (i, (key, mut value)) in values.into_iter().enumerate() {
        let input = if i < 3 {
            let snapshot = if i == 2 { "last" } else { "true" };
            // Debezium's snapshot read at the position oncely's did (no
            // write between them).
            let ts_ms = value["payload"]["source"]["ts_ms"].as_i64().unwrap_or(0);
            let ours = source_json(&MySqlSource::of_snapshot(&start, ts_ms, Snapshot::True));
            let dbz = &value["payload"]["source"];
            for k in ["file", "pos", "row", "gtid", "server_id", "thread"] {
                anyhow::ensure!(
                    ours[k] == dbz[k],
                    "snapshot source.{k}: oncely {ours} Debezium {dbz}"
                );
            }
            json!({"op": "r", "before": null, "after": chunk.rows[i], "snapshot": snapshot,
                   "server_id": SNAPSHOT_SERVER_ID, "row": 0})
        } else {
            let change = &streamed[i - 3];
            let source = change_source(change, None);
            let dbz = &value["payload"]["source"];
            // What oncely derives from the change is what Debezium wrote.
            for k in ["file", "pos", "row", "gtid", "server_id", "thread", "ts_ms"] {
                anyhow::ensure!(
                    source[k] == dbz[k],
                    "source.{k}: oncely {source} Debezium {dbz}"
                );
            }
            json!({"op": value["payload"]["op"], "before": change.before, "after": change.after,
                   "snapshot": "false", "row": source["row"]})
        };
        normalise(&mut value);
        out.push(json!({"input": input, "key": rename(&key), "value": rename(&value)}));
    }
    let modes: serde_json::Map<String, Value> = variant
        .modes
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let fixture = json!({
        "modes": modes,
        "description": "Debezium's MariaDB connector 3.5.0.Final, the modes named (else the \
            defaults), on the table \
            every_type of tests/it/mysql_snapshot.rs: a snapshot of its three rows (YEAR 0000 \
            made 1901 first: Debezium's snapshot fails on it in the MariaDB JDBC driver), then an \
            update of row 1 (FLOAT 0.1 and YEAR 0000 streamed), the delete of row 3 (its tombstone left out) and the insert of \
            row 4. `input` is what oncely's snapshot reader and binlog decoder read for each \
            record. Regenerate: cargo test --test it mysql_envelope -- --ignored",
        "table": rename(&shape_json(&shape)),
        "records": out,
    });
    std::fs::write(
        fixture_path(variant.file),
        serde_json::to_string_pretty(&fixture)? + "\n",
    )?;
    Ok(())
}
