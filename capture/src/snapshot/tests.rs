use std::collections::BTreeSet;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

fn facts<'a>(
    mode: SnapshotMode,
    stored: Option<(bool, Option<&'a BTreeSet<String>>)>,
    captured: &'a [String],
) -> StartFacts<'a> {
    StartFacts {
        mode,
        stored,
        gap: false,
        first_life: true,
        new_tables: false,
        captured,
    }
}

#[test]
fn each_mode_without_a_stored_offset() {
    let tables = vec!["public.a".to_string()];
    let all = Some((SnapshotKind::Initial, tables.clone()));
    for (mode, snapshot, exit) in [
        (SnapshotMode::Initial, all.clone(), false),
        (SnapshotMode::NoData, None, false),
        (SnapshotMode::InitialOnly, all.clone(), true),
        (SnapshotMode::WhenNeeded, all.clone(), false),
        (SnapshotMode::Always, all.clone(), false),
    ] {
        let plan = plan_start(facts(mode, None, &tables)).unwrap();
        assert_eq!(plan.snapshot, snapshot, "{mode:?}");
        assert_eq!(plan.exit_when_done, exit, "{mode:?}");
        assert!(!plan.restart_from_slot);
    }
}

#[test]
fn each_mode_with_a_stored_offset() {
    let tables = vec!["public.a".to_string()];
    for mode in [
        SnapshotMode::Initial,
        SnapshotMode::NoData,
        SnapshotMode::InitialOnly,
        SnapshotMode::WhenNeeded,
    ] {
        let plan = plan_start(facts(mode, Some((false, None)), &tables)).unwrap();
        assert_eq!(plan.snapshot, None, "{mode:?}");
    }
    let plan = plan_start(facts(SnapshotMode::Always, Some((false, None)), &tables)).unwrap();
    assert_eq!(plan.snapshot, Some((SnapshotKind::Initial, tables.clone())));
    // A restart after an error is not a new start; a running snapshot resumes.
    let mut f = facts(SnapshotMode::Always, Some((false, None)), &tables);
    f.first_life = false;
    assert_eq!(plan_start(f).unwrap().snapshot, None);
    let f = facts(SnapshotMode::Always, Some((true, None)), &tables);
    assert_eq!(plan_start(f).unwrap().snapshot, None);
}

#[test]
fn a_gap_re_snapshots_only_where_the_mode_says_so() {
    let tables = vec!["public.a".to_string()];
    for mode in [
        SnapshotMode::Initial,
        SnapshotMode::NoData,
        SnapshotMode::InitialOnly,
    ] {
        let mut f = facts(mode, Some((false, None)), &tables);
        f.gap = true;
        assert_eq!(plan_start(f), Err(GapRefused), "{mode:?}");
    }
    for mode in [SnapshotMode::WhenNeeded, SnapshotMode::Always] {
        let mut f = facts(mode, Some((true, None)), &tables);
        f.gap = true;
        let plan = plan_start(f).unwrap();
        assert!(plan.restart_from_slot);
        assert_eq!(plan.snapshot, Some((SnapshotKind::Initial, tables.clone())));
    }
}

#[test]
fn new_tables_are_snapshotted_when_configured() {
    let tables = vec!["public.a".to_string(), "public.b".to_string()];
    let known: BTreeSet<String> = ["public.a".to_string()].into();
    let mut f = facts(SnapshotMode::Initial, Some((false, Some(&known))), &tables);
    assert_eq!(plan_start(f).unwrap().snapshot, None);
    f.new_tables = true;
    assert_eq!(
        plan_start(f).unwrap().snapshot,
        Some((SnapshotKind::Incremental, vec!["public.b".to_string()]))
    );
    // An offset that lists no tables (written before they were recorded) cannot tell.
    let f = StartFacts {
        new_tables: true,
        ..facts(SnapshotMode::Initial, Some((false, None)), &tables)
    };
    assert_eq!(plan_start(f).unwrap().snapshot, None);
}

#[test]
fn requests_start_or_extend_a_snapshot() {
    let mut slot = None;
    let added = request(
        &mut slot,
        "s1".into(),
        SnapshotKind::Incremental,
        vec![TableProgress::new("public.a", None)],
    );
    assert_eq!(added, vec!["public.a"]);
    let added = request(
        &mut slot,
        "s2".into(),
        SnapshotKind::Initial,
        vec![
            TableProgress::new("public.a", None),
            TableProgress::new("public.b", Some("x".into())),
        ],
    );
    assert_eq!(added, vec!["public.b"]);
    let running = slot.unwrap();
    assert_eq!(running.id, "s1");
    assert_eq!(running.kind, SnapshotKind::Incremental);
    assert_eq!(running.tables.len(), 2);
    // Nothing to copy starts nothing.
    let mut empty = None;
    assert!(request(&mut empty, "x".into(), SnapshotKind::Initial, vec![]).is_empty());
    assert!(empty.is_none());
}

#[test]
fn chunk_query_compares_rows_and_casts_literals() {
    let key = [
        KeyColumn {
            name: "tenant".into(),
            type_name: "text".into(),
        },
        KeyColumn {
            name: "id".into(),
            type_name: "integer".into(),
        },
    ];
    let cols = ["tenant".to_string(), "id".into(), "we\"ird".into()];
    let first = chunk_query("public", "t", &cols, &key, None, None, 11);
    assert_eq!(
        first,
        r#"SELECT "tenant", "id", "we""ird" FROM "public"."t" ORDER BY "tenant", "id" LIMIT 11"#
    );
    let after = [Some("O'Neil".to_string()), Some("7".to_string())];
    let next = chunk_query(
        "public",
        "t",
        &cols,
        &key,
        Some(&after),
        Some("id % 2 = 0"),
        11,
    );
    assert_eq!(
        next,
        r#"SELECT "tenant", "id", "we""ird" FROM "public"."t" WHERE ("tenant", "id") > ('O''Neil'::text, '7'::integer) AND (id % 2 = 0) ORDER BY "tenant", "id" LIMIT 11"#
    );
}

#[test]
fn row_keys_take_key_columns_and_refuse_unknown_values() {
    let row = RowImage(vec![
        Datum::Text(Bytes::from_static(b"1")),
        Datum::Null,
        Datum::Unchanged,
    ]);
    assert_eq!(
        row_key(&row, &[1, 0]),
        Some(vec![None, Some(Bytes::from_static(b"1"))])
    );
    assert_eq!(row_key(&row, &[2]), None);
    assert_eq!(row_key(&row, &[9]), None);
}

#[test]
fn progress_round_trips_and_reads_without_optional_fields() {
    let mut p = SnapshotProgress::new(
        "initial-1".into(),
        SnapshotKind::Initial,
        vec![TableProgress::new("public.a", Some("x > 1".into()))],
    );
    p.tables[0].last_key = Some(vec![Some("a".into()), None]);
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<SnapshotProgress>(&json).unwrap(), p);
    let minimal: SnapshotProgress =
        serde_json::from_str(r#"{"id":"s","kind":"incremental","tables":[{"table":"public.a"}]}"#)
            .unwrap();
    assert_eq!(minimal.tables[0], TableProgress::new("public.a", None));
    assert!(!minimal.paused);
}

#[test]
fn chunk_ids_differ() {
    assert_ne!(new_chunk_id(1), new_chunk_id(2));
}

proptest! {
    #[test]
    fn watermarks_round_trip(id in "[a-z0-9:-]{1,40}", high in any::<bool>()) {
        let side = if high { Watermark::High } else { Watermark::Low };
        let content = watermark_content(&id, side);
        prop_assert_eq!(parse_watermark(content.as_bytes()), Some((id.as_str(), side)));
    }

    #[test]
    fn literals_never_end_early(s in "\\PC*") {
        let q = quote_literal(&s);
        // Outside the enclosing quotes, quotes only come in doubled pairs.
        let inner = &q[1..q.len() - 1];
        prop_assert!(!inner.replace("''", "").contains('\''));
        prop_assert_eq!(inner.replace("''", "'"), s);
    }
}

#[test]
fn a_table_whose_copy_began_is_copied_again_when_requested_again() {
    // Rows of chunks published before a request are older than it; whoever
    // requests (a sink recovering a gap removes every row older than its
    // request) needs every row copied after it.
    let mut slot = None;
    request(
        &mut slot,
        "s1".into(),
        SnapshotKind::Incremental,
        vec![TableProgress::new("public.a", None)],
    );
    let running = slot.as_mut().unwrap();
    running.tables[0].chunks = 1;
    running.tables[0].last_key = Some(vec![Some("7".into())]);
    let added = request(
        &mut slot,
        "s2".into(),
        SnapshotKind::Incremental,
        vec![TableProgress::new("public.a", None)],
    );
    assert_eq!(added, vec!["public.a"]);
    let tables = &slot.as_ref().unwrap().tables;
    assert_eq!(tables.len(), 2);
    assert_eq!(tables[1].last_key, None);
    // Queued again and not begun: requesting once more adds nothing.
    let added = request(
        &mut slot,
        "s3".into(),
        SnapshotKind::Incremental,
        vec![TableProgress::new("public.a", None)],
    );
    assert!(added.is_empty());
}
