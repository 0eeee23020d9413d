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

    /// Writes one dead letter and waits for Kafka's acknowledgement.
    pub(crate) async fn send(&self, letter: &DeadLetter<'_>) -> Result<(), SinkError> {
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let headers = OwnedHeaders::new()
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
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = letter.key {
            record = record.key(k);
        }
        if let Some(v) = letter.value {
            record = record.payload(v);
        }
        match self.producer.send(record, SEND_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(classify(&self.topic, e)),
        }
    }
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
