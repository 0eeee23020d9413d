//! `include.query` against the MariaDB of `scripts/services`: a streamed
//! change's `source.query` is the statement that made it (MariaDB's
//! ANNOTATE_ROWS, which capture reads aside: the dump omits it), null in
//! snapshot rows; after a SIGKILL inside a large transaction the replayed
//! rows carry the same statement. MySQL's ROWS_QUERY events are covered by
//! the decoder's byte fixtures only (no MySQL server here). The same
//! capture propagates source types (`column.propagate.source.type`,
//! `datatype.propagate.source.type`) into snapshot and streamed records.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use mysql_async::prelude::Queryable;
use serde_json::{json, Value};

use crate::harness::capture::{kill9, read_committed, wait_for, Seen};
use crate::mysql_binlog::admin;
use crate::mysql_capture::{mariadb_relay, wait_for_end_offset, MySqlCapture, BINLOG_HELD};

/// `include.query`, and the source types of `note` (by name) and of INT
/// columns (by type).
const SETTINGS: &str = r#"include.query = true
column.propagate.source.type = "{db}\\.items\\.note"
datatype.propagate.source.type = "int"
"#;

fn payloads(seen: &[Seen]) -> Vec<Value> {
    seen.iter().filter_map(|r| r.payload().cloned()).collect()
}

/// The `__debezium.*` parameters of field `field` of a record's `after`
/// (oncely's own, as the column number, left out).
fn after_parameters(record: &Seen, field: &str) -> Value {
    let schema = &record.value.as_ref().expect("a value")["schema"]["fields"];
    let after = schema
        .as_array()
        .and_then(|f| f.iter().find(|f| f["field"] == "after"))
        .expect("an after field");
    after["fields"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["field"] == field))
        .and_then(|f| f["parameters"].as_object())
        .map(|p| {
            p.iter()
                .filter(|(k, _)| k.starts_with("__debezium."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or(Value::Null)
}

async fn committed(env: &MySqlCapture, at_least: usize) -> Result<Vec<Seen>> {
    let seen = wait_for(&[env.topic("items")], Duration::from_secs(120), |s| {
        s.iter().filter(|r| r.value.is_some()).count() >= at_least
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; capture log:\n{}", env.log()))?;
    Ok(seen.into_iter().filter(|r| r.value.is_some()).collect())
}

async fn changes(env: &MySqlCapture, at_least: usize) -> Result<Vec<Value>> {
    Ok(payloads(&committed(env, at_least).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_query_is_the_statement_null_in_snapshots_and_kept_across_a_kill() -> Result<()> {
    let mut root = admin().await;
    let env = MySqlCapture::with_settings("oncely_myquery", &mut root, SETTINGS).await?;
    let relay = mariadb_relay().await?;
    env.through(&relay)?;
    let db = env.db.clone();
    root.query_drop(format!(
        "CREATE TABLE {db}.items (id int PRIMARY KEY, note varchar(20))"
    ))
    .await?;
    root.query_drop(format!("INSERT INTO {db}.items VALUES (1, 'a'), (2, 'b')"))
        .await?;
    let mut capture = env.start().await?;
    // The snapshot first: a change streamed while its chunk is open takes
    // the place of the chunk's row (correct in effect, but not the order
    // asserted below).
    committed(&env, 2).await?;

    // One transaction, three statements.
    let insert = format!("INSERT INTO {db}.items VALUES (10, 'x'), (11, 'y')");
    let update = format!("UPDATE {db}.items SET note = 'z' WHERE id = 10");
    let delete = format!("DELETE FROM {db}.items WHERE id = 1");
    root.query_drop("BEGIN").await?;
    for statement in [&insert, &update, &delete] {
        root.query_drop(statement.as_str()).await?;
    }
    root.query_drop("COMMIT").await?;
    let records = committed(&env, 6).await?;
    // column.propagate.source.type names `note`, datatype.propagate.source.type
    // the INT of `id` (MariaDB declares it `int(11)`), in snapshot and
    // streamed records alike.
    for record in [&records[0], &records[2]] {
        assert_eq!(
            after_parameters(record, "note"),
            json!({"__debezium.source.column.type": "VARCHAR",
                   "__debezium.source.column.length": "20",
                   "__debezium.source.column.name": "note"})
        );
        assert_eq!(
            after_parameters(record, "id"),
            json!({"__debezium.source.column.type": "INT",
                   "__debezium.source.column.length": "11",
                   "__debezium.source.column.name": "id"})
        );
    }
    let seen = payloads(&records);
    let ops: Vec<(&str, &Value)> = seen
        .iter()
        .map(|p| (p["op"].as_str().unwrap_or(""), &p["source"]["query"]))
        .collect();
    assert_eq!(
        ops,
        vec![
            ("r", &Value::Null),
            ("r", &Value::Null),
            ("c", &Value::from(insert.as_str())),
            ("c", &Value::from(insert.as_str())),
            ("u", &Value::from(update.as_str())),
            ("d", &Value::from(delete.as_str())),
        ]
    );

    // A large statement, then a small one, in one transaction; capture is
    // killed once part of it is in Kafka.
    let big = format!("INSERT INTO {db}.items SELECT seq, 'big' FROM seq_100000_to_109999");
    let last = format!("UPDATE {db}.items SET note = 'last' WHERE id = 2");
    relay.throttle(BINLOG_HELD);
    root.query_drop("BEGIN").await?;
    root.query_drop(big.as_str()).await?;
    root.query_drop(last.as_str()).await?;
    root.query_drop("COMMIT").await?;
    wait_for_end_offset(&env.topic("items"), 6 + 500).await?;
    kill9(&mut capture);
    relay.throttle(0);
    let partial = read_committed(&[env.topic("items")])?
        .iter()
        .filter(|r| r.value.is_some())
        .count();
    assert!(
        partial < 6 + 10_000,
        "the kill came inside the large transaction ({partial} records committed then)"
    );
    let _capture = env.start().await?;
    let seen = changes(&env, 6 + 10_001).await?;
    let after: Vec<&Value> = seen[6..].iter().collect();
    assert_eq!(after.len(), 10_001, "each change once");
    let ids: BTreeSet<i64> = after[..10_000]
        .iter()
        .map(|p| p["after"]["id"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(ids.len(), 10_000);
    let wrong = after[..10_000]
        .iter()
        .position(|p| p["source"]["query"] != big.as_str());
    assert_eq!(wrong, None, "every row of the large statement carries it");
    assert_eq!(after[10_000]["op"], "u");
    assert_eq!(after[10_000]["source"]["query"], last.as_str());
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    Ok(())
}
