//! The fault suite of [`super`] with a MariaDB source (`source = "mysql"`,
//! the MariaDB of `scripts/services`): the same chaos loop, verify and
//! exactly-once scan, on a workload written for MariaDB — inserts, updates,
//! primary-key updates, deletes, hot keys, transactions spanning tables and
//! one 20,000-row transaction, over DECIMAL, JSON, unsigned (one beyond
//! 2^63) and zero-date values and keys of four kinds (unsigned, auto
//! increment and negative, text, int). Triggers count every row change into a table
//! capture does not capture, in the same transaction, as the PostgreSQL
//! suite's do.
//!
//! The restarts (`ONCELY_CHAOS_RESTARTS`, default 1) are of Kafka and of
//! MariaDB (`scripts/services restart mariadb`). Writers reconnect, and the
//! large transaction, when its COMMIT's outcome is unknown, is read back
//! before it is tried again; with or without restarts their connections are
//! also cut four times (`KILL CONNECTION`, which the shared server allows any
//! time), once halfway through the large transaction's first attempt.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};
use rand::Rng;

use super::{
    assert_each_change_once, assert_targets_equal, chaos_loop, env_number, restart_plan,
    total_kills, WriterStats, BIG_TRANSACTION_ROWS, HOT_KEYS, TABLES,
};
use crate::harness::capture::{kill9, raw_records};
use crate::harness::checks::scan_changes;
use crate::harness::common::{self, env_var, unique};
use crate::harness::e2e::{Fleet, Pipeline};

/// Unsigned and zero dates in `accounts` (`big` starts above 2^63, `opened`
/// at `0000-00-00`), an auto-increment key in `moves`, a text key and JSON
/// in `docs`, a signed int key in `bulk`.
const SCHEMA: [&str; 4] = [
    "CREATE TABLE accounts (id bigint unsigned PRIMARY KEY, balance decimal(14,2) NOT NULL,
        rev bigint unsigned NOT NULL, big bigint unsigned NOT NULL, flags tinyint unsigned NOT NULL,
        note varchar(64), opened date NOT NULL DEFAULT '0000-00-00', closed datetime NULL,
        updated_at datetime(6) NOT NULL DEFAULT current_timestamp(6))",
    "CREATE TABLE moves (id bigint AUTO_INCREMENT PRIMARY KEY, acct bigint unsigned NOT NULL,
        amount decimal(12,2) NOT NULL, memo varchar(32), at timestamp(3) NOT NULL DEFAULT current_timestamp(3))",
    "CREATE TABLE docs (id varchar(40) PRIMARY KEY, rev int unsigned NOT NULL, meta json, body text)",
    "CREATE TABLE bulk (id int PRIMARY KEY, v char(32) NOT NULL)",
];

/// The first row of `accounts.big`, beyond a signed BIGINT.
const BIG_UNSIGNED: u64 = 18_446_744_073_709_000_000;

/// Ids of primary-key updates count down from here: below every
/// auto-increment id (a key updated upwards would move the counter onto
/// the ids it hands out next).
const RENUMBERED: i64 = 0;

/// Rows every other change works on (accounts 1..=5 are the hot keys), and
/// a row in each table, so that every topic exists before the sinks start.
fn seed() -> Vec<String> {
    let accounts: Vec<String> = (1..=50)
        .map(|i| {
            format!(
                "({i}, 100, 0, {BIG_UNSIGNED}, {}, 'seed', '0000-00-00', NULL)",
                i % 256
            )
        })
        .collect();
    let docs: Vec<String> = (1..=20)
        .map(|i| format!("('doc-{i:04}', 0, '{{}}', repeat(md5({i}), 20))"))
        .collect();
    vec![
        format!(
            "INSERT INTO accounts (id, balance, rev, big, flags, note, opened, closed) VALUES {}",
            accounts.join(", ")
        ),
        format!("INSERT INTO docs VALUES {}", docs.join(", ")),
        "INSERT INTO moves (acct, amount, memo) VALUES (1, 0, 'seed')".into(),
        "INSERT INTO bulk VALUES (0, 'seed')".into(),
    ]
}

/// The MariaDB twin of [`crate::harness::checks::event_counter`]: a
/// trigger per table and operation adds each change's events (two for a
/// primary-key update: a delete and a create) to `expected_events`.
fn event_counter() -> Vec<String> {
    let mut sql = vec!["CREATE TABLE expected_events (n int NOT NULL)".to_owned()];
    for table in TABLES {
        for (op, n) in [
            ("INSERT", "1"),
            ("UPDATE", "IF(NEW.id <=> OLD.id, 1, 2)"),
            ("DELETE", "1"),
        ] {
            sql.push(format!(
                "CREATE TRIGGER {table}_{op} AFTER {op} ON {table} FOR EACH ROW \
                 INSERT INTO expected_events VALUES ({n})"
            ));
        }
    }
    sql
}

/// A connection to `db` as the root of `scripts/services`, zero dates
/// allowed whatever the server's default `sql_mode`.
fn writer_opts(db: &str) -> Result<Opts> {
    let root = Opts::from_url(&env_var("ONCELY_MARIADB_URL")).context("ONCELY_MARIADB_URL")?;
    Ok(OptsBuilder::from_opts(root)
        .db_name(Some(db))
        .init(vec!["SET SESSION sql_mode = 'STRICT_TRANS_TABLES'"])
        .into())
}

/// A writer's connection, reopened after an error: MariaDB restarting, or
/// a statement that failed leaving the session's state unknown.
struct Writer {
    opts: Opts,
    conn: Option<Conn>,
    /// The connection's id on the server, for [`cut_connections`].
    id: Arc<AtomicU32>,
    stats: Arc<WriterStats>,
}

impl Writer {
    async fn conn(&mut self) -> &mut Conn {
        while self.conn.is_none() {
            match Conn::new(self.opts.clone()).await {
                Ok(c) => {
                    self.id.store(c.id(), Ordering::Relaxed);
                    self.conn = Some(c);
                }
                // MariaDB is restarting: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        self.conn.as_mut().expect("connected above")
    }

    fn record<T>(&mut self, r: Result<T, mysql_async::Error>) -> Option<T> {
        match r {
            Ok(v) => {
                self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                Some(v)
            }
            Err(e) => {
                // The first few, to tell a restart's errors from a workload's.
                if self.stats.errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("writer: {e}");
                }
                // Closing rolls back whatever transaction it had open.
                self.conn = None;
                None
            }
        }
    }

    /// The rows of `bulk` in `(from, to]`: whether a large transaction
    /// whose COMMIT went unanswered landed. None while MariaDB is away.
    async fn bulk_rows(&mut self, from: i64, to: i64) -> Option<i64> {
        let r = self
            .conn()
            .await
            .exec_first::<i64, _, _>(
                "SELECT count(*) FROM bulk WHERE id > ? AND id <= ?",
                (from, to),
            )
            .await;
        self.record(r).flatten()
    }
}

/// Hot keys: small updates of accounts 1..=5, many per second.
async fn hot_writer(mut w: Writer, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let id = rand::rng().random_range(1..=HOT_KEYS);
        let r = w
            .conn()
            .await
            .exec_drop(
                "UPDATE accounts SET rev = rev + 1, big = big - 1, balance = balance + 0.01, \
                 updated_at = now(6) WHERE id = ?",
                (id,),
            )
            .await;
        w.record(r);
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
}

/// The first attempt at the large transaction to get halfway tells the
/// cutter (`halfway`) and waits until its connection is cut (`done`).
#[derive(Default)]
struct BigCut {
    used: AtomicBool,
    halfway: Notify,
    done: Notify,
}

/// The 20,000-row transaction, in 20 statements; rows `(base, base + 20,000]`.
async fn big_transaction(c: &mut Conn, base: i64, cut: &BigCut) -> Result<(), mysql_async::Error> {
    c.query_drop("BEGIN").await?;
    for chunk in 0..20 {
        if chunk == 10 && !cut.used.swap(true, Ordering::Relaxed) {
            cut.halfway.notify_one();
            cut.done.notified().await;
        }
        let values: Vec<String> = (1..=1000)
            .map(|i| {
                let id = base + chunk * 1000 + i;
                format!("({id}, md5({id}))")
            })
            .collect();
        c.query_drop(format!("INSERT INTO bulk VALUES {}", values.join(", ")))
            .await?;
    }
    c.query_drop("COMMIT").await
}

/// Once: the large transaction, read back when its outcome is unknown; a
/// fresh id range per attempt. The first attempt to get halfway is cut.
async fn big_writer(w: &mut Writer, base: &mut i64, cut: &BigCut) -> bool {
    let r = big_transaction(w.conn().await, *base, cut).await;
    let landed = match w.record(r) {
        Some(()) => true,
        None => loop {
            match w.bulk_rows(*base, *base + BIG_TRANSACTION_ROWS).await {
                Some(n) => break n == BIG_TRANSACTION_ROWS,
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        },
    };
    *base += BIG_TRANSACTION_ROWS;
    landed
}

/// The mixed workload, and once (a third of the way in) the large transaction.
async fn main_writer(mut w: Writer, stop: Arc<AtomicBool>, big_at: Instant, cut: Arc<BigCut>) {
    let mut moves: Vec<i64> = Vec::new();
    let mut next_doc: i64 = 1000;
    let mut renumbered = RENUMBERED;
    let mut big_done = false;
    let mut big_base: i64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if !big_done && Instant::now() >= big_at {
            big_done = big_writer(&mut w, &mut big_base, &cut).await;
            continue;
        }
        let pick = rand::rng().random_range(0..100);
        let acct = rand::rng().random_range(1..=50u64);
        let amount = rand::rng().random_range(-5000..5000i64) as f64 / 100.0;
        let doc = format!("doc-{:04}", rand::rng().random_range(1..=20));
        let c = w.conn().await;
        match pick {
            0..=29 => {
                // One transaction across two tables.
                let r = async {
                    c.query_drop("BEGIN").await?;
                    c.exec_drop(
                        "INSERT INTO moves (acct, amount, memo) VALUES (?, ?, 'transfer')",
                        (acct, amount),
                    )
                    .await?;
                    let id = c.last_insert_id().unwrap_or_default() as i64;
                    c.exec_drop(
                        "UPDATE accounts SET balance = balance + ?, rev = rev + 1, flags = (flags + 1) % 256 \
                         WHERE id = ?",
                        (amount, acct),
                    )
                    .await?;
                    c.query_drop("COMMIT").await?;
                    Ok(id)
                }
                .await;
                if let Some(id) = w.record(r) {
                    moves.push(id);
                }
            }
            30..=44 => {
                let r = c
                    .exec_drop(
                        "INSERT INTO moves (acct, amount, memo) VALUES (?, 1, 'batch'), (?, 2, 'batch'), \
                         (?, 3, 'batch'), (?, 4, 'batch'), (?, 5, 'batch')",
                        (acct, acct, acct, acct, acct),
                    )
                    .await
                    .map(|()| c.last_insert_id().unwrap_or_default() as i64);
                // A multi-row insert's ids are consecutive, from the first.
                if let Some(first) = w.record(r) {
                    moves.extend(first..first + 5);
                }
            }
            45..=59 if !moves.is_empty() => {
                let id = moves.swap_remove(rand::rng().random_range(0..moves.len()));
                let r = c.exec_drop("DELETE FROM moves WHERE id = ?", (id,)).await;
                w.record(r);
            }
            60..=69 if !moves.is_empty() => {
                // A primary-key update.
                let i = rand::rng().random_range(0..moves.len());
                renumbered -= 1;
                let r = c
                    .exec_drop(
                        "UPDATE moves SET id = ?, memo = 'renumbered' WHERE id = ?",
                        (renumbered, moves[i]),
                    )
                    .await;
                if w.record(r).is_some() {
                    moves[i] = renumbered;
                }
            }
            70..=84 => {
                let r = c
                    .exec_drop(
                        "UPDATE docs SET rev = rev + 1, meta = json_object('rev', rev + 1, 'by', 'chaos', \
                         'tags', json_array('a', 1, true)) WHERE id = ?",
                        (&doc,),
                    )
                    .await;
                w.record(r);
            }
            85..=89 => {
                // Zero dates, and back.
                let r = c
                    .exec_drop(
                        "UPDATE accounts SET rev = rev + 1, \
                         opened = IF(opened = '0000-00-00', curdate(), '0000-00-00'), \
                         closed = IF(closed IS NULL, '0000-00-00 00:00:00', NULL) WHERE id = ?",
                        (acct,),
                    )
                    .await;
                w.record(r);
            }
            90..=92 => {
                let r = c
                    .exec_drop(
                        "UPDATE docs SET body = repeat(md5(rand()), 20), rev = rev + 1 WHERE id = ?",
                        (&doc,),
                    )
                    .await;
                w.record(r);
            }
            93..=96 => {
                next_doc += 1;
                let r = c
                    .exec_drop(
                        "INSERT IGNORE INTO docs VALUES (?, 0, '{\"new\": true}', repeat(md5(?), 20))",
                        (format!("doc-{next_doc:04}"), next_doc),
                    )
                    .await;
                w.record(r);
            }
            _ => {
                let id = format!("doc-{:04}", rand::rng().random_range(1000..=next_doc));
                let r = c.exec_drop("DELETE FROM docs WHERE id = ?", (id,)).await;
                w.record(r);
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// Closes the writers' connections from the server's side (`KILL
/// CONNECTION`) at each of `moments`: what a MariaDB restart does to them,
/// without restarting the server other tests share. The cuts made.
async fn cut_connections(
    opts: Opts,
    ids: Vec<Arc<AtomicU32>>,
    moments: Vec<Instant>,
) -> Result<usize> {
    let mut root = Conn::new(opts).await?;
    let mut cuts = 0;
    for at in moments {
        tokio::time::sleep_until(at.into()).await;
        for id in &ids {
            let id = id.load(Ordering::Relaxed);
            // An id already gone is refused ("Unknown thread id"): no cut.
            if id != 0
                && root
                    .query_drop(format!("KILL CONNECTION {id}"))
                    .await
                    .is_ok()
            {
                cuts += 1;
            }
        }
    }
    Ok(cuts)
}

/// Cuts the connection `id` once the large transaction's first attempt is
/// halfway, then lets it go on (into the error).
async fn cut_inside_big(opts: Opts, id: Arc<AtomicU32>, cut: Arc<BigCut>) -> Result<()> {
    let mut root = Conn::new(opts).await?;
    cut.halfway.notified().await;
    let killed = root
        .query_drop(format!("KILL CONNECTION {}", id.load(Ordering::Relaxed)))
        .await;
    cut.done.notify_one();
    Ok(killed?)
}

/// The capture config: the MySQL source on the test's database as the
/// least-privileged capture user, its four tables, a replica id of its own.
fn capture_config(p: &Pipeline, db: &str) -> String {
    let opts =
        Opts::from_url(&env_var("ONCELY_MARIADB_CAPTURE_URL")).expect("ONCELY_MARIADB_CAPTURE_URL");
    format!(
        "source = \"mysql\"\ntopic.prefix = \"{prefix}\"\n\
         database.hostname = \"{host}\"\ndatabase.port = {port}\n\
         database.user = \"{user}\"\ndatabase.password = \"{pass}\"\n\
         database.include.list = \"{db}\"\ntable.include.list = \"{db}\\\\.(accounts|moves|docs|bulk)\"\n\
         database.server.id = {id}\nbigint.unsigned.handling.mode = \"precise\"\n\
         kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"{offsets}\"\n\
         snapshot.mode = \"no_data\"\nbatch.max.events = 1000\nbatch.max.ms = 20\n\
         heartbeat.interval.ms = 500\n",
        prefix = p.env.prefix,
        host = opts.ip_or_hostname(),
        port = opts.tcp_port(),
        user = opts.user().unwrap_or_default(),
        pass = opts.pass().unwrap_or_default(),
        id = crate::mysql_binlog::server_id(),
        brokers = common::kafka_brokers(),
        offsets = p.env.offsets_topic,
    )
}

/// Starts capture and waits until its binlog stream is open: a change
/// committed after that is streamed (no snapshot: `no_data`).
async fn start_capture<'a>(p: &'a Pipeline) -> Result<Fleet<'a>> {
    let mut fleet = Fleet::new(p);
    fleet.spawn(0)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !p.env.capture_log().contains("binlog stream opening") {
        anyhow::ensure!(
            Instant::now() < deadline,
            "capture did not open its binlog stream; log:\n{}",
            p.env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(fleet)
}

async fn run_all(c: &mut Conn, statements: &[String]) -> Result<()> {
    for sql in statements {
        c.query_drop(sql).await.with_context(|| sql.clone())?;
    }
    Ok(())
}

// Restarting a service would break whatever other test of this process runs
// meanwhile: `scripts/test` runs it alone, `-- --ignored --test-threads=1`.
#[ignore = "restarts shared services: run alone (scripts/test does)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_source_sigkills_and_service_restarts_leave_every_target_equal_and_each_change_once(
) -> Result<()> {
    let db = unique("oncely_myfaults");
    let mut root = Conn::new(writer_opts("mysql")?).await?;
    root.query_drop(format!("CREATE DATABASE {db}")).await?;
    let result = chaos(&db).await;
    let _ = root.query_drop(format!("DROP DATABASE {db}")).await;
    result
}

async fn chaos(db: &str) -> Result<()> {
    let seconds = env_number("ONCELY_CHAOS_SECONDS", 60);
    let min_kills = env_number("ONCELY_CHAOS_KILLS", 20) as usize;
    let restarts = env_number("ONCELY_CHAOS_RESTARTS", 1);

    let opts = writer_opts(db)?;
    let mut source = Conn::new(opts.clone()).await?;
    run_all(&mut source, &SCHEMA.map(str::to_owned)).await?;
    run_all(&mut source, &event_counter()).await?;
    // The PostgreSQL database of the pipeline holds only the warehouse.
    let mut p = Pipeline::with_topics("e2e_faults_mysql", "", "", |prefix| {
        TABLES
            .iter()
            .map(|t| format!("{prefix}.{db}.{t}"))
            .collect()
    })
    .await?;
    p.capture_config = p
        .env
        .write_config("capture.toml", &capture_config(&p, db))?;
    let mut fleet = start_capture(&p).await?;
    run_all(&mut source, &seed()).await?;
    for topic in p.topics() {
        tokio::task::spawn_blocking(move || raw_records(&topic, 1)).await??;
    }
    fleet.spawn_sinks()?;

    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(WriterStats::default());
    let started = Instant::now();
    let ids = [Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0))];
    let writer = |id: &Arc<AtomicU32>| Writer {
        opts: opts.clone(),
        conn: None,
        id: id.clone(),
        stats: stats.clone(),
    };
    let big_at = started + Duration::from_secs(seconds / 3);
    let hot = tokio::spawn(hot_writer(writer(&ids[0]), stop.clone()));
    let cut = Arc::new(BigCut::default());
    let main = tokio::spawn(main_writer(
        writer(&ids[1]),
        stop.clone(),
        big_at,
        cut.clone(),
    ));
    // Connections cut at three moments, and once inside the large transaction.
    let moments = [0.2, 0.6, 0.85].map(|f| started + Duration::from_secs_f64(seconds as f64 * f));
    let cutter = tokio::spawn(cut_connections(
        opts.clone(),
        ids.to_vec(),
        moments.to_vec(),
    ));
    let big_cutter = tokio::spawn(cut_inside_big(opts.clone(), ids[1].clone(), cut));
    let restarted = chaos_loop(
        &mut fleet,
        seconds,
        min_kills,
        restart_plan(seconds, restarts, ["kafka", "mariadb"]),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    hot.await?;
    main.await?;
    let cuts = cutter.await?? + 1;
    tokio::time::timeout(Duration::from_secs(10), big_cutter)
        .await
        .context("the large transaction was never cut")???;
    let restarted = restarted?;
    fleet.supervise()?;
    eprintln!(
        "chaos (MariaDB): {}s, {} kills ({}), services restarted: {restarted:?}; writers: {} statements, {} errors, {cuts} connections cut",
        started.elapsed().as_secs(),
        total_kills(&fleet),
        fleet.summary(),
        stats.transactions.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
    );

    assert!(
        cuts > 0 && stats.errors.load(Ordering::Relaxed) > 0,
        "the writers' connections were cut ({cuts} cuts) and they saw it"
    );
    assert_targets_equal(&p, &fleet, TABLES.len()).await?;

    // Each committed source change is in Kafka exactly once (a fresh
    // connection: a restart may have closed `source`).
    let mut source = Conn::new(opts).await?;
    let expected: i64 = source
        .query_first("SELECT CAST(COALESCE(sum(n), 0) AS SIGNED) FROM expected_events")
        .await?
        .unwrap_or_default();
    let topics = p.topics();
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    assert_each_change_once(&scan, expected as u64);
    let bulk: i64 = source
        .query_first("SELECT count(*) FROM bulk")
        .await?
        .unwrap_or_default();
    // The seed row and exactly one attempt: the one cut halfway rolled
    // back and was read back as not landed, a later one committed (and was
    // read back as landed if its COMMIT went unanswered).
    assert_eq!(
        bulk,
        BIG_TRANSACTION_ROWS + 1,
        "the large transaction's rows in bulk (one attempt of it and the seed row)"
    );
    assert_eq!(
        restarted.len() as u64,
        2 * restarts,
        "service restarts: {restarted:?}"
    );

    for child in fleet.procs.iter_mut().flatten() {
        kill9(child);
    }
    drop(fleet);
    p.cleanup().await;
    Ok(())
}
