//! `oncely sink --config sink.toml`: run a configured sink until SIGTERM/SIGINT.
use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct SinkArgs {
    /// Path to the sink configuration (TOML); see examples/sink.toml.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Start partitions whose stored position Kafka has deleted (retention)
    /// at the log's start, after the tables of their topics were snapshotted
    /// again (`oncely capture snapshot --table ...`); without it such a
    /// partition stops, reported by `/readyz` and `oncely status`.
    #[arg(long)]
    pub resume_after_gap: bool,
}

/// Loads and validates the configuration, builds the sink, runs it.
/// Exits 0 after a graceful stop, non-zero on a configuration or fatal error.
pub async fn run(args: SinkArgs) -> anyhow::Result<()> {
    // Listening before anything else: a SIGTERM while the sink connects (an
    // orchestrator stopping a starting pod) is a graceful stop too, not a
    // death by the signal's default action.
    let stop = tokio_util::sync::CancellationToken::new();
    oncely_core::shutdown::cancel_on_signal(stop.clone())?;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    let (mut runner_config, sink_config) = oncely_sinks::kinds::parse_config(&text)
        .with_context(|| format!("invalid configuration in {}", args.config.display()))?;
    // Checked before the sink connects: a wrong path is a start-up error.
    let signals = match (
        &runner_config.gap_recovery,
        &runner_config.gap_capture_config,
    ) {
        (oncely_sinks::config::GapRecovery::Snapshot, Some(path)) => {
            // Relative to the sink configuration's folder unless absolute.
            let path = args
                .config
                .parent()
                .map_or_else(|| path.clone(), |dir| dir.join(path));
            Some(super::gap::CaptureSignals::load(
                &path,
                &runner_config.group_id,
            )?)
        }
        _ => None,
    };
    let sink = tokio::select! {
        sink = sink_config.build() => sink.context("cannot start the sink")?,
        _ = stop.cancelled() => return Ok(()),
    };
    runner_config.resume_after_gap = args.resume_after_gap;
    let mut runner = oncely_sinks::Runner::new(runner_config, sink)?;
    if let Some(signals) = signals {
        runner = runner.with_snapshot_signals(std::sync::Arc::new(signals));
    }
    runner.run(stop).await?;
    Ok(())
}
