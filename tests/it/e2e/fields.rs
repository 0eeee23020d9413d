//! Per-sink field selection (`fields.include` / `fields.exclude`,
//! docs/design.md, Sinks, rule 10) through the whole pipeline: a column
//! holding a marker value is excluded from two search indexes (hard and
//! soft deletes) and the hash cache, left out of a JSON cache by an include
//! list, and kept in the warehouse. After a snapshot, inserts, updates, an
//! update leaving the large marker unchanged (TOAST), a primary-key update,
//! deletes and added columns, the marker is in no Redis value and no
//! Elasticsearch document or mapping, the warehouse holds it, and `oncely
//! verify` is equal for all five. A key field in `fields.exclude` stops
//! the sink at its first record, writing nothing, and verify refuses it.
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use elasticsearch::indices::{IndicesGetMappingParts, IndicesRefreshParts};
use elasticsearch::SearchParts;
use serde_json::Value;

use crate::harness::capture::kill9;
use crate::harness::checks::dead_letters;
use crate::harness::e2e::{self, Pipeline, WAREHOUSE_SCHEMA};

const MARKER: &str = "MARKER7f3a";

const SCHEMA: &str = "
    CREATE TABLE people (id int PRIMARY KEY, name text, secret text);
    ALTER TABLE people ALTER COLUMN secret SET STORAGE EXTERNAL;
    INSERT INTO people SELECT g, 'n' || g, 'MARKER7f3a-' || g FROM generate_series(1, 30) g;
";

/// The two exclusion forms: a bare name and a qualified one.
const EXCLUDE: &str = "fields.exclude = [\"secret\", \"public.people.secret2\"]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_column_left_out_of_the_cache_and_the_index_stays_in_the_warehouse() -> Result<()>
{
    let mut p = Pipeline::new(
        "fields_exclude",
        SCHEMA,
        &["people"],
        "snapshot.mode = \"initial\"\n",
    )
    .await?;
    p.extend_sink_config(1, EXCLUDE)?;
    p.extend_sink_config(2, EXCLUDE)?;
    // A soft-deleting index leaving the same columns out, and a JSON-layout
    // cache holding only the listed columns (and the key).
    p.add_soft_index_and_json_cache()?;
    p.extend_sink_config(3, EXCLUDE)?;
    p.extend_sink_config(4, "fields.include = [\"name\", \"public.people.shown\"]")?;
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
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "after the snapshot:\n{report}");

    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO people SELECT g, 'n' || g, '{MARKER}-' || g FROM generate_series(31, 40) g;
             -- a large marker, stored out of line: later updates leave it unchanged TOAST
             UPDATE people SET secret = '{MARKER}' || repeat('x', 20000) WHERE id = 1;
             UPDATE people SET name = 'renamed' WHERE id <= 5;
             UPDATE people SET secret = '{MARKER}-changed' WHERE id = 6;
             UPDATE people SET id = 1001 WHERE id = 7;
             UPDATE people SET id = 1002, secret = '{MARKER}-moved' WHERE id = 8;
             DELETE FROM people WHERE id IN (9, 10);
             ALTER TABLE people ADD COLUMN secret2 text, ADD COLUMN shown text;
             UPDATE people SET secret2 = '{MARKER}-2', shown = 'visible' WHERE id BETWEEN 11 AND 20;
             INSERT INTO people VALUES (50, 'new', '{MARKER}-50', '{MARKER}-2', 'visible');
             UPDATE people SET name = 'again' WHERE id = 1;"
        ))
        .await
        .context("the changes")?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "after the changes:\n{report}");
    assert_eq!(report.compared(), 5, "{report}");
    for t in report.targets.iter().flat_map(|t| &t.tables) {
        assert!(t.held_unselected.is_empty(), "{report}");
    }

    let warehouse: i64 = p
        .env
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {WAREHOUSE_SCHEMA}.public_people
                 WHERE (secret LIKE '{MARKER}%' OR secret2 LIKE '{MARKER}%')
                   AND NOT coalesce(__oncely_deleted, false)"
            ),
            &[],
        )
        .await
        .context("the warehouse")?
        .get(0);
    assert_eq!(warehouse, 39, "the warehouse keeps the excluded columns");

    let redis = redis_texts(p).await?;
    assert!(
        redis.len() > 30,
        "the cache holds the rows: {}",
        redis.len()
    );
    let leaked: Vec<&String> = redis
        .iter()
        .filter(|t| t.contains(MARKER) || t.contains("secret"))
        .collect();
    assert!(leaked.is_empty(), "the cache holds the marker: {leaked:?}");
    assert!(redis.iter().any(|t| t == "visible"), "an added column kept");

    let topic = p.topics()[0].to_lowercase();
    for index in [topic.clone(), format!("{topic}-soft")] {
        let (documents, mapping) = es_texts(&index).await?;
        assert!(documents.contains("renamed") && documents.contains("visible"));
        assert!(
            !documents.contains(MARKER) && !documents.contains("secret"),
            "{index} holds the marker: {documents}"
        );
        assert!(
            !mapping.contains("secret"),
            "{index} maps an excluded column: {mapping}"
        );
    }

    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(letters.is_empty(), "dead letters: {letters:?}");
    for s in &mut sinks {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}

/// Every key name, hash field, hash value and string under the pipeline's Redis prefix.
pub(super) async fn redis_texts(p: &Pipeline) -> Result<Vec<String>> {
    let mut conn = e2e::redis_conn().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", p.redis_prefix))
        .query_async(&mut conn)
        .await?;
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
        match kind.as_str() {
            "hash" => {
                let fields: Vec<String> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?;
                out.extend(fields);
            }
            "string" => {
                let value: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                out.push(String::from_utf8_lossy(&value).into_owned());
            }
            "set" => {
                let members: Vec<String> = redis::cmd("SMEMBERS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?;
                out.extend(members);
            }
            _ => {}
        }
        out.push(key);
    }
    Ok(out)
}

/// Every document of `index` and its mapping, as JSON text.
pub(super) async fn es_texts(index: &str) -> Result<(String, String)> {
    let es = e2e::es();
    es.indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await?
        .error_for_status_code()?;
    let found: Value = es
        .search(SearchParts::Index(&[index]))
        .size(1000)
        .send()
        .await?
        .error_for_status_code()?
        .json()
        .await?;
    let hits = found["hits"]["hits"].as_array().context("hits")?;
    if hits.len() < 30 {
        bail!("the index holds {} documents", hits.len());
    }
    let mapping: Value = es
        .indices()
        .get_mapping(IndicesGetMappingParts::Index(&[index]))
        .send()
        .await?
        .error_for_status_code()?
        .json()
        .await?;
    Ok((found.to_string(), mapping.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_excluded_key_field_stops_the_sink_before_it_writes_and_verify_refuses_it() -> Result<()>
{
    let p = Pipeline::new(
        "fields_key",
        "CREATE TABLE people (id int PRIMARY KEY, name text, secret text);
         INSERT INTO people VALUES (1, 'a', 'MARKER7f3a');",
        &["people"],
        "snapshot.mode = \"initial\"\n",
    )
    .await?;
    p.extend_sink_config(2, "fields.exclude = [\"secret\", \"public.people.id\"]")?;
    let result = refused(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn refused(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sink = p.spawn_sink(2)?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = sink.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            bail!("the sink did not stop:\n{}", p.sink_log(2));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = p.sink_log(2);
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("`id` is a key field of public.people")
            && log.contains("remove `public.people.id` from sink.fields.exclude"),
        "the sink names the key field and the fix:\n{log}"
    );
    let redis = redis_texts(p).await?;
    assert!(
        !redis.iter().any(|t| t.contains(":people:")),
        "the refused sink wrote a row: {redis:?}"
    );
    let verified = p.verify(Duration::from_secs(30)).await;
    let e = format!("{:#}", verified.err().context("verify refuses")?);
    assert!(
        e.contains("remove `public.people.id` from sink.fields.exclude"),
        "{e}"
    );
    kill9(&mut capture);
    Ok(())
}
