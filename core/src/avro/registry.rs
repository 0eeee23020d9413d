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

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;
use serde_json::{json, Value};

use super::{AvroCodec, AvroError, NameAdjustment, SharedCodec};
use crate::secret::Secret;

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

/// Confluent's subject name strategies (`key.subject.name.strategy`,
/// `value.subject.name.strategy`), by their class's short or full name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SubjectStrategy {
    /// `<topic>-key`, `<topic>-value`.
    #[default]
    TopicName,
    /// The record's Avro full name (one subject per record type, whatever
    /// the topic).
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

const STRATEGY_PACKAGE: &str = "io.confluent.kafka.serializers.subject.";

impl FromStr for SubjectStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix(STRATEGY_PACKAGE).unwrap_or(s) {
            "TopicNameStrategy" => Ok(Self::TopicName),
            "RecordNameStrategy" => Ok(Self::RecordName),
            "TopicRecordNameStrategy" => Ok(Self::TopicRecordName),
            _ => Err(format!("`{s}` is not one of TopicNameStrategy, RecordNameStrategy, TopicRecordNameStrategy (short, or with {STRATEGY_PACKAGE})")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for SubjectStrategy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl SubjectStrategy {
    /// The subject of the key or value of `topic` whose Avro schema is a
    /// record named `record` (`None`: not a record).
    pub fn subject(
        self,
        topic: &str,
        is_key: bool,
        record: Option<&str>,
    ) -> Result<String, AvroError> {
        let record = || {
            record.ok_or_else(|| {
                AvroError::Schema(format!(
                    "{self:?}Strategy names subjects after a record, and the {} schema of {topic} is not one",
                    if is_key { "key" } else { "value" }
                ))
            })
        };
        Ok(match self {
            Self::TopicName => topic_subject(topic, is_key),
            Self::RecordName => record()?.to_owned(),
            Self::TopicRecordName => format!("{topic}-{}", record()?),
        })
    }
}

/// How capture names what it registers: subjects and Avro names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Naming {
    pub key_strategy: SubjectStrategy,
    pub value_strategy: SubjectStrategy,
    pub names: NameAdjustment,
}

/// Where the registry is and how to reach it.
#[derive(Clone, Default)]
pub struct RegistryAccess {
    /// `schema.registry.url`.
    pub url: String,
    /// `schema.registry.basic.auth.user.info`, `user:password`: HTTP basic
    /// authentication (with `basic.auth.credentials.source = "USER_INFO"`).
    pub user_info: Option<Secret>,
    /// `schema.registry.ssl.ca.location`: PEM CA certificates an `https`
    /// registry's certificate must chain to (with its host name checked).
    pub ca_file: Option<PathBuf>,
}

/// The value of `basic.auth.credentials.source` that sends
/// `schema.registry.basic.auth.user.info`.
pub const USER_INFO_SOURCE: &str = "USER_INFO";

impl RegistryAccess {
    /// The access the registry keys of a configuration describe, checked:
    /// an http(s) URL, user info only with `basic.auth.credentials.source
    /// = "USER_INFO"` (Confluent's clients ignore it otherwise, silently),
    /// and a CA file only for `https`.
    pub fn from_settings(
        url: &str,
        user_info: Option<&Secret>,
        source: Option<&str>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, crate::ConfigError> {
        use crate::ConfigError;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError::new(
                "schema.registry.url",
                format!("{url:?} is not an http(s) URL"),
            ));
        }
        match (source, user_info) {
            (Some(USER_INFO_SOURCE), Some(info)) if !info.expose().contains(':') => {
                return Err(ConfigError::new(
                    "schema.registry.basic.auth.user.info",
                    "is not `user:password`",
                ))
            }
            (Some(USER_INFO_SOURCE), Some(_)) | (None, None) => {}
            (Some(USER_INFO_SOURCE), None) => {
                return Err(ConfigError::new(
                    "schema.registry.basic.auth.user.info",
                    "basic.auth.credentials.source = \"USER_INFO\" needs `user:password` here",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "basic.auth.credentials.source",
                    "set it to \"USER_INFO\" to send schema.registry.basic.auth.user.info",
                ))
            }
            (Some(other), _) => {
                return Err(ConfigError::new(
                    "basic.auth.credentials.source",
                    format!("{other:?}: only \"USER_INFO\" is supported"),
                ))
            }
        }
        if ca_file.is_some() && !url.starts_with("https://") {
            return Err(ConfigError::new(
                "schema.registry.ssl.ca.location",
                "is for an https:// schema.registry.url",
            ));
        }
        Ok(Self {
            url: url.to_owned(),
            user_info: user_info.cloned(),
            ca_file: ca_file.map(Into::into),
        })
    }
}

/// A schema registry client; clones share the connection pool and caches.
#[derive(Clone)]
pub struct RegistryClient {
    url: Arc<str>,
    /// `url` as errors and logs show it (a password in it masked).
    shown: Arc<str>,
    http: reqwest::Client,
    /// User and password of basic authentication.
    auth: Option<Arc<(String, Secret)>>,
    naming: Naming,
    /// `(topic, is_key, Connect schema text)` -> id and codec (what
    /// [`RegistryClient::register_for`] registered).
    by_topic: Cache<(String, bool, String), (u32, SharedCodec)>,
    /// `(subject, Connect schema text)` -> id and codec: capture's side.
    registered: Cache<(String, String), (u32, SharedCodec)>,
    /// id -> codec: the readers' side.
    by_id: Cache<u32, SharedCodec>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.shown)
            .finish()
    }
}

impl RegistryClient {
    /// A client of the registry at `url` (e.g. `http://host:8081` or
    /// Apicurio's `http://host:8080/apis/ccompat/v7`).
    pub fn new(url: &str) -> Result<Self, AvroError> {
        Self::connect(&RegistryAccess {
            url: url.to_owned(),
            ..RegistryAccess::default()
        })
    }

    /// A client of the registry `access` describes (its CA file is read now).
    pub fn connect(access: &RegistryAccess) -> Result<Self, AvroError> {
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some(path) = &access.ca_file {
            let tls = crate::tls::client_config(crate::tls::Verify::Full, Some(path), None)
                .map_err(|e| {
                    AvroError::Schema(format!(
                        "schema.registry.ssl.ca.location {}: {e}",
                        path.display()
                    ))
                })?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| AvroError::Schema(format!("schema registry client: {e}")))?;
        let auth = match &access.user_info {
            None => None,
            Some(info) => {
                let (user, password) = info.expose().split_once(':').ok_or_else(|| {
                    AvroError::Schema(
                        "schema.registry.basic.auth.user.info is not `user:password`".into(),
                    )
                })?;
                Some(Arc::new((user.to_owned(), Secret::new(password))))
            }
        };
        Ok(Self {
            url: access.url.trim_end_matches('/').into(),
            shown: crate::secret::redact_url(access.url.trim_end_matches('/')).into(),
            http,
            auth,
            naming: Naming::default(),
            by_topic: Cache::new(CACHE_CAPACITY),
            registered: Cache::new(CACHE_CAPACITY),
            by_id: Cache::new(CACHE_CAPACITY),
        })
    }

    /// The registry's URL as errors show it (a password in it masked).
    pub fn shown_url(&self) -> &str {
        &self.shown
    }

    /// This client, naming subjects and Avro names as `naming` says (for
    /// [`RegistryClient::register_for`]).
    pub fn with_naming(mut self, naming: Naming) -> Self {
        self.naming = naming;
        self
    }

    /// Registers the Avro form of Connect schema `connect` of the keys or
    /// values of `topic` under the subject the client's strategy names,
    /// names adjusted as it says (once per client).
    pub async fn register_for(
        &self,
        topic: &str,
        is_key: bool,
        connect: &Value,
    ) -> Result<(u32, SharedCodec), AvroError> {
        let key = (topic.to_owned(), is_key, connect.to_string());
        if let Some(hit) = self.by_topic.get(&key).await {
            return Ok(hit);
        }
        let codec = Arc::new(AvroCodec::from_connect_adjusted(
            connect,
            self.naming.names,
        )?);
        let strategy = if is_key {
            self.naming.key_strategy
        } else {
            self.naming.value_strategy
        };
        let subject = strategy.subject(topic, is_key, codec.record_name().as_deref())?;
        let got = self.post_schema(&subject, codec).await?;
        self.by_topic.insert(key, got.clone()).await;
        Ok(got)
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
        let got = self.post_schema(subject, codec).await?;
        self.registered.insert(key, got.clone()).await;
        Ok(got)
    }

    /// Registers `codec`'s Avro schema under `subject`.
    async fn post_schema(
        &self,
        subject: &str,
        codec: SharedCodec,
    ) -> Result<(u32, SharedCodec), AvroError> {
        let url = format!("{}/subjects/{}/versions", self.url, encode_path(subject));
        let body = json!({ "schema": codec.avro_schema() });
        let answer = self.call(self.http.post(&url).json(&body), subject).await?;
        let id = answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| self.unavailable(format!("no schema id in its answer {answer}")))?;
        self.by_id.insert(id, Arc::clone(&codec)).await;
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
                    url: self.shown.to_string(),
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
            url: self.shown.to_string(),
            message,
        }
    }

    /// Sends a request; a transport failure or a 5xx is [`AvroError::Unavailable`],
    /// another non-2xx [`AvroError::Refused`] with the registry's message.
    async fn call(&self, req: reqwest::RequestBuilder, what: &str) -> Result<Value, AvroError> {
        let req = match &self.auth {
            Some(auth) => req.basic_auth(&auth.0, Some(auth.1.expose())),
            None => req,
        };
        let resp = req
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| match crate::tls::refused_certificate(&e) {
                Some(reason) => AvroError::Certificate {
                    url: self.shown.to_string(),
                    reason,
                },
                None => self.unavailable(error_chain(&e)),
            })?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| self.unavailable(error_chain(&e)))?;
        if status.is_server_error() {
            return Err(self.unavailable(format!("HTTP {status}: {text}")));
        }
        if !status.is_success() {
            let message = match status.as_u16() {
                401 | 403 => format!("{text} (check schema.registry.basic.auth.user.info)"),
                _ => text,
            };
            return Err(AvroError::Refused {
                url: self.shown.to_string(),
                what: what.to_owned(),
                status: status.as_u16(),
                message,
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
