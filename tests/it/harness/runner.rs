//! Running `oncely sink` as a process in tests: config files, spawn, signals, exit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use oncely_sinks::kinds::journal::read_journal;
use serde_json::Value;

/// A scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Writes a sink.toml with the runner keys and `[kafka]`/`[sink]` tables given as TOML text.
pub fn write_config(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, body).expect("write config");
    path
}

/// Starts `oncely sink --config <config>`, logs (info) to `log`.
pub fn spawn_runner(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("sink")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn oncely sink")
}

/// Sends SIGTERM.
pub fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success(), "kill -TERM failed");
}

/// Waits for the process to exit, at most `timeout`.
pub async fn wait_exit(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "runner did not exit within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILLs the process and reaps it.
pub async fn sigkill(child: &mut Child) {
    child.kill().expect("SIGKILL");
    wait_exit(child, Duration::from_secs(10)).await;
}

/// The runner keys shared by the process tests.
pub fn runner_keys(brokers: &str, group: &str, topic: &str) -> String {
    format!(
        "bootstrap.servers = \"{brokers}\"\ngroup.id = \"{group}\"\ntopics = [\"{topic}\"]\n\
         batch.max.records = 25\nbatch.max.ms = 20\nshutdown.timeout.ms = 10000\n"
    )
}

/// (partition, offset) -> how many times applied, from a journal.
pub fn journal_counts(path: &Path, group: &str) -> HashMap<(i32, i64), u32> {
    let mut counts = HashMap::new();
    for entry in read_journal(path)
        .expect("read journal")
        .into_iter()
        .filter(|e| e.group == group)
    {
        for r in &entry.records {
            let offset = r.get("offset").and_then(Value::as_i64).expect("offset");
            *counts.entry((entry.partition, offset)).or_insert(0) += 1;
        }
    }
    counts
}
