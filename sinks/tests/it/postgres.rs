//! The postgres sink against the real PostgreSQL of `scripts/services`: replays,
//! tombstones, TOAST, schema evolution and typing, rejected records, truncates, history.
//! Each test writes into a database of its own.

use std::sync::Arc;

use oncely_core::wire::UNAVAILABLE_VALUE as UNAVAILABLE;
use oncely_sinks::event::{decode_key, decode_value};
use oncely_sinks::kinds::postgres::{DeleteMode, PostgresConfig, PostgresSink};
use oncely_sinks::{Batch, Record, Sink, SinkError, TopicPartition};
use oncely_testkit::kafka::unique;
use serde_json::{json, Value};
use tokio_postgres::{Client, NoTls};

const TOPIC: &str = "shop.public.items";

fn pg_url() -> String {
    match std::env::var("ONCELY_PG_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_PG_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

/// The server URL with another database name.
fn db_url(db: &str) -> String {
    let base = pg_url();
    let (head, tail) = base
        .split_once('?')
        .map_or((base.as_str(), ""), |(h, t)| (h, t));
    let cut = head
        .rfind('/')
        .filter(|i| head[..*i].contains("//") && *i > head.find("//").unwrap_or(0) + 1);
    let server = cut.map_or(head, |i| &head[..i]);
    if tail.is_empty() {
        format!("{server}/{db}")
    } else {
        format!("{server}/{db}?{tail}")
    }
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A warehouse database of its own and a client to inspect it.
struct Warehouse {
    name: String,
    url: String,
    client: Client,
}

impl Warehouse {
    async fn new() -> Self {
        let name = unique("wh");
        connect(&pg_url())
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let url = db_url(&name);
        Self {
            client: connect(&url).await,
            name,
            url,
        }
    }

    /// Drops the database (closing the sink's connections); call at the end of a passing test.
    async fn drop(self) {
        drop(self.client);
        connect(&pg_url())
            .await
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await
            .expect("drop database");
    }

    fn config(&self) -> PostgresConfig {
        PostgresConfig::new(self.url.clone())
    }

    async fn sink(&self, tweak: impl FnOnce(&mut PostgresConfig)) -> PostgresSink {
        let mut c = self.config();
        tweak(&mut c);
        c.validate().expect("valid config");
        PostgresSink::connect(&c).await.expect("sink")
    }

    /// Every row of `table` (all columns, as JSON), ordered by `id`.
    async fn rows(&self, table: &str) -> Vec<Value> {
        self.client
            .query(
                &format!("SELECT to_jsonb(t) FROM {table} t ORDER BY id"),
                &[],
            )
            .await
            .expect("select")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn live(&self, table: &str) -> Vec<Value> {
        self.client
            .query(
                &format!("SELECT to_jsonb(t) - '__oncely_lsn' - '__oncely_seq' - '__oncely_deleted' - '__oncely_unavailable' FROM {table} t WHERE NOT __oncely_deleted ORDER BY id"),
                &[],
            )
            .await
            .expect("select")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn column_type(&self, table: &str, column: &str) -> String {
        self.client
            .query_one(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $2",
                &[&table, &column],
            )
            .await
            .expect("column")
            .get(0)
    }
}

/// A record from key and value JSON, as the runner decodes it.
fn record(offset: i64, key: Option<Value>, value: Option<Value>) -> Record {
    let (k, v) = (key.map(|k| k.to_string()), value.map(|v| v.to_string()));
    let payload = decode_value(v.as_deref().map(str::as_bytes)).expect("value");
    let key = decode_key(k.as_deref().map(str::as_bytes)).expect("key");
    Record::new(offset, key, payload).with_raw(
        k.as_deref().map(str::as_bytes),
        v.as_deref().map(str::as_bytes),
    )
}

/// A change of row `id` of `public.items` at version (lsn, 1), without schemas.
fn change(offset: i64, id: i64, op: &str, row: Value, lsn: u64) -> Record {
    let (before, after) = match op {
        "d" => (json!({"id": id}), Value::Null),
        _ => (Value::Null, row),
    };
    let value = json!({"before": before, "after": after, "op": op, "ts_ms": 1,
        "source": {"schema": "public", "table": "items", "commit_lsn": lsn, "event_seq": 1}});
    record(offset, Some(json!({"id": id})), Some(value))
}

fn batch(records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from(TOPIC), 0), records, next)
}

async fn position(sink: &PostgresSink) -> Option<i64> {
    let tp = TopicPartition::new(TOPIC, 0);
    sink.load_positions("g", std::slice::from_ref(&tp))
        .await
        .expect("positions")
        .get(&tp)
        .copied()
}

#[tokio::test]
async fn replaying_a_batch_or_an_older_batch_leaves_the_target_unchanged() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let older = batch(vec![
        change(0, 1, "c", json!({"id": 1, "name": "a", "qty": 1}), 100),
        change(1, 2, "c", json!({"id": 2, "name": "b", "qty": 2}), 110),
        change(2, 3, "c", json!({"id": 3, "name": "c", "qty": 3}), 120),
        change(3, 1, "u", json!({"id": 1, "name": "a2", "qty": 10}), 130),
    ]);
    let newer = batch(vec![
        change(4, 1, "u", json!({"id": 1, "name": "a3", "qty": 11}), 200),
        change(5, 2, "d", Value::Null, 210),
        change(6, 4, "c", json!({"id": 4, "name": "d", "qty": 4}), 220),
    ]);
    sink.apply(&older).await.expect("older");
    sink.apply(&newer).await.expect("newer");
    let expected = wh.rows("public_items").await;
    assert_eq!(
        wh.live("public_items").await,
        vec![
            json!({"id": 1, "name": "a3", "qty": 11}),
            json!({"id": 3, "name": "c", "qty": 3}),
            json!({"id": 4, "name": "d", "qty": 4}),
        ]
    );
    assert_eq!(position(&sink).await, Some(7));
    sink.apply(&newer).await.expect("newer again");
    assert_eq!(wh.rows("public_items").await, expected, "same batch twice");
    sink.apply(&older).await.expect("older after newer");
    assert_eq!(
        wh.rows("public_items").await,
        expected,
        "older batch after newer"
    );
    assert_eq!(wh.column_type("public_items", "qty").await, "bigint");
    wh.drop().await;
}

#[tokio::test]
async fn deleted_rows_stay_deleted_when_older_events_replay() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let insert = batch(vec![change(0, 1, "c", json!({"id": 1, "name": "x"}), 100)]);
    sink.apply(&insert).await.expect("insert");
    sink.apply(&batch(vec![change(1, 1, "d", Value::Null, 200)]))
        .await
        .expect("delete");
    sink.apply(&insert).await.expect("replayed insert");
    sink.apply(&batch(vec![change(
        0,
        1,
        "u",
        json!({"id": 1, "name": "y"}),
        150,
    )]))
    .await
    .expect("replayed update");
    assert_eq!(wh.live("public_items").await, Vec::<Value>::new());
    let rows = wh.rows("public_items").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["__oncely_deleted"], json!(true));
    assert_eq!(rows[0]["__oncely_lsn"], json!(200));
    // A delete of a row never seen leaves a tombstone too.
    sink.apply(&batch(vec![change(2, 9, "d", Value::Null, 300)]))
        .await
        .expect("delete unseen");
    sink.apply(&batch(vec![change(
        0,
        9,
        "c",
        json!({"id": 9, "name": "z"}),
        250,
    )]))
    .await
    .expect("older insert");
    assert_eq!(wh.live("public_items").await, Vec::<Value>::new());

    // Hard deletes remove the row, and so lose the protection (documented).
    let hard = Warehouse::new().await;
    let sink = hard.sink(|c| c.delete_mode = DeleteMode::Hard).await;
    sink.apply(&insert).await.expect("insert");
    sink.apply(&batch(vec![change(1, 1, "d", Value::Null, 200)]))
        .await
        .expect("delete");
    assert_eq!(hard.rows("public_items").await, Vec::<Value>::new());
    sink.apply(&insert).await.expect("replayed insert");
    assert_eq!(
        hard.live("public_items").await.len(),
        1,
        "hard delete: resurrected"
    );
    hard.drop().await;
    wh.drop().await;
}

#[tokio::test]
async fn unavailable_toast_values_keep_the_stored_value() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let body = "b".repeat(5000);
    sink.apply(&batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, "body": body, "rev": 0}),
        100,
    )]))
    .await
    .expect("insert");
    sink.apply(&batch(vec![
        change(
            1,
            1,
            "u",
            json!({"id": 1, "body": UNAVAILABLE, "rev": 1}),
            200,
        ),
        change(
            2,
            1,
            "u",
            json!({"id": 1, "body": UNAVAILABLE, "rev": 2}),
            210,
        ),
        change(3, 2, "c", json!({"id": 2, "body": "short", "rev": 0}), 220),
        change(
            4,
            2,
            "u",
            json!({"id": 2, "body": UNAVAILABLE, "rev": 1}),
            230,
        ),
    ]))
    .await
    .expect("updates");
    assert_eq!(
        wh.live("public_items").await,
        vec![
            json!({"id": 1, "body": body, "rev": 2}),
            json!({"id": 2, "body": "short", "rev": 1})
        ]
    );
    wh.drop().await;
}

#[tokio::test]
async fn a_new_source_column_appears_in_the_target_and_nothing_is_dropped() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    sink.apply(&batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, "a": "x", "gone": 5}),
        100,
    )]))
    .await
    .expect("first");
    sink.apply(&batch(vec![change(
        1,
        2,
        "c",
        json!({"id": 2, "a": "y", "b": 2.5}),
        200,
    )]))
    .await
    .expect("with a new column");
    assert_eq!(
        wh.column_type("public_items", "b").await,
        "double precision"
    );
    assert_eq!(
        wh.live("public_items").await,
        vec![
            json!({"id": 1, "a": "x", "b": null, "gone": 5}),
            json!({"id": 2, "a": "y", "b": 2.5, "gone": null}),
        ]
    );
    wh.drop().await;
}

#[tokio::test]
async fn connect_schemas_type_the_target_columns() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let fixture: Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/envelope/insert_all_types.json"
    ))
    .expect("fixture");
    let b = Batch::new(
        Arc::from("g"),
        (Arc::from("shop.public.all_types"), 0),
        vec![record(
            0,
            Some(fixture["key"].clone()),
            Some(fixture["value"].clone()),
        )],
        1,
    );
    sink.apply(&b).await.expect("typed insert");
    let types = [
        ("id", "bigint"),
        ("c_bool", "boolean"),
        ("c_int2", "smallint"),
        ("c_int4", "integer"),
        ("c_float4", "real"),
        ("c_numeric", "numeric(12,2)"),
        ("c_money", "numeric"),
        ("c_varchar", "character varying(32)"),
        ("c_timestamptz", "timestamp with time zone"),
        ("c_timestamp", "timestamp without time zone"),
        ("c_date", "date"),
        ("c_time", "time without time zone"),
        ("c_timetz", "time with time zone"),
        ("c_interval", "interval"),
        ("c_bytea", "bytea"),
        ("c_jsonb", "jsonb"),
        ("c_uuid", "uuid"),
        ("c_int4_array", "integer[]"),
        ("c_text_array", "text[]"),
    ];
    for (column, ty) in types {
        assert_eq!(
            wh.column_type("public_all_types", column).await,
            ty,
            "{column}"
        );
    }
    let row = wh
        .client
        .query_one(
            "SELECT c_timestamp::text, c_date::text, c_numeric::text, c_timestamptz = '2026-11-27T15:10:35.670111Z', \
             c_time::text, c_interval::text, encode(c_bytea, 'hex'), c_text_array::text, c_timestamp_inf::text, c_float8_nan::text \
             FROM public_all_types",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), "2026-11-27 15:10:35.670111");
    assert_eq!(row.get::<_, String>(1), "2026-11-27");
    assert_eq!(row.get::<_, String>(2), "12345678.90");
    assert!(row.get::<_, bool>(3));
    assert_eq!(row.get::<_, String>(4), "15:10:35.670111");
    // Exact values: months, days and time as the source had them,
    // not '10303:05:06.789'.
    assert_eq!(row.get::<_, String>(5), "1 year 2 mons 3 days 04:05:06.789");
    assert_eq!(row.get::<_, String>(6), "0001feff");
    assert_eq!(row.get::<_, String>(7), r#"{plain,"a,b","x\"y",NULL}"#);
    assert_eq!(row.get::<_, String>(8), "infinity");
    assert_eq!(row.get::<_, String>(9), "NaN");
    // PostgreSQL's extremes (docs/design.md, "Dates, times and intervals"), each as the source held it:
    // compared by PostgreSQL's `=` and by the text (interval `=` calls
    // '1 mon' and '30 days' equal; the text does not).
    let extremes = [
        (
            "c_interval_neg",
            "interval",
            "-1 years -2 mons +3 days -04:05:06.789",
        ),
        ("c_interval_huge", "interval", "-178000000 years"),
        (
            "c_timestamptz_bc",
            "timestamptz",
            "0044-03-15 12:00:00+00 BC",
        ),
        (
            "c_timestamptz_max",
            "timestamptz",
            "294276-12-31 23:59:59.999999+00",
        ),
        ("c_timestamptz_neg_inf", "timestamptz", "-infinity"),
        ("c_timestamp_bc", "timestamp", "4713-01-01 00:00:00 BC"),
        ("c_timestamp_neg_inf", "timestamp", "-infinity"),
        ("c_date_bc", "date", "4713-01-01 BC"),
        ("c_date_max", "date", "5874897-12-31"),
        ("c_date_inf", "date", "infinity"),
        ("c_time_24", "time", "24:00:00"),
        ("c_timetz_24", "timetz", "24:00:00+00"),
    ];
    for (column, ty, want) in extremes {
        // timestamptz's text follows the session's time zone: `=` only.
        let text = if ty == "timestamptz" {
            "NULL::text".to_owned()
        } else {
            format!("{column}::text")
        };
        let sql = format!("SELECT {column} = '{want}'::{ty}, {text} FROM public_all_types");
        let row = wh.client.query_one(&sql, &[]).await.expect(column);
        assert!(
            row.get::<_, Option<bool>>(0).unwrap_or(false),
            "{column}: {:?} in the warehouse, want {want}",
            row.get::<_, Option<String>>(1)
        );
        if ty != "timestamptz" {
            assert_eq!(
                row.get::<_, Option<String>>(1).as_deref(),
                Some(want),
                "{column}"
            );
        }
    }
    wh.drop().await;
}

#[tokio::test]
async fn type_conflicts_and_refused_values_are_rejected_alone_with_a_reason() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    sink.apply(&batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, "n": 1}),
        100,
    )]))
    .await
    .expect("bigint column");
    // Schemas off, a JSON boolean where the target has bigint (a JSON value
    // says nothing of its type, so the column is not changed): a type
    // conflict, found before writing. (A typed one moves the column to a new
    // generation: see the end.)
    let b = batch(vec![
        change(1, 3, "c", json!({"id": 3, "n": 3}), 150),
        change(2, 2, "c", json!({"id": 2, "n": true}), 200),
    ]);
    let Err(SinkError::Rejected(failures)) = sink.apply(&b).await else {
        panic!("expected a rejected record");
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].offset, 2);
    assert!(
        failures[0].reason.contains("type conflict") && failures[0].reason.contains("`n`"),
        "{}",
        failures[0].reason
    );
    assert_eq!(
        wh.live("public_items").await.len(),
        1,
        "nothing of the batch was written"
    );
    assert_eq!(position(&sink).await, Some(1));

    // Schemaless text into a bigint column: PostgreSQL refuses it; only that record is named.
    let b = batch(vec![
        change(3, 4, "c", json!({"id": 4, "n": 4}), 300),
        change(4, 5, "c", json!({"id": 5, "n": "five"}), 310),
        change(5, 6, "c", json!({"id": 6, "n": 6}), 320),
    ]);
    let Err(SinkError::Rejected(failures)) = sink.apply(&b).await else {
        panic!("expected a rejected record");
    };
    assert_eq!(
        failures.iter().map(|f| f.offset).collect::<Vec<_>>(),
        vec![4]
    );
    assert!(
        failures[0].reason.contains("22P02"),
        "{}",
        failures[0].reason
    );
    assert_eq!(
        wh.live("public_items").await.len(),
        1,
        "nothing of the batch was written"
    );
    // The runner then applies the rest.
    let mut rest = b.clone();
    rest.remove_offsets(&[4]);
    sink.apply(&rest).await.expect("the rest");
    let ids: Vec<Value> = wh
        .live("public_items")
        .await
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(1), json!(4), json!(6)]);
    assert_eq!(position(&sink).await, Some(6));

    // Schema says boolean where the target has bigint, neither type taking
    // the other's values: the column moves to a new generation (the bigint
    // one retired), no dead letter. An event from before it (an older
    // version, typed bigint) writes the retired column and moves nothing back.
    let typed = |offset: i64, id: i64, n: Value, ty: &str, lsn: u64| {
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": []},
                {"field": "after", "type": "struct", "optional": true, "fields": [
                    {"field": "id", "type": "int64"}, {"field": "n", "type": ty, "optional": true}]}]},
            "payload": {"before": null, "after": {"id": id, "n": n}, "op": "c",
                "source": {"schema": "public", "table": "items", "commit_lsn": lsn, "event_seq": 1}}});
        record(offset, Some(json!({"id": id})), Some(value))
    };
    sink.apply(&batch(vec![typed(6, 2, json!(true), "boolean", 400)]))
        .await
        .expect("a new generation");
    sink.apply(&batch(vec![typed(7, 7, json!(7), "int64", 350)]))
        .await
        .expect("an event from before the generation");
    let rows: Vec<Value> = wh.live("public_items").await;
    let pick = |id: i64| {
        let r = rows.iter().find(|r| r["id"] == json!(id)).expect("row");
        (r["n"].clone(), r["__oncely_g1_n"].clone())
    };
    assert_eq!(pick(1), (Value::Null, json!(1)), "{rows:?}");
    assert_eq!(pick(2), (json!(true), Value::Null), "{rows:?}");
    assert_eq!(pick(7), (Value::Null, json!(7)), "{rows:?}");
    assert_eq!(position(&sink).await, Some(8));
    wh.drop().await;
}

/// An event of `public.items` with a typed schema: `id` int64, `a` of Connect
/// type `a_type`, `amount` a decimal string of numeric(`p`,`s`), `s` a varchar(`len`).
fn typed_items(
    offset: i64,
    row: Value,
    lsn: u64,
    a_type: &str,
    p: u32,
    s: u32,
    len: u32,
) -> Record {
    let param = |k: &str, v: String| (format!("__debezium.source.column.{k}"), Value::from(v));
    let numeric: serde_json::Map<String, Value> = [
        param("type", "NUMERIC".into()),
        param("length", p.to_string()),
        param("scale", s.to_string()),
    ]
    .into_iter()
    .collect();
    let varchar: serde_json::Map<String, Value> = [
        param("type", "VARCHAR".into()),
        param("length", len.to_string()),
    ]
    .into_iter()
    .collect();
    let fields = json!([
        {"field": "id", "type": "int64"},
        {"field": "a", "type": a_type, "optional": true},
        {"field": "amount", "type": "string", "optional": true, "parameters": numeric},
        {"field": "s", "type": "string", "optional": true, "parameters": varchar}]);
    let id = row["id"].clone();
    let value = json!({
        "schema": {"type": "struct", "fields": [
            {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
            {"field": "after", "type": "struct", "optional": true, "fields": fields}]},
        "payload": {"before": null, "after": row, "op": "c",
            "source": {"schema": "public", "table": "items", "commit_lsn": lsn, "event_seq": 1}}});
    record(offset, Some(json!({"id": id})), Some(value))
}

#[tokio::test]
async fn columns_widen_to_a_wider_source_type_and_values_are_never_rounded() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let before = json!({"id": 1, "a": 5, "amount": "1.23", "s": "abc"});
    sink.apply(&batch(vec![typed_items(0, before, 100, "int32", 10, 2, 5)]))
        .await
        .expect("first events");
    assert_eq!(wh.column_type("public_items", "a").await, "integer");
    assert_eq!(
        wh.column_type("public_items", "amount").await,
        "numeric(10,2)"
    );
    // After ALTER TYPE bigint, numeric(12,4), varchar(10) at the source; one
    // batch holds rows from before and after the change.
    let b = batch(vec![
        typed_items(
            1,
            json!({"id": 2, "a": 6, "amount": "2.50", "s": "de"}),
            200,
            "int32",
            10,
            2,
            5,
        ),
        typed_items(
            2,
            json!({"id": 3, "a": 3_000_000_000_i64, "amount": "1.2345", "s": "abcdefghij"}),
            300,
            "int64",
            12,
            4,
            10,
        ),
    ]);
    sink.apply(&b)
        .await
        .expect("wider events are written, not dead-lettered");
    assert_eq!(wh.column_type("public_items", "a").await, "bigint");
    assert_eq!(
        wh.column_type("public_items", "amount").await,
        "numeric(12,4)"
    );
    assert_eq!(
        wh.column_type("public_items", "s").await,
        "character varying(10)"
    );
    let row = wh
        .client
        .query_one(
            "SELECT a, amount::text, s FROM public_items WHERE id = 3",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, i64>(0), 3_000_000_000);
    assert_eq!(row.get::<_, String>(1), "1.2345");
    assert_eq!(row.get::<_, String>(2), "abcdefghij");
    // A narrower event changes nothing: its values fit.
    sink.apply(&batch(vec![typed_items(
        3,
        json!({"id": 4, "a": 7, "amount": "3.10", "s": "x"}),
        400,
        "int32",
        10,
        2,
        5,
    )]))
    .await
    .expect("narrower events");
    assert_eq!(
        wh.column_type("public_items", "amount").await,
        "numeric(12,4)"
    );
    // A value the column would round is refused with a reason, never rounded.
    let b = batch(vec![typed_items(
        4,
        json!({"id": 5, "a": 8, "amount": "1.23456", "s": "y"}),
        500,
        "int64",
        12,
        4,
        10,
    )]);
    let Err(SinkError::Rejected(failures)) = sink.apply(&b).await else {
        panic!("expected the rounded value to be refused");
    };
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0]
            .reason
            .contains("does not fit numeric(12,4) without rounding"),
        "{}",
        failures[0].reason
    );
    wh.drop().await;
}

/// A change of `public.items` whose `tm` is a `MicroTime`, as Debezium's
/// MySQL connector sends a TIME.
fn time_change(offset: i64, id: i64, micros: i64) -> Record {
    let fields = json!([
        {"field": "id", "type": "int64"},
        {"field": "tm", "type": "int64", "optional": true,
            "name": "io.debezium.time.MicroTime", "version": 1}]);
    let value = json!({
        "schema": {"type": "struct", "fields": [
            {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
            {"field": "after", "type": "struct", "optional": true, "fields": fields}]},
        "payload": {"before": null, "after": {"id": id, "tm": micros}, "op": "c",
            "source": {"schema": "public", "table": "items", "commit_lsn": 100 + id, "event_seq": 1}}});
    record(offset, Some(json!({"id": id})), Some(value))
}

/// MySQL's TIME runs from -838:59:59 to 838:59:59: a value outside the day
/// is refused with a reason (the record's dead letter), never wrapped into
/// another time of day; the others of the batch land, `24:00:00` too.
#[tokio::test]
async fn a_time_outside_the_day_is_refused_not_wrapped() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let hour = 3_600_000_000_i64;
    let b = batch(vec![
        time_change(0, 1, hour),
        time_change(1, 2, -hour),
        time_change(2, 3, 25 * hour),
        time_change(3, 4, 24 * hour),
    ]);
    let Err(SinkError::Rejected(failures)) = sink.apply(&b).await else {
        panic!("expected the times outside the day to be refused");
    };
    let mut refused: Vec<i64> = failures.iter().map(|f| f.offset).collect();
    refused.sort();
    assert_eq!(refused, [1, 2], "{failures:?}");
    assert!(
        failures[0]
            .reason
            .contains("is outside the day a time holds"),
        "{}",
        failures[0].reason
    );
    // The runner then applies the rest.
    let mut rest = b.clone();
    rest.remove_offsets(&refused);
    sink.apply(&rest).await.expect("the rest");
    let rows: Vec<(i64, String)> = wh
        .client
        .query("SELECT id, tm::text FROM public_items ORDER BY id", &[])
        .await
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        rows,
        [(1, "01:00:00".to_owned()), (4, "24:00:00".to_owned())]
    );
    wh.drop().await;
}

#[tokio::test]
async fn a_table_created_beforehand_gets_the_sink_columns() {
    let wh = Warehouse::new().await;
    wh.client
        .batch_execute(
            "CREATE TABLE public_items (id bigint PRIMARY KEY, v text);
             INSERT INTO public_items VALUES (1, 'old'), (2, 'kept')",
        )
        .await
        .expect("pre-created table");
    let sink = wh.sink(|_| {}).await;
    sink.apply(&batch(vec![change(
        0,
        1,
        "u",
        json!({"id": 1, "v": "new"}),
        100,
    )]))
    .await
    .expect("upsert into a pre-created table");
    assert_eq!(
        wh.live("public_items").await,
        vec![json!({"id": 1, "v": "new"}), json!({"id": 2, "v": "kept"})]
    );
    wh.drop().await;
}

#[tokio::test]
async fn truncate_tombstones_older_rows_only() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let truncate = json!({"before": null, "after": null, "op": "t",
        "source": {"schema": "public", "table": "items", "commit_lsn": 150, "event_seq": 1}});
    let first = batch(vec![
        change(0, 1, "c", json!({"id": 1, "v": 1}), 100),
        change(1, 2, "c", json!({"id": 2, "v": 2}), 110),
        record(2, None, Some(truncate)),
        change(3, 3, "c", json!({"id": 3, "v": 3}), 160),
    ]);
    sink.apply(&first).await.expect("batch with a truncate");
    assert_eq!(
        wh.live("public_items").await,
        vec![json!({"id": 3, "v": 3})]
    );
    sink.apply(&first).await.expect("replayed");
    assert_eq!(
        wh.live("public_items").await,
        vec![json!({"id": 3, "v": 3})]
    );
    wh.drop().await;
}

#[tokio::test]
async fn history_holds_each_change_once_across_replays() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|c| c.history_enabled = true).await;
    let b = batch(vec![
        change(0, 1, "c", json!({"id": 1, "v": 1}), 100),
        change(1, 1, "u", json!({"id": 1, "v": 2}), 110),
        change(2, 1, "d", Value::Null, 120),
        record(3, Some(json!({"id": 1})), None),
    ]);
    sink.apply(&b).await.expect("first");
    sink.apply(&b).await.expect("replay");
    let rows = wh
        .client
        .query(
            "SELECT lsn, op, after->>'v', kafka_offset FROM public_items_history ORDER BY lsn",
            &[],
        )
        .await
        .expect("history");
    let got: Vec<(i64, String, Option<String>, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got,
        vec![
            (100, "c".into(), Some("1".into()), 0),
            (110, "u".into(), Some("2".into()), 1),
            (120, "d".into(), None, 2),
        ]
    );
    wh.drop().await;
}

/// A Debezium snapshot row of `public.items` (no `commit_lsn`): every row of
/// one snapshot has the snapshot's `source.lsn`.
fn debezium_snapshot_row(offset: i64, id: i64, lsn: u64) -> Record {
    let value = json!({"before": null, "after": {"id": id, "v": id}, "op": "r", "ts_ms": 1,
        "source": {"connector": "postgresql", "snapshot": "true", "schema": "public",
            "table": "items", "sequence": format!("[null,\"{lsn}\"]"), "lsn": lsn}});
    record(offset, Some(json!({"id": id})), Some(value))
}

#[tokio::test]
async fn history_keeps_every_row_of_a_debezium_snapshot_once() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|c| c.history_enabled = true).await;
    let b = batch(
        (0..4)
            .map(|i| debezium_snapshot_row(i, i + 1, 500))
            .collect(),
    );
    sink.apply(&b).await.expect("first");
    sink.apply(&b).await.expect("replay");
    let rows = wh
        .client
        .query(
            "SELECT lsn, after->>'v', kafka_offset FROM public_items_history ORDER BY kafka_offset",
            &[],
        )
        .await
        .expect("history");
    let got: Vec<(i64, Option<String>, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want: Vec<(i64, Option<String>, i64)> = (0..4)
        .map(|i| (500, Some((i + 1).to_string()), i))
        .collect();
    assert_eq!(got, want, "every snapshot row, once");
    wh.drop().await;
}

/// Applies `batch` as the runner does: `prepare` first, then `apply`.
async fn apply_prepared(sink: &PostgresSink, mut batch: Batch) -> Result<(), SinkError> {
    sink.prepare(&mut batch);
    sink.apply(&batch).await
}

/// An update of row `id` of `public.items`, schemaless: the column types are
/// inferred (bigint, double precision, boolean, text).
fn typed_change(offset: i64, id: i64, row: Value, lsn: u64) -> Record {
    change(offset, id, "u", row, lsn)
}

/// The all-types fixture (Connect schemas) of `public.all_types` at commit LSN `lsn`.
fn all_types(offset: i64, lsn: u64) -> Batch {
    let mut fixture: Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/envelope/insert_all_types.json"
    ))
    .expect("fixture");
    fixture["value"]["payload"]["source"]["commit_lsn"] = json!(lsn);
    Batch::new(
        Arc::from("g"),
        (Arc::from("shop.public.all_types"), 0),
        vec![record(
            offset,
            Some(fixture["key"].clone()),
            Some(fixture["value"].clone()),
        )],
        offset + 1,
    )
}

#[tokio::test]
async fn prepared_batches_write_exactly_what_unprepared_batches_write() {
    // The same batches into two warehouses, with and without `prepare`: once the
    // table is known, prepared batches of one group are written with the
    // statement built and encoded in `prepare`; the rows must be identical.
    let batches = || {
        vec![
            vec![
                typed_change(
                    0,
                    1,
                    json!({"id": 1, "name": "a", "qty": 1, "price": 1.5, "ok": true}),
                    100,
                ),
                typed_change(
                    1,
                    2,
                    json!({"id": 2, "name": "b", "qty": 2, "price": 2.5, "ok": false}),
                    101,
                ),
            ],
            // Updates, a null, a new key and an older change of key 1 in the same batch.
            vec![
                typed_change(
                    2,
                    1,
                    json!({"id": 1, "name": null, "qty": 10, "price": -0.25, "ok": null}),
                    200,
                ),
                typed_change(
                    3,
                    3,
                    json!({"id": 3, "name": "c é", "qty": -3, "price": 1e300, "ok": true}),
                    201,
                ),
                typed_change(
                    4,
                    1,
                    json!({"id": 1, "name": "old", "qty": 0, "price": 0.0, "ok": false}),
                    150,
                ),
            ],
            // Replayed older changes: must change nothing.
            vec![typed_change(
                5,
                2,
                json!({"id": 2, "name": "stale", "qty": 0, "price": 0.0, "ok": true}),
                101,
            )],
            // Schemaless events of the same table: columns typed by the target.
            vec![
                change(
                    6,
                    2,
                    "u",
                    json!({"id": 2, "name": "b2", "qty": 20, "price": 7.0, "ok": true}),
                    300,
                ),
                change(
                    7,
                    4,
                    "c",
                    json!({"id": 4, "name": "d", "qty": 4, "price": 4.0, "ok": false}),
                    301,
                ),
            ],
            // Deletes (tombstones), then unavailable values.
            vec![
                change(8, 3, "d", Value::Null, 400),
                change(9, 4, "d", Value::Null, 401),
            ],
            vec![
                change(
                    10,
                    2,
                    "u",
                    json!({"id": 2, "name": UNAVAILABLE, "qty": 21, "price": 7.5, "ok": false}),
                    500,
                ),
                change(
                    11,
                    1,
                    "u",
                    json!({"id": 1, "name": UNAVAILABLE, "qty": 11, "price": 1.0, "ok": true}),
                    501,
                ),
            ],
        ]
    };
    let (plain_wh, prepared_wh) = (Warehouse::new().await, Warehouse::new().await);
    let (plain, prepared) = (plain_wh.sink(|_| {}).await, prepared_wh.sink(|_| {}).await);
    for (records_a, records_b) in batches().into_iter().zip(batches()) {
        plain.apply(&batch(records_a)).await.expect("unprepared");
        apply_prepared(&prepared, batch(records_b))
            .await
            .expect("prepared");
        assert_eq!(
            prepared_wh.rows("public_items").await,
            plain_wh.rows("public_items").await
        );
    }
    assert_eq!(position(&prepared).await, Some(12));
    assert_eq!(
        prepared.prebuilt_statements_used(),
        5,
        "every batch but the first (which created the table) used its prebuilt statement"
    );
    // Every type of the fixture (Connect schemas), through the prebuilt statement.
    for lsn in [1_000, 2_000] {
        plain.apply(&all_types(20, lsn)).await.expect("unprepared");
        apply_prepared(&prepared, all_types(20, lsn))
            .await
            .expect("prepared");
    }
    assert_eq!(prepared.prebuilt_statements_used(), 6);
    assert_eq!(
        prepared_wh.rows("public_all_types").await,
        plain_wh.rows("public_all_types").await
    );
    assert_eq!(plain.prebuilt_statements_used(), 0);
    let rows = prepared_wh.live("public_items").await;
    assert_eq!(
        rows,
        vec![
            json!({"id": 1, "name": null, "qty": 11, "price": 1, "ok": true}),
            json!({"id": 2, "name": "b2", "qty": 21, "price": 7.5, "ok": false}),
        ]
    );
    plain_wh.drop().await;
    prepared_wh.drop().await;
}

#[tokio::test]
async fn a_statement_prepared_before_the_table_changed_is_not_used() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    sink.apply(&batch(vec![change(
        0,
        1,
        "c",
        json!({"id": 1, "name": "a"}),
        100,
    )]))
    .await
    .expect("create");
    let mut ahead = batch(vec![change(2, 1, "u", json!({"id": 1, "name": "c"}), 300)]);
    sink.prepare(&mut ahead);
    // Another batch adds a column before the prepared one is applied: the
    // catalog's table is then another, and `apply` builds its own statement.
    sink.apply(&batch(vec![change(
        1,
        2,
        "c",
        json!({"id": 2, "name": "b", "extra": 5}),
        200,
    )]))
    .await
    .expect("new column");
    sink.apply(&ahead)
        .await
        .expect("prepared before the change");
    assert_eq!(sink.prebuilt_statements_used(), 0);
    assert_eq!(
        wh.live("public_items").await,
        vec![
            json!({"id": 1, "name": "c", "extra": null}),
            json!({"id": 2, "name": "b", "extra": 5}),
        ]
    );
    // A batch prepared now is written with its prebuilt statement.
    apply_prepared(
        &sink,
        batch(vec![change(
            3,
            2,
            "u",
            json!({"id": 2, "name": "b3", "extra": 6}),
            400,
        )]),
    )
    .await
    .expect("prepared after");
    assert_eq!(sink.prebuilt_statements_used(), 1);
    assert_eq!(position(&sink).await, Some(4));
    wh.drop().await;
}

#[tokio::test]
async fn arrays_of_dates_times_and_timestamps_become_typed_array_columns() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let item = |ty: &str, name: &str| json!({"type": ty, "name": name, "optional": true});
    let fields = json!([
        {"field": "id", "type": "int64"},
        {"field": "da", "type": "array", "optional": true, "items": item("int32", "io.debezium.time.Date")},
        {"field": "ta", "type": "array", "optional": true, "items": item("int64", "io.debezium.time.MicroTimestamp")},
        {"field": "tm", "type": "array", "optional": true, "items": item("int64", "io.debezium.time.MicroTime")}]);
    let event = |offset: i64, id: i64, row: Value| {
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
                {"field": "after", "type": "struct", "optional": true, "fields": fields.clone()}]},
            "payload": {"before": null, "after": row, "op": "c",
                "source": {"schema": "public", "table": "items", "commit_lsn": 10 + offset, "event_seq": 1}}});
        record(offset, Some(json!({"id": id})), Some(value))
    };
    sink.apply(&batch(vec![
        event(
            0,
            1,
            json!({"id": 1, "da": [20454, 10956], "ta": [946684800000000_i64, -1],
                "tm": [0, 86400000000_i64]}),
        ),
        event(
            1,
            2,
            json!({"id": 2, "da": [[20454, null], [-719528, "infinity"]], "ta": [], "tm": null}),
        ),
    ]))
    .await
    .expect("typed arrays");
    for (column, ty) in [
        ("da", "date[]"),
        ("ta", "timestamp without time zone[]"),
        ("tm", "time without time zone[]"),
    ] {
        assert_eq!(wh.column_type("public_items", column).await, ty, "{column}");
    }
    let rows = wh
        .client
        .query(
            "SELECT da = '{2026-01-01,1999-12-31}'::date[], \
                    ta = '{2000-01-01 00:00:00,1969-12-31 23:59:59.999999}'::timestamp[], \
                    tm = '{00:00:00,24:00:00}'::time[], da::text, ta::text, tm::text \
             FROM public_items ORDER BY id",
            &[],
        )
        .await
        .expect("rows");
    assert!(
        rows[0].get::<_, bool>(0),
        "{:?}",
        rows[0].get::<_, String>(3)
    );
    assert!(
        rows[0].get::<_, bool>(1),
        "{:?}",
        rows[0].get::<_, String>(4)
    );
    assert!(
        rows[0].get::<_, bool>(2),
        "{:?}",
        rows[0].get::<_, String>(5)
    );
    assert_eq!(
        rows[1].get::<_, String>(3),
        "{{2026-01-01,NULL},{\"0001-01-01 BC\",infinity}}"
    );
    assert_eq!(rows[1].get::<_, String>(4), "{}");
    assert_eq!(rows[1].get::<_, Option<String>>(5), None);
    wh.drop().await;
}

#[tokio::test]
async fn non_finite_numbers_and_addresses_reach_typed_columns() {
    let wh = Warehouse::new().await;
    // The user typed the addresses; the sink creates the rest.
    wh.client
        .batch_execute(
            "CREATE TABLE public_items (id bigint PRIMARY KEY, ip inet, nets cidr[], mac macaddr)",
        )
        .await
        .expect("table");
    let sink = wh.sink(|_| {}).await;
    let fields = json!([
        {"field": "id", "type": "int64"},
        {"field": "f4", "type": "float", "optional": true},
        {"field": "f8", "type": "double", "optional": true},
        {"field": "n", "type": "string", "optional": true,
            "parameters": {"__debezium.source.column.type": "NUMERIC"}},
        {"field": "n2", "type": "string", "optional": true,
            "parameters": {"__debezium.source.column.type": "NUMERIC",
                "__debezium.source.column.length": "12", "__debezium.source.column.scale": "2"}},
        {"field": "ip", "type": "string", "optional": true},
        {"field": "nets", "type": "array", "optional": true, "items": {"type": "string", "optional": true}},
        {"field": "mac", "type": "string", "optional": true}]);
    let event = |offset: i64, row: Value| {
        let id = row["id"].clone();
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
                {"field": "after", "type": "struct", "optional": true, "fields": fields.clone()}]},
            "payload": {"before": null, "after": row, "op": "c",
                "source": {"schema": "public", "table": "items", "commit_lsn": 10 + offset, "event_seq": 1}}});
        record(offset, Some(json!({"id": id})), Some(value))
    };
    sink.apply(&batch(vec![
        event(
            0,
            json!({"id": 1, "f4": "NaN", "f8": 1e308, "n": "NaN", "n2": "NaN",
                "ip": "::1", "nets": ["::1/128", "10.0.0.0/8"], "mac": "08:00:2b:01:02:03"}),
        ),
        event(
            1,
            json!({"id": 2, "f4": "Infinity", "f8": "-Infinity", "n": "-Infinity", "n2": "11.25",
                "ip": "10.1.2.3/8", "nets": [], "mac": null}),
        ),
        event(
            2,
            json!({"id": 3, "f4": 3.4028235e38, "f8": -2.5e-300, "n": "Infinity", "n2": null,
                "ip": "2001:db8::1/64", "nets": null, "mac": null}),
        ),
    ]))
    .await
    .expect("every row lands");
    let rows = wh
        .client
        .query(
            "SELECT f4::text, f8::text, n::text, n2::text, ip::text, nets::text, \
                    format_type(atttypid, atttypmod) \
             FROM public_items, pg_attribute \
             WHERE attrelid = 'public_items'::regclass AND attname = 'f8' ORDER BY id",
            &[],
        )
        .await
        .expect("rows");
    let text = |r: usize, c: usize| rows[r].get::<_, Option<String>>(c);
    assert_eq!(text(0, 6).as_deref(), Some("double precision"));
    assert_eq!(
        (0..6).map(|c| text(0, c)).collect::<Vec<_>>(),
        [
            Some("NaN"),
            Some("1e+308"),
            Some("NaN"),
            Some("NaN"),
            Some("::1/128"),
            Some("{::1/128,10.0.0.0/8}")
        ]
        .map(|s| s.map(str::to_owned))
    );
    assert_eq!(text(1, 0).as_deref(), Some("Infinity"));
    assert_eq!(text(1, 1).as_deref(), Some("-Infinity"));
    assert_eq!(text(1, 2).as_deref(), Some("-Infinity"));
    assert_eq!(text(1, 4).as_deref(), Some("10.1.2.3/8"));
    assert_eq!(text(2, 0).as_deref(), Some("3.4028235e+38"));
    assert_eq!(text(2, 1).as_deref(), Some("-2.5e-300"));
    assert_eq!(text(2, 2).as_deref(), Some("Infinity"));
    wh.drop().await;
}

#[tokio::test]
async fn millisecond_and_nanosecond_timestamps_keep_every_digit() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let field = |name: &str, logical: &str| json!({"field": name, "type": "int64", "name": logical, "optional": true});
    let fields = json!([
        {"field": "id", "type": "int64"},
        field("ms", "io.debezium.time.Timestamp"),
        field("ns", "io.debezium.time.NanoTimestamp")]);
    let event = |offset: i64, id: i64, ms: i64, ns: i64| {
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
                {"field": "after", "type": "struct", "optional": true, "fields": fields.clone()}]},
            "payload": {"before": null, "after": {"id": id, "ms": ms, "ns": ns}, "op": "c",
                "source": {"schema": "public", "table": "stamps", "commit_lsn": 10 + offset, "event_seq": 1}}});
        record(offset, Some(json!({"id": id})), Some(value))
    };
    sink.apply(&batch(vec![
        // PostgreSQL's first and last milliseconds; int64's nanosecond ends.
        event(0, 1, -210_866_803_199_999, i64::MIN),
        event(1, 2, 9_224_318_015_999_999, i64::MAX),
        event(2, 3, -1, -1),
    ]))
    .await
    .expect("timestamps");
    let rows = wh
        .client
        .query(
            "SELECT ms::text, ns::text FROM public_stamps ORDER BY id",
            &[],
        )
        .await
        .expect("rows");
    let got: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want = [
        ("4714-11-24 00:00:00.001 BC", "1677-09-21 00:12:43.145224"),
        ("294276-12-31 23:59:59.999", "2262-04-11 23:47:16.854775"),
        ("1969-12-31 23:59:59.999", "1969-12-31 23:59:59.999999"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want);
    wh.drop().await;
}

/// A change of row `id` of `schema.table` at version (lsn, 1), without schemas.
fn change_of(offset: i64, [schema, table]: [&str; 2], id: i64, lsn: u64) -> Record {
    let value = json!({"before": null, "after": {"id": id, "v": id}, "op": "c", "ts_ms": 1,
        "source": {"schema": schema, "table": table, "commit_lsn": lsn, "event_seq": 1}});
    record(offset, Some(json!({"id": id})), Some(value))
}

/// The sink's own tables are claimed like mirror tables: a source table
/// whose mirror would be another table's history table (`public.orders_history`
/// beside `public.orders` with history on, in either order) or the positions
/// table (`oncely.positions`) is a fatal error naming both and the setting to
/// change, before anything is written; the tables keep what they held.
#[tokio::test]
async fn source_tables_named_like_history_or_positions_tables_are_refused() {
    let wh = Warehouse::new().await;
    let orders = ["public", "orders"];
    let orders_history = ["public", "orders_history"];
    let refused = |e: SinkError, want: &[&str]| {
        let text = e.to_string();
        assert!(e.is_quarantine(), "{e:?}");
        for w in want {
            assert!(text.contains(w), "{w} missing from: {text}");
        }
    };

    let sink = wh.sink(|c| c.history_enabled = true).await;
    sink.apply(&batch(vec![change_of(0, orders, 1, 100)]))
        .await
        .expect("orders");
    let e = sink
        .apply(&batch(vec![change_of(1, orders_history, 2, 110)]))
        .await
        .expect_err("orders_history's mirror is the history of orders");
    refused(
        e,
        &[
            "\"public\".\"orders\"",
            "\"public\".\"orders_history\"",
            "public_orders_history",
            "sink.history.table.name.format",
            "sink.table.name.format",
        ],
    );
    let history = wh
        .client
        .query_one("SELECT count(*) FROM public_orders_history", &[])
        .await
        .expect("history")
        .get::<_, i64>(0);
    assert_eq!(history, 1, "the history table holds orders' change only");
    assert_eq!(position(&sink).await, Some(1));
    drop(sink);

    // The other order: the mirror first, then the table whose history it would be.
    let sink = wh.sink(|c| c.history_enabled = true).await;
    sink.apply(&batch(vec![change_of(1, orders_history, 2, 110)]))
        .await
        .expect_err("orders_history first, in a new sink: refused too");
    drop(sink);
    let sink = wh.sink(|c| c.history_enabled = true).await;
    sink.apply(&batch(vec![change_of(1, orders, 2, 110)]))
        .await
        .expect("orders alone");

    // The positions table is the sink's from the start.
    let e = sink
        .apply(&batch(vec![change_of(2, ["oncely", "positions"], 3, 120)]))
        .await
        .expect_err("oncely.positions mirrors into the positions table");
    refused(
        e,
        &[
            "\"oncely\".\"positions\"",
            "oncely_positions",
            "sink.positions.table",
        ],
    );
    assert_eq!(position(&sink).await, Some(2));
    drop(sink);
    wh.drop().await;
}

/// A one-way type change (`date` → `timestamptz`: a timestamp column takes
/// every date) whose cast fails on a value the column holds (a date beyond
/// the timestamp range) moves the column to a new generation instead of
/// dead-lettering the new rows.
#[tokio::test]
async fn a_type_change_whose_cast_fails_on_a_held_value_moves_the_column_to_a_new_generation() {
    let wh = Warehouse::new().await;
    let sink = wh.sink(|_| {}).await;
    let date =
        json!({"field": "d", "type": "int32", "name": "io.debezium.time.Date", "optional": true});
    let zoned = json!({"field": "d", "type": "string", "name": "io.debezium.time.ZonedTimestamp", "optional": true});
    let typed = |offset: i64, id: i64, d: Value, field: &Value, lsn: u64| {
        let fields = json!([{"field": "id", "type": "int64"}, field]);
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": fields.clone()},
                {"field": "after", "type": "struct", "optional": true, "fields": fields}]},
            "payload": {"before": null, "after": {"id": id, "d": d}, "op": "c",
                "source": {"schema": "public", "table": "items", "commit_lsn": lsn, "event_seq": 1}}});
        record(offset, Some(json!({"id": id})), Some(value))
    };
    // 200,000,000 days: a date about 549,000 AD, beyond any timestamp.
    sink.apply(&batch(vec![
        typed(0, 1, json!(200_000_000), &date, 100),
        typed(1, 2, json!(19_723), &date, 110),
    ]))
    .await
    .expect("dates");
    sink.apply(&batch(vec![typed(
        2,
        3,
        json!("2024-01-01T00:00:00Z"),
        &zoned,
        300,
    )]))
    .await
    .expect("a new generation, no dead letter");
    // Replayed, from before the change: the live column takes a date (as
    // midnight, the cast the source made), so it goes there.
    sink.apply(&batch(vec![typed(3, 4, json!(19_724), &date, 120)]))
        .await
        .expect("an event from before the generation");
    let types: Vec<(String, String)> = wh
        .client
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_name = 'public_items' AND column_name IN ('d', '__oncely_g1_d') ORDER BY 1",
            &[],
        )
        .await
        .expect("columns")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        types,
        vec![
            ("__oncely_g1_d".to_owned(), "date".to_owned()),
            ("d".to_owned(), "timestamp with time zone".to_owned())
        ]
    );
    let held: Vec<(i64, bool, bool)> = wh
        .client
        .query(
            "SELECT id, d IS NULL, \"__oncely_g1_d\" IS NULL FROM public_items ORDER BY id",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        held,
        vec![
            (1, true, false),
            (2, true, false),
            (3, false, true),
            (4, false, true)
        ]
    );
    assert_eq!(position(&sink).await, Some(4));
    wh.drop().await;
}

/// `fields.exclude` on the warehouse (the sink as `oncely sink` builds it):
/// the column is added to neither the mirror nor the history table, and its
/// values are in neither, through a create, an update with the value
/// unchanged TOAST, a create and a delete carrying a full old row.
#[tokio::test]
async fn an_excluded_column_reaches_neither_the_mirror_nor_the_history() {
    const MARKER: &str = "MARKER7f3a";
    let wh = Warehouse::new().await;
    let mut c = wh.config();
    c.history_enabled = true;
    c.fields_exclude = vec!["secret".into()];
    let sink = oncely_sinks::kinds::SinkConfig::Postgres(c)
        .build()
        .await
        .expect("sink");
    let full_delete = json!({"before": {"id": 2, "v": 1, "secret": MARKER}, "after": null,
        "op": "d", "ts_ms": 1,
        "source": {"schema": "public", "table": "items", "commit_lsn": 130, "event_seq": 1}});
    let mut b = batch(vec![
        change(0, 1, "c", json!({"id": 1, "v": 1, "secret": MARKER}), 100),
        change(
            1,
            1,
            "u",
            json!({"id": 1, "v": 2, "secret": UNAVAILABLE}),
            110,
        ),
        change(2, 2, "c", json!({"id": 2, "v": 1, "secret": MARKER}), 120),
        record(3, Some(json!({"id": 2})), Some(full_delete)),
    ]);
    sink.prepare(&mut b);
    sink.apply(&b).await.expect("applied");
    assert_eq!(
        wh.live("public_items").await,
        vec![json!({"id": 1, "v": 2})]
    );
    let columns: i64 = wh
        .client
        .query_one(
            "SELECT count(*) FROM information_schema.columns WHERE column_name = 'secret'",
            &[],
        )
        .await
        .expect("columns")
        .get(0);
    assert_eq!(columns, 0, "a warehouse table has the excluded column");
    let everything: String = wh
        .client
        .query_one(
            "SELECT (SELECT string_agg(to_jsonb(t)::text, ' ') FROM public_items t) || ' ' ||
                    (SELECT string_agg(to_jsonb(h)::text, ' ') FROM public_items_history h)",
            &[],
        )
        .await
        .expect("rows")
        .get(0);
    assert!(
        !everything.contains(MARKER) && everything.contains("\"v\": 2"),
        "{everything}"
    );
    wh.drop().await;
}
