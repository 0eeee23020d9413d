//! The outbox event router: rows inserted into an outbox table become clean
//! domain events on a topic chosen by a column (Debezium's outbox pattern).
//!
//! The routing happens inside the capture pipeline, so an outbox event is
//! part of the same Kafka transaction as its offset record and is published
//! exactly once. Updates and deletes of outbox rows publish nothing (an
//! application may delete rows right after inserting them).

use serde::Deserialize;

use crate::pgoutput::{Relation, TupleData, TupleValue};

pub const DEFAULT_ID: &str = "id";
pub const DEFAULT_KEY: &str = "aggregateid";
pub const DEFAULT_TYPE: &str = "type";
pub const DEFAULT_PAYLOAD: &str = "payload";
pub const DEFAULT_ROUTE_BY: &str = "aggregatetype";
pub const DEFAULT_TOPIC_PATTERN: &str = "outbox.event.${routedByValue}";
/// Placeholder in the topic pattern replaced by the routing column's value.
const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// `[outbox]`: Debezium's outbox event router settings, one field per key
/// (under `outbox.`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// `outbox.table`: the outbox table, `schema.table`.
    pub table: String,
    /// `outbox.field.event.id`: the event id column (header `id`).
    #[serde(rename = "field.event.id", default = "d_id")]
    pub event_id: String,
    /// `outbox.field.event.key`: the aggregate id column (the record key).
    #[serde(rename = "field.event.key", default = "d_key")]
    pub event_key: String,
    /// `outbox.field.event.type`: the event type column (header `type`).
    #[serde(rename = "field.event.type", default = "d_type")]
    pub event_type: String,
    /// `outbox.field.event.payload`: the payload column (the record value).
    #[serde(rename = "field.event.payload", default = "d_payload")]
    pub event_payload: String,
    /// `outbox.route.by.field`: the column whose value chooses the topic.
    #[serde(rename = "route.by.field", default = "d_route_by")]
    pub route_by_field: String,
    /// `outbox.route.topic.replacement`: the topic pattern, holding `${routedByValue}`.
    #[serde(rename = "route.topic.replacement", default = "d_pattern")]
    pub route_topic_replacement: String,
}

fn d_id() -> String {
    DEFAULT_ID.into()
}
fn d_key() -> String {
    DEFAULT_KEY.into()
}
fn d_type() -> String {
    DEFAULT_TYPE.into()
}
fn d_payload() -> String {
    DEFAULT_PAYLOAD.into()
}
fn d_route_by() -> String {
    DEFAULT_ROUTE_BY.into()
}
fn d_pattern() -> String {
    DEFAULT_TOPIC_PATTERN.into()
}

impl OutboxConfig {
    /// Checks the values; the message names the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self
            .table
            .split_once('.')
            .is_none_or(|(s, t)| s.is_empty() || t.is_empty())
        {
            return Err((
                "outbox.table",
                format!(
                    "{:?} must be schema-qualified, e.g. public.outbox",
                    self.table
                ),
            ));
        }
        if !self.route_topic_replacement.contains(ROUTED_BY_VALUE) {
            return Err((
                "outbox.route.topic.replacement",
                format!(
                    "{:?} must contain {ROUTED_BY_VALUE} (replaced by the routing column's value)",
                    self.route_topic_replacement
                ),
            ));
        }
        Ok(())
    }
}

/// One routed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub topic: String,
    /// The aggregate id's text: consumers partition and compact by it.
    pub key: Vec<u8>,
    /// The payload column's text (JSON for a json/jsonb column), or `None` when null.
    pub value: Option<Vec<u8>>,
    /// The event id, for consumers' dedup (header `id`).
    pub id: Vec<u8>,
    /// The event type (header `type`).
    pub kind: Vec<u8>,
}

/// Routes the rows of one outbox relation; built per Relation message.
#[derive(Debug, Clone)]
pub struct OutboxRouter {
    id: usize,
    key: usize,
    kind: usize,
    payload: usize,
    route_by: usize,
    pattern: String,
}

/// Why an outbox row cannot be routed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OutboxError {
    #[error("outbox table {table} has no column `{column}` (configured as outbox.{key}); add it or set outbox.{key}")]
    MissingColumn {
        table: String,
        column: String,
        key: &'static str,
    },
    #[error("outbox row has a null or unavailable `{column}`, which routing needs")]
    MissingValue { column: String },
}

impl OutboxRouter {
    pub fn new(rel: &Relation, cfg: &OutboxConfig) -> Result<Self, OutboxError> {
        let find = |column: &str, key: &'static str| {
            rel.columns
                .iter()
                .position(|c| c.name == column)
                .ok_or_else(|| OutboxError::MissingColumn {
                    table: format!("{}.{}", rel.namespace, rel.name),
                    column: column.to_string(),
                    key,
                })
        };
        Ok(OutboxRouter {
            id: find(&cfg.event_id, "field.event.id")?,
            key: find(&cfg.event_key, "field.event.key")?,
            kind: find(&cfg.event_type, "field.event.type")?,
            payload: find(&cfg.event_payload, "field.event.payload")?,
            route_by: find(&cfg.route_by_field, "route.by.field")?,
            pattern: cfg.route_topic_replacement.clone(),
        })
    }

    /// The event of an inserted outbox row.
    pub fn route(&self, row: &TupleData, rel: &Relation) -> Result<OutboxEvent, OutboxError> {
        let text = |i: usize| -> Result<Vec<u8>, OutboxError> {
            match row.0.get(i) {
                Some(TupleValue::Text(b)) | Some(TupleValue::Binary(b)) => Ok(b.to_vec()),
                _ => Err(OutboxError::MissingValue {
                    column: rel
                        .columns
                        .get(i)
                        .map(|c| c.name.clone())
                        .unwrap_or_default(),
                }),
            }
        };
        let route = String::from_utf8_lossy(&text(self.route_by)?).into_owned();
        let topic: String = self
            .pattern
            .replace(ROUTED_BY_VALUE, &route)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let value = match row.0.get(self.payload) {
            Some(TupleValue::Null) => None,
            _ => Some(text(self.payload)?),
        };
        Ok(OutboxEvent {
            topic,
            key: text(self.key)?,
            value,
            id: text(self.id)?,
            kind: text(self.kind)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::{Column, ReplicaIdentity};
    use bytes::Bytes;

    fn rel() -> Relation {
        let col = |name: &str| Column {
            is_key: name == "id",
            name: name.into(),
            type_oid: 25,
            type_modifier: -1,
        };
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: ["id", "aggregatetype", "aggregateid", "type", "payload"]
                .map(col)
                .to_vec(),
        }
    }

    fn t(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn cfg(toml_text: &str) -> OutboxConfig {
        oncely_core::config::from_str(toml_text, "outbox").unwrap()
    }

    #[test]
    fn routes_by_aggregate_type() {
        let c = cfg("table = \"public.outbox\"");
        c.validate().unwrap();
        let router = OutboxRouter::new(&rel(), &c).unwrap();
        let row = TupleData(vec![
            t("e-1"),
            t("Order Line"),
            t("42"),
            t("Created"),
            t("{\"a\":1}"),
        ]);
        let ev = router.route(&row, &rel()).unwrap();
        assert_eq!(ev.topic, "outbox.event.Order_Line");
        assert_eq!(ev.key, b"42");
        assert_eq!(ev.value.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(ev.id, b"e-1");
        assert_eq!(ev.kind, b"Created");
        let null_payload = TupleData(vec![
            t("e-2"),
            t("x"),
            t("1"),
            t("Deleted"),
            TupleValue::Null,
        ]);
        assert_eq!(router.route(&null_payload, &rel()).unwrap().value, None);
    }

    #[test]
    fn configured_names_and_errors() {
        let c = cfg("table = \"public.outbox\"\nfield.event.key = \"agg\"\nroute.topic.replacement = \"ev.${routedByValue}.v1\"");
        let err = OutboxRouter::new(&rel(), &c).unwrap_err();
        assert!(err.to_string().contains("field.event.key"), "{err}");
        assert!(cfg("table = \"outbox\"").validate().unwrap_err().0 == "outbox.table");
        assert!(
            cfg("table = \"public.outbox\"\nroute.topic.replacement = \"fixed\"")
                .validate()
                .is_err()
        );
        let err = oncely_core::config::from_str::<OutboxConfig>(
            "table = \"a.b\"\nfield.event.nope = \"x\"",
            "outbox",
        )
        .unwrap_err();
        assert!(err.message.contains("field.event.nope"), "{err}");
        let router = OutboxRouter::new(&rel(), &cfg("table = \"public.outbox\"")).unwrap();
        let row = TupleData(vec![t("e"), TupleValue::Null, t("1"), t("T"), t("{}")]);
        assert!(matches!(
            router.route(&row, &rel()),
            Err(OutboxError::MissingValue { .. })
        ));
    }
}
