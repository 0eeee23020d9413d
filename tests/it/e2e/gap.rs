//! Records deleted from Kafka (retention) before the sinks applied them: every
//! prebuilt sink stops the partition instead of resuming past the gap,
//! `oncely status` says down naming the partition and the offsets gone, and
//! after a snapshot of the table and `--resume-after-gap` every target ends
//! equal to the source.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::common;
use crate::harness::e2e::Pipeline;

fn status(p: &Pipeline) -> Result<(i32, String)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncely"));
    cmd.arg("status").arg("--capture").arg(&p.capture_config);
    for sink in &p.sinks {
        cmd.arg("--sink").arg(sink);
    }
    let out = cmd.env("RUST_LOG", "warn").output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

pub(crate) fn watermarks(topic: &str) -> Result<(i64, i64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?;
    Ok(consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?)
}

/// Deletes all but the last `keep` records of partition 0 of `topic`, as
/// retention would; the log's end, so the new start is `end - keep`.
pub(crate) async fn delete_all_but_last(topic: &str, keep: i64) -> Result<i64> {
    let (_, high) = watermarks(topic)?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_brokers())
        .create()?;
    let mut cut = TopicPartitionList::new();
    cut.add_partition_offset(topic, 0, Offset::Offset(high - keep))?;
    admin
        .delete_records(&cut, &AdminOptions::new())
        .await
        .context("delete records")?;
    Ok(high)
}

/// Waits until each of the three sinks says it stopped its partition at
/// the gap (once assigned, which on a loaded machine takes a while); the
/// sinks' logs on a timeout.
async fn every_sink_stopped_at_the_gap(p: &Pipeline) -> Result<()> {
    wait_until("every sink stopped its partition at the gap", || {
        Ok((0..3).all(|i| {
            p.sink_log(i)
                .contains("offsets were deleted (retention.ms) before they were applied")
        }))
    })
    .await
    .with_context(|| {
        (0..3)
            .map(|i| format!("sink {i} log:\n{}", p.sink_log(i)))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

pub(crate) async fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    // Generous: under the full parallel suite three sinks joining their
    // groups and fetching took over 90 s once (a cold CI run).
    let deadline = Instant::now() + Duration::from_secs(240);
    while !done()? {
        if Instant::now() > deadline {
            bail!("{what}: never reached");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn rows(p: &Pipeline) -> Result<i64> {
    let row = p
        .env
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.public_t WHERE NOT coalesce(__oncely_deleted, false)",
                crate::harness::e2e::WAREHOUSE_SCHEMA
            ),
            &[],
        )
        .await;
    Ok(row.map(|r| r.get(0)).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_never_resumes_past_records_kafka_deleted() -> Result<()> {
    let p = Pipeline::new(
        "e2e_gap",
        "CREATE TABLE t (id int PRIMARY KEY, v text);\
         CREATE TABLE oncely_signal (id text PRIMARY KEY, type text NOT NULL, data text)",
        &["t"],
        "signal.data.collection = \"public.oncely_signal\"\ntable.include.list = \"public.t,public.oncely_signal\"\n",
    )
    .await?;
    let topic = p.topics()[0].clone();
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 200) g")
        .await?;
    let sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    wait_until("sinks caught up", || Ok(status(&p)?.0 == 0)).await?;
    drop(sinks);

    // 400 rows while every sink is down, then the oldest of them deleted.
    p.env
        .client
        .batch_execute(
            "INSERT INTO t SELECT g, 'b' || g FROM generate_series(201, 600) g;\
             DELETE FROM t WHERE id <= 20",
        )
        .await?;
    wait_until("capture published the 420 changes", || {
        Ok(watermarks(&topic)?.1 >= 600)
    })
    .await?;
    let high = delete_all_but_last(&topic, 100).await?;
    assert_eq!(watermarks(&topic)?.0, high - 100);

    // Started again, no sink applies anything past the gap.
    let sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    // Each sink finds the gap once it is assigned its partition, which on a
    // loaded machine takes a while: waited for, then checked in full below.
    every_sink_stopped_at_the_gap(&p).await?;
    let (code, out) = status(&p)?;
    assert_eq!(code, 2, "a gap is down:\n{out}");
    for i in 0..3 {
        assert!(
            out.contains(&format!("{topic}[0] needs offset")) && out.contains("were deleted"),
            "sink {i} gap not named:\n{out}"
        );
        let log = p.sink_log(i);
        assert!(
            log.contains("offsets were deleted (retention.ms) before they were applied"),
            "sink {i} did not say the partition stopped:\n{log}"
        );
    }
    assert_eq!(rows(&p).await?, 200, "the warehouse applied past the gap");
    drop(sinks);

    // The fix: the table snapshotted again, the sinks resumed at the log start.
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "snapshot", "--config"])
        .arg(&p.capture_config)
        .args(["--table", "public.t"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _sinks: Vec<_> = (0..3)
        .map(|i| p.spawn_sink_with(i, &["--resume-after-gap"]))
        .collect::<Result<_>>()?;
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(
        report.is_equal(),
        "{}",
        crate::harness::e2e::summary(&report)
    );
    let (code, out) = status(&p)?;
    assert_eq!(code, 0, "{out}");
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// A sink that never applied a partition (no stored position, no committed
/// offset: a new sink, or one killed before its first commit) whose log no
/// longer starts at 0 would miss what was deleted: it stops at the gap as
/// one that had applied some of it does, instead of starting silently at the
/// log start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_with_no_position_stops_at_a_log_that_lost_its_start() -> Result<()> {
    let p = Pipeline::new(
        "e2e_gap_new",
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        &["t"],
        "",
    )
    .await?;
    let topic = p.topics()[0].clone();
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 300) g")
        .await?;
    wait_until("capture published the 300 rows", || {
        // The topic exists once capture wrote its first record.
        Ok(watermarks(&topic).is_ok_and(|(_, high)| high >= 300))
    })
    .await?;
    delete_all_but_last(&topic, 100).await?;

    let sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    every_sink_stopped_at_the_gap(&p).await?;
    assert!(
        rows(&p).await? == 0,
        "the warehouse applied rows past the gap"
    );
    let (code, out) = status(&p)?;
    assert_eq!(code, 2, "a gap is down:\n{out}");
    drop(sinks);
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// With `gap.recovery = "snapshot"` the same gap — now holding deletes and
/// updates too — needs no person: each sink requests a snapshot of the
/// table through capture's signal table, removes the rows older than it
/// (the 20 deleted inside the lost records), resumes at the log start, is
/// reported recovering while capture has not done the snapshot, and ends
/// equal, with `oncely status` healthy — also the two sinks whose requests
/// reach capture while the first one's snapshot of the table is under way.
/// (That a table whose copy began is copied again when requested again is
/// `a_table_whose_copy_began_is_copied_again_when_requested_again`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_recovered_by_a_snapshot_without_a_person() -> Result<()> {
    let p = Pipeline::new(
        "e2e_gap_snap",
        "CREATE TABLE t (id int PRIMARY KEY, v text);\
         CREATE TABLE oncely_signal (id text PRIMARY KEY, type text NOT NULL, data text)",
        &["t"],
        "signal.data.collection = \"public.oncely_signal\"\ntable.include.list = \"public.t,public.oncely_signal\"\nincremental.snapshot.chunk.size = 10\n",
    )
    .await?;
    let topic = p.topics()[0].clone();
    for i in 0..3 {
        recover_by_snapshot(&p, i)?;
    }
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 200) g")
        .await?;
    let sinks: Vec<_> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    wait_until("sinks caught up", || Ok(status(&p)?.0 == 0)).await?;
    drop(sinks);

    // Deletes and updates first, so that they are among the records lost.
    p.env
        .client
        .batch_execute(
            "DELETE FROM t WHERE id <= 20;\
             UPDATE t SET v = 'u' || id WHERE id BETWEEN 21 AND 40;\
             INSERT INTO t SELECT g, 'b' || g FROM generate_series(201, 600) g",
        )
        .await?;
    wait_until("capture published the 440 changes", || {
        Ok(watermarks(&topic)?.1 >= 640)
    })
    .await?;
    let high = delete_all_but_last(&topic, 100).await?;

    // Capture stopped, so that the snapshot cannot finish yet: the
    // warehouse sink says it is recovering, never healthy, and the rows
    // deleted inside the gap are gone already.
    drop(capture);
    let mut sinks = vec![p.spawn_sink(0)?];
    let mut last = String::new();
    let recovering = wait_until("the warehouse sink reports recovering", || {
        let (code, out) = status(&p)?;
        let done = code != 0 && out.contains("recovering from a gap");
        last = out;
        Ok(done)
    })
    .await;
    recovering.with_context(|| format!("oncely status said:\n{last}"))?;
    let deleted = p
        .env
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.public_t WHERE id <= 20 AND NOT coalesce(__oncely_deleted, false)",
                crate::harness::e2e::WAREHOUSE_SCHEMA
            ),
            &[],
        )
        .await?
        .get::<_, i64>(0);
    assert_eq!(
        deleted, 0,
        "rows deleted inside the gap are still in the warehouse"
    );

    // The other two sinks ask once that snapshot has published chunks (10
    // rows each): a request joining a snapshot under way still ends equal.
    let capture = p.spawn_capture()?;
    wait_until("the snapshot published a chunk", || {
        Ok(watermarks(&topic)?.1 > high + 10)
    })
    .await?;
    sinks.push(p.spawn_sink(1)?);
    sinks.push(p.spawn_sink(2)?);
    let report = p.verify_until_equal(Duration::from_secs(120)).await?;
    assert!(
        report.is_equal(),
        "{}",
        crate::harness::e2e::summary(&report)
    );
    assert_eq!(rows(&p).await?, 580);
    // A sink declares the gap recovered once capture's offset shows the
    // snapshot done, which can come after the targets are equal.
    wait_until("status healthy after the recovery", || {
        Ok(status(&p)?.0 == 0)
    })
    .await?;
    for i in 0..3 {
        let log = p.sink_log(i);
        assert!(
            log.contains("recovering by a snapshot") && log.contains("gap recovered"),
            "sink {i} did not say it recovered the gap:\n{log}"
        );
    }
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// A gap recovery whose snapshot capture refuses — the topic's table is
/// quarantined (its primary key dropped) — is never reported recovered:
/// the sink logs the failed recovery with capture's reason, and `oncely
/// status` names it (on main the sink said "gap recovered" and status
/// turned healthy while the rows the removal took stayed gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_recovery_capture_refuses_is_not_reported_recovered() -> Result<()> {
    let mut p = Pipeline::new(
        "e2e_gap_refused",
        "CREATE TABLE t (id int PRIMARY KEY, v text);\
         CREATE TABLE oncely_signal (id text PRIMARY KEY, type text NOT NULL, data text)",
        &["t"],
        "signal.data.collection = \"public.oncely_signal\"\ntable.include.list = \"public.t,public.oncely_signal\"\n",
    )
    .await?;
    // One sink: the warehouse.
    p.sinks.truncate(1);
    let topic = p.topics()[0].clone();
    recover_by_snapshot(&p, 0)?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 50) g")
        .await?;
    wait_until("capture published the 50 rows", || {
        Ok(watermarks(&topic).is_ok_and(|(_, high)| high >= 50))
    })
    .await?;
    p.env
        .client
        .batch_execute("ALTER TABLE t DROP CONSTRAINT t_pkey; INSERT INTO t VALUES (51, 'x')")
        .await?;
    wait_until("capture quarantined public.t", || {
        Ok(status(&p)?.1.contains("table public.t is quarantined"))
    })
    .await
    .with_context(|| p.env.capture_log())?;
    delete_all_but_last(&topic, 10).await?;

    // A new sink: no position, so the deleted records are a gap.
    let sink = p.spawn_sink(0)?;
    wait_until("the sink says the recovery failed", || {
        Ok(p.sink_log(0).contains("the gap recovery failed"))
    })
    .await
    .with_context(|| format!("sink log:\n{}", p.sink_log(0)))?;
    let log = p.sink_log(0);
    assert!(
        log.contains("capture refused the recovery snapshot of public.t")
            && log.contains("is quarantined"),
        "{log}"
    );
    let mut last = String::new();
    wait_until("status names the failed recovery", || {
        let (code, out) = status(&p)?;
        let named = code != 0 && out.contains("the gap recovery failed");
        last = out;
        Ok(named)
    })
    .await
    .with_context(|| format!("oncely status said:\n{last}"))?;
    assert!(
        !p.sink_log(0).contains("gap recovered"),
        "{}",
        p.sink_log(0)
    );
    drop(sink);
    drop(capture);
    p.cleanup().await;
    Ok(())
}

/// Sink `i` recovers a gap by a snapshot signalled through the pipeline's
/// capture, with a /readyz for `oncely status` to read.
fn recover_by_snapshot(p: &Pipeline, i: usize) -> Result<()> {
    let capture_config = std::fs::canonicalize(&p.capture_config)?;
    p.prepend_sink_runner_keys(
        i,
        &format!(
            "gap.recovery = \"snapshot\"\ngap.capture.config = {:?}\nmetrics.listen = \"{}\"",
            capture_config.display().to_string(),
            std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?
        ),
    )
}
