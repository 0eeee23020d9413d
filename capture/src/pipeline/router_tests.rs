//! The pure change → records mapping: primary-key changes, TOAST fill,
//! tombstones, truncates, and ordinals that agree with the records; and the
//! router's rules for building a route, with a fake of what it asks the
//! source ([`TableCatalog`]) and a test source's tables ([`TestRel`]), so
//! no source database is named.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use super::record::Record;
use super::router::{
    create_needs_source, fill_unchanged_toast, ordinals, records, Followup, Mapping, Resolved,
};
use crate::change::{Change, Datum, OldImage as OldTuple, RowImage, StreamTable};
use crate::config::{CaptureConfig, SkippedOperations};
use crate::envelope::{
    ColumnShape, ColumnType, EnvelopeConfig, EnvelopeError, SnapshotMarker, SourceIdentity,
    SourcePosition, TableEncoder, TableShape, Unrepresentable,
};
use crate::naming::TopicClaims;
use crate::seam::{CatalogTable, RoutedTable, TableCatalog};
use oncely_core::wire::UNAVAILABLE_VALUE;

const INT: u32 = 23;
const TEXT: u32 = 25;

type Relation = TestRel;
type Router = super::router::Router<TestRel>;
type Route = super::router::Route<TestRel>;
type Routes = super::router::Routes<TestRel>;

/// A table as a test source's stream describes it: columns of a type
/// (`INT`, written as a JSON number, or `TEXT`), some flagged as the key
/// its before images carry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TestRel {
    id: u32,
    namespace: String,
    name: String,
    /// Each column's name, type and whether before images carry it.
    columns: Vec<(String, u32, bool)>,
}

impl StreamTable for TestRel {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn width(&self) -> usize {
        self.columns.len()
    }

    fn column_name(&self, i: usize) -> &str {
        &self.columns[i].0
    }

    fn column_type(&self, i: usize) -> u32 {
        self.columns[i].1
    }
}

/// A column the envelope writes as a JSON number or string.
#[derive(Debug)]
struct TestColumn {
    number: bool,
}

impl ColumnType for TestColumn {
    fn field_schema(&self, field: &str, optional: bool) -> serde_json::Value {
        let ty = if self.number { "int32" } else { "string" };
        serde_json::json!({"type": ty, "optional": optional, "field": field})
    }

    fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        if self.number {
            out.extend_from_slice(text.as_bytes());
        } else {
            out.extend_from_slice(serde_json::Value::from(text).to_string().as_bytes());
        }
        Ok(())
    }

    fn refusal_help(&self) -> (&'static str, &'static str) {
        ("", "")
    }
}

impl RoutedTable for TestRel {
    /// The type ids the source knows.
    type Types = BTreeSet<u32>;
    type TypeNote = u32;

    fn id(&self) -> u32 {
        self.id
    }

    fn publish_as(&mut self, namespace: String, name: String) {
        self.namespace = namespace;
        self.name = name;
    }

    fn same_columns(&self, other: &Self) -> bool {
        self.columns == other.columns
    }

    fn stream_key(&self) -> Vec<String> {
        let flagged = self.columns.iter().filter(|c| c.2);
        flagged.map(|c| c.0.clone()).collect()
    }

    fn identity_lacks(&self, qualified: &str, key: &[String]) -> Option<String> {
        let carried = self.stream_key();
        let lacks = !key.iter().all(|k| carried.contains(k));
        lacks.then(|| {
            format!(
                "the before images of {qualified} carry ({}) while its events are keyed by ({})",
                carried.join(", "),
                key.join(", ")
            )
        })
    }

    fn identity_reason(lacks: &str) -> String {
        format!("{lacks}: make them carry the key")
    }

    fn keyless_reason(qualified: &str) -> String {
        format!("table {qualified} has no key")
    }

    fn encoder(
        &self,
        _types: &BTreeSet<u32>,
        key: Option<&[String]>,
        envelope: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<TableEncoder, EnvelopeError> {
        let table = format!("{}.{}", self.namespace, self.name);
        let position = |name: &String| {
            let found = self.columns.iter().position(|c| &c.0 == name);
            found.ok_or_else(|| EnvelopeError::UnknownKeyColumn {
                table: table.clone(),
                column: name.clone(),
            })
        };
        let key = key.map_or_else(|| self.stream_key(), <[String]>::to_vec);
        let key = key.iter().map(position).collect::<Result<Vec<_>, _>>()?;
        if key.is_empty() {
            return Err(EnvelopeError::NoKeyColumns { table });
        }
        let columns = self.columns.iter().map(|(name, ty, _)| ColumnShape {
            name: name.clone(),
            ty: std::sync::Arc::new(TestColumn { number: *ty == INT }),
        });
        let shape = TableShape {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            columns: columns.collect(),
            key,
        };
        TableEncoder::from_shape(&shape, envelope, identity)
    }

    fn observe_type(types: &mut BTreeSet<u32>, note: &u32) -> bool {
        types.insert(*note)
    }
}

fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(values: &[Datum]) -> RowImage {
    RowImage(values.to_vec())
}

fn envelope() -> EnvelopeConfig {
    EnvelopeConfig {
        topic_prefix: "app".into(),
        topic_mapping: Default::default(),
        database: "db".into(),
        schemas_enable: false,
        columns: Default::default(),
    }
}

/// Table `public.docs<id>` (`id int` key, `big text`), routed to its topic.
fn table(id: u32) -> (u32, Option<Route>) {
    let rel = Relation {
        id,
        namespace: "public".into(),
        name: format!("docs{id}"),
        columns: [("id", INT), ("big", TEXT)]
            .iter()
            .map(|(name, type_oid)| ((*name).into(), *type_oid, *name == "id"))
            .collect(),
    };
    let enc = rel
        .encoder(&BTreeSet::new(), None, &envelope(), None)
        .unwrap();
    let topic: Arc<str> = enc.topic().into();
    (id, Some(Route::Table(enc, topic)))
}

fn routes() -> Routes {
    [table(1), table(2), (3, None)].into_iter().collect()
}

fn at(event_seq: u64) -> SourcePosition {
    SourcePosition {
        tx_id: 7,
        lsn: 90,
        commit_lsn: 100,
        event_seq,
        commit_ts_ms: 1,
        snapshot: SnapshotMarker::False,
    }
}

fn map(change: Change, resolved: Resolved, tombstones: bool) -> (Vec<Record>, u64) {
    map_skipping(change, resolved, tombstones, SkippedOperations::default())
}

fn map_skipping(
    change: Change,
    resolved: Resolved,
    tombstones: bool,
    skipped: SkippedOperations,
) -> (Vec<Record>, u64) {
    let env = envelope();
    let m = Mapping {
        envelope: &env,
        tombstones,
        skipped,
        now_ms: 2,
    };
    let routes = routes();
    let expected = ordinals(&routes, &change).unwrap();
    let (records, used) = records(&routes, change, &at(4), resolved, &m).unwrap();
    assert_eq!(used, expected, "ordinals agree with the records");
    (records, used)
}

/// A record's value as JSON (`Null` for a tombstone).
fn value(r: &Record) -> serde_json::Value {
    r.value.as_deref().map_or(serde_json::Value::Null, |v| {
        serde_json::from_slice(v).unwrap()
    })
}

fn pk_change(old: OldTuple, new: RowImage) -> Change {
    Change::Update {
        table: 1,
        old: Some(old),
        new,
    }
}

#[test]
fn a_primary_key_change_is_a_delete_and_a_create_with_the_next_ordinal() {
    let change = pk_change(
        OldTuple::Key(row(&[text("1"), Datum::Null])),
        row(&[text("2"), text("b")]),
    );
    let (out, used) = map(change, Resolved::default(), true);
    assert_eq!(used, 2);
    assert_eq!(out.len(), 3, "delete, tombstone, create");
    assert_eq!(value(&out[0])["op"], "d");
    assert_eq!(value(&out[0])["source"]["event_seq"], 4);
    assert!(out[1].value.is_none(), "the tombstone");
    assert_eq!(out[1].key, out[0].key);
    assert_eq!(value(&out[2])["op"], "c");
    assert_eq!(value(&out[2])["source"]["event_seq"], 5);
    assert_ne!(out[2].key, out[0].key);

    let change = pk_change(
        OldTuple::Key(row(&[text("1"), Datum::Null])),
        row(&[text("2"), text("b")]),
    );
    let (out, _) = map(change, Resolved::default(), false);
    assert_eq!(
        out.len(),
        2,
        "no tombstone when tombstones.on.delete is off"
    );
}

#[test]
fn a_primary_key_change_carries_unchanged_toast_from_the_old_row_or_the_source() {
    let unchanged = row(&[text("2"), Datum::Unchanged]);
    // REPLICA IDENTITY FULL: the old row has the value; nothing to read.
    let full = OldTuple::Full(row(&[text("1"), text("big")]));
    assert!(create_needs_source(&enc(), Some(&full), &unchanged).is_none());
    let (out, _) = map(
        pk_change(full, unchanged.clone()),
        Resolved::default(),
        false,
    );
    assert_eq!(value(&out[1])["after"]["big"], "big");

    // Only the key in the old row: the create's row is read from the source.
    let key_only = OldTuple::Key(row(&[text("1"), Datum::Null]));
    let (columns, wanted) = create_needs_source(&enc(), Some(&key_only), &unchanged).unwrap();
    assert_eq!(
        (columns, wanted.clone()),
        (vec!["id".to_owned()], unchanged.clone())
    );
    let resolved = Resolved {
        created: Some(row(&[text("2"), text("read")])),
        ..Resolved::default()
    };
    let (out, _) = map(
        pk_change(key_only.clone(), unchanged.clone()),
        resolved,
        false,
    );
    assert_eq!(value(&out[1])["after"]["big"], "read");
    // The row gone from the source: the value stays marked unavailable.
    let (out, _) = map(pk_change(key_only, unchanged), Resolved::default(), false);
    assert_eq!(value(&out[1])["after"]["big"], UNAVAILABLE_VALUE);
}

fn enc() -> TableEncoder {
    match table(1).1 {
        Some(Route::Table(enc, _)) => enc,
        _ => unreachable!("table() routes to a table"),
    }
}

#[test]
fn an_update_keeping_its_key_is_one_event_and_reads_nothing() {
    let old = OldTuple::Full(row(&[text("1"), text("big")]));
    let new = row(&[text("1"), Datum::Unchanged]);
    assert!(create_needs_source(&enc(), Some(&old), &new).is_none());
    let (out, used) = map(pk_change(old, new), Resolved::default(), true);
    assert_eq!((out.len(), used), (1, 1));
    assert_eq!(value(&out[0])["op"], "u");
    assert_eq!(
        value(&out[0])["after"]["big"],
        "big",
        "filled from the old row"
    );
}

#[test]
fn a_truncate_is_one_event_per_captured_table_on_every_partition() {
    let change = Change::Truncate {
        tables: vec![1, 3, 2],
    };
    let resolved = Resolved {
        partitions: HashMap::from([(1, 3), (2, 1)]),
        ..Resolved::default()
    };
    let (out, used) = map(change, resolved, true);
    assert_eq!(used, 2, "table 3 is not captured");
    let parts: Vec<(Option<i32>, serde_json::Value)> = out
        .iter()
        .map(|r| (r.partition, value(r)["source"]["event_seq"].clone()))
        .collect();
    assert_eq!(
        parts,
        [
            (Some(0), 4.into()),
            (Some(1), 4.into()),
            (Some(2), 4.into()),
            (Some(0), 5.into())
        ]
    );
}

fn skipping(letters: &str) -> SkippedOperations {
    SkippedOperations::try_from(letters.to_owned()).unwrap()
}

/// Each kind of change under `skipped.operations`: the ops left, and the
/// ordinals used (the same whatever is skipped).
fn ops_skipping(change: Change, letters: &str) -> (Vec<String>, u64) {
    let resolved = Resolved {
        partitions: HashMap::from([(1, 2)]),
        ..Resolved::default()
    };
    let (out, used) = map_skipping(change, resolved, true, skipping(letters));
    let ops = out
        .iter()
        .map(|r| match value(r)["op"].as_str() {
            Some(op) => op.to_owned(),
            None => "tombstone".to_owned(),
        })
        .collect();
    (ops, used)
}

#[test]
fn skipped_operations_publish_nothing_of_their_kind_and_keep_every_ordinal() {
    let insert = || Change::Insert {
        table: 1,
        new: row(&[text("1"), text("a")]),
    };
    let update = || {
        pk_change(
            OldTuple::Key(row(&[text("1"), Datum::Null])),
            row(&[text("1"), text("b")]),
        )
    };
    let key_change = || {
        pk_change(
            OldTuple::Key(row(&[text("1"), Datum::Null])),
            row(&[text("2"), text("b")]),
        )
    };
    let delete = || Change::Delete {
        table: 1,
        old: OldTuple::Key(row(&[text("1"), Datum::Null])),
    };
    let truncate = || Change::Truncate { tables: vec![1] };
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    for letters in ["none", "", "c,u,d,t"] {
        let all = letters == "c,u,d,t";
        let expect = |v: &[&str]| if all { Vec::new() } else { s(v) };
        assert_eq!(
            ops_skipping(insert(), letters),
            (expect(&["c"]), 1),
            "{letters:?}"
        );
        assert_eq!(
            ops_skipping(update(), letters),
            (expect(&["u"]), 1),
            "{letters:?}"
        );
        assert_eq!(
            ops_skipping(key_change(), letters),
            (expect(&["d", "tombstone", "c"]), 2),
            "{letters:?}"
        );
        assert_eq!(
            ops_skipping(delete(), letters),
            (expect(&["d", "tombstone"]), 1),
            "{letters:?}"
        );
        assert_eq!(
            ops_skipping(truncate(), letters),
            (expect(&["t", "t"]), 1),
            "{letters:?}"
        );
    }
    // A primary-key change is a delete and a create, each skipped by its
    // own letter; the create keeps the second ordinal.
    assert_eq!(ops_skipping(key_change(), "d"), (s(&["c"]), 2));
    assert_eq!(ops_skipping(key_change(), "c"), (s(&["d", "tombstone"]), 2));
    assert_eq!(
        ops_skipping(key_change(), "u"),
        (s(&["d", "tombstone", "c"]), 2)
    );
    assert_eq!(ops_skipping(update(), "c, d ,t"), (s(&["u"]), 1));
    assert_eq!(ops_skipping(insert(), "u,d,t"), (s(&["c"]), 1));
    assert_eq!(ops_skipping(truncate(), "c,u,d"), (s(&["t", "t"]), 1));
}

#[test]
fn skipped_operations_name_the_letters_they_take() {
    let err = SkippedOperations::try_from("c,x".to_owned()).unwrap_err();
    assert!(
        err.contains("\"x\"") && err.contains("c (inserts)"),
        "{err}"
    );
    assert_eq!(skipping("none"), SkippedOperations::default());
    assert!(SkippedOperations::try_from("none,c".to_owned()).is_err());
}

#[test]
fn changes_of_tables_not_captured_publish_nothing_and_take_one_ordinal() {
    let change = Change::Insert {
        table: 3,
        new: row(&[text("1")]),
    };
    let (out, used) = map(change, Resolved::default(), true);
    assert!(out.is_empty());
    assert_eq!(used, 1);
    let unknown = Change::Insert {
        table: 9,
        new: row(&[text("1")]),
    };
    assert!(ordinals(&routes(), &unknown).is_ok());
    let env = envelope();
    let m = Mapping {
        envelope: &env,
        tombstones: true,
        skipped: SkippedOperations::default(),
        now_ms: 0,
    };
    assert!(records(&routes(), unknown, &at(1), Resolved::default(), &m).is_err());
}

#[test]
fn full_identity_fills_unchanged_toast() {
    let old = row(&[text("1"), text("big")]);
    let new = row(&[text("1"), Datum::Unchanged]);
    assert_eq!(fill_unchanged_toast(&new, &old).unwrap(), old);
    // The old row itself unavailable: stays marked.
    let old = row(&[text("1"), Datum::Unchanged]);
    assert_eq!(
        fill_unchanged_toast(&new, &old).unwrap().0[1],
        Datum::Unchanged
    );
    // Nothing unchanged: no copy.
    assert!(fill_unchanged_toast(&row(&[text("1")]), &row(&[text("1")])).is_none());
}

// The router's own rules, with a fake of what it asks the source.

/// The catalog as a test sets it: tables by relation id, partition roots,
/// and how often a table's key was asked for.
#[derive(Default)]
struct FakeCatalog {
    tables: HashMap<u32, CatalogTable>,
    roots: HashMap<u32, (String, String)>,
    asked: usize,
    types_learnt: usize,
}

impl FakeCatalog {
    /// `schema.name` is relation `id`, keyed by `id`.
    fn with(mut self, id: u32, schema: &str, name: &str) -> Self {
        self.tables.insert(
            id,
            CatalogTable {
                schema: schema.into(),
                name: name.into(),
                primary_key: vec!["id".into()],
            },
        );
        self
    }
}

impl TableCatalog for FakeCatalog {
    type Table = Relation;
    type Types = BTreeSet<u32>;

    async fn published_as(
        &mut self,
        rel: &Relation,
    ) -> Result<Option<(String, String)>, crate::error::CaptureError> {
        Ok(self.roots.get(&rel.id).cloned())
    }

    async fn current(
        &mut self,
        rel: &Relation,
    ) -> Result<Option<CatalogTable>, crate::error::CaptureError> {
        self.asked += 1;
        Ok(self.tables.get(&rel.id).cloned())
    }

    async fn identity(
        &mut self,
        _qualified: &str,
        _rel: &Relation,
    ) -> Result<Option<crate::envelope::SourceIdentity>, crate::error::CaptureError> {
        Ok(None)
    }

    async fn learn_types(
        &mut self,
        _types: &mut BTreeSet<u32>,
    ) -> Result<(), crate::error::CaptureError> {
        self.types_learnt += 1;
        Ok(())
    }
}

fn router(settings: &str) -> Router {
    let text = format!(
        "topic.prefix = \"shop\"\ndatabase.hostname = \"127.0.0.1\"\n\
         database.user = \"postgres\"\ndatabase.dbname = \"shop\"\n\
         kafka.bootstrap.servers = \"127.0.0.1:9092\"\n{settings}"
    );
    let cfg = CaptureConfig::parse(&text, "test").unwrap();
    Router::new(
        &cfg,
        TopicClaims::default(),
        HashMap::new(),
        BTreeSet::new(),
    )
    .unwrap()
}

/// A Relation message for `schema.name`: `id int` (its key) and text columns.
fn relation(id: u32, schema: &str, name: &str, text_columns: &[&str]) -> Relation {
    let columns = std::iter::once(("id", INT))
        .chain(text_columns.iter().map(|c| (*c, TEXT)))
        .map(|(name, type_oid)| (name.into(), type_oid, name == "id"))
        .collect();
    Relation {
        id,
        namespace: schema.into(),
        name: name.into(),
        columns,
    }
}

fn topic_of(router: &Router, id: u32) -> Option<String> {
    match router.route(id).unwrap() {
        Some(Route::Table(_, topic)) => Some(topic.to_string()),
        _ => None,
    }
}

#[tokio::test]
async fn a_relation_gets_a_table_route_keyed_as_the_catalog_says() {
    let mut router = router("");
    let mut catalog = FakeCatalog::default().with(10, "public", "orders");
    let rel = relation(10, "public", "orders", &["note"]);
    assert!(!router.on_relation(rel, &mut catalog).await.unwrap());
    assert!(
        !router.has_route(10),
        "built on the first change, not before"
    );
    let followup = router.build(10, &mut catalog, |_| false).await.unwrap();
    assert_eq!(
        followup,
        Followup::Captured {
            table: "public.orders".into(),
            topic: "shop.public.orders".into()
        }
    );
    assert_eq!(topic_of(&router, 10).as_deref(), Some("shop.public.orders"));
    assert_eq!(
        router.key_columns("public.orders"),
        Some(&vec!["id".to_owned()])
    );
    assert_eq!(
        router
            .table_of_topic("shop.public.orders")
            .map(String::as_str),
        Some("public.orders")
    );
    // A relation no Relation message described is a protocol error.
    assert!(router.build(11, &mut catalog, |_| false).await.is_err());
}

#[tokio::test]
async fn a_second_table_on_a_topic_another_holds_is_set_aside() {
    let mut router = router("");
    // Both become `shop.public.a_b`: Kafka cannot tell them apart.
    let mut catalog = FakeCatalog::default()
        .with(11, "public", "a b")
        .with(12, "public", "a_b");
    for rel in [
        relation(11, "public", "a b", &[]),
        relation(12, "public", "a_b", &[]),
    ] {
        router.on_relation(rel, &mut catalog).await.unwrap();
    }
    let first = router.build(11, &mut catalog, |_| false).await.unwrap();
    assert!(matches!(first, Followup::Captured { .. }));
    let second = router.build(12, &mut catalog, |_| false).await.unwrap();
    let Followup::SetAside { table, reason } = second else {
        panic!("the second table is set aside, not {second:?}");
    };
    assert_eq!(table, "public.a_b");
    assert!(
        reason.contains("topic.name.mapping"),
        "names the fix: {reason}"
    );
    assert!(matches!(
        router.route(12).unwrap(),
        Some(Route::Quarantined(t)) if t == "public.a_b"
    ));
    assert_eq!(topic_of(&router, 11).as_deref(), Some("shop.public.a_b"));

    // A table quarantined already stays set aside, the catalog not asked.
    let asked = catalog.asked;
    router
        .on_relation(relation(11, "public", "a b", &[]), &mut catalog)
        .await
        .unwrap();
    let again = router
        .build(11, &mut catalog, |t| t == "public.a b")
        .await
        .unwrap();
    assert_eq!(again, Followup::Nothing, "quarantined before: nothing new");
    assert!(matches!(
        router.route(11).unwrap(),
        Some(Route::Quarantined(_))
    ));
    assert_eq!(catalog.asked, asked);
    // Released: its route is built again on its next change.
    router.release("public.a b");
    assert!(!router.has_route(11));
}

#[tokio::test]
async fn a_changed_relation_replaces_the_route() {
    let mut router = router("");
    let mut catalog = FakeCatalog::default().with(10, "public", "orders");
    let before = relation(10, "public", "orders", &["note"]);
    router
        .on_relation(before.clone(), &mut catalog)
        .await
        .unwrap();
    router.build(10, &mut catalog, |_| false).await.unwrap();
    // The same columns again: not a change, though the route is built anew.
    assert!(!router.on_relation(before, &mut catalog).await.unwrap());
    assert!(!router.has_route(10));
    router.build(10, &mut catalog, |_| false).await.unwrap();

    let after = relation(10, "public", "orders", &["note", "extra"]);
    assert!(
        router.on_relation(after, &mut catalog).await.unwrap(),
        "a column added: the schema watch compares now"
    );
    assert!(!router.has_route(10), "the old route is forgotten");
    assert!(router.route(10).is_err());
    router.build(10, &mut catalog, |_| false).await.unwrap();
    let env = envelope();
    let m = Mapping {
        envelope: &env,
        tombstones: true,
        skipped: SkippedOperations::default(),
        now_ms: 0,
    };
    let insert = Change::Insert {
        table: 10,
        new: row(&[text("1"), text("n"), text("x")]),
    };
    let (out, _) = router
        .records(insert, &at(1), Resolved::default(), &m)
        .unwrap();
    // With schemas (the default), the envelope is the payload.
    let payload = &value(&out[0])["payload"];
    assert_eq!(payload["after"]["extra"], "x", "the new shape");
}

#[tokio::test]
async fn a_new_description_replaces_the_old_whose_handles_survive() {
    let mut router = router("");
    let mut catalog = FakeCatalog::default();
    let narrow = relation(10, "public", "orders", &[]);
    router.on_relation(narrow, &mut catalog).await.unwrap();
    let first = Arc::clone(router.relation(10).unwrap());
    let wide = relation(10, "public", "orders", &["note"]);
    router.on_relation(wide, &mut catalog).await.unwrap();
    assert_eq!(first.columns.len(), 1, "a handle keeps the shape it had");
    assert_eq!(router.relation_of(10).unwrap().columns.len(), 2);
    assert!(router.relation(11).is_none() && router.relation_of(11).is_err());
}

#[tokio::test]
async fn a_table_the_filter_leaves_out_gets_no_route() {
    let mut router = router("table.include.list = \"public.orders\"\n");
    let mut catalog = FakeCatalog::default()
        .with(10, "public", "orders")
        .with(13, "public", "audit");
    router
        .on_relation(relation(13, "public", "audit", &[]), &mut catalog)
        .await
        .unwrap();
    let followup = router.build(13, &mut catalog, |_| false).await.unwrap();
    assert_eq!(followup, Followup::Nothing);
    assert!(router.has_route(13));
    assert!(router.route(13).unwrap().is_none());
    assert_eq!(catalog.asked, 0, "nothing read for a table not captured");
    assert!(!router.captures("public", "audit"));
    assert!(router.captures("public", "orders"));
}

#[tokio::test]
async fn a_partition_is_routed_as_its_root() {
    let mut router = router("");
    let mut catalog = FakeCatalog::default().with(20, "public", "events");
    catalog.roots.insert(20, ("public".into(), "events".into()));
    router
        .on_relation(relation(20, "public", "events_2026", &[]), &mut catalog)
        .await
        .unwrap();
    assert_eq!(router.relation(20).unwrap().name, "events");
    router.build(20, &mut catalog, |_| false).await.unwrap();
    assert_eq!(topic_of(&router, 20).as_deref(), Some("shop.public.events"));
}

#[tokio::test]
async fn the_signal_table_is_routed_to_its_commands() {
    let mut router = router("signal.data.collection = \"public.signals\"\n");
    let mut catalog = FakeCatalog::default();
    router
        .on_relation(relation(30, "public", "signals", &["type"]), &mut catalog)
        .await
        .unwrap();
    let followup = router.build(30, &mut catalog, |_| false).await.unwrap();
    assert_eq!(
        followup,
        Followup::Nothing,
        "no topic: nothing is published"
    );
    assert!(matches!(router.route(30).unwrap(), Some(Route::Signal(_))));
}

/// `message.key.columns` keys `public.orders` by `note`, which its replica
/// identity (the primary key `id`) does not carry.
async fn keyed_by_a_column_outside_the_identity(check: &str) -> (Router, Followup, usize) {
    let mut router = router(&format!(
        "message.key.columns = \"public.orders:note\"\nreplica.identity.check = \"{check}\"\n"
    ));
    let mut catalog = FakeCatalog::default().with(10, "public", "orders");
    router
        .on_relation(relation(10, "public", "orders", &["note"]), &mut catalog)
        .await
        .unwrap();
    let followup = router.build(10, &mut catalog, |_| false).await.unwrap();
    (router, followup, catalog.asked)
}

#[tokio::test]
async fn an_identity_without_the_event_key_sets_the_table_aside_unless_warned() {
    let (router, followup, asked) = keyed_by_a_column_outside_the_identity("fail").await;
    assert_eq!(
        asked, 0,
        "the setting decides the key; the catalog is not read"
    );
    let Followup::SetAside { table, reason } = followup else {
        panic!("set aside, not {followup:?}");
    };
    assert_eq!(table, "public.orders");
    assert!(reason.contains("keyed by (note)"), "{reason}");
    assert!(matches!(
        router.route(10).unwrap(),
        Some(Route::Quarantined(_))
    ));

    let (router, followup, _) = keyed_by_a_column_outside_the_identity("warn").await;
    assert!(matches!(followup, Followup::Captured { .. }));
    let Some(Route::Table(enc, _)) = router.route(10).unwrap() else {
        panic!("published under \"warn\"");
    };
    assert_eq!(enc.key_column_names().collect::<Vec<_>>(), ["note"]);
}

#[tokio::test]
async fn a_type_created_while_streaming_is_learnt_once_and_routes_are_built_again() {
    let mut router = router("");
    let mut catalog = FakeCatalog::default().with(10, "public", "orders");
    router
        .on_relation(relation(10, "public", "orders", &["note"]), &mut catalog)
        .await
        .unwrap();
    router.build(10, &mut catalog, |_| false).await.unwrap();
    let mood = 90_001;
    router.on_type(&mood, &mut catalog).await.unwrap();
    assert_eq!(catalog.types_learnt, 1);
    assert!(
        !router.has_route(10),
        "encoders may hold the type as unknown"
    );
    router.build(10, &mut catalog, |_| false).await.unwrap();
    // Announced again (before each Relation using it): nothing new.
    router.on_type(&mood, &mut catalog).await.unwrap();
    assert_eq!(catalog.types_learnt, 1);
    assert!(router.has_route(10));
}

/// A key column excluded: refused at start for a table whose key start-up
/// read, and the table set aside naming column and key when only its first
/// change tells the key.
#[tokio::test]
async fn a_key_column_excluded_is_refused_at_start_or_sets_its_table_aside() {
    let text = "topic.prefix = \"shop\"\ndatabase.hostname = \"127.0.0.1\"\n\
         database.user = \"postgres\"\ndatabase.dbname = \"shop\"\n\
         kafka.bootstrap.servers = \"127.0.0.1:9092\"\n\
         column.exclude.list = \"public\\\\.users\\\\.(id|note)\"\n";
    let cfg = CaptureConfig::parse(text, "test").unwrap();
    let keys = HashMap::from([("public.users".to_string(), vec!["id".to_string()])]);
    let Err(e) = Router::new(&cfg, TopicClaims::default(), keys, BTreeSet::new()) else {
        panic!("a key column excluded must refuse the start");
    };
    let e = e.to_string();
    assert!(
        e.contains("key column id of table public.users is excluded")
            && e.contains("(key of public.users: id)"),
        "{e}"
    );

    let mut router = router("column.exclude.list = \"public\\\\.users\\\\.(id|note)\"\n");
    let mut catalog = FakeCatalog::default().with(11, "public", "users");
    let rel = relation(11, "public", "users", &["note"]);
    router.on_relation(rel, &mut catalog).await.unwrap();
    let Followup::SetAside { table, reason } =
        router.build(11, &mut catalog, |_| false).await.unwrap()
    else {
        panic!("set aside");
    };
    assert_eq!(table, "public.users");
    assert!(
        reason.contains("key column id of table public.users is excluded"),
        "{reason}"
    );
}

/// The outbox publishes its payload as written: a column setting naming
/// one of its columns stops capture, naming the column.
#[tokio::test]
async fn a_column_setting_on_the_outbox_table_is_refused() {
    let mut router = router(
        "outbox.table = \"public.outbox\"\n\"column.mask.with.3.chars\" = \"public.outbox.payload\"\n",
    );
    let mut catalog = FakeCatalog::default().with(20, "public", "outbox");
    let rel = relation(20, "public", "outbox", &["payload"]);
    router.on_relation(rel, &mut catalog).await.unwrap();
    let Err(e) = router.build(20, &mut catalog, |_| false).await else {
        panic!("a masked outbox column must be refused");
    };
    let e = e.to_string();
    assert!(
        e.contains("column payload of the outbox table public.outbox is excluded or masked"),
        "{e}"
    );
}
