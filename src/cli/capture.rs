use std::path::PathBuf;

use anyhow::Context;
use oncely_capture::config::CaptureConfig;
use oncely_capture::error::CaptureError;
use oncely_capture::metrics::{self, CaptureMetrics};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct CaptureArgs {
    /// Path to the capture configuration (TOML); see examples/capture.toml.
    #[arg(long, short)]
    pub config: PathBuf,
}

/// Runs capture until SIGTERM/SIGINT (commit what is in flight, exit 0) or a fatal error.
pub async fn run(args: CaptureArgs) -> anyhow::Result<()> {
    let cfg = CaptureConfig::load(&args.config)?;
    let metrics = CaptureMetrics::new(cfg.connector_name());
    if let Some(listen) = &cfg.metrics.listen {
        let addr = listen.parse().context("metrics.listen")?;
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, m).await {
                tracing::error!(%addr, "metrics endpoint failed: {e}");
            }
        });
    }
    let shutdown = CancellationToken::new();
    super::cancel_on_signal(shutdown.clone())?;
    match oncely_capture::pipeline::run(cfg, metrics, shutdown).await {
        Ok(()) => Ok(()),
        Err(e @ CaptureError::Fenced { .. }) => Err(anyhow::anyhow!(e)),
        Err(e) => Err(e.into()),
    }
}
