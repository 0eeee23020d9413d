//! The snapshot's chunk cursor on every key type it pages by: integers of
//! each width, exact and float numerics, text, varchar(n), char(n), bit(n),
//! varbit, uuid, dates and times, bytea, boolean, inet, an enum, interval,
//! and a composite key mixing char(n), int, varchar(n) and uuid. Each table
//! holds more rows than a chunk, with keys that differ only in trailing
//! spaces or share prefixes. The last key of a chunk is cast back to the
//! column's exact type (with its type modifier): a `char(6)` key cast to
//! `character` (char(1)) or a `bit(8)` key cast to `bit` is truncated, and
//! the snapshot reads the same chunk again and again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use serde_json::Value;

use crate::harness::capture::{read_committed, CaptureEnv};

/// Rows per chunk: smaller than every table.
const CHUNK: usize = 7;

/// `(table, DDL and rows)`; each table's key is its primary key.
const TABLES: &[(&str, &str)] = &[
    (
        "k_int2",
        "CREATE TABLE k_int2 (k smallint PRIMARY KEY, v int);
         INSERT INTO k_int2 SELECT g, g FROM generate_series(-20, 20) g;
         INSERT INTO k_int2 VALUES (-32768, 0), (32767, 0);",
    ),
    (
        "k_int4",
        "CREATE TABLE k_int4 (k integer PRIMARY KEY, v int);
         INSERT INTO k_int4 SELECT g * 1000003, g FROM generate_series(-15, 15) g;
         INSERT INTO k_int4 VALUES (-2147483648, 0), (2147483647, 0);",
    ),
    (
        "k_int8",
        "CREATE TABLE k_int8 (k bigint PRIMARY KEY, v int);
         INSERT INTO k_int8 SELECT g * 100000000007, g FROM generate_series(-15, 15) g;
         INSERT INTO k_int8 VALUES (-9223372036854775808, 0), (9223372036854775807, 0);",
    ),
    (
        "k_numeric",
        "CREATE TABLE k_numeric (k numeric(10,3) PRIMARY KEY, v int);
         INSERT INTO k_numeric SELECT round(g::numeric / 7, 3), g FROM generate_series(-20, 20) g;
         INSERT INTO k_numeric VALUES (9999999.999, 0), (-9999999.999, 0), (0.001, 0);",
    ),
    (
        "k_float8",
        "CREATE TABLE k_float8 (k float8 PRIMARY KEY, v int);
         INSERT INTO k_float8 SELECT g / 3.0::float8, g FROM generate_series(-20, 20) g;
         INSERT INTO k_float8 VALUES (1e300, 0), (-1e-300, 0), (0.1 + 0.2, 0);",
    ),
    (
        "k_text",
        "CREATE TABLE k_text (k text PRIMARY KEY, v int);
         INSERT INTO k_text SELECT 'p' || repeat(' ', g), g FROM generate_series(0, 12) g;
         INSERT INTO k_text SELECT 'p' || g, g FROM generate_series(0, 12) g;
         INSERT INTO k_text SELECT 'p ' || g, g FROM generate_series(0, 12) g;
         INSERT INTO k_text VALUES ('', 0), ('P', 0), (' p', 0), (E'p\\t', 0), ('p''q', 0), ('ü', 0);",
    ),
    (
        "k_varchar",
        "CREATE TABLE k_varchar (k varchar(12) PRIMARY KEY, v int);
         INSERT INTO k_varchar SELECT 'p' || repeat(' ', g), g FROM generate_series(0, 11) g;
         INSERT INTO k_varchar SELECT 'pp' || g, g FROM generate_series(0, 12) g;
         INSERT INTO k_varchar SELECT 'pp ' || g, g FROM generate_series(0, 12) g;
         INSERT INTO k_varchar VALUES ('', 0), ('123456789012', 0), ('12345678901 ', 0);",
    ),
    (
        "k_char",
        "CREATE TABLE k_char (k char(6) PRIMARY KEY, v int);
         INSERT INTO k_char SELECT 'a' || g, g FROM generate_series(0, 15) g;
         INSERT INTO k_char SELECT 'a ' || g, g FROM generate_series(0, 15) g;
         INSERT INTO k_char SELECT 'ab' || g, g FROM generate_series(0, 15) g;
         INSERT INTO k_char VALUES ('a', 0), ('', 0), ('zzzzzz', 0), (' a', 0);",
    ),
    (
        "k_bit",
        "CREATE TABLE k_bit (k bit(8) PRIMARY KEY, v int);
         INSERT INTO k_bit SELECT g::bit(8), g FROM generate_series(0, 255, 5) g;",
    ),
    (
        "k_varbit",
        "CREATE TABLE k_varbit (k varbit(16) PRIMARY KEY, v int);
         INSERT INTO k_varbit SELECT ('1' || repeat('0', g))::varbit, g FROM generate_series(0, 15) g;
         INSERT INTO k_varbit SELECT ('0' || repeat('1', g))::varbit, g FROM generate_series(0, 15) g;
         INSERT INTO k_varbit VALUES (B'', 0);",
    ),
    (
        "k_uuid",
        "CREATE TABLE k_uuid (k uuid PRIMARY KEY, v int);
         INSERT INTO k_uuid SELECT md5(g::text)::uuid, g FROM generate_series(1, 40) g;",
    ),
    (
        "k_date",
        "CREATE TABLE k_date (k date PRIMARY KEY, v int);
         INSERT INTO k_date SELECT date '1999-12-20' + g * 3, g FROM generate_series(0, 30) g;",
    ),
    (
        "k_timestamp",
        "CREATE TABLE k_timestamp (k timestamp(3) PRIMARY KEY, v int);
         INSERT INTO k_timestamp SELECT timestamp '2020-02-28 23:59:58' + g * interval '0.1234 s', g FROM generate_series(0, 30) g;",
    ),
    (
        "k_timestamptz",
        "CREATE TABLE k_timestamptz (k timestamptz PRIMARY KEY, v int);
         INSERT INTO k_timestamptz SELECT timestamptz '2020-03-29 01:59:59+02' + g * interval '1 h 0.000001 s', g FROM generate_series(0, 30) g;",
    ),
    (
        "k_time",
        "CREATE TABLE k_time (k time(2) PRIMARY KEY, v int);
         INSERT INTO k_time SELECT time '23:59:00' + g * interval '1.01 s', g FROM generate_series(0, 30) g;",
    ),
    (
        "k_interval",
        "CREATE TABLE k_interval (k interval PRIMARY KEY, v int);
         INSERT INTO k_interval SELECT g * interval '1 mon 1 day 1.5 s', g FROM generate_series(-15, 15) g;",
    ),
    (
        "k_bytea",
        "CREATE TABLE k_bytea (k bytea PRIMARY KEY, v int);
         INSERT INTO k_bytea SELECT decode(repeat('00', g % 4) || lpad(to_hex(g), 2, '0'), 'hex'), g FROM generate_series(0, 30) g;
         INSERT INTO k_bytea VALUES ('\\x'::bytea, 0), ('\\x5c27'::bytea, 0);",
    ),
    (
        "k_bool",
        "CREATE TABLE k_bool (flag boolean, n smallint, v int, PRIMARY KEY (flag, n));
         INSERT INTO k_bool SELECT g % 2 = 0, g / 2, g FROM generate_series(0, 30) g;",
    ),
    (
        "k_inet",
        "CREATE TABLE k_inet (k inet PRIMARY KEY, v int);
         INSERT INTO k_inet SELECT ('10.0.' || (g / 8) || '.' || (g % 8))::inet, g FROM generate_series(0, 30) g;
         INSERT INTO k_inet VALUES ('10.0.0.0/24', 0), ('10.0.0.0/8', 0), ('::1', 0), ('fe80::1/64', 0);",
    ),
    (
        "k_enum",
        "CREATE TYPE mood AS ENUM ('zeta', 'alpha', 'mid', 'al', 'alp', 'b', 'a', 'ab', 'z', 'y', 'x');
         CREATE TABLE k_enum (k mood PRIMARY KEY, v int);
         INSERT INTO k_enum SELECT m, 0 FROM unnest(enum_range(NULL::mood)) m;",
    ),
    (
        "k_composite",
        "CREATE TABLE k_composite (c char(4), i int, s varchar(10), u uuid, v int, PRIMARY KEY (c, i, s, u));
         INSERT INTO k_composite
         SELECT c, i, s, md5(c || i || s)::uuid, 0
         FROM unnest(ARRAY['a', 'ab', 'a b', 'b']) c, generate_series(1, 3) i,
              unnest(ARRAY['x', 'x ', 'x  y', 'y']) s;",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_cursor_pages_every_key_type_exactly_once() -> Result<()> {
    let env = CaptureEnv::new("cap_snap_keys").await?;
    // Clean up whatever the outcome: leaked slots pin WAL and use up max_replication_slots.
    let result = chunk_cursor_pages_every_key_type_exactly_once_body(&env).await;
    env.cleanup().await;
    result
}

async fn chunk_cursor_pages_every_key_type_exactly_once_body(env: &CaptureEnv) -> Result<()> {
    let mut rows: HashMap<String, usize> = HashMap::new();
    let mut tables: HashMap<String, usize> = HashMap::new();
    for (table, sql) in TABLES {
        env.client.batch_execute(sql).await?;
        let n: i64 = env
            .client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .get(0);
        ensure!(
            n as usize > CHUNK,
            "{table} has {n} rows, not more than a chunk"
        );
        rows.insert(env.topic(table), n as usize);
        tables.insert(format!("public.{table}"), n as usize);
    }
    let topics: Vec<String> = rows.keys().cloned().collect();
    // initial_only: capture exits 0 once every table is copied.
    let config = env.write_config(
        "capture.toml",
        &env.config(&format!(
            "snapshot.mode = \"initial_only\"\nschemas.enable = false\nincremental.snapshot.chunk.size = {CHUNK}\n\
             batch.max.ms = 20\n"
        )),
    )?;
    let mut capture = env.spawn_capture(&config)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = capture.try_wait()? {
            break status;
        }
        // A cursor that goes back reads a table's rows again and never ends:
        // say so as soon as the progress log counts more rows than a table has
        // (a read_committed reader cannot see to the end while capture keeps
        // committing).
        for line in env.capture_log().lines() {
            if let Some((table, read)) = progress(line) {
                let n = tables.get(table).copied().unwrap_or(usize::MAX);
                ensure!(
                    read <= n,
                    "{table}: {read} rows of {n} read before the snapshot ended: a chunk was read again"
                );
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the snapshot did not finish; log:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(
        status.success(),
        "capture exited with {status}; log:\n{}",
        env.capture_log()
    );
    ensure!(
        !env.capture_log().contains("snapshot of this table skipped"),
        "a table was skipped; log:\n{}",
        env.capture_log()
    );

    let t = topics.clone();
    let seen = tokio::task::spawn_blocking(move || read_committed(&t)).await??;
    let mut last = 0;
    for (topic, n) in &rows {
        let mut per_key: HashMap<String, usize> = HashMap::new();
        for s in seen.iter().filter(|s| &s.topic == topic) {
            ensure!(
                s.op() == Some("r"),
                "{topic}: a {:?} event in a snapshot of an idle table",
                s.op()
            );
            let key = s.key_payload().map(Value::to_string).unwrap_or_default();
            *per_key.entry(key).or_default() += 1;
            if s.payload().unwrap()["source"]["snapshot"] == "last" {
                last += 1;
            }
        }
        let twice: Vec<&String> = per_key
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(k, _)| k)
            .collect();
        ensure!(twice.is_empty(), "{topic}: keys read twice: {twice:?}");
        ensure!(
            per_key.len() == *n,
            "{topic}: {} of {n} rows snapshotted",
            per_key.len()
        );
    }
    ensure!(last == 1, "{last} rows marked as the snapshot's last");
    Ok(())
}

/// `(table, rows read)` of a "snapshot progress" log line.
fn progress(line: &str) -> Option<(&str, usize)> {
    if !line.contains("snapshot progress") {
        return None;
    }
    let field = |name: &str| {
        line.split(name)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
    };
    let table = field(" table=")?.trim_matches('"');
    let rows = field(" rows=")?.parse().ok()?;
    Some((table, rows))
}
