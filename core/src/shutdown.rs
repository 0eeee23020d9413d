//! The one SIGTERM/SIGINT listener: `oncely capture`, `oncely sink` and the
//! sink runner stop gracefully on either signal (finish or abandon the batch
//! in flight, commit what is done, exit 0).

use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT. Both are listened to
/// before this returns (not when the task first runs), so a signal right
/// after it is never handled by its default action (death). Abort the
/// returned task to stop listening.
pub fn cancel_on_signal(token: CancellationToken) -> std::io::Result<JoinHandle<()>> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        }
        token.cancel();
    }))
}
