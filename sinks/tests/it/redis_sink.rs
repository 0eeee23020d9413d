//! The `redis` sink against the real Redis of `scripts/services` (never mocks):
//! versions never regress under replays and reordering, positions are stored
//! with the data, deletes leave tombstones, unchanged TOAST values stay,
//! `NOSCRIPT` is survived, a key of another type is a per-record failure,
//! truncates remove the rows older than them (and only those) through the
//! table's key set; a runner that lost its partition writes nothing, and
//! the transaction path's cache of versions follows other writers and
//! truncates.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use oncely_core::wire::UNAVAILABLE_VALUE;
use oncely_sinks::event::decode_value;
use oncely_sinks::kinds::redis::config::DEFAULT_VERSION_FIELD;
use oncely_sinks::kinds::redis::{encode_version, Layout, RedisConfig, RedisSink};
use oncely_sinks::native::ValueFormat;
use oncely_sinks::{Batch, Record, Sink, SinkError, TopicPartition, Version};
use rand::seq::SliceRandom;
use rand::Rng;
use redis::aio::MultiplexedConnection;
use serde_json::{json, Map, Value};

fn redis_url() -> String {
    match std::env::var("ONCELY_REDIS_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_REDIS_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// A config whose keys all live under a fresh prefix.
fn config(layout: Layout) -> (RedisConfig, String) {
    let p = unique("oncely_test_redis");
    let mut c = RedisConfig::new(redis_url());
    c.layout = layout;
    c.key_pattern = format!("{p}:{{table}}:{{key}}");
    c.version_prefix = format!("{p}:v:");
    c.positions_prefix = format!("{p}:pos:");
    c.keyset_prefix = format!("{p}:ks:");
    c.fence_prefix = format!("{p}:fence:");
    (c, p)
}

async fn raw() -> MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A record of an oncely envelope for row `id` of table `t`.
fn record(offset: i64, id: i64, op: &str, row: Value, v: Version) -> Record {
    let (before, after) = if op == "d" {
        (json!({"id": id}), Value::Null)
    } else {
        (Value::Null, row)
    };
    let value = json!({
        "before": before, "after": after, "op": op,
        "source": {"schema": "public", "table": "t", "commit_lsn": v.lsn, "event_seq": v.seq},
    });
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("envelope");
    Record::new(offset, Some(json!({ "id": id })), payload)
}

fn batch(group: &str, partition: i32, records: Vec<Record>, next: i64) -> Batch {
    Batch::new(
        Arc::from(group),
        (Arc::from("topic-a"), partition),
        records,
        next,
    )
}

/// The row as the cache holds it, in either layout, as column -> text.
async fn cached(
    conn: &mut MultiplexedConnection,
    layout: Layout,
    key: &str,
) -> Option<BTreeMap<String, String>> {
    match layout {
        Layout::Hash => {
            let mut h: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .expect("HGETALL");
            if !h.is_empty() {
                assert!(
                    h.remove(DEFAULT_VERSION_FIELD).is_some(),
                    "{key}: a live row carries its version"
                );
            }
            (!h.is_empty()).then_some(h)
        }
        Layout::Json => {
            let s: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(conn)
                .await
                .expect("GET");
            s.map(|s| {
                let v: Map<String, Value> = serde_json::from_str(&s).expect("json row");
                v.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        (
                            k,
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string()),
                        )
                    })
                    .collect()
            })
        }
    }
}

/// The stored version of a row: a live hash row's version field, else the
/// version key (a JSON row's version, or the tombstone of a deleted row).
async fn stored_version(
    conn: &mut MultiplexedConnection,
    layout: Layout,
    p: &str,
    key: &str,
) -> Option<String> {
    if layout == Layout::Hash {
        let v: Option<String> = redis::cmd("HGET")
            .arg(key)
            .arg(DEFAULT_VERSION_FIELD)
            .query_async(conn)
            .await
            .expect("HGET");
        if v.is_some() {
            assert_eq!(
                get(conn, &format!("{p}:v:{key}")).await,
                None,
                "{key}: a live row has no tombstone"
            );
            return v;
        }
    }
    get(conn, &format!("{p}:v:{key}")).await
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

fn text_row(row: &Value) -> BTreeMap<String, String> {
    row.as_object()
        .expect("object")
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string()),
            )
        })
        .collect()
}

/// Random histories per key, applied in random chunks with older replays and
/// duplicates mixed in: the cache ends at each key's newest change, exactly.
async fn never_regresses(layout: Layout) {
    let (cfg, p) = config(layout);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let mut rng = rand::rng();
    // key -> its changes in version order: (version, op, row).
    let mut history: BTreeMap<i64, Vec<(Version, &'static str, Value)>> = BTreeMap::new();
    let mut lsn = 1000u64;
    for _ in 0..400 {
        let id = rng.random_range(1..=20);
        lsn += rng.random_range(1..5);
        let seq = rng.random_range(0..3);
        let op = match rng.random_range(0..10) {
            0..=1 => "d",
            2 => "c",
            _ => "u",
        };
        let row = json!({"id": id, "rev": lsn, "note": if rng.random_bool(0.2) { Value::Null } else { json!(format!("n{lsn}")) }});
        history
            .entry(id)
            .or_default()
            .push((Version::new(lsn, seq), op, row));
    }
    // In order, then replays of random older changes and exact duplicates.
    let mut all: Vec<(i64, Version, &'static str, Value)> = history
        .iter()
        .flat_map(|(id, h)| {
            h.iter()
                .map(move |(v, op, row)| (*id, *v, *op, row.clone()))
        })
        .collect();
    all.sort_by_key(|c| c.1);
    let mut stream = all.clone();
    let mut replays = all.clone();
    replays.shuffle(&mut rng);
    stream.extend(replays);
    stream.extend(all.iter().rev().cloned());
    let mut offset = 0i64;
    for (i, chunk) in stream.chunks(37).enumerate() {
        let records = chunk
            .iter()
            .map(|(id, v, op, row)| {
                offset += 1;
                record(offset, *id, op, row.clone(), *v)
            })
            .collect();
        let mut b = batch("g", 0, records, offset + 1);
        // Every other batch is planned ahead, as the runner does, and applied
        // twice: the second apply (a retry) finds the plan taken and plans again.
        if i % 2 == 1 {
            sink.prepare(&mut b);
            sink.apply(&b).await.expect("apply prepared");
        }
        sink.apply(&b).await.expect("apply");
    }
    // The table's key set (what truncates go through) holds exactly the rows that exist.
    let members: std::collections::BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}:ks:.public.t"))
        .query_async(&mut conn)
        .await
        .expect("SMEMBERS");
    let live: std::collections::BTreeSet<String> = history
        .iter()
        .filter(|(_, h)| h.iter().max_by_key(|c| c.0).is_some_and(|c| c.1 != "d"))
        .map(|(id, _)| format!("{p}:t:{id}"))
        .collect();
    assert_eq!(members, live, "key set");
    for (id, h) in &history {
        let (v, op, row) = h.iter().max_by_key(|c| c.0).expect("history");
        let key = format!("{p}:t:{id}");
        let got = cached(&mut conn, layout, &key).await;
        if *op == "d" {
            assert_eq!(got, None, "{key} deleted at {v}");
        } else {
            assert_eq!(got, Some(text_row(row)), "{key} at {v}");
        }
        assert_eq!(
            stored_version(&mut conn, layout, &p, &key).await,
            Some(encode_version(*v)),
            "{key}"
        );
    }
}

/// A sink that did not write the rows (a restart, a rebalance) reads what
/// they hold before writing: the fields a new image no longer has go, and a
/// tombstone still stops an older insert.
#[tokio::test]
async fn a_cold_cache_reads_stored_fields_and_tombstones() {
    let (cfg, p) = config(Layout::Hash);
    let v = |n: u64| Version::new(n, 0);
    let first = RedisSink::connect(&cfg).await.expect("sink");
    first
        .apply(&batch(
            "g",
            0,
            vec![
                record(0, 1, "c", json!({"id": 1, "a": "1", "b": "2"}), v(10)),
                record(1, 2, "c", json!({"id": 2, "a": "1"}), v(11)),
                record(2, 2, "d", Value::Null, v(12)),
            ],
            3,
        ))
        .await
        .expect("first sink");
    let second = RedisSink::connect(&cfg).await.expect("sink");
    second
        .apply(&batch(
            "g",
            0,
            vec![
                record(3, 1, "u", json!({"id": 1, "a": "3"}), v(13)),
                record(4, 2, "c", json!({"id": 2, "a": "old"}), v(11)),
            ],
            5,
        ))
        .await
        .expect("second sink");
    let mut conn = raw().await;
    let want: BTreeMap<String, String> = [("id", "1"), ("a", "3")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        Some(want)
    );
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:2")).await,
        None
    );
}

/// Rows added and deleted within one batch: the key set ends with exactly
/// the rows that exist (the transaction path adds a chunk's new rows with one
/// `SADD` per set, so a delete must send the pending ones before its `SREM`).
async fn key_set_follows_rows_within_a_batch(layout: Layout) {
    let (cfg, p) = config(layout);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let v = |n: u64| Version::new(n, 0);
    let row = |id: i64| json!({"id": id, "note": "x"});
    let records = vec![
        record(0, 1, "c", row(1), v(10)),
        record(1, 2, "c", row(2), v(11)),
        record(2, 1, "d", Value::Null, v(12)),
        record(3, 3, "c", row(3), v(13)),
        record(4, 3, "d", Value::Null, v(14)),
        record(5, 3, "c", row(3), v(15)),
    ];
    sink.apply(&batch("g", 0, records, 6)).await.expect("apply");
    let members: std::collections::BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}:ks:.public.t"))
        .query_async(&mut conn)
        .await
        .expect("SMEMBERS");
    let want: std::collections::BTreeSet<String> =
        [2, 3].iter().map(|id| format!("{p}:t:{id}")).collect();
    assert_eq!(members, want);
    assert_eq!(cached(&mut conn, layout, &format!("{p}:t:1")).await, None);
}

#[tokio::test]
async fn hash_key_sets_follow_rows_added_and_deleted_in_one_batch() {
    key_set_follows_rows_within_a_batch(Layout::Hash).await;
}

#[tokio::test]
async fn json_key_sets_follow_rows_added_and_deleted_in_one_batch() {
    key_set_follows_rows_within_a_batch(Layout::Json).await;
}

#[tokio::test]
async fn hash_rows_never_regress_under_replays_and_reordering() {
    never_regresses(Layout::Hash).await;
}

#[tokio::test]
async fn json_rows_never_regress_under_replays_and_reordering() {
    never_regresses(Layout::Json).await;
}

#[tokio::test]
async fn positions_are_stored_with_the_data_and_loaded_back() {
    let (mut cfg, p) = config(Layout::Hash);
    cfg.script_max_changes = 3; // a batch of 10 takes 4 calls; the last stores the position
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let tps = [
        TopicPartition::new("topic-a", 0),
        TopicPartition::new("topic-a", 1),
    ];
    assert!(sink
        .load_positions("g1", &tps)
        .await
        .expect("load")
        .is_empty());
    let records = (0..10)
        .map(|i| record(i, i, "c", json!({"id": i}), Version::new(50, i as u64)))
        .collect();
    sink.apply(&batch("g1", 0, records, 11))
        .await
        .expect("apply");
    // An empty batch (offsets skipped) still moves the position.
    sink.apply(&batch("g1", 1, vec![], 42))
        .await
        .expect("apply empty");
    let positions = sink.load_positions("g1", &tps).await.expect("load");
    assert_eq!(
        positions,
        HashMap::from([(tps[0].clone(), 11), (tps[1].clone(), 42)])
    );
    assert!(
        sink.load_positions("other", &tps)
            .await
            .expect("load")
            .is_empty(),
        "per group"
    );
    let mut conn = raw().await;
    for i in 0..10 {
        assert_eq!(
            cached(&mut conn, Layout::Hash, &format!("{p}:t:{i}")).await,
            Some(text_row(&json!({"id": i})))
        );
    }
    let fields: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(format!("{p}:pos:g1"))
        .query_async(&mut conn)
        .await
        .expect("positions");
    assert_eq!(
        fields,
        HashMap::from([("topic-a:0".into(), 11), ("topic-a:1".into(), 42)])
    );
}

#[tokio::test]
async fn deletes_keep_a_tombstone_that_stops_older_inserts() {
    let (mut cfg, p) = config(Layout::Hash);
    cfg.tombstone_ttl_seconds = 3600;
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    sink.apply(&batch(
        "g",
        0,
        vec![
            record(1, 1, "c", json!({"id": 1, "v": "a"}), Version::new(10, 0)),
            record(2, 1, "d", json!({"id": 1}), Version::new(11, 0)),
        ],
        3,
    ))
    .await
    .expect("apply");
    let key = format!("{p}:t:1");
    assert_eq!(cached(&mut conn, Layout::Hash, &key).await, None);
    let vkey = format!("{p}:v:{p}:t:1");
    assert_eq!(
        get(&mut conn, &vkey).await,
        Some(encode_version(Version::new(11, 0)))
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&vkey)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(
        (3_590_000..=3_600_000).contains(&pttl),
        "tombstone TTL {pttl}"
    );
    // A replay of the insert does not resurrect the row.
    sink.apply(&batch(
        "g",
        0,
        vec![record(
            1,
            1,
            "c",
            json!({"id": 1, "v": "a"}),
            Version::new(10, 0),
        )],
        3,
    ))
    .await
    .expect("replay");
    assert_eq!(cached(&mut conn, Layout::Hash, &key).await, None);
    // A newer insert does, and its version loses the tombstone's expiry.
    sink.apply(&batch(
        "g",
        0,
        vec![record(
            3,
            1,
            "c",
            json!({"id": 1, "v": "b"}),
            Version::new(12, 0),
        )],
        4,
    ))
    .await
    .expect("insert");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &key).await,
        Some(text_row(&json!({"id": 1, "v": "b"})))
    );
    // Its version lives in the row now; the superseded tombstone is gone.
    assert_eq!(get(&mut conn, &vkey).await, None, "tombstone removed");
    assert_eq!(
        stored_version(&mut conn, Layout::Hash, &p, &key).await,
        Some(encode_version(Version::new(12, 0)))
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert_eq!(pttl, -1, "a live row does not expire");
    // The replayed delete is older than the row now: nothing changes.
    sink.apply(&batch(
        "g",
        0,
        vec![record(2, 1, "d", json!({"id": 1}), Version::new(11, 0))],
        3,
    ))
    .await
    .expect("replayed delete");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &key).await,
        Some(text_row(&json!({"id": 1, "v": "b"})))
    );
}

#[tokio::test]
async fn rows_expire_with_ttl_seconds() {
    let (mut cfg, p) = config(Layout::Json);
    cfg.ttl_seconds = 100;
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    sink.apply(&batch(
        "g",
        0,
        vec![record(1, 1, "c", json!({"id": 1}), Version::new(10, 0))],
        2,
    ))
    .await
    .expect("apply");
    for key in [format!("{p}:t:1"), format!("{p}:v:{p}:t:1")] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!((99_000..=100_000).contains(&pttl), "{key}: {pttl}");
    }
}

async fn toast_is_kept(layout: Layout) {
    let (cfg, p) = config(layout);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let big = "x".repeat(5000);
    sink.apply(&batch(
        "g",
        0,
        vec![record(
            1,
            1,
            "c",
            json!({"id": 1, "rev": 1, "body": big}),
            Version::new(10, 0),
        )],
        2,
    ))
    .await
    .expect("insert");
    sink.apply(&batch(
        "g",
        0,
        vec![
            record(
                2,
                1,
                "u",
                json!({"id": 1, "rev": 2, "body": UNAVAILABLE_VALUE}),
                Version::new(11, 0),
            ),
            record(
                3,
                1,
                "u",
                json!({"id": 1, "rev": 3, "body": UNAVAILABLE_VALUE}),
                Version::new(12, 0),
            ),
        ],
        4,
    ))
    .await
    .expect("update");
    assert_eq!(
        cached(&mut conn, layout, &format!("{p}:t:1")).await,
        Some(text_row(&json!({"id": 1, "rev": 3, "body": big}))),
        "{layout:?}"
    );
}

#[tokio::test]
async fn unchanged_toast_values_keep_the_stored_value() {
    toast_is_kept(Layout::Hash).await;
    toast_is_kept(Layout::Json).await;
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded() {
    let (cfg, p) = config(Layout::Hash);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    // SCRIPT FLUSH is what a Redis restart does to the script cache.
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .expect("SCRIPT FLUSH");
    sink.apply(&batch(
        "g",
        0,
        vec![record(1, 1, "c", json!({"id": 1}), Version::new(10, 0))],
        2,
    ))
    .await
    .expect("apply after NOSCRIPT");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        Some(text_row(&json!({"id": 1})))
    );
}

#[tokio::test]
async fn a_key_of_another_type_is_rejected_and_no_position_stored() {
    let (cfg, p) = config(Layout::Hash);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    redis::cmd("SET")
        .arg(format!("{p}:t:2"))
        .arg("not a hash")
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");
    let records = vec![
        record(1, 1, "c", json!({"id": 1}), Version::new(10, 0)),
        record(2, 2, "c", json!({"id": 2}), Version::new(10, 1)),
    ];
    let err = sink
        .apply(&batch("g", 0, records, 3))
        .await
        .expect_err("WRONGTYPE");
    let failures = err.rejected().expect("rejected").to_vec();
    assert_eq!(
        failures.iter().map(|f| f.offset).collect::<Vec<_>>(),
        vec![2]
    );
    let tps = [TopicPartition::new("topic-a", 0)];
    assert!(sink
        .load_positions("g", &tps)
        .await
        .expect("load")
        .is_empty());
    assert!(matches!(err, SinkError::Rejected(_)));
    // Without the rejected record (as the runner does after dead-lettering it).
    let records = vec![record(1, 1, "c", json!({"id": 1}), Version::new(10, 0))];
    sink.apply(&batch("g", 0, records, 3))
        .await
        .expect("apply the rest");
    assert_eq!(
        sink.load_positions("g", &tps)
            .await
            .expect("load")
            .get(&tps[0]),
        Some(&3)
    );
}

#[tokio::test]
async fn bad_credentials_are_fatal() {
    let (mut cfg, _) = config(Layout::Hash);
    cfg.username = Some("nobody".into());
    cfg.password = Some(oncely_core::Secret::new("wrong"));
    match RedisSink::connect(&cfg).await {
        Err(e) => assert!(e.is_fatal(), "{e:?}"),
        Ok(_) => panic!("connected with a wrong password"),
    }
}

#[tokio::test]
async fn hash_rows_expire_with_ttl_seconds_and_carry_their_version() {
    let (mut cfg, p) = config(Layout::Hash);
    cfg.ttl_seconds = 100;
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    sink.apply(&batch(
        "g",
        0,
        vec![record(1, 1, "c", json!({"id": 1}), Version::new(10, 0))],
        2,
    ))
    .await
    .expect("apply");
    let key = format!("{p}:t:1");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!((99_000..=100_000).contains(&pttl), "{key}: {pttl}");
    assert_eq!(
        stored_version(&mut conn, Layout::Hash, &p, &key).await,
        Some(encode_version(Version::new(10, 0)))
    );
}

/// A truncate event of table `t` at `v`.
fn truncate_record(offset: i64, v: Version) -> Record {
    let value = json!({
        "before": null, "after": null, "op": "t",
        "source": {"schema": "public", "table": "t", "commit_lsn": v.lsn, "event_seq": v.seq},
    });
    Record::new(
        offset,
        None,
        decode_value(Some(value.to_string().as_bytes())).expect("envelope"),
    )
}

/// The copies of one truncate on two partitions: each removes the rows older
/// than it, in several calls (a key set of 300 rows, 3 members per call),
/// keeps the rows written after it by the other partition, and a replay
/// changes nothing.
async fn truncates_remove_older_rows(layout: Layout) {
    let (mut cfg, p) = config(layout);
    cfg.script_max_changes = 3;
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let row = |id: i64| json!({"id": id, "v": format!("row {id}")});
    let truncate = Version::new(20, 1);
    // Partition 0: 300 rows before the truncate.
    let before: Vec<Record> = (1..=300)
        .map(|id| record(id - 1, id, "c", row(id), Version::new(10, id as u64)))
        .collect();
    sink.apply(&batch("g", 0, before, 300)).await.expect("rows");
    // Partition 1: its copy of the truncate, then a row written after it.
    let p1 = || {
        batch(
            "g",
            1,
            vec![
                truncate_record(0, truncate),
                record(1, 5, "c", row(5), Version::new(20, 2)),
            ],
            2,
        )
    };
    sink.apply(&p1()).await.expect("truncate on partition 1");
    // Partition 0 reads one more row from before the truncate, then its copy.
    sink.apply(&batch(
        "g",
        0,
        vec![
            record(300, 7, "u", row(7), Version::new(15, 0)),
            truncate_record(301, truncate),
        ],
        302,
    ))
    .await
    .expect("truncate on partition 0");
    sink.apply(&p1()).await.expect("replay");
    for id in 1..=300 {
        let got = cached(&mut conn, layout, &format!("{p}:t:{id}")).await;
        if id == 5 {
            assert_eq!(
                got,
                Some(text_row(&row(5))),
                "the row after the truncate stays"
            );
        } else {
            assert_eq!(got, None, "row {id} is older than the truncate");
        }
    }
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}:ks:.public.t"))
        .query_async(&mut conn)
        .await
        .expect("SMEMBERS");
    assert_eq!(
        members,
        vec![format!("{p}:t:5")],
        "the key set holds the live rows"
    );
    let positions = sink
        .load_positions(
            "g",
            &[
                TopicPartition::new("topic-a", 0),
                TopicPartition::new("topic-a", 1),
            ],
        )
        .await
        .expect("positions");
    assert_eq!(
        positions.get(&TopicPartition::new("topic-a", 0)),
        Some(&302)
    );
    assert_eq!(positions.get(&TopicPartition::new("topic-a", 1)), Some(&2));
}

#[tokio::test]
async fn hash_truncates_remove_older_rows_only() {
    truncates_remove_older_rows(Layout::Hash).await;
}

#[tokio::test]
async fn json_truncates_remove_older_rows_only() {
    truncates_remove_older_rows(Layout::Json).await;
}

/// Non-finite floats, doubles at their limits, numerics and addresses are
/// cached as the exact text capture sent, in either layout.
async fn special_numbers_are_kept(layout: Layout) {
    let (cfg, p) = config(layout);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let rows = [
        json!({"id": 1, "f8": 1e308, "f4": "NaN", "n": "NaN", "ip": "::1"}),
        json!({"id": 2, "f8": -2.5e-300, "f4": "Infinity", "n": "-Infinity", "ip": "10.1.2.3/8"}),
        json!({"id": 3, "f8": "-Infinity", "f4": 3.4028235e38, "n": "11.2500", "ip": null}),
    ];
    let records = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let id = i as i64 + 1;
            record(id, id, "c", row.clone(), Version::new(10 + id as u64, 0))
        })
        .collect();
    sink.apply(&batch("g", 0, records, 4)).await.expect("rows");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            cached(&mut conn, layout, &format!("{p}:t:{}", i + 1)).await,
            Some(text_row(row)),
            "{layout:?}"
        );
    }
}

#[tokio::test]
async fn non_finite_floats_extreme_doubles_and_numerics_are_cached_exactly() {
    special_numbers_are_kept(Layout::Hash).await;
    special_numbers_are_kept(Layout::Json).await;
}

/// The Connect schema of a table with a column of each kind the native form
/// converts, and some it keeps (`total`, `at`, `raw`).
fn typed_fields() -> Value {
    let semantic = |field: &str, ty: &str, name: &str| json!({"field": field, "type": ty, "optional": true, "name": name, "version": 1});
    json!([
        {"field": "id", "type": "int64", "optional": false},
        semantic("opened", "int32", "io.debezium.time.Date"),
        semantic("local_ts", "int64", "io.debezium.time.MicroTimestamp"),
        semantic("at", "string", "io.debezium.time.ZonedTimestamp"),
        semantic("tm", "int64", "io.debezium.time.MicroTime"),
        {"field": "total", "type": "string", "optional": true, "parameters": {
            "__debezium.source.column.type": "NUMERIC",
            "__debezium.source.column.length": "12",
            "__debezium.source.column.scale": "2"}},
        semantic("meta", "string", "io.debezium.data.Json"),
        {"field": "raw", "type": "bytes", "optional": true},
        {"field": "days", "type": "array", "optional": true,
         "items": {"type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1}},
    ])
}

/// A record of an oncely envelope with schemas on, inserting `row` into `t`.
fn typed_record(offset: i64, row: Value, v: Version) -> Record {
    let fields = typed_fields();
    let schema = json!({"type": "struct", "optional": false, "fields": [
        {"field": "before", "type": "struct", "optional": true, "fields": fields},
        {"field": "after", "type": "struct", "optional": true, "fields": fields},
        {"field": "op", "type": "string", "optional": false},
    ]});
    let id = row["id"].clone();
    let value = json!({"schema": schema, "payload": {
        "before": null, "after": row, "op": "c",
        "source": {"schema": "public", "table": "t", "commit_lsn": v.lsn, "event_seq": v.seq},
    }});
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("envelope");
    Record::new(offset, Some(json!({ "id": id })), payload)
}

/// Two rows on the wire: ordinary values, and PostgreSQL's extremes.
fn typed_rows() -> [Value; 2] {
    [
        json!({"id": 1, "opened": 16_661, "local_ts": 946_684_788_500_000_i64,
               "at": "2026-11-27T15:10:35.670111Z", "tm": 45_296_500_000_i64,
               "total": "163.38", "meta": "{\"a\": [1, 2.50], \"b\": \"x\"}", "raw": "AP8Q",
               "days": [16_661, null, i32::MAX]}),
        json!({"id": 2, "opened": -2_440_588, "local_ts": i64::MAX,
               "at": "-0043-03-15T12:00:00.000000Z", "tm": 86_400_000_000_i64,
               "total": "-9999999999.99", "meta": "\"s\"", "raw": "", "days": []}),
    ]
}

async fn apply_typed(layout: Layout, format: ValueFormat) -> (MultiplexedConnection, String) {
    let (mut cfg, p) = config(layout);
    cfg.value_format = format;
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let records = typed_rows()
        .into_iter()
        .enumerate()
        .map(|(i, row)| typed_record(i as i64, row, Version::new(10 + i as u64, 0)))
        .collect();
    sink.apply(&batch("g", 0, records, 2)).await.expect("rows");
    (raw().await, p)
}

async fn hget(conn: &mut MultiplexedConnection, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(conn)
        .await
        .expect("HGET")
}

/// `HGET` of each field of `key` returns the text paired with it.
async fn assert_fields(conn: &mut MultiplexedConnection, key: &str, want: &[(&str, &str)]) {
    for (field, value) in want {
        assert_eq!(
            hget(conn, key, field).await.as_deref(),
            Some(*value),
            "{key} {field}"
        );
    }
}

/// Native values (docs/design.md, "Native values"): `HGET` of a date column returns `YYYY-MM-DD`, a timestamp
/// ISO-8601, a numeric its exact decimal string; BC, far-future and infinite
/// values keep their meaning; `value.format = "wire"` keeps the wire form.
#[tokio::test]
async fn hash_fields_hold_dates_times_and_numerics_in_their_users_form() {
    let (mut conn, p) = apply_typed(Layout::Hash, ValueFormat::Native).await;
    let row1 = format!("{p}:t:1");
    let want = [
        ("opened", "2015-08-14"),
        ("local_ts", "1999-12-31T23:59:48.500000"),
        ("at", "2026-11-27T15:10:35.670111Z"),
        ("tm", "12:34:56.500000"),
        ("total", "163.38"),
        // A hash field is text: a JSON column keeps its text.
        ("meta", "{\"a\": [1, 2.50], \"b\": \"x\"}"),
        ("raw", "AP8Q"),
        ("days", "[\"2015-08-14\",null,\"infinity\"]"),
    ];
    assert_fields(&mut conn, &row1, &want).await;
    let row2 = format!("{p}:t:2");
    let want = [
        ("opened", "-4713-11-24"),
        ("local_ts", "infinity"),
        ("at", "-0043-03-15T12:00:00.000000Z"),
        ("tm", "24:00:00.000000"),
        ("total", "-9999999999.99"),
        ("days", "[]"),
    ];
    assert_fields(&mut conn, &row2, &want).await;

    let (mut conn, p) = apply_typed(Layout::Hash, ValueFormat::Wire).await;
    let wire = [
        ("opened", "16661"),
        ("local_ts", "946684788500000"),
        ("tm", "45296500000"),
        ("total", "163.38"),
        ("days", "[16661,null,2147483647]"),
    ];
    assert_fields(&mut conn, &format!("{p}:t:1"), &wire).await;
}

/// The JSON layout: the same forms, and JSON columns nested as JSON.
#[tokio::test]
async fn json_rows_hold_dates_times_numerics_and_nested_json() {
    let (mut conn, p) = apply_typed(Layout::Json, ValueFormat::Native).await;
    let row = |text: Option<String>| -> Value {
        serde_json::from_str(&text.expect("cached row")).expect("json row")
    };
    assert_eq!(
        row(get(&mut conn, &format!("{p}:t:1")).await),
        json!({"id": 1, "opened": "2015-08-14", "local_ts": "1999-12-31T23:59:48.500000",
               "at": "2026-11-27T15:10:35.670111Z", "tm": "12:34:56.500000",
               "total": "163.38", "meta": {"a": [1, 2.5], "b": "x"}, "raw": "AP8Q",
               "days": ["2015-08-14", null, "infinity"]})
    );
    assert_eq!(
        row(get(&mut conn, &format!("{p}:t:2")).await),
        json!({"id": 2, "opened": "-4713-11-24", "local_ts": "infinity",
               "at": "-0043-03-15T12:00:00.000000Z", "tm": "24:00:00.000000",
               "total": "-9999999999.99", "meta": "s", "raw": "", "days": []})
    );

    let (mut conn, p) = apply_typed(Layout::Json, ValueFormat::Wire).await;
    let [wire, _] = typed_rows();
    assert_eq!(row(get(&mut conn, &format!("{p}:t:1")).await), wire);
}

/// Two runners of one group on the same partition, the first revoked (a
/// zombie): once the second was assigned the partition, the first writes
/// nothing and stores no position, even for keys the second has not
/// touched; a second consumer group writing the same keys is followed.
#[tokio::test]
async fn a_runner_that_lost_its_partition_writes_nothing() {
    let (cfg, p) = config(Layout::Hash);
    let old = RedisSink::connect(&cfg).await.expect("old owner");
    let new = RedisSink::connect(&cfg).await.expect("new owner");
    let mut conn = raw().await;
    let tps = [TopicPartition::new("topic-a", 0)];
    let row = |id: i64, v: &str| json!({"id": id, "v": v});
    old.load_positions("g", &tps)
        .await
        .expect("assigned to the old owner");
    old.apply(&batch(
        "g",
        0,
        vec![record(0, 1, "c", row(1, "a"), Version::new(10, 0))],
        1,
    ))
    .await
    .expect("old owner, before the rebalance");
    new.load_positions("g", &tps)
        .await
        .expect("assigned to the new owner");
    new.apply(&batch(
        "g",
        0,
        vec![record(1, 1, "u", row(1, "c"), Version::new(30, 0))],
        2,
    ))
    .await
    .expect("new owner");
    // The zombie's batch in flight: an older change of key 1 (which its
    // cache would let through as newer than its own write) and a new key.
    let late = batch(
        "g",
        0,
        vec![
            record(1, 1, "u", row(1, "b"), Version::new(20, 0)),
            record(2, 2, "c", row(2, "z"), Version::new(40, 0)),
        ],
        50,
    );
    match old.apply(&late).await {
        Err(e @ SinkError::Retriable { .. }) => {
            assert!(e.to_string().contains("another runner"), "{e}")
        }
        other => panic!("a revoked owner must not write: {other:?}"),
    }
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        Some(text_row(&row(1, "c")))
    );
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:2")).await,
        None
    );
    // Read directly: `load_positions` would assign the partition again.
    let position: Option<i64> = redis::cmd("HGET")
        .arg(format!("{p}:pos:g"))
        .arg("topic-a:0")
        .query_async(&mut conn)
        .await
        .expect("HGET position");
    assert_eq!(position, Some(2), "the zombie stored no position");
    // A second consumer group writes key 1 (newer); the first group's owner,
    // whose cache holds version 30, must see it and skip its older change.
    let other = RedisSink::connect(&cfg).await.expect("second group");
    other
        .apply(&batch(
            "h",
            0,
            vec![record(0, 1, "u", row(1, "h"), Version::new(60, 0))],
            1,
        ))
        .await
        .expect("second group");
    new.apply(&batch(
        "g",
        0,
        vec![record(2, 1, "u", row(1, "d"), Version::new(50, 0))],
        3,
    ))
    .await
    .expect("first group again");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        Some(text_row(&row(1, "h"))),
        "an older change never overwrites another group's newer row"
    );
    // The same through the script path (rows with a TTL take it).
    let mut scripted = cfg.clone();
    scripted.ttl_seconds = 3600;
    let scripted = RedisSink::connect(&scripted).await.expect("script path");
    new.apply(&batch(
        "g",
        0,
        vec![record(3, 1, "u", row(1, "e"), Version::new(65, 0))],
        4,
    ))
    .await
    .expect("first group caches version 65");
    scripted
        .apply(&batch(
            "k",
            0,
            vec![record(0, 1, "u", row(1, "k"), Version::new(80, 0))],
            1,
        ))
        .await
        .expect("a script writes version 80");
    new.apply(&batch(
        "g",
        0,
        vec![record(4, 1, "u", row(1, "f"), Version::new(70, 0))],
        5,
    ))
    .await
    .expect("first group, older than the script's write");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        Some(text_row(&row(1, "k"))),
        "an older change never overwrites a script's newer row"
    );
}

/// A truncate applied by another partition removes rows of this partition's
/// keys; the owner's cache must not then treat those keys as still in the
/// table's key set, or its own copy of the truncate would miss them.
#[tokio::test]
async fn another_partitions_truncate_is_seen_by_the_cache() {
    let (cfg, p) = config(Layout::Hash);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let row = |id: i64, v: &str| json!({"id": id, "v": v});
    let truncate = Version::new(20, 0);
    sink.apply(&batch(
        "g",
        0,
        vec![record(0, 1, "c", row(1, "a"), Version::new(10, 0))],
        1,
    ))
    .await
    .expect("row on partition 0");
    sink.apply(&batch("g", 1, vec![truncate_record(0, truncate)], 1))
        .await
        .expect("truncate on partition 1");
    // Partition 0: one more change from before the truncate, then its copy.
    sink.apply(&batch(
        "g",
        0,
        vec![record(1, 1, "u", row(1, "b"), Version::new(15, 0))],
        2,
    ))
    .await
    .expect("older change");
    sink.apply(&batch("g", 0, vec![truncate_record(2, truncate)], 3))
        .await
        .expect("truncate on partition 0");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &format!("{p}:t:1")).await,
        None,
        "the row is older than the truncate"
    );
}

/// Rows whose columns change: a full image drops the fields it no longer
/// has, an unchanged TOAST column keeps its stored field, a delete and a
/// re-create start over — through the cache, in one batch and across batches.
#[tokio::test]
async fn full_images_replace_cached_rows() {
    let (cfg, p) = config(Layout::Hash);
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let v = |n: u64| Version::new(n, 0);
    sink.apply(&batch(
        "g",
        0,
        vec![
            record(
                0,
                1,
                "c",
                json!({"id": 1, "a": "1", "b": "2", "doc": "big"}),
                v(10),
            ),
            record(
                1,
                1,
                "u",
                json!({"id": 1, "a": "3", "doc": UNAVAILABLE_VALUE}),
                v(11),
            ),
        ],
        2,
    ))
    .await
    .expect("first batch");
    let key = format!("{p}:t:1");
    let want = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    assert_eq!(
        cached(&mut conn, Layout::Hash, &key).await,
        want(&[("id", "1"), ("a", "3"), ("doc", "big")])
    );
    sink.apply(&batch(
        "g",
        0,
        vec![record(
            2,
            1,
            "u",
            json!({"id": 1, "c": "4", "doc": null}),
            v(12),
        )],
        3,
    ))
    .await
    .expect("second batch");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &key).await,
        want(&[("id", "1"), ("c", "4")])
    );
    sink.apply(&batch(
        "g",
        0,
        vec![
            record(3, 1, "d", Value::Null, v(13)),
            record(4, 1, "c", json!({"id": 1, "doc": UNAVAILABLE_VALUE}), v(12)),
        ],
        5,
    ))
    .await
    .expect("delete, then a stale create");
    assert_eq!(cached(&mut conn, Layout::Hash, &key).await, None);
    sink.apply(&batch(
        "g",
        0,
        vec![record(
            5,
            1,
            "c",
            json!({"id": 1, "e": "5", "doc": UNAVAILABLE_VALUE}),
            v(14),
        )],
        6,
    ))
    .await
    .expect("re-create");
    assert_eq!(
        cached(&mut conn, Layout::Hash, &key).await,
        want(&[("id", "1"), ("e", "5")])
    );
    assert_eq!(
        get(&mut conn, &format!("{p}:v:{key}")).await,
        None,
        "the tombstone went"
    );
}

/// A change or truncate (`row` null) of `schema.table` at `v`, row `id`.
fn record_of(offset: i64, [schema, table]: [&str; 2], id: i64, row: Value, v: Version) -> Record {
    let op = if row.is_null() { "t" } else { "c" };
    let value = json!({
        "before": null, "after": row, "op": op,
        "source": {"schema": schema, "table": table, "commit_lsn": v.lsn, "event_seq": v.seq},
    });
    let key = (op == "c").then(|| json!({ "id": id }));
    Record::new(
        offset,
        key,
        decode_value(Some(value.to_string().as_bytes())).expect("envelope"),
    )
}

/// `"a.b"."c"` and `"a"."b.c"` have key sets of their own (names escaped as
/// in row keys): a truncate of one leaves the other's older rows.
async fn dotted_names_have_their_own_key_sets(layout: Layout) {
    let (mut cfg, p) = config(layout);
    cfg.key_pattern = format!("{p}:{{schema}}:{{table}}:{{key}}");
    let sink = RedisSink::connect(&cfg).await.expect("sink");
    let mut conn = raw().await;
    let (one, other) = (["a.b", "c"], ["a", "b.c"]);
    let row = |id: i64| json!({"id": id, "v": format!("row {id}")});
    sink.apply(&batch(
        "g",
        0,
        vec![
            record_of(0, one, 1, row(1), Version::new(10, 0)),
            record_of(1, other, 2, row(2), Version::new(10, 1)),
        ],
        2,
    ))
    .await
    .expect("rows");
    sink.apply(&batch(
        "g",
        0,
        vec![record_of(2, one, 0, Value::Null, Version::new(20, 0))],
        3,
    ))
    .await
    .expect("truncate of \"a.b\".\"c\"");
    assert_eq!(
        cached(&mut conn, layout, &format!("{p}:a.b:c:1")).await,
        None,
        "the truncated table's row goes"
    );
    assert_eq!(
        cached(&mut conn, layout, &format!("{p}:a:b.c:2")).await,
        Some(text_row(&row(2))),
        "the other table's row stays"
    );
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}:ks:.a\\.b.c"))
        .query_async(&mut conn)
        .await
        .expect("SMEMBERS");
    assert!(members.is_empty(), "{members:?}");
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}:ks:.a.b\\.c"))
        .query_async(&mut conn)
        .await
        .expect("SMEMBERS");
    assert_eq!(members, vec![format!("{p}:a:b.c:2")], "escaped key set");
}

#[tokio::test]
async fn hash_truncates_of_dotted_names_leave_the_other_table() {
    dotted_names_have_their_own_key_sets(Layout::Hash).await;
}

#[tokio::test]
async fn json_truncates_of_dotted_names_leave_the_other_table() {
    dotted_names_have_their_own_key_sets(Layout::Json).await;
}
