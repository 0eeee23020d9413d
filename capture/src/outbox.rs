//! The outbox event router: rows inserted into an outbox table become clean
//! domain events on a topic chosen by a column (Debezium's outbox pattern).
//!
//! The routing happens inside the capture pipeline, so an outbox event is
//! part of the same Kafka transaction as its offset record and is published
//! exactly once. Updates and deletes of outbox rows publish nothing (an
//! application may delete rows right after inserting them).
//!
//! A row that cannot be routed (a routing column null, a topic name Kafka
//! refuses) is a dead letter: the row goes to the outbox dead-letter topic
//! in the same Kafka transaction, with headers naming the table, the reason
//! and the fix. Stopping would not help: a restart replays the same WAL.

use serde::Deserialize;

use crate::change::{Datum, RowImage, StreamTable};

pub const DEFAULT_ID: &str = "id";
pub const DEFAULT_KEY: &str = "aggregateid";
pub const DEFAULT_TYPE: &str = "type";
pub const DEFAULT_PAYLOAD: &str = "payload";
pub const DEFAULT_ROUTE_BY: &str = "aggregatetype";
pub const DEFAULT_TOPIC_PATTERN: &str = "outbox.event.${routedByValue}";
/// The default dead-letter topic follows `topic.prefix`: `<topic.prefix>` + this.
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = ".outbox-dlq";
/// Dead-letter headers: the outbox table, why the row is one, and what to do.
pub const HEADER_DLQ_TABLE: &str = "oncely.dlq.table";
pub const HEADER_DLQ_ERROR: &str = "oncely.dlq.error";
pub const HEADER_DLQ_FIX: &str = "oncely.dlq.fix";
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
    /// `outbox.errors.deadletterqueue.topic.name`: where rows that cannot be
    /// routed go; by default `<topic.prefix>.outbox-dlq` (see
    /// [`OutboxConfig::dead_letter_topic`]).
    #[serde(rename = "errors.deadletterqueue.topic.name", default)]
    pub dead_letter_topic: Option<String>,
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
    /// The outbox dead-letter topic of a connector with `topic_prefix`.
    pub fn dead_letter_topic(&self, topic_prefix: &str) -> String {
        match &self.dead_letter_topic {
            Some(topic) => topic.clone(),
            None => crate::naming::sanitize_topic(&format!(
                "{topic_prefix}{DEFAULT_DEAD_LETTER_SUFFIX}"
            )),
        }
    }

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
        if let Some(topic) = &self.dead_letter_topic {
            if !is_topic_name(topic) {
                return Err((
                    "outbox.errors.deadletterqueue.topic.name",
                    format!("{topic:?} must be 1 to 249 letters, digits, '.', '_' and '-' (Kafka topic characters)"),
                ));
            }
        }
        Ok(())
    }
}

fn is_topic_name(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= crate::naming::MAX_TOPIC_BYTES
        && topic != "."
        && topic != ".."
        && crate::naming::sanitize_topic(topic) == topic
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
    /// The outbox dead-letter topic.
    dead_letters: String,
    /// `schema.table`, for dead-letter headers.
    table: String,
}

/// An outbox row that cannot be routed, as its dead-letter record carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub topic: String,
    /// The aggregate id's text, when the row has one.
    pub key: Option<Vec<u8>>,
    /// The row's routing columns as a JSON object, column name -> text or null.
    pub value: Vec<u8>,
    /// `schema.table` of the outbox.
    pub table: String,
    /// Why it is a dead letter; names columns and settings, never values.
    pub reason: String,
    /// What to do about it.
    pub fix: String,
}
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OutboxError {
    #[error("outbox table {table} has no column `{column}` (configured as outbox.{key}); add it or set outbox.{key}")]
    MissingColumn {
        table: String,
        column: String,
        key: &'static str,
    },
    #[error("outbox row has a null or unavailable `{column}` (outbox.{key}), which routing needs")]
    MissingValue { column: String, key: &'static str },
    #[error("outbox row routes to a topic of {len} bytes, longer than Kafka's limit of {max}: its `{column}` (outbox.route.by.field) holds {value_len} bytes", max = crate::naming::MAX_TOPIC_BYTES)]
    TopicTooLong {
        len: usize,
        column: String,
        value_len: usize,
    },
    #[error("outbox row routes to topic `{topic}`, which Kafka refuses or which is the outbox dead-letter topic: its `{column}` (outbox.route.by.field) chooses it")]
    BadTopic { topic: String, column: String },
}

impl OutboxError {
    /// What to do about a row this error made a dead letter.
    fn fix(&self) -> String {
        match self {
            OutboxError::MissingColumn { key, .. } => {
                format!("add the column to the outbox table, or set outbox.{key}")
            }
            OutboxError::MissingValue { column, .. } => format!(
                "insert outbox rows with `{column}` set (make the column NOT NULL); to publish this event, insert it again with the value"
            ),
            OutboxError::TopicTooLong { column, .. } | OutboxError::BadTopic { column, .. } => format!(
                "keep `{column}` values to what makes a valid topic name through outbox.route.topic.replacement (at most {} bytes in all); to publish this event, insert it again with such a value",
                crate::naming::MAX_TOPIC_BYTES
            ),
        }
    }
}

impl OutboxRouter {
    /// The router of `rel`, whose dead letters go to `dead_letters`.
    pub fn new(
        rel: &impl StreamTable,
        cfg: &OutboxConfig,
        dead_letters: &str,
    ) -> Result<Self, OutboxError> {
        let find = |column: &str, key: &'static str| {
            (0..rel.width())
                .position(|i| rel.column_name(i) == column)
                .ok_or_else(|| OutboxError::MissingColumn {
                    table: format!("{}.{}", rel.namespace(), rel.name()),
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
            dead_letters: dead_letters.to_owned(),
            table: format!("{}.{}", rel.namespace(), rel.name()),
        })
    }

    /// The event of an inserted outbox row, or its dead letter when it
    /// cannot be routed.
    pub fn route_or_dead_letter(
        &self,
        row: &RowImage,
        rel: &impl StreamTable,
    ) -> Result<OutboxEvent, Box<DeadLetter>> {
        self.route(row, rel)
            .map_err(|e| Box::new(self.dead_letter(row, rel, &e)))
    }

    /// The dead letter of `row`, which `error` kept from being routed.
    fn dead_letter(
        &self,
        row: &RowImage,
        rel: &impl StreamTable,
        error: &OutboxError,
    ) -> DeadLetter {
        let text = |i: usize| match row.0.get(i) {
            Some(Datum::Text(b)) | Some(Datum::Binary(b)) => Some(b.as_ref()),
            _ => None,
        };
        let mut value = serde_json::Map::new();
        for i in [self.id, self.route_by, self.key, self.kind, self.payload] {
            if i >= rel.width() {
                continue;
            }
            let v = text(i).map_or(serde_json::Value::Null, |b| {
                String::from_utf8_lossy(b).into_owned().into()
            });
            value.insert(rel.column_name(i).to_owned(), v);
        }
        DeadLetter {
            topic: self.dead_letters.clone(),
            key: text(self.key).map(<[u8]>::to_vec),
            value: serde_json::Value::Object(value).to_string().into_bytes(),
            table: self.table.clone(),
            reason: error.to_string(),
            fix: error.fix(),
        }
    }

    /// The event of an inserted outbox row.
    pub fn route(
        &self,
        row: &RowImage,
        rel: &impl StreamTable,
    ) -> Result<OutboxEvent, OutboxError> {
        let column = |i: usize| {
            if i < rel.width() {
                rel.column_name(i).to_owned()
            } else {
                String::new()
            }
        };
        let text = |i: usize, key: &'static str| -> Result<Vec<u8>, OutboxError> {
            match row.0.get(i) {
                Some(Datum::Text(b)) | Some(Datum::Binary(b)) => Ok(b.to_vec()),
                _ => Err(OutboxError::MissingValue {
                    column: column(i),
                    key,
                }),
            }
        };
        let route = String::from_utf8_lossy(&text(self.route_by, "route.by.field")?).into_owned();
        let topic = crate::naming::sanitize_topic(&self.pattern.replace(ROUTED_BY_VALUE, &route));
        if topic.len() > crate::naming::MAX_TOPIC_BYTES {
            return Err(OutboxError::TopicTooLong {
                len: topic.len(),
                column: column(self.route_by),
                value_len: route.len(),
            });
        }
        if !is_topic_name(&topic) || topic == self.dead_letters {
            return Err(OutboxError::BadTopic {
                topic,
                column: column(self.route_by),
            });
        }
        let value = match row.0.get(self.payload) {
            Some(Datum::Null) => None,
            _ => Some(text(self.payload, "field.event.payload")?),
        };
        Ok(OutboxEvent {
            topic,
            key: text(self.key, "field.event.key")?,
            value,
            id: text(self.id, "field.event.id")?,
            kind: text(self.kind, "field.event.type")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::TestTable;
    use bytes::Bytes;

    fn rel() -> TestTable {
        TestTable {
            namespace: "public",
            name: "outbox",
            ahead_of_stream: false,
            columns: ["id", "aggregatetype", "aggregateid", "type", "payload"]
                .map(|name| (name.to_owned(), 25))
                .to_vec(),
        }
    }

    fn t(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn cfg(toml_text: &str) -> OutboxConfig {
        oncely_core::config::from_str(toml_text, "outbox").unwrap()
    }

    #[test]
    fn routes_by_aggregate_type() {
        let c = cfg("table = \"public.outbox\"");
        c.validate().unwrap();
        let router = OutboxRouter::new(&rel(), &c, "p.outbox-dlq").unwrap();
        let row = RowImage(vec![
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
        let null_payload = RowImage(vec![t("e-2"), t("x"), t("1"), t("Deleted"), Datum::Null]);
        assert_eq!(router.route(&null_payload, &rel()).unwrap().value, None);
    }

    #[test]
    fn configured_names_and_errors() {
        let c = cfg("table = \"public.outbox\"\nfield.event.key = \"agg\"\nroute.topic.replacement = \"ev.${routedByValue}.v1\"");
        let err = OutboxRouter::new(&rel(), &c, "p.outbox-dlq").unwrap_err();
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
        let router =
            OutboxRouter::new(&rel(), &cfg("table = \"public.outbox\""), "p.outbox-dlq").unwrap();
        let row = RowImage(vec![t("e"), Datum::Null, t("1"), t("T"), t("{}")]);
        assert!(matches!(
            router.route(&row, &rel()),
            Err(OutboxError::MissingValue { .. })
        ));
    }

    #[test]
    fn rows_that_cannot_be_routed_are_dead_letters_naming_the_fix() {
        let router =
            OutboxRouter::new(&rel(), &cfg("table = \"public.outbox\""), "p.outbox-dlq").unwrap();
        let null_key = RowImage(vec![
            t("e-1"),
            t("order"),
            Datum::Null,
            t("Created"),
            t("{}"),
        ]);
        let dl = router.route_or_dead_letter(&null_key, &rel()).unwrap_err();
        assert_eq!(dl.topic, "p.outbox-dlq");
        assert_eq!(dl.table, "public.outbox");
        assert_eq!(dl.key, None);
        assert!(
            dl.reason.contains("`aggregateid` (outbox.field.event.key)"),
            "{}",
            dl.reason
        );
        assert!(dl.fix.contains("NOT NULL"), "{}", dl.fix);
        let row: serde_json::Value = serde_json::from_slice(&dl.value).unwrap();
        assert_eq!(row["aggregateid"], serde_json::Value::Null);
        assert_eq!(row["aggregatetype"], "order");
        assert_eq!(row["payload"], "{}");

        let long = "x".repeat(300);
        let long_type = RowImage(vec![t("e-2"), t(&long), t("7"), t("Created"), t("{}")]);
        let dl = router.route_or_dead_letter(&long_type, &rel()).unwrap_err();
        assert_eq!(dl.key.as_deref(), Some(&b"7"[..]));
        assert!(dl.reason.contains("249"), "{}", dl.reason);
        assert!(!dl.reason.contains(&long), "no values in the reason");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&dl.value).unwrap()["aggregatetype"],
            long.as_str()
        );
        // 236 bytes of type fill the default pattern to Kafka's limit exactly.
        let fits = RowImage(vec![t("e-3"), t(&"y".repeat(236)), t("7"), t("T"), t("{}")]);
        assert_eq!(router.route(&fits, &rel()).unwrap().topic.len(), 249);

        // Nor to the dead-letter topic itself, nor to `.`.
        let pattern =
            cfg("table = \"public.outbox\"\nroute.topic.replacement = \"${routedByValue}\"");
        let router = OutboxRouter::new(&rel(), &pattern, "p.outbox-dlq").unwrap();
        for to in ["p.outbox-dlq", "."] {
            let row = RowImage(vec![t("e"), t(to), t("1"), t("T"), t("{}")]);
            assert!(
                matches!(
                    router.route(&row, &rel()),
                    Err(OutboxError::BadTopic { .. })
                ),
                "{to}"
            );
        }
    }

    #[test]
    fn the_dead_letter_topic_follows_the_prefix_unless_set() {
        let c = cfg("table = \"public.outbox\"");
        assert_eq!(c.dead_letter_topic("shop"), "shop.outbox-dlq");
        let c = cfg("table = \"public.outbox\"\nerrors.deadletterqueue.topic.name = \"bad-rows\"");
        c.validate().unwrap();
        assert_eq!(c.dead_letter_topic("shop"), "bad-rows");
        let c = cfg("table = \"public.outbox\"\nerrors.deadletterqueue.topic.name = \"a b\"");
        assert_eq!(
            c.validate().unwrap_err().0,
            "outbox.errors.deadletterqueue.topic.name"
        );
    }
}
