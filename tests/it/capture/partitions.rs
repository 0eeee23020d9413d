//! Partitioned tables are captured as one table each, through their root:
//! one topic, the root's key, a snapshot of the root (every partition), and
//! streamed changes under the root's name whatever partition they touch —
//! for list, range, hash and two-level partitioning, rows moving between
//! partitions, partitions attached, created and detached while capture
//! streams, and capture restarts. `oncely verify` then finds the warehouse,
//! Elasticsearch and Redis holding one table per root, equal to the source.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::harness::capture::{kill9, read_committed, terminate, wait_for, CaptureEnv, Seen};
use crate::harness::e2e::Pipeline;

/// Four partitioned roots: list, range, hash, and list over range (two levels).
const SCHEMA: &str = "
    CREATE TABLE orders (id int, region text, qty int, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
    CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu');
    CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us');
    CREATE TABLE readings (id int, day int, v int, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
    CREATE TABLE readings_low PARTITION OF readings FOR VALUES FROM (0) TO (100);
    CREATE TABLE readings_high PARTITION OF readings FOR VALUES FROM (100) TO (200);
    CREATE TABLE accounts (id int PRIMARY KEY, balance int) PARTITION BY HASH (id);
    CREATE TABLE accounts_0 PARTITION OF accounts FOR VALUES WITH (MODULUS 3, REMAINDER 0);
    CREATE TABLE accounts_1 PARTITION OF accounts FOR VALUES WITH (MODULUS 3, REMAINDER 1);
    CREATE TABLE accounts_2 PARTITION OF accounts FOR VALUES WITH (MODULUS 3, REMAINDER 2);
    CREATE TABLE events (id int, kind text, v int, PRIMARY KEY (id, kind)) PARTITION BY LIST (kind);
    CREATE TABLE events_a PARTITION OF events FOR VALUES IN ('a') PARTITION BY RANGE (id);
    CREATE TABLE events_a_low PARTITION OF events_a FOR VALUES FROM (0) TO (1000);
    CREATE TABLE events_a_high PARTITION OF events_a FOR VALUES FROM (1000) TO (MAXVALUE);
    CREATE TABLE events_b PARTITION OF events FOR VALUES IN ('b');
    INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g, 'n' || g FROM generate_series(1, 20) g;
    INSERT INTO readings SELECT g, g * 9 % 200, g FROM generate_series(1, 20) g;
    INSERT INTO accounts SELECT g, g * 10 FROM generate_series(1, 20) g;
    INSERT INTO events SELECT g, CASE WHEN g % 3 = 0 THEN 'b' ELSE 'a' END, g FROM generate_series(990, 1010) g;";

/// Changes within and across partitions of each kind. Every move between
/// partitions changes the key (the partition key is part of it).
const MOVES: &str = "
    INSERT INTO orders VALUES (100, 'eu', 1, 'new');
    UPDATE orders SET qty = qty + 1000 WHERE id <= 6;
    UPDATE orders SET region = 'us' WHERE id = 2;
    DELETE FROM orders WHERE id = 3;
    UPDATE readings SET day = 150 WHERE id = 1;
    UPDATE readings SET v = -v WHERE id = 2;
    INSERT INTO readings VALUES (50, 199, 5);
    UPDATE accounts SET id = id + 100 WHERE id IN (5, 6);
    UPDATE accounts SET balance = 0 WHERE id = 8;
    DELETE FROM accounts WHERE id = 7;
    UPDATE events SET id = id + 2000 WHERE id = 995;
    UPDATE events SET kind = 'b' WHERE id = 991;
    DELETE FROM events WHERE id = 1001;";

/// A table attached (its columns in another order than the root's) and one
/// created as a partition, while capture streams; rows go into both.
const ATTACH: &str = "
    CREATE TABLE orders_asia (note text, qty int, region text NOT NULL, id int NOT NULL);
    ALTER TABLE orders ATTACH PARTITION orders_asia FOR VALUES IN ('asia');
    INSERT INTO orders VALUES (200, 'asia', 1, 'attached');
    CREATE TABLE orders_apac PARTITION OF orders FOR VALUES IN ('apac');
    INSERT INTO orders VALUES (201, 'apac', 1, 'created');
    UPDATE orders SET region = 'asia' WHERE id = 4;
    UPDATE orders SET qty = 7 WHERE id = 200;";

const ROOTS: [(&str, &[&str]); 4] = [
    ("orders", &["id", "region"]),
    ("readings", &["id", "day"]),
    ("accounts", &["id"]),
    ("events", &["id", "kind"]),
];

fn key_of(obj: &Value, cols: &[&str]) -> String {
    cols.iter()
        .map(|c| obj[*c].to_string())
        .collect::<Vec<_>>()
        .join("|")
}

/// What a consumer applying `records` in order holds: key -> row.
fn fold(records: &[Seen], cols: &[&str]) -> Result<BTreeMap<String, Value>> {
    let mut rows = BTreeMap::new();
    for r in records {
        let Some(payload) = r.payload() else { continue };
        let key = key_of(r.key_payload().context("event without a key")?, cols);
        match payload["op"].as_str() {
            Some("d") => {
                rows.remove(&key);
            }
            Some("c" | "u" | "r") => {
                rows.insert(key, payload["after"].clone());
            }
            other => anyhow::bail!("unexpected op {other:?} in {payload}"),
        }
    }
    Ok(rows)
}

/// The rows of `table` (a root reads every partition), key -> row.
async fn source_rows(
    client: &tokio_postgres::Client,
    table: &str,
    cols: &[&str],
) -> Result<BTreeMap<String, Value>> {
    let rows = client
        .query(&format!("SELECT to_jsonb(t)::text FROM {table} t"), &[])
        .await?;
    rows.iter()
        .map(|r| {
            let v: Value = serde_json::from_str(&r.get::<_, String>(0))?;
            Ok((key_of(&v, cols), v))
        })
        .collect()
}

fn leaf_topics(env: &CaptureEnv) -> Vec<String> {
    [
        "orders_eu",
        "orders_us",
        "orders_asia",
        "orders_apac",
        "readings_low",
        "readings_high",
        "accounts_0",
        "accounts_1",
        "accounts_2",
        "events_a",
        "events_a_low",
        "events_a_high",
        "events_b",
    ]
    .iter()
    .map(|t| env.topic(t))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_tables_stream_and_snapshot_through_their_root() -> Result<()> {
    let env = CaptureEnv::new("cap_partitions").await?;
    env.client.batch_execute(SCHEMA).await?;
    let config = |include: &str| {
        env.config(&format!(
            "snapshot.mode = \"initial\"\npublication.name = \"{slot}_pub\"\n\
             publication.autocreate.mode = \"filtered\"\ntable.include.list = \"{include}\"\n",
            slot = env.slot
        ))
    };
    let roots = "public\\\\.(orders|readings|accounts|events)";
    let path = env.write_config("capture.toml", &config(roots))?;
    let mut capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    env.client.batch_execute(MOVES).await?;
    env.client.batch_execute(ATTACH).await?;
    let topics: Vec<String> = ROOTS.iter().map(|(t, _)| env.topic(t)).collect();
    // A partition detached before the snapshot read it takes its rows
    // along unseen: detach once the snapshot is done.
    wait_for(&topics, Duration::from_secs(120), |seen| {
        seen.iter().any(|r| {
            r.payload()
                .is_some_and(|p| p["source"]["snapshot"] == "last")
        })
    })
    .await
    .with_context(|| env.capture_log())?;
    // Detached while streaming: its rows stay in the targets as they were;
    // its later changes are not the root's and are not captured.
    let detached = source_rows(&env.client, "orders_us", &["id", "region"]).await?;
    ensure!(!detached.is_empty(), "orders_us should hold rows");
    env.client
        .batch_execute(
            "ALTER TABLE orders DETACH PARTITION orders_us;
             UPDATE orders_us SET qty = -1;
             INSERT INTO orders_us VALUES (300, 'us', 1, 'after detach');
             INSERT INTO orders VALUES (101, 'eu', 1, 'marker');",
        )
        .await?;

    let marker = |seen: &[Seen], note: &str| {
        seen.iter()
            .any(|r| r.payload().is_some_and(|p| p["after"]["note"] == note))
    };
    wait_for(&topics, Duration::from_secs(120), |seen| {
        marker(seen, "marker")
    })
    .await?;
    // Created publishing through the roots, holding the roots.
    let publication = env
        .client
        .query_one(
            "SELECT p.pubviaroot, array_agg(c.relname::text ORDER BY c.relname)
             FROM pg_publication p JOIN pg_publication_rel r ON r.prpubid = p.oid
             JOIN pg_class c ON c.oid = r.prrelid WHERE p.pubname = $1 GROUP BY 1",
            &[&format!("{}_pub", env.slot)],
        )
        .await?;
    ensure!(publication.get::<_, bool>(0), "publication is not via root");
    let members: Vec<String> = publication.get(1);
    ensure!(
        members == ["accounts", "events", "orders", "readings"],
        "publication holds {members:?}"
    );

    // A restart: the publication already holds the roots.
    terminate(&mut capture, Duration::from_secs(30))?;
    let mut capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute(
            "INSERT INTO accounts VALUES (500, 1);
             UPDATE orders SET region = 'eu' WHERE id = 201;
             INSERT INTO orders VALUES (102, 'apac', 1, 'after restart');",
        )
        .await?;
    let seen = wait_for(&topics, Duration::from_secs(120), |seen| {
        marker(seen, "after restart")
    })
    .await
    .with_context(|| env.capture_log())?;

    for (i, (table, cols)) in ROOTS.iter().enumerate() {
        let records: Vec<Seen> = seen
            .iter()
            .filter(|r| r.topic == topics[i])
            .cloned()
            .collect();
        for r in &records {
            let (Some(key), Some(p)) = (r.key_payload(), r.payload()) else {
                continue;
            };
            let names: Vec<&str> = key
                .as_object()
                .context("key is an object")?
                .keys()
                .map(String::as_str)
                .collect();
            ensure!(
                cols.iter().all(|c| names.contains(c)) && names.len() == cols.len(),
                "{table}: key {key} is not the root's primary key {cols:?}"
            );
            ensure!(
                p["source"]["table"] == *table,
                "{table}: event of {}",
                p["source"]
            );
        }
        let mut want = source_rows(&env.client, table, cols).await?;
        if *table == "orders" {
            want.extend(detached.clone());
        }
        let got = fold(&records, cols)?;
        ensure!(
            got == want,
            "{table}: the events fold to\n{got:#?}\nbut the source (with orders_us as detached) holds\n{want:#?}"
        );
        let snapshot = records.iter().filter(|r| r.op() == Some("r")).count();
        ensure!(snapshot > 0, "{table}: no snapshot rows");
    }
    let leaves = tokio::task::spawn_blocking({
        let t = leaf_topics(&env);
        move || read_committed(&t)
    })
    .await??;
    ensure!(
        leaves.is_empty(),
        "records on partition topics: {:?}",
        leaves.iter().map(|r| &r.topic).collect::<Vec<_>>()
    );
    let after_detach = seen.iter().any(|r| {
        r.payload()
            .is_some_and(|p| p["after"]["qty"] == -1 || p["after"]["id"] == 300)
    });
    ensure!(!after_detach, "a change of the detached table was captured");

    // The detached table included by name is a table of its own from now on.
    terminate(&mut capture, Duration::from_secs(30))?;
    let path = env.write_config(
        "capture-detached.toml",
        &config("public\\\\.(orders|readings|accounts|events|orders_us)"),
    )?;
    let capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute("UPDATE orders_us SET note = 'own table' WHERE id = 300")
        .await?;
    wait_for(
        &[env.topic("orders_us")],
        Duration::from_secs(120),
        |seen| marker(seen, "own table"),
    )
    .await
    .with_context(|| env.capture_log())?;
    // Stopped first: an active slot cannot be dropped.
    drop(capture);
    env.cleanup().await;
    Ok(())
}

fn run_capture(env: &CaptureEnv, extra: &str) -> Result<(bool, String)> {
    env.run_capture(extra, Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publications_and_include_lists_are_checked_for_partitions() -> Result<()> {
    let env = CaptureEnv::new("cap_part_pub").await?;
    env.client
        .batch_execute(&format!(
            "{SCHEMA}
             CREATE PUBLICATION leafwise FOR TABLE orders;"
        ))
        .await?;

    // A partition named without its root.
    let (ok, err) = run_capture(&env, "table.include.list = \"public\\\\.orders_eu\"\n")?;
    ensure!(!ok, "capture started with a partition alone");
    ensure!(
        err.contains("public.orders_eu (of public.orders)") && err.contains("Include the root"),
        "{err}"
    );

    // A publication that may not be changed and publishes partitions by their own names.
    let (ok, err) = run_capture(
        &env,
        "publication.name = \"leafwise\"\npublication.autocreate.mode = \"disabled\"\ntable.include.list = \"public\\\\.orders\"\n",
    )?;
    ensure!(!ok, "capture started with a leaf-wise publication");
    ensure!(
        err.contains("publish_via_partition_root = true") && err.contains("public.orders"),
        "{err}"
    );

    // The same publication when capture may alter it: WAL written before it
    // is altered still names the partitions, and goes to the root.
    env.client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&env.slot],
        )
        .await?;
    env.client
        .batch_execute("INSERT INTO orders VALUES (900, 'eu', 1, 'before via root'), (901, 'us', 1, 'before via root');")
        .await?;
    let path = env.write_config(
        "capture.toml",
        &env.config(
            "publication.name = \"leafwise\"\npublication.autocreate.mode = \"filtered\"\ntable.include.list = \"public\\\\.orders\"\n",
        ),
    )?;
    let capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute("INSERT INTO orders VALUES (902, 'eu', 1, 'after via root');")
        .await?;
    let topic = env.topic("orders");
    let seen = wait_for(
        std::slice::from_ref(&topic),
        Duration::from_secs(120),
        |seen| seen.iter().filter(|r| r.op() == Some("c")).count() >= 3,
    )
    .await
    .with_context(|| env.capture_log())?;
    let mut ids: Vec<i64> = seen
        .iter()
        .filter(|r| r.op() == Some("c"))
        .filter_map(|r| r.payload()?["after"]["id"].as_i64())
        .collect();
    ids.sort();
    ensure!(ids == [900, 901, 902], "created on {topic}: {ids:?}");
    let leaves = tokio::task::spawn_blocking({
        let t = leaf_topics(&env);
        move || read_committed(&t)
    })
    .await??;
    ensure!(leaves.is_empty(), "records on partition topics");
    let via_root: bool = env
        .client
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'leafwise'",
            &[],
        )
        .await?
        .get(0);
    ensure!(via_root, "the publication was not altered");
    // Stopped first: an active slot cannot be dropped.
    drop(capture);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_roots_reach_every_target_as_one_table() -> Result<()> {
    let schema = format!(
        "{SCHEMA}
         CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));"
    );
    let tables: Vec<&str> = ROOTS.iter().map(|(t, _)| *t).collect();
    let p = Pipeline::new(
        "cap_part_e2e",
        &schema,
        &tables,
        "snapshot.mode = \"initial\"\nsignal.data.collection = \"public.oncely_signal\"\n\
         table.include.list = \"public\\\\.(orders|readings|accounts|events)\"\n",
    )
    .await?;
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    p.env.client.batch_execute(MOVES).await?;

    // SIGKILL in the middle, then go on.
    let topics = p.topics();
    wait_for(&topics, Duration::from_secs(120), |seen| {
        seen.iter()
            .any(|r| r.payload().is_some_and(|v| v["after"]["note"] == "new"))
    })
    .await?;
    kill9(&mut capture);
    p.env.client.batch_execute(ATTACH).await?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    // Rows a table holds when it is attached were never changes of the
    // root: a snapshot of the root brings them to the targets.
    p.env
        .client
        .batch_execute(
            "CREATE TABLE orders_latam (id int NOT NULL, region text NOT NULL, qty int, note text);
             INSERT INTO orders_latam VALUES (400, 'latam', 4, 'held before attach'), (401, 'latam', 4, 'held before attach');
             ALTER TABLE orders ATTACH PARTITION orders_latam FOR VALUES IN ('latam');",
        )
        .await?;
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(&p.capture_config)
        .args(["--table", "public.orders"])
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(&topics, Duration::from_secs(120), |seen| {
        seen.iter().any(|r| {
            r.payload()
                .is_some_and(|v| v["after"]["id"] == 400 && v["op"] == "r")
        })
    })
    .await
    .with_context(|| p.env.capture_log())?;

    let report = p.verify(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "targets differ:\n{report}");
    for target in &report.targets {
        let mut names: Vec<&str> = target.tables.iter().map(|t| t.table.as_str()).collect();
        names.sort();
        ensure!(
            names
                == [
                    "public.accounts",
                    "public.events",
                    "public.orders",
                    "public.readings"
                ],
            "{}: tables {names:?}\n{report}",
            target.label
        );
    }
    let orders = report.targets[0]
        .tables
        .iter()
        .find(|t| t.table == "public.orders")
        .context("orders in the report")?;
    let source: i64 = p
        .env
        .client
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    ensure!(
        orders.source_rows as i64 == source && source > 20,
        "{report}"
    );
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// A table's partition root is read once the Relation's transaction is
/// visible: the walsender sends a transaction a moment before other sessions
/// see it committed, and a catalog read in that moment gave the table
/// detached in that transaction (and written after, so published as itself)
/// its former root, so its rows went to the root's topic; one attached in it
/// none. Here each DDL's transaction is held open, as it is in that moment,
/// while capture reads the root; committed half a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_roots_are_read_once_the_relations_transaction_is_visible() -> Result<()> {
    let env = CaptureEnv::new("cap_part_visible").await?;
    let result = roots_wait(&env).await;
    if result.is_err() {
        eprintln!("database {}", env.dbname);
    }
    env.cleanup().await;
    result
}

async fn roots_wait(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE parent (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
             CREATE TABLE leaving PARTITION OF parent FOR VALUES FROM (0) TO (100);
             CREATE TABLE joining (id int PRIMARY KEY, v int)",
        )
        .await?;
    for (table, ddl, root) in [
        (
            "leaving",
            "ALTER TABLE parent DETACH PARTITION leaving; INSERT INTO leaving VALUES (1, 1)",
            None,
        ),
        (
            "joining",
            "ALTER TABLE parent ATTACH PARTITION joining FOR VALUES FROM (100) TO (200); \
             INSERT INTO joining VALUES (101, 1)",
            Some(("public".to_owned(), "parent".to_owned())),
        ),
    ] {
        let oid: u32 = env
            .client
            .query_one("SELECT $1::text::regclass::oid", &[&table])
            .await?
            .get(0);
        let tx = env.connect().await?;
        tx.batch_execute(&format!("BEGIN; {ddl}")).await?;
        let xid: i64 = tx
            .query_one("SELECT (txid_current() % 4294967296)::bigint", &[])
            .await?
            .get(0);
        let xid = u32::try_from(xid)?;
        let reader = env.connect().await?;
        let read = tokio::spawn(async move {
            oncely_capture::testing::partition_root(&reader, oid, Some(xid)).await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.batch_execute("COMMIT").await?;
        let found = read.await??;
        assert_eq!(found, root, "partition root of {table} after {ddl}");
    }
    Ok(())
}
