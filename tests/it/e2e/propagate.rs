//! `column.propagate.source.type` (docs/configuration.md, "Columns: source
//! types in the schema") through the whole pipeline: the records of a
//! snapshot row and a streamed row carry Debezium's
//! `__debezium.source.column.*` parameters on the named fields (a
//! varchar(n), a numeric(p,s), an enum, an array) and none on the others,
//! and the warehouse still creates its columns from them, `verify` equal.
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::masking::every_record;
use crate::harness::capture::kill9;
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

const SCHEMA: &str = "
    CREATE TYPE mood AS ENUM ('sad', 'happy');
    CREATE TABLE typed (id int PRIMARY KEY, v varchar(20), n numeric(12,2), m mood, a int[], t text);
    INSERT INTO typed VALUES (1, 'snap', 12.5, 'sad', '{1,2}', 'x');
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagated_source_types_reach_the_topic_and_the_warehouse_reads_them() -> Result<()> {
    let p = Pipeline::new(
        "propagate",
        SCHEMA,
        &["typed"],
        "snapshot.mode = \"initial\"\n\
         column.propagate.source.type = \"public\\\\.typed\\\\.(v|n|a)\"\n\
         datatype.propagate.source.type = \"mood\"\n",
    )
    .await?;
    let result = drive(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drive(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    p.env
        .client
        .batch_execute("INSERT INTO typed VALUES (2, 'stream', 7.25, 'happy', '{3}', 'y');")
        .await?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "{report}");

    let prefix = p.env.prefix.clone();
    let offsets = p.env.offsets_topic.clone();
    let records = tokio::task::spawn_blocking(move || every_record(&prefix, &offsets)).await??;
    let topic = p.topics().into_iter().next().context("the table's topic")?;
    let values: Vec<Value> = records
        .iter()
        .filter_map(|r| r.strip_prefix(&format!("{topic}: ")))
        .filter_map(|r| {
            r.find("{\"schema\":{\"type\":\"struct\",\"fields\":[{\"type\":\"struct\"")
                .map(|at| &r[at..])
        })
        .filter_map(|r| {
            serde_json::Deserializer::from_str(r)
                .into_iter::<Value>()
                .next()?
                .ok()
        })
        .collect();
    assert_eq!(values.len(), 2, "a snapshot row and a streamed row");
    for value in &values {
        let fields = value["schema"]["fields"][1]["fields"]
            .as_array()
            .context("after fields")?;
        let params = |name: &str| {
            fields
                .iter()
                .find(|f| f["field"] == name)
                .and_then(|f| f["parameters"].as_object())
                // oncely's own (`__oncely.attnum`) aside.
                .map(|p| {
                    let debezium = p.iter().filter(|(k, _)| !k.starts_with("__oncely."));
                    Value::Object(debezium.map(|(k, v)| (k.clone(), v.clone())).collect())
                })
                .unwrap_or_default()
        };
        let source = |ty: &str, length: &str, scale: &str, name: &str| {
            json!({"__debezium.source.column.type": ty,
                   "__debezium.source.column.length": length,
                   "__debezium.source.column.scale": scale,
                   "__debezium.source.column.name": name})
        };
        assert_eq!(params("v"), source("VARCHAR", "20", "0", "v"));
        assert_eq!(params("n"), source("NUMERIC", "12", "2", "n"));
        assert_eq!(params("a"), source("_INT4", "10", "0", "a"));
        assert_eq!(params("m")["__debezium.source.column.type"], json!("MOOD"));
        assert_eq!(params("m")["__debezium.source.column.name"], json!("m"));
        assert_eq!(params("t"), json!({}));
        assert_eq!(params("id"), json!({}));
    }
    let types: Vec<(String, String)> = p
        .env
        .client
        .query(
            &format!(
                "SELECT column_name::text, format_type(atttypid, atttypmod)
                 FROM information_schema.columns c
                 JOIN pg_attribute a ON a.attrelid = format('%I.%I', c.table_schema, c.table_name)::regclass
                   AND a.attname = c.column_name
                 WHERE table_schema = '{WAREHOUSE_SCHEMA}' AND table_name = 'public_typed'
                   AND column_name IN ('v', 'n')"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut types = types;
    types.sort();
    assert_eq!(
        types,
        [
            ("n".to_owned(), "numeric(12,2)".to_owned()),
            ("v".to_owned(), "character varying(20)".to_owned())
        ],
        "the warehouse's columns"
    );
    for s in &mut sinks {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}
