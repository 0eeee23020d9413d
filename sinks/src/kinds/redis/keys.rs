//! Row keys: `key.pattern` parsed once ([`KeyPattern`]), every value
//! escaped so that keys never collide, and the key set holding a table's
//! row keys ([`key_set`]), its names escaped the same way (`push_escaped`).

use serde_json::Value;

use crate::event::ChangeEvent;

/// One piece of a parsed `key.pattern`.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Literal(String),
    Topic,
    Source(&'static str),
    Key,
}

/// How row keys are built: `key.pattern`, parsed once. The one function the
/// sink and `oncely verify` name keys with.
///
/// Every value put into the pattern (`{topic}`, `{db}`, `{schema}`,
/// `{table}`, and each key value of `{key}`) is escaped: a backslash goes
/// before each `\`, each character of `key.separator` and each character
/// that ends a placeholder in the pattern (the first character of the text
/// after it; with the default `{table}:{key}`: `\` and `:` only).
/// Unescaped, those characters come only from the pattern and the
/// separators, so reading left to right each value ends where the pattern
/// says and a key names one row: `('a:b', 'c')` is `t:a\:b:c` and
/// `('a', 'b:c')` is `t:a:b\:c` (they were both `t:a:b:c`). Two
/// placeholders must therefore have text between them (the config checks).
#[derive(Debug, Clone)]
pub struct KeyPattern {
    parts: Vec<Part>,
    separator: String,
    /// Characters escaped in values (besides `\`).
    special: Vec<char>,
}

/// Where a key's source names come from.
trait SourceNames {
    fn field(&self, name: &str) -> &str;
}

impl SourceNames for ChangeEvent {
    fn field(&self, name: &str) -> &str {
        self.source.get(name).and_then(Value::as_str).unwrap_or("")
    }
}

impl SourceNames for [&str; 3] {
    fn field(&self, name: &str) -> &str {
        match name {
            "db" => self[0],
            "schema" => self[1],
            _ => self[2],
        }
    }
}

impl KeyPattern {
    /// A pattern (placeholders checked by the config) and the composite-key separator.
    pub fn new(pattern: &str, separator: &str) -> Self {
        let mut parts = Vec::new();
        let mut rest = pattern;
        while !rest.is_empty() {
            let next = [
                ("{topic}", Part::Topic),
                ("{db}", Part::Source("db")),
                ("{schema}", Part::Source("schema")),
                ("{table}", Part::Source("table")),
                ("{key}", Part::Key),
            ]
            .into_iter()
            .filter_map(|(p, part)| rest.find(p).map(|at| (at, p.len(), part)))
            .min_by_key(|(at, _, _)| *at);
            match next {
                Some((at, len, part)) => {
                    if at > 0 {
                        parts.push(Part::Literal(rest[..at].to_owned()));
                    }
                    parts.push(part);
                    rest = &rest[at + len..];
                }
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    rest = "";
                }
            }
        }
        let mut special: Vec<char> = separator.chars().collect();
        for pair in parts.windows(2) {
            if let [placeholder, Part::Literal(s)] = pair {
                if !matches!(placeholder, Part::Literal(_)) {
                    special.extend(s.chars().next());
                }
            }
        }
        special.sort_unstable();
        special.dedup();
        Self {
            parts,
            separator: separator.to_owned(),
            special,
        }
    }

    /// The row key of `key` for an event of `topic`.
    pub fn render(&self, topic: &str, event: &ChangeEvent, key: &Value) -> String {
        match key {
            Value::Object(map) => self.render_with(topic, event, map.values()),
            other => self.render_with(topic, event, std::iter::once(other)),
        }
    }

    /// The row key of a row of table `schema.table` in database `db`, on
    /// `topic`, with key values `key` (in key order, as on the wire).
    pub fn render_row<'v>(
        &self,
        topic: &str,
        [db, schema, table]: [&str; 3],
        key: impl IntoIterator<Item = &'v Value>,
    ) -> String {
        self.render_with(topic, &[db, schema, table], key)
    }

    /// The key with everything but `{key}` filled in (`{key}` stays): what
    /// tells one table's keys from another's.
    pub fn table_part(&self, topic: &str, [db, schema, table]: [&str; 3]) -> String {
        let mut out = String::with_capacity(64);
        for part in &self.parts {
            match part {
                Part::Key => out.push_str("{key}"),
                _ => self.push_part(&mut out, part, topic, &[db, schema, table]),
            }
        }
        out
    }

    /// The key values of `inner` (a row key with the table part's text
    /// before and after `{key}` removed), unescaped, in key order.
    pub fn split_key(&self, inner: &str) -> Vec<String> {
        let mut values = vec![String::new()];
        let mut rest = inner;
        while let Some(c) = rest.chars().next() {
            if c == '\\' {
                rest = &rest[1..];
                if let Some(next) = rest.chars().next() {
                    if let Some(v) = values.last_mut() {
                        v.push(next);
                    }
                    rest = &rest[next.len_utf8()..];
                }
            } else if rest.starts_with(self.separator.as_str()) {
                values.push(String::new());
                rest = &rest[self.separator.len()..];
            } else {
                if let Some(v) = values.last_mut() {
                    v.push(c);
                }
                rest = &rest[c.len_utf8()..];
            }
        }
        values
    }

    fn render_with<'v>(
        &self,
        topic: &str,
        names: &(impl SourceNames + ?Sized),
        key: impl IntoIterator<Item = &'v Value>,
    ) -> String {
        let values: Vec<&Value> = key.into_iter().collect();
        let mut out = String::with_capacity(64);
        for part in &self.parts {
            match part {
                Part::Key => {
                    for (i, v) in values.iter().enumerate() {
                        if i > 0 {
                            out.push_str(&self.separator);
                        }
                        self.push_value(&mut out, v);
                    }
                }
                _ => self.push_part(&mut out, part, topic, names),
            }
        }
        out
    }

    fn push_part(
        &self,
        out: &mut String,
        part: &Part,
        topic: &str,
        names: &(impl SourceNames + ?Sized),
    ) {
        match part {
            Part::Literal(s) => out.push_str(s),
            Part::Topic => push_escaped(out, topic, &self.special),
            Part::Source(f) => push_escaped(out, names.field(f), &self.special),
            Part::Key => {}
        }
    }

    /// A key value's text, escaped: strings as is, other values as JSON,
    /// nothing for null.
    fn push_value(&self, out: &mut String, v: &Value) {
        match v {
            Value::Null => {}
            Value::String(s) => push_escaped(out, s, &self.special),
            other => push_escaped(out, &other.to_string(), &self.special),
        }
    }
}

/// Appends `text` with a backslash before each `\` and each character of
/// `special` (sorted): the one escaping of every name and value the sink puts
/// into a key, so that, read left to right, a value ends where the key's
/// unescaped text says.
fn push_escaped(out: &mut String, text: &str, special: &[char]) {
    for c in text.chars() {
        if c == '\\' || special.binary_search(&c).is_ok() {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The key of the set holding the row keys of an event's table:
/// `<keyset.key.prefix><db>.<schema>.<table>` (the topic when the event names
/// no table). Per table, not per topic or key pattern, so a truncate of one
/// table never touches another's rows. Each name is escaped (`push_escaped`,
/// `\` and `.`), so the set names one table: `"a.b"."c"` is `.a\.b.c` and
/// `"a"."b.c"` is `.a.b\.c` (they were both `.a.b.c`); a topic's set (no
/// unescaped `.`) never meets a table's (two).
pub fn key_set(prefix: &str, topic: &str, event: &ChangeEvent) -> String {
    const SPECIAL: &[char] = &['.'];
    let mut out = String::with_capacity(prefix.len() + 64);
    out.push_str(prefix);
    match event.table() {
        Some(table) => {
            let db = event.source.get("db").and_then(Value::as_str).unwrap_or("");
            let schema = event.schema_name().unwrap_or("");
            push_escaped(&mut out, db, SPECIAL);
            out.push('.');
            push_escaped(&mut out, schema, SPECIAL);
            out.push('.');
            push_escaped(&mut out, table, SPECIAL);
        }
        None => push_escaped(&mut out, topic, SPECIAL),
    }
    out
}
