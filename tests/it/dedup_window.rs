//! Dedup windows against the real Redis and Kafka of `scripts/services`.

use std::time::Duration;

use oncely_dedup::{MemoryWindow, RedisWindow, Seen, WindowStore};
use oncely_sinks::warmup::{read_before, Warmup};
use oncely_sinks::TopicPartition;
use oncely_testkit::kafka::{brokers, create_topic, envelope, key, produce, unique, Out};

fn redis_url() -> String {
    match std::env::var("ONCELY_REDIS_URL") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "ONCELY_REDIS_URL is not set: run `eval \"$(scripts/services env)\"` or scripts/test"
        ),
    }
}

#[tokio::test]
async fn memory_window_suppresses_duplicates_inside_and_forgets_outside() {
    let w = MemoryWindow::new(1000, Duration::from_millis(300));
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    // Documented limit: older than the window is reported as new.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        w.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );

    // Count bound: the oldest identity falls out once `capacity` newer ones arrived.
    let small = MemoryWindow::new(3, Duration::from_secs(60));
    for id in [b"a", b"b", b"c", b"d"] {
        assert_eq!(small.check_and_remember_now(id), Seen::New);
    }
    small.run_pending_tasks();
    assert!(!small.contains_now(b"a"), "evicted by count");
    assert!(small.contains_now(b"d") && small.contains_now(b"c") && small.contains_now(b"b"));
}

#[tokio::test]
async fn redis_window_survives_a_restart_and_expires_by_age() {
    let prefix = format!("{}:", unique("oncely:test:dedup"));
    let first = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("connect");
    assert_eq!(
        first.check_and_remember(b"evt-1").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        first.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    drop(first);
    // A new process would connect anew: the window is still there.
    let second = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("reconnect");
    assert_eq!(
        second.check_and_remember(b"evt-1").await.expect("check"),
        Seen::Duplicate
    );
    assert!(!second.contains(b"evt-2").await.expect("contains"));
    second.remember(b"evt-2").await.expect("remember");
    assert!(second.contains(b"evt-2").await.expect("contains"));
    second.forget(b"evt-2").await.expect("forget");
    assert_eq!(
        second.check_and_remember(b"evt-2").await.expect("check"),
        Seen::New
    );

    let short = RedisWindow::connect(
        &redis_url(),
        &format!("{prefix}short:"),
        Duration::from_millis(200),
    )
    .await
    .expect("connect");
    assert_eq!(
        short.check_and_remember(b"evt-3").await.expect("check"),
        Seen::New
    );
    let mut expired = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !short.contains(b"evt-3").await.expect("contains") {
            expired = true;
            break;
        }
    }
    assert!(expired, "identity older than the TTL must expire");
    assert_eq!(
        short.check_and_remember(b"evt-3").await.expect("check"),
        Seen::New
    );
}

#[tokio::test]
async fn concurrent_redis_checks_of_one_identity_yield_exactly_one_new() {
    let prefix = format!("{}:", unique("oncely:test:race"));
    let w = RedisWindow::connect(&redis_url(), &prefix, Duration::from_secs(60))
        .await
        .expect("connect");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let w = w.clone();
            tokio::spawn(async move { w.check_and_remember(b"same").await })
        })
        .collect();
    let mut news = 0;
    for t in tasks {
        if t.await.expect("join").expect("check") == Seen::New {
            news += 1;
        }
    }
    assert_eq!(news, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_window_is_rebuilt_from_the_records_before_the_start_offset() {
    let topic = unique("warmup");
    create_topic(&topic, 1).await;
    let records: Vec<Out> = (0..10u64)
        .map(|i| Out {
            key: Some(key(i)),
            value: Some(envelope(i, 100 + i, 0, i)),
            partition: Some(0),
        })
        .collect();
    produce(&topic, &records).await;
    let warm = read_before(Warmup {
        bootstrap_servers: brokers(),
        kafka: Default::default(),
        partition: TopicPartition::new(&topic, 0),
        end_offset: 8,
        max_records: 5,
        timeout: Duration::from_secs(30),
    })
    .await
    .expect("warm-up");
    let offsets: Vec<i64> = warm.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        vec![3, 4, 5, 6, 7],
        "the last five records before offset 8"
    );
    let window = MemoryWindow::new(100, Duration::from_secs(60));
    for r in &warm {
        let version = r.event().map(|e| e.version.to_string()).unwrap_or_default();
        window.remember(version.as_bytes()).await.expect("remember");
    }
    // A redelivered record inside the warmed window is a duplicate, an older one is new.
    assert_eq!(
        window.check_and_remember(b"107/0").await.expect("check"),
        Seen::Duplicate
    );
    assert_eq!(
        window.check_and_remember(b"102/0").await.expect("check"),
        Seen::New
    );
    assert_eq!(
        window.check_and_remember(b"108/0").await.expect("check"),
        Seen::New
    );
}
