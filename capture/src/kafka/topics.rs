//! [`TopicCreator`]: the topics capture writes to, created on first use
//! (moved unchanged from `kafka.rs`).

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::CaptureConfig;
use crate::error::CaptureError;

/// One of capture's own single-partition topics, for [`check_one_partition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InternalTopic {
    /// `offset.storage.topic`: offset records, read back at start.
    Offsets,
    /// `<topic.prefix>.schema-changes`: the schema history, read back at start.
    SchemaChanges,
}

/// Refuses an internal topic that exists with more than one partition.
/// Capture writes these topics' records to partition 0 and reads only
/// partition 0 back at start; records another partition holds (written by
/// key hash before, or by another tool) would be missed, and a start that
/// misses its offset snapshots and publishes everything again. Kafka cannot
/// take partitions away, so the message says how to start over instead.
pub async fn check_one_partition(
    cfg: &CaptureConfig,
    topic: &str,
    kind: InternalTopic,
) -> Result<(), CaptureError> {
    match crate::offset::partition_count(cfg, topic).await? {
        None | Some(1) => Ok(()),
        Some(n) => Err(CaptureError::Prerequisite(one_partition_message(
            topic, n, kind,
        ))),
    }
}

fn one_partition_message(topic: &str, partitions: usize, kind: InternalTopic) -> String {
    let fix = match kind {
        InternalTopic::Offsets => format!(
            "set offset.storage.topic to a topic that does not exist yet (capture creates it with one partition, compacted), or delete `{topic}` and make it again with --partitions 1 --config cleanup.policy=compact. The offsets stored in it are left behind either way, so the next start snapshots as snapshot.mode says"
        ),
        InternalTopic::SchemaChanges => format!(
            "delete `{topic}` (capture makes it again with one partition and takes the catalog's columns as its baseline), or make it again with --partitions 1 --config cleanup.policy=compact"
        ),
    };
    let what = match kind {
        InternalTopic::Offsets => "offsets topic",
        InternalTopic::SchemaChanges => "schema-change topic",
    };
    format!(
        "the {what} `{topic}` has {partitions} partitions; capture needs exactly one (it writes its records to partition 0 and reads only partition 0 back at start, so with more a restart can miss them and publish everything again). Kafka cannot remove partitions: {fix}"
    )
}

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

    /// Makes sure the compacted single-partition offsets topic exists (one
    /// that exists already is checked by [`check_one_partition`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_topic_its_partitions_and_the_fix() {
        let m = one_partition_message("oncely-offsets-shop", 3, InternalTopic::Offsets);
        assert!(m.contains("`oncely-offsets-shop` has 3 partitions"), "{m}");
        assert!(m.contains("offset.storage.topic"), "{m}");
        let m = one_partition_message("shop.schema-changes", 2, InternalTopic::SchemaChanges);
        assert!(
            m.contains("schema-change topic `shop.schema-changes` has 2 partitions"),
            "{m}"
        );
    }
}
