//! Capture's quarantine, against the real services: a table that cannot be
//! captured as it is (no key, a topic another table holds, a replica
//! identity on a non-key index, a primary key dropped while streaming) is
//! set aside while a neighbour table keeps flowing into the warehouse;
//! `oncely status` says degraded naming it; after the fix capture snapshots
//! it by itself (and removes the rows deleted meanwhile) and `oncely
//! verify` finds the warehouse equal.
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::harness::capture::{read_committed, terminate, Spawned};
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

/// Capture settings of every test here (besides the harness's heartbeat of
/// 500 ms, at which the fix is seen): an initial snapshot of the tables
/// that can be captured.
const CAPTURE: &str = "snapshot.mode = \"initial\"\n";

/// A pipeline of capture (serving `/readyz` at the returned address) and
/// the warehouse sink.
async fn pipeline(
    name: &str,
    schema: &str,
    tables: &[&str],
    extra: &str,
) -> Result<(Pipeline, SocketAddr)> {
    let addr = crate::harness::common::free_addr();
    let p = Pipeline::new(
        name,
        schema,
        tables,
        &format!("{CAPTURE}metrics.listen = \"{addr}\"\n{extra}"),
    )
    .await?;
    Ok((p, addr))
}

/// Rows of `wh.public_<table>` (0 while it does not exist).
async fn warehouse_rows(p: &Pipeline, table: &str) -> i64 {
    p.env
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {WAREHOUSE_SCHEMA}.public_{table} WHERE NOT __oncely_deleted"
            ),
            &[],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(0)
}

/// Inserts rows `from..=to` into `good` and waits for the warehouse to hold
/// `to` of them: the neighbour flows.
async fn neighbour_flows(p: &Pipeline, from: i32, to: i32) -> Result<()> {
    p.env
        .client
        .execute(
            "INSERT INTO good SELECT g, 'v' || g FROM generate_series($1::int, $2::int) g",
            &[&from, &to],
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while warehouse_rows(p, "good").await < i64::from(to) {
        if Instant::now() > deadline {
            bail!(
                "the neighbour table stopped: {} of {to} rows in the warehouse\ncapture log:\n{}",
                warehouse_rows(p, "good").await,
                p.env.capture_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `oncely status` of capture and the warehouse: exit code and output.
fn status(p: &Pipeline) -> Result<(i32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("status")
        .arg("--capture")
        .arg(&p.capture_config)
        .arg("--sink")
        .arg(&p.sinks[0])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Waits until status is degraded (exit 1) naming `table` as quarantined
/// with `reason`, and `/readyz` says so too.
async fn wait_quarantined(p: &Pipeline, addr: SocketAddr, table: &str, reason: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out) = status(p)?;
        let ready = oncely_core::endpoint::get(addr, "/readyz").await.ok();
        let named = |text: &str| {
            text.contains(&format!("table {table} is quarantined")) && text.contains(reason)
        };
        if code == 1
            && named(&out)
            && ready
                .as_ref()
                .is_some_and(|(s, body)| *s == 503 && named(body))
        {
            let metrics = oncely_core::endpoint::get(addr, "/metrics").await?.1;
            let label = format!("table=\"{table}\"");
            ensure!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("oncely_capture_quarantined{")
                        && l.contains(&label)
                        && l.ends_with(" 1")),
                "no oncely_capture_quarantined gauge of {table} in:\n{metrics}"
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("status never degraded naming {table} ({reason}): exit {code}\n{out}\n/readyz: {ready:?}\ncapture log:\n{}", p.env.capture_log());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `oncely verify` of the warehouse, again until equal (a snapshot may
/// still publish); fails with the last report.
async fn verify_equal(p: &Pipeline) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = oncely::verify::run(&oncely::verify::Options {
            capture: p.capture_config.clone(),
            sinks: vec![p.sinks[0].clone()],
            wait: true,
            capture_offset: true,
            timeout: Duration::from_secs(60),
            examples: 5,
            retries: 0,
        })
        .await
        .context("verify")?;
        if report.is_equal() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the warehouse differs from the source: {report}\ncapture log:\n{}",
                p.env.capture_log()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Status healthy again: no table quarantined.
fn released(p: &Pipeline) -> Result<()> {
    let (_, out) = status(p)?;
    ensure!(
        !out.contains("quarantined"),
        "still quarantined after the fix:\n{out}"
    );
    Ok(())
}

async fn finish(p: Pipeline, procs: Vec<Spawned>) {
    drop(procs);
    p.cleanup().await;
}

/// A keyless table matched by `table.include.list` (on main: start-up stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_table_is_quarantined_and_returns_equal_once_it_has_a_key() -> Result<()> {
    keyless("quar_keyless", "", "INSERT INTO bare VALUES (3, 'c')").await
}

/// The same with a filtered publication, which holds keyed tables only (a
/// keyless one in it would make PostgreSQL refuse its updates and deletes):
/// the release adds it before the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_table_outside_a_filtered_publication_returns_equal_once_it_has_a_key(
) -> Result<()> {
    keyless(
        "quar_keyless_filtered",
        "publication.autocreate.mode = \"filtered\"\n",
        "INSERT INTO bare VALUES (3, 'c'); UPDATE bare SET v = 'a2' WHERE id = 1; DELETE FROM bare WHERE id = 3;",
    )
    .await
}

async fn keyless(name: &str, extra: &str, while_set_aside: &str) -> Result<()> {
    let (p, addr) = pipeline(
        name,
        "CREATE TABLE good (id int PRIMARY KEY, v text);
         CREATE TABLE bare (id int NOT NULL, v text);
         INSERT INTO bare VALUES (1, 'a'), (2, 'b');",
        &["good", "bare"],
        extra,
    )
    .await?;
    let capture = p.spawn_capture()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    let sink = p.spawn_sink(0)?;
    p.env.client.batch_execute(while_set_aside).await?;
    neighbour_flows(&p, 1, 20).await?;
    wait_quarantined(&p, addr, "public.bare", "no primary key").await?;
    ensure!(
        warehouse_rows(&p, "bare").await == 0,
        "rows of a keyless table reached the warehouse"
    );

    p.env
        .client
        .batch_execute(
            "ALTER TABLE bare ADD PRIMARY KEY (id);
             UPDATE bare SET v = 'b2' WHERE id = 2;
             INSERT INTO bare VALUES (4, 'd');",
        )
        .await?;
    neighbour_flows(&p, 21, 30).await?;
    verify_equal(&p).await?;
    released(&p)?;
    finish(p, vec![capture, sink]).await;
    Ok(())
}

/// Two tables whose topic names collide (on main: start-up stopped). The
/// second in catalog order (`spare`, mapped onto `good`'s topic) is set
/// aside; a mapping of its own and a restart bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_topic_is_taken_is_quarantined_and_returns_equal_after_a_mapping(
) -> Result<()> {
    let collide = "topic.name.mapping = { \"public.spare\" = \"{prefix}.public.good\" }\n";
    let (p, addr) = pipeline(
        "quar_topic",
        "CREATE TABLE good (id int PRIMARY KEY, v text);
         CREATE TABLE spare (id int PRIMARY KEY, w text);
         INSERT INTO spare VALUES (1, 'a'), (2, 'b'), (3, 'c');",
        &["good", "spare"],
        collide,
    )
    .await?;
    let mut capture = p.spawn_capture()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    let sink = p.spawn_sink(0)?;
    p.env
        .client
        .batch_execute("UPDATE spare SET w = 'b2' WHERE id = 2; DELETE FROM spare WHERE id = 3; INSERT INTO spare VALUES (4, 'd');")
        .await?;
    neighbour_flows(&p, 1, 20).await?;
    wait_quarantined(&p, addr, "public.spare", "topic.name.mapping").await?;
    let mixed = read_committed(&[p.env.topic("good")])?
        .into_iter()
        .filter(|r| r.payload().is_some_and(|v| v["after"].get("w").is_some()))
        .count();
    ensure!(
        mixed == 0,
        "{mixed} records of public.spare on public.good's topic"
    );

    // The fix is a setting: capture restarts with it, sees it, snapshots spare.
    terminate(&mut capture.0, Duration::from_secs(30))?;
    let text = std::fs::read_to_string(&p.capture_config)?;
    let fixed = text.replace(
        &format!("\"{}.public.good\" }}", p.env.prefix),
        &format!("\"{}.public.spare\" }}", p.env.prefix),
    );
    ensure!(fixed != text, "mapping not found in:\n{text}");
    std::fs::write(&p.capture_config, fixed)?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("UPDATE spare SET w = 'a2' WHERE id = 1")
        .await?;
    neighbour_flows(&p, 21, 30).await?;
    verify_equal(&p).await?;
    released(&p)?;
    finish(p, vec![capture, sink]).await;
    Ok(())
}

/// REPLICA IDENTITY moved to a non-key index while streaming (on main:
/// refused from then on, never brought back; at start-up, a stop: see
/// `capture::replica_identity`). Set aside; changes made meanwhile, a
/// delete and a key change among them, reach the warehouse once REPLICA
/// IDENTITY DEFAULT is back: the snapshot rewrites every row, and the rows
/// it did not (deleted meanwhile) are removed when it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_identity_is_a_non_key_index_is_quarantined_and_returns_equal_once_fixed(
) -> Result<()> {
    let (p, addr) = pipeline(
        "quar_identity",
        "CREATE TABLE good (id int PRIMARY KEY, v text);
         CREATE TABLE bare (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text);
         INSERT INTO bare VALUES (1, 'a@x', 'a'), (2, 'b@x', 'b'), (3, 'c@x', 'c');",
        &["good", "bare"],
        "",
    )
    .await?;
    let capture = p.spawn_capture()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    let sink = p.spawn_sink(0)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while warehouse_rows(&p, "bare").await < 3 {
        ensure!(
            Instant::now() < deadline,
            "bare's snapshot never arrived:\n{}",
            p.env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.env
        .client
        .batch_execute(
            "ALTER TABLE bare REPLICA IDENTITY USING INDEX bare_email_key;
             UPDATE bare SET id = 20 WHERE id = 2;
             DELETE FROM bare WHERE id = 3;
             INSERT INTO bare VALUES (4, 'd@x', 'd');",
        )
        .await?;
    neighbour_flows(&p, 1, 20).await?;
    wait_quarantined(
        &p,
        addr,
        "public.bare",
        "REPLICA IDENTITY USING INDEX on (email)",
    )
    .await?;
    ensure!(
        warehouse_rows(&p, "bare").await == 3,
        "changes of a table with a broken identity reached the warehouse"
    );

    p.env
        .client
        .batch_execute(
            "ALTER TABLE bare REPLICA IDENTITY DEFAULT; UPDATE bare SET v = 'd2' WHERE id = 4;",
        )
        .await?;
    neighbour_flows(&p, 21, 30).await?;
    verify_equal(&p).await?;
    released(&p)?;
    finish(p, vec![capture, sink]).await;
    Ok(())
}

/// A primary key dropped while streaming, and capture restarted while the
/// table is set aside (on main: the restart stopped on the keyless table).
/// The quarantine survives the restart; the key added back brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_dropped_while_streaming_quarantines_across_a_restart_and_returns_equal(
) -> Result<()> {
    let (p, addr) = pipeline(
        "quar_dropped",
        "CREATE TABLE good (id int PRIMARY KEY, v text);
         CREATE TABLE bare (id int PRIMARY KEY, v text);
         INSERT INTO bare VALUES (1, 'a'), (2, 'b');",
        &["good", "bare"],
        "",
    )
    .await?;
    let mut capture = p.spawn_capture()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    let sink = p.spawn_sink(0)?;
    neighbour_flows(&p, 1, 5).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while warehouse_rows(&p, "bare").await < 2 {
        ensure!(
            Instant::now() < deadline,
            "bare's snapshot never arrived:\n{}",
            p.env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.env
        .client
        .batch_execute(
            "ALTER TABLE bare DROP CONSTRAINT bare_pkey; INSERT INTO bare VALUES (3, 'c');",
        )
        .await?;
    neighbour_flows(&p, 6, 10).await?;
    wait_quarantined(&p, addr, "public.bare", "primary key").await?;

    terminate(&mut capture.0, Duration::from_secs(30))?;
    p.env
        .client
        .batch_execute("INSERT INTO bare VALUES (4, 'd')")
        .await?;
    let capture = p.spawn_capture()?;
    p.env
        .wait_slot_active()
        .await
        .with_context(|| p.env.capture_log())?;
    neighbour_flows(&p, 11, 20).await?;
    wait_quarantined(&p, addr, "public.bare", "no primary key").await?;

    p.env
        .client
        .batch_execute(
            "ALTER TABLE bare ADD PRIMARY KEY (id); UPDATE bare SET v = 'a2' WHERE id = 1;",
        )
        .await?;
    neighbour_flows(&p, 21, 30).await?;
    verify_equal(&p).await?;
    released(&p)?;
    finish(p, vec![capture, sink]).await;
    Ok(())
}
