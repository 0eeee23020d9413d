use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use oncely_capture::catalog::mysql::MySqlCatalog;
use oncely_capture::config::{CaptureConfig, SourceKind};
use oncely_capture::error::CaptureError;
use oncely_capture::metrics::{CaptureMetrics, SnapshotView};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CaptureArgs {
    #[command(subcommand)]
    pub action: Option<CaptureAction>,
    /// Path to the capture configuration (TOML); see examples/capture.toml.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum CaptureAction {
    /// Signal a running capture to snapshot tables (or stop, pause, resume
    /// its snapshot): inserts a row into `signal.data.collection`.
    Snapshot(SnapshotArgs),
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The capture configuration whose database and signal table to use.
    #[arg(long, short)]
    pub config: PathBuf,
    /// `schema.table` to snapshot (repeatable); with --stop, the tables to stop.
    #[arg(long = "table", short)]
    pub tables: Vec<String>,
    /// Only rows matching this SQL condition (Debezium's additional-conditions).
    #[arg(long, conflicts_with_all = ["stop", "pause", "resume"])]
    pub filter: Option<String>,
    /// Stop the running snapshot (of --table tables, or entirely).
    #[arg(long, conflicts_with_all = ["pause", "resume"])]
    pub stop: bool,
    /// Pause the running snapshot after the chunk in flight.
    #[arg(long, conflicts_with = "resume")]
    pub pause: bool,
    /// Resume a paused snapshot.
    #[arg(long)]
    pub resume: bool,
}

/// Runs capture until SIGTERM/SIGINT (commit what is in flight, exit 0) or a
/// fatal error, or runs a subcommand.
pub async fn run(args: CaptureArgs) -> anyhow::Result<()> {
    match (args.action, args.config) {
        (Some(CaptureAction::Snapshot(s)), _) => signal(s).await,
        (None, Some(config)) => capture(config).await,
        (None, None) => bail!("--config is required: oncely capture --config capture.toml"),
    }
}

/// The capture configuration at `path`; an error names the file.
fn load(path: &std::path::Path) -> anyhow::Result<CaptureConfig> {
    CaptureConfig::load(path)
        .with_context(|| format!("invalid configuration in {}", path.display()))
}

async fn capture(config: PathBuf) -> anyhow::Result<()> {
    let cfg = load(&config)?;
    let metrics = CaptureMetrics::new(cfg.connector_name());
    metrics.health.set_max_lag(cfg.ready_max_lag());
    let shutdown = CancellationToken::new();
    // Bound before anything connects: a taken address stops the start.
    let endpoint = match &cfg.metrics_listen {
        Some(listen) => {
            let addr = listen.parse().context("metrics.listen")?;
            let listener = oncely_core::endpoint::bind(addr, "metrics.listen").await?;
            tracing::info!(%addr, "metrics at /metrics, health at /healthz and /readyz");
            Some(tokio::spawn(oncely_core::endpoint::serve(
                listener,
                std::sync::Arc::new(metrics.clone()),
                shutdown.clone(),
            )))
        }
        None => None,
    };
    oncely_core::shutdown::cancel_on_signal(shutdown.clone())?;
    let bar = std::io::stderr()
        .is_terminal()
        .then(|| tokio::spawn(progress_bar(metrics.clone(), shutdown.clone())));
    // On a runtime worker, next to the replication stream's reader task: handing
    // each message over stays on one worker thread instead of waking the main one.
    let pipeline = tokio::spawn(oncely_capture::run(cfg, metrics.clone(), shutdown.clone()));
    let result = match pipeline.await {
        Ok(result) => result,
        Err(e) => return Err(anyhow::anyhow!("the capture pipeline task failed: {e}")),
    };
    shutdown.cancel();
    if let Some(bar) = bar {
        let _ = bar.await;
    }
    if let Some(endpoint) = endpoint {
        let _ = endpoint.await;
    }
    match result {
        Ok(()) => Ok(()),
        Err(e @ CaptureError::Fenced { .. }) => Err(anyhow::anyhow!(e)),
        Err(e) => Err(e.into()),
    }
}

/// Draws the snapshot's progress on the terminal while one runs.
async fn progress_bar(metrics: CaptureMetrics, shutdown: CancellationToken) {
    use indicatif::{ProgressBar, ProgressStyle};
    let style = ProgressStyle::with_template(
        "{prefix} [{bar:30}] {pos}/{len} rows ({per_sec}, eta {eta}) {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let mut shown: Option<(String, ProgressBar)> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        let view: Option<SnapshotView> = metrics.snapshot_view.lock().ok().and_then(|v| v.clone());
        match view {
            None => {
                if let Some((_, bar)) = shown.take() {
                    bar.finish_and_clear();
                }
            }
            Some(v) => {
                if shown.as_ref().is_none_or(|(t, _)| *t != v.table) {
                    if let Some((_, bar)) = shown.take() {
                        bar.finish_and_clear();
                    }
                    let bar = ProgressBar::new(v.estimate.unwrap_or(0)).with_style(style.clone());
                    bar.set_prefix(format!("snapshot {}", v.table));
                    shown = Some((v.table.clone(), bar));
                }
                if let Some((_, bar)) = &shown {
                    // reltuples is an estimate: never let the bar read more than done.
                    bar.set_length(v.estimate.unwrap_or(0).max(v.rows));
                    bar.set_position(v.rows);
                    let mut msg = String::new();
                    if v.tables_after > 0 {
                        msg.push_str(&format!("+{} tables", v.tables_after));
                    }
                    if v.paused {
                        msg.push_str(" paused");
                    }
                    bar.set_message(msg);
                }
            }
        }
    }
    if let Some((_, bar)) = shown {
        bar.finish_and_clear();
    }
}

/// Inserts a signal row for the running capture.
async fn signal(args: SnapshotArgs) -> anyhow::Result<()> {
    let cfg = load(&args.config)?;
    let Some(table) = cfg.signal_table() else {
        bail!(
            "{} sets no signal.data.collection: add e.g. signal.data.collection = \"public.oncely_signal\" (a table with columns id, type, data) and restart capture",
            args.config.display()
        );
    };
    let (kind, data) = if args.stop {
        let data = (!args.tables.is_empty())
            .then(|| serde_json::json!({ "data-collections": args.tables }).to_string());
        ("stop-snapshot", data)
    } else if args.pause {
        ("pause-snapshot", None)
    } else if args.resume {
        ("resume-snapshot", None)
    } else {
        if args.tables.is_empty() {
            bail!("name at least one table to snapshot: --table schema.table");
        }
        let mut data =
            serde_json::json!({ "data-collections": args.tables, "type": "incremental" });
        if let Some(filter) = &args.filter {
            // The running capture checks it again; refusing here says why at once.
            oncely_capture::catalog::check_filter(filter)
                .map_err(|why| anyhow::anyhow!("--filter: {why}"))?;
            if cfg.source == SourceKind::Mysql {
                for (db, name) in args.tables.iter().filter_map(|t| t.split_once('.')) {
                    oncely_capture::catalog::mysql::check_filter_on(filter, db, name)
                        .map_err(|why| anyhow::anyhow!("--filter: {why}"))?;
                }
            }
            data["additional-conditions"] = args
                .tables
                .iter()
                .map(|t| serde_json::json!({ "data-collection": t, "filter": filter }))
                .collect();
        }
        ("execute-snapshot", Some(data.to_string()))
    };
    let (schema, name) = table
        .split_once('.')
        .context("signal.data.collection must be schema.table (database.table on MySQL)")?;
    let id = format!(
        "cli-{}-{}",
        oncely_core::clock::now_ms(),
        std::process::id()
    );
    if cfg.source == SourceKind::Mysql {
        let mut catalog = MySqlCatalog::connect(&cfg)
            .await
            .with_context(|| format!("connect to {}", cfg.database_hostname))?;
        catalog
            .insert_signal((schema, name), &id, kind, data.as_deref())
            .await
            .with_context(|| format!("insert the signal into {table}"))?;
    } else {
        let pg = oncely_capture::catalog::pg_config(&cfg, "oncely-capture-signal");
        let client = oncely_capture::catalog::connect_with(&cfg, &pg, "signal")
            .await
            .with_context(|| format!("connect to database {}", cfg.database_dbname))?;
        super::insert_signal(&client, (schema, name), &id, kind, data.as_deref())
            .await
            .with_context(|| format!("insert the signal into {table}"))?;
    }
    println!("signal {id} ({kind}) inserted into {table}; the capture log says what it did");
    Ok(())
}
