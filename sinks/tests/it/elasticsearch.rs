//! The elasticsearch sink against the real Elasticsearch and Kafka of `scripts/services`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use elasticsearch::http::transport::Transport;
use elasticsearch::indices::{IndicesDeleteParts, IndicesRefreshParts};
use elasticsearch::{Elasticsearch, SearchParts};
use oncely_core::wire::UNAVAILABLE_VALUE;
use oncely_sinks::event::{decode_key, decode_value};
use oncely_sinks::kinds::elasticsearch::config::{
    DEFAULT_VERSION_FIELD, DEFAULT_VERSION_LSN_FIELD, DEFAULT_VERSION_SEQ_FIELD,
};
use oncely_sinks::kinds::elasticsearch::{ElasticsearchConfig, ElasticsearchSink};
use oncely_sinks::runner::{HEADER_ERROR, HEADER_OFFSET};
use oncely_sinks::{Batch, Record, Runner, RunnerConfig, Sink, SinkError};
use oncely_testkit::kafka::*;
use rand::seq::SliceRandom;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn es_url() -> String {
    match std::env::var("ONCELY_ES_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_ES_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

fn es() -> Elasticsearch {
    Elasticsearch::new(Transport::single_node(&es_url()).expect("es transport"))
}

fn sink_config(extra: &str) -> ElasticsearchConfig {
    let c: ElasticsearchConfig =
        oncely_core::config::from_str(&format!("url = \"{}\"\n{extra}", es_url()), "sink")
            .expect("sink config");
    c.validate().expect("valid sink config");
    c
}

/// Every document of `index` after a refresh: id -> (version, source).
async fn documents(index: &str) -> BTreeMap<String, (i64, Value)> {
    es().indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await
        .expect("refresh");
    let body = search(
        index,
        json!({"size": 10000, "version": true, "query": {"match_all": {}}}),
    )
    .await;
    let hits = body["hits"]["hits"].as_array().cloned().unwrap_or_default();
    hits.into_iter()
        .map(|h| {
            let id = h["_id"].as_str().expect("_id").to_owned();
            let mut source = h["_source"].clone();
            let fields = source.as_object_mut().expect("object");
            // Written by the old packing (see `write_packed`), or by the sink.
            let packed = fields.shift_remove(DEFAULT_VERSION_FIELD);
            let lsn = fields.shift_remove(DEFAULT_VERSION_LSN_FIELD);
            let seq = fields.shift_remove(DEFAULT_VERSION_SEQ_FIELD);
            assert!(
                packed.as_ref().is_some_and(Value::is_i64)
                    || [lsn, seq]
                        .iter()
                        .all(|f| f.as_ref().is_some_and(Value::is_i64)),
                "{id}: every document carries its version: {source}"
            );
            (id, (h["_version"].as_i64().expect("_version"), source))
        })
        .collect()
}

async fn delete_index(index: &str) {
    let _ = es()
        .indices()
        .delete(IndicesDeleteParts::Index(&[index]))
        .send()
        .await;
}

/// An oncely envelope of table `t` for row `id`.
fn change(op: &str, id: u64, lsn: u64, seq: u64, row: Value) -> Vec<u8> {
    let (before, after) = if op == "d" {
        (json!({"id": id}), Value::Null)
    } else {
        (Value::Null, row)
    };
    json!({"before": before, "after": after, "op": op, "ts_ms": 0,
        "source": {"connector": "test", "lsn": lsn, "commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "t"}})
    .to_string()
    .into_bytes()
}

fn runner_config(topic: &str, batch: usize) -> RunnerConfig {
    let mut c = RunnerConfig::new(brokers(), unique("g"), vec![topic.to_owned()]);
    c.batch_max_records = batch;
    c.batch_max_ms = 5;
    c.retry_backoff_ms = 10;
    c.retry_backoff_max_ms = 200;
    c
}

/// Runs the sink until `group` committed `want` on every partition of `topic`, then stops it.
async fn run_until_committed(config: RunnerConfig, sink: Arc<dyn Sink>, topic: &str, want: &[i64]) {
    let group = config.group_id.clone();
    let stop = CancellationToken::new();
    let runner = Runner::new(config, sink).expect("runner");
    let task = tokio::spawn(runner.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = committed(&group, topic, want.len() as i32).await;
        if got == want {
            break;
        }
        assert!(!task.is_finished(), "runner stopped early");
        assert!(
            Instant::now() < deadline,
            "committed {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    task.await.expect("runner task").expect("runner result");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_out_of_order_deliveries_never_leave_an_older_version() {
    let topic = unique("es_dup");
    create_topic(&topic, 2).await;
    // Per key: versions 1..=6, a delete at version 4 for every third key, then
    // every event delivered twice, in a shuffled order (per key, as Kafka keeps).
    let mut per_partition: BTreeMap<i32, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    let mut expected: BTreeMap<String, (u64, Option<Value>)> = BTreeMap::new();
    for id in 0..30u64 {
        let mut events = Vec::new();
        for v in 1..=6u64 {
            let (lsn, seq) = (1_000 * v + id, v % 3);
            let deleted = id % 3 == 0 && v == 4;
            let op = if deleted {
                "d"
            } else if v == 1 {
                "c"
            } else {
                "u"
            };
            let row = json!({"id": id, "v": v, "name": format!("row {id} v{v}")});
            events.push(change(op, id, lsn, seq, row.clone()));
            let newest = expected.entry(id.to_string()).or_insert((0, None));
            let packed = (lsn << 20) | seq;
            if packed > newest.0 {
                *newest = (packed, (!deleted).then_some(row));
            }
        }
        // Version 6 is the newest; keys that stop at the delete lose it.
        if id % 3 == 0 {
            events.truncate(4);
            let del_lsn = 4_000 + id;
            expected.insert(id.to_string(), ((del_lsn << 20) | 1, None));
        }
        let mut delivered: Vec<Vec<u8>> = events.iter().chain(events.iter()).cloned().collect();
        delivered.shuffle(&mut rand::rng());
        let p = (id % 2) as i32;
        per_partition
            .entry(p)
            .or_default()
            .extend(delivered.into_iter().map(|e| (id, e)));
    }
    let mut out = Vec::new();
    let mut ends = vec![0i64; 2];
    for (p, events) in per_partition {
        ends[p as usize] = events.len() as i64;
        out.extend(events.into_iter().map(|(id, value)| Out {
            key: Some(key(id)),
            value: Some(value),
            partition: Some(p),
        }));
    }
    produce(&topic, &out).await;

    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    run_until_committed(runner_config(&topic, 7), Arc::new(sink), &topic, &ends).await;

    let docs = documents(&topic).await;
    let want: BTreeMap<String, (i64, Value)> = expected
        .into_iter()
        .filter_map(|(id, (v, row))| row.map(|r| (id, (v as i64, r))))
        .collect();
    assert_eq!(
        docs, want,
        "each document is the newest version, deleted rows are gone"
    );

    // A delete of a row never indexed, alone in its request: a 404 item inside an
    // `errors: false` response, settled.
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let phantom = (77, change("d", 77, 9_000, 0, Value::Null));
    sink.apply(&batch_of(&topic, vec![phantom.clone()], 0))
        .await
        .expect("a delete of an absent document is applied");
    sink.apply(&batch_of(&topic, vec![phantom], 0))
        .await
        .expect("and applied again");
    assert_eq!(documents(&topic).await, docs);
    delete_index(&topic).await;
}

fn batch_of(topic: &str, records: Vec<(u64, Vec<u8>)>, first_offset: i64) -> Batch {
    let recs: Vec<Record> = records
        .into_iter()
        .enumerate()
        .map(|(i, (id, v))| {
            let k = key(id);
            Record::new(
                first_offset + i as i64,
                decode_key(Some(&k)).expect("key"),
                decode_value(Some(&v)).expect("value"),
            )
        })
        .collect();
    let next = first_offset + recs.len() as i64;
    Batch::new(Arc::from("g"), (Arc::from(topic), 0), recs, next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_toast_keeps_the_stored_value_and_soft_deletes_keep_the_document() {
    let topic = unique("es_toast");
    let sink = ElasticsearchSink::connect(&sink_config("delete.mode = \"soft\""))
        .await
        .expect("sink");
    let create = (
        1,
        change("c", 1, 100, 0, json!({"id": 1, "n": 0, "body": "big text"})),
    );
    let toast = (
        1,
        change(
            "u",
            1,
            200,
            0,
            json!({"id": 1, "n": 1, "body": UNAVAILABLE_VALUE}),
        ),
    );
    let delete = (1, change("d", 1, 300, 0, json!({"id": 1})));
    sink.apply(&batch_of(&topic, vec![create.clone()], 0))
        .await
        .expect("create");
    sink.apply(&batch_of(&topic, vec![toast.clone()], 1))
        .await
        .expect("toast");
    let docs = documents(&topic).await;
    let v200 = 200 << 20;
    assert_eq!(
        docs.get("1"),
        Some(&(
            v200,
            json!({"id": 1, "n": 1, "__deleted": false, "body": "big text"})
        ))
    );
    // Replays of older batches change nothing.
    sink.apply(&batch_of(&topic, vec![create.clone(), toast.clone()], 0))
        .await
        .expect("replay");
    assert_eq!(documents(&topic).await, docs);
    sink.apply(&batch_of(&topic, vec![delete.clone()], 2))
        .await
        .expect("delete");
    let docs = documents(&topic).await;
    let deleted = json!({"id": 1, "n": 1, "__deleted": true, "body": "big text"});
    assert_eq!(docs.get("1"), Some(&(300 << 20, deleted.clone())));
    sink.apply(&batch_of(&topic, vec![create, toast, delete], 0))
        .await
        .expect("replay all");
    assert_eq!(
        documents(&topic).await.get("1"),
        Some(&(300 << 20, deleted))
    );
    delete_index(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_conflict_dead_letters_that_record_and_the_rest_lands() {
    let topic = unique("es_map");
    let dlq = unique("es_map_dlq");
    create_topic(&topic, 1).await;
    let dir = std::env::temp_dir().join(unique("es_tpl"));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = dir.join("template.json");
    let body = json!({"index_patterns": [format!("{topic}*")],
        "template": {"mappings": {"properties": {"n": {"type": "long"}}}}});
    std::fs::write(&template, body.to_string()).expect("template");
    let tpl_name = unique("tpl");
    let cfg = sink_config(&format!(
        "template.file = \"{}\"\ntemplate.name = \"{tpl_name}\"\n",
        template.display()
    ));
    let rows = [json!(1), json!("not a number"), json!(3), json!(4)];
    let out: Vec<Out> = rows
        .iter()
        .enumerate()
        .map(|(i, n)| Out {
            key: Some(key(i as u64)),
            value: Some(change(
                "c",
                i as u64,
                100,
                i as u64,
                json!({"id": i, "n": n}),
            )),
            partition: Some(0),
        })
        .collect();
    produce(&topic, &out).await;
    let sink = ElasticsearchSink::connect(&cfg).await.expect("sink");
    let mut rc = runner_config(&topic, 100);
    rc.dlq_topic = Some(dlq.clone());
    rc.batch_max_ms = 500; // one batch holds all four records
    run_until_committed(rc, Arc::new(sink), &topic, &[4]).await;

    let docs = documents(&topic).await;
    let ids: Vec<&str> = docs.keys().map(String::as_str).collect();
    assert_eq!(ids, vec!["0", "2", "3"], "the rest of the batch landed");
    assert_eq!(docs["2"].1, json!({"id": 2, "n": 3}));
    let letters = read_topic(&dlq, 1, 1).await;
    assert_eq!(letters.len(), 1, "exactly the bad record is dead-lettered");
    assert_eq!(header(&letters[0], HEADER_OFFSET).as_deref(), Some("1"));
    let reason = header(&letters[0], HEADER_ERROR).unwrap_or_default();
    assert!(
        reason.contains("document_parsing_exception")
            || reason.contains("mapper_parsing_exception"),
        "{reason}"
    );
    delete_index(&topic).await;
    let _ = es()
        .indices()
        .delete_index_template(
            elasticsearch::indices::IndicesDeleteIndexTemplateParts::Name(&tpl_name),
        )
        .send()
        .await;
}

/// Documents a search finds right now, without forcing a refresh.
async fn searchable(index: &str) -> u64 {
    let body = search(index, json!({"size": 0, "track_total_hits": true})).await;
    body["hits"]["total"]["value"].as_u64().expect("total")
}

/// The response body of a search of `index`.
async fn search(index: &str, body: Value) -> Value {
    es().search(SearchParts::Index(&[index]))
        .body(body)
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("search body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_true_makes_a_batch_searchable_when_it_is_applied() {
    // Periodic refreshes off: only the sink's requests can make documents searchable.
    let topic = unique("es_refresh");
    es().indices()
        .create(elasticsearch::indices::IndicesCreateParts::Index(&topic))
        .body(json!({"settings": {"refresh_interval": "-1", "number_of_replicas": 0}}))
        .send()
        .await
        .expect("create index")
        .error_for_status_code()
        .expect("index created");
    let rows = |from: u64| -> Vec<(u64, Vec<u8>)> {
        (from..from + 3)
            .map(|id| (id, change("c", id, 100 + id, 0, json!({"id": id}))))
            .collect()
    };
    let lazy = ElasticsearchSink::connect(&sink_config("refresh = false"))
        .await
        .expect("sink");
    lazy.apply(&batch_of(&topic, rows(1), 0))
        .await
        .expect("apply");
    assert_eq!(
        searchable(&topic).await,
        0,
        "refresh = false left it to the index"
    );
    let eager = ElasticsearchSink::connect(&sink_config("refresh = true"))
        .await
        .expect("sink");
    eager
        .apply(&batch_of(&topic, rows(4), 3))
        .await
        .expect("apply");
    // The refresh publishes every document indexed before it, the lazy sink's too.
    assert_eq!(searchable(&topic).await, 6);
    delete_index(&topic).await;
}

/// A truncate envelope of table `t`.
fn truncate_change(lsn: u64, seq: u64) -> Vec<u8> {
    json!({"before": null, "after": null, "op": "t", "ts_ms": 0,
        "source": {"connector": "test", "lsn": lsn, "commit_lsn": lsn, "event_seq": seq, "schema": "public", "table": "t"}})
    .to_string()
    .into_bytes()
}

/// A batch of `topic` partition `partition`; `None` ids are keyless records (truncates).
fn partition_batch(
    topic: &str,
    partition: i32,
    records: Vec<(Option<u64>, Vec<u8>)>,
    first: i64,
) -> Batch {
    let recs: Vec<Record> = records
        .into_iter()
        .enumerate()
        .map(|(i, (id, v))| {
            let k = id.map(key);
            Record::new(
                first + i as i64,
                decode_key(k.as_deref()).expect("key"),
                decode_value(Some(&v)).expect("value"),
            )
        })
        .collect();
    let next = first + recs.len() as i64;
    Batch::new(Arc::from("g"), (Arc::from(topic), partition), recs, next)
}

/// The copies of one truncate read from two partitions at different times:
/// each removes the documents older than it, the documents written after it
/// stay, and replaying a copy changes nothing.
async fn truncate_copies(mode: &str) -> BTreeMap<String, (i64, Value)> {
    let topic = unique("es_truncate");
    let sink = ElasticsearchSink::connect(&sink_config(&format!("delete.mode = \"{mode}\"")))
        .await
        .expect("sink");
    let row = |id: u64| json!({"id": id, "v": format!("row {id}")});
    // Partition 0: 300 rows before the truncate.
    let before = (1..=300)
        .map(|id| (Some(id), change("c", id, 10, id, row(id))))
        .collect();
    sink.apply(&partition_batch(&topic, 0, before, 0))
        .await
        .expect("rows");
    // Partition 1: its copy, then a row written after the truncate.
    let p1 = || {
        partition_batch(
            &topic,
            1,
            vec![
                (None, truncate_change(20, 1)),
                (Some(5), change("c", 5, 20, 2, row(5))),
            ],
            0,
        )
    };
    sink.apply(&p1()).await.expect("truncate on partition 1");
    // Partition 0: one more row from before the truncate, then its copy.
    sink.apply(&partition_batch(
        &topic,
        0,
        vec![
            (Some(7), change("u", 7, 15, 0, row(7))),
            (None, truncate_change(20, 1)),
        ],
        300,
    ))
    .await
    .expect("truncate on partition 0");
    sink.apply(&p1()).await.expect("replay");
    let docs = documents(&topic).await;
    delete_index(&topic).await;
    docs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_deletes_the_documents_older_than_it_and_keeps_newer_ones() {
    let docs = truncate_copies("delete").await;
    let ids: Vec<&str> = docs.keys().map(String::as_str).collect();
    assert_eq!(ids, vec!["5"], "only the row written after the truncate");
    assert_eq!(docs["5"], ((20 << 20) + 2, json!({"id": 5, "v": "row 5"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_truncate_flags_the_documents_older_than_it() {
    let docs = truncate_copies("soft").await;
    assert_eq!(docs.len(), 300, "soft deletes keep the documents");
    for (id, (_, source)) in &docs {
        let live = id == "5";
        assert_eq!(source["__deleted"], json!(!live), "{id}: {source}");
    }
    assert_eq!(docs["5"].1["v"], json!("row 5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_where_the_version_field_is_not_indexed_is_a_dead_letter() {
    let topic = unique("es_truncate_unmapped");
    // An index that does not map new fields: the version field is not searchable.
    let created = es()
        .indices()
        .create(elasticsearch::indices::IndicesCreateParts::Index(&topic))
        .body(json!({"mappings": {"dynamic": false, "properties": {"id": {"type": "long"}}}}))
        .send()
        .await
        .expect("create index");
    assert!(created.status_code().is_success());
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    sink.apply(&partition_batch(
        &topic,
        0,
        vec![(Some(1), change("c", 1, 10, 1, json!({"id": 1})))],
        0,
    ))
    .await
    .expect("row");
    let err = sink
        .apply(&partition_batch(
            &topic,
            0,
            vec![(None, truncate_change(20, 1))],
            1,
        ))
        .await
        .expect_err("refused");
    let oncely_sinks::SinkError::Rejected(failures) = err else {
        panic!("not a per-record failure: {err}")
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].offset, 1);
    assert!(
        failures[0].reason.contains("not mapped"),
        "{}",
        failures[0].reason
    );
    assert_eq!(documents(&topic).await.len(), 1, "nothing deleted");
    delete_index(&topic).await;
}

/// Exact values (docs/design.md, "Native values in search indexes"): a `timestamptz` Elasticsearch cannot parse as a date (a
/// year before 0 or after 9999 as java.time writes it, `infinity`) after the
/// field was mapped as `date` still lands, its exact value in `_source`; as
/// do timestamp/date infinity sentinels and exact ISO intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dates_beyond_elasticsearchs_range_are_kept_in_the_source() {
    let topic = unique("es_dates");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let rows = [
        json!({"id": 0, "tz": "2026-11-27T15:10:35.670111Z", "ts": 1, "d": 1, "iv": "P1Y2M3DT4H5M6.789S"}),
        json!({"id": 1, "tz": "-0043-03-15T12:00:00.000000Z", "ts": i64::MIN, "d": i32::MIN, "iv": "P-178000000Y0M0DT0H0M0S"}),
        json!({"id": 2, "tz": "+294276-12-31T23:59:59.999999Z", "ts": i64::MAX, "d": i32::MAX, "iv": "P0Y0M0DT0H0M-0.5S"}),
        json!({"id": 3, "tz": "infinity", "ts": -210_863_520_000_000_000_i64, "d": 2_145_042_905, "iv": "P0Y0M0DT0H0M0S"}),
        json!({"id": 4, "tz": "-infinity", "ts": 0, "d": -2_440_550, "iv": "P0Y0M0DT24H0M0S"}),
    ];
    // The first row alone, so the field is mapped as a date first.
    let first = vec![(0, change("c", 0, 100, 1, rows[0].clone()))];
    sink.apply(&batch_of(&topic, first, 0))
        .await
        .expect("first");
    let rest: Vec<(u64, Vec<u8>)> = rows[1..]
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                i as u64 + 1,
                change("c", i as u64 + 1, 200, i as u64 + 1, r.clone()),
            )
        })
        .collect();
    sink.apply(&batch_of(&topic, rest, 1))
        .await
        .expect("every row lands");
    let docs = documents(&topic).await;
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(docs.get(&i.to_string()).map(|d| &d.1), Some(row), "row {i}");
    }
    let mapping = es()
        .indices()
        .get_mapping(elasticsearch::indices::IndicesGetMappingParts::Index(&[
            &topic,
        ]))
        .send()
        .await
        .expect("mapping")
        .json::<Value>()
        .await
        .expect("mapping json");
    assert_eq!(
        mapping[&topic]["mappings"]["properties"]["tz"]["type"],
        json!("date"),
        "{mapping}"
    );
    delete_index(&topic).await;
}

/// An oncely envelope of table `t` with its Connect schema: `id` int64,
/// `f4` float, `f8` double, `fa` array of double.
fn float_change(lsn: u64, row: Value) -> Vec<u8> {
    typed_change(
        lsn,
        &[
            ("f4", json!({"type": "float"})),
            ("f8", json!({"type": "double"})),
            (
                "fa",
                json!({"type": "array", "items": {"type": "double", "optional": true}}),
            ),
        ],
        row,
    )
}

/// An oncely insert into table `t` with its Connect schema: `id` int64,
/// then `columns` (name, field schema).
fn typed_change(lsn: u64, columns: &[(&str, Value)], row: Value) -> Vec<u8> {
    let field = |name: &str, ty: &Value| {
        let mut f = ty.clone();
        f["optional"] = json!(name != "id");
        f["field"] = json!(name);
        f
    };
    let row_schema = |name: &str| {
        let mut fields = vec![field("id", &json!({"type": "int64"}))];
        fields.extend(columns.iter().map(|(n, ty)| field(n, ty)));
        json!({"type": "struct", "optional": true, "field": name, "fields": fields})
    };
    let schema = json!({"type": "struct", "optional": false, "fields": [
        row_schema("before"), row_schema("after"),
        {"type": "struct", "optional": false, "field": "source", "fields": []},
        {"type": "string", "optional": false, "field": "op"},
    ]});
    json!({"schema": schema, "payload": {"before": null, "after": row, "op": "c", "ts_ms": 0,
        "source": {"connector": "test", "lsn": lsn, "commit_lsn": lsn, "event_seq": 1, "schema": "public", "table": "t"}}})
    .to_string()
    .into_bytes()
}

/// The mapping of `field` in `index`: its `type` and `ignore_malformed`.
async fn field_mapping(index: &str, field: &str) -> Value {
    let body: Value = es()
        .indices()
        .get_mapping(elasticsearch::indices::IndicesGetMappingParts::Index(&[
            index,
        ]))
        .send()
        .await
        .expect("get mapping")
        .json()
        .await
        .expect("mapping body");
    body[index]["mappings"]["properties"][field].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doubles_beyond_float_and_non_finite_floats_are_indexed_exactly() {
    let topic = unique("es_floats");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    // The first double is integral (dynamic mapping would make it `long`).
    let rows = [
        json!({"id": 1, "f4": 1.5, "f8": 1, "fa": [1]}),
        json!({"id": 2, "f4": 3.4028235e38, "f8": 1e308, "fa": [1e308, "NaN"]}),
        json!({"id": 3, "f4": "NaN", "f8": -2.5e-300, "fa": ["-Infinity", 0.1]}),
        json!({"id": 4, "f4": "Infinity", "f8": "-Infinity", "fa": []}),
        json!({"id": 5, "f4": "-Infinity", "f8": "NaN", "fa": null}),
        json!({"id": 6, "f4": -3.25e-5, "f8": "Infinity", "fa": [2.5e-300]}),
    ];
    for (i, row) in rows.iter().enumerate() {
        let id = i as u64 + 1;
        sink.apply(&batch_of(
            &topic,
            vec![(id, float_change(100 + id, row.clone()))],
            i as i64,
        ))
        .await
        .unwrap_or_else(|e| panic!("row {id} refused: {e}"));
    }
    let docs = documents(&topic).await;
    assert_eq!(docs.len(), rows.len(), "{docs:?}");
    for (i, row) in rows.iter().enumerate() {
        let stored = &docs[&(i + 1).to_string()].1;
        for f in ["f4", "f8", "fa"] {
            assert_eq!(stored[f], row[f], "row {}: {f}: {stored}", i + 1);
        }
    }
    assert_eq!(
        field_mapping(&topic, "f8").await,
        json!({"type": "double", "ignore_malformed": true})
    );
    assert_eq!(
        field_mapping(&topic, "f4").await,
        json!({"type": "float", "ignore_malformed": true})
    );
    assert_eq!(field_mapping(&topic, "fa").await["type"], "double");
    // Finite values are searchable at full precision; non-finite ones are kept, not indexed.
    let hits = search(
        &topic,
        json!({"query": {"range": {"f8": {"gte": 1e307}}}, "_source": false}),
    )
    .await;
    let ids: Vec<&str> = hits["hits"]["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["_id"].as_str())
        .collect();
    assert_eq!(ids, vec!["2"]);
    let tiny = search(&topic, json!({"query": {"term": {"f8": -2.5e-300}}})).await;
    assert_eq!(tiny["hits"]["total"]["value"], 1, "{tiny}");

    // A column added later is mapped before its first value.
    let later = json!({"id": 7, "f4": 0.5, "f8": 2, "fa": [3]});
    let mut added: Value = serde_json::from_slice(&float_change(200, later)).expect("json");
    for row in [0, 1] {
        added["schema"]["fields"][row]["fields"]
            .as_array_mut()
            .expect("fields")
            .push(json!({"type": "double", "optional": true, "field": "g8"}));
    }
    added["payload"]["after"]["g8"] = json!(7);
    sink.apply(&batch_of(
        &topic,
        vec![(7, added.to_string().into_bytes())],
        6,
    ))
    .await
    .expect("new column");
    assert_eq!(field_mapping(&topic, "g8").await["type"], "double");
    delete_index(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_with_mappings_and_an_index_made_elsewhere_keep_their_mappings() {
    // A user's template with mappings applies to the index: the sink adds nothing.
    let topic = unique("es_floats_tpl");
    let dir = std::env::temp_dir().join(unique("es_tpl_floats"));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = dir.join("template.json");
    let body = json!({"index_patterns": [format!("{topic}*")], "priority": 500,
        "template": {"mappings": {"properties": {"f8": {"type": "keyword"}}}}});
    std::fs::write(&template, body.to_string()).expect("template");
    let tpl_name = unique("tpl");
    let sink = ElasticsearchSink::connect(&sink_config(&format!(
        "template.file = \"{}\"\ntemplate.name = \"{tpl_name}\"\n",
        template.display()
    )))
    .await
    .expect("sink");
    let row = json!({"id": 1, "f4": 1.5, "f8": 1e308, "fa": [1.5]});
    sink.apply(&batch_of(&topic, vec![(1, float_change(10, row))], 0))
        .await
        .expect("row");
    assert_eq!(field_mapping(&topic, "f8").await["type"], "keyword");
    // Dynamic mapping as Elasticsearch has it: `fa` a float, no `_meta` mark.
    assert_eq!(field_mapping(&topic, "fa").await["type"], "float");
    delete_index(&topic).await;
    let _ = es()
        .indices()
        .delete_index_template(
            elasticsearch::indices::IndicesDeleteIndexTemplateParts::Name(&tpl_name),
        )
        .send()
        .await;

    // An index someone else created is not re-mapped.
    let topic = unique("es_floats_theirs");
    es().indices()
        .create(elasticsearch::indices::IndicesCreateParts::Index(&topic))
        .body(json!({"mappings": {"properties": {"f4": {"type": "double"}}}}))
        .send()
        .await
        .expect("create index")
        .error_for_status_code()
        .expect("index created");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let row = json!({"id": 1, "f4": 1.5, "f8": 2.5, "fa": [1.5]});
    sink.apply(&batch_of(&topic, vec![(1, float_change(10, row))], 0))
        .await
        .expect("row");
    assert_eq!(field_mapping(&topic, "f4").await, json!({"type": "double"}));
    assert_eq!(field_mapping(&topic, "f8").await["type"], "float");
    delete_index(&topic).await;
}

/// The columns of the native-values tests, as capture describes them.
fn native_columns() -> Vec<(&'static str, Value)> {
    vec![
        (
            "d",
            json!({"type": "int32", "name": "io.debezium.time.Date", "version": 1}),
        ),
        (
            "ts",
            json!({"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}),
        ),
        (
            "tz",
            json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}),
        ),
        (
            "tm",
            json!({"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1}),
        ),
        (
            "n",
            json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC",
            "__debezium.source.column.length": "12", "__debezium.source.column.scale": "2"}}),
        ),
        (
            "j",
            json!({"type": "string", "name": "io.debezium.data.Json", "version": 1}),
        ),
        (
            "u",
            json!({"type": "string", "name": "io.debezium.data.Uuid", "version": 1}),
        ),
        (
            "da",
            json!({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date", "version": 1, "optional": true}}),
        ),
    ]
}

/// The ids of the documents `query` finds in `index` (after a refresh), sorted.
async fn ids_of(index: &str, query: Value) -> Vec<String> {
    es().indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await
        .expect("refresh");
    let body = search(
        index,
        json!({"size": 100, "_source": false, "query": query}),
    )
    .await;
    let mut ids: Vec<String> = body["hits"]["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("no hits: {body}"))
        .iter()
        .filter_map(|h| h["_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Native values (docs/design.md, "Native values in search indexes"): documents carry dates as ISO-8601 text, JSON as JSON,
/// decimals exactly; the index is mapped from the Connect schema, so a
/// `range` query on a date column and on a numeric column finds exactly
/// the right rows (values Elasticsearch cannot index kept in `_source`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_values_are_typed_and_range_queries_find_the_right_rows() {
    let topic = unique("es_native");
    let sink = ElasticsearchSink::connect(&sink_config("json.handling.mode = \"flattened\"\n"))
        .await
        .expect("sink");
    // (wire row, the document the sink must write)
    let rows = [
        (
            json!({"id": 1, "d": 20454, "ts": 946_684_788_500_000_i64, "tz": "2026-11-27T15:10:35.670111Z",
                "tm": 45_296_500_000_i64, "n": "163.38", "j": "{\"a\": {\"b\": [1, 2.50]}}",
                "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "da": [20454, null]}),
            json!({"id": 1, "d": "2026-01-01", "ts": "1999-12-31T23:59:48.500000", "tz": "2026-11-27T15:10:35.670111Z",
                "tm": "12:34:56.500000", "n": "163.38", "j": {"a": {"b": [1, 2.50]}},
                "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "da": ["2026-01-01", null]}),
        ),
        (
            json!({"id": 2, "d": 10956, "ts": 0, "tz": "1970-01-01T00:00:00.000000Z", "tm": 0,
                "n": "-9999999999.99", "j": "{}", "u": null, "da": [[10956], [-719162]]}),
            json!({"id": 2, "d": "1999-12-31", "ts": "1970-01-01T00:00:00.000000", "tz": "1970-01-01T00:00:00.000000Z",
                "tm": "00:00:00.000000", "n": "-9999999999.99", "j": {}, "u": null, "da": [["1999-12-31"], ["0001-01-01"]]}),
        ),
        (
            json!({"id": 3, "d": 20455, "ts": i64::MAX, "tz": "infinity", "tm": 86_400_000_000_i64,
                "n": "200.00", "j": null, "u": null, "da": []}),
            json!({"id": 3, "d": "2026-01-02", "ts": "infinity", "tz": "infinity", "tm": "24:00:00.000000",
                "n": "200.00", "j": null, "u": null, "da": []}),
        ),
        (
            json!({"id": 4, "d": i32::MAX, "ts": -210_866_803_200_000_000_i64, "tz": "-0043-03-15T12:00:00.000000Z",
                "tm": 1, "n": "NaN", "j": "[{\"k\": 1}]", "u": null, "da": [i32::MIN]}),
            json!({"id": 4, "d": "infinity", "ts": "-4713-11-24T00:00:00.000000", "tz": "-0043-03-15T12:00:00.000000Z",
                "tm": "00:00:00.000001", "n": "NaN", "j": [{"k": 1}], "u": null, "da": ["-infinity"]}),
        ),
        (
            json!({"id": 5, "d": -735_160, "ts": 1, "tz": "+294276-12-31T23:59:59.999999Z", "tm": 2,
                "n": "100.00", "j": "{\"a\": \"x\"}", "u": null, "da": null}),
            json!({"id": 5, "d": "-0043-03-15", "ts": "1970-01-01T00:00:00.000001", "tz": "+294276-12-31T23:59:59.999999Z",
                "tm": "00:00:00.000002", "n": "100.00", "j": {"a": "x"}, "u": null, "da": null}),
        ),
    ];
    let columns = native_columns();
    let records: Vec<(u64, Vec<u8>)> = rows
        .iter()
        .enumerate()
        .map(|(i, (wire, _))| {
            (
                i as u64 + 1,
                typed_change(100 + i as u64, &columns, wire.clone()),
            )
        })
        .collect();
    sink.apply(&batch_of(&topic, records, 0))
        .await
        .expect("every row lands");
    let docs = documents(&topic).await;
    for (wire, native) in &rows {
        let id = wire["id"].to_string();
        assert_eq!(docs.get(&id).map(|d| &d.1), Some(native), "row {id}");
    }
    assert_eq!(field_mapping(&topic, "d").await["type"], "date");
    assert_eq!(field_mapping(&topic, "ts").await["type"], "date");
    assert_eq!(field_mapping(&topic, "tz").await["type"], "date");
    assert_eq!(field_mapping(&topic, "tm").await["type"], "keyword");
    assert_eq!(field_mapping(&topic, "u").await["type"], "keyword");
    assert_eq!(field_mapping(&topic, "j").await["type"], "flattened");
    let n = field_mapping(&topic, "n").await;
    assert_eq!(n["type"], "double", "{n}");
    assert_eq!(n["fields"]["keyword"]["type"], "keyword", "{n}");

    // Dates: by calendar, BC and infinity kept out of the index.
    let range = |f: &str, r: Value| json!({"range": {f: r}});
    assert_eq!(
        ids_of(
            &topic,
            range("d", json!({"gte": "2026-01-01", "lte": "2026-01-02"}))
        )
        .await,
        ["1", "3"]
    );
    assert_eq!(
        ids_of(&topic, range("d", json!({"lt": "2000-01-01"}))).await,
        ["2", "5"]
    );
    assert_eq!(
        ids_of(
            &topic,
            range(
                "ts",
                json!({"gte": "1999-12-31T23:59:48", "lt": "2000-01-01"})
            )
        )
        .await,
        ["1"]
    );
    assert_eq!(
        ids_of(&topic, range("da", json!({"lte": "0001-01-01"}))).await,
        ["2"]
    );
    // Numerics: by value, not by text ("200.00" < "9..." as text); NaN kept out.
    assert_eq!(
        ids_of(&topic, range("n", json!({"gte": 100, "lte": 163.38}))).await,
        ["1", "5"]
    );
    assert_eq!(ids_of(&topic, range("n", json!({"lt": 0}))).await, ["2"]);
    assert_eq!(
        ids_of(&topic, json!({"term": {"n.keyword": "100.00"}})).await,
        ["5"]
    );
    // Times sort as text; JSON leaves are searchable.
    assert_eq!(
        ids_of(&topic, range("tm", json!({"gt": "12:00:00"}))).await,
        ["1", "3"]
    );
    assert_eq!(ids_of(&topic, json!({"term": {"j.a": "x"}})).await, ["5"]);
    assert_eq!(ids_of(&topic, json!({"term": {"j.a.b": "1"}})).await, ["1"]);

    // JSON a flattened field cannot hold is a dead letter naming the setting.
    let scalar = json!({"id": 6, "j": "[1, \"two\"]"});
    let e = sink
        .apply(&batch_of(
            &topic,
            vec![(6, typed_change(300, &columns, scalar))],
            5,
        ))
        .await
        .expect_err("an array of scalars in a flattened field");
    let SinkError::Rejected(failures) = e else {
        panic!("not a dead letter: {e}");
    };
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].reason.contains("json.handling.mode"),
        "{}",
        failures[0].reason
    );
    delete_index(&topic).await;
}

/// Under the default `json.handling.mode` (text) every JSON value a
/// `json`/`jsonb` column can hold lands as its text — objects, arrays of
/// scalars (a tags column), scalars, nested arrays — none is a dead letter,
/// and the index records the form it was made in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_columns_default_to_text_and_every_json_value_lands() {
    let topic = unique("es_json_text");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let columns = native_columns();
    let values = [
        "{\"a\": {\"b\": [1, 2.50]}}",
        "[\"red\", \"blue\"]",
        "\"just a string\"",
        "42",
        "[[1], {\"k\": null}]",
        "true",
    ];
    let records: Vec<(u64, Vec<u8>)> = values
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let row = json!({"id": i + 1, "j": j});
            (i as u64 + 1, typed_change(100 + i as u64, &columns, row))
        })
        .collect();
    sink.apply(&batch_of(&topic, records, 0))
        .await
        .expect("every JSON value lands under the default");
    let docs = documents(&topic).await;
    for (i, j) in values.iter().enumerate() {
        let id = (i + 1).to_string();
        assert_eq!(
            docs.get(&id).map(|d| &d.1["j"]),
            Some(&json!(j)),
            "row {id}"
        );
    }
    assert_eq!(field_mapping(&topic, "j").await["type"], "text");
    assert_eq!(
        ids_of(&topic, json!({"match": {"j": "blue"}})).await,
        ["2"],
        "JSON text is searchable"
    );
    let mapping: Value = es()
        .indices()
        .get_mapping(elasticsearch::indices::IndicesGetMappingParts::Index(&[
            &topic,
        ]))
        .send()
        .await
        .expect("mapping")
        .json()
        .await
        .expect("mapping body");
    assert_eq!(
        mapping[topic.as_str()]["mappings"]["_meta"]["oncely"]["json.handling.mode"],
        "text",
        "{mapping}"
    );
    delete_index(&topic).await;
}

/// `value.format = "wire"` keeps the wire values (and the dynamic mapping
/// of before); an index an older version created (its mark without
/// `value.format`, dates mapped `long`) keeps taking the wire form, whatever
/// the setting, instead of refusing every document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_values_and_indexes_made_before_native_values_keep_the_wire_form() {
    let columns = native_columns();
    let wire = json!({"id": 1, "d": 20454, "ts": 1, "tz": "1970-01-01T00:00:00.000000Z", "tm": 2,
        "n": "1.50", "j": "[1, 2]", "u": null, "da": [20454]});

    let topic = unique("es_wire");
    let sink = ElasticsearchSink::connect(&sink_config("value.format = \"wire\""))
        .await
        .expect("sink");
    sink.apply(&batch_of(
        &topic,
        vec![(1, typed_change(10, &columns, wire.clone()))],
        0,
    ))
    .await
    .expect("wire row");
    assert_eq!(documents(&topic).await["1"].1, wire);
    assert_eq!(field_mapping(&topic, "d").await["type"], "long");
    delete_index(&topic).await;

    // An index as the version before native values created it.
    let topic = unique("es_legacy");
    es().indices()
        .create(elasticsearch::indices::IndicesCreateParts::Index(&topic))
        .body(
            json!({"mappings": {"_meta": {"oncely": {"floating_point": "double"}},
            "properties": {"d": {"type": "long"}, "ts": {"type": "long"}}}}),
        )
        .send()
        .await
        .expect("create index")
        .error_for_status_code()
        .expect("index created");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    sink.apply(&batch_of(
        &topic,
        vec![(1, typed_change(10, &columns, wire.clone()))],
        0,
    ))
    .await
    .expect("a legacy index keeps taking wire values");
    assert_eq!(documents(&topic).await["1"].1, wire);
    assert_eq!(field_mapping(&topic, "d").await["type"], "long");
    // Mapped as Elasticsearch's dynamic mapping has it, not as a double.
    assert_eq!(field_mapping(&topic, "n").await["type"], "text");
    delete_index(&topic).await;
}

/// The concrete indexes behind `name` (itself when it is an index).
async fn concrete_indexes(name: &str) -> Vec<String> {
    let body: Value = es()
        .indices()
        .get_alias(elasticsearch::indices::IndicesGetAliasParts::Index(&[name]))
        .send()
        .await
        .expect("get alias")
        .json()
        .await
        .expect("alias body");
    body.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// A column changed from `int32` to `string` (`ALTER COLUMN code TYPE
/// text`): the index, mapped `long`, moves to `<index>-g2` with the field
/// remapped and its documents copied (versions kept), and the name becomes
/// the alias the sink writes and reads. The move is first left half-done,
/// as by a process killed after the write block: the next sink finishes it.
/// Events from before the change still fit and never move the index again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_type_the_mapping_refuses_moves_the_index_to_a_new_generation() {
    let topic = unique("es_generation");
    let int = [("code", json!({"type": "int32"}))];
    let text = [("code", json!({"type": "string"}))];
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    sink.apply(&batch_of(
        &topic,
        vec![
            (1, typed_change(100, &int, json!({"id": 1, "code": 10}))),
            (2, typed_change(101, &int, json!({"id": 2, "code": 20}))),
        ],
        0,
    ))
    .await
    .expect("integers");
    assert_eq!(field_mapping(&topic, "code").await["type"], "long");
    let before = documents(&topic).await;

    // A move killed right after its first step: the old index write-blocked.
    let blocked = es()
        .indices()
        .put_settings(elasticsearch::indices::IndicesPutSettingsParts::Index(&[
            &topic,
        ]))
        .body(json!({"index.blocks.write": true}))
        .send()
        .await
        .expect("block");
    assert!(blocked.status_code().is_success());

    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink after the kill");
    sink.apply(&batch_of(
        &topic,
        vec![
            // Read late: an event from before the change in the same batch.
            (2, typed_change(150, &int, json!({"id": 2, "code": 21}))),
            (3, typed_change(200, &text, json!({"id": 3, "code": "c-3"}))),
        ],
        2,
    ))
    .await
    .expect("text into the new generation");
    let generation = format!("{topic}-g2");
    assert_eq!(concrete_indexes(&topic).await, vec![generation.clone()]);
    assert_eq!(field_mapping(&generation, "code").await["type"], "text");
    let after = documents(&topic).await;
    assert_eq!(after["1"], before["1"], "copied with its version");
    assert_eq!(after["2"].1, json!({"id": 2, "code": 21}));
    assert_eq!(after["3"].1, json!({"id": 3, "code": "c-3"}));

    // An older event replayed later fits the new generation: no third one.
    sink.apply(&batch_of(
        &topic,
        vec![(4, typed_change(300, &int, json!({"id": 4, "code": 40})))],
        4,
    ))
    .await
    .expect("integer into the text field");
    assert_eq!(concrete_indexes(&topic).await, vec![generation.clone()]);
    assert_eq!(documents(&topic).await.len(), 4);
    delete_index(&generation).await;
}

/// The rows of `index` without the sink's bookkeeping: id -> source.
async fn rows(index: &str) -> BTreeMap<String, Value> {
    documents(index)
        .await
        .into_iter()
        .map(|(id, (_, source))| (id, source))
        .collect()
}

/// Inserts, updates, deletes, replays, an older event after a newer one and a
/// truncate, all at commit LSNs starting at `base`: the index ends equal to
/// the table whatever the size of the LSN.
async fn changes_at(base: u64) {
    let topic = unique("es_lsn_space");
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let row = |id: u64, n: u64| json!({"id": id, "n": n});
    let insert1 = (1, change("c", 1, base, 1, row(1, 0)));
    let update1 = (1, change("u", 1, base + 64, 3, row(1, 1)));
    let insert2 = (2, change("c", 2, base, 2, row(2, 0)));
    let delete2 = (2, change("d", 2, base + 64, 1, Value::Null));
    let insert3 = (3, change("c", 3, base + 64, 4, row(3, 0)));
    sink.apply(&batch_of(&topic, vec![insert1.clone(), insert2.clone()], 0))
        .await
        .expect("inserts");
    sink.apply(&batch_of(
        &topic,
        vec![update1.clone(), delete2.clone(), insert3],
        2,
    ))
    .await
    .expect("update and delete");
    let want = BTreeMap::from([("1".to_owned(), row(1, 1)), ("3".to_owned(), row(3, 0))]);
    assert_eq!(rows(&topic).await, want);
    // Older events after newer ones, alone and as a replayed batch.
    sink.apply(&batch_of(&topic, vec![insert1.clone()], 0))
        .await
        .expect("older insert");
    sink.apply(&batch_of(&topic, vec![insert2.clone()], 1))
        .await
        .expect("older insert of a deleted row");
    sink.apply(&batch_of(
        &topic,
        vec![insert1, insert2, update1, delete2],
        0,
    ))
    .await
    .expect("replay");
    assert_eq!(rows(&topic).await, want, "older events change nothing");
    // Same LSN, next ordinal: newer.
    let update3 = (3, change("u", 3, base + 64, 5, row(3, 1)));
    sink.apply(&batch_of(&topic, vec![update3], 5))
        .await
        .expect("next ordinal");
    // One transaction deletes row 3 and inserts it again, in two batches:
    // the delete's tombstone must not refuse the newer insert.
    let delete3 = (3, change("d", 3, base + 64, 6, Value::Null));
    let insert3 = (3, change("c", 3, base + 64, 7, row(3, 2)));
    sink.apply(&batch_of(&topic, vec![delete3.clone()], 6))
        .await
        .expect("delete in the transaction");
    sink.apply(&batch_of(&topic, vec![insert3.clone()], 7))
        .await
        .expect("insert again in the transaction");
    sink.apply(&batch_of(&topic, vec![delete3, insert3], 6))
        .await
        .expect("replay of both");
    assert_eq!(
        rows(&topic).await,
        BTreeMap::from([("1".to_owned(), row(1, 1)), ("3".to_owned(), row(3, 2))]),
        "the row inserted again after its delete is there"
    );
    // A truncate between the rows: row 1 (older) goes, row 4 (newer) stays.
    let insert4 = (4, change("c", 4, base + 255, 0, row(4, 0)));
    sink.apply(&partition_batch(
        &topic,
        0,
        vec![(None, truncate_change(base + 128, 0)), (Some(4), insert4.1)],
        8,
    ))
    .await
    .expect("truncate");
    assert_eq!(
        rows(&topic).await,
        BTreeMap::from([("4".to_owned(), row(4, 0))]),
        "the truncate removed the rows older than it"
    );
    delete_index(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_at_lsns_just_above_2_to_the_43_are_applied() {
    changes_at((1 << 43) + 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_at_the_top_of_the_lsn_space_are_applied() {
    // The last one at FFFFFFFF/FFFFFFFF.
    changes_at(u64::MAX - 255).await;
}

/// A document as an earlier sink version wrote it: external version
/// `lsn << 20 | seq`, also in the `__oncely_version` field.
async fn write_packed(index: &str, id: u64, lsn: u64, seq: u64, row: Value) {
    let packed = (lsn << 20) | seq;
    let mut source = row;
    source[DEFAULT_VERSION_FIELD] = json!(packed);
    let response = es()
        .index(elasticsearch::IndexParts::IndexId(index, &id.to_string()))
        .version(packed as i64)
        .version_type(elasticsearch::params::VersionType::External)
        .body(source)
        .send()
        .await
        .expect("index");
    assert!(response.status_code().is_success(), "{response:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_written_by_the_old_packing_goes_on_below_and_above_2_to_the_43() {
    let topic = unique("es_packed");
    let row = |id: u64, n: u64| json!({"id": id, "n": n});
    for id in 1..=5 {
        write_packed(&topic, id, 1_000, id, row(id, 0)).await;
    }
    let sink = ElasticsearchSink::connect(&sink_config(""))
        .await
        .expect("sink");
    let high = 1u64 << 44;
    sink.apply(&batch_of(
        &topic,
        vec![
            // Older than the stored document: kept out.
            (1, change("u", 1, 900, 0, row(1, 9))),
            // Newer, below 2^43.
            (2, change("u", 2, 2_000, 0, row(2, 1))),
            // Newer, above 2^43.
            (3, change("u", 3, high, 0, row(3, 1))),
            // A delete above 2^43, then the row again.
            (4, change("d", 4, high, 1, Value::Null)),
        ],
        0,
    ))
    .await
    .expect("new events on old documents");
    sink.apply(&batch_of(
        &topic,
        vec![(4, change("c", 4, high + 64, 0, row(4, 1)))],
        4,
    ))
    .await
    .expect("the deleted row again");
    sink.apply(&batch_of(
        &topic,
        vec![(2, change("u", 2, high, 2, row(2, 2)))],
        5,
    ))
    .await
    .expect("a second change above 2^43");
    assert_eq!(
        rows(&topic).await,
        BTreeMap::from([
            ("1".to_owned(), row(1, 0)),
            ("2".to_owned(), row(2, 2)),
            ("3".to_owned(), row(3, 1)),
            ("4".to_owned(), row(4, 1)),
            ("5".to_owned(), row(5, 0)),
        ])
    );
    // A truncate above 2^43 removes the documents of the old packing (1, 5)
    // and the older new ones (2, 3), and keeps the newer one (4).
    sink.apply(&partition_batch(
        &topic,
        0,
        vec![(None, truncate_change(high + 32, 0))],
        6,
    ))
    .await
    .expect("truncate");
    assert_eq!(
        rows(&topic).await,
        BTreeMap::from([("4".to_owned(), row(4, 1))])
    );
    delete_index(&topic).await;
}
