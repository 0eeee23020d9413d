//! The indexes read back for `oncely verify`, with the sink's own index
//! names, document ids and value forms: one index per table (`index.pattern`,
//! lower-cased), document id = the key (one column: its value as text;
//! several: the JSON array of the values), `_source` = the row in the index's
//! form (recorded in the index's mark; see [`super::values`]). With
//! `delete.mode = "soft"` a deleted row stays with the flag field set. The
//! sink leaves its positions to Kafka (the consumer group's offsets).

use std::collections::HashMap;

use ::elasticsearch::indices::IndicesRefreshParts;
use ::elasticsearch::{CountParts, Elasticsearch, MgetParts, OpenPointInTimeParts, SearchParts};
use async_trait::async_trait;
use serde_json::{json, Value};

use super::mapping::index_format;
use super::plan::{document_id_of, index_name};
use super::values::Format;
use super::{DeleteMode, ElasticsearchConfig, ElasticsearchSink};
use crate::config::RunnerConfig;
use crate::sink::TopicPartition;
use crate::verify_reader::{
    committed_offsets, wire_text, Fetched, KeyPage, RowKey, StoredRow, VerifiedTable,
    VerifyContext, VerifyReadError, VerifyReader, PAGE,
};

/// An Elasticsearch sink's indexes, read the way the sink writes them.
pub struct ElasticsearchVerifyReader {
    sink: ElasticsearchSink,
    config: ElasticsearchConfig,
    runner: RunnerConfig,
    db: String,
}

impl ElasticsearchVerifyReader {
    /// Connects with the sink's own client settings.
    pub async fn connect(
        config: &ElasticsearchConfig,
        ctx: &VerifyContext<'_>,
    ) -> Result<Self, VerifyReadError> {
        let sink = ElasticsearchSink::connect(config)
            .await
            .map_err(|e| VerifyReadError::Target(format!("elasticsearch: {e}")))?;
        Ok(Self {
            sink,
            config: config.clone(),
            runner: ctx.runner.clone(),
            db: ctx.db.to_owned(),
        })
    }

    fn client(&self) -> &Elasticsearch {
        self.sink.client()
    }

    /// The index the sink writes `table` to: the sink's own function.
    fn index(&self, table: &VerifiedTable) -> Result<String, VerifyReadError> {
        index_name(
            &self.config.index_pattern,
            &table.topic,
            &self.db,
            &table.schema,
            &table.name,
        )
        .map_err(VerifyReadError::Config)
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
}

#[async_trait]
impl VerifyReader for ElasticsearchVerifyReader {
    fn location(&self, table: &VerifiedTable) -> String {
        match self.index(table) {
            Ok(index) => format!("index {index}"),
            Err(e) => e.to_string(),
        }
    }

    async fn fetch(
        &self,
        table: &VerifiedTable,
        keys: &[RowKey<'_>],
    ) -> Result<Fetched, VerifyReadError> {
        let index = self.index(table)?;
        let err =
            |e: String| VerifyReadError::Target(format!("elasticsearch mget on {index}: {e}"));
        let ids: Vec<String> = keys.iter().map(|k| document_id(k.wire)).collect();
        let response = self
            .client()
            .mget(MgetParts::Index(&index))
            .body(json!({ "ids": ids }))
            .send()
            .await
            .map_err(|e| err(e.to_string()))?;
        let status = response.status_code().as_u16();
        let configured = Format::of_config(&self.config);
        if status == 404 {
            return Ok(Fetched {
                rows: vec![None; keys.len()],
                form: configured.stored_form(),
            });
        }
        let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
        if !(200..300).contains(&status) {
            return Err(err(format!("HTTP {status}: {body}")));
        }
        let format = index_format(self.client(), &index, configured)
            .await
            .map_err(|e| {
                VerifyReadError::Target(format!("elasticsearch mapping of {index}: {e}"))
            })?;
        let docs = body["docs"].as_array().cloned().unwrap_or_default();
        if docs.len() != keys.len() {
            return Err(err(format!(
                "answered {} documents for {} ids",
                docs.len(),
                keys.len()
            )));
        }
        let rows = docs
            .into_iter()
            .map(|d| {
                if d["found"] != json!(true) {
                    return None;
                }
                let mut source = d["_source"].as_object().cloned().unwrap_or_default();
                // Every document carries its version beside the columns.
                for field in self.config.bookkeeping_fields() {
                    source.shift_remove(field);
                }
                if self.soft() {
                    let flag = source.shift_remove(&self.config.soft_delete_field);
                    if flag == Some(json!(true)) {
                        return None;
                    }
                }
                Some(StoredRow::Json(source))
            })
            .collect();
        Ok(Fetched {
            rows,
            form: format.stored_form(),
        })
    }

    async fn count(&self, table: &VerifiedTable) -> Result<u64, VerifyReadError> {
        let index = self.index(table)?;
        let err =
            |e: String| VerifyReadError::Target(format!("elasticsearch count of {index}: {e}"));
        // Counting searches what is refreshed; mget is real-time, so refresh first.
        let refresh = self
            .client()
            .indices()
            .refresh(IndicesRefreshParts::Index(&[&index]))
            .send()
            .await
            .map_err(|e| {
                VerifyReadError::Target(format!("elasticsearch refresh of {index}: {e}"))
            })?;
        if refresh.status_code().as_u16() == 404 {
            return Ok(0);
        }
        let response = self
            .client()
            .count(CountParts::Index(&[&index]))
            .body(json!({ "query": self.live_query() }))
            .send()
            .await
            .map_err(|e| err(e.to_string()))?;
        let status = response.status_code().as_u16();
        let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
        body["count"]
            .as_u64()
            .ok_or_else(|| err(format!("HTTP {status}: {body}")))
    }

    /// Pages through the index with a point in time, in `_shard_doc` order
    /// (sorting by `_id` needs fielddata, off by default).
    async fn scan_keys(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyReadError> {
        let index = self.index(table)?;
        let err =
            |e: String| VerifyReadError::Target(format!("elasticsearch scan of {index}: {e}"));
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

    async fn positions(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, VerifyReadError> {
        committed_offsets(&self.runner, partitions).await
    }
}

/// The sink's document id of a key's values ("" for a null key, which the
/// sink never writes).
fn document_id(key: &[Value]) -> String {
    let values: Vec<&Value> = key.iter().collect();
    document_id_of(&values).unwrap_or_default()
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
