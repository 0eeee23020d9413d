//! Tables the stream still names but the catalog no longer has under that
//! name: a staging table created, filled and dropped while capture was
//! behind, and a table renamed after its first rows. Capture must publish
//! their changes keyed as the source keyed them, and go on.

use std::time::Duration;

use serde_json::json;

use crate::harness::capture::{terminate, wait_for, CaptureEnv, Seen, Spawned};

/// What `topics` hold once `done` says so, capture still running; capture's
/// log in the error otherwise.
async fn seen_while_running(
    env: &CaptureEnv,
    capture: &mut Spawned,
    topics: &[String],
    done: impl Fn(&[Seen]) -> bool,
) -> anyhow::Result<Vec<Seen>> {
    let seen = match wait_for(topics, Duration::from_secs(60), done).await {
        Ok(seen) => seen,
        Err(e) => anyhow::bail!(
            "{e}; capture exited: {:?}\n{}",
            capture.try_wait()?,
            env.capture_log()
        ),
    };
    assert!(
        capture.try_wait()?.is_none(),
        "capture stopped:\n{}",
        env.capture_log()
    );
    Ok(seen)
}

fn of<'a>(seen: &'a [Seen], topic: &str) -> Vec<&'a Seen> {
    seen.iter()
        .filter(|s| s.topic == topic && s.value.is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_renamed_tables_in_the_backlog_are_published_and_capture_goes_on(
) -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_gone").await?;
    env.client
        .batch_execute("CREATE TABLE kept (id int PRIMARY KEY, v text)")
        .await?;
    let config = env.write_config("capture.toml", &env.config(""))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    assert!(terminate(&mut capture, Duration::from_secs(30))?.success());

    // While capture is stopped, each statement its own transaction.
    for sql in [
        "CREATE TABLE staging (id int PRIMARY KEY, v text)",
        "INSERT INTO staging VALUES (1, 'a'), (2, 'b')",
        "UPDATE staging SET v = 'c' WHERE id = 1",
        "DELETE FROM staging WHERE id = 2",
        "CREATE TABLE old_name (k text PRIMARY KEY, n int)",
        "INSERT INTO old_name VALUES ('x', 1)",
        "ALTER TABLE old_name RENAME TO new_name",
        "INSERT INTO new_name VALUES ('y', 2)",
        "DROP TABLE staging",
        // A table of the same name as the dropped one, keyed differently:
        // the dropped table's changes must not take this one's key.
        "CREATE TABLE staging (code text PRIMARY KEY, id int)",
        "INSERT INTO kept VALUES (1, 'after')",
    ] {
        env.client.batch_execute(sql).await?;
    }

    let mut capture = env.spawn_capture(&config)?;
    let topics: Vec<String> = ["staging", "old_name", "new_name", "kept"]
        .iter()
        .map(|t| env.topic(t))
        .collect();
    let kept = env.topic("kept");
    let seen =
        seen_while_running(&env, &mut capture, &topics, |s| !of(s, &kept).is_empty()).await?;

    let staging: Vec<_> = of(&seen, &env.topic("staging"))
        .into_iter()
        .map(|s| (s.key_payload().cloned(), s.op().map(str::to_owned)))
        .collect();
    let key = |id: i64| Some(json!({"id": id}));
    let op = |o: &str| Some(o.to_owned());
    assert_eq!(
        staging,
        vec![
            (key(1), op("c")),
            (key(2), op("c")),
            (key(1), op("u")),
            (key(2), op("d")),
        ],
        "the dropped table's changes, keyed by its own primary key"
    );
    let renamed: Vec<_> = of(&seen, &env.topic("old_name"))
        .into_iter()
        .chain(of(&seen, &env.topic("new_name")))
        .map(|s| (s.topic.clone(), s.key_payload().cloned()))
        .collect();
    assert_eq!(
        renamed,
        vec![
            (env.topic("old_name"), Some(json!({"k": "x"}))),
            (env.topic("new_name"), Some(json!({"k": "y"}))),
        ]
    );
    assert!(terminate(&mut capture, Duration::from_secs(30))?.success());
    env.cleanup().await;
    Ok(())
}

/// A table capture keyed at start, dropped and made again under its name
/// with another primary key while capture streams: its new rows are keyed
/// by the new primary key, not the one capture read at start (which the new
/// table still has as a plain column, so a stale key would pass unnoticed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_made_again_with_another_key_while_streaming_takes_the_new_key(
) -> anyhow::Result<()> {
    let env = CaptureEnv::new("cap_remade").await?;
    env.client
        .batch_execute("CREATE TABLE remade (id int PRIMARY KEY, v text)")
        .await?;
    let config = env.write_config("capture.toml", &env.config(""))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    for sql in [
        "INSERT INTO remade VALUES (1, 'old')",
        "DROP TABLE remade",
        "CREATE TABLE remade (code text PRIMARY KEY, id int)",
        "INSERT INTO remade VALUES ('a', 1)",
    ] {
        env.client.batch_execute(sql).await?;
    }
    let topic = env.topic("remade");
    let seen = seen_while_running(&env, &mut capture, std::slice::from_ref(&topic), |s| {
        of(s, &topic).len() >= 2
    })
    .await?;
    let keys: Vec<_> = of(&seen, &topic)
        .into_iter()
        .map(|s| s.key_payload().cloned())
        .collect();
    assert_eq!(
        keys,
        vec![Some(json!({"id": 1})), Some(json!({"code": "a"}))],
        "the old table's row by its key, the new table's by its own"
    );
    assert!(terminate(&mut capture, Duration::from_secs(30))?.success());
    env.cleanup().await;
    Ok(())
}
