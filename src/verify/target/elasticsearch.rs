//! Elasticsearch: one index per table (`index.pattern`, lower-cased), document
//! id = the key (one column: its value as text; several: the JSON array of
//! the values), `_source` = the row in the index's form (native or wire,
//! recorded in the index's mark; see the sink's `values`). With
//! `delete.mode = "soft"` a deleted row stays with the flag field set. The
//! sink commits its positions to Kafka (the consumer group's offsets).

use std::collections::HashMap;
use std::time::Duration;

use elasticsearch::indices::IndicesRefreshParts;
use elasticsearch::{CountParts, Elasticsearch, MgetParts, OpenPointInTimeParts, SearchParts};
use oncely_sinks::kinds::elasticsearch::mapping::index_format;
use oncely_sinks::kinds::elasticsearch::plan::index_name;
use oncely_sinks::kinds::elasticsearch::values::Format;
use oncely_sinks::kinds::elasticsearch::{DeleteMode, ElasticsearchConfig, ElasticsearchSink};
use oncely_sinks::native::ValueFormat;
use oncely_sinks::RunnerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};

use super::{KeyPage, Partition, PAGE};
use crate::verify::compare::TargetRow;
use crate::verify::source::{wire_text, SourceRow, SourceTable};
use crate::verify::VerifyError;

pub struct EsTarget {
    sink: ElasticsearchSink,
    config: ElasticsearchConfig,
    bootstrap: String,
    group: String,
    /// The runner's security settings, to read the group's offsets.
    kafka: Vec<(String, String)>,
    db: String,
}

impl EsTarget {
    pub async fn connect(
        config: &ElasticsearchConfig,
        runner: &RunnerConfig,
        db: &str,
    ) -> Result<Self, VerifyError> {
        let sink = ElasticsearchSink::connect(config)
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch: {e}")))?;
        let kafka = runner
            .kafka
            .iter()
            .filter(|(k, _)| oncely_capture::kafka::is_connection_property(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Self {
            sink,
            config: config.clone(),
            bootstrap: runner.bootstrap_servers.clone(),
            group: runner.group_id.clone(),
            kafka,
            db: db.to_owned(),
        })
    }

    fn client(&self) -> &Elasticsearch {
        self.sink.client()
    }

    /// The index the sink writes `table` to: the sink's own function.
    pub fn index(&self, table: &SourceTable) -> Result<String, VerifyError> {
        index_name(
            &self.config.index_pattern,
            &table.topic,
            &self.db,
            &table.schema,
            &table.name,
        )
        .map_err(VerifyError::Config)
    }

    fn soft(&self) -> bool {
        self.config.delete_mode == DeleteMode::Soft
    }

    /// Live documents: with soft deletes, those whose flag is not set.
    fn live_query(&self) -> Value {
        if self.soft() {
            json!({"bool": {"must_not": {"term": {self.config.soft_delete_field.clone(): true}}}})
        } else {
            json!({"match_all": {}})
        }
    }

    pub async fn fetch(
        &self,
        table: &SourceTable,
        rows: &[SourceRow],
    ) -> Result<Vec<Option<TargetRow>>, VerifyError> {
        let index = self.index(table)?;
        let ids: Vec<String> = rows.iter().map(|r| document_id(&r.key_wire)).collect();
        let response = self
            .client()
            .mget(MgetParts::Index(&index))
            .body(json!({ "ids": ids }))
            .send()
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch mget on {index}: {e}")))?;
        let status = response.status_code().as_u16();
        if status == 404 {
            return Ok(vec![None; rows.len()]);
        }
        let body: Value = response
            .json()
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch mget on {index}: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(VerifyError::Target(format!(
                "elasticsearch mget on {index}: HTTP {status}: {body}"
            )));
        }
        let format = index_format(self.client(), &index, Format::of_config(&self.config))
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch mapping of {index}: {e}")))?;
        let docs = body["docs"].as_array().cloned().unwrap_or_default();
        if docs.len() != rows.len() {
            return Err(VerifyError::Target(format!(
                "elasticsearch mget on {index} answered {} documents for {} ids",
                docs.len(),
                rows.len()
            )));
        }
        Ok(docs
            .into_iter()
            .map(|d| {
                if d["found"] != json!(true) {
                    return None;
                }
                let mut source = d["_source"].as_object().cloned().unwrap_or_default();
                // Every document carries its version beside the columns.
                if !self.config.version_field.is_empty() {
                    source.shift_remove(&self.config.version_field);
                }
                if self.soft() {
                    let flag = source.shift_remove(&self.config.soft_delete_field);
                    if flag == Some(json!(true)) {
                        return None;
                    }
                }
                Some(match format.values {
                    ValueFormat::Native => TargetRow::Native(source, format),
                    ValueFormat::Wire => TargetRow::Json(source),
                })
            })
            .collect())
    }

    pub async fn count(&self, table: &SourceTable) -> Result<u64, VerifyError> {
        let index = self.index(table)?;
        // Counting searches what is refreshed; mget is real-time, so refresh first.
        let refresh = self
            .client()
            .indices()
            .refresh(IndicesRefreshParts::Index(&[&index]))
            .send()
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch refresh of {index}: {e}")))?;
        if refresh.status_code().as_u16() == 404 {
            return Ok(0);
        }
        let response = self
            .client()
            .count(CountParts::Index(&[&index]))
            .body(json!({ "query": self.live_query() }))
            .send()
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch count of {index}: {e}")))?;
        let status = response.status_code().as_u16();
        let body: Value = response
            .json()
            .await
            .map_err(|e| VerifyError::Target(format!("elasticsearch count of {index}: {e}")))?;
        body["count"].as_u64().ok_or_else(|| {
            VerifyError::Target(format!(
                "elasticsearch count of {index}: HTTP {status}: {body}"
            ))
        })
    }

    /// Pages through the index with a point in time, in `_shard_doc` order
    /// (sorting by `_id` needs fielddata, off by default).
    pub async fn scan_keys(
        &self,
        table: &SourceTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyError> {
        let index = self.index(table)?;
        let err = |e: String| VerifyError::Target(format!("elasticsearch scan of {index}: {e}"));
        let (pit, after) = match cursor {
            Some(c) => {
                let c: Value = serde_json::from_str(&c).map_err(|e| err(e.to_string()))?;
                (
                    c["pit"].as_str().unwrap_or_default().to_owned(),
                    Some(c["after"].clone()),
                )
            }
            None => {
                let response = self
                    .client()
                    .open_point_in_time(OpenPointInTimeParts::Index(&[&index]))
                    .keep_alive("2m")
                    .send()
                    .await
                    .map_err(|e| err(e.to_string()))?;
                if response.status_code().as_u16() == 404 {
                    return Ok((Vec::new(), None));
                }
                let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
                let id = body["id"]
                    .as_str()
                    .ok_or_else(|| err(format!("no point in time: {body}")))?;
                (id.to_owned(), None)
            }
        };
        let mut query = json!({
            "size": PAGE,
            "_source": false,
            "query": self.live_query(),
            "pit": {"id": pit, "keep_alive": "2m"},
            "sort": [{"_shard_doc": "asc"}],
        });
        if let Some(after) = after {
            query["search_after"] = after;
        }
        let response = self
            .client()
            .search(SearchParts::None)
            .body(query)
            .send()
            .await
            .map_err(|e| err(e.to_string()))?;
        let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
        let hits = body["hits"]["hits"]
            .as_array()
            .ok_or_else(|| err(format!("unexpected answer: {body}")))?;
        let keys = hits
            .iter()
            .filter_map(|h| h["_id"].as_str())
            .map(|id| key_of_id(id, table.key.len()))
            .collect();
        let next = match hits.last() {
            Some(last) if hits.len() == PAGE => {
                let pit = body["pit_id"].as_str().unwrap_or(&pit);
                Some(json!({"pit": pit, "after": last["sort"]}).to_string())
            }
            _ => None,
        };
        Ok((keys, next))
    }

    /// The group's committed offsets (the sink commits after a batch is settled).
    pub async fn positions(
        &self,
        partitions: &[Partition],
    ) -> Result<HashMap<Partition, i64>, VerifyError> {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false");
        for (k, v) in &self.kafka {
            config.set(k, v);
        }
        let partitions = partitions.to_vec();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config
                .create()
                .map_err(|e| VerifyError::Kafka(format!("create a consumer: {e}")))?;
            let mut tpl = TopicPartitionList::new();
            for (t, p) in &partitions {
                tpl.add_partition(t, *p);
            }
            let committed = consumer
                .committed_offsets(tpl, Duration::from_secs(10))
                .map_err(|e| {
                    VerifyError::Kafka(format!("read the group's committed offsets: {e}"))
                })?;
            Ok(committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
                    _ => None,
                })
                .collect())
        })
        .await
        .map_err(|e| VerifyError::Kafka(format!("offset reader task failed: {e}")))?
    }
}

/// The sink's document id of a key's values ("" for a null key, which the
/// sink never writes).
pub fn document_id(key: &[Value]) -> String {
    let values: Vec<&Value> = key.iter().collect();
    oncely_sinks::kinds::elasticsearch::plan::document_id_of(&values).unwrap_or_default()
}

/// Key values (as text) of a document id.
fn key_of_id(id: &str, columns: usize) -> Vec<String> {
    if columns == 1 {
        return vec![id.to_owned()];
    }
    match serde_json::from_str::<Vec<Value>>(id) {
        Ok(values) => values
            .iter()
            .map(|v| wire_text(v).unwrap_or_default())
            .collect(),
        Err(_) => vec![id.to_owned()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_sink() {
        assert_eq!(document_id(&[json!(42)]), "42");
        assert_eq!(document_id(&[json!("a-b")]), "a-b");
        assert_eq!(document_id(&[json!(1), json!("x")]), "[1,\"x\"]");
        assert_eq!(
            key_of_id("[1,\"x\"]", 2),
            vec!["1".to_string(), "x".to_string()]
        );
        assert_eq!(key_of_id("42", 1), vec!["42".to_string()]);
    }
}
