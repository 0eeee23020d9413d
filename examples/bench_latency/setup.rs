//! What a run makes before it starts and removes after: the config files,
//! the index and the topics.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use elasticsearch::indices::IndicesCreateParts;
use elasticsearch::Elasticsearch;
use serde_json::json;

use super::bench_support;

/// Writes capture's config and the three sinks' into `dir`.
pub fn write_configs(
    services: &bench_support::Services,
    dir: &Path,
    (db, dw, slot, prefix): (&str, &str, &str, &str),
    es_url: &str,
    redis_url: &str,
) -> Result<(PathBuf, [(&'static str, PathBuf); 3])> {
    let (host, port, user) = (&services.host, services.port, &services.user);
    let brokers = &services.brokers;
    // Unset: the product's defaults.
    let capture_batch = std::env::var("BENCH_CAPTURE_BATCH_MS")
        .map(|ms| format!("batch.max.ms = {ms}\n"))
        .unwrap_or_default();
    // Extra capture settings, e.g. 'schemas.enable = false'.
    let capture_extra = std::env::var("BENCH_CAPTURE_EXTRA").unwrap_or_default();
    let sink_batch = std::env::var("BENCH_SINK_BATCH_MS")
        .map(|ms| format!("batch.max.ms = {ms}\n"))
        .unwrap_or_default();
    // Extra Elasticsearch sink settings, e.g. 'refresh = true'.
    let es_extra = std::env::var("BENCH_ES_EXTRA").unwrap_or_default();
    let write = |name: &str, body: String| -> Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, body)?;
        Ok(p)
    };
    let capture = write(
        "capture.toml",
        format!(
            "topic.prefix = \"{prefix}\"\ndatabase.hostname = \"{host}\"\ndatabase.port = {port}\n\
             database.user = \"{user}\"\ndatabase.dbname = \"{db}\"\nslot.name = \"{slot}\"\n\
             publication.name = \"{slot}\"\npublication.autocreate.mode = \"filtered\"\n\
             table.include.list = \"public\\\\.ticks\"\n{capture_batch}\
             kafka.bootstrap.servers = \"{brokers}\"\noffset.storage.topic = \"{prefix}-offsets\"\n\
             {capture_extra}\n"
        ),
    )?;
    // Extra librdkafka consumer properties for the sinks, e.g. '"fetch.wait.max.ms" = "20"'.
    let sink_kafka = std::env::var("BENCH_SINK_KAFKA").unwrap_or_default();
    // Extra runner settings for every sink, e.g. 'metrics.listen = "127.0.0.1:9464"'.
    let sink_extra = std::env::var("BENCH_SINK_EXTRA").unwrap_or_default();
    let runner = |group: &str| {
        format!(
            "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{prefix}-{group}\"\n\
             topics = [\"{prefix}.public.ticks\"]\n{sink_batch}\
             errors.deadletterqueue.topic.name = \"{prefix}-dlq\"\n{sink_extra}\n[kafka]\n{sink_kafka}\n"
        )
    };
    let dw_url = format!("postgres://{user}@{host}:{port}/{dw}");
    let sinks = [
        (
            "postgres",
            write(
                "sink-postgres.toml",
                format!("{}[sink]\nkind = \"postgres\"\nurl = \"{dw_url}\"\n", runner("pg")),
            )?,
        ),
        (
            "elasticsearch",
            write(
                "sink-elasticsearch.toml",
                format!(
                    "{}[sink]\nkind = \"elasticsearch\"\nurl = \"{es_url}\"\n{es_extra}\n",
                    runner("es")
                ),
            )?,
        ),
        (
            "redis",
            write(
                "sink-redis.toml",
                format!(
                    "{}[sink]\nkind = \"redis\"\nurl = \"{redis_url}\"\nkey.pattern = \"{prefix}:{{table}}:{{key}}\"\n",
                    runner("redis")
                ),
            )?,
        ),
    ];
    Ok((capture, sinks))
}

/// The benchmark's index, with its refresh interval and slow log.
pub async fn create_index(es: &Elasticsearch, index: &str) -> Result<()> {
    // The slow log names any single document that took long to index.
    let mut settings = json!({"number_of_replicas": 0,
                              "indexing.slowlog.threshold.index.warn": "300ms"});
    // Every second unless BENCH_ES_REFRESH says otherwise, and explicitly: with
    // the setting unset, a shard nobody searches goes search-idle after 30 s
    // and stops its periodic refreshes; updates then pile up and are written
    // in one burst when the indexing buffer fills, and a real-time get waits
    // for that burst (seconds here). An index users search never goes idle.
    let refresh = std::env::var("BENCH_ES_REFRESH").unwrap_or_else(|_| "1s".into());
    if refresh != "unset" {
        settings["refresh_interval"] = json!(refresh);
    }
    es.indices()
        .create(IndicesCreateParts::Index(index))
        .body(json!({"settings": settings, "mappings": {"properties": {"n": {"type": "long"}}}}))
        .send()
        .await?
        .error_for_status_code()
        .context("create the benchmark index")?;
    Ok(())
}

pub async fn create_topic(brokers: &str, topic: &str) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topic = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for result in admin.create_topics([&topic], &AdminOptions::new()).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    Ok(())
}

/// Deletes the benchmark's topics (best effort: a topic never created is no error).
pub async fn delete_topics(brokers: &str, topics: &[&str]) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: Result<AdminClient<rdkafka::client::DefaultClientContext>, _> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create();
    if let Ok(admin) = admin {
        let _ = admin.delete_topics(topics, &AdminOptions::new()).await;
    }
}
