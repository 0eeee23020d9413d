//! The load-and-kill loop of the schema-change tests, over any source
//! database ([`Source`]: PostgreSQL or MySQL): random transactions on the
//! `id` and `v` columns of every table (which no DDL changes) while a random
//! process of a [`Fleet`] is SIGKILLed every 1.2-2.5 s; and what such a
//! test checks at the end (every copy equal, nothing dead-lettered, each
//! schema change named once).

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use oncely::verify::Report;
use rand::Rng;
use serde_json::Value;

use crate::harness::capture;
use crate::harness::checks::dead_letters;
use crate::harness::e2e::{Fleet, Pipeline};

/// A source database the load writes to.
pub trait Source {
    /// An insert of `(id, v)` into `table` that does nothing when `id` exists.
    fn insert_ignoring(&self, table: &str, id: i64, v: i32) -> String;

    /// Runs `statements` as one transaction.
    fn transaction(&mut self, statements: &[String]) -> impl Future<Output = Result<()>>;
}

impl Source for tokio_postgres::Client {
    fn insert_ignoring(&self, table: &str, id: i64, v: i32) -> String {
        format!("INSERT INTO {table} (id, v) VALUES ({id}, {v}) ON CONFLICT DO NOTHING")
    }

    async fn transaction(&mut self, statements: &[String]) -> Result<()> {
        let sql = format!("BEGIN;{};COMMIT;", statements.join(";"));
        self.batch_execute(&sql).await.context("workload")
    }
}

impl Source for mysql_async::Conn {
    fn insert_ignoring(&self, table: &str, id: i64, v: i32) -> String {
        format!("INSERT IGNORE INTO {table} (id, v) VALUES ({id}, {v})")
    }

    async fn transaction(&mut self, statements: &[String]) -> Result<()> {
        self.query_drop("BEGIN").await.context("workload")?;
        for s in statements {
            self.query_drop(s).await.context("workload")?;
        }
        self.query_drop("COMMIT").await.context("workload")
    }
}

/// The load: `source`, the tables it writes and the highest id inserted.
pub struct Load<S> {
    pub source: S,
    tables: Vec<String>,
    /// The highest `id` inserted so far (the seed rows are `1..=next`).
    pub next: i64,
    last_kill: Instant,
}

impl<S: Source> Load<S> {
    pub fn new(source: S, tables: &[&str], seeded: i64) -> Self {
        Load {
            source,
            tables: tables.iter().map(|t| t.to_string()).collect(),
            next: seeded,
            last_kill: Instant::now(),
        }
    }

    /// Transactions and random kills for `for_how_long`, restarting what
    /// exited on its own.
    pub async fn run(&mut self, fleet: &mut Fleet<'_>, for_how_long: Duration) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < for_how_long {
            self.one_transaction().await?;
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(5..40))).await;
            if self.last_kill.elapsed()
                > Duration::from_millis(rand::rng().random_range(1200..2500))
            {
                fleet.supervise()?;
                fleet.kill_random()?;
                self.last_kill = Instant::now();
            }
        }
        fleet.supervise()
    }

    /// A transaction of random inserts, updates and deletes.
    pub async fn one_transaction(&mut self) -> Result<()> {
        let statements = self.random_statements();
        self.source.transaction(&statements).await
    }

    fn random_statements(&mut self) -> Vec<String> {
        let mut rng = rand::rng();
        let mut out = Vec::new();
        for _ in 0..rng.random_range(1..5) {
            let t = &self.tables[rng.random_range(0..self.tables.len())];
            let existing = rng.random_range(1..self.next);
            let v: i32 = rng.random_range(0..1_000_000);
            match rng.random_range(0..10) {
                0..=2 => {
                    self.next += 1;
                    out.push(self.source.insert_ignoring(t, self.next, v));
                }
                3 => out.push(format!("DELETE FROM {t} WHERE id = {existing}")),
                _ => out.push(format!("UPDATE {t} SET v = {v} WHERE id = {existing}")),
            }
        }
        out
    }
}

/// `oncely verify` after the load: every one of `tables` equal in each of
/// the three targets and nothing dead-lettered. The report.
pub async fn assert_all_equal(p: &Pipeline, fleet: &Fleet<'_>, tables: usize) -> Result<Report> {
    let report = p.verify(Duration::from_secs(240)).await?;
    eprintln!("{report}");
    let letters = tokio::task::spawn_blocking({
        let prefix = p.env.prefix.clone();
        move || dead_letters(&prefix)
    })
    .await??;
    assert!(
        letters.is_empty(),
        "{} dead letters, e.g. {:?}",
        letters.len(),
        &letters[..letters.len().min(5)]
    );
    let differing: Vec<(String, String)> = report
        .targets
        .iter()
        .flat_map(|t| {
            t.tables
                .iter()
                .filter(|r| !r.is_equal())
                .map(|r| (t.label.clone(), r.table.clone()))
        })
        .collect();
    assert!(
        differing.is_empty(),
        "targets differ: {differing:?} ({}); logs in {}:\n{report}",
        fleet.summary(),
        p.env.dir.display()
    );
    assert_eq!(report.compared(), tables * 3, "{report}");
    Ok(report)
}

/// The changes on the pipeline's schema-change topic, each with the
/// `table` of its record.
pub async fn schema_changes(p: &Pipeline) -> Result<Vec<(String, Value)>> {
    let topic = format!("{}.schema-changes", p.env.prefix);
    let seen = tokio::task::spawn_blocking(move || capture::read_committed(&[topic])).await??;
    Ok(seen
        .iter()
        .filter_map(|r| r.value.as_ref())
        .flat_map(|v| {
            let table = v["table"].as_str().unwrap_or_default().to_owned();
            v["changes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |c| (table.clone(), c))
        })
        .collect())
}

/// How many of `changes` are of `kind` on `table`.
pub fn count_changes(changes: &[(String, Value)], table: &str, kind: &str) -> usize {
    changes
        .iter()
        .filter(|(t, c)| t == table && c["kind"] == kind)
        .count()
}

/// The warehouse's columns of `table` (its name there).
pub async fn warehouse_columns(p: &Pipeline, table: &str) -> Result<Vec<String>> {
    Ok(p.env
        .client
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2",
            &[&crate::harness::e2e::WAREHOUSE_SCHEMA, &table],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}
