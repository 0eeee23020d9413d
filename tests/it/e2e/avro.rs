//! Avro end to end: capture writes keys and values in Confluent's Avro wire
//! format through the real schema registry (Apicurio, `ONCELY_REGISTRY_URL`),
//! the warehouse, search index and cache sinks read them through the same
//! registry, and `oncely verify` finds every target equal to the source,
//! across a schema change (a new schema version) and a SIGKILL of capture
//! in the middle of a stream of transactions (the replay registers the same
//! schemas again and gets the same ids), with no dead letter.
use std::time::Duration;

use anyhow::{Context, Result};

use crate::harness::capture::{kill9, raw_records};
use crate::harness::checks::dead_letters;
use crate::harness::common::registry_url;
use crate::harness::e2e::Pipeline;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_through_the_registry_reaches_every_target() -> Result<()> {
    let url = registry_url();
    let p = Pipeline::new(
        "e2e_avro",
        "CREATE TABLE t (id bigint PRIMARY KEY, v text, n numeric(12,2), d date,
                         ts timestamptz, b bytea, arr int[], j jsonb, f float8, small int2);",
        &["t"],
        &format!(
            "key.converter = \"avro\"\nvalue.converter = \"avro\"\nschema.registry.url = \"{url}\"\n"
        ),
    )
    .await?;
    for i in 0..p.sinks.len() {
        p.prepend_sink_runner_keys(i, &format!("schema.registry.url = \"{url}\""))?;
    }
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_>>()?;
    p.env
        .client
        .batch_execute(
            "INSERT INTO t SELECT g, 'row ' || g, g * 1.25, DATE '2026-01-01' + g,
                    TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * INTERVAL '1 hour',
                    decode('00ff' || lpad(to_hex(g), 4, '0'), 'hex'), ARRAY[g, NULL, -g],
                    jsonb_build_object('g', g), CASE WHEN g = 3 THEN 'NaN'::float8 ELSE g / 3.0 END,
                    (g % 100)::int2
             FROM generate_series(1, 200) g;
             UPDATE t SET v = NULL, n = -n WHERE id % 4 = 0;
             DELETE FROM t WHERE id % 9 = 0;",
        )
        .await?;
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "before the schema change:\n{report}");

    // A new column: a new schema version; the records before it stay readable.
    p.env
        .client
        .batch_execute(
            "ALTER TABLE t ADD COLUMN extra text;
             UPDATE t SET extra = 'x' || id WHERE id % 5 = 0;
             INSERT INTO t (id, v, extra) VALUES (1000, 'after', 'y');",
        )
        .await?;
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "after the schema change:\n{report}");
    assert_eq!(report.compared(), p.sinks.len(), "{report}");

    // Capture killed while transactions stream in; a new one (a new
    // process: an empty schema cache) takes over from the committed offset.
    let writer = {
        let client = p.env.connect().await?;
        tokio::spawn(async move {
            for i in 0..40 {
                let base = 2000 + i * 50;
                client
                    .batch_execute(&format!(
                        "INSERT INTO t (id, v, extra) SELECT g, 'burst', 'z' FROM generate_series({base}, {}) g;
                         UPDATE t SET n = {i} WHERE id BETWEEN {base} AND {};",
                        base + 49,
                        base + 9
                    ))
                    .await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill9(&mut capture);
    capture = p.spawn_capture()?;
    writer.await??;
    let report = p.verify(Duration::from_secs(150)).await?;
    assert!(report.is_equal(), "after capture's SIGKILL:\n{report}");

    // The records in Kafka are Avro in Confluent's wire format, readable by
    // id alone through the registry.
    let topic = format!("{}.public.t", p.env.prefix);
    let records = tokio::task::spawn_blocking(move || raw_records(&topic, 3)).await??;
    let registry = oncely_core::avro::registry::RegistryClient::new(&url)?;
    for (key, value) in &records {
        assert_eq!((key[0], value[0]), (0, 0), "magic bytes");
        let (id, body) = oncely_core::avro::wire::unframe(value)?;
        let payload = registry.schema(id).await?.decode(body)?;
        assert_eq!(payload["op"], "c", "{payload}");
        assert!(payload["after"]["id"].is_i64(), "{payload}");
    }

    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await?
    .context("read dead letters")?;
    assert!(letters.is_empty(), "no dead letters: {letters:#?}");
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}
