//! The demo's helper (`scripts/demo` runs it; see there for the whole flow):
//!
//! * `reset`: drops and recreates the `shop` database (with its schema) and the
//!   `shop_warehouse` database, the demo's slot, topics, consumer groups,
//!   Elasticsearch indexes and Redis keys — so the demo runs the same every time;
//! * `workload --seconds N --rate R`: an online shop's traffic for N seconds, at
//!   most R transactions per second, printing progress and the targets' lag;
//! * `summary --seconds N`: events captured, rows per table, what each sink
//!   applied, throughput and lag, from the processes' Prometheus endpoints.
//!
//! Services are found through `scripts/services env` (`ONCELY_PG_URL`,
//! `ONCELY_KAFKA_BROKERS`, `ONCELY_ES_URL`, `ONCELY_REDIS_URL`).
//!
//! `ONCELY_DEMO_SOURCE=mysql` puts the shop on the MariaDB of
//! `scripts/services` (`ONCELY_MARIADB_URL`; module `mysql`) instead; the
//! warehouse stays in PostgreSQL.
mod mysql;
mod summary;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use elasticsearch::http::transport::Transport;
use elasticsearch::indices::IndicesDeleteParts;
use elasticsearch::Elasticsearch;
use rand::Rng;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio_postgres::{Client, NoTls};

const TABLES: [&str; 3] = ["customers", "orders", "order_lines"];
/// Topic prefixes of the shop's tables: PostgreSQL's `public` schema and
/// MySQL's `shop` database. Reset removes both sources' topics and indexes.
const TOPIC_PREFIXES: [&str; 2] = ["shop.public.", "shop.shop."];
const OFFSETS_TOPIC: &str = "oncely-demo-offsets";
const DLQ_TOPIC: &str = "oncely-demo-dlq";
const GROUPS: [&str; 4] = [
    "oncely-demo-warehouse",
    "oncely-demo-search",
    "oncely-demo-cache",
    "oncely-demo-webhook",
];
const SLOT: &str = "oncely_demo";
const REDIS_PREFIX: &str = "shop:";
const SCHEMA: &str = "
    CREATE TYPE order_status AS ENUM ('pending', 'paid', 'shipped', 'cancelled');
    CREATE TABLE customers (
        id bigserial PRIMARY KEY,
        email text NOT NULL UNIQUE,
        name text NOT NULL,
        country char(2) NOT NULL,
        credit numeric(12,2) NOT NULL DEFAULT 0,
        created_at timestamptz NOT NULL DEFAULT now(),
        profile jsonb NOT NULL DEFAULT '{}');
    CREATE TABLE orders (
        id bigserial PRIMARY KEY,
        customer_id bigint NOT NULL REFERENCES customers,
        status order_status NOT NULL DEFAULT 'pending',
        total numeric(12,2) NOT NULL DEFAULT 0,
        currency char(3) NOT NULL DEFAULT 'EUR',
        placed_at timestamptz NOT NULL DEFAULT now(),
        shipped_on date,
        note text);
    CREATE TABLE order_lines (
        order_id bigint NOT NULL REFERENCES orders ON DELETE CASCADE,
        line_no integer NOT NULL,
        sku text NOT NULL,
        quantity integer NOT NULL,
        unit_price numeric(10,2) NOT NULL,
        PRIMARY KEY (order_id, line_no));";

#[derive(Parser)]
#[command(about = "Helper of scripts/demo")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Recreate the demo's databases, and remove its slot, topics, groups, indexes and keys.
    Reset,
    /// Drive the shop's traffic.
    Workload {
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Transactions per second at most.
        #[arg(long, default_value_t = 200)]
        rate: u64,
    },
    /// Drop the demo's replication slot (capture stopped): an idle slot would
    /// keep PostgreSQL from recycling WAL. The databases stay for a look.
    DropSlot,
    /// Print what went through, from the metrics endpoints.
    Summary {
        /// How long the workload ran (for throughput).
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// The webhook receiver's address (`ONCELY_DEMO_WEBHOOK=1`): report the webhook sink too.
        #[arg(long)]
        webhook: Option<String>,
    },
}

/// `ONCELY_DEMO_SOURCE`: the shop on PostgreSQL (default) or on MySQL/MariaDB.
fn on_mysql() -> Result<bool> {
    match std::env::var("ONCELY_DEMO_SOURCE").as_deref() {
        Err(_) | Ok("") | Ok("postgres") => Ok(false),
        Ok("mysql") => Ok(true),
        Ok(other) => bail!("ONCELY_DEMO_SOURCE={other:?}: postgres or mysql"),
    }
}

/// The demo's topics (and index names) of the shop's tables, both sources'.
fn shop_topics() -> Vec<String> {
    TOPIC_PREFIXES
        .iter()
        .flat_map(|p| TABLES.iter().map(move |t| format!("{p}{t}")))
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Reset => reset().await,
        Cmd::DropSlot => drop_slot().await,
        Cmd::Workload { seconds, rate } => workload(seconds, rate).await,
        Cmd::Summary { seconds, webhook } => summary::summary(seconds, webhook.as_deref()).await,
    }
}

fn env(name: &str) -> Result<String> {
    std::env::var(name)
        .with_context(|| format!("{name} is not set: eval \"$(scripts/services env)\""))
}

/// `ONCELY_PG_URL` with its database replaced by `db`.
fn db_url(db: &str) -> Result<String> {
    let base = env("ONCELY_PG_URL")?;
    let head = base.rsplit_once('/').map_or(base.as_str(), |(h, _)| h);
    Ok(format!("{head}/{db}"))
}

async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

async fn reset() -> Result<()> {
    let admin = connect(&env("ONCELY_PG_URL")?).await?;
    // A capture left running by an interrupted demo holds the slot: end it first.
    admin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&SLOT],
        )
        .await?;
    drop_slot_with(&admin).await?;
    // One statement per call: several in one string form a transaction block,
    // where DROP/CREATE DATABASE are refused.
    for sql in [
        "DROP DATABASE IF EXISTS shop WITH (FORCE)",
        "DROP DATABASE IF EXISTS shop_warehouse WITH (FORCE)",
        "CREATE DATABASE shop",
        "CREATE DATABASE shop_warehouse",
    ] {
        admin
            .batch_execute(sql)
            .await
            .with_context(|| sql.to_owned())?;
    }
    connect(&db_url("shop")?)
        .await?
        .batch_execute(SCHEMA)
        .await?;
    if on_mysql()? {
        mysql::reset().await?;
    }
    reset_kafka().await?;

    let es = Elasticsearch::new(Transport::single_node(&env("ONCELY_ES_URL")?)?);
    let indexes = shop_topics();
    let names: Vec<&str> = indexes.iter().map(String::as_str).collect();
    let r = es
        .indices()
        .delete(IndicesDeleteParts::Index(&names))
        .ignore_unavailable(true)
        .send()
        .await?;
    if !r.status_code().is_success() {
        bail!("deleting the demo's indexes: {}", r.text().await?);
    }

    let mut redis = redis::Client::open(env("ONCELY_REDIS_URL")?)?
        .get_multiplexed_async_connection()
        .await?;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{REDIS_PREFIX}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<()>(&mut redis)
                .await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let shop = if on_mysql()? {
        "shop (MariaDB)"
    } else {
        "shop"
    };
    println!("reset: databases {shop} and shop_warehouse, slot {SLOT}, topics, groups, indexes and keys of the demo");
    Ok(())
}

async fn drop_slot() -> Result<()> {
    drop_slot_with(&connect(&env("ONCELY_PG_URL")?).await?).await
}

/// Drops the slot once its walsender is gone (it lingers briefly after capture stops).
async fn drop_slot_with(admin: &Client) -> Result<()> {
    for _ in 0..50 {
        let dropped = admin
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
                &[&SLOT],
            )
            .await;
        let left = admin
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        if dropped.is_ok() && left.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("replication slot {SLOT} is still in use: stop the capture that holds it")
}

/// Deletes the demo's topics and groups, and waits until the topics are gone
/// (deletion is asynchronous; capture recreates them on its first event).
async fn reset_kafka() -> Result<()> {
    let brokers = env("ONCELY_KAFKA_BROKERS")?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let mut topics = shop_topics();
    topics.push(OFFSETS_TOPIC.into());
    topics.push(DLQ_TOPIC.into());
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    // Unknown topics and groups (a first run) are answered per item, not as an error.
    admin.delete_topics(&names, &opts).await?;
    admin.delete_groups(&GROUPS, &opts).await?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    for _ in 0..60 {
        let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
        if !metadata
            .topics()
            .iter()
            .any(|t| topics.iter().any(|n| n == t.name()))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("Kafka did not delete the demo's topics within 30 s")
}

/// Ids the workload knows, to pick rows to change.
#[derive(Default)]
struct Shop {
    customers: Vec<i64>,
    open_orders: Vec<i64>,
    paid_orders: Vec<i64>,
}

const COUNTRIES: [&str; 6] = ["DE", "FR", "NL", "SE", "ES", "IT"];
const SKUS: [(&str, &str); 5] = [
    ("TEA-GREEN-100", "4.90"),
    ("MUG-BLUE", "12.50"),
    ("BEANS-1KG", "18.99"),
    ("KETTLE-1L", "39.00"),
    ("FILTER-100", "3.25"),
];

/// The shop's database, where the workload writes.
enum Source {
    Postgres(Client),
    Mysql(mysql_async::Conn),
}

impl Source {
    async fn connect() -> Result<Self> {
        Ok(if on_mysql()? {
            Source::Mysql(mysql::connect(Some("shop")).await?)
        } else {
            Source::Postgres(connect(&db_url("shop")?).await?)
        })
    }

    async fn one_transaction(&mut self, shop: &mut Shop) -> Result<()> {
        match self {
            Source::Postgres(c) => one_transaction(c, shop).await,
            Source::Mysql(c) => mysql::one_transaction(c, shop).await,
        }
    }

    /// Rows of `table`.
    async fn count(&mut self, table: &str) -> Result<i64> {
        match self {
            Source::Postgres(c) => Ok(c
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await?
                .get(0)),
            Source::Mysql(c) => mysql::count(c, table).await,
        }
    }
}

async fn workload(seconds: u64, rate: u64) -> Result<()> {
    let mut c = Source::connect().await?;
    let mut shop = Shop::default();
    let started = Instant::now();
    let tick = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let mut next = Instant::now();
    let mut transactions = 0u64;
    let mut last_report = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        c.one_transaction(&mut shop).await?;
        transactions += 1;
        next += tick;
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            let m = summary::scrape_all().await;
            println!(
                "  {:>3.0}s  {transactions:>6} transactions  {:>7} events captured  lag (records): warehouse {}, search {}, cache {}",
                started.elapsed().as_secs_f64(),
                m.get("capture", "oncely_capture_events_total"),
                m.get("postgres", "oncely_sink_consumer_lag_records"),
                m.get("elasticsearch", "oncely_sink_consumer_lag_records"),
                m.get("redis", "oncely_sink_consumer_lag_records"),
            );
        }
    }
    println!(
        "workload: {transactions} transactions in {:.1} s ({:.0}/s)",
        started.elapsed().as_secs_f64(),
        transactions as f64 / started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One transaction of the shop: sign-ups, orders with lines, payments,
/// shipments, cancellations (deleting the order and its lines), profile edits.
async fn one_transaction(c: &Client, shop: &mut Shop) -> Result<()> {
    let pick = rand::rng().random_range(0..100);
    if shop.customers.len() < 20 || pick < 10 {
        let n = rand::rng().random::<u32>();
        let country = COUNTRIES[n as usize % COUNTRIES.len()];
        let row = c
            .query_one(
                "INSERT INTO customers (email, name, country, credit, profile)
                 VALUES ($1, $2, $3::text, ($4::int / 100.0)::numeric(12,2), jsonb_build_object('newsletter', $5::bool, 'tags', jsonb_build_array($3::text)))
                 RETURNING id",
                &[&format!("c{n}@example.com"), &format!("Customer {n}"), &country, &((n % 50_000) as i32), &(n % 2 == 0)],
            )
            .await;
        match row {
            Ok(row) => shop.customers.push(row.get(0)),
            // A random email can repeat: the unique constraint refuses it, nothing to do.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {}
            Err(e) => return Err(e).context("insert a customer"),
        }
        return Ok(());
    }
    let mut rng = rand::rng();
    match pick {
        10..=59 => {
            let customer = shop.customers[rng.random_range(0..shop.customers.len())];
            let lines = rng.random_range(1..=4);
            let skus: Vec<usize> = (0..lines)
                .map(|_| rng.random_range(0..SKUS.len()))
                .collect();
            let quantities: Vec<i32> = (0..lines).map(|_| rng.random_range(1..=5)).collect();
            let mut sql = format!(
                "BEGIN; WITH o AS (INSERT INTO orders (customer_id, note) VALUES ({customer}, {}) RETURNING id)
                 INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price) SELECT o.id, l.n, l.sku, l.q, l.p FROM o, (VALUES ",
                if rng.random_bool(0.3) { "'gift wrap, please'" } else { "NULL" }
            );
            for (i, (s, q)) in skus.iter().zip(&quantities).enumerate() {
                let (sku, price) = SKUS[*s];
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!(
                    "({}, '{sku}', {q}, {price}::numeric(10,2))",
                    i + 1
                ));
            }
            sql.push_str(
                ") AS l(n, sku, q, p);
                 UPDATE orders SET total = (SELECT sum(quantity * unit_price) FROM order_lines WHERE order_id = currval('orders_id_seq'))
                 WHERE id = currval('orders_id_seq');
                 COMMIT;",
            );
            c.batch_execute(&sql).await?;
            let id: i64 = c
                .query_one("SELECT currval('orders_id_seq')", &[])
                .await?
                .get(0);
            shop.open_orders.push(id);
        }
        60..=74 if !shop.open_orders.is_empty() => {
            let id = shop
                .open_orders
                .swap_remove(rng.random_range(0..shop.open_orders.len()));
            c.execute("UPDATE orders SET status = 'paid' WHERE id = $1", &[&id])
                .await?;
            shop.paid_orders.push(id);
        }
        75..=84 if !shop.paid_orders.is_empty() => {
            let id = shop
                .paid_orders
                .swap_remove(rng.random_range(0..shop.paid_orders.len()));
            c.execute(
                "UPDATE orders SET status = 'shipped', shipped_on = current_date WHERE id = $1",
                &[&id],
            )
            .await?;
        }
        85..=89 if !shop.open_orders.is_empty() => {
            let id = shop
                .open_orders
                .swap_remove(rng.random_range(0..shop.open_orders.len()));
            c.execute("DELETE FROM orders WHERE id = $1", &[&id])
                .await?;
        }
        _ => {
            let id = shop.customers[rng.random_range(0..shop.customers.len())];
            c.execute(
                "UPDATE customers SET credit = credit + 5, profile = profile || jsonb_build_object('last_seen', now()::text) WHERE id = $1",
                &[&id],
            )
            .await?;
        }
    }
    Ok(())
}
