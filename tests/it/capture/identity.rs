//! Event identity and primary-key updates, against real PostgreSQL and Kafka:
//! every event of a transaction has its own `(commit_lsn, event_seq)`,
//! numbered in event order and the same way after a SIGKILL in the middle of
//! the transaction; and the create of a primary-key update carries the real
//! value of a TOASTed column the update left unchanged.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

use crate::harness::capture::{kill9, terminate, wait_for, CaptureEnv, Seen};

const TIMEOUT: Duration = Duration::from_secs(120);
const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// `big` is stored out of line (EXTERNAL: TOASTed, uncompressed), so an
/// update that leaves it alone sends it as "unchanged". `k` has no TOASTed
/// values; `filler` rows close Kafka transactions mid-transaction.
const SCHEMA: &str = "
    CREATE TABLE t (id bigint PRIMARY KEY, rev int NOT NULL, big text);
    ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
    CREATE TABLE k (id bigint PRIMARY KEY, v text);
    CREATE TABLE filler (id bigint PRIMARY KEY);
    INSERT INTO t SELECT g, 0, repeat(md5(g::text), 1000) FROM generate_series(1, 10) g;
    INSERT INTO k SELECT g, 'k' || g FROM generate_series(1, 2) g;";

/// The transaction under test, and the events it must become (op, topic
/// table, key id, and for creates and updates of `t` the id whose `big` the
/// event must carry, or `None` for the unavailable marker).
const WORKLOAD: &str = "
    UPDATE k SET id = id + 100;
    INSERT INTO filler SELECT g FROM generate_series(1, 20) g;
    UPDATE t SET id = id + 100 WHERE id IN (1, 2, 3);
    UPDATE t SET id = 105 WHERE id = 5;
    DELETE FROM t WHERE id = 105;
    UPDATE t SET id = 106 WHERE id = 6;
    UPDATE t SET id = 206 WHERE id = 106;
    UPDATE t SET rev = 1 WHERE id = 4;";

type Expected = (char, &'static str, i64, Option<Option<i64>>);

fn expected() -> Vec<Expected> {
    let mut e: Vec<Expected> = vec![
        ('d', "k", 1, None),
        ('c', "k", 101, None),
        ('d', "k", 2, None),
        ('c', "k", 102, None),
    ];
    e.extend((1..=20).map(|i| ('c', "filler", i, None)));
    for id in 1..=3 {
        e.push(('d', "t", id, None));
        // The value read from the source by the new key.
        e.push(('c', "t", id + 100, Some(Some(id))));
    }
    // Gone again by the time capture reads it (deleted, key changed again):
    // the marker stays, and the next event of the key covers the targets.
    e.push(('d', "t", 5, None));
    e.push(('c', "t", 105, Some(None)));
    e.push(('d', "t", 105, None));
    e.push(('d', "t", 6, None));
    e.push(('c', "t", 106, Some(None)));
    e.push(('d', "t", 106, None));
    e.push(('c', "t", 206, Some(Some(6))));
    // A plain update keeps the marker: the targets hold the row's value.
    e.push(('u', "t", 4, Some(None)));
    e
}

/// Each row's `big` before the workload, by id.
async fn bigs(env: &CaptureEnv) -> Result<BTreeMap<i64, String>> {
    let rows = env.client.query("SELECT id, big FROM t", &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// One event of the transaction: its position, what it is, and its value of `big`.
#[derive(Debug)]
struct Event {
    seq: u64,
    offset: i64,
    op: char,
    table: String,
    id: i64,
    big: Option<Value>,
}

fn events_of(seen: &[Seen], commit_lsn: u64) -> Vec<Event> {
    seen.iter()
        .filter_map(|s| {
            let p = s.payload()?;
            let src = &p["source"];
            if src["commit_lsn"].as_u64() != Some(commit_lsn) {
                return None;
            }
            let op = p["op"].as_str()?.chars().next()?;
            let row = if op == 'd' { &p["before"] } else { &p["after"] };
            Some(Event {
                seq: src["event_seq"].as_u64()?,
                offset: s.offset,
                op,
                table: src["table"].as_str()?.to_string(),
                id: row["id"].as_i64()?,
                big: (op != 'd' && src["table"] == "t").then(|| row["big"].clone()),
            })
        })
        .collect()
}

/// The transaction's events have distinct positions numbered 1..=n in event
/// order (within each topic, Kafka order), and are exactly `expected()`.
fn check(events: &[Event], bigs: &BTreeMap<i64, String>) -> Result<()> {
    let want = expected();
    let positions: HashSet<u64> = events.iter().map(|e| e.seq).collect();
    ensure!(
        positions.len() == events.len(),
        "events share a (commit_lsn, event_seq): {:?}",
        events
            .iter()
            .map(|e| (e.seq, e.op, &e.table, e.id))
            .collect::<Vec<_>>()
    );
    let mut by_seq: Vec<&Event> = events.iter().collect();
    by_seq.sort_by_key(|e| e.seq);
    let seqs: Vec<u64> = by_seq.iter().map(|e| e.seq).collect();
    ensure!(
        seqs == (1..=want.len() as u64).collect::<Vec<_>>(),
        "event_seq must number the {} events 1..={} (one ordinal per event): {seqs:?}",
        want.len(),
        want.len()
    );
    let mut per_topic: BTreeMap<&str, Vec<(i64, u64)>> = BTreeMap::new();
    for e in events {
        per_topic
            .entry(&e.table)
            .or_default()
            .push((e.offset, e.seq));
    }
    for (table, mut v) in per_topic {
        v.sort();
        ensure!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "event_seq goes down along topic {table}: {v:?}"
        );
    }
    for (e, (op, table, id, big)) in by_seq.iter().zip(&want) {
        ensure!(
            (e.op, e.table.as_str(), e.id) == (*op, *table, *id),
            "event {} is {} {} {}, expected {op} {table} {id}",
            e.seq,
            e.op,
            e.table,
            e.id
        );
        if let Some(big) = big {
            let want_big = match big {
                Some(of) => json!(bigs.get(of).context("no such row")?),
                None => json!(UNAVAILABLE),
            };
            let got = e.big.as_ref().context("no big")?;
            ensure!(
                *got == want_big,
                "event {} ({op} t {id}) carries big = {}..., expected {}...",
                e.seq,
                got.as_str()
                    .map_or(String::new(), |s| s.chars().take(40).collect()),
                want_big
                    .as_str()
                    .map_or(String::new(), |s| s.chars().take(40).collect()),
            );
        }
    }
    Ok(())
}

fn topics(env: &CaptureEnv) -> Vec<String> {
    ["t", "k", "filler"].iter().map(|t| env.topic(t)).collect()
}

fn change_events(seen: &[Seen]) -> usize {
    seen.iter().filter(|s| s.value.is_some()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_key_updates_carry_toast_values_and_every_event_has_its_own_position() -> Result<()>
{
    let env = CaptureEnv::new("cap_identity").await?;
    env.client.batch_execute(SCHEMA).await?;
    let bigs = bigs(&env).await?;
    let config = env.write_config("capture.toml", &env.config("batch.max.ms = 20\n"))?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    env.client
        .batch_execute(&format!("BEGIN; {WORKLOAD} COMMIT;"))
        .await?;
    let want = expected().len();
    let seen = wait_for(&topics(&env), TIMEOUT, |s| change_events(s) >= want).await?;
    let lsn = seen
        .iter()
        .find_map(|s| s.payload()?["source"]["commit_lsn"].as_u64())
        .context("no event")?;
    let events = events_of(&seen, lsn);
    assert_eq!(events.len(), want, "{events:#?}");
    check(&events, &bigs)?;
    let tombstones = seen.iter().filter(|s| s.value.is_none()).count();
    assert_eq!(tombstones, 2 + 3 + 2 + 2, "one tombstone per delete");

    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "capture exit {status}");
    env.cleanup().await;
    Ok(())
}

/// Capture is SIGKILLed while it reads a primary-key update's TOAST value
/// (held up by a lock on the table), after Kafka took the first part of the
/// transaction, primary-key updates included. The restart skips that part,
/// still counting its ordinals, and reads the value again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_transaction_numbers_its_events_the_same_way() -> Result<()> {
    let env = CaptureEnv::new("cap_identity_kill").await?;
    env.client.batch_execute(SCHEMA).await?;
    let bigs = bigs(&env).await?;
    // Small Kafka transactions: the source transaction spans several.
    let config = env.write_config(
        "capture.toml",
        &env.config("batch.max.events = 5\nbatch.max.ms = 20\n"),
    )?;
    let mut capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;

    // The workload's transaction stays open while a second session queues
    // for an exclusive lock on `t`; the commit hands the lock to that
    // session, ahead of capture's read.
    let writer = env.connect().await?;
    writer.batch_execute(&format!("BEGIN; {WORKLOAD}")).await?;
    let locker = env.connect().await?;
    let locker_pid: i32 = locker
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let lock = tokio::spawn(async move {
        locker
            .batch_execute("BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            .await
            .map(|()| locker)
    });
    wait_state(
        &env,
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)",
        locker_pid,
    )
    .await?;
    writer.batch_execute("COMMIT").await?;
    let locker = lock.await??;

    // Capture waits for the lock inside the transaction, and Kafka holds its
    // first part: the primary-key updates of `k` and some filler rows.
    wait_state(
        &env,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'oncely-capture-control' \
         AND datname = current_database() AND wait_event_type = 'Lock' AND pid <> $1)",
        locker_pid,
    )
    .await?;
    let first = wait_for(&topics(&env), TIMEOUT, |s| {
        s.iter()
            .filter(|r| r.topic == env.topic("k") && r.value.is_some())
            .count()
            == 4
            && s.iter().any(|r| r.topic == env.topic("filler"))
    })
    .await?;
    assert!(
        first.iter().all(|r| r.topic != env.topic("t")),
        "nothing of t can be published before its read"
    );
    kill9(&mut capture);
    locker.batch_execute("COMMIT").await?;

    let mut capture = env.spawn_capture(&config)?;
    let want = expected().len();
    let seen = wait_for(&topics(&env), TIMEOUT, |s| change_events(s) >= want).await?;
    let lsn = seen
        .iter()
        .find_map(|s| s.payload()?["source"]["commit_lsn"].as_u64())
        .context("no event")?;
    let events = events_of(&seen, lsn);
    assert_eq!(
        events.len(),
        want,
        "each event once after the restart: {events:#?}"
    );
    check(&events, &bigs)?;

    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "capture exit {status}");
    env.cleanup().await;
    Ok(())
}

/// Waits until `sql` (one boolean, `$1` = a backend pid) holds.
async fn wait_state(env: &CaptureEnv, sql: &str, pid: i32) -> Result<()> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if env.client.query_one(sql, &[&pid]).await?.get::<_, bool>(0) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "never true: {sql}; capture log:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A table's primary key is read once the Relation's transaction is
/// visible: the walsender sends a transaction a moment before other sessions
/// see it committed, and a catalog read in that moment keyed the changes of
/// `DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (other)` (and the writes of its
/// transaction) by the old key. Here the DDL's transaction is held open, as
/// it is in that moment, while capture reads the key; committed half a
/// second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_keys_are_read_once_the_relations_transaction_is_visible() -> Result<()> {
    let env = CaptureEnv::new("cap_key_visible").await?;
    let result = key_wait(&env).await;
    if result.is_err() {
        eprintln!("database {}", env.dbname);
    }
    env.cleanup().await;
    result
}

async fn key_wait(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE rekeyed (id int PRIMARY KEY, other int NOT NULL);
             INSERT INTO rekeyed VALUES (1, 10)",
        )
        .await?;
    let oid: u32 = env
        .client
        .query_one("SELECT 'public.rekeyed'::regclass::oid", &[])
        .await?
        .get(0);
    let tx = env.connect().await?;
    tx.batch_execute(
        "BEGIN; ALTER TABLE rekeyed DROP CONSTRAINT rekeyed_pkey, ADD PRIMARY KEY (other); \
         INSERT INTO rekeyed VALUES (1, 11)",
    )
    .await?;
    let xid: i64 = tx
        .query_one("SELECT (txid_current() % 4294967296)::bigint", &[])
        .await?
        .get(0);
    let xid = u32::try_from(xid)?;
    let reader = env.connect().await?;
    let read = tokio::spawn(async move {
        oncely_capture::testing::relation_by_oid(&reader, oid, Some(xid)).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.batch_execute("COMMIT").await?;
    let (_, _, key) = read.await??.context("no row for the table")?;
    assert_eq!(
        key,
        ["other"],
        "primary key after DROP CONSTRAINT rekeyed_pkey, ADD PRIMARY KEY (other)"
    );
    Ok(())
}
