use super::*;
use crate::event::decode_value;
use serde_json::json;

fn list(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn exclude(items: &[&str]) -> FieldSelection {
    FieldSelection::parse(&[], &list(items))
        .expect("valid")
        .expect("set")
}

fn include(items: &[&str]) -> FieldSelection {
    FieldSelection::parse(&list(items), &[])
        .expect("valid")
        .expect("set")
}

#[test]
fn lists_are_exact_names_either_bare_or_qualified_and_never_both_kinds() {
    assert_eq!(FieldSelection::parse(&[], &[]).expect("valid"), None);
    let both = FieldSelection::parse(&list(&["a"]), &list(&["b"])).expect_err("both");
    assert_eq!(both.key, INCLUDE_KEY);
    assert!(both.message.contains(EXCLUDE_KEY), "{both}");
    for bad in ["", "a.b", "a..c", ".b.c", "a.b.c.d"] {
        let e = FieldSelection::parse(&[], &list(&[bad])).expect_err(bad);
        assert_eq!(e.key, EXCLUDE_KEY, "{bad}");
        assert!(e.message.contains("<schema>.<table>.<column>"), "{e}");
    }
    let s = exclude(&["secret", "public.users.email"]);
    assert_eq!(s.mode(), Mode::Exclude);
    assert!(!s.keeps("public", "users", "secret", false));
    assert!(!s.keeps("other", "t", "secret", false));
    assert!(!s.keeps("public", "users", "email", false));
    // A qualified entry is for its table only; names are exact (no regex, no case folding).
    assert!(s.keeps("public", "orders", "email", false));
    assert!(s.keeps("public", "users", "Secret", false));
    assert!(s.keeps("public", "users", "secre.", false));
    let s = include(&["name", "public.users.email"]);
    assert!(s.keeps("public", "users", "email", false));
    assert!(s.keeps("x", "y", "name", false));
    assert!(!s.keeps("public", "orders", "email", false));
    assert!(!s.keeps("public", "users", "secret", false));
    // Key fields are kept whether listed or not.
    assert!(s.keeps("public", "users", "id", true));
}

#[test]
fn an_excluded_key_field_is_refused_naming_the_entry_and_the_fix() {
    let s = exclude(&["public.users.id", "note"]);
    let why = s
        .refuse_key("public", "users", ["tenant", "id"])
        .expect("refused");
    assert!(
        why.contains("`public.users.id`")
            && why.contains("`id` is a key field of public.users")
            && why.contains("remove `public.users.id` from sink.fields.exclude"),
        "{why}"
    );
    assert_eq!(s.refuse_key("public", "orders", ["id"]), None);
    assert!(s.refuse_key("a", "b", ["note"]).is_some());
    // Include lists keep key fields, so they never refuse one.
    assert_eq!(include(&["x"]).refuse_key("public", "users", ["id"]), None);
}

/// An update of `public.users` with schemas: key `id`, columns `id`, `name`, `secret`.
fn update(offset: i64, id: i64, secret: &str) -> Record {
    let image = |name: &str| json!({"id": id, "name": name, "secret": secret});
    let columns = json!([
        {"type": "int64", "optional": false, "field": "id"},
        {"type": "string", "optional": true, "field": "name"},
        {"type": "string", "optional": true, "field": "secret"}
    ]);
    let value = json!({
        "schema": {"type": "struct", "fields": [
            {"type": "struct", "optional": true, "field": "before", "fields": columns},
            {"type": "struct", "optional": true, "field": "after", "fields": columns},
            {"type": "struct", "optional": false, "field": "source", "fields": []},
            {"type": "string", "optional": false, "field": "op"}
        ]},
        "payload": {
            "before": image("old"), "after": image("new"), "op": "u",
            "source": {"schema": "public", "table": "users", "commit_lsn": 100 + offset, "event_seq": 0}
        }
    });
    let payload = decode_value(Some(value.to_string().as_bytes())).expect("decode");
    Record::new(offset, Some(json!({"id": id})), payload)
}

fn batch(records: Vec<Record>) -> Batch {
    let next = records.last().map_or(0, |r| r.offset + 1);
    Batch::new(Arc::from("g"), (Arc::from("t"), 0), records, next)
}

/// Keeps every batch it is handed.
#[derive(Default)]
struct Seen(Mutex<Vec<Batch>>);

#[async_trait]
impl Sink for Seen {
    fn name(&self) -> &str {
        "seen"
    }
    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        self.0.lock().expect("lock").push(batch.clone());
        Ok(())
    }
}

/// Every column name the sink was handed, in images and schemas.
fn columns_seen(seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    for b in seen.0.lock().expect("lock").iter() {
        for r in b.records() {
            let e = r.event().expect("event");
            for image in [&e.before, &e.after].into_iter().flatten() {
                out.extend(image.keys().cloned());
            }
            let fields = crate::event::row_fields(e.schema.as_deref()).expect("schema");
            out.extend(fields.keys().map(|k| format!("schema:{k}")));
            let text = serde_json::to_string(e.schema.as_deref().expect("schema")).expect("json");
            out.extend(
                text.contains("\"secret\"")
                    .then(|| "schema:before:secret".to_owned()),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test]
async fn the_sink_is_handed_no_left_out_column_prepared_or_not() {
    for prepared in [true, false] {
        let seen = Arc::new(Seen::default());
        let sink = select(seen.clone(), Some(exclude(&["secret"])));
        let mut b = batch(vec![update(0, 1, "MARKER"), update(1, 2, "MARKER")]);
        if prepared {
            sink.prepare(&mut b);
        }
        sink.apply(&b).await.expect("applied");
        assert_eq!(
            columns_seen(&seen),
            ["id", "name", "schema:id", "schema:name"],
            "prepared: {prepared}"
        );
    }
    let seen = Arc::new(Seen::default());
    let sink = select(seen.clone(), Some(include(&["name"])));
    let mut b = batch(vec![update(0, 1, "MARKER")]);
    sink.prepare(&mut b);
    // A dead letter removed from the batch leaves the rest selected.
    b.remove_offsets(&[5]);
    sink.apply(&b).await.expect("applied");
    assert_eq!(
        columns_seen(&seen),
        ["id", "name", "schema:id", "schema:name"]
    );
}

#[tokio::test]
async fn a_record_keyed_by_an_excluded_field_stops_the_sink_before_it_writes() {
    let seen = Arc::new(Seen::default());
    let sink = select(seen.clone(), Some(exclude(&["id"])));
    let mut b = batch(vec![update(7, 1, "x")]);
    sink.prepare(&mut b);
    let e = sink.apply(&b).await.expect_err("refused");
    assert!(e.is_fatal(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("offset 7") && text.contains("remove `id` from sink.fields.exclude"),
        "{text}"
    );
    assert!(seen.0.lock().expect("lock").is_empty());
}

#[test]
fn a_rewritten_schema_is_shared_by_the_events_of_its_table() {
    let seen = Arc::new(Seen::default());
    let sink = select(seen, Some(exclude(&["secret"])));
    let (a, b) = (update(0, 1, "x"), update(1, 2, "y"));
    // Two decodes of the same text share no Arc; the same Arc shares its rewrite.
    let shared = a.event().and_then(|e| e.schema.clone()).expect("schema");
    let mut records = vec![a, b];
    if let Payload::Change(e) = &mut records[1].payload {
        e.schema = Some(shared);
    }
    let mut batch = batch(records);
    sink.prepare(&mut batch);
    let schemas: Vec<_> = batch
        .records()
        .iter()
        .map(|r| r.event().and_then(|e| e.schema.clone()).expect("schema"))
        .collect();
    assert!(Arc::ptr_eq(&schemas[0], &schemas[1]));
}

#[test]
fn a_list_naming_no_column_of_a_table_is_told_once_for_that_table() {
    let selecting = |fields| SelectingSink {
        inner: Arc::new(Seen::default()),
        fields,
        schemas: SchemaCache::default(),
        told: Mutex::default(),
    };
    let event = |r: &Record| r.event().cloned().expect("event");
    let users = event(&update(0, 1, "x"));
    let mut orders = users.clone();
    orders.source.insert("table".into(), json!("orders"));
    let sink = selecting(include(&["public.orders.name"]));
    let told = sink.unmatched(&users).expect("told");
    assert!(
        told.contains("public.users: sink.fields.include names none of its columns"),
        "{told}"
    );
    assert_eq!(sink.unmatched(&users), None, "once per table");
    assert_eq!(sink.unmatched(&orders), None, "orders.name is listed");
    let sink = selecting(exclude(&["nothing_here"]));
    assert!(sink.unmatched(&orders).is_some());
    let sink = selecting(exclude(&["secret"]));
    assert_eq!(sink.unmatched(&users), None);
}

#[test]
fn two_tables_sharing_one_decoded_schema_get_their_own_selection() {
    let sink = select(
        Arc::new(Seen::default()),
        Some(exclude(&["public.users.secret"])),
    );
    let users = update(0, 1, "x");
    let shared = users
        .event()
        .and_then(|e| e.schema.clone())
        .expect("schema");
    let mut orders = update(1, 2, "y");
    if let Payload::Change(e) = &mut orders.payload {
        e.source.insert("table".into(), json!("orders"));
        e.schema = Some(shared);
    }
    let mut b = batch(vec![users, orders]);
    sink.prepare(&mut b);
    let has_secret: Vec<bool> = b
        .records()
        .iter()
        .map(|r| {
            let e = r.event().expect("event");
            let schema = crate::event::row_fields(e.schema.as_deref()).expect("schema");
            schema.contains_key("secret")
                && e.after.as_ref().is_some_and(|a| a.contains_key("secret"))
        })
        .collect();
    assert_eq!(has_secret, [false, true]);
}
