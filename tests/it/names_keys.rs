//! Names, keys and SQL made from user text (docs/design.md, "Topics and
//! records" and "Snapshots"), against the real services: tables whose topics, indexes,
//! warehouse tables or Redis keys would merge; Redis keys whose values hold
//! the separator; full row images after DROP and RENAME COLUMN in Redis; a
//! source column named like the warehouse's bookkeeping; and a snapshot
//! filter that tries to run a second statement.
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;

use crate::harness::capture::{read_committed, wait_for, CaptureEnv};
use crate::harness::common;
use crate::harness::e2e::{redis_conn, summary, Pipeline};

/// Distinct tables get distinct topics: `"Order Items"` and `Order_Items` both became
/// `<prefix>.Sales.Order_Items`. The second is quarantined (set aside, the
/// other flows), naming both tables and `topic.name.mapping`; with a mapping
/// both flow, and a table created later whose topic would be one of theirs
/// is quarantined with the same message while capture goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_whose_topics_would_merge_are_refused() -> Result<()> {
    let env = CaptureEnv::new("names_topics").await?;
    env.client
        .batch_execute(
            r#"CREATE SCHEMA "Sales";
               CREATE TABLE "Sales"."Order Items" (id int PRIMARY KEY, v text);
               CREATE TABLE "Sales"."Order_Items" (id int PRIMARY KEY, v text);"#,
        )
        .await?;
    let merged = env.write_config("capture-merged.toml", &env.config(""))?;
    let mut capture = env.spawn_capture(&merged)?;
    let quarantined = "table Sales.Order_Items is quarantined";
    let deadline = Instant::now() + Duration::from_secs(60);
    while !env.capture_log().contains(quarantined) {
        assert!(
            Instant::now() < deadline,
            "two tables share a topic and none was set aside:\n{}",
            env.capture_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = env.capture_log();
    for needle in [
        r#""Sales"."Order Items""#,
        r#""Sales"."Order_Items""#,
        "topic.name.mapping",
        &format!("{}.Sales.Order_Items", env.prefix),
    ] {
        assert!(log.contains(needle), "no {needle:?} in:\n{log}");
    }
    crate::harness::capture::terminate(&mut capture, Duration::from_secs(30))?;
    drop(capture);

    // Separated by a mapping: capture runs and each table has its topic.
    let spaced = format!("{}.Sales.Order-Items", env.prefix);
    let mapping = format!("topic.name.mapping = {{ \"Sales.Order Items\" = \"{spaced}\" }}\n");
    let config = env.write_config("capture-mapped.toml", &env.config(&mapping))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute(
            r#"INSERT INTO "Sales"."Order Items" VALUES (1, 'spaced');
               INSERT INTO "Sales"."Order_Items" VALUES (1, 'underscored');"#,
        )
        .await?;
    let underscored = format!("{}.Sales.Order_Items", env.prefix);
    let topics = vec![spaced.clone(), underscored.clone()];
    // Order_Items was set aside by the first run: its row comes with the
    // snapshot its release queues (op r), or as a change.
    let seen = wait_for(&topics, Duration::from_secs(60), |s| {
        s.iter()
            .filter(|r| matches!(r.op(), Some("c" | "r")))
            .count()
            >= 2
    })
    .await?;
    let by_topic: HashMap<&str, &str> = seen
        .iter()
        .filter_map(|r| {
            let v = r.payload()?.get("after")?.get("v")?.as_str()?;
            Some((r.topic.as_str(), v))
        })
        .collect();
    assert_eq!(by_topic.get(spaced.as_str()), Some(&"spaced"));
    assert_eq!(by_topic.get(underscored.as_str()), Some(&"underscored"));

    // A table created while capture runs, whose topic is taken: set aside,
    // capture goes on (after the fix it is snapshotted).
    env.client
        .batch_execute(
            r#"CREATE TABLE "Sales"."Order#Items" (id int PRIMARY KEY, v text);
               INSERT INTO "Sales"."Order#Items" VALUES (1, 'hash');"#,
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !env
        .capture_log()
        .contains("table Sales.Order#Items is quarantined")
    {
        assert!(
            Instant::now() < deadline,
            "a new table took another table's topic and was not set aside:\n{}",
            env.capture_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        capture.try_wait()?.is_none(),
        "capture stopped for one table"
    );
    let log = env.capture_log();
    for needle in [
        r#""Sales"."Order#Items""#,
        r#""Sales"."Order_Items""#,
        "topic.name.mapping",
    ] {
        assert!(log.contains(needle), "no {needle:?} in:\n{log}");
    }
    let hashed: Vec<_> = read_committed(&topics)?
        .into_iter()
        .filter(|r| {
            r.payload()
                .and_then(|p| p.get("after")?.get("v")?.as_str().map(|v| v == "hash"))
                .unwrap_or(false)
        })
        .collect();
    assert!(
        hashed.is_empty(),
        "the new table's row reached another table's topic"
    );
    drop(capture);
    env.cleanup().await;
    Ok(())
}

/// Rows of `"Sales"."Order Items"` with key values holding the Redis key
/// separator and the escape character, and a TOASTed column.
const ODD_SCHEMA: &str = r#"
    CREATE SCHEMA "Sales";
    CREATE TABLE "Sales"."Order Items" (a text, b text, old text, x int, big text, PRIMARY KEY (a, b));
    ALTER TABLE "Sales"."Order Items" ALTER COLUMN big SET STORAGE EXTERNAL;"#;

const ODD_KEYS: [(&str, &str); 6] = [
    ("a:b", "c"),
    ("a", "b:c"),
    ("a\\", "b"),
    ("a", "\\b"),
    ("x", "y"),
    ("", ":"),
];

/// Verify reads what the sinks wrote: `verify` names indexes and keys as the sinks
/// do (it looked for the index `... order items`); Redis keys of rows whose
/// key values hold `:` stay apart (`('a:b','c')` and `('a','b:c')` were one
/// key); and after DROP COLUMN and RENAME COLUMN a full row image replaces
/// the cached row in both Redis layouts, keeping only the unchanged TOASTed
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_and_keys_reach_every_target_and_full_images_replace_cached_rows() -> Result<()> {
    let mut p = Pipeline::with_topics("names_odd", ODD_SCHEMA, "", |prefix| {
        vec![format!("{prefix}.Sales.Order_Items")]
    })
    .await?;
    let rp = p.redis_prefix.clone();
    p.add_sink(
        "redis-json",
        &format!(
            "[sink]\nkind = \"redis\"\nurl = \"{}\"\nlayout = \"json\"\n\
             key.pattern = \"{rp}:j:{{table}}:{{key}}\"\nversion.key.prefix = \"{rp}:jv:\"\n\
             positions.key.prefix = \"{rp}:jpos:\"\n",
            common::redis_url()
        ),
    )?;
    let _capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let _sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_>>()?;
    let big = "B".repeat(20_000);
    for (a, b) in ODD_KEYS {
        p.env
            .client
            .execute(
                r#"INSERT INTO "Sales"."Order Items" VALUES ($1, $2, 'old', 1, $3)"#,
                &[&a, &b, &big],
            )
            .await?;
    }
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "after inserts:\n{}", summary(&report));
    // Compared, not skipped: verify knows the topic the sinks consume (it
    // named it `... Order Items` and skipped the table as no sink's).
    assert_all_compared(&report, p.sinks.len(), ODD_KEYS.len() as u64);

    p.env
        .client
        .batch_execute(
            r#"ALTER TABLE "Sales"."Order Items" DROP COLUMN old;
               ALTER TABLE "Sales"."Order Items" RENAME COLUMN x TO y;
               UPDATE "Sales"."Order Items" SET y = y + 1;"#,
        )
        .await?;
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(
        report.is_equal(),
        "after DROP/RENAME:\n{}",
        summary(&report)
    );
    assert_all_compared(&report, p.sinks.len(), ODD_KEYS.len() as u64);

    // Each row under its own key; no dropped or old-named field; the
    // unchanged TOASTed value kept.
    let mut conn = redis_conn().await?;
    let hash_keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{rp}:Order Items:*"))
        .query_async(&mut conn)
        .await?;
    assert_eq!(hash_keys.len(), ODD_KEYS.len(), "hash keys: {hash_keys:?}");
    for key in &hash_keys {
        let h: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        assert!(
            !h.contains_key("old") && !h.contains_key("x"),
            "{key}: {h:?}"
        );
        assert_eq!(h.get("y").map(String::as_str), Some("2"), "{key}: {h:?}");
        assert_eq!(h.get("big"), Some(&big), "{key}: TOASTed value lost");
    }
    let json_keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{rp}:j:Order Items:*"))
        .query_async(&mut conn)
        .await?;
    assert_eq!(json_keys.len(), ODD_KEYS.len(), "json keys: {json_keys:?}");
    for key in &json_keys {
        let text: String = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
        let row: serde_json::Map<String, Value> = serde_json::from_str(&text)?;
        assert!(
            !row.contains_key("old") && !row.contains_key("x"),
            "{key}: {text}"
        );
        assert_eq!(row.get("big").and_then(Value::as_str), Some(big.as_str()));
    }
    let escaped = format!("{rp}:Order Items:a\\:b:c");
    assert!(
        hash_keys.contains(&escaped),
        "{escaped} not in {hash_keys:?}"
    );
    drop(_sinks);
    drop(_capture);
    p.cleanup().await;
    Ok(())
}

/// Every one of `targets` compared the one table and holds `rows` rows.
fn assert_all_compared(report: &oncely::verify::Report, targets: usize, rows: u64) {
    assert_eq!(report.compared(), targets, "{}", summary(report));
    for t in &report.targets {
        for table in &t.tables {
            assert_eq!(table.target_rows, rows, "{} {}", t.label, table.location);
        }
    }
}

/// A source column `__oncely_deleted` (the warehouse's own column) once made
/// `CREATE TABLE` fail for ever, then stopped the whole sink. Now only that
/// table's partition is set aside (quarantined): the neighbour table keeps
/// flowing, `/readyz` and `oncely status` (exit 1) name the column and
/// `meta.column.prefix`, and after the fix (a prefix, in a new target
/// schema) the quarantined table is replayed from its stored position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_column_named_like_the_warehouse_bookkeeping_quarantines_only_its_table(
) -> Result<()> {
    let mut p = Pipeline::new(
        "names_reserved",
        r#"CREATE TABLE flags (id int PRIMARY KEY, "__oncely_deleted" boolean, note text);
           CREATE TABLE other (id int PRIMARY KEY, note text);"#,
        &["flags", "other"],
        "",
    )
    .await?;
    let port = crate::harness::common::free_addr().port();
    let listen = format!("127.0.0.1:{port}");
    let config = std::fs::read_to_string(&p.sinks[0])?;
    std::fs::write(
        &p.sinks[0],
        format!("metrics.listen = \"{listen}\"\n{config}"),
    )?;
    let _capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute(
            "INSERT INTO flags SELECT g, g % 2 = 0, 'n' FROM generate_series(1, 10) g;
             INSERT INTO other SELECT g, 'o' FROM generate_series(1, 10) g",
        )
        .await?;
    let mut sink = p.spawn_sink(0)?;
    let other_rows = |schema: &'static str| {
        let client = &p.env.client;
        async move {
            client
                .query_one(&format!("SELECT count(*) FROM {schema}.public_other"), &[])
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0)
        }
    };
    let addr: std::net::SocketAddr = listen.parse()?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let ready = loop {
        let ready = oncely_core::endpoint::get(addr, "/readyz").await.ok();
        if other_rows("wh").await == 10
            && ready
                .as_ref()
                .is_some_and(|(code, body)| *code == 503 && body.contains("quarantined"))
        {
            break ready.unwrap_or_default().1;
        }
        if let Some(status) = sink.0.try_wait()? {
            bail!(
                "the sink exited ({status}) instead of setting one table aside:\n{}",
                p.sink_log(0)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "never quarantined with the neighbour applied; /readyz {ready:?}:\n{}",
                p.sink_log(0)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        ready.contains("public.flags") || ready.contains("public_flags"),
        "{ready}"
    );
    assert!(
        ready.contains("__oncely_deleted") && ready.contains("meta.column.prefix"),
        "{ready}"
    );
    // The neighbour keeps flowing while the table is set aside.
    p.env
        .client
        .batch_execute("INSERT INTO other SELECT g, 'p' FROM generate_series(11, 30) g")
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while other_rows("wh").await != 30 {
        if Instant::now() > deadline {
            bail!("the neighbour's new rows never arrived:\n{}", p.sink_log(0));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["status", "--capture"])
        .arg(&p.capture_config)
        .arg("--sink")
        .arg(&p.sinks[0])
        .env("RUST_LOG", "warn")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "quarantine is degraded:\n{text}"
    );
    assert!(
        text.contains("quarantined") && text.contains("meta.column.prefix"),
        "{text}"
    );
    assert!(sink.0.try_wait()?.is_none(), "the sink stopped");
    drop(sink);

    // The fix: another prefix, in a new schema (the old tables keep the old names).
    let config = std::fs::read_to_string(&p.sinks[0])?.replace(
        "target.schema = \"wh\"",
        "target.schema = \"wh_fixed\"\nmeta.column.prefix = \"_oncely_meta_\"",
    );
    std::fs::write(&p.sinks[0], config)?;
    let _sink = p.spawn_sink(0)?;
    p.sinks.truncate(1);
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "{}", summary(&report));
    let flags = p
        .env
        .client
        .query_one("SELECT count(*) FROM wh_fixed.public_flags", &[])
        .await?
        .get::<_, i64>(0);
    assert_eq!(flags, 10);
    drop(_sink);
    drop(_capture);
    p.cleanup().await;
    Ok(())
}

/// Tables one target name would merge — lower-casing in the index name
/// (`"Sales"."Orders"`, `sales.orders`), `${schema}_${table}` in the
/// warehouse (`a_b.c`, `a.b_c`), `{table}` in the Redis key pattern
/// (`s1.t`, `s2.t`) — set the second table aside (quarantine), naming both
/// tables and the setting; the sink goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_merged_by_a_target_name_quarantine_the_second_naming_both() -> Result<()> {
    let schema = r#"
        CREATE SCHEMA "Sales"; CREATE SCHEMA sales; CREATE SCHEMA a_b; CREATE SCHEMA a;
        CREATE SCHEMA s1; CREATE SCHEMA s2;
        CREATE TABLE "Sales"."Orders" (id int PRIMARY KEY);
        CREATE TABLE sales.orders (id int PRIMARY KEY);
        CREATE TABLE a_b.c (id int PRIMARY KEY);
        CREATE TABLE a.b_c (id int PRIMARY KEY);
        CREATE TABLE s1.t (id int PRIMARY KEY);
        CREATE TABLE s2.t (id int PRIMARY KEY);"#;
    // `a_b.c` and `a.b_c` also collide as Kafka topics ('.' and '_').
    let p = Pipeline::with_topics(
        "names_merge",
        schema,
        "topic.name.mapping = { \"a.b_c\" = \"{prefix}.a.b-c\" }\n",
        |prefix| {
            [
                "Sales.Orders",
                "sales.orders",
                "a_b.c",
                "a.b-c",
                "s1.t",
                "s2.t",
            ]
            .iter()
            .map(|t| format!("{prefix}.{t}"))
            .collect()
        },
    )
    .await?;
    let _capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute(
            r#"INSERT INTO "Sales"."Orders" VALUES (1); INSERT INTO sales.orders VALUES (1);
               INSERT INTO a_b.c VALUES (1); INSERT INTO a.b_c VALUES (1);
               INSERT INTO s1.t VALUES (1); INSERT INTO s2.t VALUES (1);"#,
        )
        .await?;
    let expected = [
        (0, r#""a_b"."c""#, r#""a"."b_c""#, "table.name.format"),
        (
            1,
            r#""Sales"."Orders""#,
            r#""sales"."orders""#,
            "index.pattern",
        ),
        (2, r#""s1"."t""#, r#""s2"."t""#, "key.pattern"),
    ];
    for (i, first, second, setting) in expected {
        let mut sink = p.spawn_sink(i)?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let log = p.sink_log(i);
            if log.contains("quarantined")
                && log.contains(first)
                && log.contains(second)
                && log.contains(setting)
            {
                break;
            }
            if let Some(status) = sink.0.try_wait()? {
                bail!("sink {i} exited ({status}) instead of setting one table aside:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("sink {i} mixed two tables into one target:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    drop(_capture);
    p.cleanup().await;
    Ok(())
}

/// A snapshot filter is one boolean expression, never SQL to run: the filter `true) LIMIT 0; DROP TABLE ...; SELECT (1`
/// ran its DROP under the capture role. The CLI refuses it, a signal row
/// holding it is ignored, a filter that is not boolean is ignored, nothing
/// is dropped — and a real filter still snapshots what it selects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_filter_cannot_run_a_second_statement() -> Result<()> {
    let env = CaptureEnv::new("names_filter").await?;
    env.client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text);
             INSERT INTO t SELECT g, 'v' FROM generate_series(1, 20) g;
             CREATE TABLE victim (id int PRIMARY KEY);
             CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));",
        )
        .await?;
    let config = env.write_config(
        "capture.toml",
        &env.config(
            "signal.data.collection = \"public.oncely_signal\"\ntable.include.list = \"public.t,public.oncely_signal\"\n",
        ),
    )?;
    let _capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let attack = "true) LIMIT 0; DROP TABLE public.victim; SELECT (1";

    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(&config)
        .args(["--table", "public.t", "--filter", attack])
        .output()?;
    assert!(!out.status.success(), "the CLI inserted the attack");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a single expression"), "{stderr}");

    // Past the CLI: signal rows written by anyone who may write the table.
    for (id, filter) in [
        ("attack", attack),
        ("not-boolean", "id"),
        ("two", "1=1) OR (1=1"),
    ] {
        let data = serde_json::json!({
            "data-collections": ["public.t"],
            "additional-conditions": [{"data-collection": "public.t", "filter": filter}],
        })
        .to_string();
        env.client
            .execute(
                "INSERT INTO oncely_signal VALUES ($1, 'execute-snapshot', $2)",
                &[&id, &data],
            )
            .await?;
    }
    let data = serde_json::json!({
        "data-collections": ["public.t"],
        "additional-conditions": [{"data-collection": "public.t", "filter": "id > 15"}],
    })
    .to_string();
    env.client
        .execute(
            "INSERT INTO oncely_signal VALUES ('real', 'execute-snapshot', $1)",
            &[&data],
        )
        .await?;
    let topics = vec![env.topic("t")];
    let seen = wait_for(&topics, Duration::from_secs(90), |s| {
        s.iter().filter(|r| r.op() == Some("r")).count() >= 5
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = read_committed(&topics).unwrap_or(seen);
    let ids: Vec<i64> = seen
        .iter()
        .filter(|r| r.op() == Some("r"))
        .filter_map(|r| r.payload()?.get("after")?.get("id")?.as_i64())
        .collect();
    assert_eq!(ids, (16..=20).collect::<Vec<_>>(), "snapshot rows");
    let victim: Option<String> = env
        .client
        .query_one("SELECT to_regclass('public.victim')::text", &[])
        .await?
        .get(0);
    assert_eq!(
        victim.as_deref(),
        Some("victim"),
        "the filter dropped a table"
    );
    let log = env.capture_log();
    assert!(log.contains("not a boolean expression"), "{log}");
    drop(_capture);
    env.cleanup().await;
    Ok(())
}
