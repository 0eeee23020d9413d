//! A local webhook receiver as a process, for `scripts/demo`
//! (`ONCELY_DEMO_WEBHOOK=1`) and the webhook benchmark: it answers every
//! POST 200, applies each `Idempotency-Key` once (a repeat is counted as a
//! duplicate, as a receiver honouring the key does) and answers `GET /stats`
//! with `{"requests", "applied", "duplicates"}`. It keeps only keys and
//! counts. Stops on SIGTERM or Ctrl-C, printing its counts.
//!
//! ```sh
//! cargo run --example webhook_receiver -- 127.0.0.1:19480
//! ```

use tokio::signal::unix::{signal, SignalKind};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:19480".into());
    let receiver = oncely_testkit::webhook::Receiver::start_counting(&addr).await;
    println!(
        "webhook receiver at {} (counts at GET /stats)",
        receiver.url()
    );
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    println!("{}", receiver.stats());
    Ok(())
}
