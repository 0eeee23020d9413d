//! Avro keys and values (`key.converter` / `value.converter = "avro"`):
//! the JSON converter's records, as the envelope writes them, turned into
//! Confluent's wire format just before the producer sends them (see
//! `oncely_core::avro` for the mapping).
//!
//! The schema is registered (idempotently, once per schema and process)
//! before the record that names its id is sent, so within the Kafka
//! transaction that carries the record: a kill between the two aborts the
//! transaction, and the replay registers the same schema and gets the same
//! id. Offset records and the schema-change topic stay JSON (capture reads
//! them back itself), as does a record without a schema (a tombstone's
//! missing value, an outbox payload).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use oncely_core::avro::registry::{Naming, RegistryClient};
use oncely_core::avro::{wire, AvroError, NameAdjustment, SharedCodec};
use oncely_core::backoff::{retry, Backoff, RetryOutcome};
use prometheus::IntCounter;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::{CaptureConfig, Converter};
use crate::envelope::Heads;
use crate::error::CaptureError;

/// How long a record waits for an unreachable registry before the
/// transaction fails (retriable: capture restarts from the committed
/// offset and waits again, without bound); below the default transaction
/// timeout (60 s), which an open transaction must not outlive.
const REGISTRY_WAIT: Duration = Duration::from_secs(30);

/// Converts records to Avro for the producer.
pub(crate) struct AvroWriter {
    registry: RegistryClient,
    key: bool,
    value: bool,
    /// Topics whose records stay JSON.
    json_topics: Vec<String>,
    /// Capture's shutdown: a wait for the registry ends with it.
    stop: CancellationToken,
    /// `oncely_capture_schema_registry_retries_total`.
    retries: IntCounter,
    /// Per topic, the schema its keys (`[1]`) and values (`[0]`) were last
    /// converted with: a record that starts with the same schema is
    /// encoded without parsing, hashing or registering it again.
    known: Mutex<HashMap<String, [Option<Arc<Known>>; 2]>>,
}

/// A schema of a topic's keys or values, registered, and how the envelope
/// writes it at the start of each record.
pub(crate) struct Known {
    /// `{"schema":<Connect schema>,"payload":`: the wrapper around the
    /// payload (a `}` closes it), byte for byte as the envelope writes it.
    head: Arc<[u8]>,
    id: u32,
    codec: SharedCodec,
}

/// What the writer is handed besides the configuration.
pub(crate) struct WriterContext {
    /// Topics whose records stay JSON.
    pub(crate) json_topics: Vec<String>,
    pub(crate) stop: CancellationToken,
    pub(crate) retries: IntCounter,
}

/// A key's or value's bytes to send instead of the envelope's, when converted.
pub(crate) type Converted = (Option<Vec<u8>>, Option<Vec<u8>>);

impl AvroWriter {
    /// The writer `cfg` asks for, if any.
    pub(crate) fn new(
        cfg: &CaptureConfig,
        cx: WriterContext,
    ) -> Result<Option<Self>, CaptureError> {
        let key = cfg.key_converter == Converter::Avro;
        let value = cfg.value_converter == Converter::Avro;
        let Some(access) = cfg.registry_access()?.filter(|_| key || value) else {
            return Ok(None);
        };
        let naming = Naming {
            key_strategy: cfg.key_subject_name_strategy,
            value_strategy: cfg.value_subject_name_strategy,
            names: NameAdjustment {
                schema: cfg.schema_name_adjustment_mode,
                field: cfg.field_name_adjustment_mode,
            },
        };
        Ok(Some(Self {
            registry: RegistryClient::connect(&access)?.with_naming(naming),
            key,
            value,
            json_topics: cx.json_topics,
            stop: cx.stop,
            retries: cx.retries,
            known: Mutex::default(),
        }))
    }

    /// The Avro key and value of a record to `topic`, where they are
    /// converted (`None`: send the envelope's bytes as they are).
    #[cfg(test)]
    pub(crate) async fn convert(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<Converted, CaptureError> {
        self.convert_apart(topic, key, value, &Heads::default())
            .await
    }

    /// [`AvroWriter::convert`] of a key and value the envelope may have
    /// written apart from their schema `heads` (the payload alone).
    pub(crate) async fn convert_apart(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        heads: &Heads,
    ) -> Result<Converted, CaptureError> {
        if self.json_topics.iter().any(|t| t == topic) {
            return Ok((None, None));
        }
        let key = match key.filter(|_| self.key) {
            Some(k) => self.part(topic, k, heads.key.as_ref(), true).await?,
            None => None,
        };
        let value = match value.filter(|_| self.value) {
            Some(v) => self.part(topic, v, heads.value.as_ref(), false).await?,
            None => None,
        };
        Ok((key, value))
    }

    /// The Avro of one part: `bytes` whole, or its payload alone when
    /// written apart from `head`.
    async fn part(
        &self,
        topic: &str,
        bytes: &[u8],
        head: Option<&Arc<[u8]>>,
        is_key: bool,
    ) -> Result<Option<Vec<u8>>, CaptureError> {
        let known = self.known(topic, is_key);
        let payload = match head {
            // The encoder's own head, or one of the same bytes (another
            // encoder of the same shape).
            Some(head) => known
                .filter(|k| Arc::ptr_eq(&k.head, head) || k.head[..] == head[..])
                .map(|k| (k, bytes)),
            // Anything after the payload but the closing brace: parsed whole below.
            None => known
                .filter(|k| bytes.starts_with(&k.head[..]))
                .and_then(|k| {
                    let payload = bytes[k.head.len()..].strip_suffix(b"}")?;
                    Some((k, payload))
                }),
        };
        if let Some((known, payload)) = payload {
            let mut out = Vec::with_capacity(payload.len() / 2 + 16);
            out.extend_from_slice(&wire::header(known.id));
            if let Some(written) = known.codec.encode_text_into(payload, &mut out) {
                written.map_err(|e| misfit(topic, is_key, e))?;
                return Ok(Some(out));
            }
        }
        let whole = match head {
            Some(head) => std::borrow::Cow::Owned(Heads::whole(head, bytes)),
            None => std::borrow::Cow::Borrowed(bytes),
        };
        self.parsed(topic, &whole, head, is_key).await
    }

    /// The Avro of a whole part, parsed: its schema registered and
    /// remembered (by `head` itself when it was written apart from it).
    async fn parsed(
        &self,
        topic: &str,
        bytes: &[u8],
        head: Option<&Arc<[u8]>>,
        is_key: bool,
    ) -> Result<Option<Vec<u8>>, CaptureError> {
        let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(bytes) else {
            return Ok(None);
        };
        let (Some(schema), Some(payload)) = (doc.remove("schema"), doc.remove("payload")) else {
            return Ok(None);
        };
        if schema.is_null() || !doc.is_empty() {
            return Ok(None);
        }
        let (id, codec) = self.register(topic, is_key, &schema).await?;
        let framed = encode(topic, is_key, id, &codec, &payload)?;
        let mut known = Known::new(&schema, id, codec);
        if let Some(head) = head.filter(|h| h[..] == known.head[..]) {
            known.head = Arc::clone(head);
        }
        self.remember(topic, is_key, known, bytes);
        Ok(Some(framed))
    }

    fn known(&self, topic: &str, is_key: bool) -> Option<Arc<Known>> {
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.get(topic)?[usize::from(is_key)].clone()
    }

    /// Keeps `known` as the schema of `topic`'s keys or values (replacing
    /// the one before a DDL: records of an older shape are parsed again)
    /// when `record` starts with it. Only a schema written as the envelope
    /// writes it is known by its bytes; another writer's records keep
    /// taking the parsing path.
    pub(crate) fn remember(&self, topic: &str, is_key: bool, known: Known, record: &[u8]) -> bool {
        if !record.starts_with(&known.head[..]) {
            return false;
        }
        let mut all = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        all.entry(topic.to_owned()).or_default()[usize::from(is_key)] = Some(Arc::new(known));
        true
    }

    /// Registers `schema` of `topic`'s keys or values, waiting up to [`REGISTRY_WAIT`]
    /// while the registry is unreachable, and no longer once capture is
    /// told to stop (the open transaction is then aborted, never committed
    /// without the record).
    async fn register(
        &self,
        topic: &str,
        is_key: bool,
        schema: &Value,
    ) -> Result<(u32, oncely_core::avro::SharedCodec), AvroError> {
        let deadline = Instant::now() + REGISTRY_WAIT;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let outcome = retry(
            &mut backoff,
            &self.stop,
            // A request in flight (up to the client's timeout) is cut
            // short at shutdown too.
            || async {
                tokio::select! {
                    got = self.registry.register_for(topic, is_key, schema) => got,
                    () = self.stop.cancelled() => Err(AvroError::Unavailable {
                        url: self.registry.shown_url().to_owned(),
                        message: "capture is stopping".into(),
                    }),
                }
            },
            |e: &AvroError| e.is_retriable() && Instant::now() < deadline,
            |e, delay| {
                self.retries.inc();
                tracing::warn!("{e}; registering the schema of {topic} again in {delay:?}");
            },
        )
        .await;
        outcome.map_err(|(RetryOutcome::Failed(e) | RetryOutcome::Cancelled(e))| e)
    }
}

impl Known {
    /// `schema` (a record's, as parsed), registered as `id`.
    pub(crate) fn new(schema: &Value, id: u32, codec: SharedCodec) -> Self {
        Known {
            head: format!("{{\"schema\":{schema},\"payload\":")
                .into_bytes()
                .into(),
            id,
            codec,
        }
    }
}

#[cfg(test)]
impl AvroWriter {
    /// Capture stopping: a wait for the registry ends at once.
    pub(crate) fn stop_now(&self) {
        self.stop.cancel();
    }
}

/// A payload framed as Confluent's wire format with schema `id`.
fn encode(
    topic: &str,
    is_key: bool,
    id: u32,
    codec: &SharedCodec,
    payload: &Value,
) -> Result<Vec<u8>, CaptureError> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&wire::header(id));
    codec
        .encode_into(payload, &mut out)
        .map_err(|e| misfit(topic, is_key, e))?;
    Ok(out)
}

/// A key or value that does not fit its schema: the record's own failure.
fn misfit(topic: &str, is_key: bool, e: AvroError) -> CaptureError {
    AvroError::Value(format!(
        "the {} of a record to {topic} does not fit its Avro schema: {e}",
        if is_key { "key" } else { "value" }
    ))
    .into()
}

/// A writer whose registry nothing answers: its records never reach it.
#[cfg(test)]
pub(crate) fn unreachable_writer(key: bool, value: bool) -> AvroWriter {
    AvroWriter {
        registry: RegistryClient::new("http://127.0.0.1:9").unwrap(),
        key,
        value,
        json_topics: vec!["oncely-offsets-shop".into()],
        stop: CancellationToken::new(),
        retries: IntCounter::new("retries", "retries").unwrap(),
        known: Mutex::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(key: bool, value: bool) -> AvroWriter {
        unreachable_writer(key, value)
    }

    /// A registry that stays unreachable holds a record for up to
    /// [`REGISTRY_WAIT`], counting its retries, but capture's shutdown ends
    /// the wait at once (with the retriable error: the transaction is
    /// aborted, nothing of it committed).
    #[tokio::test]
    async fn a_wait_for_the_registry_ends_at_shutdown_and_counts_its_retries() {
        let w = writer(true, true);
        let wrapped = br#"{"schema":{"type":"int32","optional":false},"payload":1}"#;
        let stop = w.stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            stop.cancel();
        });
        let started = Instant::now();
        let out = tokio::time::timeout(
            Duration::from_secs(5),
            w.convert("shop.public.t", Some(wrapped), None),
        )
        .await
        .expect("the wait ends at shutdown, not after REGISTRY_WAIT");
        let e = out.unwrap_err();
        assert!(e.is_retriable(), "{e:?}");
        assert!(started.elapsed() >= Duration::from_millis(600));
        assert!(w.retries.get() >= 2, "{}", w.retries.get());
    }

    #[tokio::test]
    async fn what_has_no_schema_or_stays_json_is_sent_as_it_is() {
        let w = writer(true, true);
        let wrapped = br#"{"schema":{"type":"int32","optional":false},"payload":1}"#;
        // Offset records stay JSON.
        let out = w
            .convert("oncely-offsets-shop", Some(wrapped), Some(wrapped))
            .await;
        assert_eq!(out.unwrap(), (None, None));
        // Schemaless payloads, a null schema, a tombstone's missing value.
        for bytes in [
            &br#"{"id":1}"#[..],
            br#"{"schema":null,"payload":{"id":1}}"#,
            b"not json",
        ] {
            let out = w.convert("shop.public.t", Some(bytes), None).await;
            assert_eq!(out.unwrap(), (None, None));
        }
        // Neither part converted when neither converter is avro.
        let neither = writer(false, false);
        let out = neither
            .convert("shop.public.t", Some(wrapped), Some(wrapped))
            .await;
        assert_eq!(out.unwrap(), (None, None));
    }
}
