//! `oncely status --capture capture.toml --sink sink.toml...`: the slot
//! (PostgreSQL) or the binlog (MySQL/MariaDB), capture's committed offset
//! against it and each sink's lag and dead letters; exit 0 healthy, 1
//! degraded, 2 down.
use std::path::PathBuf;

use oncely::status::{self, Options};

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The capture configuration (source database, slot or binlog, topics).
    #[arg(long)]
    pub capture: PathBuf,
    /// A sink configuration (postgres, elasticsearch or redis); repeat for each.
    #[arg(long = "sink")]
    pub sinks: Vec<PathBuf>,
    /// Offsets a sink may be behind its topics' ends before it counts as degraded.
    #[arg(long, default_value_t = 100_000)]
    pub max_lag: i64,
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints the status and exits with its code (2 when it cannot be read).
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let result = status::run(&Options {
        capture: args.capture,
        sinks: args.sinks,
        max_lag: args.max_lag,
    })
    .await;
    let code = match result {
        Ok(s) => {
            if args.json {
                println!("{:#}", s.to_json());
            } else {
                println!("{s}");
            }
            s.health().code()
        }
        Err(e) => {
            let why = format!("cannot read the pipeline's status: {e}");
            if args.json {
                println!(
                    "{:#}",
                    serde_json::json!({"health": "down", "problems": [{"severity": "down", "problem": why}]})
                );
            } else {
                println!("DOWN: {why}\nstatus: down");
            }
            2
        }
    };
    std::process::exit(code)
}
