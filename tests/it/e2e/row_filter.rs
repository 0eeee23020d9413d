//! Row filters (`table.filter`, docs/configuration.md "Row filters")
//! through the whole pipeline: the initial snapshot and the stream publish
//! only matching rows; an UPDATE moving a row out of the filter reaches the
//! warehouse, the index and the cache as a delete and one moving a row in
//! as a create; `oncely verify` is equal under the filter and reports the
//! rows a narrower filter leaves out as held by the targets; a capture
//! killed mid-snapshot resumes with the filter, and one killed inside
//! filtered transactions replays them exactly once; a filter that is not one
//! expression, or that the replica identity does not cover, or a table the
//! publication holds through its schema, stops start-up; a partitioned
//! table is filtered through its root; verify resolves the filter among
//! the built-in functions only, as capture does. Each runs on PostgreSQL
//! 13/14 too (`scripts/test`'s `test-pg14`), where capture evaluates the
//! filter on the stream instead of the publication.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::harness::capture::{kill9, read_committed, CaptureEnv, Seen};
use crate::harness::e2e::{Pipeline, WAREHOUSE_SCHEMA};

const SCHEMA: &str = "
    CREATE TABLE orders (id int PRIMARY KEY, region text NOT NULL, note text);
    -- the filter reads a column outside the key: the old row must hold it
    ALTER TABLE orders REPLICA IDENTITY FULL;
    INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'n' || g
      FROM generate_series(1, 40) g;
    -- a filter on the key needs no more than the default identity
    CREATE TABLE items (id int PRIMARY KEY, label text);
    INSERT INTO items SELECT g, 'l' || g FROM generate_series(1, 30) g;
";

const FILTERS: &str = "publication.autocreate.mode = \"filtered\"
snapshot.mode = \"initial\"
[table.filter]
\"public.orders\" = \"region = 'eu'\"
\"public.items\" = \"id % 3 = 0\"
";

/// The first server version with publication row filters; below it
/// capture evaluates `table.filter` itself.
const ROW_FILTER_VERSION: i32 = 150_000;

async fn server_version(client: &tokio_postgres::Client) -> Result<i32> {
    Ok(client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0))
}

/// The publication's tables, each with the row filter the server holds
/// (`-` where it holds none, as below PostgreSQL 15, where capture filters).
async fn published(client: &tokio_postgres::Client) -> Result<Vec<String>> {
    let filter = if server_version(client).await? >= ROW_FILTER_VERSION {
        "coalesce(rowfilter, '-')"
    } else {
        "'-'"
    };
    Ok(client
        .query(
            &format!(
                "SELECT tablename::text || ': ' || {filter} FROM pg_publication_tables
                 WHERE pubname = 'oncely_publication' ORDER BY 1"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The id of a record's key.
fn id(seen: &Seen) -> Option<i64> {
    let key = seen.key.as_ref()?;
    key.get("payload").unwrap_or(key).get("id")?.as_i64()
}

/// The ops (`r`, `c`, `u`, `d`) of `topic`'s records, by id, in order;
/// tombstones left out.
fn ops_by_id(seen: &[Seen], topic: &str) -> BTreeMap<i64, Vec<String>> {
    let mut ops: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let mut records: Vec<&Seen> = seen.iter().filter(|s| s.topic == topic).collect();
    records.sort_by_key(|s| (s.partition, s.offset));
    for s in records {
        if let (Some(id), Some(op)) = (id(s), s.op()) {
            ops.entry(id).or_default().push(op.to_owned());
        }
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_moving_in_and_out_of_the_filter_reach_every_target_as_creates_and_deletes(
) -> Result<()> {
    let p = Pipeline::new("row_filter", SCHEMA, &["orders", "items"], FILTERS).await?;
    let result = moves(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn moves(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "after the snapshot:\n{report}");
    // The publication holds the filters as the server renders them; below
    // PostgreSQL 15 it holds none and capture filters the stream.
    let held = published(&p.env.client).await?;
    if server_version(&p.env.client).await? >= ROW_FILTER_VERSION {
        assert_eq!(
            held,
            ["items: ((id % 3) = 0)", "orders: (region = 'eu'::text)"],
            "the publication's row filters"
        );
    } else {
        assert_eq!(
            held,
            ["items: -", "orders: -"],
            "a publication without filters"
        );
    }

    p.env
        .client
        .batch_execute(
            "UPDATE orders SET region = 'us' WHERE id IN (2, 4);     -- out
             UPDATE orders SET region = 'eu' WHERE id IN (1, 3);     -- in
             UPDATE orders SET note = 'still out' WHERE id = 5;      -- never in
             UPDATE orders SET note = 'still in' WHERE id = 6;
             INSERT INTO orders VALUES (100, 'eu', 'new'), (101, 'us', 'new');
             DELETE FROM orders WHERE id IN (7, 8);
             UPDATE items SET id = id + 1000 WHERE id IN (3, 4);     -- 3 out; 4 never in (1004 % 3 = 2)
             UPDATE items SET id = 1002 WHERE id = 5;                -- in
             UPDATE items SET label = 'x' WHERE id IN (6, 7);",
        )
        .await
        .context("the changes")?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "after the changes:\n{report}");

    let seen = read_committed(&p.topics())?;
    let orders = ops_by_id(&seen, &p.env.topic("orders"));
    let ops = |id: i64| orders.get(&id).cloned().unwrap_or_default();
    assert_eq!(ops(2), ["r", "d"], "a row moved out is deleted");
    assert_eq!(ops(1), ["c"], "a row moved in is created");
    assert_eq!(ops(6), ["r", "u"]);
    assert_eq!(ops(8), ["r", "d"]);
    for out in [5, 7, 101] {
        assert!(
            ops(out).is_empty(),
            "row {out} never matched: {:?}",
            ops(out)
        );
    }
    assert!(
        orders.keys().all(|id| id % 2 == 0 || [1, 3].contains(id)),
        "an unmatched row reached the topic: {orders:?}"
    );
    let items = ops_by_id(&seen, &p.env.topic("items"));
    assert_eq!(items.get(&3).cloned().unwrap_or_default(), ["r", "d"]);
    assert_eq!(items.get(&1002).cloned().unwrap_or_default(), ["c"]);
    assert!(!items.contains_key(&1003) && !items.contains_key(&7));

    // The warehouse holds exactly the matching rows (deleted ones marked).
    let live: Vec<i32> = p
        .env
        .client
        .query(
            &format!(
                "SELECT id FROM {WAREHOUSE_SCHEMA}.public_orders
                 WHERE NOT coalesce(__oncely_deleted, false) ORDER BY id"
            ),
            &[],
        )
        .await
        .context("the warehouse")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want: Vec<i32> = p
        .env
        .client
        .query("SELECT id FROM orders WHERE region = 'eu' ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(live, want, "the warehouse's live rows");

    // verify reads the source under the filter: with a narrower one, the
    // rows the targets hold beyond it are reported.
    let narrower = p.env.write_config(
        "capture-narrower.toml",
        &std::fs::read_to_string(&p.capture_config)?
            .replace("\"region = 'eu'\"", "\"region = 'eu' AND id < 20\""),
    )?;
    let report = oncely::verify::run(&oncely::verify::Options {
        capture: narrower,
        sinks: p.sinks.clone(),
        wait: true,
        capture_offset: true,
        timeout: Duration::from_secs(120),
        examples: 5,
        retries: 0,
    })
    .await
    .context("verify under a narrower filter")?;
    ensure!(
        !report.is_equal(),
        "rows beyond a narrower filter must be reported:\n{report}"
    );

    for s in sinks.iter_mut() {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_killed_mid_snapshot_resumes_with_the_filter() -> Result<()> {
    let schema = "CREATE TABLE big (id int PRIMARY KEY, v text);
                  INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 20000) g;";
    let extra = "publication.autocreate.mode = \"filtered\"
snapshot.mode = \"initial\"
incremental.snapshot.chunk.size = 5
[table.filter]
\"public.big\" = \"id % 2 = 0\"
";
    let p = Pipeline::new("row_filter_kill", schema, &["big"], extra).await?;
    let result = killed_mid_snapshot(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn killed_mid_snapshot(p: &Pipeline) -> Result<()> {
    let topic = p.env.topic("big");
    let mut capture = p.spawn_capture()?;
    // Killed once the snapshot reports progress and is not done: some
    // chunks committed, most not.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let log = p.env.capture_log();
        if log.contains("snapshot complete") {
            bail!("the snapshot ended before the kill: the test tests no restart");
        }
        if log.contains("snapshot progress") {
            break;
        }
        if Instant::now() > deadline {
            bail!("no snapshot progress within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut capture);
    let published = read_committed(&p.topics())?
        .iter()
        .filter(|s| s.topic == topic && s.value.is_some())
        .count();
    ensure!(
        (1..9_000).contains(&published),
        "{published} rows published before the kill: the test tests no restart"
    );
    let _capture = p.spawn_capture()?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    let report = p.verify_until_equal(Duration::from_secs(300)).await?;
    ensure!(report.is_equal(), "after the resumed snapshot:\n{report}");
    let seen = read_committed(&p.topics())?;
    let ids = ops_by_id(&seen, &topic);
    assert_eq!(ids.len(), 10_000, "every matching row, once or more");
    let odd: Vec<&i64> = ids.keys().filter(|id| *id % 2 != 0).take(5).collect();
    assert!(odd.is_empty(), "rows outside the filter published: {odd:?}");
    for s in sinks.iter_mut() {
        kill9(s);
    }
    Ok(())
}

/// Runs capture to its exit with `extra` (snapshot.mode = initial_only, so a
/// start that is not refused ends by itself).
fn start(env: &CaptureEnv, extra: &str) -> Result<(bool, String)> {
    env.run_capture(
        &format!("snapshot.mode = \"initial_only\"\n{extra}"),
        Duration::from_secs(120),
    )
}

fn filter_of(table: &str, filter: &str) -> String {
    format!(
        "[table.filter]\n\"public.{table}\" = {}\n",
        Value::from(filter)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_is_not_one_expression_or_lacks_the_replica_identity_stops_start_up(
) -> Result<()> {
    let env = CaptureEnv::new("row_filter_refused").await?;
    let result = refused(&env).await;
    if result.is_err() {
        eprintln!("logs in {}", env.dir.display());
    }
    env.cleanup().await;
    result
}

async fn refused(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE acct (id int PRIMARY KEY, region text, secret text,
               at timestamptz NOT NULL DEFAULT now());
             INSERT INTO acct VALUES (1, 'eu', 's1'), (2, 'us', 's2');",
        )
        .await?;
    let filtered = "publication.autocreate.mode = \"filtered\"\n";
    // An injection attempt: refused when the file is read, naming the key.
    let (ok, err) = start(
        env,
        &format!(
            "{filtered}{}",
            filter_of("acct", "true) OR (pg_sleep(5) IS NULL")
        ),
    )?;
    ensure!(!ok, "an injected filter started capture:\n{err}");
    ensure!(err.contains("table.filter.public.acct"), "{err}");
    let (ok, err) = start(
        env,
        &format!(
            "{filtered}{}",
            filter_of("acct", "length(pg_read_file('/etc/passwd')) > 0")
        ),
    )?;
    ensure!(!ok && err.contains("pg_read_file"), "{err}");

    // REPLICA IDENTITY DEFAULT and a filter on a column outside the key:
    // refused, and no filter is added (the table's UPDATEs still work).
    let (ok, err) = start(
        env,
        &format!("{filtered}{}", filter_of("acct", "region = 'eu'")),
    )?;
    ensure!(!ok, "an uncovered filter started capture:\n{err}");
    ensure!(
        err.contains("REPLICA IDENTITY FULL") && err.contains("region"),
        "{err}"
    );
    env.client
        .batch_execute("UPDATE acct SET secret = 'x' WHERE id = 1")
        .await
        .context("capture added a filter the identity does not cover")?;

    // Functions PostgreSQL 15 refuses in a publication filter (not
    // immutable: they read the session's TimeZone), one named in the
    // expression and one a cast through text calls: refused on every
    // version, by the server's probe or, below 15, by capture's own.
    let by_server = server_version(&env.client).await? >= ROW_FILTER_VERSION;
    for (filter, named) in [
        (
            "date_part('year', at) > 2000",
            "date_part(text,timestamp with time zone) (not immutable)",
        ),
        ("at::text LIKE '2024%'", "a cast through text"),
    ] {
        let (ok, err) = start(env, &format!("{filtered}{}", filter_of("acct", filter)))?;
        ensure!(
            !ok,
            "a mutable function in {filter} started capture:\n{err}"
        );
        let reason = if by_server {
            "refused by the server"
        } else {
            named
        };
        ensure!(err.contains(reason), "{filter}: {err}");
    }
    if !by_server {
        return refused_without_publication_filters(env).await;
    }

    // An operator-managed publication (`disabled`) whose filter the
    // identity does not cover: PostgreSQL refuses the table's UPDATEs,
    // and capture refuses to start, naming the fix.
    env.client
        .batch_execute("CREATE PUBLICATION oncely_publication FOR TABLE acct WHERE (region = 'eu')")
        .await?;
    let update = env
        .client
        .batch_execute("UPDATE acct SET secret = 'y' WHERE id = 1")
        .await;
    ensure!(
        update.is_err(),
        "PostgreSQL took an UPDATE under an uncovered row filter"
    );
    let disabled = "publication.autocreate.mode = \"disabled\"\n";
    let (ok, err) = start(
        env,
        &format!("{disabled}{}", filter_of("acct", "region = 'eu'")),
    )?;
    ensure!(
        !ok && err.contains("REPLICA IDENTITY FULL"),
        "an uncovered operator-managed filter:\n{err}"
    );
    // Covered, capture starts; a different filter is refused with the SQL.
    env.client
        .batch_execute("ALTER TABLE acct REPLICA IDENTITY FULL")
        .await?;
    let (ok, err) = start(
        env,
        &format!("{disabled}{}", filter_of("acct", "region='eu'")),
    )?;
    ensure!(ok, "the publication's own filter:\n{err}");
    let (ok, err) = start(
        env,
        &format!("{disabled}{}", filter_of("acct", "region = 'us'")),
    )?;
    ensure!(
        !ok && err.contains("ALTER PUBLICATION") && err.contains("region = 'us'"),
        "a filter other than the publication's:\n{err}"
    );
    let (ok, err) = start(env, disabled)?;
    ensure!(
        !ok && err.contains("filters the rows of public.acct"),
        "a filtered publication without table.filter:\n{err}"
    );
    // Under `filtered` a changed filter replaces the publication's, with a
    // warning saying how the targets converge.
    let (ok, err) = start(
        env,
        &format!("{filtered}{}", filter_of("acct", "region = 'us'")),
    )?;
    ensure!(ok, "a changed filter under filtered:\n{err}");
    ensure!(
        err.contains("row filter changed") && err.contains("execute-snapshot"),
        "{err}"
    );
    let held: String = env
        .client
        .query_one(
            "SELECT rowfilter FROM pg_publication_tables WHERE pubname = 'oncely_publication'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(held, "(region = 'us'::text)");
    Ok(())
}

/// Below PostgreSQL 15: an operator-managed publication carries no filter,
/// and capture refuses a filter its replica identity does not cover all
/// the same (a DELETE's old row would lack the column), naming the fix;
/// covered, it starts.
async fn refused_without_publication_filters(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute("CREATE PUBLICATION oncely_publication FOR TABLE acct")
        .await?;
    let disabled = "publication.autocreate.mode = \"disabled\"\n";
    let (ok, err) = start(
        env,
        &format!("{disabled}{}", filter_of("acct", "region = 'eu'")),
    )?;
    ensure!(
        !ok && err.contains("REPLICA IDENTITY FULL") && err.contains("region"),
        "an uncovered filter on an operator-managed publication:\n{err}"
    );
    env.client
        .batch_execute("ALTER TABLE acct REPLICA IDENTITY FULL")
        .await?;
    let (ok, err) = start(
        env,
        &format!("{disabled}{}", filter_of("acct", "region = 'eu'")),
    )?;
    ensure!(ok, "a covered filter under disabled:\n{err}");
    assert_eq!(published(&env.client).await?, ["acct: -"]);
    Ok(())
}

/// A filter calling `lower(name)` on a varchar column, and a
/// `public.lower(varchar)` created once capture runs: on the default
/// search_path that one matches better than the built-in `lower(text)`.
const SHADOWED: &str = "
    CREATE TABLE people (id int PRIMARY KEY, name varchar(20) NOT NULL);
    ALTER TABLE people REPLICA IDENTITY FULL;
    INSERT INTO people VALUES (1, 'KEEP'), (2, 'keep'), (3, 'drop'), (4, 'Drop');
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_evaluates_the_filter_as_capture_does_despite_a_shadowing_function() -> Result<()> {
    let p = Pipeline::new(
        "row_filter_shadow",
        SHADOWED,
        &["people"],
        &format!(
            "publication.autocreate.mode = \"filtered\"\nsnapshot.mode = \"initial\"\n{}",
            filter_of("people", "lower(name) = 'keep'")
        ),
    )
    .await?;
    let result = shadowed(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn shadowed(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "after the snapshot:\n{report}");
    // Matches every row: resolved along the default search_path, the
    // filter would mean all four rows, which capture never published.
    p.env
        .client
        .batch_execute(
            "CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE sql IMMUTABLE
             AS $$ SELECT 'keep'::text $$",
        )
        .await?;
    let resolved: String = p
        .env
        .client
        .query_one("SELECT lower('x'::varchar)", &[])
        .await?
        .get(0);
    ensure!(resolved == "keep", "the shadowing function is not picked");
    let report = p.verify(Duration::from_secs(120)).await?;
    ensure!(
        report.is_equal(),
        "verify under a shadowing function:\n{report}"
    );
    for s in sinks.iter_mut() {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_table_published_through_its_schema_is_refused_naming_the_fix() -> Result<()> {
    let env = CaptureEnv::new("row_filter_in_schema").await?;
    let result = in_schema(&env).await;
    if result.is_err() {
        eprintln!("logs in {}", env.dir.display());
    }
    env.cleanup().await;
    result
}

async fn in_schema(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute(
            "CREATE TABLE acct (id int PRIMARY KEY, region text);
             INSERT INTO acct VALUES (1, 'eu'), (2, 'us');
             CREATE PUBLICATION oncely_publication FOR TABLES IN SCHEMA public;",
        )
        .await?;
    for mode in ["filtered", "disabled"] {
        let (ok, err) = start(
            env,
            &format!(
                "publication.autocreate.mode = \"{mode}\"\n{}",
                filter_of("acct", "id > 1")
            ),
        )?;
        ensure!(!ok, "{mode}: a schema publication with a filter started");
        ensure!(
            err.contains("TABLES IN SCHEMA public")
                && err.contains("DROP TABLES IN SCHEMA")
                && err.contains("public.acct"),
            "{mode}: {err}"
        );
    }
    Ok(())
}

/// A partitioned table published through its root
/// (`publish_via_partition_root`), filtered on its partition key.
const PARTITIONED: &str = "
    CREATE TABLE events (id int, region text, note text, PRIMARY KEY (id, region))
      PARTITION BY LIST (region);
    CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu');
    CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us');
    CREATE TABLE events_other PARTITION OF events DEFAULT;
    INSERT INTO events SELECT g, (ARRAY['eu', 'us', 'asia'])[g % 3 + 1], 'n' || g
      FROM generate_series(1, 30) g;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_partitioned_table_takes_rows_moving_across_partitions_and_the_filter(
) -> Result<()> {
    let p = Pipeline::new(
        "row_filter_partitioned",
        PARTITIONED,
        &["events"],
        &format!(
            "publication.autocreate.mode = \"filtered\"\nsnapshot.mode = \"initial\"\n{}",
            filter_of("events", "region <> 'us'")
        ),
    )
    .await?;
    let result = partitioned(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn partitioned(p: &Pipeline) -> Result<()> {
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let mut sinks = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<Vec<_>>>()?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "after the snapshot:\n{report}");
    // g % 3: 0 -> eu, 1 -> us, 2 -> asia.
    p.env
        .client
        .batch_execute(
            "UPDATE events SET region = 'asia' WHERE id = 3;   -- eu -> other, stays in
             UPDATE events SET region = 'us' WHERE id = 6;     -- eu -> us, out
             UPDATE events SET region = 'eu' WHERE id = 1;     -- us -> eu, in
             UPDATE events SET note = 'x' WHERE id IN (4, 5);  -- 4 never in, 5 in
             INSERT INTO events VALUES (100, 'us', 'new'), (101, 'eu', 'new');
             DELETE FROM events WHERE id IN (7, 9);",
        )
        .await
        .context("the changes")?;
    let report = p.verify_until_equal(Duration::from_secs(180)).await?;
    ensure!(report.is_equal(), "after the changes:\n{report}");

    let seen = read_committed(&p.topics())?;
    let events = ops_by_id(&seen, &p.env.topic("events"));
    let ops = |id: i64| events.get(&id).cloned().unwrap_or_default();
    assert_eq!(ops(6), ["r", "d"], "a row moved out is deleted");
    assert_eq!(ops(1), ["c"], "a row moved in is created");
    assert_eq!(ops(5), ["r", "u"]);
    assert_eq!(ops(9), ["r", "d"]);
    assert_eq!(ops(101), ["c"]);
    for out in [4, 7, 100] {
        assert!(
            ops(out).is_empty(),
            "row {out} never matched: {:?}",
            ops(out)
        );
    }
    // Across partitions the key changes (region is in it): the old key
    // deleted, the new one created.
    assert_eq!(ops(3), ["r", "d", "c"], "a row moved to another partition");
    for s in sinks.iter_mut() {
        kill9(s);
    }
    kill9(&mut capture);
    Ok(())
}

/// Rows that each transaction of [`a_capture_killed_inside_filtered_transactions_replays_them_exactly_once`]
/// moves: `v` grows by 2 where `id % 3 = 0` (staying in, an update, or
/// out, dropped) and by 1 elsewhere (leaving, a delete, or entering, a
/// create) under the filter `v % 2 = 0`.
const FLIPS: i64 = 3000;
const FLIP_TRANSACTIONS: usize = 4;

/// The ops each row's key gets: `r` in the snapshot, then per transaction.
fn expected_flips() -> BTreeMap<i64, Vec<String>> {
    let mut want: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for id in 1..=FLIPS {
        let mut v = id;
        let mut ops = Vec::new();
        if v % 2 == 0 {
            ops.push("r".to_owned());
        }
        for _ in 0..FLIP_TRANSACTIONS {
            let new = v + if id % 3 == 0 { 2 } else { 1 };
            match (v % 2 == 0, new % 2 == 0) {
                (true, true) => ops.push("u".to_owned()),
                (true, false) => ops.push("d".to_owned()),
                (false, true) => ops.push("c".to_owned()),
                (false, false) => {}
            }
            v = new;
        }
        if !ops.is_empty() {
            want.insert(id, ops);
        }
    }
    want
}

/// Source transactions that drop, keep and rewrite changes, published in
/// Kafka transactions of 5 events, and capture killed once part of them is
/// in Kafka: the restarted capture replays them and skips exactly what
/// Kafka holds, which it can only if the replay drops and rewrites the same
/// events (the ordinals it skips by are counted after the filter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_killed_inside_filtered_transactions_replays_them_exactly_once() -> Result<()> {
    let schema = format!(
        "CREATE TABLE flips (id int PRIMARY KEY, v int NOT NULL);
         ALTER TABLE flips REPLICA IDENTITY FULL;
         INSERT INTO flips SELECT g, g FROM generate_series(1, {FLIPS}) g;"
    );
    let extra = "publication.autocreate.mode = \"filtered\"
snapshot.mode = \"initial\"
batch.max.events = 5
[table.filter]
\"public.flips\" = \"v % 2 = 0\"
";
    let p = Pipeline::new("row_filter_replay", &schema, &["flips"], extra).await?;
    let result = replayed(&p).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

/// The `topic` records holding a value, once there are at least `want`
/// (or the deadline passed).
fn wait_values(topic: &str, want: usize, within: Duration) -> Result<Vec<Seen>> {
    let deadline = Instant::now() + within;
    loop {
        let seen: Vec<Seen> = read_committed(&[topic.to_owned()])?
            .into_iter()
            .filter(|s| s.topic == topic && s.value.is_some())
            .collect();
        if seen.len() >= want || Instant::now() > deadline {
            return Ok(seen);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn replayed(p: &Pipeline) -> Result<()> {
    let topic = p.env.topic("flips");
    let want = expected_flips();
    let total: usize = want.values().map(Vec::len).sum();
    let snapshot = (FLIPS / 2) as usize;
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let seen = wait_values(&topic, snapshot, Duration::from_secs(180))?;
    ensure!(seen.len() == snapshot, "the snapshot: {} rows", seen.len());
    // The changes wait for a capture that is down, then a capture is
    // killed as soon as some of them are in Kafka (a longer life each time
    // none were), so the next one replays from inside a transaction.
    kill9(&mut capture);
    for _ in 0..FLIP_TRANSACTIONS {
        p.env
            .client
            .batch_execute("UPDATE flips SET v = v + CASE WHEN id % 3 = 0 THEN 2 ELSE 1 END")
            .await?;
    }
    let mut life = Duration::from_millis(1500);
    let partial = loop {
        let mut capture = p.spawn_capture()?;
        tokio::time::sleep(life).await;
        kill9(&mut capture);
        let partial = wait_values(&topic, 0, Duration::ZERO)?.len();
        ensure!(
            partial < total,
            "every change was in Kafka before the kill: the test tests no replay"
        );
        if partial > snapshot {
            eprintln!("capture killed with {partial} of {total} records in Kafka");
            break partial;
        }
        ensure!(
            life < Duration::from_secs(30),
            "no change published in {life:?}"
        );
        life *= 2;
    };
    let _capture = p.spawn_capture()?;
    wait_values(&topic, total, Duration::from_secs(180))?;
    // Anything replayed twice would land after the last expected record.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = read_committed(std::slice::from_ref(&topic))?;
    let got = ops_by_id(&seen, &topic);
    let wrong: Vec<_> = want
        .iter()
        .filter(|(id, ops)| got.get(id) != Some(ops))
        .take(5)
        .map(|(id, ops)| (id, ops, got.get(id)))
        .collect();
    ensure!(
        wrong.is_empty() && got.len() == want.len(),
        "rows whose ops differ (id, want, got), killed at {partial} of {total}: {wrong:?}"
    );
    Ok(())
}
