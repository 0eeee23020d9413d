//! The dead-letter topic: records that can never be applied, with where they came from and why.

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

    /// Writes one dead letter and waits for Kafka's acknowledgement. A
    /// record larger than the dead-letter topic (or this producer's
    /// `message.max.bytes`) accepts is written without its value, with its
    /// size in [`HEADER_VALUE_OMITTED`]: the headers still say where the
    /// original is and why it failed.
    pub(crate) async fn send(&self, letter: &DeadLetter<'_>) -> Result<(), SinkError> {
        match self.send_once(letter, false).await {
            Err(e) if e.rdkafka_error_code().is_some_and(is_too_large) => {
                tracing::warn!(
                    topic = letter.topic,
                    partition = letter.partition,
                    offset = letter.offset,
                    bytes = letter.value.map_or(0, <[u8]>::len),
                    "the dead-letter topic refused the record for its size: writing the dead letter without its value"
                );
                self.send_once(letter, true)
                    .await
                    .map_err(|e| classify(&self.topic, e))
            }
            result => result.map_err(|e| classify(&self.topic, e)),
        }
    }

    async fn send_once(&self, letter: &DeadLetter<'_>, omit_value: bool) -> Result<(), KafkaError> {
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let omitted = letter.value.map_or(0, <[u8]>::len).to_string();
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
                value: Some(letter.reason),
            });
        if omit_value {
            headers = headers.insert(Header {
                key: HEADER_VALUE_OMITTED,
                value: Some(&omitted),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = letter.key {
            record = record.key(k);
        }
        if let Some(v) = letter.value.filter(|_| !omit_value) {
            record = record.payload(v);
        }
        match self.producer.send(record, SEND_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e),
        }
    }
}

fn is_too_large(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge
    )
}

/// Kafka errors that resending cannot fix stop the runner; the rest are retried.
fn classify(topic: &str, e: KafkaError) -> SinkError {
    let code = e.rdkafka_error_code();
    let fatal = matches!(
        code,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::TopicAuthorizationFailed
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
