//! A snapshot of a table with a TOASTed column while a writer keeps updating
//! its other columns, with capture and the three sinks as processes and
//! capture SIGKILLed during the snapshot; then `oncely verify` must find
//! every target equal to the source.
//!
//! An update that leaves the TOASTed column unchanged carries it as
//! unavailable; a chunk row whose key such an update touched inside the
//! chunk's watermark window cannot simply be dropped, or a target that had
//! no row yet (the snapshot had not reached it) never gets the value. The
//! chunk row holds it: capture completes the row from the window's updates
//! and the chunk row (`capture/src/snapshot/window.rs`). Deletes in the
//! window must still win, inserts carry their own values, and updates that
//! do set the TOASTed column must not lose to the chunk's older read.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use rand::Rng;
use tokio_postgres::Client;

use crate::harness::capture;
use crate::harness::capture::{kill9, CaptureEnv, Spawned};
use crate::harness::checks::scan_changes;
use crate::harness::e2e::Pipeline;

/// Rows at the start; ids above it are inserted by the writer.
const ROWS: i64 = 5000;
/// Rows per chunk: small, so that many chunks overlap the writer's updates.
const CHUNK: usize = 5;
/// SIGKILLs of capture while the snapshot runs (at least).
const KILLS: usize = 3;

/// `big` is stored out of line uncompressed (`EXTERNAL`): 2,560 bytes of md5
/// digests, over the TOAST threshold. Not captured: `wh` (the warehouse), and
/// the signal table (commands, not state).
const SCHEMA: &str = "
    CREATE TABLE docs (id bigint PRIMARY KEY, rev bigint NOT NULL, note text, big text);
    ALTER TABLE docs ALTER COLUMN big SET STORAGE EXTERNAL;
    CREATE FUNCTION big_value(seed text) RETURNS text LANGUAGE sql IMMUTABLE AS
        $$ SELECT string_agg(md5(seed || ':' || i), '') FROM generate_series(1, 80) i $$;
    INSERT INTO docs SELECT g, 0, 'seed', big_value(g::text) FROM generate_series(1, 5000) g;
    CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));";

/// The snapshot the test runs.
#[derive(Clone, Copy)]
enum Start {
    /// `snapshot.mode = "initial"`.
    Initial,
    /// `snapshot.mode = "no_data"` and an `execute-snapshot` signal whose
    /// filter makes each chunk SELECT slow, after its snapshot is taken: the
    /// writer's updates then also commit between the chunk's read and its
    /// high watermark, so the chunk row is older than the stream's values.
    SlowSignal,
}

/// The tests each run a whole pipeline: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_snapshot_under_updates_that_leave_toast_unchanged_fills_every_target() -> Result<()>
{
    run(Start::Initial).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signalled_snapshot_with_reads_older_than_the_window_keeps_the_newer_updates() -> Result<()>
{
    run(Start::SlowSignal).await
}

async fn run(start: Start) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let mode = match start {
        Start::Initial => "snapshot.mode = \"initial\"\n",
        Start::SlowSignal => {
            "snapshot.mode = \"no_data\"\nsignal.data.collection = \"public.oncely_signal\"\n"
        }
    };
    let mut p = Pipeline::new(
        "e2e_snap_toast",
        SCHEMA,
        &["docs"],
        &format!(
            "table.include.list = \"public\\\\.docs\"\npublication.autocreate.mode = \"filtered\"\n\
             incremental.snapshot.chunk.size = {CHUNK}\nbatch.max.ms = 20\n{mode}"
        ),
    )
    .await?;
    // The per-chunk line says how many rows were completed from the chunk.
    p.env.capture_log = "info,rdkafka=warn,oncely_capture::pipeline::snapshot=debug".into();
    let result = body(&p, start).await;
    p.cleanup().await;
    result
}

async fn body(p: &Pipeline, start: Start) -> Result<()> {
    let big: i64 = p
        .env
        .client
        .query_one(
            "SELECT count(*) FROM docs WHERE pg_column_size(big) > 2048",
            &[],
        )
        .await?
        .get(0);
    ensure!(big == ROWS, "{big} of {ROWS} values over 2 KB");
    let sinks: Vec<Spawned> = (0..3).map(|i| p.spawn_sink(i)).collect::<Result<_>>()?;
    let mut capture = p.spawn_capture()?;
    wait_streaming(&p.env).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn(write(
        p.env.connect().await?,
        Arc::clone(&stop),
        Arc::clone(&stats),
    ));
    let chaser = tokio::spawn(chase(
        p.env.connect().await?,
        Arc::clone(&stop),
        Arc::clone(&stats),
    ));
    if let Start::SlowSignal = start {
        // A filter may call no pg_sleep; this one reads and lowers every
        // row's TOASTed value, and with index scans off in this test's
        // database (new sessions: the snapshot connection opens for the
        // first chunk) every chunk SELECT scans the rest of the table.
        p.env
            .client
            .batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET enable_indexscan = off', current_database());
                              EXECUTE format('ALTER DATABASE %I SET enable_indexonlyscan = off', current_database());
                              EXECUTE format('ALTER DATABASE %I SET enable_bitmapscan = off', current_database()); END $$;
                 INSERT INTO oncely_signal VALUES ('slow', 'execute-snapshot', '{\"data-collections\": [\"public.docs\"], \"additional-conditions\": [{\"data-collection\": \"public.docs\", \"filter\": \"length(lower(big)) > 0\"}]}')",
            )
            .await?;
    }

    // SIGKILL capture at random moments while the snapshot runs.
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !snapshot_done(&p.env) {
        ensure!(
            Instant::now() < deadline,
            "the snapshot did not finish; log in {}",
            p.env.dir.display()
        );
        if kills < KILLS {
            // Each life commits something before it dies, so the snapshot advances.
            let confirmed = p.env.confirmed_flush().await?;
            while p.env.confirmed_flush().await? <= confirmed && !snapshot_done(&p.env) {
                ensure!(Instant::now() < deadline, "capture committed nothing");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let pause = rand::rng().random_range(100..500);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if snapshot_done(&p.env) {
                break;
            }
            kill9(&mut capture);
            kills += 1;
            capture = p.spawn_capture()?;
            wait_streaming(&p.env).await?;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    ensure!(
        kills == KILLS,
        "the snapshot finished after {kills} of {KILLS} kills: make it slower"
    );
    // A little streaming after the snapshot, then a quiet source.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await??;
    chaser.await??;
    let writes = stats.load(Ordering::Relaxed);
    ensure!(
        writes > 100,
        "the writer committed only {writes} transactions"
    );

    let report = p.verify(Duration::from_secs(300)).await?;
    eprintln!("{report}");
    ensure!(
        report.is_equal(),
        "targets differ from the source after the snapshot ({writes} writer transactions, {kills} kills); logs in {}:\n{report}",
        p.env.dir.display()
    );
    ensure!(report.compared() == 3, "{report}");

    let topics = p.topics();
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    ensure!(
        scan.duplicate_count == 0,
        "events committed twice, e.g. {:?}",
        scan.duplicates
    );
    // The case this test is about happened: chunk rows completed from the
    // chunk read (the writer updated them in their window, leaving `big` out).
    let completed: u64 = p
        .env
        .capture_log()
        .lines()
        .filter(|l| l.contains("snapshot chunk published"))
        .filter_map(|l| {
            l.split(" completed=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let again = p
        .env
        .capture_log()
        .matches("snapshot chunk read again")
        .count();
    eprintln!(
        "{writes} writer transactions, {kills} kills, {completed} chunk rows completed, {again} chunks read again"
    );
    ensure!(
        completed > 0,
        "no chunk row was updated in its window: make the writer busier"
    );
    drop(capture);
    drop(sinks);
    Ok(())
}

/// Waits until capture streams from its slot. Generous: creating a slot
/// waits for every transaction running on the server, other tests' too.
async fn wait_streaming(env: &CaptureEnv) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let active = env
            .client
            .query_opt(capture::ACTIVE_SLOT, &[&env.slot])
            .await?
            .is_some_and(|r| r.get::<_, bool>(0));
        if active {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "capture never streamed from slot {}; log:\n{}",
            env.slot,
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn snapshot_done(env: &CaptureEnv) -> bool {
    env.capture_log().contains("snapshot complete")
}

/// Updates of `rev`/`note` on random rows (leaving `big` unchanged:
/// unavailable in the stream), also of rows in chunks not read yet, among
/// deletes, inserts, updates that set `big`, and a transaction that sets
/// `big` and then leaves it unchanged.
async fn write(client: Client, stop: Arc<AtomicBool>, stats: Arc<AtomicU64>) -> Result<()> {
    let mut next_id = ROWS;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (kind, id, ids) = {
            let mut rng = rand::rng();
            let ids: Vec<i64> = (0..5).map(|_| rng.random_range(1..=ROWS)).collect();
            (rng.random_range(0..100), rng.random_range(1..=ROWS), ids)
        };
        let sql = match kind {
            0..=79 => {
                let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                format!("UPDATE docs SET rev = rev + 1, note = 'w{n}' WHERE id IN ({list})")
            }
            80..=86 => format!("DELETE FROM docs WHERE id = {id}"),
            87..=92 => {
                next_id += 1;
                format!("INSERT INTO docs VALUES ({next_id}, 0, 'new', big_value('new{next_id}'))")
            }
            93..=96 => {
                format!("UPDATE docs SET rev = rev + 1, big = big_value('b{n}') WHERE id = {id}")
            }
            _ => format!(
                "UPDATE docs SET big = big_value('t{n}') WHERE id = {id};
                 UPDATE docs SET rev = rev + 1, note = 't{n}' WHERE id = {id}"
            ),
        };
        client
            .batch_execute(&format!("BEGIN; {sql}; COMMIT"))
            .await?;
        stats.fetch_add(1, Ordering::Relaxed);
        // Few enough that most rows are not updated again after their
        // chunk: a wrong value published for a chunk row stays wrong.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Updates `rev`/`note` (leaving `big` unchanged) of the rows the snapshot
/// reads now and next, and deletes and inserts some of them: the rows after the last key of the newest chunk
/// SELECT (in `pg_stat_activity`), so that they change inside their chunk's
/// window — with the slow SELECT, after the chunk's read.
async fn chase(client: Client, stop: Arc<AtomicBool>, stats: Arc<AtomicU64>) -> Result<()> {
    let mut n = 0u64;
    let mut after = 0i64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        // The snapshot connection's current or last query; between chunk
        // SELECTs, the last key of the previous one.
        let query: Option<String> = client
            .query_opt(
                "SELECT query FROM pg_stat_activity
                 WHERE application_name = 'oncely-capture-snapshot' AND datname = current_database()
                   AND query LIKE 'SELECT \"id\"%' ORDER BY backend_start DESC LIMIT 1",
                &[],
            )
            .await?
            .map(|r| r.get(0));
        if let Some(query) = query {
            after = query
                .split("(\"id\") > ('")
                .nth(1)
                .and_then(|r| r.split('\'').next())
                .and_then(|k| k.parse().ok())
                .unwrap_or(0);
        }
        // Mostly updates; now and then a delete of one of those rows, or
        // the row inserted again: inside the window, both must win over
        // the chunk row.
        let id = after + 1 + (n % (2 * CHUNK as u64)) as i64;
        match n % 20 {
            0 => {
                client
                    .execute("DELETE FROM docs WHERE id = $1", &[&id])
                    .await?
            }
            10 => {
                client
                    .execute(
                        "INSERT INTO docs VALUES ($1, 0, 'again', big_value($2)) ON CONFLICT DO NOTHING",
                        &[&id, &format!("again{n}")],
                    )
                    .await?
            }
            _ => {
                client
                    .execute(
                        "UPDATE docs SET rev = rev + 1, note = $1 WHERE id > $2 AND id <= $3",
                        &[&format!("c{n}"), &after, &(after + 2 * CHUNK as i64)],
                    )
                    .await?
            }
        };
        stats.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
