//! Snapshot filters (a signal's `additional-conditions`) on MySQL and
//! MariaDB: what is accepted, and the server's probe of it.
//!
//! A filter passes three checks before a signal queues it:
//!
//! 1. the shared rules ([`check_filter_on`]): one expression of the
//!    table's columns, literals, operators and allowlisted functions;
//! 2. MySQL's own lexical rules ([`check_lexically`]), for what MySQL
//!    reads otherwise than the shared rules' PostgreSQL reading, so that
//!    nothing the first check took for a string or a name can be code on
//!    the server: no backslash (an escape in MySQL strings unless
//!    `NO_BACKSLASH_ESCAPES`, so where a string ends would depend on the
//!    server's `sql_mode`), no `"` (a string in MySQL unless
//!    `ANSI_QUOTES`, not a name), no backtick, `#` comment, `||` or `&&`
//!    (MySQL's OR and AND), `@` variable, `?` parameter, `;`, `--` or `/*` (with
//!    `/*! ... */`, which MySQL runs), no call of an allowed function
//!    MySQL does not build in (`date_trunc`: MySQL would call a stored
//!    function of that name), and no space between an allowed function's
//!    name and its `(` (MySQL may then call a stored function of that
//!    name);
//! 3. its outermost operation yields a truth value ([`is_predicate`]):
//!    MySQL has no boolean type, and `id > 1` and `id` are both integers
//!    to it, so the probe's result type cannot tell them apart.
//!
//! Then the server prepares, never runs, `SELECT (filter) FROM db.t
//! LIMIT 0` ([`probe`]): it parses the statement and resolves its names,
//! so an unknown column or a syntax MySQL does not have (`::` casts,
//! `ILIKE`) refuses the signal with the server's message. A prepared
//! statement is one statement, and reads no row. Chunks run the filter in
//! their `READ ONLY` consistent-snapshot transaction ([`super::chunks`]),
//! and check it lexically again.

use crate::snapshot::filter::{is_predicate, FUNCTIONS};
use crate::snapshot::signal::check_filter_on;
use oncely_core::sql::quote_mysql_ident;

/// Whether `filter` may filter snapshot chunks of `database.table` (the
/// reason when not, never quoting the filter's values).
pub fn check(filter: &str, database: &str, table: &str) -> Result<(), String> {
    check_filter_on(filter, database, table)?;
    check_lexically(filter)?;
    if !is_predicate(filter)? {
        return Err("the filter is not a condition: MySQL has no boolean type, so write one whose outermost operation is a comparison, AND, OR, NOT, IS, IN, BETWEEN or LIKE (`flag = 1` or `flag IS TRUE` rather than `flag`)".into());
    }
    Ok(())
}

/// The statement the server prepares to check `filter` on `database.table`.
pub fn probe(filter: &str, database: &str, table: &str) -> String {
    format!(
        "SELECT ({filter}) FROM {}.{} LIMIT 0",
        quote_mysql_ident(database),
        quote_mysql_ident(table)
    )
}

/// MySQL's lexical rules for a filter (the module's rule 2). Strings are
/// single-quoted with `''` for a quote, as both readings agree once
/// backslashes are out.
pub fn check_lexically(filter: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("the filter does not work on MySQL: {why}"));
    let b = filter.as_bytes();
    if b.contains(&b'\\') {
        return refuse("backslashes are not accepted (MySQL reads them as escapes in strings unless sql_mode has NO_BACKSLASH_ESCAPES)");
    }
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return refuse("a quote is not closed"),
                        Some(b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
                        Some(b'\'') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'"' => return refuse("a double quote is not accepted (MySQL reads \"...\" as a string, not a column name): write strings in single quotes and column names unquoted"),
            b'`' => return refuse("quoted names (`...`) are not accepted: write column names unquoted"),
            b'#' => return refuse("'#' starts a comment in MySQL"),
            b'-' if b.get(i + 1) == Some(&b'-') => return refuse("comments are not accepted"),
            b'/' if b.get(i + 1) == Some(&b'*') => return refuse("comments (and /*! ... */, which MySQL runs) are not accepted"),
            b';' => return refuse("';' ends a statement"),
            b'|' if b.get(i + 1) == Some(&b'|') => return refuse("MySQL reads '||' as OR: write OR"),
            b'&' if b.get(i + 1) == Some(&b'&') => return refuse("MySQL reads '&&' as AND: write AND"),
            b'@' => return refuse("variables (@) are not accepted"),
            // The chunk's SELECT is prepared with its key as parameters.
            b'?' => return refuse("'?' (a statement parameter) is not accepted"),
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while b.get(i + 1).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$') {
                    i += 1;
                }
                call(&filter[start..=i], &b[i + 1..])?;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The allowed functions ([`FUNCTIONS`]) MySQL has no built-in of: it
/// would call a stored function of that name in the session's database.
const NOT_BUILT_IN: &[&str] = &["btrim", "date_part", "date_trunc", "trunc"];

/// A call of an allowed function MySQL does not build in, or written with
/// space before its `(`: MySQL then need not read the name as the
/// built-in function, and may call a stored function of that name.
fn call(word: &str, rest: &[u8]) -> Result<(), String> {
    let spaced = rest.first().is_some_and(u8::is_ascii_whitespace);
    if rest.iter().find(|c| !c.is_ascii_whitespace()) != Some(&b'(') {
        return Ok(());
    }
    let is = |names: &[&str]| names.iter().any(|f| f.eq_ignore_ascii_case(word));
    if is(NOT_BUILT_IN) {
        return Err(format!(
            "the filter does not work on MySQL: {word} is not one of its functions (MySQL would call a stored function of that name)"
        ));
    }
    if spaced && is(FUNCTIONS) {
        return Err(format!(
            "the filter does not work on MySQL: write {word}(...) with no space before the parenthesis (MySQL may otherwise call a stored function of that name)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_filters_are_conditions_of_the_tables_columns() {
        for ok in [
            "id > 30 AND (region = 'eu' OR qty < 0)",
            "name = 'it''s (not) ; -- # /* a comment'",
            "lower(name) LIKE 'a%' AND id IN (1, 2, 3)",
            "NOT (id BETWEEN 1 AND 5) OR note IS NULL",
            "flag IS TRUE",
            "((id = 1))",
            "created < date '2024-01-01'",
            "t.id > 1",
            "true",
        ] {
            assert_eq!(check(ok, "shop", "t"), Ok(()), "{ok}");
        }
    }

    /// What MySQL reads otherwise than the shared (PostgreSQL) rules: each
    /// passes those, and each is refused here, naming why.
    #[test]
    fn what_mysql_reads_otherwise_is_refused() {
        for (bad, why) in [
            // PostgreSQL: the string `\`, then `OR 1 = 1`; MySQL: one
            // string, `\'` an escaped quote.
            (r"name = 'a\' OR 1 = 1 OR name = ''", "backslash"),
            (r"note LIKE '%\%'", "backslash"),
            ("\"region\" = 'eu'", "double quote"),
            ("name || 'x' = 'ax'", "'||'"),
            ("lower (name) = 'a'", "no space before"),
            ("id > 1 AND LENGTH\t(name) > 0", "no space before"),
            (
                "date_trunc('day', created) = date '2024-01-01'",
                "not one of its functions",
            ),
            ("trunc(price) = 3", "not one of its functions"),
        ] {
            assert_eq!(
                check_filter_on(bad, "shop", "t"),
                Ok(()),
                "the shared rules pass {bad}"
            );
            let err = check(bad, "shop", "t").expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
        // Refused by the shared rules already, and by MySQL's on their own.
        for (bad, why) in [
            ("id > 1 # x", "'#'"),
            ("id > 1 /*! OR 1 = 1 */", "/*!"),
            ("id > 1 -- x", "comments"),
            ("id > 1--1", "comments"),
            ("true; DROP TABLE t", "';'"),
            ("`id` > 1", "quoted names"),
            ("id > 1 && id < 5", "'&&'"),
            ("id = @x", "variables"),
            ("id = @@version", "variables"),
            ("id > ?", "parameter"),
            ("name = 'open", "not closed"),
        ] {
            assert!(check(bad, "shop", "t").is_err(), "{bad}");
            let err = check_lexically(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
        // Inside strings none of it counts, and names merely containing an
        // allowed function's name are names.
        assert_eq!(
            check_lexically("note = 'a # b -- c /* d ; e || f \" g ` h @ ?' AND lowered (1) "),
            Ok(())
        );
        // The refusal names the construct, never the filter's values.
        let err = check(r"name = 'swordfish\' OR 1=1", "shop", "t").unwrap_err();
        assert!(!err.contains("swordfish"), "{err}");
    }

    #[test]
    fn a_filter_must_be_a_condition_not_a_value() {
        for bad in [
            "id",
            "id + 1",
            "(qty * 2)",
            "lower(name)",
            "'eu'",
            "coalesce(flag, 0)",
        ] {
            let err = check(bad, "shop", "t").expect_err(bad);
            assert!(err.contains("not a condition"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_probe_is_prepared_on_the_quoted_table() {
        assert_eq!(
            probe("id > 1", "shop", "or`ders"),
            "SELECT (id > 1) FROM `shop`.`or``ders` LIMIT 0"
        );
    }
}
