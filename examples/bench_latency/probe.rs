//! The observers: one task per target polls for the highest change number
//! it can read ([`Probe`]) and records each transaction's latency when it
//! first shows; `kafka` is followed by a `read_committed` consumer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use elasticsearch::{Elasticsearch, SearchParts};
use serde_json::{json, Value};
use tokio_postgres::NoTls;

use super::{Bench, Log, ProbeTimes, Seen, Visible, POLL_MS};

/// The running observers and what they record.
pub struct Observers {
    pub log: Arc<Mutex<Log>>,
    pub visible: Visible,
    targets: Vec<&'static str>,
    seen: BTreeMap<&'static str, Seen>,
    probe_time: BTreeMap<&'static str, ProbeTimes>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    observers: Vec<tokio::task::JoinHandle<()>>,
}

/// What the observers recorded: the targets, their latencies and their poll times.
type Recorded = (
    Vec<&'static str>,
    BTreeMap<&'static str, Seen>,
    BTreeMap<&'static str, ProbeTimes>,
);

impl Observers {
    /// Stops the observers and returns what they recorded.
    pub async fn stop(self) -> Result<Recorded> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for o in self.observers {
            o.await?;
        }
        Ok((self.targets, self.seen, self.probe_time))
    }
}

/// Starts the Kafka watcher and one observer per target.
pub async fn start_observers(bench: &Bench) -> Result<Observers> {
    let (brokers, prefix, targets) = (&bench.services.brokers, &bench.prefix, &bench.targets);
    let (es, index, dw_cfg) = (&bench.es, &bench.index, &bench.dw_cfg);
    let redis = redis::Client::open(bench.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let log = Arc::new(Mutex::new(Log::default()));
    let mut seen: BTreeMap<&str, Seen> = BTreeMap::new();
    let visible: BTreeMap<&str, Arc<std::sync::atomic::AtomicI64>> = targets
        .iter()
        .map(|t| (*t, Arc::new(std::sync::atomic::AtomicI64::new(-1))))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_kafka = Arc::new(std::sync::atomic::AtomicI64::new(-1));
    tokio::spawn(watch_topic(
        brokers.clone(),
        format!("{prefix}.public.ticks"),
        in_kafka.clone(),
    ));
    let poll =
        Duration::from_millis(std::env::var("BENCH_POLL_MS").map_or(Ok(POLL_MS), |v| v.parse())?);
    let es_get = std::env::var("BENCH_ES_GET").is_ok();
    let mut observers = Vec::new();
    let mut probe_time: BTreeMap<&str, ProbeTimes> = BTreeMap::new();
    for &target in targets {
        let s: Seen = Arc::default();
        seen.insert(target, s.clone());
        let (log, stop, visible) = (log.clone(), stop.clone(), visible[target].clone());
        let probe = Probe {
            target,
            dw: if target == "postgres" {
                let (c, conn) = dw_cfg.connect(NoTls).await?;
                tokio::spawn(conn);
                Some(c)
            } else {
                None
            },
            es: es.clone(),
            index: index.clone(),
            redis: redis.clone(),
            prefix: prefix.clone(),
            in_kafka: in_kafka.clone(),
            es_get,
        };
        let probe_times: ProbeTimes = Arc::default();
        probe_time.insert(target, probe_times.clone());
        observers.push(tokio::spawn(async move {
            let mut next = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let pending: Vec<(i64, i64)> = {
                    let log = log.lock().unwrap();
                    log.sent
                        .iter()
                        .skip(next)
                        .take(64)
                        .map(|s| (s.key, s.n))
                        .collect()
                };
                let asked = Instant::now();
                let max = probe.max_n(&pending).await;
                let now = Instant::now();
                probe_times
                    .lock()
                    .unwrap()
                    .push((asked, (now - asked).as_secs_f64()));
                visible.fetch_max(max, std::sync::atomic::Ordering::SeqCst);
                {
                    let log = log.lock().unwrap();
                    let mut out = s.lock().unwrap();
                    while next < log.sent.len() && log.sent[next].n <= max {
                        let sent = &log.sent[next];
                        out.push((sent.phase, sent.at, (now - sent.at).as_secs_f64()));
                        next += 1;
                    }
                }
                tokio::time::sleep(poll).await;
            }
        }));
    }
    Ok(Observers {
        log,
        visible,
        targets: targets.clone(),
        seen,
        probe_time,
        stop,
        observers,
    })
}

/// Reads the highest change number visible in one target (-1 when none yet).
struct Probe {
    target: &'static str,
    dw: Option<tokio_postgres::Client>,
    es: Elasticsearch,
    index: String,
    redis: redis::aio::MultiplexedConnection,
    prefix: String,
    in_kafka: Arc<std::sync::atomic::AtomicI64>,
    /// `BENCH_ES_GET`: read Elasticsearch by a real-time multi-get instead of a search.
    es_get: bool,
}

/// Follows the topic with `read_committed` and publishes the highest change number seen.
async fn watch_topic(brokers: String, topic: String, max: Arc<std::sync::atomic::AtomicI64>) {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    let consumer: StreamConsumer = match rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("{topic}-observer"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .create()
    {
        Ok(c) => c,
        Err(e) => return eprintln!("kafka observer: {e}"),
    };
    if let Err(e) = consumer.subscribe(&[&topic]) {
        return eprintln!("kafka observer: {e}");
    }
    loop {
        let Ok(m) = consumer.recv().await else {
            continue;
        };
        // Typed, so the rest of the envelope (and its schema) is skipped, not built.
        #[derive(serde::Deserialize)]
        struct Row {
            n: i64,
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            after: Option<Row>,
        }
        #[derive(serde::Deserialize)]
        struct Top {
            payload: Option<Envelope>,
            after: Option<Row>,
        }
        let Some(Ok(top)) = m.payload().map(serde_json::from_slice::<Top>) else {
            continue; // a tombstone
        };
        if let Some(row) = top.payload.and_then(|p| p.after).or(top.after) {
            max.fetch_max(row.n, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Probe {
    /// The highest change number known visible. `pending`: (row, change number)
    /// of the transactions not yet seen, oldest first. A row showing a change
    /// number at or past a transaction's proves that transaction landed (the
    /// sinks apply one partition in order); with nothing pending, the warm-up row.
    async fn max_n(&self, pending: &[(i64, i64)]) -> i64 {
        if self.target == "kafka" {
            return self.in_kafka.load(std::sync::atomic::Ordering::SeqCst);
        }
        let warm_up = [(0, 0)];
        let rows = if pending.is_empty() {
            &warm_up[..]
        } else {
            pending
        };
        let keys: Vec<i64> = rows.iter().map(|(k, _)| *k).collect();
        let Some(stored) = self.stored_n(&keys).await else {
            return -1;
        };
        if pending.is_empty() {
            return stored.get(&0).copied().unwrap_or(-1);
        }
        let mut max = -1;
        for (key, n) in pending {
            if stored.get(key).is_some_and(|s| s >= n) {
                max = *n;
            } else {
                break;
            }
        }
        max
    }

    /// The change number each of `keys` shows in the target.
    async fn stored_n(&self, keys: &[i64]) -> Option<std::collections::HashMap<i64, i64>> {
        match self.target {
            "postgres" => {
                let rows = self
                    .dw
                    .as_ref()?
                    .query(
                        "SELECT id, n FROM public_ticks WHERE id = ANY($1)",
                        &[&keys],
                    )
                    .await
                    .ok()?;
                Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            }
            "elasticsearch" => {
                // Searchable, not merely stored (a get by id would be real-time):
                // a search sees what the last refresh published.
                let ids: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                let resp = if self.es_get {
                    self.es
                        .mget(elasticsearch::MgetParts::Index(&self.index))
                        .body(json!({"ids": ids}))
                        .send()
                        .await
                        .ok()?
                } else {
                    self.es
                        .search(SearchParts::Index(&[&self.index]))
                        .body(json!({"size": ids.len(), "_source": ["id", "n"],
                                     "query": {"ids": {"values": ids}}}))
                        .send()
                        .await
                        .ok()?
                };
                let body = resp.json::<Value>().await.ok()?;
                Some(
                    body["hits"]["hits"]
                        .as_array()
                        .or(body["docs"].as_array())?
                        .iter()
                        .filter_map(|h| {
                            Some((h["_source"]["id"].as_i64()?, h["_source"]["n"].as_i64()?))
                        })
                        .collect(),
                )
            }
            _ => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.hget(format!("{}:ticks:{key}", self.prefix), "n");
                }
                let mut conn = self.redis.clone();
                let values: Vec<Option<i64>> = pipe.query_async(&mut conn).await.ok()?;
                Some(
                    keys.iter()
                        .zip(values)
                        .filter_map(|(k, v)| Some((*k, v?)))
                        .collect(),
                )
            }
        }
    }
}
