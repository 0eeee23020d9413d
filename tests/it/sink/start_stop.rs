//! `oncely sink` stopped before it consumes anything.

use std::time::Duration;

use oncely_testkit::kafka::{brokers, unique};

use crate::harness::runner::*;

/// A SIGTERM while the sink still connects to its target (an orchestrator
/// stopping a pod that is starting) is a graceful stop: exit 0, not a death
/// by the signal's default action.
#[tokio::test]
async fn a_sigterm_while_the_sink_connects_exits_0() {
    // A target that takes connections and never answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let addr = silent.local_addr().expect("address");
    let dir = scratch(&unique("start_stop"));
    let body = format!(
        "{}[sink]\nkind = \"redis\"\nurl = \"redis://{addr}\"\n",
        runner_keys(&brokers(), &unique("g"), &unique("start_stop"))
    );
    let config = write_config(&dir, "sink", &body);
    let log = dir.join("runner.log");
    let mut child = spawn_runner(&config, &log);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the sink should still be connecting to the silent target; log:\n{}",
        read_log()
    );
    sigterm(&child);
    let status = wait_exit(&mut child, Duration::from_secs(5)).await;
    assert!(
        status.success(),
        "a SIGTERM during start-up exits 0, got {status}; log:\n{}",
        read_log()
    );
    drop(silent);
}
