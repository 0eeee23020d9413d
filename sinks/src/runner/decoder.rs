//! A worker's collecting and decoding stage (see [`super::worker`]): the
//! next batch is collected and its envelopes decoded and prepared on a
//! blocking thread while the applier writes the previous one.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_core::avro::{wire, AvroError, SharedCodec};
use oncely_core::backoff::{retry, Backoff, RetryOutcome};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use crate::event::{decode_key, decode_value, DecodeError, Payload, TombstoneOrigin};
use crate::sink::{Batch, Record, TopicPartition};

/// A record read from Kafka, holding its share of the in-flight byte budget.
pub(crate) struct Incoming {
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// A tombstone's origin, from its headers (see [`TombstoneOrigin`]).
    pub tombstone: Option<TombstoneOrigin>,
    /// The `dedup.identity.header` header's value (only that header is carried).
    pub identity_header: Option<Vec<u8>>,
    pub _permit: OwnedSemaphorePermit,
}

/// A record that could not be decoded, to dead-letter before its batch is applied.
pub(super) struct Undecodable {
    pub(super) offset: i64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Option<Vec<u8>>,
    pub(super) error: DecodeError,
}

/// A collected, decoded and prepared batch on its way to the applier.
pub(super) struct Decoded {
    pub(super) batch: Batch,
    pub(super) undecodable: Vec<Undecodable>,
    /// Time spent decoding and preparing.
    pub(super) decode_time: Duration,
    /// The byte budget of the batch's records, released once it is applied.
    pub(super) _permits: Vec<OwnedSemaphorePermit>,
}

/// Batches handed to the applier and not yet finished, and a wake-up when one finishes.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) batches: AtomicUsize,
    pub(super) finished: Notify,
}

impl Pending {
    pub(super) fn idle(&self) -> bool {
        self.batches.load(Ordering::Acquire) == 0
    }
}

/// How long a decoder waits before looking for more records of the batch it collects.
const COLLECT_NAP: Duration = Duration::from_millis(1);

/// The collecting and decoding stage of a worker.
pub(super) struct Decoder {
    pub(super) shared: Arc<Shared>,
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) rx: mpsc::Receiver<Incoming>,
    pub(super) stop: CancellationToken,
    pub(super) pending: Arc<Pending>,
}

impl Decoder {
    /// Collects and decodes batches until stopped or the applier is gone.
    pub(super) async fn run(mut self, tx: mpsc::Sender<Decoded>) {
        loop {
            let (incoming, stopping) = self.collect().await;
            // The schemas of the batch's Avro records, read before decoding
            // (on a blocking thread, below); `None`: stopped while waiting
            // for the registry (the records are read again after the restart).
            let Some(schemas) = self.schemas(&incoming).await else {
                return;
            };
            if !incoming.is_empty() {
                self.pending.batches.fetch_add(1, Ordering::AcqRel);
                // On a blocking thread: decoding and preparing a batch is
                // milliseconds of CPU in one piece, which on a runtime worker
                // held up the applier's round trips to the target (its
                // `BEGIN` waited 7 ms on average instead of under 1 ms).
                let (shared, tp) = (self.shared.clone(), (self.topic.clone(), self.partition));
                let decoded = match tokio::task::spawn_blocking(move || {
                    decode_batch(&shared, tp, incoming, &schemas)
                })
                .await
                {
                    Ok(d) => d,
                    Err(e) => {
                        // Never go on without the batch: its records would be
                        // skipped. The runner stops before this returns, so the
                        // records the poll thread still hands in are not lost
                        // but read again after the restart.
                        let tp = TopicPartition::new(&*self.topic, self.partition);
                        self.shared
                            .worker_died(&tp, "decoding or preparing a batch", e);
                        return;
                    }
                };
                if tx.send(decoded).await.is_err() {
                    return;
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// Waits for a first record, then gathers more until the batch is full, its
    /// time is up, nothing more is waiting while the applier is idle, or the
    /// worker is told to stop. Returns the records and whether to stop afterwards.
    ///
    /// After the first record it does not wait on the channel: it takes what is
    /// queued, and while the applier is busy naps [`COLLECT_NAP`] (never past the
    /// batch's deadline, and woken when the applier finishes) and looks again.
    /// Waiting on the channel woke this task for nearly every record (the poll
    /// thread hands them over one at a time), a cross-thread wake-up each,
    /// competing for the cores with the target.
    async fn collect(&mut self) -> (Vec<Incoming>, bool) {
        use tokio::sync::mpsc::error::TryRecvError;
        let max = self.shared.config.batch_max_records;
        let mut out = Vec::new();
        let first = tokio::select! {
            biased;
            _ = self.stop.cancelled() => return (out, true),
            m = self.rx.recv() => m,
        };
        let Some(first) = first else {
            return (out, true);
        };
        out.reserve(max.min(16_384));
        out.push(first);
        let deadline = tokio::time::Instant::now() + self.shared.config.batch_max_wait();
        loop {
            while out.len() < max {
                match self.rx.try_recv() {
                    Ok(m) => out.push(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return (out, true),
                }
            }
            let now = tokio::time::Instant::now();
            if out.len() >= max || now >= deadline || self.pending.idle() {
                // Full, due, or the sink waits for work: hand it what there is.
                return (out, false);
            }
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return (out, true),
                _ = self.pending.finished.notified() => {}
                _ = tokio::time::sleep_until((now + COLLECT_NAP).min(deadline)) => {}
            }
        }
    }
}

/// Decodes keys and envelopes (what cannot be decoded is set aside for the
/// dead-letter topic), then lets the sink prepare the batch.
fn decode_batch(
    shared: &Shared,
    tp: (Arc<str>, i32),
    incoming: Vec<Incoming>,
    schemas: &Schemas,
) -> Decoded {
    let started = Instant::now();
    // Configured as `return(<topic>/<partition>)`: a panic in that partition's
    // decoding only, so tests in one process do not disturb each other.
    #[cfg(feature = "failpoints")]
    if fail::eval("sink-decode-batch", |arg| arg)
        .is_some_and(|arg| arg.as_deref() == Some(&*format!("{}/{}", tp.0, tp.1)))
    {
        panic!("injected panic (failpoint sink-decode-batch)");
    }
    let (records, undecodable, next_offset, permits) =
        decode(incoming, shared.config.debezium_schemaless_accept, schemas);
    let mut batch = Batch::new(shared.group.clone(), tp, records, next_offset);
    shared.sink.prepare(&mut batch);
    Decoded {
        batch,
        undecodable,
        decode_time: started.elapsed(),
        _permits: permits,
    }
}

/// Records, undecodable records, the next offset and the records' byte budget.
type DecodedParts = (
    Vec<Record>,
    Vec<Undecodable>,
    i64,
    Vec<OwnedSemaphorePermit>,
);

/// Decodes keys and envelopes; what cannot be decoded is set aside for the dead-letter topic.
/// `schemaless_debezium`: whether events a real Debezium wrote without
/// schemas are applied (else they are dead letters, see
/// [`crate::debezium::refuse_schemaless`]).
fn decode(incoming: Vec<Incoming>, schemaless_debezium: bool, schemas: &Schemas) -> DecodedParts {
    let next_offset = incoming.last().map_or(0, |m| m.offset + 1);
    let mut records = Vec::with_capacity(incoming.len());
    let mut undecodable = Vec::new();
    let mut permits = Vec::with_capacity(incoming.len());
    for m in incoming {
        permits.push(m._permit);
        let decoded = from_avro(m.key.as_deref(), schemas, "key")
            .and_then(|key| decode_key(key.as_deref().or(m.key.as_deref())))
            .and_then(|k| {
                let value = from_avro(m.value.as_deref(), schemas, "value")?;
                Ok((k, decode_value(value.as_deref().or(m.value.as_deref()))?))
            })
            .and_then(|(k, payload)| match &payload {
                Payload::Change(e) if !schemaless_debezium => {
                    crate::debezium::refuse_schemaless(e).map_or(Ok((k, payload)), Err)
                }
                _ => Ok((k, payload)),
            });
        match decoded {
            Ok((key, payload)) => {
                // A tombstone that says which delete it follows is applied as
                // that delete (versioned, so applying both is harmless).
                let payload = match (payload, m.tombstone) {
                    (Payload::Tombstone, Some(origin)) => {
                        Payload::Change(Box::new(origin.to_delete()))
                    }
                    (payload, _) => payload,
                };
                let mut r = Record::new(m.offset, key, payload)
                    .with_raw_owned(m.key, m.value)
                    .with_identity_header(m.identity_header);
                r.timestamp_ms = m.timestamp_ms;
                records.push(r);
            }
            Err(error) => undecodable.push(Undecodable {
                offset: m.offset,
                key: m.key,
                value: m.value,
                error,
            }),
        }
    }
    (records, undecodable, next_offset, permits)
}

/// The codecs of the schema ids a batch's Avro records name, or why an id
/// has none (an id the registry does not know: those records are dead letters).
pub(super) type Schemas = HashMap<u32, Result<SharedCodec, String>>;

/// The schema id of an Avro record (Confluent's wire format); `None` for
/// anything else (JSON never starts with the magic byte 0).
fn avro_id(bytes: Option<&[u8]>) -> Option<u32> {
    bytes
        .filter(|b| b.first() == Some(&wire::MAGIC))
        .and_then(|b| wire::unframe(b).ok())
        .map(|(id, _)| id)
}

/// An Avro key or value as the JSON converter's `{"schema", "payload"}`
/// (`None`: not Avro, decoded as it is).
fn from_avro(
    bytes: Option<&[u8]>,
    schemas: &Schemas,
    part: &'static str,
) -> Result<Option<Vec<u8>>, DecodeError> {
    let Some(id) = avro_id(bytes) else {
        return Ok(None);
    };
    let bytes = bytes.unwrap_or_default();
    let failed = |reason: String| DecodeError { part, reason };
    let codec = match schemas.get(&id) {
        Some(Ok(codec)) => codec,
        Some(Err(reason)) => return Err(failed(reason.clone())),
        None => {
            return Err(failed(format!(
                "an Avro record (schema id {id}) and no schema.registry.url to read its schema"
            )))
        }
    };
    let (_, body) = wire::unframe(bytes).map_err(|e| failed(e.to_string()))?;
    codec
        .decode_wrapped(body)
        .map(Some)
        .map_err(|e| failed(format!("Avro record of schema id {id}: {e}")))
}

impl Decoder {
    /// Reads the schemas the Avro records of `incoming` name, waiting while
    /// the registry is unreachable; `None` when stopped meanwhile (also
    /// when the registry refused to answer: the runner then stops).
    async fn schemas(&self, incoming: &[Incoming]) -> Option<Schemas> {
        let Some(registry) = &self.shared.registry else {
            return Some(Schemas::new());
        };
        let ids: BTreeSet<u32> = incoming
            .iter()
            .flat_map(|m| [avro_id(m.key.as_deref()), avro_id(m.value.as_deref())])
            .flatten()
            .collect();
        let retries = &self.shared.metrics.schema_registry_retries;
        match read_schemas(registry, ids, &self.stop, retries).await {
            Ok(schemas) => schemas,
            Err(e) => {
                self.shared.fail(crate::SinkError::fatal(format!(
                    "{e}: fix schema.registry.url or its credentials, then start the sink again"
                )));
                None
            }
        }
    }
}

/// The codecs of `ids`, retrying (counted in `retries`) while the registry
/// is unreachable, however long: an id is a dead letter only when the
/// registry answers that it does not know it (or its schema cannot be
/// read as Avro), never because the registry could not be asked. `Ok(None)`:
/// stopped while waiting; `Err`: the registry refused the request
/// (authentication, a wrong URL), which no record is to blame for.
async fn read_schemas(
    registry: &oncely_core::avro::registry::RegistryClient,
    ids: BTreeSet<u32>,
    stop: &CancellationToken,
    retries: &prometheus::IntCounter,
) -> Result<Option<Schemas>, AvroError> {
    let mut out = Schemas::new();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    for id in ids {
        let got = retry(
            &mut backoff,
            stop,
            || registry.schema(id),
            AvroError::is_retriable,
            |e, delay| {
                retries.inc();
                tracing::warn!("{e}; reading schema id {id} again in {delay:?}");
            },
        )
        .await;
        match got {
            Ok(codec) => drop(out.insert(id, Ok(codec))),
            Err(RetryOutcome::Failed(e)) if e.is_refusal() => return Err(e),
            Err(RetryOutcome::Failed(e)) => drop(out.insert(id, Err(e.to_string()))),
            Err(RetryOutcome::Cancelled(_)) => return Ok(None),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use oncely_core::avro::AvroCodec;
    use serde_json::Value;

    use super::*;
    use crate::event::Payload;

    /// A registry that is down when a batch names an unknown id and comes
    /// up 1.5 s later: the id is read, not dead-lettered, and the
    /// retries are counted.
    #[tokio::test]
    async fn an_unknown_id_while_the_registry_is_unreachable_is_retried_not_dead_lettered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let registry =
            oncely_core::avro::registry::RegistryClient::new(&format!("http://{addr}")).unwrap();
        let schema = r#"{"type":"record","name":"t","fields":[{"name":"id","type":"int"}]}"#;
        let answer = serde_json::json!({ "schema": schema }).to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        let retries = prometheus::IntCounter::new("r", "r").unwrap();
        let schemas = read_schemas(
            &registry,
            BTreeSet::from([7]),
            &CancellationToken::new(),
            &retries,
        )
        .await
        .unwrap()
        .expect("not stopped");
        let codec = schemas[&7].as_ref().expect("read once the registry is up");
        assert_eq!(codec.decode(&[0x02]).unwrap(), serde_json::json!({"id": 1}));
        assert!(retries.get() >= 2, "{}", retries.get());
    }

    /// An https registry asking for basic auth: read with the CA file and
    /// the user info; without the CA its certificate is refused, which stops
    /// the sink rather than dead-letter the records or retry for ever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_https_registry_with_basic_auth_is_read_with_its_ca_file() {
        use oncely_core::avro::registry::{RegistryAccess, RegistryClient};
        use oncely_testkit::webhook::{Answer, Receiver};
        let dir = std::env::temp_dir().join(format!("oncely-registry-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let certs = oncely_testkit::tls::server_certs(&dir).expect("test certificates");
        let receiver = Receiver::start_tls(&certs.cert, &certs.key).await;
        let schema = r#"{"type":"record","name":"t","fields":[{"name":"id","type":"int"}]}"#;
        receiver.always(
            "",
            Answer::new(200, &serde_json::json!({ "schema": schema }).to_string()),
        );
        let access = |ca: Option<&std::path::Path>| RegistryAccess {
            url: receiver.url(),
            user_info: Some(oncely_core::Secret::new("svc:s3cret")),
            ca_file: ca.map(Into::into),
        };
        let retries = prometheus::IntCounter::new("r", "r").unwrap();
        let stop = CancellationToken::new();
        let trusting = RegistryClient::connect(&access(Some(&certs.ca))).unwrap();
        let schemas = read_schemas(&trusting, BTreeSet::from([3]), &stop, &retries)
            .await
            .unwrap()
            .unwrap();
        assert!(schemas[&3].is_ok());
        let seen = receiver.requests();
        // "svc:s3cret" in base64.
        assert_eq!(
            seen[0].authorization.as_deref(),
            Some("Basic c3ZjOnMzY3JldA==")
        );

        let untrusting = RegistryClient::connect(&access(None)).unwrap();
        let e = read_schemas(&untrusting, BTreeSet::from([4]), &stop, &retries)
            .await
            .unwrap_err();
        assert!(e.is_refusal(), "{e:?}");
        assert!(
            e.to_string().contains("schema.registry.ssl.ca.location"),
            "{e}"
        );
        assert_eq!(retries.get(), 0, "not retried");
    }

    fn fixture() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/envelope/insert_all_types.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
    }

    #[test]
    fn avro_records_decode_as_their_json_twins() {
        let doc = fixture();
        let codec = AvroCodec::from_connect(&doc["value"]["schema"]).unwrap();
        // The reader knows only the registered text, as from the registry.
        let reader = Arc::new(AvroCodec::from_avro(codec.avro_schema()).unwrap());
        let framed = wire::frame(7, &codec.encode(&doc["value"]["payload"]).unwrap());
        let schemas = Schemas::from([(7, Ok(reader))]);

        let json = from_avro(Some(&framed), &schemas, "value")
            .unwrap()
            .unwrap();
        let (Payload::Change(avro), Payload::Change(plain)) = (
            decode_value(Some(&json)).unwrap(),
            decode_value(Some(doc["value"].to_string().as_bytes())).unwrap(),
        ) else {
            panic!("not change events");
        };
        assert_eq!(avro.op, plain.op);
        assert_eq!(avro.after, plain.after);
        assert_eq!(avro.source, plain.source);
        assert_eq!(avro.version, plain.version);
        // The Avro side's schema says `optional` everywhere: compare the
        // row's field names and types.
        let fields = |s: &Value| -> Vec<(Value, Value)> {
            s["fields"][1]["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| (f["field"].clone(), f["type"].clone()))
                .collect()
        };
        assert_eq!(
            fields(avro.schema.as_deref().unwrap()),
            fields(&doc["value"]["schema"])
        );

        // JSON records pass through untouched.
        assert_eq!(from_avro(Some(b"{}"), &schemas, "value").unwrap(), None);
    }

    #[test]
    fn an_unknown_schema_id_is_a_dead_letter_naming_it() {
        let schemas = Schemas::from([(
            9,
            Err("schema id 9 is unknown to the schema registry at http://r".to_owned()),
        )]);
        let e = from_avro(Some(&wire::frame(9, b"x")), &schemas, "value").unwrap_err();
        assert_eq!(e.part, "value");
        assert!(e.reason.contains("schema id 9"), "{e}");
        // No registry configured: named too, never read as JSON.
        let e = from_avro(Some(&wire::frame(3, b"x")), &Schemas::new(), "key").unwrap_err();
        assert!(
            e.reason.contains("schema id 3") && e.reason.contains("schema.registry.url"),
            "{e}"
        );
    }
}
