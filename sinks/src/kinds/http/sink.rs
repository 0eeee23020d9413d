//! The webhook sink: lanes by key, requests with retries, and the answers classified.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::config::HttpConfig;
use super::error::HttpError;
use crate::error::{RecordFailure, SinkError};
use crate::kinds::json::record_json;
use crate::runner::dedup::event_identity;
use crate::sink::{Batch, Record, Sink};
use oncely_core::backoff::{retry_hinted, Backoff, RetryOutcome};

/// The request header carrying the event's identity (its source position).
pub const HEADER_IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// POSTs each change (or `batch.size` of them) as JSON to a URL (see the module docs).
pub struct HttpSink {
    client: reqwest::Client,
    url: reqwest::Url,
    /// `url` as errors and logs show it (no path or query: they may hold the secret).
    shown: String,
    auth: Option<(HeaderName, HeaderValue)>,
    permits: Arc<Semaphore>,
    config: HttpConfig,
    /// Never cancelled: a request's retries end by `retry.max.attempts`.
    never: CancellationToken,
}

impl HttpSink {
    /// A client for `config`: TLS (with `tls.ca.file`), timeout, the auth header.
    pub fn connect(config: &HttpConfig) -> Result<Self, SinkError> {
        let url = reqwest::Url::parse(config.url.expose().trim())
            .map_err(|e| SinkError::fatal_from("sink.url", e))?;
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(path) = &config.tls_ca_file {
            let tls =
                oncely_core::tls::client_config(oncely_core::tls::Verify::Full, Some(path), None)
                    .map_err(|e| {
                    SinkError::fatal_from(format!("sink.tls.ca.file {}", path.display()), e)
                })?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let client = builder
            .build()
            .map_err(|e| SinkError::fatal_from("webhook client", e))?;
        let auth = match &config.auth_value {
            None => None,
            Some(secret) => {
                let mut value = HeaderValue::from_str(secret.expose())
                    .map_err(|_| SinkError::fatal("sink.auth.value: not a valid header value"))?;
                value.set_sensitive(true);
                let name = HeaderName::from_bytes(config.auth_header.as_bytes())
                    .map_err(|e| SinkError::fatal_from("sink.auth.header", e))?;
                Some((name, value))
            }
        };
        Ok(Self {
            client,
            url,
            shown: config.url.redacted(),
            auth,
            permits: Arc::new(Semaphore::new(config.max_concurrency)),
            config: config.clone(),
            never: CancellationToken::new(),
        })
    }

    /// The batch's change events split into lanes by key: one key is always in
    /// the same lane, in offset order, so its changes arrive in order.
    fn lanes<'b>(&self, batch: &'b Batch) -> Vec<Vec<&'b Record>> {
        let events: Vec<&Record> = batch
            .records()
            .iter()
            .filter(|r| r.event().is_some())
            .collect();
        let n = self.config.max_concurrency.min(events.len()).max(1);
        let mut lanes = vec![Vec::new(); n];
        for r in events {
            let mut h = DefaultHasher::new();
            r.raw_key().hash(&mut h);
            let lane = usize::try_from(h.finish() % n as u64).unwrap_or(0);
            lanes[lane].push(r);
        }
        lanes.retain(|l| !l.is_empty());
        lanes
    }

    /// Sends a lane's changes in order; rejected ones are collected, anything else stops the lane.
    async fn send_lane(
        &self,
        batch: &Batch,
        lane: &[&Record],
    ) -> Result<Vec<RecordFailure>, SinkError> {
        let mut failures = Vec::new();
        for chunk in lane.chunks(self.config.batch_size) {
            let offsets: Vec<i64> = chunk.iter().map(|r| r.offset).collect();
            match self.send_with_retries(batch, chunk).await {
                Ok(()) => {}
                Err(e @ HttpError::Rejected { .. }) => {
                    if let Some(f) = e.into_sink_error(&offsets).rejected() {
                        failures.extend_from_slice(f);
                    }
                }
                Err(e) => return Err(e.into_sink_error(&offsets)),
            }
        }
        Ok(failures)
    }

    /// One request, retried on transient failures (honouring `Retry-After`) up to `retry.max.attempts`.
    async fn send_with_retries(&self, batch: &Batch, chunk: &[&Record]) -> Result<(), HttpError> {
        let (key, body) = request_body(batch, chunk, self.config.batch_size > 1);
        let body = serde_json::to_vec(&body).map_err(|e| HttpError::Fatal {
            what: "cannot encode a change as JSON".into(),
            source: Some(Box::new(e)),
        })?;
        let c = &self.config;
        let mut backoff = Backoff::new(
            Duration::from_millis(c.retry_backoff_ms),
            Duration::from_millis(c.retry_backoff_max_ms),
        );
        let attempts = AtomicU32::new(0);
        let outcome = retry_hinted(
            &mut backoff,
            &self.never,
            || {
                attempts.fetch_add(1, Ordering::Relaxed);
                self.send_once(&key, body.clone())
            },
            (
                |e: &HttpError| {
                    e.is_retriable() && attempts.load(Ordering::Relaxed) < c.retry_max_attempts
                },
                HttpError::retry_after,
            ),
            |e, delay| tracing::debug!(topic = batch.topic(), key, "{e}; again in {delay:?}"),
        )
        .await;
        outcome.map_err(|o| match o {
            RetryOutcome::Failed(e) | RetryOutcome::Cancelled(e) => e,
        })
    }

    async fn send_once(&self, key: &str, body: Vec<u8>) -> Result<(), HttpError> {
        let _permit = self.permits.acquire().await.map_err(|e| HttpError::Fatal {
            what: "webhook concurrency limit closed".into(),
            source: Some(Box::new(e)),
        })?;
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(HEADER_IDEMPOTENCY_KEY, key)
            .body(body);
        if let Some((name, value)) = &self.auth {
            request = request.header(name.clone(), value.clone());
        }
        let response = request
            .send()
            .await
            .map_err(|e| HttpError::from_client(e, &self.shown))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_default();
        Err(HttpError::from_status(
            status,
            &headers,
            &body,
            self.config.retry_after_max(),
        ))
    }
}

/// The `Idempotency-Key` and JSON body of a request: one change as an object,
/// or (`array`) the changes as an array, each with its `idempotency_key`. A
/// request of several changes is keyed `<first>..<last>`.
fn request_body(batch: &Batch, chunk: &[&Record], array: bool) -> (String, Value) {
    let mut keys = Vec::with_capacity(chunk.len());
    let mut events = Vec::with_capacity(chunk.len());
    for r in chunk {
        let key = event_identity(batch.topic(), r, None).unwrap_or_default();
        let mut v = record_json(batch, r, true);
        if let Some(obj) = v.as_object_mut() {
            obj.insert("idempotency_key".into(), Value::String(key.clone()));
        }
        keys.push(key);
        events.push(v);
    }
    let key = match keys.as_slice() {
        [one] => one.clone(),
        [first, .., last] => format!("{first}..{last}"),
        [] => String::new(),
    };
    if array {
        (key, Value::Array(events))
    } else {
        (key, events.pop().unwrap_or(Value::Null))
    }
}

#[async_trait]
impl Sink for HttpSink {
    fn name(&self) -> &str {
        "http"
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let lanes = self.lanes(batch);
        let results = join_all(lanes.iter().map(|lane| self.send_lane(batch, lane))).await;
        let mut failures = Vec::new();
        let mut transient = None;
        for result in results {
            match result {
                Ok(f) => failures.extend(f),
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => transient = transient.or(Some(e)),
            }
        }
        if let Some(e) = transient {
            return Err(e);
        }
        if failures.is_empty() {
            Ok(())
        } else {
            failures.sort_by_key(|f| f.offset);
            Err(SinkError::Rejected(failures))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::decode_value;
    use serde_json::json;

    fn record(offset: i64, lsn: u64) -> Record {
        let value = json!({
            "before": null, "after": {"id": offset}, "op": "c",
            "source": {"commit_lsn": lsn, "event_seq": 2, "schema": "public", "table": "t"},
        })
        .to_string();
        let payload = decode_value(Some(value.as_bytes())).expect("decode");
        Record::new(offset, Some(json!({"id": offset})), payload)
    }

    /// A Slack-style webhook carries its secret in the path: neither the
    /// configuration's `Debug` nor a failed request's error (as the runner
    /// logs it, with its sources) shows it.
    #[tokio::test]
    async fn the_secret_in_the_webhook_path_is_never_shown() {
        let text = "bootstrap.servers = \"k:9092\"\ngroup.id = \"g\"\ntopics = [\"t\"]\n\
                    [sink]\nkind = \"http\"\n\
                    url = \"http://127.0.0.1:1/services/T000/B000/SECRETXYZ?token=SECRETXYZ\"\n\
                    retry.max.attempts = 1\n";
        let config = match crate::kinds::parse_config(text) {
            Ok((_, crate::kinds::SinkConfig::Http(c))) => c,
            other => panic!("not an http config: {:?}", other.err()),
        };
        let sink = HttpSink::connect(&config).expect("client");
        let batch = Batch::new(
            Arc::from("g"),
            (Arc::from("topic"), 0),
            vec![record(4, 100)],
            5,
        );
        let e = sink
            .apply(&batch)
            .await
            .expect_err("nothing listens on port 1");
        let mut told = format!("{e:#} | {e:?}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            told.push_str(&format!(" | {s} | {s:?}"));
            source = s.source();
        }
        let shown = [
            ("Debug of the config", format!("{config:?}")),
            ("the error", told),
        ];
        let leaks: Vec<_> = shown
            .iter()
            .filter(|(_, t)| t.contains("SECRETXYZ"))
            .collect();
        assert!(leaks.is_empty(), "the secret is shown: {leaks:#?}");
        assert!(
            shown[1].1.contains("127.0.0.1:1"),
            "still says where: {}",
            shown[1].1
        );
    }

    #[test]
    fn one_change_is_an_object_several_an_array_each_keyed() {
        let records = vec![record(4, 100), record(5, 101)];
        let batch = Batch::new(Arc::from("g"), (Arc::from("topic"), 0), records, 6);
        let refs: Vec<&Record> = batch.records().iter().collect();
        let (key, body) = request_body(&batch, &refs[..1], false);
        assert_eq!(key, "topic/100/2");
        assert_eq!(body["idempotency_key"], "topic/100/2");
        assert_eq!(body["after"]["id"], 4);
        assert_eq!(body["op"], "c");
        let (key, body) = request_body(&batch, &refs, true);
        assert_eq!(key, "topic/100/2..topic/101/2");
        let keys: Vec<&Value> = body
            .as_array()
            .expect("array")
            .iter()
            .map(|e| &e["idempotency_key"])
            .collect();
        assert_eq!(keys, [&json!("topic/100/2"), &json!("topic/101/2")]);
    }
}
