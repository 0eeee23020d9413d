use serde_json::json;

use super::*;
use crate::kinds::postgres::types::from_schema;

fn spec(connect: &str) -> ColumnSpec {
    from_schema(&json!({ "type": connect }))
}

fn v(lsn: u64) -> Version {
    Version::new(lsn, 0)
}

fn live(ty: &str, since: Option<u64>) -> Live<'_> {
    Live {
        ty,
        since: since.map(v),
        key: false,
    }
}

fn retired(column: &str, ty: &str, n: u32) -> Retired {
    Retired {
        column: column.into(),
        ty: ty.into(),
        generation: n,
        attnum: Some(3),
        until: v(50),
    }
}

#[test]
fn a_change_neither_way_newer_than_the_column_moves_it() {
    // integer -> boolean: no cast either way.
    assert_eq!(
        fit(&spec("boolean"), v(60), live("integer", Some(10)), &[]),
        Fit::Change
    );
    // A column that records nothing: a conflict was a dead letter; now a move.
    assert_eq!(
        fit(&spec("boolean"), v(60), live("integer", None), &[]),
        Fit::Change
    );
    // One-way (integer -> text) is a change too, followed by a cast.
    assert_eq!(
        fit(&spec("string"), v(60), live("integer", Some(10)), &[]),
        Fit::Change
    );
}

#[test]
fn a_text_column_follows_a_newer_typed_event_only() {
    // text -> integer: the text column would take the digits as text.
    assert_eq!(
        fit(&spec("int32"), v(60), live("text", Some(10)), &[]),
        Fit::Change
    );
    // An integer event older than the column's text type (integer -> text,
    // replayed): the text column takes it, nothing moves back.
    assert_eq!(
        fit(&spec("int32"), v(5), live("text", Some(10)), &[]),
        Fit::Live
    );
    // A text column that records no version keeps taking everything.
    assert_eq!(
        fit(&spec("int32"), v(60), live("text", None), &[]),
        Fit::Live
    );
    assert_eq!(
        fit(&spec("string"), v(60), live("text", Some(10)), &[]),
        Fit::Live
    );
}

#[test]
fn events_from_before_a_generation_go_to_the_retired_column_and_never_move_it_back() {
    let old = retired("__oncely_g1_flag", "integer", 1);
    let older = retired("__oncely_g0_flag", "text", 0);
    // The live column is boolean since version 50; an integer event of
    // version 40 is from before the change.
    assert_eq!(
        fit(
            &spec("int32"),
            v(40),
            live("boolean", Some(50)),
            &[&old, &older]
        ),
        Fit::Retired("__oncely_g1_flag".into())
    );
    // The newest retired generation taking it wins; none: left out.
    assert_eq!(
        fit(&spec("string"), v(40), live("boolean", Some(50)), &[&old]),
        Fit::Left
    );
    assert_eq!(
        fit(&spec("int32"), v(40), live("boolean", Some(50)), &[]),
        Fit::Left
    );
    // The live type itself is always live, whatever the version.
    assert_eq!(
        fit(&spec("boolean"), v(40), live("boolean", Some(50)), &[&old]),
        Fit::Live
    );
    // Newer than the generation: the source changed again.
    assert_eq!(
        fit(&spec("int32"), v(70), live("boolean", Some(50)), &[&old]),
        Fit::Change
    );
}

#[test]
fn keys_widenings_and_schemas_off_never_move() {
    let key = Live {
        ty: "integer",
        since: Some(v(10)),
        key: true,
    };
    assert_eq!(fit(&spec("boolean"), v(60), key, &[]), Fit::Live);
    assert_eq!(
        fit(&spec("int64"), v(60), live("integer", Some(10)), &[]),
        Fit::Live
    );
    let inferred = crate::kinds::postgres::types::infer(&json!(true)).unwrap();
    assert_eq!(
        fit(&inferred, v(60), live("integer", Some(10)), &[]),
        Fit::Live
    );
}

#[test]
fn retired_names_are_deterministic_short_and_free() {
    assert_eq!(retired_name("__oncely_", "flag", 1), "__oncely_g1_flag");
    let long = "é".repeat(40);
    let name = retired_name("__oncely_", &long, 12);
    assert!(
        name.len() <= 63 && name.starts_with("__oncely_g12_é"),
        "{name}"
    );
    // The next generation is above the retired ones and skips taken names.
    let (n, name) = next_generation("__oncely_", "flag", [1, 2].into_iter(), |c| {
        c == "__oncely_g3_flag"
    });
    assert_eq!((n, name.as_str()), (4, "__oncely_g4_flag"));
    // Two long names cut to the same prefix get different generations.
    let a = "a".repeat(70);
    let first = retired_name("__oncely_", &a, 1);
    let (n, _) = next_generation("__oncely_", &format!("{a}b"), std::iter::empty(), |c| {
        c == first
    });
    assert_eq!(n, 2);
}

#[test]
fn comments_record_generations_and_keep_the_attnum() {
    let statements = move_statements(
        "\"wh\".\"t\"",
        ("flag", Some("oncely.attnum=3 oncely.at=10/0"), Some(3)),
        (1, "__oncely_g1_flag"),
        "boolean",
        v(50),
    );
    let all = statements.join(";\n");
    assert!(
        all.contains("RENAME COLUMN \"flag\" TO \"__oncely_g1_flag\""),
        "{all}"
    );
    assert!(all.contains("ADD COLUMN \"flag\" boolean"), "{all}");
    assert!(
        all.contains(
            "'oncely.retired.generation=1 oncely.retired.until=50/0 oncely.retired.attnum=3'"
        ),
        "{all}"
    );
    assert!(
        all.contains("'oncely.attnum=3 oncely.at=10/0 oncely.since=50/0'"),
        "{all}"
    );
    let r = Retired::parse(
        "__oncely_g1_flag",
        "integer",
        "oncely.retired.generation=1 oncely.retired.until=50/0 oncely.retired.attnum=3",
    )
    .unwrap();
    assert!(r.of("flag", Some(3), "__oncely_") && !r.of("flag", Some(4), "__oncely_"));
    assert!(r.of("flag", None, "__oncely_"));
    assert_eq!(
        since_of("oncely.attnum=3 oncely.at=10/0 oncely.since=50/0"),
        Some(v(50))
    );
    assert_eq!(
        Retired::parse("x", "text", "oncely.attnum=3 oncely.at=1/0"),
        None
    );
}

/// PostgreSQL cuts identifiers to 63 bytes at a character boundary.
#[test]
fn a_stored_identifier_is_cut_as_postgresql_cuts_it() {
    let ascii = format!("c{}", "y".repeat(63));
    assert_eq!(stored_identifier(&ascii), &ascii[..63]);
    // 22 three-byte characters (66 bytes): 21 fit.
    let wide = "日".repeat(22);
    assert_eq!(stored_identifier(&wide), "日".repeat(21));
    assert_eq!(stored_identifier("short"), "short");
}
