//! `oncely verify` against a real pipeline (capture and the sinks as
//! processes): it reports every target equal once they caught up, and it
//! catches a difference deliberately introduced into each kind of target —
//! a missing row, a changed value, a deleted row brought back. Five sinks:
//! the warehouse, Elasticsearch with plain and with soft deletes, Redis with
//! the hash and with the JSON layout. `bulk` spans
//! several pages, whose keys order differently as numbers and as text.
//! `nums` holds values targets spell otherwise (numerics of another scale,
//! re-serialized and non-finite doubles, addresses with their full prefix,
//! warehouse columns typed `inet`/`cidr`): verify compares them by value.
use std::time::Duration;

use elasticsearch::{DeleteParts, IndexParts};
use oncely::verify::{Difference, Report, TableReport};
use serde_json::json;

use crate::harness::capture::wait_for;
use crate::harness::e2e::{es, redis_conn, Pipeline, WAREHOUSE_SCHEMA};

/// Columns of the wire mapping's tricky kinds: exact numerics, timestamptz,
/// jsonb, an enum, a date, a TOASTed text, and a composite-key table.
const SCHEMA: &str = "
    CREATE TYPE item_status AS ENUM ('new', 'paid', 'shipped');
    CREATE TABLE items (id bigint PRIMARY KEY, price numeric(12,2) NOT NULL, at timestamptz,
                        meta jsonb, status item_status, note text, day date, qty integer, ratio real, body text);
    ALTER TABLE items ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE TABLE pairs (a integer, b text, v double precision, PRIMARY KEY (a, b));
    CREATE TABLE bulk (id bigint PRIMARY KEY, v text);
    CREATE TABLE nums (id integer PRIMARY KEY, n numeric, f double precision, r real, ip inet, net cidr);";

/// The warehouse types `nums`' addresses as `inet` and `cidr` (the sink
/// alone would make them `text`): their `::text` is `::1/128`, the source's
/// output `::1`.
const WAREHOUSE_NUMS: &str = "
    CREATE TABLE public_nums (id integer PRIMARY KEY, ip inet, net cidr);";

const WORKLOAD: &str = "
    INSERT INTO items SELECT g, g * 1.25, '2026-11-27 15:10:35.670111+02'::timestamptz + g * interval '1 hour',
        jsonb_build_object('tags', jsonb_build_array('a', g), 'n', g), (ARRAY['new','paid','shipped'])[1 + g % 3]::item_status,
        CASE WHEN g % 4 = 0 THEN NULL ELSE 'note ' || g END, DATE '2026-01-01' + g, g, g / 3.0,
        repeat(md5(g::text), 100) FROM generate_series(1, 40) g;
    UPDATE items SET qty = qty + 100, status = 'shipped' WHERE id <= 10;
    DELETE FROM items WHERE id BETWEEN 31 AND 35;
    INSERT INTO pairs SELECT g, 'k:' || g, g / 7.0 FROM generate_series(1, 10) g;
    DELETE FROM pairs WHERE a = 3;
    INSERT INTO bulk SELECT g, 'v' || g FROM generate_series(1, 2500) g;
    INSERT INTO nums VALUES (1, 11.2500, 1e308, 3.4028235e38, '::1', '::1/128'),
        (2, 'NaN', 'NaN', 'Infinity', '::1/128', '10.0.0.0/8'),
        (3, '-Infinity', '-Infinity', '-Infinity', '10.1.2.3/8', '2001:db8::/32'),
        (4, 0.00000000000000000001, -2.5e-300, 1.17549435e-38, '10.1.2.3/32', '10.1.2.3/32');";

fn table<'a>(report: &'a Report, target: usize, name: &str) -> &'a TableReport {
    report.targets[target]
        .tables
        .iter()
        .find(|t| t.table == name)
        .unwrap_or_else(|| panic!("{name} missing from the report:\n{report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_equal_targets_and_catches_each_kind_of_difference() -> anyhow::Result<()> {
    let mut p = Pipeline::new(
        "verify_targets",
        SCHEMA,
        &["items", "pairs", "bulk", "nums"],
        "",
    )
    .await?;
    let json_prefix = p.add_soft_index_and_json_cache()?;
    p.env
        .client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {WAREHOUSE_SCHEMA}; SET search_path = {WAREHOUSE_SCHEMA}; {WAREHOUSE_NUMS} RESET search_path;"
        ))
        .await?;
    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env.client.batch_execute(WORKLOAD).await?;
    let topics = p.topics();
    wait_for(&topics, Duration::from_secs(60), |seen| {
        topics.iter().all(|t| seen.iter().any(|r| &r.topic == t))
    })
    .await?;
    let sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_, _>>()?;

    // Equal once caught up: verify itself waits for capture and each sink.
    let report = p.verify(Duration::from_secs(120)).await?;
    eprintln!("{report}");
    assert!(
        report.is_equal(),
        "targets should equal the source:\n{report}"
    );
    assert_eq!(report.compared(), 20, "4 tables x 5 targets:\n{report}");
    for t in 0..5 {
        assert_eq!(table(&report, t, "public.items").source_rows, 35);
        assert_eq!(table(&report, t, "public.items").target_rows, 35);
        assert_eq!(table(&report, t, "public.pairs").target_rows, 9);
        assert_eq!(table(&report, t, "public.bulk").source_rows, 2500);
        assert_eq!(table(&report, t, "public.bulk").target_rows, 2500);
    }
    let (status, out) = p.verify_cli(&["--timeout", "60s"])?;
    assert!(status.success(), "verify exits 0 when equal:\n{out}");
    assert!(out.contains("result: equal (20 table copies)"), "{out}");
    drop(sinks);

    // Into each target: item 1 removed, item 2's price changed, deleted item 31 back.
    p.env
        .client
        .batch_execute(&format!(
            "DELETE FROM {WAREHOUSE_SCHEMA}.public_items WHERE id = 1;
             UPDATE {WAREHOUSE_SCHEMA}.public_items SET price = price + 1 WHERE id = 2;
             UPDATE {WAREHOUSE_SCHEMA}.public_items SET __oncely_deleted = false WHERE id = 31;
             UPDATE {WAREHOUSE_SCHEMA}.public_items SET body = repeat('x', 6144) WHERE id = 4;"
        ))
        .await?;
    let es = es();
    let index = p.env.topic("items");
    let deleted = es.delete(DeleteParts::IndexId(&index, "1")).send().await?;
    assert!(
        deleted.status_code().is_success(),
        "{:?}",
        deleted.text().await
    );
    for (id, price) in [("2", "3.50"), ("31", "38.75")] {
        let r = es
            .index(IndexParts::IndexId(&index, id))
            .body(json!({"id": id.parse::<i64>()?, "price": price}))
            .send()
            .await?;
        assert!(r.status_code().is_success(), "{:?}", r.text().await);
    }
    // Soft deletes: item 31 is there, flagged; unflagging it brings it back.
    let soft = format!("{index}-soft");
    let deleted = es.delete(DeleteParts::IndexId(&soft, "1")).send().await?;
    assert!(
        deleted.status_code().is_success(),
        "{:?}",
        deleted.text().await
    );
    for (id, price) in [("2", "3.50"), ("31", "38.75")] {
        let r = es
            .index(IndexParts::IndexId(&soft, id))
            .body(json!({"id": id.parse::<i64>()?, "price": price, "__deleted": false}))
            .send()
            .await?;
        assert!(r.status_code().is_success(), "{:?}", r.text().await);
    }
    let mut redis = redis_conn().await?;
    let key = |id: &str| format!("{}:items:{id}", p.redis_prefix);
    redis::cmd("DEL")
        .arg(key("1"))
        .query_async::<()>(&mut redis)
        .await?;
    redis::cmd("HSET")
        .arg(key("2"))
        .arg("price")
        .arg("3.51")
        .query_async::<()>(&mut redis)
        .await?;
    redis::cmd("HSET")
        .arg(key("31"))
        .arg("id")
        .arg("31")
        .arg("price")
        .arg("38.75")
        .query_async::<()>(&mut redis)
        .await?;

    let json_key = |id: &str| format!("{json_prefix}:items:{id}");
    redis::cmd("DEL")
        .arg(json_key("1"))
        .query_async::<()>(&mut redis)
        .await?;
    for (id, row) in [("2", r#"{"id":2,"price":"3.51"}"#), ("31", r#"{"id":31}"#)] {
        redis::cmd("SET")
            .arg(json_key(id))
            .arg(row)
            .query_async::<()>(&mut redis)
            .await?;
    }

    // Values spelled otherwise are no difference: a numeric of another
    // scale, a double re-serialized, an address with its full prefix.
    let nums = p.env.topic("nums");
    let r = es
        .index(IndexParts::IndexId(&nums, "1"))
        .body(json!({"id": 1, "n": "11.25", "f": 1.0E308, "r": 3.4028235e38, "ip": "::1/128", "net": "::1/128"}))
        .send()
        .await?;
    assert!(r.status_code().is_success(), "{:?}", r.text().await);
    redis::cmd("HSET")
        .arg(format!("{}:nums:1", p.redis_prefix))
        .arg("n")
        .arg("11.250")
        .arg("f")
        .arg("1.0E308")
        .arg("ip")
        .arg("0:0:0:0:0:0:0:1")
        .query_async::<()>(&mut redis)
        .await?;

    let report = p.verify(Duration::from_secs(60)).await?;
    assert!(!report.is_equal(), "{report}");
    assert_eq!(
        report.differing(),
        5,
        "only items differs, in each target:\n{report}"
    );
    for t in 0..5 {
        let items = table(&report, t, "public.items");
        // The warehouse's item 4 also holds a 6 KB body of its own.
        let changed = if t == 0 { 2 } else { 1 };
        assert_eq!(
            (items.missing, items.changed, items.extra),
            (1, changed, 1),
            "target {t}:\n{report}"
        );
        assert!(
            items.examples.contains(&Difference::Missing {
                key: json!({"id": 1})
            }),
            "{report}"
        );
        assert!(
            items.examples.iter().any(|d| matches!(d, Difference::Changed { key, diff }
                if *key == json!({"id": 2}) && diff.column == "price" && diff.source == json!("2.50"))),
            "{report}"
        );
        assert!(
            items.examples.contains(&Difference::Extra {
                key: vec!["31".into()]
            }),
            "{report}"
        );
        assert!(table(&report, t, "public.pairs").is_equal(), "{report}");
        assert!(table(&report, t, "public.bulk").is_equal(), "{report}");
        assert!(table(&report, t, "public.nums").is_equal(), "{report}");
    }
    // A real difference stays through a second round.
    let (status, out) = p.verify_cli(&["--timeout", "60s", "--retries", "1"])?;
    assert!(
        !status.success(),
        "verify exits non-zero on differences:\n{out}"
    );
    assert!(out.contains("(round 2 of the comparison"), "{out}");
    assert!(out.contains("result: 5 of 20 table copies DIFFER"), "{out}");
    // The 3.2 KB source and 6 KB warehouse bodies print as prefix, length and hash.
    assert!(
        out.contains("column body: source \"") && out.contains("(6144 chars, hash "),
        "{out}"
    );
    assert!(out.lines().all(|l| l.len() < 400), "long lines:\n{out}");
    let (status, out) = p.verify_cli(&["--timeout", "60s", "--json"])?;
    assert!(
        !status.success(),
        "--json exits non-zero on differences too"
    );
    let parsed: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(parsed["result"], "different", "{out}");
    assert_eq!(parsed["differing"], 5, "{out}");
    let body = parsed["targets"][0]["tables"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["table"] == "public.items"))
        .and_then(|t| t["examples"].as_array())
        .and_then(|es| es.iter().find(|e| e["column"] == "body"))
        .unwrap_or_else(|| panic!("no body difference in {out}"));
    assert_eq!(body["key"], json!({"id": 4}), "{out}");
    assert_eq!(body["target"]["truncated"]["length"], 6144, "{out}");
    assert_eq!(body["source"]["truncated"]["length"], 3200, "{out}");
    // Stopped first: cleanup cannot drop a slot in use.
    drop(capture);
    p.cleanup().await;
    Ok(())
}
