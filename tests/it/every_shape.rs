//! Every shape end to end (not the conformance kit of a `Sink`,
//! `oncely_sinks::conformance`): one table per shape a real schema has — every type
//! the value mapping supports with its edge values, text, unicode and
//! composite keys of typmod types, TOASTed columns left unchanged by
//! updates, `REPLICA IDENTITY FULL` — driven through capture and the three
//! prebuilt sinks while a chaos loop SIGKILLs a random process every second
//! or two: rows that exist before capture starts (the initial snapshot),
//! streamed inserts, updates and deletes, and a signalled snapshot of every
//! table while the rows keep changing. Then `oncely verify` must report every
//! copy equal, no sink may have dead-lettered anything, and a
//! `read_committed` scan must hold each streamed change exactly once and as
//! many as the source committed (a trigger counts them in the same
//! transactions).
//!
//! A shape is data ([`Shape`]): its DDL, how a row's key is spelled from a
//! number, and per column the SQL literals its values cycle through, so a
//! new type or key kind is one entry. Every value of every shape must
//! arrive exactly: there is no list of tolerated differences.
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;

use crate::harness::capture;
use crate::harness::checks::{dead_letters, expected_events, scan_changes};
use crate::harness::e2e::{Fleet, Pipeline};

/// A column and the SQL literals its values cycle through.
type Column = (&'static str, &'static str, &'static [&'static str]);

/// One table of the suite.
struct Shape {
    table: &'static str,
    /// Extra DDL the table needs first (types, domains, extensions).
    prelude: &'static str,
    /// Key columns with their types.
    key: &'static [(&'static str, &'static str)],
    /// The key's SQL literals for row number `n`, in `key` order.
    key_of: fn(i64) -> Vec<String>,
    columns: &'static [Column],
    /// Appended after `CREATE TABLE` (storage, replica identity).
    after: &'static str,
    /// Updates of this shape leave these columns out (so their TOASTed
    /// values stay unchanged); every fourth update sets them too.
    rarely_updated: &'static [&'static str],
    /// `PARTITION BY ...` (partitions are created in `after`), or empty.
    partition_by: &'static str,
    /// The workload also changes primary keys (`id`, an integer key).
    key_updates: bool,
}

fn int_key(n: i64) -> Vec<String> {
    vec![n.to_string()]
}

/// Text keys with spaces, quotes, backslashes, unicode and trailing blanks.
fn text_key(n: i64) -> Vec<String> {
    const STEMS: [&str; 6] = ["k ", "ключ-", "it''s ", "back\\slash ", "Ünï ", "x"];
    let stem = STEMS[(n % STEMS.len() as i64) as usize];
    let tail = if n % 4 == 0 { "  " } else { "" };
    vec![format!("'{stem}{n}{tail}'")]
}

/// A composite key mixing `char(n)`, `int`, `varchar(n)` and `uuid`.
fn mixed_key(n: i64) -> Vec<String> {
    vec![
        format!("'c{}'", n % 7),
        n.to_string(),
        format!("'v{}'", n % 3),
        format!("md5('{n}')::uuid"),
    ]
}

const ALL_TYPES_PRELUDE: &str = "
    CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
    CREATE EXTENSION IF NOT EXISTS hstore;";

/// Every type of the value mapping, each with its edge values.
const ALL_TYPES: &[Column] = &[
    ("b", "boolean", &["true", "false", "NULL"]),
    ("i2", "smallint", &["0", "-32768", "32767", "NULL"]),
    ("i4", "integer", &["-2147483648", "2147483647", "42"]),
    (
        "i8",
        "bigint",
        &["-9223372036854775808", "9223372036854775807", "0", "NULL"],
    ),
    ("f4", "real", &["1.5", "-3.25e-5", "3.4028235e38"]),
    (
        "f8",
        "double precision",
        &["0.1", "-2.5e-3", "1e15", "NULL"],
    ),
    (
        "n122",
        "numeric(12,2)",
        &["0.00", "-9999999999.99", "163.38"],
    ),
    (
        "n",
        "numeric",
        &[
            "0.00000000000000000001",
            "123456789012345678901234567890.123456789",
            "-7",
        ],
    ),
    ("m", "money", &["12.34", "-0.99", "1000000.00"]),
    (
        "t",
        "text",
        &[
            "''",
            "'héllo wörld 🎉'",
            "E'line\\nbreak\\ttab'",
            "'quote''s \"double\" \\backslash'",
            "NULL",
        ],
    ),
    ("vc", "varchar(20)", &["'v'", "repeat('x', 20)"]),
    ("ch", "char(5)", &["'ab'", "'abcde'"]),
    (
        "j",
        "json",
        &[
            "'{\"a\": [1, 2.50, null], \"b\": \"x\"}'",
            "'[]'",
            "'\"s\"'",
        ],
    ),
    (
        "jb",
        "jsonb",
        &[
            "'{\"z\": 1, \"a\": {\"n\": [true, false]}}'",
            "'[1, \"two\"]'",
            "NULL",
        ],
    ),
    ("x", "xml", &["'<a x=\"1\">t</a>'", "'<b/>'"]),
    (
        "u",
        "uuid",
        &[
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
            "gen_random_uuid()",
        ],
    ),
    ("e", "mood", &["'sad'", "'happy'", "NULL"]),
    (
        "by",
        "bytea",
        &["'\\x00ff10'", "'\\x'", "decode(md5('b'), 'hex')"],
    ),
    // Dates and times at PostgreSQL's extremes (docs/design.md, "Dates, times
    // and intervals"): BC,
    // the largest value of each type, ±infinity, 24:00:00, and intervals
    // whose months, days and time differ in sign or exceed 64-bit µs.
    (
        "tz",
        "timestamptz",
        &[
            "'2026-11-27 15:10:35.670111+02'",
            "'1970-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59.999999+00'",
            "'0044-03-15 12:00+00 BC'",
            "'4714-11-24 00:00:00+00 BC'",
            "'294276-12-31 23:59:59.999999+00'",
            "'infinity'",
            "'-infinity'",
        ],
    ),
    (
        "ts",
        "timestamp",
        &[
            "'2000-01-01 00:00:00'",
            "'1969-12-31 23:59:59.999999'",
            "'2262-04-11 23:47:16'",
            "'4714-11-24 00:00:00 BC'",
            "'294246-12-31 23:59:59.999999'",
            "'infinity'",
            "'-infinity'",
        ],
    ),
    (
        "d",
        "date",
        &[
            "'2026-01-01'",
            "'1900-02-28'",
            "'0001-01-01'",
            "'4713-01-01 BC'",
            "'4714-11-24 BC'",
            "'5874897-12-31'",
            "'infinity'",
            "'-infinity'",
        ],
    ),
    (
        "tm",
        "time",
        &[
            "'00:00:00'",
            "'23:59:59.999999'",
            "'12:34:56.5'",
            "'24:00:00'",
        ],
    ),
    (
        "ttz",
        "timetz",
        &["'12:00:00+05:30'", "'00:00:00-12'", "'24:00:00+00'"],
    ),
    (
        "iv",
        "interval",
        &[
            "'3 days 04:05:06.789'",
            "'-1 hour'",
            "'0'",
            "'1 year 2 mons 3 days 04:05:06.789'",
            "'-1 years -2 mons +3 days -04:05:06.789'",
            "'-178000000 years'",
            "'178000000 years 2147483647 days 2562047788:00:54.775807'",
        ],
    ),
    (
        "tza",
        "timestamptz[]",
        // Elasticsearch maps a field from the first document holding it; an
        // array mixing date-like and other strings there is a mapping
        // conflict (see docs/design.md), so each array is of one kind.
        &[
            "'{\"0044-03-15 12:00+00 BC\",NULL,\"2026-01-01 00:00+00\"}'",
            "'{infinity,-infinity}'",
            "'{}'",
        ],
    ),
    (
        "iva",
        "interval[]",
        &[
            "'{\"1 year 2 mons\",\"-178000000 years\",NULL}'",
            "'{-00:00:00.5}'",
        ],
    ),
    ("ip", "inet", &["'192.168.0.1/24'", "'10.0.0.1'"]),
    ("net", "cidr", &["'10.0.0.0/8'", "'2001:db8::/32'"]),
    ("mac", "macaddr", &["'08:00:2b:01:02:03'"]),
    ("bits", "bit(8)", &["B'10101010'", "B'00000001'"]),
    ("vb", "varbit", &["B'1'", "B'0110'"]),
    ("r", "int4range", &["'[1,10)'", "'empty'", "'(,5]'"]),
    (
        "tr",
        "tstzrange",
        &["'[2026-01-01 00:00+00,2026-02-01 00:00+00)'"],
    ),
    ("pt", "point", &["'(1.5,-2)'"]),
    ("dom", "posint", &["5", "2147483647"]),
    (
        "ia",
        "integer[]",
        &["'{1,2,NULL}'", "'{}'", "'{{1,2},{3,4}}'"],
    ),
    ("ta", "text[]", &["'{\"a b\",\"c,d\",\"\",NULL}'", "'{x}'"]),
    ("na", "numeric[]", &["'{1.10,2.5}'"]),
    ("ua", "uuid[]", &["ARRAY[gen_random_uuid()]"]),
    ("ea", "mood[]", &["'{sad,happy}'", "'{}'"]),
    ("hs", "hstore", &["'a=>1, b=>NULL'", "''"]),
    // Non-finite and extreme floats ("NaN", "Infinity", "-Infinity" on the
    // wire), numerics that differ from their spelling in scale.
    (
        "n_special",
        "numeric",
        &["'NaN'", "'Infinity'", "'-Infinity'", "11.2500", "NULL"],
    ),
    (
        "f8_special",
        "double precision",
        &[
            "1",
            "'NaN'",
            "1e308",
            "'Infinity'",
            "-2.5e-300",
            "'-Infinity'",
            "-1.7976931348623157e308",
        ],
    ),
    (
        "f4_special",
        "real",
        &[
            "'NaN'",
            "3.4028235e38",
            "'Infinity'",
            "1.17549435e-38",
            "'-Infinity'",
            "2",
        ],
    ),
    (
        "ip6",
        "inet",
        &[
            "'::1'",
            "'::1/128'",
            "'10.1.2.3/8'",
            "'2001:db8::1/64'",
            "'10.1.2.3/32'",
        ],
    ),
    ("net6", "cidr", &["'::1/128'", "'0.0.0.0/0'"]),
    (
        "fa",
        "double precision[]",
        &["'{1e308,NaN,-Infinity,NULL}'", "'{}'", "'{{1,2},{3,4.5}}'"],
    ),
    ("nsa", "numeric[]", &["'{NaN,Infinity,-Infinity,1.10}'"]),
    // Arrays of dates, timestamps and times: typed arrays in the warehouse.
    (
        "da",
        "date[]",
        &[
            "'{2026-01-01,1999-12-31}'",
            "'{{2026-01-01,NULL},{1970-01-01,0001-01-01}}'",
            "'{}'",
        ],
    ),
    (
        "tsa",
        "timestamp[]",
        &[
            "'{2000-01-01 00:00:00,1969-12-31 23:59:59.999999}'",
            "'{NULL}'",
        ],
    ),
    (
        "tma",
        "time[]",
        &["'{00:00:00,23:59:59.999999,12:34:56.5}'"],
    ),
];

const TOAST_COLUMNS: &[Column] = &[
    ("rev", "integer", &["1", "2", "3", "4", "5"]),
    (
        "body",
        "text",
        &[
            "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 200) g)",
        ],
    ),
    ("note", "text", &["'n'", "NULL", "'note'"]),
];

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            table: "all_types",
            prelude: ALL_TYPES_PRELUDE,
            key: &[("id", "bigint")],
            key_of: int_key,
            columns: ALL_TYPES,
            after: "",
            rarely_updated: &[],
            partition_by: "",
            key_updates: true,
        },
        Shape {
            table: "text_keys",
            prelude: "",
            key: &[("k", "text")],
            key_of: text_key,
            columns: &[
                ("v", "integer", &["1", "2", "NULL"]),
                ("s", "text", &["'a'", "'b'"]),
            ],
            after: "",
            rarely_updated: &[],
            partition_by: "",
            key_updates: false,
        },
        Shape {
            table: "mixed_keys",
            prelude: "",
            key: &[
                ("code", "char(4)"),
                ("n", "integer"),
                ("tag", "varchar(10)"),
                ("u", "uuid"),
            ],
            key_of: mixed_key,
            columns: &[("v", "numeric(10,3)", &["1.5", "-2.125", "0"])],
            after: "",
            rarely_updated: &[],
            partition_by: "",
            key_updates: false,
        },
        Shape {
            table: "toast_docs",
            prelude: "",
            key: &[("id", "bigint")],
            key_of: int_key,
            columns: TOAST_COLUMNS,
            after: "ALTER TABLE toast_docs ALTER COLUMN body SET STORAGE EXTERNAL;",
            rarely_updated: &["body"],
            partition_by: "",
            key_updates: true,
        },
        Shape {
            table: "full_identity",
            prelude: "",
            key: &[("id", "bigint")],
            key_of: int_key,
            columns: TOAST_COLUMNS,
            after: "ALTER TABLE full_identity ALTER COLUMN body SET STORAGE EXTERNAL;
                    ALTER TABLE full_identity REPLICA IDENTITY FULL;",
            rarely_updated: &["body"],
            partition_by: "",
            key_updates: true,
        },
        Shape {
            table: "part_orders",
            prelude: "",
            key: &[("id", "bigint"), ("region", "text")],
            key_of: |n| vec![n.to_string(), format!("'{}'", ["eu", "us", "apac"][(n % 3) as usize])],
            columns: TOAST_COLUMNS,
            after: "CREATE TABLE part_orders_eu PARTITION OF part_orders FOR VALUES IN ('eu');
                    CREATE TABLE part_orders_us PARTITION OF part_orders FOR VALUES IN ('us');
                    CREATE TABLE part_orders_apac PARTITION OF part_orders FOR VALUES IN ('apac')
                        PARTITION BY HASH (id);
                    CREATE TABLE part_orders_apac_0 PARTITION OF part_orders_apac FOR VALUES WITH (MODULUS 2, REMAINDER 0);
                    CREATE TABLE part_orders_apac_1 PARTITION OF part_orders_apac FOR VALUES WITH (MODULUS 2, REMAINDER 1);
                    ALTER TABLE part_orders ALTER COLUMN body SET STORAGE EXTERNAL;",
            rarely_updated: &["body"],
            partition_by: "PARTITION BY LIST (region)",
            key_updates: true,
        },
    ]
}

impl Shape {
    fn ddl(&self) -> String {
        let mut cols: Vec<String> = self
            .key
            .iter()
            .map(|(c, t)| format!("{c} {t} NOT NULL"))
            .collect();
        cols.extend(self.columns.iter().map(|(c, t, _)| format!("{c} {t}")));
        let key: Vec<&str> = self.key.iter().map(|(c, _)| *c).collect();
        format!(
            "{}\nCREATE TABLE {} ({}, PRIMARY KEY ({})) {};\n{}\n\
             CREATE TRIGGER count_event AFTER INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW EXECUTE FUNCTION count_event();\n",
            self.prelude,
            self.table,
            cols.join(", "),
            key.join(", "),
            self.partition_by,
            self.after,
            self.table,
        )
    }

    fn key_match(&self, n: i64) -> String {
        self.key
            .iter()
            .zip((self.key_of)(n))
            .map(|((c, _), v)| format!("{c} = {v}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// The value of column `c` for variant `v`.
    fn value(column: &Column, v: usize) -> &'static str {
        column.2[v % column.2.len()]
    }

    fn insert(&self, n: i64, v: usize) -> String {
        let mut names: Vec<&str> = self.key.iter().map(|(c, _)| *c).collect();
        names.extend(self.columns.iter().map(|(c, _, _)| *c));
        let mut values = (self.key_of)(n);
        // Each column cycles with its own period, so rows mix the edge values.
        values.extend(
            self.columns
                .iter()
                .enumerate()
                .map(|(i, col)| Self::value(col, v + i).to_string()),
        );
        format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
            self.table,
            names.join(", "),
            values.join(", ")
        )
    }

    fn update(&self, n: i64, v: usize) -> String {
        let all = v.is_multiple_of(4);
        let sets: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, (c, _, _))| all || !self.rarely_updated.contains(c))
            .map(|(i, col)| format!("{} = {}", col.0, Self::value(col, v + 2 * i + 1)))
            .collect();
        format!(
            "UPDATE {} SET {} WHERE {}",
            self.table,
            sets.join(", "),
            self.key_match(n)
        )
    }

    fn delete(&self, n: i64) -> String {
        format!("DELETE FROM {} WHERE {}", self.table, self.key_match(n))
    }
}

/// Counts every row change of the captured tables, in the same transaction,
/// into a table capture does not capture: the exact number of change events.
const COUNTER: &str = "
    CREATE TABLE expected_events (n integer NOT NULL);
    CREATE FUNCTION count_event() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- A primary-key update goes out as a delete and a create. (A row
        -- moving between partitions fires the delete and insert triggers.)
        IF TG_OP = 'UPDATE' AND to_jsonb(NEW) -> 'id' IS DISTINCT FROM to_jsonb(OLD) -> 'id' THEN
            INSERT INTO expected_events VALUES (2);
        ELSE
            INSERT INTO expected_events VALUES (1);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TABLE oncely_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));";

/// Rows per table before capture starts (the initial snapshot).
const SEED_ROWS: i64 = 120;
/// Snapshot chunk size: small, so snapshots span many chunks and kills.
const CHUNK: usize = 25;

fn schema(shapes: &[Shape]) -> String {
    let mut sql = COUNTER.to_string();
    for s in shapes {
        sql.push_str(&s.ddl());
    }
    sql
}

/// One transaction of random changes to random shapes.
fn random_transaction(shapes: &[Shape], next: &mut i64) -> String {
    let mut rng = rand::rng();
    let mut sql = String::from("BEGIN;\n");
    for _ in 0..rng.random_range(1..6) {
        let s = &shapes[rng.random_range(0..shapes.len())];
        let v = rng.random_range(0..1000);
        let existing = rng.random_range(1..*next);
        let stmt = match rng.random_range(0..11) {
            0..=3 => {
                *next += 1;
                s.insert(*next, v)
            }
            10 if s.key_updates => {
                // A new key for an existing row: its unchanged TOASTed
                // values must reach the targets under the new key.
                *next += 1;
                format!(
                    "UPDATE {} SET id = {} WHERE {}",
                    s.table,
                    *next,
                    s.key_match(existing)
                )
            }
            10 => s.update(existing, v),
            4..=8 => s.update(existing, v),
            _ => s.delete(existing),
        };
        sql.push_str(&stmt);
        sql.push_str(";\n");
    }
    sql.push_str("COMMIT;");
    sql
}

/// Key of the 20 MiB row, beyond the keys the random workload touches.
const BIG_KEY: i64 = 1_000_000;

/// A 20 MiB row in `toast_docs`: inserted before the signalled snapshot
/// (which reads it again), then updated with its body unchanged, then given
/// a new key (the create must carry the 20 MiB value, read back from the
/// source), all while processes are killed.
#[derive(Default)]
struct BigRows {
    done: usize,
}

impl BigRows {
    async fn step(
        &mut self,
        writer: &tokio_postgres::Client,
        shapes: &[Shape],
        elapsed: Duration,
        seconds: u64,
    ) -> Result<()> {
        if !shapes.iter().any(|s| s.table == "toast_docs") {
            return Ok(());
        }
        let steps = [
            (
                seconds / 4,
                format!(
                    "INSERT INTO toast_docs (id, rev, body, note) VALUES ({BIG_KEY}, 1, \
                     (SELECT string_agg(md5(random()::text || g), '') \
                      FROM generate_series(1, {}) g), 'big')",
                    20 * 1024 * 1024 / 32
                ),
            ),
            (
                seconds / 2,
                format!(
                    "UPDATE toast_docs SET rev = 2, note = 'big, updated' WHERE id = {BIG_KEY}"
                ),
            ),
            (
                seconds * 2 / 3,
                format!(
                    "UPDATE toast_docs SET id = {} WHERE id = {BIG_KEY}",
                    BIG_KEY + 1
                ),
            ),
        ];
        if let Some((at, sql)) = steps.get(self.done) {
            if elapsed > Duration::from_secs(*at) {
                writer.batch_execute(sql).await.context("20 MiB row")?;
                self.done += 1;
            }
        }
        Ok(())
    }
}

async fn run_suite(name: &str, shapes: Vec<Shape>, seconds: u64, min_kills: usize) -> Result<()> {
    let tables: Vec<&str> = shapes.iter().map(|s| s.table).collect();
    let include = format!("public\\\\.({})", tables.join("|"));
    let p = Pipeline::new(
        name,
        &schema(&shapes),
        &tables,
        &format!(
            "snapshot.mode = \"initial\"\nincremental.snapshot.chunk.size = {CHUNK}\n\
             batch.max.events = 200\nbatch.max.ms = 20\n\
             signal.data.collection = \"public.oncely_signal\"\n\
             table.include.list = \"{include}\"\npublication.autocreate.mode = \"filtered\"\n\
             topic.creation.default.max.message.bytes = 33554432\n"
        ),
    )
    .await?;
    let result = drive(&p, &shapes, seconds, min_kills).await;
    if result.is_err() {
        eprintln!("logs in {}", p.env.dir.display());
    }
    p.cleanup().await;
    result
}

async fn drive(p: &Pipeline, shapes: &[Shape], seconds: u64, min_kills: usize) -> Result<()> {
    // Rows that exist before capture starts: the initial snapshot reads them.
    let mut seed = String::new();
    for s in shapes {
        for n in 1..=SEED_ROWS {
            seed.push_str(&s.insert(n, n as usize));
            seed.push_str(";\n");
        }
    }
    // The seed is read by the initial snapshot, not streamed: not counted.
    seed.push_str("DELETE FROM expected_events;");
    p.env.client.batch_execute(&seed).await.context("seed")?;
    let mut next = SEED_ROWS;

    // Changes committed before the slot exists are snapshot rows, not events.
    let mut fleet = Fleet::with_capture(p).await?;
    // The sinks start once every topic exists, so the kills below never meet
    // a group whose assignment predates a topic (a restarted static member
    // gets such a topic only at the runner's ownership check, a few seconds
    // later: sinks/src/runner/ownership.rs).
    let topics = p.topics();
    capture::wait_for(&topics, Duration::from_secs(120), |seen| {
        topics.iter().all(|t| seen.iter().any(|r| &r.topic == t))
    })
    .await?;
    fleet.spawn_sinks()?;
    let writer = p.env.connect().await?;
    let started = Instant::now();
    let mut last_kill = Instant::now();
    let mut signalled = false;
    let mut big_rows = BigRows::default();
    let kills = |f: &Fleet| f.kills.iter().sum::<usize>();
    while started.elapsed() < Duration::from_secs(seconds) || kills(&fleet) < min_kills {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(seconds * 4 + 60),
            "the chaos loop did not finish: {}",
            fleet.summary()
        );
        writer
            .batch_execute(&random_transaction(shapes, &mut next))
            .await
            .context("workload")?;
        big_rows
            .step(&writer, shapes, started.elapsed(), seconds)
            .await?;
        if !signalled && started.elapsed() > Duration::from_secs(seconds / 3) {
            // A signalled snapshot of every table while the rows keep changing.
            let list: Vec<String> = shapes
                .iter()
                .map(|s| format!("\"public.{}\"", s.table))
                .collect();
            writer
                .execute(
                    "INSERT INTO oncely_signal VALUES ($1, 'execute-snapshot', $2)",
                    &[
                        &"conformance-1",
                        &format!("{{\"data-collections\": [{}]}}", list.join(", ")),
                    ],
                )
                .await?;
            signalled = true;
        }
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(5..40))).await;
        if last_kill.elapsed() > Duration::from_millis(rand::rng().random_range(900..2500)) {
            fleet.supervise()?;
            fleet.kill_random()?;
            last_kill = Instant::now();
        }
    }
    fleet.supervise()?;
    if shapes.iter().any(|s| s.table == "toast_docs") {
        anyhow::ensure!(big_rows.done == 3, "the 20 MiB row's steps did not all run");
    }
    eprintln!(
        "conformance: {}s, {} kills ({}), {} rows inserted",
        started.elapsed().as_secs(),
        kills(&fleet),
        fleet.summary(),
        next
    );

    let report = p.verify(Duration::from_secs(300)).await?;
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
    assert!(
        report.is_equal(),
        "targets differ ({}); logs in {}:\n{report}",
        fleet.summary(),
        p.env.dir.display()
    );
    assert_eq!(report.compared(), shapes.len() * 3, "{report}");

    let expected = expected_events(&p.env.client).await?;
    let topics = p.topics();
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    eprintln!("topics: {scan:?}; expected {expected} streamed events");
    assert_eq!(scan.unversioned, 0, "events without a source position");
    assert_eq!(
        scan.duplicate_count, 0,
        "changes in Kafka more than once, e.g. {:?}",
        scan.duplicates
    );
    assert_eq!(
        scan.events - scan.reads,
        expected as u64,
        "streamed change events in Kafka vs changes committed"
    );
    assert!(
        scan.reads >= SEED_ROWS as u64 * shapes.len() as u64,
        "snapshot rows: {} for {} seeded rows",
        scan.reads,
        SEED_ROWS as usize * shapes.len()
    );
    for child in fleet.procs.iter_mut().flatten() {
        capture::kill9(child);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_converges_under_sigkills() -> Result<()> {
    run_suite("conformance", shapes(), 45, 12).await
}

/// Snapshot chunks are read with `COPY (SELECT ...) TO STDOUT`, or through a
/// cursor when the snapshot has a filter; every value of every shape must
/// be, byte for byte, what the same SELECT gives as text through the simple
/// protocol (what pgoutput sends too), so that chunk rows and streamed rows
/// go through the same conversion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_reads_give_what_a_select_gives() -> Result<()> {
    let env = capture::CaptureEnv::new("conformance_copy").await?;
    let result = chunk_reads_give_what_a_select_gives_body(&env).await;
    env.cleanup().await;
    result
}

async fn chunk_reads_give_what_a_select_gives_body(env: &capture::CaptureEnv) -> Result<()> {
    use oncely_capture::testing::TupleValue;
    use oncely_capture::testing::{chunk, chunk_query, KeyColumn};

    let shapes = shapes();
    env.client.batch_execute(&schema(&shapes)).await?;
    let mut seed = String::new();
    for s in &shapes {
        for n in 1..=SEED_ROWS {
            seed.push_str(&s.insert(n, n as usize));
            seed.push_str(";\n");
        }
    }
    env.client.batch_execute(&seed).await.context("seed")?;
    let cfg = oncely_capture::config::CaptureConfig::parse(&env.config(""), "test")?;
    let conn = chunk::connect(&cfg).await?;
    let mut values = 0;
    for s in &shapes {
        let keys: Vec<String> = s.key.iter().map(|(c, _)| c.to_string()).collect();
        let read = |filter: Option<&str>| {
            let req = chunk::ChunkRequest {
                id: format!("conformance-copy-{}", s.table),
                schema: "public".into(),
                table: s.table.into(),
                key_columns: keys.clone(),
                after: None,
                filter: filter.map(str::to_string),
                size: 10_000,
            };
            let conn = &conn;
            async move {
                chunk::read_chunk(conn, &req)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", s.table))
            }
        };
        let copied = read(None).await?;
        let cursor = read(Some("true")).await?;
        let columns: Vec<String> = copied
            .relation
            .columns
            .iter()
            .map(|c| c.name.clone())
            .collect();
        let key: Vec<KeyColumn> = keys
            .iter()
            .map(|k| KeyColumn {
                name: k.clone(),
                type_name: String::new(),
            })
            .collect();
        let sql = chunk_query("public", s.table, &columns, &key, None, None, 10_001);
        let selected: Vec<_> = conn
            .simple_query(&sql)
            .await?
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .collect();
        anyhow::ensure!(
            copied.rows.len() as i64 == SEED_ROWS
                && cursor.rows.len() as i64 == SEED_ROWS
                && selected.len() as i64 == SEED_ROWS,
            "{}: {} rows by COPY, {} by the cursor, {} by SELECT, {SEED_ROWS} seeded",
            s.table,
            copied.rows.len(),
            cursor.rows.len(),
            selected.len()
        );
        for (path, rows) in [("COPY", &copied.rows), ("cursor", &cursor.rows)] {
            for (read, row) in rows.iter().zip(&selected) {
                for (i, value) in read.0.iter().enumerate() {
                    let got = match value {
                        TupleValue::Text(b) => Some(b.as_ref()),
                        TupleValue::Null => None,
                        other => anyhow::bail!("{}: {path} gave {other:?}", s.table),
                    };
                    anyhow::ensure!(
                        got == row.get(i).map(str::as_bytes),
                        "{}.{} by {path}: {:?}, SELECT: {:?}",
                        s.table,
                        columns[i],
                        got.map(String::from_utf8_lossy),
                        row.get(i)
                    );
                    values += 1;
                }
            }
        }
    }
    // Every shape's every value, both ways.
    anyhow::ensure!(
        values > 2 * 6 * SEED_ROWS as usize,
        "only {values} values compared"
    );
    Ok(())
}
