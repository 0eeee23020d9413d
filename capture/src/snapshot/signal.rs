//! Signals: rows inserted into the table named by `signal.data.collection`
//! (columns `id`, `type`, `data`, as Debezium's), parsed into actions.
//!
//! A signal that cannot be understood is reported with its reason and
//! changes nothing; it never stops capture.

use serde_json::Value;

/// What a signal asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::enum_variant_names,
    reason = "one variant per Debezium signal type: execute-snapshot, stop-snapshot, ..."
)]
pub enum SignalAction {
    /// Snapshot these tables (`schema.table`, optional filter), incrementally.
    ExecuteSnapshot {
        tables: Vec<(String, Option<String>)>,
    },
    /// Stop snapshotting these tables, or everything when `None`.
    StopSnapshot {
        tables: Option<Vec<String>>,
    },
    PauseSnapshot,
    ResumeSnapshot,
}

/// Parses a signal's `type` and `data` columns.
pub fn parse(kind: &str, data: Option<&str>) -> Result<SignalAction, String> {
    let json = || -> Result<Option<Value>, String> {
        match data.map(str::trim).filter(|d| !d.is_empty()) {
            None => Ok(None),
            Some(d) => serde_json::from_str(d)
                .map(Some)
                .map_err(|e| format!("data is not JSON ({e}): {d}")),
        }
    };
    match kind {
        "execute-snapshot" => {
            let data = json()?.ok_or("execute-snapshot needs data with \"data-collections\"")?;
            check_type(&data)?;
            let tables = collections(&data)?.ok_or(
                "execute-snapshot needs \"data-collections\": [\"schema.table\", ...] in data",
            )?;
            if tables.is_empty() {
                return Err("\"data-collections\" is empty".into());
            }
            let filters = conditions(&data)?;
            let tables = tables
                .into_iter()
                .map(|t| {
                    let filter = filters
                        .iter()
                        .find(|(table, _)| table.as_deref().is_none_or(|n| n == t))
                        .map(|(_, f)| f.clone());
                    (t, filter)
                })
                .collect();
            Ok(SignalAction::ExecuteSnapshot { tables })
        }
        "stop-snapshot" => {
            let tables = match json()? {
                Some(data) => {
                    check_type(&data)?;
                    collections(&data)?.filter(|t| !t.is_empty())
                }
                None => None,
            };
            Ok(SignalAction::StopSnapshot { tables })
        }
        "pause-snapshot" => Ok(SignalAction::PauseSnapshot),
        "resume-snapshot" => Ok(SignalAction::ResumeSnapshot),
        other => Err(format!(
            "unknown signal type {other:?} (known: execute-snapshot, stop-snapshot, pause-snapshot, resume-snapshot)"
        )),
    }
}

/// Only incremental snapshots exist here; Debezium's `blocking` is refused.
fn check_type(data: &Value) -> Result<(), String> {
    match data.get("type") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if t.eq_ignore_ascii_case("incremental") => Ok(()),
        Some(other) => Err(format!(
            "snapshot type {other} is not supported: only \"incremental\" (chunked, while streaming)"
        )),
    }
}

fn collections(data: &Value) -> Result<Option<Vec<String>>, String> {
    match data.get("data-collections") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v.as_str() {
                Some(s) if super::split_table(s).is_some() => Ok(s.to_string()),
                _ => Err(format!(
                    "\"data-collections\" entry {v} is not a schema-qualified table name"
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(format!(
            "\"data-collections\" must be an array of \"schema.table\" strings, not {other}"
        )),
    }
}

/// Checks a snapshot filter: one SQL expression built only of the table's
/// columns, literals, operators and allowlisted functions
/// ([`super::filter`]); errors name the construct, never the filter's
/// values. First a lexical guard: balanced parentheses outside quotes, and no
/// `;`, comment, dollar quote or escape string (`E'...'`, whose backslashes
/// could hide a quote), which a parser of another dialect might read
/// otherwise than the server. Whether it is a boolean expression of the
/// table's columns the server decides when the signal is checked (a
/// prepared, never executed `SELECT`); every query holding a filter goes
/// through the extended protocol, which refuses more than one statement.
/// Each guard stands on its own: `true) LIMIT 0; DROP TABLE t; SELECT (1`
/// fails each.
pub fn check_filter(filter: &str) -> Result<(), String> {
    check_lexically(filter)?;
    super::filter::check(filter, None)
}

/// [`check_filter`] for the table `schema.table`: a qualified column
/// reference must name it.
pub fn check_filter_on(filter: &str, schema: &str, table: &str) -> Result<(), String> {
    check_lexically(filter)?;
    super::filter::check(filter, Some((schema, table)))
}

fn check_lexically(filter: &str) -> Result<(), String> {
    let b = filter.as_bytes();
    if filter.trim().is_empty() {
        return Err("the filter is empty".into());
    }
    let refuse = |why: &str| Err(format!("the filter is not a single expression: {why}"));
    let (mut i, mut depth) = (0usize, 0i32);
    while i < b.len() {
        match b[i] {
            quote @ (b'\'' | b'"') => {
                let escape_string = quote == b'\''
                    && i > 0
                    && matches!(b[i - 1], b'e' | b'E')
                    && (i < 2
                        || !(b[i - 2].is_ascii_alphabetic()
                            || b[i - 2] == b'_'
                            || b[i - 2] >= 0x80));
                if escape_string {
                    return refuse("escape string constants (E'...') are not accepted; write the value as a standard '...' literal");
                }
                i += 1;
                loop {
                    match b.get(i) {
                        None => return refuse("a quote is not closed"),
                        Some(&c) if c == quote && b.get(i + 1) == Some(&quote) => i += 2,
                        Some(&c) if c == quote => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth < 0 {
                    return refuse("a ')' closes a parenthesis the filter did not open");
                }
            }
            b';' => return refuse("';' ends a statement"),
            b'-' if b.get(i + 1) == Some(&b'-') => return refuse("comments are not accepted"),
            b'/' if b.get(i + 1) == Some(&b'*') => return refuse("comments are not accepted"),
            b'$' => return refuse("'$' (dollar quoting, parameters) is not accepted"),
            _ => {}
        }
        i += 1;
    }
    if depth != 0 {
        return refuse("a '(' is not closed");
    }
    Ok(())
}

/// `additional-conditions: [{"data-collection": t, "filter": sql}]` (Debezium
/// 2.x), or the older single `additional-condition` string for every table.
/// `None` as the table means every table.
fn conditions(data: &Value) -> Result<Vec<(Option<String>, String)>, String> {
    let mut out = Vec::new();
    if let Some(v) = data.get("additional-condition") {
        match v {
            Value::String(f) if !f.trim().is_empty() => {
                check_filter(f)?;
                out.push((None, f.clone()))
            }
            Value::Null | Value::String(_) => {}
            other => {
                return Err(format!(
                    "\"additional-condition\" must be a string, not {other}"
                ))
            }
        }
    }
    match data.get("additional-conditions") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let table = item.get("data-collection").and_then(Value::as_str);
                let filter = item.get("filter").and_then(Value::as_str);
                match (table, filter) {
                    (Some(t), Some(f)) if !f.trim().is_empty() => {
                        match super::split_table(t) {
                            Some((schema, table)) => check_filter_on(f, schema, table)?,
                            None => check_filter(f)?,
                        }
                        out.insert(0, (Some(t.to_string()), f.to_string()))
                    }
                    _ => {
                        return Err(format!(
                            "\"additional-conditions\" entry {item} needs \"data-collection\" and a non-empty \"filter\""
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(format!(
                "\"additional-conditions\" must be an array, not {other}"
            ))
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_must_be_one_expression() {
        for ok in [
            "id > 100",
            "(a = 1 OR b = 2) AND c IS NOT NULL",
            "name = 'it''s (not) ; -- a comment'",
            "\"we;ird\" = 'x'",
            "created > date'2020-01-01'",
            "note LIKE '%\\%'",
        ] {
            assert_eq!(check_filter(ok), Ok(()), "{ok}");
        }
        for bad in [
            "true) LIMIT 0; DROP TABLE t; SELECT (1",
            "1=1) OR (1=1",
            "true; DROP TABLE t",
            "true --",
            "true /* x */",
            "x = $$a$$",
            "x = E'\\')' OR (true",
            "(true",
            "'open",
            "  ",
        ] {
            assert!(check_filter(bad).is_err(), "{bad}");
        }
        let attack = r#"{"data-collections": ["public.t"], "additional-conditions": [{"data-collection": "public.t", "filter": "true) LIMIT 0; DROP TABLE public.t; SELECT (1"}]}"#;
        assert!(parse("execute-snapshot", Some(attack)).is_err());
    }

    #[test]
    fn filters_are_column_literal_operator_expressions() {
        let check = |f: &str| check_filter_on(f, "public", "t");
        for ok in [
            "id > 10 and status in ('a','b')",
            "created_at >= '2024-01-01'::date",
            "lower(name) like 'a%'",
            "name ILIKE 'A%' AND NOT (id BETWEEN 1 AND 5) OR note IS NULL",
            "coalesce(score, 0) * 2 + 1 <> -3 AND flag IS NOT TRUE",
            "created_at < date '2024-01-01' AND length(upper(name)) = 3",
            "CAST(code AS integer) = 7 AND id::text = '7' AND v::varchar(10) = 'x'",
            "t.id > 1 AND public.\"t\".id IS NOT NULL AND T.id <> 0",
            "date_trunc('day', created_at) = timestamp '2024-01-01 00:00:00'",
            "CASE WHEN a > 1 THEN true ELSE b END",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
            assert_eq!(check_filter(ok), Ok(()), "{ok}");
        }
        for (bad, construct) in [
            ("pg_read_file('/etc/passwd') <> ''", "pg_read_file"),
            ("pg_sleep(10) IS NULL", "pg_sleep"),
            ("id IN (select id from secrets)", "subquery"),
            ("(select count(*) from secrets) > 0", "subquery"),
            ("EXISTS (select 1 from secrets)", "subquery"),
            ("dblink('host=evil', 'select 1') IS NULL", "dblink"),
            ("id = CAST(pg_sleep(1) AS text)", "pg_sleep"),
            ("id::text = pg_catalog.lower('x')", "pg_catalog.lower"),
            ("id = count(*) OVER ()", "count"),
            ("1=1; drop table x", "';'"),
            ("true -- x", "comment"),
            ("true /* x */", "comment"),
            ("x = $$a$$", "'$'"),
            ("x = $1", "'$'"),
            ("other.secret = 1", "other.secret"),
            ("\"T\".id = 1", "T.id"),
            ("id = generate_series(1, 3)", "generate_series"),
            ("id::regclass IS NULL", "regclass"),
            ("id = ANY(ARRAY[1, 2])", "ANY"),
            ("lower(name => 'x') = 'x'", "lower"),
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.contains(construct), "{bad}: {err}");
        }
        // The refusal names the construct, never the filter's values.
        let err = check("pg_read_file('/etc/hunter2') = 'swordfish'").unwrap_err();
        assert!(
            !err.contains("hunter2") && !err.contains("swordfish"),
            "{err}"
        );
        let err = check("id = 'swordfish' +").unwrap_err();
        assert!(!err.contains("swordfish"), "{err}");
        let err = check("id = 'swordfish' 'trout'").unwrap_err();
        assert!(
            !err.contains("swordfish") && !err.contains("trout"),
            "{err}"
        );
    }

    #[test]
    fn execute_snapshot_with_conditions() {
        let a = parse(
            "execute-snapshot",
            Some(
                r#"{"data-collections": ["public.a", "s.b"], "type": "INCREMENTAL",
                     "additional-conditions": [{"data-collection": "s.b", "filter": "x > 1"}]}"#,
            ),
        )
        .unwrap();
        assert_eq!(
            a,
            SignalAction::ExecuteSnapshot {
                tables: vec![
                    ("public.a".into(), None),
                    ("s.b".into(), Some("x > 1".into()))
                ]
            }
        );
        // The older single condition applies to every table; a specific one wins.
        let a = parse(
            "execute-snapshot",
            Some(
                r#"{"data-collections": ["public.a", "s.b"], "additional-condition": "true",
                     "additional-conditions": [{"data-collection": "s.b", "filter": "y"}]}"#,
            ),
        )
        .unwrap();
        assert_eq!(
            a,
            SignalAction::ExecuteSnapshot {
                tables: vec![
                    ("public.a".into(), Some("true".into())),
                    ("s.b".into(), Some("y".into()))
                ]
            }
        );
    }

    #[test]
    fn bad_signals_say_why() {
        let cases = [
            ("execute-snapshot", Some("{not json"), "not JSON"),
            ("execute-snapshot", None, "data-collections"),
            (
                "execute-snapshot",
                Some(r#"{"data-collections": []}"#),
                "empty",
            ),
            (
                "execute-snapshot",
                Some(r#"{"data-collections": ["a"]}"#),
                "schema-qualified",
            ),
            (
                "execute-snapshot",
                Some(r#"{"data-collections": "public.a"}"#),
                "array",
            ),
            (
                "execute-snapshot",
                Some(r#"{"data-collections": ["public.a"], "type": "blocking"}"#),
                "not supported",
            ),
            (
                "execute-snapshot",
                Some(
                    r#"{"data-collections": ["public.a"], "additional-conditions": [{"filter": "x"}]}"#,
                ),
                "data-collection",
            ),
            ("reboot", None, "unknown signal type"),
        ];
        for (kind, data, why) in cases {
            let err = parse(kind, data).unwrap_err();
            assert!(err.contains(why), "{kind} {data:?}: {err}");
        }
    }

    #[test]
    fn stop_pause_resume() {
        assert_eq!(
            parse("stop-snapshot", None).unwrap(),
            SignalAction::StopSnapshot { tables: None }
        );
        assert_eq!(
            parse(
                "stop-snapshot",
                Some(r#"{"data-collections": ["public.a"]}"#)
            )
            .unwrap(),
            SignalAction::StopSnapshot {
                tables: Some(vec!["public.a".into()])
            }
        );
        assert_eq!(
            parse("pause-snapshot", Some("")).unwrap(),
            SignalAction::PauseSnapshot
        );
        assert_eq!(
            parse("resume-snapshot", None).unwrap(),
            SignalAction::ResumeSnapshot
        );
    }
}
