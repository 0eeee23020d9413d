use super::*;

fn col(attnum: i16, name: &str, ty: &str) -> ColumnDef {
    ColumnDef {
        attnum,
        name: name.into(),
        type_name: ty.into(),
        not_null: false,
        has_default: false,
    }
}

#[test]
fn changes_are_matched_by_attnum() {
    let old = vec![
        col(1, "id", "integer"),
        col(2, "a", "integer"),
        col(3, "old", "text"),
    ];
    let mut added = col(4, "c", "integer");
    added.has_default = true;
    let mut renamed = col(2, "b", "bigint");
    renamed.not_null = true;
    let new = vec![col(1, "id", "integer"), renamed, added];
    let changes = diff(&old, &new);
    assert_eq!(
        changes,
        vec![
            ColumnChange::Rename {
                attnum: 2,
                from: "a".into(),
                to: "b".into()
            },
            ColumnChange::AlterType {
                attnum: 2,
                column: "b".into(),
                from: "integer".into(),
                to: "bigint".into()
            },
            ColumnChange::Nullability {
                attnum: 2,
                column: "b".into(),
                not_null: true
            },
            ColumnChange::Drop {
                attnum: 3,
                column: "old".into()
            },
            ColumnChange::Add {
                attnum: 4,
                column: "c".into(),
                type_name: "integer".into(),
                has_default: true
            },
        ]
    );
    let backfills: Vec<bool> = changes.iter().map(ColumnChange::changes_rows).collect();
    assert_eq!(backfills, [true, true, false, true, true]);
    assert!(diff(&old, &old).is_empty());
    // A column added without a default holds NULL in every row: no backfill.
    let plain = diff(&old[..1], &old[..2]);
    assert!(!plain[0].changes_rows(), "{plain:?}");
}

#[test]
fn attnums_are_matched_by_name_in_attnum_order() {
    // RENAME a TO b; ADD COLUMN a: `a` is 2 before the rename, 3 after.
    let known = [(1, "id"), (2, "a"), (2, "b"), (3, "a")];
    assert_eq!(
        match_attnums(&["id", "a"], &known),
        [Some(1), Some(2)],
        "before the rename"
    );
    assert_eq!(
        match_attnums(&["id", "b", "a"], &known),
        [Some(1), Some(2), Some(3)]
    );
    assert_eq!(match_attnums(&["id", "zz"], &known), [Some(1), None]);
}

#[test]
fn former_names_tie_an_older_relation_to_renamed_columns() {
    let mut history = SchemaHistory::default();
    let rename = |attnum, from: &str, to: &str| ColumnChange::Rename {
        attnum,
        from: from.into(),
        to: to.into(),
    };
    // Swap `a` (2) and `b` (3) through `tmp`.
    history.note_renames("public.t", &[rename(2, "a", "tmp")]);
    history.note_renames("public.t", &[rename(3, "b", "a"), rename(2, "tmp", "b")]);
    history.note_renames("public.t", &[rename(3, "b", "a")]);
    let former = history.former_names("public.t");
    assert_eq!(former.len(), 3, "{former:?}");
    // The catalog (and the last published columns) have b = 2, a = 3.
    let mut candidates = vec![(1, "id"), (2, "b"), (3, "a")];
    assert_eq!(
        match_attnums(&["id", "a", "b"], &candidates),
        [Some(1), Some(3), None],
        "without former names the old `b` is lost"
    );
    candidates.extend(former.iter().map(|f| (f.attnum, f.name.as_str())));
    assert_eq!(
        match_attnums(&["id", "a", "b"], &candidates),
        [Some(1), Some(2), Some(3)],
        "the Relation before the swap"
    );
    assert_eq!(
        match_attnums(&["id", "tmp", "b"], &candidates),
        [Some(1), Some(2), Some(3)],
        "the Relation halfway"
    );
    assert_eq!(
        match_attnums(&["id", "b", "a"], &candidates),
        [Some(1), Some(2), Some(3)],
        "the Relation after the swap"
    );
    assert!(history.former_names("public.other").is_empty());
    for n in 0..100 {
        history.note_renames("public.t", &[rename(2, &format!("n{n}"), "b")]);
    }
    let former = history.former_names("public.t");
    assert_eq!(former.len(), FORMER_NAMES_KEPT);
    assert_eq!(former.last().unwrap().name, "n99", "the newest are kept");
}

#[test]
fn the_record_names_the_changes() {
    let changes = [ColumnChange::Rename {
        attnum: 2,
        from: "a".into(),
        to: "b".into(),
    }];
    let (key, value) = record(
        "shop",
        "public.t",
        &changes,
        TableShape {
            columns: &[col(2, "b", "integer")],
            former_names: &[FormerName {
                attnum: 2,
                name: "a".into(),
            }],
        },
        42,
        Some("schema-change-1"),
        7,
    );
    let key: serde_json::Value = serde_json::from_slice(&key).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(key, json!({"schema": "public", "table": "t"}));
    assert_eq!(
        value["changes"],
        json!([{"kind": "rename", "attnum": 2, "from": "a", "to": "b"}])
    );
    assert_eq!(value["columns"][0]["type"], "integer");
    assert_eq!(value["former_names"], json!([{"attnum": 2, "name": "a"}]));
    assert_eq!(value["backfill"], "schema-change-1");
    assert_eq!(value["source"]["lsn"], 42);
}
