//! Target names made from source names: a name pattern (index, table, key
//! pattern) can map two source tables to one target — lower-casing
//! (`Sales.Orders`, `sales.orders`), a pattern without the schema
//! (`public.orders`, `shop.orders`), or `_` joining names that contain `_`
//! (`a_b.c`, `a.b_c`). Rows of both would then mix, and one table's rows
//! overwrite the other's. [`TargetClaims`] remembers which table each target
//! belongs to and refuses a second one naming both tables and the setting to
//! change ([`SinkError::Quarantined`]): the runner sets that partition aside
//! before applying anything of it and the other tables go on; after the fix
//! the sink resumes it from its committed position and nothing is lost.
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
    owners: Mutex<HashMap<String, Owner>>,
}

/// Who a target belongs to: a source table's rows, another of its tables
/// (its history), or the sink itself (its positions), and the setting that
/// names that target — a sink that creates several tables per source table
/// claims each, so a source table named like another's history table is
/// caught like any other collision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// For messages: `source table "public"."orders"`, `the history table of
    /// source table "public"."orders"`, `the sink's positions table`.
    name: String,
    /// The setting to change, e.g. `sink.history.table.name.format`.
    setting: &'static str,
}

impl Owner {
    /// The rows of source table `schema`.`table`, named by `setting`.
    pub fn source(schema: &str, table: &str, setting: &'static str) -> Self {
        Self {
            name: format!("source table {}.{}", quote(schema), quote(table)),
            setting,
        }
    }

    /// `role` (e.g. "the history table") of source table `schema`.`table`.
    pub fn of_source(role: &str, schema: &str, table: &str, setting: &'static str) -> Self {
        Self {
            name: format!("{role} of source table {}.{}", quote(schema), quote(table)),
            setting,
        }
    }

    /// One of the sink's own targets, e.g. "the sink's positions table".
    pub fn sink(name: &str, setting: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            setting,
        }
    }
}

impl TargetClaims {
    pub fn new(what: &'static str, setting: &'static str) -> Self {
        Self {
            what,
            setting,
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves `target` for the source table `schema`.`table`: quarantined when
    /// another table holds it.
    pub fn claim(&self, target: &str, schema: &str, table: &str) -> Result<(), SinkError> {
        self.claim_as(target, Owner::source(schema, table, self.setting))
    }

    /// Reserves `target` for `owner`: quarantined when another owner holds it,
    /// naming both and the settings that name them.
    pub fn claim_as(&self, target: &str, owner: Owner) -> Result<(), SinkError> {
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        match owners.get(target) {
            Some(first) if *first != owner => {
                let settings = if first.setting == owner.setting {
                    first.setting.to_owned()
                } else {
                    format!("{} or {}", first.setting, owner.setting)
                };
                Err(SinkError::quarantine(format!(
                    "{} and {} map to the same {what} `{target}`: their rows would mix and overwrite each other. Change {settings} so that it separates them (include the placeholders that tell them apart, e.g. the schema, or a prefix or suffix no source table name has), or route the source table to another sink",
                    first.name,
                    owner.name,
                    what = self.what,
                )))
            }
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
    fn a_second_table_on_one_target_is_quarantined_and_names_both() {
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
        assert!(e.is_quarantine(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("\"Sales\".\"Orders\"")
                && text.contains("\"sales\".\"orders\"")
                && text.contains("sink.index.pattern"),
            "{text}"
        );
    }

    /// A sink's other tables are claimed too: a source table whose target is
    /// another's history table, or the sink's own table, is refused, in
    /// either order, naming both settings.
    #[test]
    fn a_target_that_is_another_tables_history_or_the_sinks_own_is_quarantined() {
        const T: &str = "sink.table.name.format";
        const H: &str = "sink.history.table.name.format";
        let claims = TargetClaims::new("warehouse table", T);
        claims
            .claim_as(
                "oncely_positions",
                Owner::sink("the sink's positions table", "sink.positions.table"),
            )
            .expect("positions");
        let history = Owner::of_source("the history table", "public", "orders", H);
        claims
            .claim_as("public_orders_history", history.clone())
            .expect("history");
        claims
            .claim_as("public_orders_history", history)
            .expect("again");
        let e = claims
            .claim("public_orders_history", "public", "orders_history")
            .expect_err("mirror onto a history table");
        assert!(e.is_quarantine(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("the history table of source table \"public\".\"orders\"")
                && text.contains("\"public\".\"orders_history\"")
                && text.contains(&format!("{H} or {T}")),
            "{text}"
        );
        let text = claims
            .claim("oncely_positions", "oncely", "positions")
            .expect_err("mirror onto the positions table")
            .to_string();
        assert!(
            text.contains("the sink's positions table") && text.contains("sink.positions.table"),
            "{text}"
        );
        // The other order: the mirror first.
        let claims = TargetClaims::new("warehouse table", T);
        claims
            .claim("public_orders_history", "public", "orders_history")
            .expect("mirror");
        assert!(claims
            .claim_as(
                "public_orders_history",
                Owner::of_source("the history table", "public", "orders", H)
            )
            .is_err());
    }
}
