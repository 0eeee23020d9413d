//! DDL on a MariaDB source while capture streams is followed in every
//! target (docs/mysql.md, "Schema changes"): a column dropped, one renamed
//! and a new one added under its old name, one renamed and widened by
//! `CHANGE`, one widened, one added with a
//! default, rows written between each. Capture numbers MySQL columns from
//! the DDL text it passes (shapes tied to binlog positions), so the
//! warehouse renames its column (same PostgreSQL attnum, old values kept)
//! and drops the dropped one under `schema.evolution.drop.columns =
//! "drop"`, also across a capture SIGKILLed between a DDL and the next
//! row; the schema-change records capture writes queue the backfill
//! that rewrites the index's and the cache's whole rows; then `oncely
//! verify` finds the three targets equal to MariaDB.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde_json::Value;

use crate::harness::capture::{kill9, read_committed};
use crate::harness::checks::dead_letters;
use crate::harness::common::{kafka_brokers, unique};
use crate::harness::e2e::{es, redis_conn, summary, Pipeline, WAREHOUSE_SCHEMA};
use crate::mysql_binlog::{admin, capture_opts, server_id};
use elasticsearch::indices::IndicesRefreshParts;
use elasticsearch::SearchParts;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_drop_rename_add_and_widen_reach_every_target_and_verify_says_equal() -> Result<()> {
    let mut root = admin().await;
    let db = unique("oncely_myddl");
    root.query_drop(format!("CREATE DATABASE {db}")).await?;
    let table = format!("{db}.orders");
    root.query_drop(format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, qty int, gone varchar(20), \
         `old name` varchar(20), note varchar(10))"
    ))
    .await?;
    let p = Pipeline::with_topics("myddl", "", "", |prefix| {
        vec![format!("{prefix}.{db}.orders")]
    })
    .await?;
    let p = configure(p, &db)?;
    p.extend_sink_config(0, "schema.evolution.drop.columns = \"drop\"")?;
    let result = follow_ddl(&mut root, &p, &table).await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    p.cleanup().await;
    result
}

fn configure(mut p: Pipeline, db: &str) -> Result<Pipeline> {
    let opts = capture_opts();
    p.capture_config = p.env.write_config(
        "capture-mysql.toml",
        &format!(
            "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
             database.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.password = \"{pass}\"\n\
             database.include.list = \"{db}\"\ndatabase.server.id = {id}\n\
             kafka.bootstrap.servers = \"{brokers}\"\nsnapshot.mode = \"no_data\"\n\
             heartbeat.interval.ms = 500\n",
            prefix = p.env.prefix,
            host = opts.ip_or_hostname(),
            port = opts.tcp_port(),
            user = opts.user().unwrap_or_default(),
            pass = opts.pass().unwrap_or_default(),
            id = server_id(),
            brokers = kafka_brokers(),
        ),
    )?;
    Ok(p)
}

/// The warehouse table's columns: `(name, attnum)`, the sink's own left out.
async fn warehouse_columns(p: &Pipeline) -> Result<Vec<(String, i16)>> {
    let rows = p
        .env
        .client
        .query(
            "SELECT a.attname::text, a.attnum FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname LIKE '%orders' AND a.attnum > 0 \
               AND NOT a.attisdropped AND a.attname NOT LIKE '\\_\\_oncely%' ORDER BY a.attnum",
            &[&WAREHOUSE_SCHEMA],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Waits until the warehouse has a column named `name`; its attnum.
async fn wait_warehouse_column(p: &Pipeline, name: &str) -> Result<i16> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let cols = warehouse_columns(p).await.unwrap_or_default();
        if let Some((_, n)) = cols.iter().find(|(c, _)| c == name) {
            return Ok(*n);
        }
        if Instant::now() > deadline {
            bail!(
                "the warehouse has no column {name:?} (columns {cols:?}); logs in {}",
                p.env.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn exec(root: &mut Conn, sql: String) -> Result<()> {
    root.query_drop(&sql).await.with_context(|| sql)
}

async fn follow_ddl(root: &mut Conn, p: &Pipeline, table: &str) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.env.capture_log().contains("binlog stream opening") {
        if Instant::now() > deadline {
            bail!("capture did not open its stream:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sinks = (0..3)
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    for id in 1..=40 {
        exec(
            root,
            format!("INSERT INTO {table} VALUES ({id}, {id}, 'g{id}', 'o{id}', 'n{id}')"),
        )
        .await?;
    }
    let renamed_attnum = wait_warehouse_column(p, "old name").await?;
    let qty_attnum = wait_warehouse_column(p, "qty").await?;

    // DROP COLUMN (MariaDB's `DROP` without COLUMN), rows between each DDL.
    exec(root, format!("ALTER TABLE {table} DROP gone")).await?;
    exec(
        root,
        format!("UPDATE {table} SET qty = qty + 100 WHERE id <= 5"),
    )
    .await?;
    // RENAME COLUMN, then a new column under the old name. Rows 11..40 are
    // written before the rename only: their values must stay in the
    // renamed column.
    exec(
        root,
        format!("ALTER TABLE {table} RENAME COLUMN `old name` TO `new name`"),
    )
    .await?;
    exec(
        root,
        format!("UPDATE {table} SET `new name` = concat('r', id) WHERE id BETWEEN 6 AND 10"),
    )
    .await?;
    exec(
        root,
        format!("ALTER TABLE {table} ADD COLUMN `old name` int"),
    )
    .await?;
    // Capture SIGKILLed between the DDL and the next row: the restart
    // numbers the new column as the first life would have.
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill9(&mut capture.0);
    let opened = p.env.capture_log().matches("binlog stream opening").count();
    capture = p.spawn_capture()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.env.capture_log().matches("binlog stream opening").count() == opened {
        if Instant::now() > deadline {
            bail!(
                "capture did not open its stream again:\n{}",
                p.env.capture_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    exec(
        root,
        format!("UPDATE {table} SET `old name` = id * 7 WHERE id <= 3"),
    )
    .await?;
    // CHANGE to the same name: a widening; then values only the wider fits.
    exec(
        root,
        format!("ALTER TABLE {table} CHANGE note note varchar(200)"),
    )
    .await?;
    exec(
        root,
        format!("UPDATE {table} SET note = repeat('w', 150) WHERE id IN (12, 13)"),
    )
    .await?;
    // MariaDB's and MySQL 5's rename: CHANGE old new type, here widened too.
    exec(
        root,
        format!("ALTER TABLE {table} CHANGE qty quantity bigint"),
    )
    .await?;
    exec(
        root,
        format!("UPDATE {table} SET quantity = 5000000000 WHERE id = 20"),
    )
    .await?;
    // An added column with a default fills every existing row without row
    // events.
    exec(
        root,
        format!("ALTER TABLE {table} ADD COLUMN added int NOT NULL DEFAULT 7"),
    )
    .await?;
    exec(
        root,
        format!("INSERT INTO {table} VALUES (41, 41, 'n41', 'x41', NULL, 1)"),
    )
    .await?;

    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    let letters = dead_letters(&p.env.prefix)?;
    assert!(
        report.is_equal() && letters.is_empty(),
        "{}\ndead letters: {letters:?}\ncapture log:\n{}",
        summary(&report),
        p.env.capture_log()
    );
    assert_eq!(report.compared(), 3, "{}", summary(&report));

    // The warehouse renamed its column (same attnum: an ALTER ... RENAME,
    // not a new column), added a new one under the old name and dropped
    // the dropped one.
    let cols = warehouse_columns(p).await?;
    let attnum_of = |name: &str| cols.iter().find(|(c, _)| c == name).map(|(_, n)| *n);
    assert_eq!(
        attnum_of("new name"),
        Some(renamed_attnum),
        "the renamed column is not the old one; warehouse columns {cols:?}"
    );
    assert!(
        attnum_of("old name").is_some_and(|n| n != renamed_attnum),
        "warehouse columns {cols:?}"
    );
    assert_eq!(attnum_of("gone"), None, "warehouse columns {cols:?}");
    assert_eq!(
        attnum_of("quantity"),
        Some(qty_attnum),
        "warehouse columns {cols:?}"
    );
    assert_eq!(attnum_of("qty"), None, "warehouse columns {cols:?}");
    let kept: String = p
        .env
        .client
        .query_one(
            &format!(
                "SELECT \"new name\" FROM {WAREHOUSE_SCHEMA}.{} WHERE id = 30",
                warehouse_table(p).await?
            ),
            &[],
        )
        .await?
        .get(0);
    assert_eq!(kept, "o30");

    // Capture wrote schema-change records saying so.
    let changes = schema_changes(p)?;
    let kinds: Vec<(String, String)> = changes
        .iter()
        .flat_map(|v| v["changes"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            let kind = c["kind"].as_str().unwrap_or_default().to_owned();
            let what = match kind.as_str() {
                "rename" => format!("{}->{}", c["from"], c["to"]),
                _ => c["column"].as_str().unwrap_or_default().to_owned(),
            };
            (kind, what)
        })
        .collect();
    for want in [
        ("drop", "gone".to_owned()),
        ("rename", "\"old name\"->\"new name\"".to_owned()),
        ("rename", "\"qty\"->\"quantity\"".to_owned()),
        ("add", "old name".to_owned()),
        ("alter_type", "note".to_owned()),
        ("add", "added".to_owned()),
    ] {
        assert!(
            kinds.contains(&(want.0.to_owned(), want.1.clone())),
            "no {want:?} among the schema changes {kinds:?}"
        );
    }
    // The index's documents and the cache's hashes are whole rows: the
    // backfill the records queued rewrote them without the dropped and
    // the old names.
    let (docs, hashes) = index_and_cache_fields(p, table).await?;
    for fields in docs.iter().chain(&hashes) {
        assert!(
            !fields.contains("gone") && !fields.contains("qty") && fields.contains("new name"),
            "fields {fields:?}; documents {docs:?}; hashes {hashes:?}"
        );
    }
    assert_eq!((docs.len(), hashes.len()), (41, 41));
    drop(capture);
    drop(sinks);
    Ok(())
}

/// The field names of every document in the index and every hash in the
/// cache (the sinks' own left out).
async fn index_and_cache_fields(
    p: &Pipeline,
    table: &str,
) -> Result<(Vec<BTreeSet<String>>, Vec<BTreeSet<String>>)> {
    let index = format!("{}.{table}", p.env.prefix);
    let es = es();
    es.indices()
        .refresh(IndicesRefreshParts::Index(&[&index]))
        .send()
        .await?
        .error_for_status_code()?;
    let found: Value = es
        .search(SearchParts::Index(&[&index]))
        .size(1000)
        .send()
        .await?
        .error_for_status_code()?
        .json()
        .await?;
    let own = |k: &String| !k.starts_with("__");
    let docs = found["hits"]["hits"]
        .as_array()
        .context("hits")?
        .iter()
        .filter_map(|h| h["_source"].as_object())
        .map(|o| o.keys().filter(|k| own(k)).cloned().collect())
        .collect();
    let mut conn = redis_conn().await?;
    let table_name = table.rsplit('.').next().unwrap_or(table);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{table_name}:*", p.redis_prefix))
        .query_async(&mut conn)
        .await?;
    let mut hashes = Vec::new();
    for key in keys {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(&key).query_async(&mut conn).await?;
        hashes.push(fields.into_iter().filter(|k| own(k)).collect());
    }
    Ok((docs, hashes))
}

/// The warehouse table's name (`<database>_orders`).
async fn warehouse_table(p: &Pipeline) -> Result<String> {
    let row = p
        .env
        .client
        .query_one(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname LIKE '%orders' AND c.relkind = 'r'",
            &[&WAREHOUSE_SCHEMA],
        )
        .await?;
    Ok(format!("\"{}\"", row.get::<_, String>(0)))
}

/// The values of `<topic.prefix>.schema-changes`, committed.
fn schema_changes(p: &Pipeline) -> Result<Vec<Value>> {
    let topic = format!("{}.schema-changes", p.env.prefix);
    Ok(read_committed(&[topic])?
        .into_iter()
        .filter_map(|r| r.value)
        .collect())
}
