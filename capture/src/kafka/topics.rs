//! [`TopicCreator`]: the topics capture writes to, created on first use
//! (moved unchanged from `kafka.rs`).

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::CaptureConfig;
use crate::error::CaptureError;

/// Creates topics on first use, so capture works where brokers do not auto-create.
pub struct TopicCreator {
    admin: AdminClient<DefaultClientContext>,
    known: HashSet<String>,
    partitions: i32,
    replication: i32,
    /// `max.message.bytes` of created topics.
    max_message_bytes: String,
}

impl TopicCreator {
    pub fn new(cfg: &CaptureConfig) -> Result<Self, CaptureError> {
        let admin = cfg
            .kafka_client()
            .create()
            .map_err(|e| CaptureError::kafka("create admin client", "-", e))?;
        Ok(TopicCreator {
            admin,
            known: HashSet::new(),
            partitions: cfg.topic_partitions,
            replication: cfg.topic_replication_factor,
            max_message_bytes: cfg.max_message_bytes().to_string(),
        })
    }

    /// Makes sure a change topic exists (idempotent).
    pub async fn ensure(&mut self, topic: &str) -> Result<(), CaptureError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        // The broker's default (`message.max.bytes`, about 1 MB) would refuse
        // rows with large values; a topic that exists keeps its own setting.
        let new = NewTopic::new(
            topic,
            self.partitions,
            TopicReplication::Fixed(self.replication),
        )
        .set("max.message.bytes", &self.max_message_bytes);
        self.create(new).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    /// Makes sure a compacted single-partition topic exists, keeping records
    /// as large as change topics do (the schema-change topic: one partition
    /// keeps its records in commit order).
    pub async fn ensure_compacted(&mut self, topic: &str) -> Result<(), CaptureError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        let new = NewTopic::new(topic, 1, TopicReplication::Fixed(self.replication))
            .set("cleanup.policy", "compact")
            .set("max.message.bytes", &self.max_message_bytes);
        self.create(new).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    /// Makes sure the compacted single-partition offsets topic exists.
    pub async fn ensure_offsets_topic(&mut self, topic: &str) -> Result<(), CaptureError> {
        let new = NewTopic::new(topic, 1, TopicReplication::Fixed(self.replication))
            .set("cleanup.policy", "compact");
        self.create(new).await?;
        self.known.insert(topic.to_string());
        Ok(())
    }

    async fn create(&self, topic: NewTopic<'_>) -> Result<(), CaptureError> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = self
            .admin
            .create_topics([&topic], &opts)
            .await
            .map_err(|e| CaptureError::kafka("create topic", "-", e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(CaptureError::kafka(
                        "create topic",
                        "-",
                        KafkaError::AdminOp(code),
                    ))
                    .map_err(|e| {
                        tracing::error!(topic = %name, "cannot create topic: {e}");
                        e
                    })
                }
            }
        }
        Ok(())
    }
}
