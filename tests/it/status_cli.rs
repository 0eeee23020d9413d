//! `oncely status` against a real pipeline: down before capture runs (no
//! slot), healthy while capture streams and the sinks caught up (slot
//! active, offsets, per-partition positions of each sink's group), degraded
//! when the slot retains more than `slot.max.retained.bytes`, down again once
//! capture is killed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;

use crate::harness::e2e::Pipeline;

/// The sinks this test runs: the warehouse and Redis (indexes in `Pipeline::sinks`).
const RUN: [usize; 2] = [0, 2];

fn status(p: &Pipeline, capture: &Path, args: &[&str]) -> Result<(i32, String)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oncely"));
    cmd.arg("status").arg("--capture").arg(capture);
    for i in RUN {
        cmd.arg("--sink").arg(&p.sinks[i]);
    }
    let out = cmd
        .args(args)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Runs `status --json` until `done` holds for (exit code, JSON).
fn wait_status(
    p: &Pipeline,
    capture: &Path,
    what: &str,
    done: impl Fn(i32, &Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (code, out) = status(p, capture, &["--json"])?;
        let json: Value = serde_json::from_str(&out)
            .map_err(|e| anyhow::anyhow!("status --json is not JSON ({e}):\n{out}"))?;
        if done(code, &json) {
            return Ok(json);
        }
        if Instant::now() > deadline {
            bail!("{what}: never reached; last exit {code}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_tells_healthy_degraded_and_down() -> Result<()> {
    let p = Pipeline::new(
        "status_cli",
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        &["t"],
        "",
    )
    .await?;
    let capture_config = p.capture_config.clone();
    let (code, out) = status(&p, &capture_config, &[])?;
    assert_eq!(code, 2, "no slot yet is down:\n{out}");
    assert!(
        out.contains("MISSING") && out.contains("status: down"),
        "{out}"
    );

    let capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g")
        .await?;
    let sinks: Vec<_> = RUN
        .iter()
        .map(|&i| p.spawn_sink(i))
        .collect::<Result<_, _>>()?;
    let healthy = wait_status(&p, &capture_config, "healthy and caught up", |code, j| {
        code == 0
            && j["sinks"].as_array().is_some_and(|sinks| {
                sinks.iter().all(|s| {
                    s["partitions"].as_array().is_some_and(|ps| {
                        !ps.is_empty()
                            && ps.iter().all(|p| {
                                p["position"].is_i64()
                                    && p["lag_offsets"].as_i64() <= Some(1)
                                    && p["lag_seconds"] == 0.0
                            })
                    })
                })
            })
    })?;
    assert_eq!(healthy["health"], "healthy", "{healthy:#}");
    assert_eq!(healthy["slot"]["active"], true, "{healthy:#}");
    assert!(
        healthy["capture"]["lag_seconds"]
            .as_f64()
            .is_some_and(|s| (0.0..60.0).contains(&s)),
        "capture's lag in seconds, from its walsender: {healthy:#}"
    );
    assert!(
        healthy["capture"]["committed_lsn"].is_string(),
        "{healthy:#}"
    );
    for (n, &i) in RUN.iter().enumerate() {
        assert_eq!(
            healthy["sinks"][n]["group"],
            p.sink_group(i)?,
            "{healthy:#}"
        );
        assert_eq!(healthy["sinks"][n]["dead_letters"], 0, "{healthy:#}");
    }
    let (code, text) = status(&p, &capture_config, &[])?;
    assert_eq!(code, 0, "{text}");
    eprintln!("{text}");
    assert!(
        text.contains(&format!("slot {}: active", p.env.slot))
            && text.ends_with("status: healthy\n"),
        "{text}"
    );

    // The same pipeline under a limit its slot is above.
    let strict = p.env.write_config(
        "capture-strict.toml",
        &format!(
            "{}\nslot.max.retained.bytes = 1\n",
            std::fs::read_to_string(&capture_config)?
        ),
    )?;
    let degraded = wait_status(&p, &strict, "degraded", |code, _| code == 1)?;
    assert_eq!(degraded["health"], "degraded", "{degraded:#}");
    assert!(
        degraded["problems"][0]["problem"]
            .as_str()
            .is_some_and(|w| w.contains("slot.max.retained.bytes = 1")),
        "{degraded:#}"
    );

    // Redis's sink stopped: its partition falls behind, in offsets and in time.
    let mut sinks = sinks;
    drop(sinks.pop());
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(501, 510) g")
        .await?;
    let behind = wait_status(&p, &capture_config, "redis behind", |code, j| {
        code == 0
            && j["sinks"][1]["partitions"][0]["lag_offsets"].as_i64() > Some(1)
            && j["sinks"][1]["partitions"][0]["lag_seconds"].as_f64() > Some(0.5)
    })?;
    assert!(
        behind["sinks"][0]["partitions"][0]["lag_seconds"].as_f64() < Some(60.0),
        "{behind:#}"
    );

    assert!(
        behind["sinks"][1]["partitions"][0]["lag_source_seconds"].as_f64()
            >= behind["sinks"][1]["partitions"][0]["lag_seconds"].as_f64(),
        "a change commits at the source before it reaches Kafka: {behind:#}"
    );

    // Lag in source time counts capture's delay too: with capture and the
    // warehouse's sink stopped, rows committed now reach Kafka only once
    // capture is back, seconds later; the warehouse is that much staler
    // than the time they have spent in Kafka.
    wait_status(&p, &capture_config, "warehouse caught up", |_, j| {
        j["sinks"][0]["partitions"][0]["lag_offsets"].as_i64() <= Some(1)
    })?;
    drop(sinks);
    drop(capture);
    p.env
        .client
        .batch_execute("INSERT INTO t SELECT g, 'x' || g FROM generate_series(511, 520) g")
        .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let capture = p.spawn_capture()?;
    let stale = wait_status(&p, &capture_config, "warehouse stale", |_, j| {
        let part = &j["sinks"][0]["partitions"][0];
        part["lag_offsets"].as_i64() > Some(1) && part["lag_source_seconds"].as_f64() >= Some(4.0)
    })?;
    let part = &stale["sinks"][0]["partitions"][0];
    assert!(
        part["lag_seconds"].as_f64().unwrap_or(f64::MAX)
            < part["lag_source_seconds"].as_f64().unwrap_or(0.0) - 2.0,
        "time in Kafka leaves out the seconds capture was stopped: {stale:#}"
    );

    drop(capture);
    let down = wait_status(&p, &capture_config, "down", |code, _| code == 2)?;
    assert!(
        down["capture"]["lag_seconds"].is_null(),
        "no walsender, no measured lag: {down:#}"
    );
    assert!(
        down["problems"]
            .to_string()
            .contains("capture is not streaming"),
        "{down:#}"
    );
    p.cleanup().await;
    Ok(())
}
