//! The listener every process runs (`oncely_core::endpoint`): `/metrics`,
//! `/healthz` and `/readyz` after a SIGKILL and an immediate restart on the
//! same port, a taken port as a start-up error, and capture's readiness while
//! PostgreSQL is out of reach. (The sink's readiness under refused Kafka
//! commits: `refused_commits_show_in_metrics_and_are_sent_again_when_idle`
//! in `sinks/tests/it/runner_kafka.rs`.)
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use oncely_core::endpoint::get;

use crate::harness::capture;
use crate::harness::capture::{CaptureEnv, Spawned};
use crate::harness::common;
use crate::harness::relay::Relay;

/// Polls `path` until it answers `status`; the last body.
async fn wait_status(
    addr: SocketAddr,
    path: &str,
    status: u16,
    timeout: Duration,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let answer = get(addr, path).await;
        if let Ok((s, body)) = &answer {
            if *s == status {
                return Ok(body.clone());
            }
        }
        if Instant::now() > deadline {
            bail!("{addr}{path} never answered {status} within {timeout:?}; last: {answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn spawn_sink(config: &Path, log: &Path) -> Result<Spawned> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Ok(Spawned(
        Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(["sink", "--config"])
            .arg(config)
            .env("RUST_LOG", "info,rdkafka=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    ))
}

fn sink_config(env: &CaptureEnv, topic: &str, listen: SocketAddr, extra: &str) -> String {
    format!(
        "bootstrap.servers = \"{}\"\ngroup.id = \"{}-g\"\ntopics = [\"{topic}\"]\nmetrics.listen = \"{listen}\"\n{extra}\n\
         [kafka]\n\"session.timeout.ms\" = \"6000\"\n[sink]\nkind = \"stdout\"\n",
        common::kafka_brokers(),
        env.prefix,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_killed_and_restarted_at_once_serve_metrics_and_health_on_their_port(
) -> Result<()> {
    let env = CaptureEnv::new("health_restart").await?;
    env.client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        .await?;
    let capture_addr = common::free_addr();
    let capture_config = env.write_config(
        "capture.toml",
        &env.config(&format!(
            "metrics.listen = \"{capture_addr}\"\nheartbeat.interval.ms = 500\n"
        )),
    )?;
    let sink_addr = common::free_addr();
    let sink_config_path = env.write_config(
        "sink.toml",
        &sink_config(&env, &env.topic("t"), sink_addr, ""),
    )?;
    let sink_log = env.dir.join("sink.log");

    let mut capture = env.spawn_capture(&capture_config)?;
    env.wait_slot_active().await?;
    wait_status(capture_addr, "/readyz", 200, Duration::from_secs(60)).await?;
    env.client
        .batch_execute("INSERT INTO t VALUES (1, 'a')")
        .await?;
    let mut sink = spawn_sink(&sink_config_path, &sink_log)?;
    wait_status(sink_addr, "/readyz", 200, Duration::from_secs(60)).await?;

    for round in 0..2 {
        // SIGKILL and start again at once, before the killed one is reaped.
        capture.kill()?;
        let next_capture = env.spawn_capture(&capture_config)?;
        sink.kill()?;
        let next_sink = spawn_sink(&sink_config_path, &sink_log)?;
        capture.wait()?;
        sink.wait()?;
        capture = next_capture;
        sink = next_sink;
        for (addr, name, metric) in [
            (capture_addr, "capture", "oncely_capture_events_total"),
            (
                sink_addr,
                "sink",
                "oncely_sink_offset_commit_failures_total",
            ),
        ] {
            wait_status(addr, "/healthz", 200, Duration::from_secs(30)).await?;
            let metrics = wait_status(addr, "/metrics", 200, Duration::from_secs(5)).await?;
            assert!(
                metrics.contains(metric),
                "round {round}: {name} metrics lack {metric}:\n{metrics}"
            );
            wait_status(addr, "/readyz", 200, Duration::from_secs(90)).await?;
        }
        assert!(
            capture.try_wait()?.is_none(),
            "capture exited:\n{}",
            env.capture_log()
        );
        assert!(sink.try_wait()?.is_none(), "sink exited");
        env.client
            .execute("INSERT INTO t VALUES ($1, 'b')", &[&(round + 10)])
            .await?;
    }
    let log = env.capture_log();
    assert!(!log.contains("metrics endpoint failed"), "{log}");
    drop(capture);
    drop(sink);
    env.cleanup().await;
    Ok(())
}

/// Runs `oncely <args>` until it exits (at most `timeout`): success and stderr.
fn run_until_exit(args: &[&str], config: &Path, timeout: Duration) -> Result<(bool, String)> {
    let err = config.with_extension("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err)?)
        .spawn()?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() > deadline {
            capture::kill9(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    Ok(match status {
        Some(s) => (s.success(), text),
        None => (false, format!("still running after {timeout:?}:\n{text}")),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_stops_start_up_naming_the_address_and_key() -> Result<()> {
    let env = CaptureEnv::new("health_taken").await?;
    env.client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await?;
    let held = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = held.local_addr()?;
    let capture = env.write_config(
        "capture.toml",
        &env.config(&format!("metrics.listen = \"{addr}\"\n")),
    )?;
    let sink = env.write_config("sink.toml", &sink_config(&env, &env.topic("t"), addr, ""))?;
    for (args, config) in [
        (["capture", "--config"], &capture),
        (["sink", "--config"], &sink),
    ] {
        let (ok, stderr) = run_until_exit(&args, config, Duration::from_secs(30))?;
        assert!(!ok, "{args:?} started on a taken port:\n{stderr}");
        assert!(
            stderr.contains(&format!("cannot listen on {addr}"))
                && stderr.contains("`metrics.listen`")
                && stderr.contains("in use"),
            "{args:?}: {stderr}"
        );
    }
    drop(held);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_is_not_ready_while_it_cannot_reach_postgres() -> Result<()> {
    let env = CaptureEnv::new("health_pg").await?;
    env.client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await?;
    let proxy = Relay::start(&env.pg_host, env.pg_port).await?;
    let addr = common::free_addr();
    let text = env
        .config(&format!(
            "metrics.listen = \"{addr}\"\nheartbeat.interval.ms = 500\n"
        ))
        .replace(
            &format!(
                "database.hostname = \"{}\"\ndatabase.port = {}",
                env.pg_host, env.pg_port
            ),
            &format!(
                "database.hostname = \"127.0.0.1\"\ndatabase.port = {}",
                proxy.addr.port()
            ),
        );
    assert!(text.contains(&proxy.addr.port().to_string()), "{text}");
    let config = env.write_config("capture.toml", &text)?;
    let capture = env.spawn_capture(&config)?;
    wait_status(addr, "/readyz", 200, Duration::from_secs(90)).await?;

    proxy.cut();
    let why = wait_status(addr, "/readyz", 503, Duration::from_secs(30)).await?;
    assert!(why.contains("not connected"), "{why}");
    assert_eq!(get(addr, "/healthz").await?.0, 200, "alive while not ready");

    proxy.reopen().await?;
    wait_status(addr, "/readyz", 200, Duration::from_secs(90)).await?;
    drop(capture);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_retaining_more_than_slot_max_retained_bytes_is_reported() -> Result<()> {
    let env = CaptureEnv::new("health_slot").await?;
    env.client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        .await?;
    let addr = common::free_addr();
    let config = |limit: u64| {
        env.config(&format!(
            "metrics.listen = \"{addr}\"\nheartbeat.interval.ms = 200\nslot.max.retained.bytes = {limit}\n"
        ))
    };
    let path = env.write_config("capture.toml", &config(4096))?;
    let capture = env.spawn_capture(&path)?;
    env.wait_slot_active().await?;
    wait_status(addr, "/healthz", 200, Duration::from_secs(30)).await?;
    // About 2.5 MB of WAL: the slot keeps it until the server logs its
    // running transactions again and capture confirms past them.
    env.client
        .batch_execute("INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(1, 2000) g")
        .await?;
    let why = wait_status(addr, "/readyz", 503, Duration::from_secs(30)).await?;
    assert!(
        why.contains(&format!("replication slot {} retains", env.slot))
            && why.contains("slot.max.retained.bytes = 4096"),
        "{why}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env
        .capture_log()
        .contains("more than slot.max.retained.bytes = 4096")
    {
        assert!(
            Instant::now() < deadline,
            "no error logged:\n{}",
            env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.capture_log()
            .lines()
            .filter(|l| l.contains("more than slot.max.retained.bytes"))
            .count()
            <= 1,
        "the error is rate-limited:\n{}",
        env.capture_log()
    );
    drop(capture);

    // A limit the slot stays below: ready, the metric at 0.
    std::fs::write(&path, config(1 << 30))?;
    let capture = env.spawn_capture(&path)?;
    wait_status(addr, "/readyz", 200, Duration::from_secs(60)).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = get(addr, "/metrics").await?.1;
        if metrics
            .lines()
            .any(|l| l.starts_with("oncely_capture_slot_over_limit{") && l.ends_with(" 0"))
            && metrics.contains("oncely_capture_slot_max_retained_bytes")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(capture);
    env.cleanup().await;
    Ok(())
}
