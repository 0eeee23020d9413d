//! Schema changes of captured tables (docs/design.md, "Schema changes").
//!
//! pgoutput sends a Relation message before a table's next change after
//! DDL, but DDL that writes no row change (ADD COLUMN with a default,
//! RENAME COLUMN, ALTER TYPE rewriting the table) may never be followed by
//! one. So capture reads the captured tables' columns from the catalog at
//! start and every heartbeat, and when a Relation message differs from the
//! cached one, and compares them with the columns its last committed offset
//! record names (stored there, so a restart knows them). A difference is a
//! schema change: a record on `<topic.prefix>.schema-changes`, in the Kafka
//! transaction of the offset record that stores the new columns, and, when
//! existing rows' values changed without row events, a backfill (an
//! incremental snapshot of the table).

use std::collections::BTreeMap;

use rdkafka::message::Message;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::CaptureConfig;
use crate::error::CaptureError;
use crate::snapshot::split_table;

/// Suffix of the schema-change topic: `<topic.prefix>.schema-changes`.
pub const TOPIC_SUFFIX: &str = "schema-changes";

/// One column as the catalog has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// `attnum`: stable across RENAME and ALTER TYPE, never reused.
    pub attnum: i16,
    pub name: String,
    /// `format_type(atttypid, atttypmod)`, e.g. `numeric(12,4)`.
    #[serde(rename = "type")]
    pub type_name: String,
    pub not_null: bool,
    /// A default (or a stored "missing" value of ADD COLUMN ... DEFAULT).
    #[serde(default)]
    pub has_default: bool,
}

/// The columns of each captured table (`schema.table`), in attnum order.
pub type TableSchemas = BTreeMap<String, Vec<ColumnDef>>;

/// A name a column had before a RENAME. Events decoded from WAL written
/// before the rename still use it (a restart replays them after capture
/// saw the new name in the catalog), and only this ties them to the column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormerName {
    pub attnum: i16,
    pub name: String,
}

/// How many former names are kept per table: the oldest go first. A name
/// is needed only while events older than its rename can still be replayed.
const FORMER_NAMES_KEPT: usize = 64;

/// What capture knows of each table's shape: its columns as last
/// published and the names its columns had before.
#[derive(Debug, Clone, Default)]
pub struct SchemaHistory {
    pub columns: TableSchemas,
    pub former_names: BTreeMap<String, Vec<FormerName>>,
}

impl SchemaHistory {
    /// Records the columns `changes` renamed in `table` under their old names.
    pub fn note_renames(&mut self, table: &str, changes: &[ColumnChange]) {
        for change in changes {
            if let ColumnChange::Rename { attnum, from, .. } = change {
                let former = FormerName {
                    attnum: *attnum,
                    name: from.clone(),
                };
                let names = self.former_names.entry(table.to_owned()).or_default();
                if !names.contains(&former) {
                    names.push(former);
                }
                let excess = names.len().saturating_sub(FORMER_NAMES_KEPT);
                names.drain(..excess);
            }
        }
    }

    /// The former names of `table`'s columns, oldest first.
    pub fn former_names(&self, table: &str) -> &[FormerName] {
        self.former_names.get(table).map_or(&[], Vec::as_slice)
    }
}

/// What changed in one column, matched by attnum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnChange {
    Add {
        attnum: i16,
        column: String,
        #[serde(rename = "type")]
        type_name: String,
        has_default: bool,
    },
    Drop {
        attnum: i16,
        column: String,
    },
    Rename {
        attnum: i16,
        from: String,
        to: String,
    },
    AlterType {
        attnum: i16,
        column: String,
        from: String,
        to: String,
    },
    Nullability {
        attnum: i16,
        column: String,
        not_null: bool,
    },
}

impl ColumnChange {
    /// Whether existing rows changed without row events: a column added
    /// with a default (PostgreSQL fills it without writing rows), a rename
    /// (rows hold the value under the new name), a type change (a rewrite or
    /// `USING` can change every value), a drop (targets holding whole rows,
    /// the index and the cache, keep the field until the row is written
    /// again). A column added without a default is NULL in every row, and
    /// nullability changes no value.
    pub fn changes_rows(&self) -> bool {
        match self {
            ColumnChange::Add { has_default, .. } => *has_default,
            ColumnChange::Rename { .. }
            | ColumnChange::AlterType { .. }
            | ColumnChange::Drop { .. } => true,
            ColumnChange::Nullability { .. } => false,
        }
    }
}

/// The changes from `old` to `new` columns of one table; empty when equal
/// (a default set or dropped on an existing column is not a change: rows
/// keep their values).
pub fn diff(old: &[ColumnDef], new: &[ColumnDef]) -> Vec<ColumnChange> {
    let mut changes = Vec::new();
    for o in old {
        match new.iter().find(|n| n.attnum == o.attnum) {
            None => changes.push(ColumnChange::Drop {
                attnum: o.attnum,
                column: o.name.clone(),
            }),
            Some(n) => {
                if n.name != o.name {
                    changes.push(ColumnChange::Rename {
                        attnum: o.attnum,
                        from: o.name.clone(),
                        to: n.name.clone(),
                    });
                }
                if n.type_name != o.type_name {
                    changes.push(ColumnChange::AlterType {
                        attnum: o.attnum,
                        column: n.name.clone(),
                        from: o.type_name.clone(),
                        to: n.type_name.clone(),
                    });
                }
                if n.not_null != o.not_null {
                    changes.push(ColumnChange::Nullability {
                        attnum: o.attnum,
                        column: n.name.clone(),
                        not_null: n.not_null,
                    });
                }
            }
        }
    }
    for n in new {
        if !old.iter().any(|o| o.attnum == n.attnum) {
            changes.push(ColumnChange::Add {
                attnum: n.attnum,
                column: n.name.clone(),
                type_name: n.type_name.clone(),
                has_default: n.has_default,
            });
        }
    }
    changes
}

/// The attnum of each column of `names` (a Relation's columns, in attnum
/// order), from `candidates` (attnum, name) of every shape of the table
/// known: the smallest attnum of that name above the previous column's.
/// When the catalog is ahead of the stream a name can have two attnums
/// (`RENAME a TO b; ADD COLUMN a`); the order tells them apart: in the
/// Relation `[id, a]` (before the rename) `a` is the older attnum, in
/// `[id, b, a]` the newer. `None` for a name no candidate has.
pub fn match_attnums(names: &[&str], candidates: &[(i16, &str)]) -> Vec<Option<i16>> {
    let mut previous = 0;
    names
        .iter()
        .map(|name| {
            let found = candidates
                .iter()
                .filter(|(attnum, n)| n == name && *attnum > previous)
                .map(|(attnum, _)| *attnum)
                .min();
            if let Some(a) = found {
                previous = a;
            }
            found
        })
        .collect()
}

/// `<topic.prefix>.schema-changes`.
pub fn topic(cfg: &CaptureConfig) -> String {
    format!("{}.{TOPIC_SUFFIX}", cfg.topic_prefix)
}

/// The columns each table had in the last committed schema-change record of
/// this connector (`read_committed`: records of an aborted transaction,
/// whose offset record was aborted with them, are never seen), and the
/// former names that record carries. Every table gets a record when first
/// seen, so this is the schema its last committed events used; empty when
/// the topic does not exist yet.
pub async fn read_history(cfg: &CaptureConfig) -> Result<SchemaHistory, CaptureError> {
    let topic = topic(cfg);
    if !crate::offset::topic_exists(cfg, &topic).await? {
        return Ok(SchemaHistory::default());
    }
    let client = cfg.kafka_client();
    let connector = cfg.connector_name().to_owned();
    tokio::task::spawn_blocking(move || read_history_blocking(client, &topic, &connector))
        .await
        .map_err(CaptureError::task("schema history reader"))?
}

fn read_history_blocking(
    client: rdkafka::config::ClientConfig,
    topic: &str,
    connector: &str,
) -> Result<SchemaHistory, CaptureError> {
    let mut history = SchemaHistory::default();
    crate::offset::read_to_end(client, topic, "read schema-change topic", |msg| {
        let Some(bytes) = msg.payload() else {
            return Ok(());
        };
        let corrupt = |reason: String| CaptureError::CorruptSchemaHistory {
            topic: topic.to_owned(),
            reason: format!("offset {}: {reason}", msg.offset()),
        };
        let value: Value = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        if value["source"]["name"].as_str() != Some(connector) {
            return Ok(());
        }
        let table = value["table"]
            .as_str()
            .ok_or_else(|| corrupt("no table".into()))?;
        let columns: Vec<ColumnDef> =
            serde_json::from_value(value["columns"].clone()).map_err(|e| corrupt(e.to_string()))?;
        // Each record carries every former name (so compaction keeping only
        // a table's last record loses none); records written before former
        // names existed have none.
        let former: Vec<FormerName> = match &value["former_names"] {
            Value::Null => Vec::new(),
            v => serde_json::from_value(v.clone()).map_err(|e| corrupt(e.to_string()))?,
        };
        history.columns.insert(table.to_owned(), columns);
        history.former_names.insert(table.to_owned(), former);
        Ok(())
    })?;
    Ok(history)
}

/// A table's shape as a schema-change record states it.
pub struct TableShape<'a> {
    pub columns: &'a [ColumnDef],
    pub former_names: &'a [FormerName],
}

/// The schema-change record: key `{"schema", "table"}`, value naming the
/// changes (by attnum, so a rename is told from a drop and an add), the
/// columns after them and every name they had before, the stream position
/// they were seen at and the snapshot that backfills the table (null when
/// none).
pub fn record(
    connector: &str,
    table: &str,
    changes: &[ColumnChange],
    shape: TableShape<'_>,
    seen_at_lsn: u64,
    backfill: Option<&str>,
    ts_ms: i64,
) -> (Vec<u8>, Vec<u8>) {
    let (schema, name) = split_table(table).unwrap_or(("", table));
    let key = json!({"schema": schema, "table": name});
    let value = json!({
        "source": {"connector": "postgresql", "name": connector, "schema": schema, "table": name, "lsn": seen_at_lsn},
        "ts_ms": ts_ms,
        "table": table,
        "changes": changes,
        "columns": shape.columns,
        "former_names": shape.former_names,
        "backfill": backfill,
    });
    (key.to_string().into_bytes(), value.to_string().into_bytes())
}

#[cfg(test)]
mod tests;
