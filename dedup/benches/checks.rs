//! Checks per second of the dedup windows: `cargo bench -p oncely-dedup --bench checks`.
//! The Redis window is measured too when `ONCELY_REDIS_URL` is set.
use std::time::{Duration, Instant};

use oncely_dedup::{MemoryWindow, RedisWindow, SequenceWatermark, WindowStore};

const N: u64 = 1_000_000;

fn report(name: &str, n: u64, elapsed: Duration) {
    let rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "{name:<44} {n:>9} checks in {:>8.3} s = {rate:>12.0} checks/s",
        elapsed.as_secs_f64()
    );
}

fn memory() {
    let w = MemoryWindow::new(100_000, Duration::from_secs(600));
    let start = Instant::now();
    let mut dups = 0u64;
    for i in 0..N {
        // Every id twice in a row, then evicted: half new, half duplicates.
        let id = (i / 2).to_be_bytes();
        dups += u64::from(w.check_and_remember_now(&id).is_duplicate());
    }
    report(
        "memory window (cap 100k, 50% duplicates)",
        N,
        start.elapsed(),
    );
    assert_eq!(dups, N / 2);
}

fn watermark() {
    let w: SequenceWatermark<u32, u64> = SequenceWatermark::new(10_000);
    let start = Instant::now();
    for i in 0..N {
        let _ = w.check((i % 1000) as u32, i / 1000);
    }
    report("sequence watermark (1000 keys)", N, start.elapsed());
}

async fn redis(url: &str) {
    let prefix = format!("oncely:bench:{}:", std::process::id());
    let w = match RedisWindow::connect(url, &prefix, Duration::from_secs(60)).await {
        Ok(w) => w,
        Err(e) => {
            println!("redis window: skipped ({e})");
            return;
        }
    };
    let n = 50_000u64;
    let start = Instant::now();
    for i in 0..n {
        if let Err(e) = w.check_and_remember(&i.to_be_bytes()).await {
            println!("redis window: failed ({e})");
            return;
        }
    }
    report("redis window (sequential round trips)", n, start.elapsed());
    let start = Instant::now();
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let w = w.clone();
            tokio::spawn(async move {
                for i in 0..n / 16 {
                    let _ = w.check_and_remember(&(n + t * n + i).to_be_bytes()).await;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    report(
        "redis window (16 concurrent tasks, pipelined)",
        n,
        start.elapsed(),
    );
}

fn main() {
    memory();
    watermark();
    if let Ok(url) = std::env::var("ONCELY_REDIS_URL") {
        match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(redis(&url)),
            Err(e) => println!("redis window: no runtime ({e})"),
        }
    }
}
