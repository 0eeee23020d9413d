//! Changes/s through the `redis` sink next to a plain pipelined client writing
//! the same rows to the same Redis in the same run.
//!
//! ```sh
//! eval "$(scripts/services env)"
//! cargo run --release -p oncely-sinks --example redis_bench            # 1,000,000 events
//! ONCELY_BENCH_EVENTS=200000 cargo run --release -p oncely-sinks --example redis_bench
//! ```
//!
//! Both sides get the same decoded records, 1000 per batch (the runner's
//! default `batch.max.records`), over 100,000 distinct keys (so most events
//! update an existing row), and are timed from records to acknowledged
//! writes: the sink reads the versions of rows it has not seen (one
//! pipeline), checks each change against them and writes the newer ones and
//! the position in one `MULTI`/`EXEC` guarded by the partition's fence
//! (`WATCH`); the plain client builds one `HSET` per record and sends the
//! batch as one pipeline. Building the records (Kafka decoding) is outside
//! both timings. The sink's `prepare` (row keys, versions, each row's `HSET`)
//! is timed apart, as the runner calls it ahead on another thread together
//! with decoding, and the ratio is printed with and without it. Alternating
//! rounds even out noise; Redis's own CPU per change is printed for each side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncely_sinks::event::decode_value;
use oncely_sinks::kinds::redis::{RedisConfig, RedisSink};
use oncely_sinks::{Batch, Record, Sink};
use serde_json::{json, Value};

// The allocator the `oncely` binary runs the sink with (both sides get it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 1000;
const KEYS: u64 = 100_000;
const ROUNDS: u64 = 4;

fn records(first: u64, n: usize) -> Vec<Record> {
    (0..n as u64)
        .map(|i| {
            let seq = first + i;
            let id = seq % KEYS;
            let value = json!({
                "before": null,
                "after": {"id": id, "rev": seq, "note": format!("note for row {id} at {seq}"), "amount": "1234.50", "active": true},
                "op": "u",
                "source": {"schema": "public", "table": "bench", "commit_lsn": seq, "event_seq": 0},
            });
            let payload = decode_value(Some(value.to_string().as_bytes())).expect("envelope");
            Record::new(seq as i64, Some(json!({ "id": id })), payload)
        })
        .collect()
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v.to_string())
}

async fn plain(conn: &mut redis::aio::MultiplexedConnection, prefix: &str, recs: &[Record]) {
    let mut pipe = redis::pipe();
    for r in recs {
        let Some(e) = r.event() else { continue };
        let Some(after) = &e.after else { continue };
        let id = r
            .key
            .as_ref()
            .and_then(|k| k.get("id"))
            .map(text)
            .unwrap_or_default();
        let cmd = pipe.cmd("HSET").arg(format!("{prefix}:bench:{id}"));
        for (column, value) in after {
            cmd.arg(column).arg(text(value));
        }
        pipe.ignore();
    }
    pipe.query_async::<()>(conn).await.expect("pipeline");
}

async fn cleanup(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(5000)
            .query_async(conn)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(keys)
                .query_async::<()>(conn)
                .await
                .expect("UNLINK");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// Redis's own CPU seconds so far (`INFO cpu`), to split each side's time
/// into the server's work and the client's.
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| matches!(*k, "used_cpu_sys_main_thread" | "used_cpu_user_main_thread"))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("ONCELY_REDIS_URL")
        .expect("ONCELY_REDIS_URL (eval \"$(scripts/services env)\")");
    let total: u64 = std::env::var("ONCELY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tag = format!("oncely_bench_{:08x}", rand::random::<u32>());
    let mut config = RedisConfig::new(url.clone());
    config.key_pattern = format!("{tag}:s:{{table}}:{{key}}");
    config.version_prefix = format!("{tag}:v:");
    config.positions_prefix = format!("{tag}:pos:");
    config.keyset_prefix = format!("{tag}:ks:");
    config.fence_prefix = format!("{tag}:fence:");
    let sink = RedisSink::connect(&config).await.expect("sink");
    let mut conn = redis::Client::open(url)
        .expect("client")
        // The sink's own timeouts, so a loaded machine fails neither side first.
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout()))
                .set_response_timeout(Some(config.response_timeout())),
        )
        .await
        .expect("connect");
    let plain_prefix = format!("{tag}:p");
    let (mut t_sink, mut t_plain) = (Duration::ZERO, Duration::ZERO);
    let mut t_prepare = Duration::ZERO;
    let (mut longest_call, mut n) = (Duration::ZERO, 0u64);
    let mut server = [0.0f64; 2];
    let per_round = total / ROUNDS;
    for round in 0..ROUNDS {
        // Alternate which side goes first in a round.
        let (sink_before, plain_before) = (t_sink, t_plain);
        for side in [round % 2, 1 - round % 2] {
            let mut done = 0u64;
            let cpu_before = server_cpu(&mut conn).await;
            while done < per_round {
                let size = BATCH.min((per_round - done) as usize);
                let first = round * per_round + done;
                let recs = records(first, size);
                if side == 0 {
                    let mut batch = Batch::new(
                        Arc::from("bench"),
                        (Arc::from("bench"), 0),
                        recs,
                        (first + size as u64) as i64,
                    );
                    let start = Instant::now();
                    sink.prepare(&mut batch);
                    t_prepare += start.elapsed();
                    let start = Instant::now();
                    sink.apply(&batch).await.expect("apply");
                    let d = start.elapsed();
                    longest_call = longest_call.max(d);
                    t_sink += d;
                } else {
                    let start = Instant::now();
                    plain(&mut conn, &plain_prefix, &recs).await;
                    t_plain += start.elapsed();
                }
                done += size as u64;
            }
            server[side as usize] += server_cpu(&mut conn).await - cpu_before;
        }
        n += per_round;
        let (s, p) = (
            rate(per_round, t_sink - sink_before),
            rate(per_round, t_plain - plain_before),
        );
        eprintln!(
            "round {round}: {n} events per side; this round: sink {s:.0}/s, plain {p:.0}/s, {:.1} %",
            100.0 * s / p
        );
    }
    let (s, p) = (rate(n, t_sink), rate(n, t_plain));
    println!("events per side:          {n}");
    println!(
        "redis sink:               {s:>10.0} changes/s  ({:.2} s)",
        t_sink.as_secs_f64()
    );
    println!(
        "plain pipelined HSET:     {p:>10.0} changes/s  ({:.2} s)",
        t_plain.as_secs_f64()
    );
    println!("ratio sink / plain:       {:>10.1} %", 100.0 * s / p);
    let sp = rate(n, t_sink + t_prepare);
    println!(
        "  with prepare timed in:  {:>10.1} %  (prepare {:.2} s, {sp:.0} changes/s)",
        100.0 * sp / p,
        t_prepare.as_secs_f64()
    );
    let per = |secs: f64| secs * 1e6 / n as f64;
    println!(
        "redis server CPU per change: sink {:.2} µs, plain {:.2} µs",
        per(server[0]),
        per(server[1])
    );
    println!(
        "longest 1000-change apply: {:.1} ms",
        longest_call.as_secs_f64() * 1000.0
    );
    cleanup(&mut conn, &tag).await;
}
