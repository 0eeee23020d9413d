//! Target names made from source names: a name pattern (index, table, key
//! pattern) can map two source tables to one target — lower-casing
//! (`Sales.Orders`, `sales.orders`), a pattern without the schema
//! (`public.orders`, `shop.orders`), or `_` joining names that contain `_`
//! (`a_b.c`, `a.b_c`). Rows of both would then mix, and one table's rows
//! overwrite the other's. [`TargetClaims`] remembers which table each target
//! belongs to and refuses a second one with a fatal error naming both tables
//! and the setting to change: the runner stops before applying anything of
//! it, so after the fix the sink resumes from its committed position and
//! nothing is lost.
//!
//! The claims live in the sink process: two sink processes that share a
//! consumer group each see only the tables of their own partitions.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::error::SinkError;

/// Which source table writes to which target, for one sink.
#[derive(Debug)]
pub struct TargetClaims {
    /// What a target is, for messages: "index", "table", "key prefix".
    what: &'static str,
    /// The setting that names targets, e.g. `sink.index.pattern`.
    setting: &'static str,
    owners: Mutex<HashMap<String, String>>,
}

impl TargetClaims {
    pub fn new(what: &'static str, setting: &'static str) -> Self {
        Self {
            what,
            setting,
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves `target` for the source table `schema`.`table`: fatal when
    /// another table holds it.
    pub fn claim(&self, target: &str, schema: &str, table: &str) -> Result<(), SinkError> {
        let owner = format!("{}.{}", quote(schema), quote(table));
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        match owners.get(target) {
            Some(first) if *first != owner => Err(SinkError::fatal(format!(
                "source tables {first} and {owner} map to the same {what} `{target}`: their rows would mix and overwrite each other. Change {setting} so that it separates them (include the placeholders that tell them apart, e.g. the schema), or route one of them to another sink",
                what = self.what,
                setting = self.setting,
            ))),
            Some(_) => Ok(()),
            None => {
                owners.insert(target.to_owned(), owner);
                Ok(())
            }
        }
    }
}

use oncely_core::sql::quote_ident as quote;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_table_on_one_target_is_fatal_and_names_both() {
        let claims = TargetClaims::new("index", "sink.index.pattern");
        claims
            .claim("p.sales.orders", "Sales", "Orders")
            .expect("first");
        claims
            .claim("p.sales.orders", "Sales", "Orders")
            .expect("again");
        let e = claims
            .claim("p.sales.orders", "sales", "orders")
            .expect_err("merge");
        assert!(e.is_fatal());
        let text = e.to_string();
        assert!(
            text.contains("\"Sales\".\"Orders\"")
                && text.contains("\"sales\".\"orders\"")
                && text.contains("sink.index.pattern"),
            "{text}"
        );
    }
}
