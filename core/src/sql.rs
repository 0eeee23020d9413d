//! SQL identifiers and literals, quoted once for capture, the warehouse
//! sink and `oncely verify`.

/// `"ident"` with embedded quotes doubled: any name, as PostgreSQL spells it.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `'literal'` with embedded quotes doubled. Only for sessions with
/// `standard_conforming_strings = on` (the default, and every connection
/// oncely opens), where backslashes are plain characters.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_doubled() {
        assert_eq!(quote_ident("Order \"Items\""), "\"Order \"\"Items\"\"\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
