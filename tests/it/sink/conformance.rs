//! The conformance kit (`oncely_sinks::conformance`) against a prebuilt sink
//! and its real target: the PostgreSQL warehouse sink and the Redis cache sink
//! (both own their positions; versioned writes) and the Elasticsearch sink
//! (Kafka holds its positions; versioned writes). The webhook sink runs it in
//! `tests/it/sink/http.rs`.

use std::sync::Arc;

use oncely_sinks::conformance::{self, Rows, Target};
use oncely_sinks::error::BoxError;
use oncely_sinks::{Sink, SinkError};
use serde_json::{Map, Value};

use crate::harness::common::{es_url, pg_url, redis_url, unique};

/// The sink a `[sink]` table (its lines after the header) describes, as `oncely sink` builds it.
async fn build(sink_table: &str) -> Result<Arc<dyn Sink>, SinkError> {
    let text = format!(
        "bootstrap.servers = \"unused:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n[sink]\n{sink_table}"
    );
    let (_, config) = oncely_sinks::kinds::parse_config(&text).expect("config");
    config.build().await
}

/// The Redis sink, its rows under `<topic>:<id>` (hash layout).
struct RedisTarget;

#[async_trait::async_trait]
impl Target for RedisTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, SinkError> {
        build(&format!(
            "kind = \"redis\"\nurl = \"{}\"\nkey.pattern = \"{{topic}}:{{key}}\"\n",
            redis_url()
        ))
        .await
    }

    async fn rows(&self, topic: &str) -> Result<Rows, BoxError> {
        let client = redis::Client::open(redis_url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{topic}:*"))
            .query_async(&mut conn)
            .await?;
        let mut rows = Rows::new();
        for key in keys {
            let id: u64 = key.rsplit(':').next().ok_or("key")?.parse()?;
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            let mut row = Map::new();
            for (field, value) in fields {
                if field.starts_with("_oncely") {
                    continue;
                }
                let value = match field.as_str() {
                    "doc" => Value::String(value),
                    _ => serde_json::from_str(&value)?,
                };
                row.insert(field, value);
            }
            if !row.is_empty() {
                rows.insert(id, row);
            }
        }
        Ok(rows)
    }
}

#[tokio::test]
async fn the_redis_sink_passes_the_conformance_kit() {
    conformance::check(&RedisTarget, &unique("conf"))
        .await
        .expect("conforms");
}

async fn pg() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

/// The PostgreSQL sink writing into a schema of its own.
struct PostgresTarget {
    schema: String,
}

#[async_trait::async_trait]
impl Target for PostgresTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, SinkError> {
        build(&format!(
            "kind = \"postgres\"\nurl = \"{}\"\ntarget.schema = \"{}\"\n",
            pg_url(),
            self.schema
        ))
        .await
    }

    async fn rows(&self, _topic: &str) -> Result<Rows, BoxError> {
        let sql = format!(
            "SELECT to_jsonb(t) FROM {}.public_conformance t WHERE NOT __oncely_deleted",
            self.schema
        );
        let mut rows = Rows::new();
        for r in pg().await.query(&sql, &[]).await? {
            let row: Value = r.get(0);
            let id = row["id"].as_u64().ok_or("no id")?;
            rows.insert(id, row.as_object().cloned().ok_or("not an object")?);
        }
        Ok(rows)
    }
}

#[tokio::test]
async fn the_postgres_sink_passes_the_conformance_kit() {
    let schema = unique("conf");
    pg().await
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("schema");
    let target = PostgresTarget {
        schema: schema.clone(),
    };
    conformance::check(&target, &unique("conf"))
        .await
        .expect("conforms");
    pg().await
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop schema");
}

/// The Elasticsearch sink, one index per topic (the default pattern).
struct ElasticsearchTarget;

#[async_trait::async_trait]
impl Target for ElasticsearchTarget {
    async fn sink(&self) -> Result<Arc<dyn Sink>, SinkError> {
        build(&format!(
            "kind = \"elasticsearch\"\nurl = \"{}\"\n",
            es_url()
        ))
        .await
    }

    async fn rows(&self, topic: &str) -> Result<Rows, BoxError> {
        use elasticsearch::http::transport::Transport;
        use elasticsearch::indices::IndicesRefreshParts;
        use elasticsearch::{Elasticsearch, SearchParts};
        let client = Elasticsearch::new(Transport::single_node(&es_url())?);
        client
            .indices()
            .refresh(IndicesRefreshParts::Index(&[topic]))
            .send()
            .await?
            .error_for_status_code()?;
        let found: Value = client
            .search(SearchParts::Index(&[topic]))
            .size(1000)
            .send()
            .await?
            .error_for_status_code()?
            .json()
            .await?;
        let mut rows = Rows::new();
        for hit in found["hits"]["hits"].as_array().ok_or("no hits")? {
            let row = hit["_source"].as_object().cloned().ok_or("no _source")?;
            let id = row.get("id").and_then(Value::as_u64).ok_or("no id")?;
            rows.insert(id, row);
        }
        Ok(rows)
    }
}

#[tokio::test]
async fn the_elasticsearch_sink_passes_the_conformance_kit() {
    let index = unique("conf");
    conformance::check(&ElasticsearchTarget, &index)
        .await
        .expect("conforms");
    let client = elasticsearch::Elasticsearch::new(
        elasticsearch::http::transport::Transport::single_node(&es_url()).expect("transport"),
    );
    client
        .indices()
        .delete(elasticsearch::indices::IndicesDeleteParts::Index(&[&index]))
        .send()
        .await
        .expect("delete index");
}
