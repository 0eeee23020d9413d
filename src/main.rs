//! The `oncely` command line: `oncely capture`, `oncely sink`, `oncely verify` and `oncely status`.
use clap::{Parser, Subcommand};

mod cli;

// Decoding and planning allocate many small short-lived values per record;
// glibc's allocator spent a third of a sink's CPU in malloc/free and its
// consolidation passes, mimalloc a fraction of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "oncely",
    version,
    about = "Exactly-once-in-effect CDC: PostgreSQL -> Kafka -> your stores"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stream a PostgreSQL database's committed changes into Kafka, exactly once.
    Capture(cli::capture::CaptureArgs),
    /// Apply change topics from Kafka to a target store, effectively once.
    Sink(cli::sink::SinkArgs),
    /// Compare the source tables with every target, after waiting for them to catch up;
    /// exits non-zero on any difference.
    Verify(cli::verify::VerifyArgs),
    /// Show a pipeline's slot or binlog, capture offset and sink lag; exits 0 healthy,
    /// 1 degraded, 2 down.
    Status(cli::status::StatusArgs),
}

fn main() -> std::process::ExitCode {
    cli::init_tracing();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Capture(args) => cli::capture::run(args).await,
            Command::Sink(args) => cli::sink::run(args).await,
            Command::Verify(args) => cli::verify::run(args).await,
            Command::Status(args) => cli::status::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Told once, as the last line, whatever RUST_LOG filters: a log
            // line as well would say the same thing twice.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
