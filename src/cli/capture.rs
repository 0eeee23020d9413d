use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CaptureArgs {
    /// Path to the capture configuration (TOML).
    #[arg(long, short)]
    pub config: PathBuf,
}

pub async fn run(args: CaptureArgs) -> anyhow::Result<()> {
    anyhow::bail!("capture is not built yet (config {})", args.config.display())
}
