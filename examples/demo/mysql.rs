//! The shop on MySQL/MariaDB (`ONCELY_DEMO_SOURCE=mysql`): the same three
//! tables and traffic as on PostgreSQL, in the `shop` database of the
//! MariaDB `scripts/services` runs (`ONCELY_MARIADB_URL`).
//!
//! `heartbeat` is not captured: capture's `heartbeat.action.query` writes
//! it, so the binlog moves while the shop is idle (the sinks write to
//! PostgreSQL, not here) and capture's heartbeats commit offsets.
//!
//! Order lines are deleted by statement before their order, not by
//! `ON DELETE CASCADE`: InnoDB applies a cascade inside the engine, and the
//! row-format binlog (which capture reads, as any replica) never sees it.

use anyhow::{Context, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};
use rand::Rng;

use crate::{env, Shop, COUNTRIES, SKUS};

const SCHEMA: &str = "
    CREATE TABLE customers (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        email varchar(255) NOT NULL UNIQUE,
        name varchar(255) NOT NULL,
        country char(2) NOT NULL,
        credit decimal(12,2) NOT NULL DEFAULT 0,
        created_at timestamp(6) NOT NULL DEFAULT current_timestamp(6),
        profile json NOT NULL DEFAULT '{}');
    CREATE TABLE orders (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        customer_id bigint NOT NULL,
        status enum('pending', 'paid', 'shipped', 'cancelled') NOT NULL DEFAULT 'pending',
        total decimal(12,2) NOT NULL DEFAULT 0,
        currency char(3) NOT NULL DEFAULT 'EUR',
        placed_at timestamp(6) NOT NULL DEFAULT current_timestamp(6),
        shipped_on date NULL,
        note text NULL,
        FOREIGN KEY (customer_id) REFERENCES customers (id));
    CREATE TABLE order_lines (
        order_id bigint NOT NULL,
        line_no int NOT NULL,
        sku varchar(64) NOT NULL,
        quantity int NOT NULL,
        unit_price decimal(10,2) NOT NULL,
        PRIMARY KEY (order_id, line_no),
        FOREIGN KEY (order_id) REFERENCES orders (id));
    CREATE TABLE heartbeat (id int PRIMARY KEY, beat_at timestamp(6) NOT NULL);";

/// MariaDB's duplicate-key error (a random email repeating).
const ER_DUP_ENTRY: u16 = 1062;

/// A connection to MariaDB, on `db` if given.
pub async fn connect(db: Option<&str>) -> Result<Conn> {
    let url = env("ONCELY_MARIADB_URL")?;
    let opts =
        OptsBuilder::from_opts(Opts::from_url(&url).context("ONCELY_MARIADB_URL")?).db_name(db);
    Conn::new(opts)
        .await
        .with_context(|| format!("connect to {url}"))
}

/// Drops and recreates the `shop` database with its tables.
pub async fn reset() -> Result<()> {
    let mut c = connect(None).await?;
    c.query_drop("DROP DATABASE IF EXISTS shop; CREATE DATABASE shop")
        .await
        .context("recreate database shop on MariaDB")?;
    connect(Some("shop")).await?.query_drop(SCHEMA).await?;
    Ok(())
}

/// Rows of `table` in the shop.
pub async fn count(c: &mut Conn, table: &str) -> Result<i64> {
    let n: Option<i64> = c
        .query_first(format!("SELECT count(*) FROM {table}"))
        .await?;
    Ok(n.unwrap_or(0))
}

/// One transaction of the shop, as `crate::one_transaction` on PostgreSQL.
pub async fn one_transaction(c: &mut Conn, shop: &mut Shop) -> Result<()> {
    let pick = rand::rng().random_range(0..100);
    if shop.customers.len() < 20 || pick < 10 {
        let n = rand::rng().random::<u32>();
        let country = COUNTRIES[n as usize % COUNTRIES.len()];
        let profile = serde_json::json!({"newsletter": n % 2 == 0, "tags": [country]});
        let inserted = c
            .exec_drop(
                "INSERT INTO customers (email, name, country, credit, profile)
                 VALUES (?, ?, ?, ? / 100, ?)",
                (
                    format!("c{n}@example.com"),
                    format!("Customer {n}"),
                    country,
                    n % 50_000,
                    profile.to_string(),
                ),
            )
            .await;
        match inserted {
            Ok(()) => shop.customers.push(c.last_insert_id().unwrap_or(0) as i64),
            Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {}
            Err(e) => return Err(e).context("insert a customer"),
        }
        return Ok(());
    }
    let mut rng = rand::rng();
    match pick {
        10..=59 => {
            let customer = shop.customers[rng.random_range(0..shop.customers.len())];
            let lines: Vec<String> = (1..=rng.random_range(1..=4))
                .map(|line| {
                    let (sku, price) = SKUS[rng.random_range(0..SKUS.len())];
                    let quantity = rng.random_range(1..=5);
                    format!("(@o, {line}, '{sku}', {quantity}, {price})")
                })
                .collect();
            let note = if rng.random_bool(0.3) {
                "'gift wrap, please'"
            } else {
                "NULL"
            };
            c.query_drop(format!(
                "START TRANSACTION;
                 INSERT INTO orders (customer_id, note) VALUES ({customer}, {note});
                 SET @o = LAST_INSERT_ID();
                 INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price) VALUES {};
                 UPDATE orders SET total = (SELECT sum(quantity * unit_price) FROM order_lines WHERE order_id = @o)
                 WHERE id = @o;
                 COMMIT",
                lines.join(", ")
            ))
            .await
            .context("place an order")?;
            let id: Option<i64> = c.query_first("SELECT @o").await?;
            shop.open_orders.extend(id);
        }
        60..=74 if !shop.open_orders.is_empty() => {
            let id = shop
                .open_orders
                .swap_remove(rng.random_range(0..shop.open_orders.len()));
            c.exec_drop("UPDATE orders SET status = 'paid' WHERE id = ?", (id,))
                .await?;
            shop.paid_orders.push(id);
        }
        75..=84 if !shop.paid_orders.is_empty() => {
            let id = shop
                .paid_orders
                .swap_remove(rng.random_range(0..shop.paid_orders.len()));
            c.exec_drop(
                "UPDATE orders SET status = 'shipped', shipped_on = current_date WHERE id = ?",
                (id,),
            )
            .await?;
        }
        85..=89 if !shop.open_orders.is_empty() => {
            let id = shop
                .open_orders
                .swap_remove(rng.random_range(0..shop.open_orders.len()));
            c.query_drop(format!(
                "START TRANSACTION; DELETE FROM order_lines WHERE order_id = {id};
                 DELETE FROM orders WHERE id = {id}; COMMIT"
            ))
            .await
            .context("cancel an order")?;
        }
        _ => {
            let id = shop.customers[rng.random_range(0..shop.customers.len())];
            c.exec_drop(
                "UPDATE customers SET credit = credit + 5,
                 profile = JSON_SET(profile, '$.last_seen', CAST(now(6) AS char)) WHERE id = ?",
                (id,),
            )
            .await?;
        }
    }
    Ok(())
}
