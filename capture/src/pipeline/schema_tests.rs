//! The schema watch without services: which catalog columns make a
//! schema-change record, which queue a backfill, and the backfill queue.

use std::sync::Arc;

use super::schema::{queue_backfill, SchemaWatch, Seen};
use crate::config::SchemaChangeBackfill;
use crate::offset::SourceOffset;
use crate::schema_change::{ColumnDef, SchemaHistory, TableSchemas};

fn column(attnum: i16, name: &str, type_name: &str) -> ColumnDef {
    ColumnDef {
        attnum,
        name: name.into(),
        type_name: type_name.into(),
        not_null: false,
        has_default: false,
    }
}

fn catalog(table: &str, columns: Vec<ColumnDef>) -> TableSchemas {
    [(table.to_owned(), columns)].into_iter().collect()
}

fn seen(backfill: SchemaChangeBackfill) -> Seen<'static> {
    Seen {
        connector: "oncely",
        backfill,
        at_lsn: 0x100,
        now_ms: 1,
    }
}

fn watch() -> SchemaWatch {
    SchemaWatch::new(Arc::from("app.schema-changes"), SchemaHistory::default())
}

#[test]
fn a_table_seen_the_first_time_gets_a_record_but_is_no_change() {
    let mut watch = watch();
    let mut queued = Vec::new();
    let compared = watch.compare(
        catalog("public.t", vec![column(1, "id", "integer")]),
        &seen(SchemaChangeBackfill::Auto),
        |t| {
            queued.push(t.to_owned());
            "id".into()
        },
    );
    assert_eq!(compared.records.len(), 1);
    assert_eq!(compared.changes, 0);
    assert_eq!(&*compared.records[0].topic, "app.schema-changes");
    assert_eq!(compared.records[0].partition, Some(0));
    assert!(queued.is_empty(), "{queued:?}");
}

#[test]
fn unchanged_columns_make_no_record() {
    let mut watch = watch();
    let columns = vec![column(1, "id", "integer")];
    watch.compare(
        catalog("public.t", columns.clone()),
        &seen(SchemaChangeBackfill::Auto),
        |_| unreachable_id(),
    );
    let compared = watch.compare(
        catalog("public.t", columns),
        &seen(SchemaChangeBackfill::Auto),
        |_| unreachable_id(),
    );
    assert!(compared.records.is_empty());
    assert_eq!(compared.changes, 0);
}

#[test]
fn a_change_of_rows_queues_a_backfill_only_under_auto() {
    for (backfill, expected) in [
        (SchemaChangeBackfill::Auto, vec!["public.t".to_owned()]),
        (SchemaChangeBackfill::Off, Vec::new()),
    ] {
        let mut watch = watch();
        watch.compare(
            catalog("public.t", vec![column(1, "id", "integer")]),
            &seen(backfill),
            |_| unreachable_id(),
        );
        let mut queued = Vec::new();
        let compared = watch.compare(
            catalog("public.t", vec![column(1, "id", "bigint")]),
            &seen(backfill),
            |t| {
                queued.push(t.to_owned());
                "snap".into()
            },
        );
        assert_eq!(compared.records.len(), 1);
        assert_eq!(compared.changes, 1);
        assert_eq!(queued, expected, "{backfill:?}");
    }
}

#[test]
fn a_backfill_joins_the_running_snapshot_once() {
    let mut stage = SourceOffset::start(0);
    let id = queue_backfill(&mut stage, false, "public.t");
    assert!(id.starts_with("schema-change-"), "{id}");
    // Queued and not started: it reads the new rows anyway.
    assert_eq!(queue_backfill(&mut stage, false, "public.t"), id);
    assert_eq!(stage.snapshot.as_ref().map(|p| p.tables.len()), Some(1));
    // Its first chunk in flight may have read rows before the change.
    assert_eq!(queue_backfill(&mut stage, true, "public.t"), id);
    assert_eq!(stage.snapshot.as_ref().map(|p| p.tables.len()), Some(2));
}

fn unreachable_id() -> String {
    panic!("no backfill expected")
}
