//! What capture tells of a row's source table and columns, and how the
//! warehouse records it: the table's oid and dropped attnums (row-struct
//! parameters), and the comments that keep a column's attnum and a table's oid
//! (the table of comments is in [`super::identity`], which maps fields to
//! columns by them).

use std::collections::HashMap;

use serde_json::Value;

use crate::event::{row_struct, Version};

/// Row-struct parameter: the source table's oid.
pub const PARAM_TABLE_OID: &str = "__oncely.table.oid";
/// Row-struct parameter: the source table's dropped attnums.
pub const PARAM_DROPPED_ATTNUMS: &str = "__oncely.dropped.attnums";

/// The source table an event's schema names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    pub oid: u32,
    /// Attnums of the table's dropped columns, sorted.
    pub dropped: Vec<i16>,
}

/// The source table of a value schema, when capture sent it.
pub fn source_table(schema: Option<&Value>) -> Option<SourceTable> {
    let params = row_struct(schema)?.get("parameters")?;
    let oid = params.get(PARAM_TABLE_OID)?.as_str()?.parse().ok()?;
    let mut dropped: Vec<i16> = params
        .get(PARAM_DROPPED_ATTNUMS)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .split(',')
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    dropped.sort_unstable();
    Some(SourceTable { oid, dropped })
}

/// A column's recorded source column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnId {
    pub attnum: i16,
    /// The version of the change that gave the column its name.
    pub at: Version,
}

/// A table's recorded source table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableId {
    pub oid: u32,
    /// The version of the change that recorded the oid.
    pub at: Version,
    /// Source columns the sink dropped (`schema.evolution.drop.columns =
    /// "drop"`): older events carrying them must not add them again.
    pub dropped: Vec<i16>,
}

fn words(comment: &str) -> HashMap<&str, &str> {
    comment
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn version(text: &str) -> Option<Version> {
    let (lsn, seq) = text.split_once('/')?;
    Some(Version::new(lsn.parse().ok()?, seq.parse().ok()?))
}

impl ColumnId {
    pub fn parse(comment: &str) -> Option<Self> {
        let w = words(comment);
        Some(Self {
            attnum: w.get("oncely.attnum")?.parse().ok()?,
            at: version(w.get("oncely.at")?)?,
        })
    }

    pub(super) fn comment(&self) -> String {
        format!("oncely.attnum={} oncely.at={}", self.attnum, self.at)
    }
}

impl TableId {
    pub fn parse(comment: &str) -> Option<Self> {
        let w = words(comment);
        Some(Self {
            oid: w.get("oncely.source.oid")?.parse().ok()?,
            at: version(w.get("oncely.at")?)?,
            dropped: w
                .get("oncely.dropped")
                .unwrap_or(&"")
                .split(',')
                .filter_map(|a| a.parse().ok())
                .collect(),
        })
    }

    pub(super) fn comment(&self) -> String {
        let dropped: Vec<String> = self.dropped.iter().map(i16::to_string).collect();
        format!(
            "oncely.source.oid={} oncely.at={} oncely.dropped={}",
            self.oid,
            self.at,
            dropped.join(",")
        )
    }
}
