//! A captured table whose replica identity does not carry its event key
//! (REPLICA IDENTITY NOTHING, USING INDEX on other columns, a partition with
//! either) is quarantined at start-up with a message naming the table and
//! the fix, or only warned of with `replica.identity.check = "warn"`. FULL
//! and a primary key work. When DDL breaks a table's identity while capture
//! streams, the Relation message that follows quarantines that table (the
//! targets keep what they hold) while the other tables go on; once the
//! identity is fixed, capture snapshots the table again by itself.

use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::harness::capture::{wait_for, CaptureEnv, Seen};

const START: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_sets_aside_identities_without_the_key() -> Result<()> {
    let env = CaptureEnv::new("cap_ident_start").await?;
    env.client
        .batch_execute(
            "CREATE TABLE plain (id int PRIMARY KEY, v text);
             CREATE TABLE fully (id int PRIMARY KEY, v text);
             ALTER TABLE fully REPLICA IDENTITY FULL;
             CREATE TABLE by_email (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text);
             ALTER TABLE by_email REPLICA IDENTITY USING INDEX by_email_email_key;
             CREATE TABLE by_pk_index (id int PRIMARY KEY, v text);
             ALTER TABLE by_pk_index REPLICA IDENTITY USING INDEX by_pk_index_pkey;
             CREATE TABLE nothing (id int PRIMARY KEY, v text);
             ALTER TABLE nothing REPLICA IDENTITY NOTHING;
             CREATE TABLE parts (id int, r int, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
             CREATE TABLE parts_1 PARTITION OF parts FOR VALUES IN (1);
             CREATE TABLE parts_2 PARTITION OF parts FOR VALUES IN (2);
             ALTER TABLE parts_2 REPLICA IDENTITY NOTHING;",
        )
        .await?;

    // Each table whose identity lacks its key is set aside (quarantined),
    // named with the fix; capture itself runs on.
    let bad = "table.include.list = \"public\\\\.(nothing|by_email|parts)\"\n";
    let path = env.write_config("bad.toml", &env.config(bad))?;
    let mut capture = env.spawn_capture(&path)?;
    let wanted = [
        "table public.nothing is quarantined: table public.nothing has REPLICA IDENTITY NOTHING",
        "ALTER TABLE public.nothing REPLICA IDENTITY FULL",
        "replica.identity.check",
        "table public.by_email has REPLICA IDENTITY USING INDEX on (email)",
        "keyed by (id)",
        "ALTER TABLE public.by_email REPLICA IDENTITY FULL",
        "partition public.parts_2 of captured table public.parts",
        "ALTER TABLE public.parts_2 REPLICA IDENTITY FULL",
    ];
    let deadline = std::time::Instant::now() + START;
    while !wanted.iter().all(|w| env.capture_log().contains(w)) {
        ensure!(
            std::time::Instant::now() < deadline,
            "not every broken identity was set aside:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        capture.try_wait()?.is_none(),
        "capture stopped:\n{}",
        env.capture_log()
    );
    crate::harness::capture::terminate(&mut capture, Duration::from_secs(30))?;
    drop(capture);

    // FULL, DEFAULT with a primary key, USING INDEX on the primary key: start and stream.
    let good = "table.include.list = \"public\\\\.(plain|fully|by_pk_index)\"\n";
    let path = env.write_config("good.toml", &env.config(good))?;
    let capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    env.client
        .batch_execute(
            "INSERT INTO plain VALUES (1, 'a'); INSERT INTO fully VALUES (1, 'a'); INSERT INTO by_pk_index VALUES (1, 'a');
             UPDATE fully SET id = 2; DELETE FROM by_pk_index;",
        )
        .await?;
    let topics = [
        env.topic("plain"),
        env.topic("fully"),
        env.topic("by_pk_index"),
    ];
    let seen = wait_for(&topics, Duration::from_secs(60), |seen| {
        seen.iter().filter(|r| r.op() == Some("d")).count() >= 2
    })
    .await
    .with_context(|| env.capture_log())?;
    for r in seen.iter().filter(|r| r.op() == Some("d")) {
        ensure!(
            r.key_payload().is_some_and(|k| k["id"] == 1),
            "delete without its key: {r:?}"
        );
    }
    drop(capture);

    // warn: starts, says why, publishes (another connector: its own slot).
    let warn = "snapshot.mode = \"no_data\"\ntable.include.list = \"public\\\\.(by_email|nothing)\"\nreplica.identity.check = \"warn\"\n";
    let prefix = format!("{}-warn", env.prefix);
    let slot = format!("{}_warn", env.slot);
    let path = env.write_config(
        "warn.toml",
        &env.config_as(&prefix, &slot, &format!("{prefix}-offsets"), warn),
    )?;
    let capture = env.spawn_capture(&path)?;
    env.wait_named_slot_active(&slot).await?;
    env.client
        .batch_execute("INSERT INTO by_email VALUES (1, 'a@x', 'a')")
        .await?;
    wait_for(
        &[format!("{prefix}.public.by_email")],
        Duration::from_secs(60),
        |seen| seen.iter().any(|r| r.op() == Some("c")),
    )
    .await
    .with_context(|| env.capture_log())?;
    let log = env.capture_log();
    ensure!(
        log.contains("table public.by_email has REPLICA IDENTITY USING INDEX")
            && log.contains("table public.nothing has REPLICA IDENTITY NOTHING"),
        "no warnings:\n{log}"
    );
    // Stopped first: an active slot cannot be dropped.
    drop(capture);
    env.cleanup().await;
    Ok(())
}

fn ids(seen: &[Seen], topic: &str) -> Vec<(String, i64)> {
    seen.iter()
        .filter(|r| r.topic == topic)
        .filter_map(|r| {
            let p = r.payload()?;
            let row = if p["op"] == "d" {
                &p["before"]
            } else {
                &p["after"]
            };
            Some((p["op"].as_str()?.to_string(), row["id"].as_i64()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_broken_while_streaming_refuses_only_that_table() -> Result<()> {
    let env = CaptureEnv::new("cap_ident_stream").await?;
    env.client
        .batch_execute(
            "CREATE TABLE people (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text);
             CREATE TABLE keyed (id int PRIMARY KEY, v text);
             CREATE TABLE other (id int PRIMARY KEY, v text);",
        )
        .await?;
    let path = env.write_config(
        "capture.toml",
        &env.config("table.include.list = \"public\\\\.(people|keyed|other)\"\n"),
    )?;
    let capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    let (people, keyed, other) = (env.topic("people"), env.topic("keyed"), env.topic("other"));
    let topics = [people.clone(), keyed.clone(), other.clone()];
    env.client
        .batch_execute(
            "INSERT INTO people VALUES (1, 'a@x', 'a'), (2, 'b@x', 'b');
             INSERT INTO keyed VALUES (1, 'a');",
        )
        .await?;
    wait_for(&topics, Duration::from_secs(60), |seen| seen.len() >= 3).await?;

    // Identity moved to another index, and a primary key dropped, while streaming.
    env.client
        .batch_execute(
            "ALTER TABLE people REPLICA IDENTITY USING INDEX people_email_key;
             UPDATE people SET id = 10 WHERE id = 1;
             DELETE FROM people WHERE id = 2;
             INSERT INTO people VALUES (3, 'c@x', 'c');
             ALTER TABLE keyed DROP CONSTRAINT keyed_pkey;
             INSERT INTO keyed VALUES (2, 'b');
             INSERT INTO other VALUES (1, 'goes on');",
        )
        .await?;
    let seen = wait_for(&topics, Duration::from_secs(60), |seen| {
        !ids(seen, &other).is_empty()
    })
    .await
    .with_context(|| env.capture_log())?;
    let log = env.capture_log();
    ensure!(
        log.contains("table public.people has REPLICA IDENTITY USING INDEX on (email)")
            && log.contains("ALTER TABLE public.people REPLICA IDENTITY FULL")
            && log
                .contains("table public.keyed has REPLICA IDENTITY DEFAULT without a primary key"),
        "no refusal in the log:\n{log}"
    );
    let before = [("c".to_string(), 1), ("c".to_string(), 2)];
    ensure!(
        ids(&seen, &people) == before,
        "people changes published with a broken identity: {:?}",
        ids(&seen, &people)
    );
    ensure!(
        ids(&seen, &keyed) == [("c".to_string(), 1)],
        "keyed: {:?}",
        ids(&seen, &keyed)
    );

    // A retriable failure restarts the pipeline inside the process; the
    // start check then only warns, and the other tables go on. (A table
    // without any key stops every start, restarts too: give keyed its key back.)
    env.client
        .batch_execute("ALTER TABLE keyed ADD PRIMARY KEY (id)")
        .await?;
    env.client
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&env.slot],
        )
        .await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !env
        .capture_log()
        .contains("restarting from the last committed offset")
    {
        ensure!(
            std::time::Instant::now() < deadline,
            "capture did not restart:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.wait_slot_active().await?;

    // Fixed: the heartbeat's catalog check releases it, and a snapshot of
    // it brings the changes made while it was set aside.
    env.client
        .batch_execute(
            "ALTER TABLE people REPLICA IDENTITY FULL;
             UPDATE people SET v = 'fixed' WHERE id = 3;
             INSERT INTO other VALUES (2, 'after fix');",
        )
        .await?;
    let fixed = |seen: &[Seen]| {
        seen.iter().any(|r| {
            r.topic == people
                && r.op() == Some("r")
                && r.payload().is_some_and(|p| p["after"]["v"] == "fixed")
        })
    };
    let seen = wait_for(&topics, Duration::from_secs(60), |seen| {
        ids(seen, &other).len() >= 2 && fixed(seen)
    })
    .await
    .with_context(|| env.capture_log())?;
    let mut read: Vec<i64> = ids(&seen, &people)
        .into_iter()
        .filter(|(op, _)| op == "r")
        .map(|(_, id)| id)
        .collect();
    read.sort();
    read.dedup();
    ensure!(
        read == [3, 10],
        "people's snapshot after the fix: {:?}",
        ids(&seen, &people)
    );
    // Stopped first: an active slot cannot be dropped.
    drop(capture);
    env.cleanup().await;
    Ok(())
}
