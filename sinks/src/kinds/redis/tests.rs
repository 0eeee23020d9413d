//! Unit tests of the parts that need no server: config, keys, values, chunks, replies.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::config::Layout;
use super::config::DEFAULT_VERSION_FIELD as VF;
use super::keys::{key_set, KeyPattern};
use oncely_core::wire::UNAVAILABLE_VALUE;

use super::plan::{keys_to_merge, merge_json, plan, Body, HashRow, Naming};
use super::script::{decode_version, encode_version, pack_str, Reply};
use crate::event::{decode_value, Version};
use crate::kinds::{parse_config, SinkConfig};
use crate::native::ValueFormat;
use crate::sink::{Batch, Record};

const HEAD: &str = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n";

fn event_record(offset: i64, id: i64, op: &str, row: Value, lsn: u64, seq: u64) -> Record {
    let (before, after) = if op == "d" {
        (row, Value::Null)
    } else {
        (Value::Null, row)
    };
    let value = json!({
        "before": before, "after": after, "op": op,
        "source": {"db": "shop", "schema": "public", "table": "orders", "commit_lsn": lsn, "event_seq": seq},
    });
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("valid envelope");
    Record::new(offset, Some(json!({ "id": id })), payload)
}

fn naming(keys: &KeyPattern) -> Naming<'_> {
    Naming {
        keys,
        version_field: VF,
        keyset_prefix: "ks:",
    }
}

fn batch(records: Vec<Record>) -> Batch {
    Batch::new(Arc::from("g"), (Arc::from("t"), 0), records, 100)
}

#[test]
fn config_parses_bare_and_quoted_dotted_keys() {
    std::env::set_var("ONCELY_SINKS_TEST_REDIS_PASSWORD", "pw-from-env");
    let (_, sink) = parse_config(&format!(
        "{HEAD}[sink]\nkind = \"redis\"\nurl = \"redis://h:1\"\nlayout = \"json\"\n\
         key.pattern = \"c:{{table}}:{{key}}\"\n\"tombstone.ttl.seconds\" = 60\n\
         password = \"${{env:ONCELY_SINKS_TEST_REDIS_PASSWORD}}\"\n"
    ))
    .expect("valid");
    let SinkConfig::Redis(c) = sink else {
        panic!("not a redis config")
    };
    assert_eq!(c.layout, Layout::Json);
    assert_eq!(c.key_pattern, "c:{table}:{key}");
    assert_eq!(c.tombstone_ttl_seconds, 60);
    assert_eq!(c.script_max_changes, 1000);
    // Resolved when the configuration is read, and never printed.
    let password = c.password.as_ref().expect("password");
    assert_eq!(password.expose(), "pw-from-env");
    assert!(
        !format!("{c:?}").contains("pw-from-env"),
        "secret printed: {c:?}"
    );
}

#[test]
fn an_unset_password_variable_fails_at_load_naming_the_key() {
    let e = parse_config(&format!(
        "{HEAD}[sink]\nkind = \"redis\"\nurl = \"redis://h:1\"\n\
         password = \"${{env:ONCELY_SINKS_TEST_SURELY_UNSET}}\"\n"
    ))
    .expect_err("unset variable");
    assert_eq!(e.key, "sink");
    assert!(
        e.message.contains("key `password`")
            && e.message.contains("ONCELY_SINKS_TEST_SURELY_UNSET"),
        "{e}"
    );
}

#[test]
fn config_errors_name_the_key() {
    let bad = |body: &str| {
        parse_config(&format!("{HEAD}[sink]\nkind = \"redis\"\n{body}\n"))
            .expect_err(body)
            .key
    };
    assert_eq!(bad("url = \"http://x\""), "sink.url");
    assert_eq!(bad("key.pattern = \"{table}\""), "sink.key.pattern");
    assert_eq!(bad("key.pattern = \"{tabel}:{key}\""), "sink.key.pattern");
    assert_eq!(bad("script.max.changes = 0"), "sink.script.max.changes");
    assert_eq!(bad("username = \"u\""), "sink.password");
    assert_eq!(bad("version.key.prefix = \"\""), "sink.version.key.prefix");
    assert_eq!(bad("tls.ca.file = \"/ca.pem\""), "sink.tls.ca.file");
    assert_eq!(bad("version.field = \"\""), "sink.version.field");
    // Keys must stay injective: text between placeholders, no escape character in the separator.
    assert_eq!(bad("key.pattern = \"{table}{key}\""), "sink.key.pattern");
    assert_eq!(bad("key.separator = \"\\\\\""), "sink.key.separator");
    let e = parse_config(&format!(
        "{HEAD}[sink]\nkind = \"redis\"\nlayot = \"hash\"\n"
    ))
    .expect_err("typo");
    assert!(e.message.contains("layot"), "{e}");
    let e = parse_config(&format!(
        "{HEAD}[sink]\nkind = \"redis\"\nvalue.format = \"raw\"\n"
    ))
    .expect_err("unknown format");
    assert!(
        e.message.contains("raw") && e.message.contains("native") && e.message.contains("wire"),
        "{e}"
    );
}

#[test]
fn value_format_is_native_unless_wire_is_asked_for() {
    let format = |body: &str| {
        let (_, sink) =
            parse_config(&format!("{HEAD}[sink]\nkind = \"redis\"\n{body}\n")).expect("valid");
        let SinkConfig::Redis(c) = sink else {
            panic!("not a redis config")
        };
        c.value_format
    };
    assert_eq!(format(""), ValueFormat::Native);
    assert_eq!(format("value.format = \"wire\""), ValueFormat::Wire);
    assert_eq!(format("\"value.format\" = \"native\""), ValueFormat::Native);
}

/// A change with schemas on: dates and JSON in native form per layout;
/// without a schema, or under `value.format = "wire"`, as sent.
#[test]
fn rows_are_planned_in_native_form_from_their_schema() {
    let fields = json!([
        {"field": "id", "type": "int64"},
        {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
        {"field": "j", "type": "string", "name": "io.debezium.data.Json"},
    ]);
    let value = json!({
        "schema": {"type": "struct", "fields": [
            {"field": "before", "type": "struct", "fields": fields},
            {"field": "after", "type": "struct", "fields": fields},
        ]},
        "payload": {"before": null, "after": {"id": 1, "d": 16661, "j": "{\"a\": 1}"}, "op": "c",
            "source": {"db": "shop", "schema": "public", "table": "orders", "commit_lsn": 5, "event_seq": 0}},
    });
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("valid envelope");
    let b = batch(vec![Record::new(0, Some(json!({"id": 1})), payload)]);
    let keys = KeyPattern::new("{table}:{key}", ":");
    let row_of = |layout: Layout, format: ValueFormat| -> Value {
        let changes = plan(&b, layout, format, naming(&keys)).expect("plan");
        match &changes[0].body {
            Body::Hash(row) => Value::Object(
                text_fields(row)
                    .into_iter()
                    .map(|(f, v)| (f, Value::String(v)))
                    .collect(),
            ),
            Body::Json { row, .. } => Value::Object(row.clone()),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        row_of(Layout::Hash, ValueFormat::Native),
        json!({"id": "1", "d": "2015-08-14", "j": "{\"a\": 1}"})
    );
    assert_eq!(
        row_of(Layout::Json, ValueFormat::Native),
        json!({"id": 1, "d": "2015-08-14", "j": {"a": 1}})
    );
    assert_eq!(
        row_of(Layout::Hash, ValueFormat::Wire),
        json!({"id": "1", "d": "16661", "j": "{\"a\": 1}"})
    );
    assert_eq!(
        row_of(Layout::Json, ValueFormat::Wire),
        json!({"id": 1, "d": 16661, "j": "{\"a\": 1}"})
    );
}

#[test]
fn versions_encode_to_digits_that_sort_like_versions() {
    let vs = [
        Version::new(0, 0),
        Version::new(9, u64::MAX),
        Version::new(10, 0),
        Version::new(u64::MAX, 3),
    ];
    for pair in vs.windows(2) {
        assert!(
            encode_version(pair[0]) < encode_version(pair[1]),
            "{pair:?}"
        );
    }
    for v in vs {
        let text = encode_version(v);
        assert_eq!(text.len(), 40);
        assert_eq!(decode_version(&text), Some(v));
    }
    assert_eq!(decode_version("12"), None);
}

#[test]
fn keys_render_from_the_pattern() {
    let r = event_record(1, 7, "c", json!({"id": 7}), 1, 0);
    let e = r.event().expect("event");
    let p = KeyPattern::new("{db}.{schema}.{table}:{key}@{topic}", "|");
    assert_eq!(
        p.render("t", e, &json!({"a": 1, "b": "x"})),
        "shop.public.orders:1|x@t"
    );
    assert_eq!(
        KeyPattern::new("{table}:{key}", ":").render("t", e, &json!({"id": 7})),
        "orders:7"
    );
    assert_eq!(
        KeyPattern::new("c:{key}:{key}!", ":").render("t", e, &json!({"id": "a"})),
        "c:a:a!"
    );
}

#[test]
fn keys_holding_the_separator_stay_apart_and_split_back() {
    let r = event_record(1, 7, "c", json!({"id": 7}), 1, 0);
    let e = r.event().expect("event");
    let p = KeyPattern::new("{table}:{key}", ":");
    let one = p.render("t", e, &json!({"a": "a:b", "b": "c"}));
    let two = p.render("t", e, &json!({"a": "a", "b": "b:c"}));
    assert_eq!(one, "orders:a\\:b:c");
    assert_eq!(two, "orders:a:b\\:c");
    let three = p.render("t", e, &json!({"a": "a\\", "b": "b"}));
    let four = p.render("t", e, &json!({"a": "a", "b": "\\b"}));
    assert_ne!(three, four);
    let prefix = "orders:";
    for (key, values) in [
        (&one, vec!["a:b", "c"]),
        (&two, vec!["a", "b:c"]),
        (&three, vec!["a\\", "b"]),
        (&four, vec!["a", "\\b"]),
    ] {
        let inner = key.strip_prefix(prefix).expect("prefix");
        assert_eq!(p.split_key(inner), values, "{key}");
    }
    // Names with the pattern's characters are escaped too: table `a:b` key
    // `c` is not table `a` key (`b`, `c`).
    let q = KeyPattern::new("{schema}.{table}:{key}", ":");
    let k1 = q.render_row("t", ["d", "s", "a:b"], [&json!("c")]);
    let k2 = q.render_row("t", ["d", "s", "a"], [&json!("b"), &json!("c")]);
    assert_ne!(k1, k2);
    assert_eq!(q.table_part("t", ["d", "s.x", "a"]), "s\\.x.a:{key}");
    // The pattern's other text is not escaped in values.
    let r = KeyPattern::new("cache_v1:{table}:{key}", ":");
    assert_eq!(
        r.render_row("t", ["d", "s", "order_items"], [&json!("a_b.c")]),
        "cache_v1:order_items:a_b.c"
    );
    // Integers and text without special characters are as before.
    assert_eq!(p.render("t", e, &json!({"id": 7})), "orders:7");
}

/// Key sets are named with the row keys' escaping: dotted names never share
/// one, and names without `.` or `\` keep the set they always had.
#[test]
fn key_sets_of_dotted_names_stay_apart() {
    let set = |db: &str, schema: &str, table: &str| {
        let value = json!({"op": "t", "source": {"db": db, "schema": schema, "table": table, "commit_lsn": 1, "event_seq": 0}});
        let payload = decode_value(Some(value.to_string().as_bytes())).expect("truncate");
        let record = Record::new(0, None, payload);
        key_set("ks:", "topic.a", record.event().expect("event"))
    };
    assert_eq!(set("shop", "a.b", "c"), "ks:shop.a\\.b.c");
    assert_eq!(set("shop", "a", "b.c"), "ks:shop.a.b\\.c");
    assert_eq!(set("s.h", "a", "b"), "ks:s\\.h.a.b");
    assert_eq!(set("shop", "a\\", "b"), "ks:shop.a\\\\.b");
    assert_eq!(set("shop", "public", "orders"), "ks:shop.public.orders");
}

#[test]
fn hash_rows_skip_unavailable_and_unset_nulls() {
    let row = json!({"id": 1, "note": null, "body": UNAVAILABLE_VALUE, "n": "1.50", "ok": true, "tags": [1, 2]});
    let b = batch(vec![event_record(5, 1, "u", row, 10, 2)]);
    let changes = plan(
        &b,
        Layout::Hash,
        ValueFormat::Native,
        naming(&KeyPattern::new("{table}:{key}", ":")),
    )
    .expect("plan");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].row_key, "orders:1");
    assert_eq!(
        changes[0].version_str(),
        encode_version(Version::new(10, 2))
    );
    let Body::Hash(row) = &changes[0].body else {
        panic!("not a hash body")
    };
    let set = text_fields(row);
    assert_eq!(
        set,
        vec![
            ("id".to_string(), "1".to_string()),
            ("n".to_string(), "1.50".to_string()),
            ("ok".to_string(), "true".to_string()),
            ("tags".to_string(), "[1,2]".to_string())
        ]
    );
    assert_eq!(&row.names[..], ["id", "n", "ok", "tags"]);
    // The write itself: the row key, then its version in the version field, then the fields.
    let head: Vec<String> = row
        .hset
        .args_iter()
        .take(4)
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => panic!("a cursor argument"),
        })
        .collect();
    assert_eq!(
        head,
        [
            "HSET",
            "orders:1",
            "_oncely_version",
            &encode_version(Version::new(10, 2))
        ]
    );
    let keep = &row.keep;
    // `note` (null) gets no field; `body` (unchanged TOAST) keeps the stored one.
    assert_eq!(*keep, ["body"]);
}

/// A hash row's fields as (name, value) text, as written.
fn text_fields(row: &HashRow) -> Vec<(String, String)> {
    row.fields()
        .map(|(f, v)| {
            (
                String::from_utf8_lossy(f).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect()
}

#[test]
fn a_column_named_like_the_version_field_is_rejected() {
    let row = json!({"id": 1, "_oncely_version": "x"});
    let b = batch(vec![event_record(5, 1, "u", row, 10, 2)]);
    let keys = KeyPattern::new("{table}:{key}", ":");
    let failures =
        plan(&b, Layout::Hash, ValueFormat::Native, naming(&keys)).expect_err("collision");
    assert_eq!(failures[0].offset, 5);
    assert!(failures[0].reason.contains("version.field"), "{failures:?}");
    // The JSON layout keeps versions apart from rows: no collision there.
    assert!(plan(&b, Layout::Json, ValueFormat::Native, naming(&keys)).is_ok());
}

#[test]
fn packed_strings_are_messagepack_strings() {
    let mut out = Vec::new();
    for len in [0usize, 31, 32, 255, 256, 65_535, 65_536] {
        out.clear();
        let text = vec![b'x'; len];
        pack_str(&mut out, &text);
        let header: &[u8] = match len {
            0 => &[0xa0],
            31 => &[0xbf],
            32 => &[0xd9, 32],
            255 => &[0xd9, 255],
            256 => &[0xda, 1, 0],
            65_535 => &[0xda, 0xff, 0xff],
            _ => &[0xdb, 0, 1, 0, 0],
        };
        assert_eq!(&out[..header.len()], header, "{len}");
        assert_eq!(&out[header.len()..], &text[..], "{len}");
    }
}

#[test]
fn tombstones_and_messages_are_skipped_truncates_kept_in_order() {
    let tombstone = Record::new(2, Some(json!({"id": 1})), crate::event::Payload::Tombstone);
    let b = batch(vec![
        event_record(1, 1, "d", json!({"id": 1}), 5, 0),
        tombstone,
    ]);
    let changes = plan(
        &b,
        Layout::Hash,
        ValueFormat::Native,
        naming(&KeyPattern::new("{table}:{key}", ":")),
    )
    .expect("plan");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].body, Body::Delete);
    assert_eq!(changes[0].key_set, "ks:shop.public.orders");

    let value = json!({"op": "t", "source": {"db": "shop", "schema": "public", "table": "orders", "commit_lsn": 9, "event_seq": 2}});
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("truncate");
    let b = batch(vec![
        event_record(2, 1, "c", json!({"id": 1}), 9, 1),
        Record::new(3, None, payload),
        event_record(4, 1, "c", json!({"id": 1}), 9, 3),
    ]);
    let changes = plan(
        &b,
        Layout::Hash,
        ValueFormat::Native,
        naming(&KeyPattern::new("{table}:{key}", ":")),
    )
    .expect("plan");
    assert_eq!(changes.len(), 3);
    assert_eq!(changes[1].body, Body::Truncate);
    assert_eq!(changes[1].offset, 3);
    assert_eq!(changes[1].key_set, "ks:shop.public.orders");
    assert_eq!(changes[1].version_str(), encode_version(Version::new(9, 2)));
}

#[test]
fn json_merge_forgets_rows_a_truncate_removed() {
    let keys = KeyPattern::new("{table}:{key}", ":");
    let truncate = json!({"op": "t", "source": {"db": "shop", "schema": "public", "table": "orders", "commit_lsn": 30, "event_seq": 1}});
    let b = batch(vec![
        Record::new(
            1,
            None,
            decode_value(Some(truncate.to_string().as_bytes())).expect("t"),
        ),
        event_record(
            2,
            1,
            "u",
            json!({"id": 1, "body": UNAVAILABLE_VALUE}),
            30,
            2,
        ),
    ]);
    let mut changes = plan(&b, Layout::Json, ValueFormat::Native, naming(&keys)).expect("plan");
    let mut stored = HashMap::new();
    stored.insert(
        "orders:1".to_string(),
        (
            Some(encode_version(Version::new(10, 0))),
            Some(r#"{"id":1,"body":"before the truncate"}"#.to_string()),
        ),
    );
    merge_json(&mut changes, stored);
    let Body::Json { row, unavailable } = &changes[1].body else {
        panic!("not json")
    };
    assert_eq!(super::plan::json_text(row, unavailable), r#"{"id":1}"#);
}

#[test]
fn json_merge_takes_unavailable_columns_from_the_newest_prior_row() {
    let keys = KeyPattern::new("{table}:{key}", ":");
    let b = batch(vec![
        // Older than what is stored: skipped, must not become the base.
        event_record(1, 1, "u", json!({"id": 1, "body": "stale", "rev": 0}), 5, 0),
        event_record(
            2,
            1,
            "u",
            json!({"id": 1, "body": UNAVAILABLE_VALUE, "rev": 2}),
            20,
            0,
        ),
        event_record(3, 1, "u", json!({"id": 1, "body": "new", "rev": 3}), 21, 0),
        event_record(
            4,
            1,
            "u",
            json!({"id": 1, "body": UNAVAILABLE_VALUE, "rev": 4}),
            22,
            0,
        ),
        // Not cached anywhere: the column is left out.
        event_record(
            5,
            2,
            "u",
            json!({"id": 2, "body": UNAVAILABLE_VALUE, "rev": 1}),
            23,
            0,
        ),
    ]);
    let mut changes = plan(&b, Layout::Json, ValueFormat::Native, naming(&keys)).expect("plan");
    assert_eq!(keys_to_merge(&changes), vec!["orders:1", "orders:2"]);
    let mut stored = HashMap::new();
    stored.insert(
        "orders:1".to_string(),
        (
            Some(encode_version(Version::new(10, 0))),
            Some(r#"{"id":1,"body":"stored","rev":1}"#.to_string()),
        ),
    );
    stored.insert("orders:2".to_string(), (None, None));
    merge_json(&mut changes, stored);
    let text = |i: usize| match &changes[i].body {
        Body::Json { row, unavailable } => super::plan::json_text(row, unavailable),
        other => panic!("not json: {other:?}"),
    };
    assert_eq!(text(1), r#"{"id":1,"body":"stored","rev":2}"#);
    assert_eq!(text(3), r#"{"id":1,"body":"new","rev":4}"#);
    assert_eq!(text(4), r#"{"id":2,"rev":1}"#);
}

#[test]
fn script_replies_parse() {
    assert_eq!(
        Reply::parse(&[0, 3, 1]),
        Some(Reply::Done {
            applied: 3,
            skipped: 1
        })
    );
    assert_eq!(Reply::parse(&[1, 2, 5]), Some(Reply::WrongType(vec![1, 4])));
    assert_eq!(Reply::parse(&[1]), None);
    assert_eq!(Reply::parse(&[7, 1, 1]), None);
}

#[test]
fn the_annotated_example_is_valid() {
    let text = include_str!("../../../../examples/sink-redis.toml");
    let (runner, sink) = parse_config(text).expect("examples/sink-redis.toml is valid");
    assert_eq!(runner.group_id, "oncely-cache");
    let SinkConfig::Redis(c) = sink else {
        panic!("not a redis config")
    };
    assert_eq!(c.tombstone_ttl_seconds, 604_800);
    assert_eq!(c.layout, Layout::Hash);
}
