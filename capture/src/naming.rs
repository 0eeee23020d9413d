//! Names made from the catalog and the configuration: each table's topic, and
//! SQL identifiers and literals. One home for each, used by capture, the CLI
//! and `oncely verify`, so every reader derives the same name the writer used.
//!
//! A table's topic is `<topic.prefix>.<schema>.<table>` with characters Kafka
//! does not allow replaced by `_` (Debezium's rule), unless
//! `topic.name.mapping` names the table. The replacement can merge tables
//! (`"Order Items"` and `Order_Items`), and so can dots inside names
//! (`"a.b".c` and `a."b.c"`); Kafka also refuses a topic that differs from an
//! existing one only in `.` versus `_`. [`TopicClaims`] refuses every such
//! merge, naming both tables and the setting that separates them.

use std::collections::{BTreeMap, HashMap};

/// Kafka's limit on a topic name, in bytes (all topic characters are ASCII).
pub const MAX_TOPIC_BYTES: usize = 249;

pub use oncely_core::sql::{quote_ident, quote_literal};

/// Kafka topic names allow `[A-Za-z0-9._-]`; anything else becomes `_`.
pub fn sanitize_topic(raw: &str) -> String {
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The topic of table `schema.table`: its `topic.name.mapping` entry, else
/// `<prefix>.<schema>.<table>` through [`sanitize_topic`].
pub fn table_topic(
    prefix: &str,
    mapping: &BTreeMap<String, String>,
    schema: &str,
    table: &str,
) -> String {
    match mapping.get(&format!("{schema}.{table}")) {
        Some(topic) => topic.clone(),
        None => sanitize_topic(&format!("{prefix}.{schema}.{table}")),
    }
}

/// Two tables (or a table and one of capture's own topics) whose records
/// would land on one topic, or on topics Kafka cannot hold side by side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{second} would write to topic `{topic}`, {why} {first}: their records would mix. Give one of them a topic of its own with topic.name.mapping (e.g. topic.name.mapping = {{ {example:?} = \"{topic}-2\" }}), or leave one out with table.exclude.list")]
pub struct TopicClash {
    /// The table (or topic owner) that holds the name already.
    pub first: String,
    /// The table that wants it.
    pub second: String,
    pub topic: String,
    why: &'static str,
    example: String,
}

/// A topic name Kafka refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table {table} would write to topic `{topic}` ({len} bytes), longer than Kafka's limit of {MAX_TOPIC_BYTES}: name a shorter topic for it with topic.name.mapping (e.g. topic.name.mapping = {{ {table:?} = \"<prefix>.<short name>\" }})")]
pub struct TopicTooLong {
    pub table: String,
    pub topic: String,
    pub len: usize,
}

/// Which table writes to which topic, so that no two tables ever share one.
/// Topics are compared as Kafka compares them for collisions (`.` and `_`
/// alike: it refuses to create `a.b` beside `a_b`).
#[derive(Debug, Default, Clone)]
pub struct TopicClaims {
    /// Collision form -> (topic, owner).
    by_key: HashMap<String, (String, String)>,
}

impl TopicClaims {
    /// Reserves `topic` for table `schema.table`. Claiming the same topic
    /// again for the same table is fine.
    pub fn claim_table(
        &mut self,
        topic: &str,
        schema: &str,
        table: &str,
    ) -> Result<(), TopicClash> {
        self.claim(topic, &owner(schema, table), &format!("{schema}.{table}"))
    }

    /// Reserves one of capture's own topics (`what` describes it).
    pub fn claim_own(&mut self, topic: &str, what: &str) -> Result<(), TopicClash> {
        self.claim(topic, what, "<schema>.<table>")
    }

    fn claim(&mut self, topic: &str, owner: &str, example: &str) -> Result<(), TopicClash> {
        if topic.len() > MAX_TOPIC_BYTES {
            // Reported by `check_length`; a name Kafka refuses merges nothing.
            return Ok(());
        }
        let key = topic.replace('.', "_");
        match self.by_key.get(&key) {
            Some((held, first)) if first != owner => Err(TopicClash {
                first: first.clone(),
                second: owner.to_owned(),
                topic: topic.to_owned(),
                why: if held == topic {
                    "the topic of"
                } else {
                    "which Kafka cannot create beside the topic (differing only in '.' and '_') of"
                },
                example: example.to_owned(),
            }),
            Some(_) => Ok(()),
            None => {
                self.by_key
                    .insert(key, (topic.to_owned(), owner.to_owned()));
                Ok(())
            }
        }
    }

    /// The owner of `topic`, when claimed.
    #[cfg(test)]
    pub fn owner(&self, topic: &str) -> Option<&str> {
        self.by_key
            .get(&topic.replace('.', "_"))
            .filter(|(held, _)| held == topic)
            .map(|(_, owner)| owner.as_str())
    }
}

/// How a table is named in [`TopicClaims`] and its messages: quoted, so that
/// `"a.b"."c"` and `"a"."b.c"` stay two tables.
pub fn owner(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// Refuses a topic name longer than Kafka allows.
pub fn check_length(topic: &str, table: &str) -> Result<(), TopicTooLong> {
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(TopicTooLong {
            table: table.to_owned(),
            topic: topic.to_owned(),
            len: topic.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaced_characters_and_dots_merge_tables_and_are_refused() {
        let none = BTreeMap::new();
        let a = table_topic("p", &none, "Sales", "Order Items");
        let b = table_topic("p", &none, "Sales", "Order_Items");
        assert_eq!(a, "p.Sales.Order_Items");
        assert_eq!(a, b);
        let mut claims = TopicClaims::default();
        claims
            .claim_table(&a, "Sales", "Order Items")
            .expect("first");
        claims
            .claim_table(&a, "Sales", "Order Items")
            .expect("same table again");
        let clash = claims
            .claim_table(&b, "Sales", "Order_Items")
            .expect_err("merge");
        let text = clash.to_string();
        assert!(
            text.contains(r#""Sales"."Order Items""#) && text.contains(r#""Sales"."Order_Items""#),
            "{text}"
        );
        assert!(
            text.contains(r#"topic.name.mapping = { "Sales.Order_Items" = "#),
            "{text}"
        );
        // Dots inside names.
        let c = table_topic("p", &none, "a.b", "c");
        assert!(claims.claim_table(&c, "a.b", "c").is_ok());
        let err = claims
            .claim_table(&table_topic("p", &none, "a", "b.c"), "a", "b.c")
            .expect_err("dots");
        assert!(err.to_string().contains(r#""a.b"."c""#), "{err}");
        // Kafka's '.'/'_' collision rule.
        let err = claims
            .claim_table("p.Sales_Order_Items", "Sales_Order_Items", "x")
            .expect_err("kafka collision");
        assert!(err.to_string().contains("'.' and '_'"), "{err}");
        assert_eq!(
            claims.owner("p.Sales.Order_Items"),
            Some(owner("Sales", "Order Items").as_str())
        );
    }

    #[test]
    fn a_mapping_separates_tables_and_long_names_are_refused() {
        let mapping: BTreeMap<String, String> = [(
            "Sales.Order Items".to_owned(),
            "p.sales.order-items".to_owned(),
        )]
        .into();
        let a = table_topic("p", &mapping, "Sales", "Order Items");
        let b = table_topic("p", &mapping, "Sales", "Order_Items");
        assert_eq!(a, "p.sales.order-items");
        let mut claims = TopicClaims::default();
        claims.claim_table(&a, "Sales", "Order Items").expect("a");
        claims.claim_table(&b, "Sales", "Order_Items").expect("b");
        let long = table_topic("p", &mapping, "public", &"t".repeat(250));
        assert!(check_length(&long, "public.ttt").is_err());
        assert!(check_length(&a, "Sales.Order Items").is_ok());
    }

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_ident("order"), "\"order\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
