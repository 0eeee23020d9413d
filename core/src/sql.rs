//! SQL identifiers and literals, quoted once for capture, the warehouse
//! sink and `oncely verify`.

/// `"ident"` with embedded quotes doubled: any name, as PostgreSQL spells it.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `` `ident` `` with embedded backticks doubled: any name, as MySQL and
/// MariaDB spell it (without `ANSI_QUOTES`, double quotes are strings there).
pub fn quote_mysql_ident(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// `'literal'` with embedded quotes doubled. Only for sessions with
/// `standard_conforming_strings = on` (the default, and every connection
/// oncely opens), where backslashes are plain characters.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Column `name` of alias `alias` in its type's text output form — what
/// pgoutput sends and capture encodes; verify reads the source and the
/// warehouse in it. A cast to `text` differs for some types: it strips
/// `char(n)` padding and spells `inet` with its netmask (`::1/128` for
/// `::1`). (`format` turns NULL into an empty string, hence the test of
/// `::text`, which is NULL only for NULL, composites included.)
pub fn output_text_of(alias: &str, name: &str) -> String {
    let c = format!("{alias}.{}", quote_ident(name));
    format!("CASE WHEN {c}::text IS NULL THEN NULL ELSE format('%s', {c}) END")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_doubled() {
        assert_eq!(quote_ident("Order \"Items\""), "\"Order \"\"Items\"\"\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_mysql_ident("a`b"), "`a``b`");
    }
}
