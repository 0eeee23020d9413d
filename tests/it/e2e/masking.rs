//! Capture's column settings (docs/configuration.md, "Columns: selection
//! and masking") through the whole pipeline. Every protected value holds a
//! marker: an excluded column (`ssn`), a hashed one (`email`, `v2`, and
//! `note`, `v1`, its salt from a file), one masked with asterisks (`bio`,
//! large and stored out of line, so updates leave it unchanged TOAST) and
//! one truncated (`city`). After a snapshot, inserts, updates, primary-key
//! updates (their unchanged TOAST values read back from the source),
//! deletes, and the same on a REPLICA IDENTITY FULL table (whose `before`
//! images carry every column), the marker and the salt are in no record of
//! any topic (read uncommitted: aborted transactions too), no log line and
//! no target; the warehouse holds exactly the pseudonyms PostgreSQL computes
//! from the source; and `oncely verify` is equal for all three targets.
use std::time::Duration;

use anyhow::{Context, Result};

use super::fields::{es_texts, redis_texts};
use crate::harness::capture::{kill9, read_to_end, topics_where};
use crate::harness::checks::dead_letters;
use crate::harness::common;
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

const MARKER: &str = "Mq7RKz";
const SALT: &str = "s4ltPepper9";

const SCHEMA: &str = "
    CREATE TABLE people (id int PRIMARY KEY, name text, email varchar(40), ssn text, bio text, city text);
    ALTER TABLE people ALTER COLUMN bio SET STORAGE EXTERNAL, ALTER COLUMN ssn SET STORAGE EXTERNAL;
    INSERT INTO people SELECT g, 'n' || g, 'Mq7RKz' || g || '@x.org', 'Mq7RKz-ssn-' || g || repeat('s', 9000),
        'Mq7RKz-bio-' || g || repeat('b', 20000), 'Mq7RKz-city-' || g
      FROM generate_series(1, 30) g;
    CREATE TABLE ledger (id int PRIMARY KEY, amount int, note text, ssn text);
    ALTER TABLE ledger REPLICA IDENTITY FULL;
    INSERT INTO ledger SELECT g, g * 10, 'Mq7RKz-note-' || g, 'Mq7RKz-lssn-' || g FROM generate_series(1, 30) g;
";

fn settings(salt_file: &str) -> String {
    format!(
        "snapshot.mode = \"initial\"\n\
         column.exclude.list = \"public\\\\.(people|ledger)\\\\.ssn\"\n\
         \"column.mask.hash.v2.SHA-256.with.salt.{SALT}\" = \"public.people.email\"\n\
         \"column.mask.hash.SHA-256.with.salt.${{file:{salt_file}}}\" = \"public.ledger.note\"\n\
         column.mask.with.6.chars = \"public.people.bio\"\n\
         column.truncate.to.3.chars = \"public.people.city\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_and_excluded_columns_reach_no_topic_no_log_and_no_target() -> Result<()> {
    let dir = std::env::temp_dir().join(common::unique("oncely-mask-salt"));
    std::fs::create_dir_all(&dir)?;
    let salt_file = dir.join("salt");
    std::fs::write(&salt_file, format!("{SALT}\n"))?;
    let p = Pipeline::new(
        "masking",
        SCHEMA,
        &["people", "ledger"],
        &settings(&salt_file.display().to_string()),
    )
    .await?;
    let result = drive(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
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
            "INSERT INTO people SELECT g, 'n' || g, '{MARKER}' || g || '@x.org', '{MARKER}-ssn', '{MARKER}-bio', '{MARKER}-city'
               FROM generate_series(31, 40) g;
             -- bio and ssn stay unchanged TOAST in these
             UPDATE people SET name = 'renamed' WHERE id <= 5;
             UPDATE people SET email = '{MARKER}-new@x.org', city = '{MARKER}-moved' WHERE id = 6;
             -- primary-key changes: the new rows' TOAST values are read back from the source
             UPDATE people SET id = 1001 WHERE id = 7;
             UPDATE people SET id = 1002, name = 'moved' WHERE id = 8;
             DELETE FROM people WHERE id IN (9, 10);
             UPDATE ledger SET amount = amount + 1 WHERE id <= 10;
             UPDATE ledger SET note = '{MARKER}-note-changed' WHERE id = 11;
             UPDATE ledger SET id = 1012 WHERE id = 12;
             DELETE FROM ledger WHERE id IN (13, 14);
             INSERT INTO ledger VALUES (50, 5, '{MARKER}-note-50', '{MARKER}-lssn-50'),
               (51, 5, NULL, NULL);"
        ))
        .await
        .context("the changes")?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "after the changes:\n{report}");
    assert_eq!(
        report.compared(),
        6,
        "two tables in three targets: {report}"
    );

    // The warehouse holds what PostgreSQL computes from the source: v2 is
    // SHA-256 over the salt and the value's UTF-8, cut to varchar(40).
    // (Rows deleted from the source stay in the warehouse, soft-deleted;
    // verify compared the rows.)
    let mismatched: i64 = p
        .env
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM public.people s JOIN {WAREHOUSE_SCHEMA}.public_people w USING (id)
                 WHERE w.email IS DISTINCT FROM left(encode(sha256(convert_to('{SALT}' || s.email, 'UTF8')), 'hex'), 40)
                    OR w.bio IS DISTINCT FROM '******' OR w.city IS DISTINCT FROM left(s.city, 3)"
            ),
            &[],
        )
        .await
        .context("the warehouse's masked values")?
        .get(0);
    assert_eq!(
        mismatched, 0,
        "warehouse values differ from the masks of the source"
    );
    let warehouse: Vec<String> = p
        .env
        .client
        .query(
            &format!(
                "SELECT w::text FROM {WAREHOUSE_SCHEMA}.public_people w
                 UNION ALL SELECT l::text FROM {WAREHOUSE_SCHEMA}.public_ledger l
                 UNION ALL SELECT column_name::text FROM information_schema.columns
                   WHERE table_schema = '{WAREHOUSE_SCHEMA}'"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(warehouse.len() > 60, "the warehouse holds the rows");
    assert_clean("the warehouse", &warehouse, true);

    assert_clean("the Redis cache", &redis_texts(p).await?, true);
    for topic in p.topics() {
        let (documents, mapping) = es_texts(&topic.to_lowercase()).await?;
        assert_clean(&topic, &[documents, mapping], true);
    }

    let prefix = p.env.prefix.clone();
    let offsets = p.env.offsets_topic.clone();
    let records = tokio::task::spawn_blocking(move || every_record(&prefix, &offsets)).await??;
    assert!(records.len() > 100, "{} records", records.len());
    assert!(
        records.iter().any(|r| r.contains("\"masked\":\"true\"")),
        "masked fields say so in their schema"
    );
    // The schema-change topic names every column of a table (as Debezium's
    // schema history does), an excluded one too; never a value.
    assert_clean("the topics", &records, false);
    let topics = p.topics();
    let changes: Vec<String> = records
        .into_iter()
        .filter(|r| topics.iter().any(|t| r.starts_with(&format!("{t}: "))))
        .collect();
    assert!(changes.len() > 60, "{} change records", changes.len());
    assert_clean("the change topics", &changes, true);

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
    let logs = logs(&p.env.dir)?;
    assert!(
        logs.len() >= 4,
        "capture's and the sinks' logs: {}",
        logs.len()
    );
    assert_clean("the logs", &logs, false);
    Ok(())
}

/// Neither the marker nor the salt in `texts`; nor an excluded column's
/// name (`ssn`) when `names` says names are in them too.
fn assert_clean(what: &str, texts: &[String], names: bool) {
    for t in texts {
        assert!(
            !t.contains(MARKER),
            "{what} holds the marker: {}",
            excerpt(t, MARKER)
        );
        assert!(
            !t.contains(SALT),
            "{what} holds the salt: {}",
            excerpt(t, SALT)
        );
        if names {
            assert!(
                !t.contains("ssn"),
                "{what} holds an excluded column: {}",
                excerpt(t, "ssn")
            );
        }
    }
}

fn excerpt(text: &str, found: &str) -> String {
    let at = text.find(found).unwrap_or(0);
    let before: String = text[..at].chars().rev().take(200).collect();
    let after: String = text[at..].chars().take(200).collect();
    before.chars().rev().chain(after.chars()).collect()
}

/// The text of every `*.log` file of the pipeline (capture's, the sinks', verify's).
fn logs(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".log") || name.ends_with(".stderr") {
            out.push(std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    Ok(out)
}

/// The key, value and headers of every record, committed or not, of every
/// topic of this pipeline: its tables', schema changes, heartbeats, dead
/// letters and offsets.
pub(super) fn every_record(prefix: &str, offsets: &str) -> Result<Vec<String>> {
    use rdkafka::message::{Headers, Message};

    let topics = topics_where(|t| t.contains(prefix) || t == offsets)?;
    let mut out = Vec::new();
    // Aborted transactions too: a masked value must not reach Kafka at all.
    read_to_end("read_uncommitted", &topics, Duration::from_secs(60), |m| {
        let mut text = format!("{}: ", m.topic());
        for part in [m.key(), m.payload()].into_iter().flatten() {
            text.push_str(&String::from_utf8_lossy(part));
        }
        for h in m.headers().iter().flat_map(|h| h.iter()) {
            text.push_str(h.key);
            text.push_str(&String::from_utf8_lossy(h.value.unwrap_or_default()));
        }
        out.push(text);
        Ok(())
    })?;
    Ok(out)
}

/// A key column excluded stops capture at start, naming the column, the
/// key and the fix, before anything is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_column_excluded_refuses_the_start() -> Result<()> {
    let p = Pipeline::new(
        "masking_key",
        "CREATE TABLE people (id int PRIMARY KEY, name text);
         INSERT INTO people VALUES (1, 'Mq7RKz');",
        &["people"],
        "",
    )
    .await?;
    let result = p.env.run_capture(
        "snapshot.mode = \"initial\"\ncolumn.exclude.list = \"public.people.id\"\n",
        Duration::from_secs(60),
    );
    p.cleanup().await;
    let (ok, out) = result?;
    assert!(!ok, "{out}");
    assert!(
        out.contains("key column id of table public.people is excluded")
            && out.contains("message.key.columns"),
        "{out}"
    );
    Ok(())
}

/// `column.include.list` publishes only the columns it names and the key
/// (which it need not name): the other columns reach no target, and
/// verify compares what is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_include_list_publishes_its_columns_and_the_key() -> Result<()> {
    let p = Pipeline::new(
        "masking_include",
        "CREATE TABLE people (id int PRIMARY KEY, name text, secret text);
         INSERT INTO people SELECT g, 'n' || g, 'Mq7RKz' || g FROM generate_series(1, 30) g;",
        &["people"],
        "snapshot.mode = \"initial\"\ncolumn.include.list = \"public\\\\.people\\\\.name\"\n",
    )
    .await?;
    let result = included(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn included(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    p.env
        .client
        .batch_execute(&format!(
            "INSERT INTO people VALUES (31, 'new', '{MARKER}');
             UPDATE people SET id = 1001, secret = '{MARKER}-moved' WHERE id = 1;"
        ))
        .await?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    assert!(report.is_equal(), "{report}");
    let columns: Vec<String> = p
        .env
        .client
        .query(
            &format!(
                "SELECT column_name::text FROM information_schema.columns
                 WHERE table_schema = '{WAREHOUSE_SCHEMA}' AND table_name = 'public_people'
                   AND column_name NOT LIKE '\\_\\_%'"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut columns = columns;
    columns.sort();
    assert_eq!(columns, ["id", "name"], "the warehouse's columns");
    let redis = redis_texts(p).await?;
    assert!(redis.iter().any(|t| t == "new"), "the cache holds the rows");
    assert!(
        !redis
            .iter()
            .any(|t| t.contains(MARKER) || t.contains("secret")),
        "{redis:?}"
    );
    for s in &mut sinks {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}
