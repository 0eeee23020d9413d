use std::path::PathBuf;

#[derive(clap::Args)]
pub struct SinkArgs {
    /// Path to the sink configuration (TOML).
    #[arg(long, short)]
    pub config: PathBuf,
}

pub async fn run(args: SinkArgs) -> anyhow::Result<()> {
    anyhow::bail!("sink is not built yet (config {})", args.config.display())
}
