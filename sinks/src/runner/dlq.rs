//! The dead-letter topic: records that can never be applied, with where they came from and why.
//!
//! **A dead letter never stops the runner for its size.** The reason header
//! is cut to [`MAX_REASON_BYTES`] (in its middle, on character boundaries,
//! saying so; [`cap_reason`]): a
//! reason names what is wrong, the record itself travels as key and value.
//! A record the dead-letter topic refuses for its size (its
//! `max.message.bytes`, or this producer's `message.max.bytes`) is written
//! as a reference instead: no key and no value, the source topic, partition
//! and offset, the reason, and the sizes left out
//! ([`HEADER_KEY_OMITTED`], [`HEADER_VALUE_OMITTED`]); the original stays
//! at its offset in the source topic. Only a topic that refuses even a
//! reference with a short reason (a misconfigured `max.message.bytes` of a
//! few hundred bytes) stops the runner, naming the setting.

use std::borrow::Cow;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::error::{RunnerError, SinkError};

/// Header: the topic the record was read from.
pub const HEADER_TOPIC: &str = "oncely.dlq.topic";
/// Header: the partition the record was read from (decimal).
pub const HEADER_PARTITION: &str = "oncely.dlq.partition";
/// Header: the record's offset in that partition (decimal).
pub const HEADER_OFFSET: &str = "oncely.dlq.offset";
/// Header: why the record could not be applied.
pub const HEADER_ERROR: &str = "oncely.dlq.error";
/// Header, only on a dead letter whose value was left out because the
/// dead-letter topic refused a record that large: the value's size in bytes.
/// The original stays at the source topic, partition and offset.
pub const HEADER_VALUE_OMITTED: &str = "oncely.dlq.value.omitted.bytes";
/// Header, only on such a reference whose record had a key: the key's size in bytes.
pub const HEADER_KEY_OMITTED: &str = "oncely.dlq.key.omitted.bytes";
/// Longest [`HEADER_ERROR`] written, in bytes; a longer reason is cut.
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest reason of the last resort, a reference the topic still refused
/// with a [`MAX_REASON_BYTES`] reason.
const SHORT_REASON_BYTES: usize = 128;

/// How long one send may wait for a free slot in the producer queue and an acknowledgement.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A record to dead-letter: the original key and value, its origin and the reason.
pub(crate) struct DeadLetter<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub reason: &'a str,
}

/// An idempotent producer (acks=all) writing to the dead-letter topic.
///
/// Delivery is at least once: [`DeadLetters::send`] returns only once Kafka has
/// acknowledged the record, and the runner acknowledges the source record
/// (Kafka commit, or a position stored by the sink) only after that. A crash
/// in between writes the dead letter again.
pub(crate) struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetters {
    pub(crate) fn new(base: &ClientConfig, topic: String) -> Result<Self, RunnerError> {
        let mut config = base.clone();
        config
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5");
        let producer = config
            .create()
            .map_err(|e| RunnerError::kafka("create the dead-letter producer", e))?;
        Ok(Self { producer, topic })
    }

    /// Writes one dead letter and waits for Kafka's acknowledgement; a record
    /// the topic refuses for its size is written as a reference (see the
    /// module docs).
    pub(crate) async fn send(&self, letter: &DeadLetter<'_>) -> Result<(), SinkError> {
        let shapes = [
            Shape::Whole,
            Shape::Reference(MAX_REASON_BYTES),
            Shape::Reference(SHORT_REASON_BYTES),
        ];
        let mut refused = None;
        for shape in shapes {
            match self.send_once(letter, shape).await {
                Ok(()) => return Ok(()),
                Err(e) if e.rdkafka_error_code().is_some_and(is_too_large) => {
                    tracing::warn!(
                        topic = letter.topic,
                        partition = letter.partition,
                        offset = letter.offset,
                        key_bytes = letter.key.map_or(0, <[u8]>::len),
                        value_bytes = letter.value.map_or(0, <[u8]>::len),
                        ?shape,
                        "the dead-letter topic refused the dead letter for its size: writing a smaller reference"
                    );
                    refused = Some(e);
                }
                Err(e) => return Err(classify(&self.topic, e)),
            }
        }
        let message = format!(
            "the dead-letter topic `{}` refuses even a reference to {}[{}]@{} with a \
             {SHORT_REASON_BYTES}-byte reason for its size: raise its max.message.bytes",
            self.topic, letter.topic, letter.partition, letter.offset
        );
        Err(match refused {
            Some(e) => SinkError::fatal_from(message, e),
            None => SinkError::fatal(message),
        })
    }

    async fn send_once(&self, letter: &DeadLetter<'_>, shape: Shape) -> Result<(), KafkaError> {
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let reason = cap_reason(letter.reason, shape.reason_bytes());
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: HEADER_TOPIC,
                value: Some(letter.topic),
            })
            .insert(Header {
                key: HEADER_PARTITION,
                value: Some(&partition),
            })
            .insert(Header {
                key: HEADER_OFFSET,
                value: Some(&offset),
            })
            .insert(Header {
                key: HEADER_ERROR,
                value: Some(reason.as_ref()),
            });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic);
        match shape {
            Shape::Whole => {
                if let Some(k) = letter.key {
                    record = record.key(k);
                }
                if let Some(v) = letter.value {
                    record = record.payload(v);
                }
            }
            Shape::Reference(_) => {
                if let Some(k) = letter.key {
                    headers = headers.insert(Header {
                        key: HEADER_KEY_OMITTED,
                        value: Some(&k.len().to_string()),
                    });
                }
                if let Some(v) = letter.value {
                    headers = headers.insert(Header {
                        key: HEADER_VALUE_OMITTED,
                        value: Some(&v.len().to_string()),
                    });
                }
            }
        }
        match self
            .producer
            .send(record.headers(headers), SEND_TIMEOUT)
            .await
        {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e),
        }
    }
}

/// What a dead letter carries.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// The record's key and value, the reason cut to [`MAX_REASON_BYTES`].
    Whole,
    /// No key and no value, the reason cut to this many bytes.
    Reference(usize),
}

impl Shape {
    fn reason_bytes(self) -> usize {
        match self {
            Shape::Whole => MAX_REASON_BYTES,
            Shape::Reference(bytes) => bytes,
        }
    }
}

/// `reason` cut to at most `max` bytes on character boundaries: its first
/// two thirds and its last third kept (what failed comes first, the advice
/// last; a quoted value sits in between), with a note of what was cut.
pub(crate) fn cap_reason(reason: &str, max: usize) -> Cow<'_, str> {
    if reason.len() <= max {
        return Cow::Borrowed(reason);
    }
    let note = format!(" ... [{} of {} bytes cut] ... ", reason.len(), reason.len());
    let room = max.saturating_sub(note.len());
    let mut head = room * 2 / 3;
    while !reason.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = reason.len() - (room - head);
    while !reason.is_char_boundary(tail) {
        tail += 1;
    }
    let note = format!(" ... [{} of {} bytes cut] ... ", tail - head, reason.len());
    Cow::Owned(format!("{}{note}{}", &reason[..head], &reason[tail..]))
}

/// A refusal for size: by the broker (the topic's `max.message.bytes`) or
/// by this producer (`message.max.bytes`).
fn is_too_large(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge
    )
}

/// Kafka errors that resending cannot fix stop the runner; the rest are
/// retried. (A refusal for size never comes here: [`DeadLetters::send`]
/// writes a smaller reference instead.)
fn classify(topic: &str, e: KafkaError) -> SinkError {
    let code = e.rdkafka_error_code();
    let fatal = matches!(
        code,
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::Fenced
        )
    );
    let message = format!("write to dead-letter topic `{topic}`");
    if fatal {
        SinkError::fatal_from(message, e)
    } else {
        SinkError::retriable_from(message, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_on_a_character_boundary_saying_so() {
        assert_eq!(cap_reason("short", MAX_REASON_BYTES), "short");
        let long = format!("unknown op `{}`; set it right", "é".repeat(4000));
        let cut = cap_reason(&long, MAX_REASON_BYTES);
        assert!(cut.len() <= MAX_REASON_BYTES, "{}", cut.len());
        assert!(cut.starts_with("unknown op `éé"), "{cut}");
        assert!(cut.ends_with("éé`; set it right"), "{cut}");
        assert!(
            cut.contains(&format!(" of {} bytes cut] ... ", long.len())),
            "{cut}"
        );
        let short = cap_reason(&long, SHORT_REASON_BYTES);
        assert!(short.len() <= SHORT_REASON_BYTES, "{}", short.len());
        assert!(short.ends_with("set it right"), "{short}");
    }
}
