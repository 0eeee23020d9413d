//! A user-written sink with an effect that cannot be made idempotent — here,
//! "sending a notification", which appends a line to a file (think: calling a
//! webhook or sending a mail) — made effectively-once with `oncely-dedup`.
//!
//! # Why dedup is needed
//!
//! The runner delivers every record at least once: after a crash, the records
//! applied since the last committed offset come again. A warehouse upsert with
//! a version check absorbs that; a notification would go out twice. So the sink
//! gives each event a stable identity — topic, key and source version
//! (commit LSN / event ordinal) — and keeps the identities it already handled
//! in a Redis window that survives restarts:
//!
//! 1. `contains(id)`: already notified? skip it.
//! 2. Send the notification.
//! 3. `remember(id)`.
//!
//! The remaining gap is a crash between 2 and 3: that one notification is sent
//! again (at least once, never lost). Swap 1 and 3 for `check_and_remember`
//! before sending to get at-most-once instead. Identities older than the
//! window's TTL are forgotten: a redelivery later than that is sent again.
//!
//! # Run it
//!
//! ```sh
//! scripts/services up && eval "$(scripts/services env)"
//! cargo run --example custom_sink -- <topic> [notifications.txt]
//! ```
//!
//! It consumes `<topic>` as group `custom-sink-example` and stops on Ctrl-C.
//!
//! # Checked by the conformance kit
//!
//! Each notification is one JSON line (`id`, `op`, `key`, `after`), so the
//! file folds back into rows; `cargo test --example custom_sink` (part of
//! `scripts/test`: the example is `test = true` in Cargo.toml) runs
//! `oncely_sinks::conformance` against it — replays, a crash with redelivery,
//! a rebalance with a late old owner — and the rows must come out exact.
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_dedup::{RedisWindow, WindowStore};
use oncely_sinks::runner::dedup::window_error as dedup_error;
use oncely_sinks::{Batch, Runner, RunnerConfig, Sink, SinkError};

/// Notifies about every change (create, update, delete), once per event.
struct NotifySink {
    window: RedisWindow,
    out: PathBuf,
}

impl NotifySink {
    /// The non-idempotent effect.
    async fn notify(&self, line: String) -> Result<(), SinkError> {
        let out = self.out.clone();
        tokio::task::spawn_blocking(move || {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out)?;
            writeln!(f, "{line}")
        })
        .await
        .map_err(|e| SinkError::fatal_from("notify task", e))?
        .map_err(|e| SinkError::retriable_from("notify", e))
    }
}

#[async_trait]
impl Sink for NotifySink {
    fn name(&self) -> &str {
        "notify"
    }

    /// Records of one partition arrive in order; a retried batch is skipped
    /// record by record thanks to the window.
    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        for record in batch.records() {
            let Some(event) = record.event() else {
                continue;
            }; // tombstone
            let key = record
                .key
                .as_ref()
                .map(|k| k.to_string())
                .unwrap_or_default();
            let id = format!("{}/{key}/{}", batch.topic(), event.version);
            if self
                .window
                .contains(id.as_bytes())
                .await
                .map_err(dedup_error)?
            {
                continue;
            }
            let line = serde_json::json!({
                "id": id,
                "op": event.op.code(),
                "key": record.key,
                "after": event.after,
            });
            self.notify(line.to_string()).await?;
            self.window
                .remember(id.as_bytes())
                .await
                .map_err(dedup_error)?;
        }
        Ok(())
    }
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set: eval \"$(scripts/services env)\""))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let topic = args
        .next()
        .ok_or("usage: custom_sink <topic> [notifications.txt]")?;
    let out = PathBuf::from(args.next().unwrap_or_else(|| "notifications.txt".into()));
    let window = RedisWindow::connect(
        &env("ONCELY_REDIS_URL")?,
        "oncely:example:notify:",
        Duration::from_secs(24 * 3600),
    )
    .await?;
    let mut config = RunnerConfig::new(
        env("ONCELY_KAFKA_BROKERS")?,
        "custom-sink-example",
        vec![topic],
    );
    config.batch_max_records = 100;
    let runner = Runner::new(config, Arc::new(NotifySink { window, out }))?;
    runner.run_until_signal().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::wire::UNAVAILABLE_VALUE as UNAVAILABLE;
    use oncely_sinks::conformance::{self, Rows, Target};
    use oncely_sinks::error::BoxError;

    /// The notifications file folded into rows, a fresh sink per call over the same window.
    struct Notifications {
        prefix: String,
        out: PathBuf,
    }

    #[async_trait]
    impl Target for Notifications {
        async fn sink(&self) -> Result<Arc<dyn Sink>, SinkError> {
            let url = env("ONCELY_REDIS_URL").map_err(SinkError::fatal)?;
            let window = RedisWindow::connect(&url, &self.prefix, Duration::from_secs(600))
                .await
                .map_err(dedup_error)?;
            Ok(Arc::new(NotifySink {
                window,
                out: self.out.clone(),
            }))
        }

        async fn rows(&self, topic: &str) -> Result<Rows, BoxError> {
            let mut rows = Rows::new();
            for line in std::fs::read_to_string(&self.out)?.lines() {
                let n: serde_json::Value = serde_json::from_str(line)?;
                let ours = n["id"].as_str().and_then(|i| i.strip_prefix(topic));
                if !ours.is_some_and(|rest| rest.starts_with('/')) {
                    continue;
                }
                let id = n["key"]["id"].as_u64().ok_or("no key id")?;
                if n["op"] == "d" {
                    rows.remove(&id);
                    continue;
                }
                let row = rows.entry(id).or_default();
                for (column, value) in n["after"].as_object().ok_or("no after")? {
                    if value != UNAVAILABLE {
                        row.insert(column.clone(), value.clone());
                    }
                }
            }
            Ok(rows)
        }
    }

    #[tokio::test]
    async fn the_example_sink_passes_the_conformance_kit() {
        let run = format!("{:016x}", rand::random::<u64>());
        let target = Notifications {
            prefix: format!("oncely:test:notify:{run}:"),
            out: std::env::temp_dir().join(format!("oncely-notify-{run}.jsonl")),
        };
        let result = conformance::check(&target, &format!("conf_{run}")).await;
        let _ = std::fs::remove_file(&target.out);
        result.expect("conforms");
    }
}
