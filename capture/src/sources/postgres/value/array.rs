//! PostgreSQL array literals: `{1,2,NULL,"a,b","x\"y"}`, nested arrays,
//! and the `[lower:upper]=` prefix printed when a lower bound is not 1.
//!
//! The parser follows `array_out`: elements are separated by the element
//! type's delimiter (`,` for everything built in except `box`, which uses
//! `;`); an element is quoted when it is empty, contains special characters
//! or spells NULL, and inside quotes `\` escapes the next character. An
//! unquoted `NULL` (any case) is SQL NULL; a quoted `"NULL"` is the string.

use std::borrow::Cow;

/// One element of a parsed array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrayNode<'a> {
    Null,
    /// The element's text form, unescaped.
    Item(Cow<'a, str>),
    /// A sub-array of a multi-dimensional array.
    Nested(Vec<ArrayNode<'a>>),
}

/// Parses an array literal into its top-level elements; `None` when the
/// text is not a well-formed literal.
pub fn parse_array(s: &str, delim: u8) -> Option<Vec<ArrayNode<'_>>> {
    let mut p = Parser { s, pos: 0, delim };
    p.skip_dimensions()?;
    p.skip_ws();
    let nodes = p.array()?;
    p.skip_ws();
    (p.pos == s.len()).then_some(nodes)
}

/// `array_isspace`: the ASCII spaces PostgreSQL skips around elements.
fn is_pg_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C)
}

fn trim_pg_space(s: &str) -> &str {
    s.trim_end_matches(|c: char| u8::try_from(c).is_ok_and(is_pg_space))
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
    delim: u8,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(is_pg_space) {
            self.pos += 1;
        }
    }

    /// `[1:3][0:1]=` -> skipped; the bounds do not change the JSON array.
    fn skip_dimensions(&mut self) -> Option<()> {
        if self.peek() != Some(b'[') {
            return Some(());
        }
        while self.peek() == Some(b'[') {
            let close = self.s[self.pos..].find(']')?;
            self.pos += close + 1;
        }
        (self.peek() == Some(b'=')).then(|| self.pos += 1)
    }

    fn array(&mut self) -> Option<Vec<ArrayNode<'a>>> {
        if self.peek() != Some(b'{') {
            return None;
        }
        self.pos += 1;
        let mut nodes = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Some(nodes);
        }
        loop {
            self.skip_ws();
            let node = match self.peek()? {
                b'{' => ArrayNode::Nested(self.array()?),
                b'"' => ArrayNode::Item(self.quoted()?),
                _ => self.unquoted()?,
            };
            nodes.push(node);
            self.skip_ws();
            match self.peek()? {
                b'}' => {
                    self.pos += 1;
                    return Some(nodes);
                }
                c if c == self.delim => self.pos += 1,
                _ => return None,
            }
        }
    }

    /// `"..."` with `\` escapes; borrows when there is nothing to unescape.
    fn quoted(&mut self) -> Option<Cow<'a, str>> {
        self.pos += 1;
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let mut owned: Option<String> = None;
        let mut run_start = start;
        loop {
            match *bytes.get(self.pos)? {
                b'"' => {
                    let out = match owned {
                        None => Cow::Borrowed(&self.s[start..self.pos]),
                        Some(mut o) => {
                            o.push_str(&self.s[run_start..self.pos]);
                            Cow::Owned(o)
                        }
                    };
                    self.pos += 1;
                    return Some(out);
                }
                b'\\' => {
                    let o = owned.get_or_insert_with(String::new);
                    o.push_str(&self.s[run_start..self.pos]);
                    self.pos += 1;
                    let ch = self.s[self.pos..].chars().next()?;
                    o.push(ch);
                    self.pos += ch.len_utf8();
                    run_start = self.pos;
                }
                _ => self.pos += 1,
            }
        }
    }

    /// Unquoted text up to the delimiter or `}`, trimmed; `NULL` is SQL NULL.
    fn unquoted(&mut self) -> Option<ArrayNode<'a>> {
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let mut owned: Option<String> = None;
        let mut run_start = start;
        while let Some(&c) = bytes.get(self.pos) {
            match c {
                b'}' | b'{' | b'"' => break,
                c if c == self.delim => break,
                b'\\' => {
                    let o = owned.get_or_insert_with(String::new);
                    o.push_str(&self.s[run_start..self.pos]);
                    self.pos += 1;
                    let ch = self.s[self.pos..].chars().next()?;
                    o.push(ch);
                    self.pos += ch.len_utf8();
                    run_start = self.pos;
                }
                _ => self.pos += 1,
            }
        }
        let text = match owned {
            None => Cow::Borrowed(trim_pg_space(&self.s[start..self.pos])),
            Some(mut o) => {
                o.push_str(&self.s[run_start..self.pos]);
                Cow::Owned(trim_pg_space(&o).to_owned())
            }
        };
        if text.is_empty() {
            return None;
        }
        if text.eq_ignore_ascii_case("NULL") && matches!(text, Cow::Borrowed(_)) {
            return Some(ArrayNode::Null);
        }
        Some(ArrayNode::Item(text))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn item(s: &str) -> ArrayNode<'_> {
        ArrayNode::Item(Cow::Borrowed(s))
    }

    #[test]
    fn flat() {
        assert_eq!(
            parse_array(r#"{1,2,NULL,"a,b","x\"y"}"#, b','),
            Some(vec![
                item("1"),
                item("2"),
                ArrayNode::Null,
                item("a,b"),
                item("x\"y"),
            ])
        );
    }

    #[test]
    fn empty_and_nested() {
        assert_eq!(parse_array("{}", b','), Some(vec![]));
        assert_eq!(
            parse_array("{{1,2},{3,NULL}}", b','),
            Some(vec![
                ArrayNode::Nested(vec![item("1"), item("2")]),
                ArrayNode::Nested(vec![item("3"), ArrayNode::Null]),
            ])
        );
    }

    #[test]
    fn quoted_null_empty_and_whitespace() {
        assert_eq!(
            parse_array(r#"{"NULL",null,"", " a b ",c d}"#, b','),
            Some(vec![
                item("NULL"),
                ArrayNode::Null,
                item(""),
                item(" a b "),
                item("c d"),
            ])
        );
    }

    #[test]
    fn dimension_prefix_and_box_delimiter() {
        assert_eq!(
            parse_array("[0:1]={7,8}", b','),
            Some(vec![item("7"), item("8")])
        );
        assert_eq!(
            parse_array("{(1,1),(0,0);(2,2),(1,1)}", b';'),
            Some(vec![item("(1,1),(0,0)"), item("(2,2),(1,1)")])
        );
    }

    #[test]
    fn malformed() {
        for bad in [
            "", "1,2", "{1,2", "{1,,2}", "{1}x", "{\"a}", "[1:2]{1}", "{a\"b}",
        ] {
            assert_eq!(parse_array(bad, b','), None, "{bad}");
        }
    }

    /// A generated array value, rendered like `array_out` would.
    #[derive(Debug, Clone)]
    enum Gen {
        Null,
        Text(String),
        Nested(Vec<Gen>),
    }

    fn render(items: &[Gen], out: &mut String) {
        out.push('{');
        for (i, g) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            match g {
                Gen::Null => out.push_str("NULL"),
                Gen::Nested(v) => render(v, out),
                Gen::Text(s) => {
                    let needs_quotes = s.is_empty()
                        || s.eq_ignore_ascii_case("NULL")
                        || s.chars().any(|c| {
                            matches!(c, '"' | '\\' | '{' | '}' | ',')
                                || u8::try_from(c).is_ok_and(is_pg_space)
                        });
                    if needs_quotes {
                        out.push('"');
                        for c in s.chars() {
                            if c == '"' || c == '\\' {
                                out.push('\\');
                            }
                            out.push(c);
                        }
                        out.push('"');
                    } else {
                        out.push_str(s);
                    }
                }
            }
        }
        out.push('}');
    }

    fn same(parsed: &[ArrayNode], generated: &[Gen]) -> bool {
        parsed.len() == generated.len()
            && parsed.iter().zip(generated).all(|(p, g)| match (p, g) {
                (ArrayNode::Null, Gen::Null) => true,
                (ArrayNode::Item(a), Gen::Text(b)) => a == b,
                (ArrayNode::Nested(a), Gen::Nested(b)) => same(a, b),
                _ => false,
            })
    }

    fn leaf() -> impl Strategy<Value = Gen> {
        prop_oneof![
            1 => Just(Gen::Null),
            1 => Just(Gen::Text("null".into())),
            6 => "\\PC{0,8}".prop_map(Gen::Text),
            2 => any::<i64>().prop_map(|n| Gen::Text(n.to_string())),
        ]
    }

    fn tree() -> impl Strategy<Value = Vec<Gen>> {
        let nested = leaf().prop_recursive(3, 24, 4, |inner| {
            proptest::collection::vec(inner, 0..4).prop_map(Gen::Nested)
        });
        proptest::collection::vec(nested, 0..6)
    }

    proptest! {
        #[test]
        fn rendered_arrays_parse_back(items in tree()) {
            let mut text = String::new();
            render(&items, &mut text);
            let parsed = parse_array(&text, b',');
            prop_assert!(parsed.is_some(), "{}", text);
            prop_assert!(same(&parsed.unwrap(), &items), "{}", text);
        }

        #[test]
        fn never_panics(s in "\\PC{0,30}") {
            let _ = parse_array(&s, b',');
        }
    }
}
