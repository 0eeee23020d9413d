//! A client of a schema registry's Confluent-compatible API (Confluent
//! Schema Registry, Apicurio's `/apis/ccompat/v7`): registering a schema
//! under a subject and reading a schema by id, both cached (bounded).
//!
//! Registering is idempotent (the registry answers the existing id for a
//! schema it holds), so capture registers before the Kafka transaction that
//! uses an id and a kill in between costs nothing. Failures are told apart
//! by kind ([`AvroError::is_retriable`]): an unreachable registry or a
//! server error is retried by the caller, an id the registry does not know
//! is the record's own failure (a dead letter naming the id).

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;
use serde_json::{json, Value};

use super::{AvroCodec, AvroError, SharedCodec};

/// How many schemas each cache keeps.
pub const CACHE_CAPACITY: u64 = 10_000;
/// How long one request to the registry may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// Confluent's error code of a schema id the registry does not hold.
const SCHEMA_NOT_FOUND: i64 = 40403;

/// The subject of a topic's keys or values under Confluent's
/// `TopicNameStrategy`: `<topic>-key`, `<topic>-value`.
pub fn topic_subject(topic: &str, is_key: bool) -> String {
    format!("{topic}-{}", if is_key { "key" } else { "value" })
}

/// A schema registry client; clones share the connection pool and caches.
#[derive(Clone)]
pub struct RegistryClient {
    url: Arc<str>,
    http: reqwest::Client,
    /// `(subject, Connect schema text)` -> id and codec: capture's side.
    registered: Cache<(String, String), (u32, SharedCodec)>,
    /// id -> codec: the readers' side.
    by_id: Cache<u32, SharedCodec>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.url)
            .finish()
    }
}

impl RegistryClient {
    /// A client of the registry at `url` (e.g. `http://host:8081` or
    /// Apicurio's `http://host:8080/apis/ccompat/v7`).
    pub fn new(url: &str) -> Result<Self, AvroError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| AvroError::Schema(format!("schema registry client: {e}")))?;
        Ok(Self {
            url: url.trim_end_matches('/').into(),
            http,
            registered: Cache::new(CACHE_CAPACITY),
            by_id: Cache::new(CACHE_CAPACITY),
        })
    }

    /// The registry's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Registers the Avro form of Connect schema `connect` under `subject`
    /// (once per client; the registry keeps one id per schema), returning
    /// its id and codec.
    pub async fn register(
        &self,
        subject: &str,
        connect: &Value,
    ) -> Result<(u32, SharedCodec), AvroError> {
        let key = (subject.to_owned(), connect.to_string());
        if let Some(hit) = self.registered.get(&key).await {
            return Ok(hit);
        }
        let codec = Arc::new(AvroCodec::from_connect(connect)?);
        let url = format!("{}/subjects/{}/versions", self.url, encode_path(subject));
        let body = json!({ "schema": codec.avro_schema() });
        let answer = self.call(self.http.post(&url).json(&body), subject).await?;
        let id = answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| self.unavailable(format!("no schema id in its answer {answer}")))?;
        self.by_id.insert(id, Arc::clone(&codec)).await;
        self.registered.insert(key, (id, Arc::clone(&codec))).await;
        Ok((id, codec))
    }

    /// The codec of schema `id`.
    pub async fn schema(&self, id: u32) -> Result<SharedCodec, AvroError> {
        if let Some(hit) = self.by_id.get(&id).await {
            return Ok(hit);
        }
        let url = format!("{}/schemas/ids/{id}", self.url);
        let answer = match self
            .call(self.http.get(&url), &format!("schema id {id}"))
            .await
        {
            Err(AvroError::Refused {
                status: 404,
                message,
                ..
            }) if message.contains(&SCHEMA_NOT_FOUND.to_string()) || message.is_empty() => {
                return Err(AvroError::UnknownId {
                    id,
                    url: self.url.to_string(),
                })
            }
            other => other?,
        };
        let text = answer["schema"]
            .as_str()
            .ok_or_else(|| self.unavailable(format!("no schema in its answer {answer}")))?;
        if answer["schemaType"].as_str().is_some_and(|t| t != "AVRO") {
            return Err(AvroError::Schema(format!(
                "schema id {id} is a {} schema, not Avro",
                answer["schemaType"]
            )));
        }
        let codec = Arc::new(AvroCodec::from_avro(text)?);
        self.by_id.insert(id, Arc::clone(&codec)).await;
        Ok(codec)
    }

    fn unavailable(&self, message: String) -> AvroError {
        AvroError::Unavailable {
            url: self.url.to_string(),
            message,
        }
    }

    /// Sends a request; a transport failure or a 5xx is [`AvroError::Unavailable`],
    /// another non-2xx [`AvroError::Refused`] with the registry's message.
    async fn call(&self, req: reqwest::RequestBuilder, what: &str) -> Result<Value, AvroError> {
        let resp = req
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| self.unavailable(error_chain(&e)))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| self.unavailable(error_chain(&e)))?;
        if status.is_server_error() {
            return Err(self.unavailable(format!("HTTP {status}: {text}")));
        }
        if !status.is_success() {
            return Err(AvroError::Refused {
                url: self.url.to_string(),
                what: what.to_owned(),
                status: status.as_u16(),
                message: text,
            });
        }
        serde_json::from_str(&text)
            .map_err(|e| self.unavailable(format!("an answer that is not JSON ({e}): {text}")))
    }
}

/// The error and its sources, for a message that says why (a refused
/// connection, a timeout).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A subject as one URL path segment.
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
