//! The one HTTP listener of every process: `/metrics` (Prometheus text),
//! `/healthz` (alive) and `/readyz` (connected and making progress).
//!
//! # Contract
//!
//! * [`bind`] sets `SO_REUSEADDR`, so a process restarted at once after a
//!   SIGKILL gets its port back although connections of the killed one linger
//!   in `TIME_WAIT`; an address still in use (the killed process not yet
//!   reaped) is tried again for [`BIND_RETRY`]. A failure after that is a
//!   start-up error naming the address and the configuration key, never a
//!   process running without its endpoint.
//! * [`serve`] answers until its token fires. Accept errors (too many open
//!   files, a connection reset before it was accepted) are logged and the
//!   listener goes on; one request per connection, each bounded in time and
//!   size on a task of its own. At most [`MAX_CONNECTIONS`] are served at
//!   once: a connection is accepted only when a slot is free (the others wait
//!   in the listen backlog), and one that sends no request within
//!   [`READ_TIMEOUT`] is closed, so idle connections cannot hold the slots
//!   (nor tasks and memory without bound) and a probe behind them is answered.
//! * `/healthz` is 200 while the process runs. `/readyz` is 200 `ready` when
//!   [`Probe::ready`] says so, else 503 with its plain-text reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How long an address still in use is tried again before start-up fails.
pub const BIND_RETRY: Duration = Duration::from_secs(5);
/// How long one connection may take to be answered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once: probes and scrapers need a few.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read.
const MAX_REQUEST_BYTES: usize = 4096;

/// What the listener asks its process.
pub trait Probe: Send + Sync + 'static {
    /// The Prometheus text exposition of the process's metrics.
    fn metrics(&self) -> Vec<u8>;
    /// `Ok` when the process is connected and making progress, else why not
    /// (one short line, shown as the 503 body).
    fn ready(&self) -> Result<(), String>;
}

/// One metric a process registers, as the metrics table of docs/operating.md lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricInfo {
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Label names, constant ones (capture's `connector`) included, sorted.
    pub labels: Vec<String>,
    pub help: String,
}

/// The listener could not be opened: a start-up error.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (set by `{key}`): {source}; choose a free address or stop the process holding it")]
pub struct BindError {
    pub addr: SocketAddr,
    /// The configuration key the address comes from.
    pub key: String,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` (from configuration key `key`) with `SO_REUSEADDR`, trying an
/// address in use again for up to [`BIND_RETRY`].
pub async fn bind(addr: SocketAddr, key: &str) -> Result<TcpListener, BindError> {
    let deadline = Instant::now() + BIND_RETRY;
    loop {
        match try_bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(source) => {
                return Err(BindError {
                    addr,
                    key: key.to_owned(),
                    source,
                })
            }
        }
    }
}

fn try_bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

/// Serves `/metrics`, `/healthz` and `/readyz` (anything else is 404) until
/// `stop` fires.
pub async fn serve(listener: TcpListener, probe: Arc<dyn Probe>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot before accepting: beyond the bound, connections wait in the
        // listen backlog rather than in tasks.
        let slot = tokio::select! {
            _ = stop.cancelled() => return,
            s = slots.clone().acquire_owned() => match s {
                Ok(slot) => slot,
                Err(_) => return, // never closed
            },
        };
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let probe = probe.clone();
                // Detached on purpose: each connection ends within the timeout.
                drop(tokio::spawn(async move {
                    let _slot = slot;
                    let answer = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &*probe));
                    if let Ok(Err(e)) = answer.await {
                        tracing::debug!("metrics connection: {e}");
                    }
                }));
            }
            Err(e) => {
                tracing::warn!("metrics listener: {e} (still listening)");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(mut stream: TcpStream, probe: &dyn Probe) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf[len..]))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no request within {READ_TIMEOUT:?}"),
                )
            })??;
        if n == 0 {
            break;
        }
        len += n;
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next(), parts.next());
    // Probes may add a query string.
    let path = path.map(|p| p.split('?').next().unwrap_or(p));
    let (status, content_type, body) = match (method, path) {
        (Some("GET"), Some("/metrics")) => ("200 OK", "text/plain; version=0.0.4", probe.metrics()),
        (Some("GET"), Some("/healthz")) => ("200 OK", "text/plain", b"ok\n".to_vec()),
        (Some("GET"), Some("/readyz")) => match probe.ready() {
            Ok(()) => ("200 OK", "text/plain", b"ready\n".to_vec()),
            Err(why) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n").into_bytes(),
            ),
        },
        _ => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

/// `GET path` on `addr`: status code and body (for tests and `oncely status`).
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status line")
        })?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Fixed(Mutex<Result<(), String>>);

    impl Probe for Fixed {
        fn metrics(&self) -> Vec<u8> {
            b"oncely_test_total 3\n".to_vec()
        }
        fn ready(&self) -> Result<(), String> {
            self.0.lock().expect("lock").clone()
        }
    }

    #[tokio::test]
    async fn serves_metrics_health_readiness_and_404() {
        let listener = bind("127.0.0.1:0".parse().expect("addr"), "metrics.listen")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let probe = Arc::new(Fixed(Mutex::new(Err("stream not connected".into()))));
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, probe.clone(), stop.clone()));
        assert_eq!(
            get(addr, "/metrics").await.expect("get"),
            (200, "oncely_test_total 3\n".into())
        );
        assert_eq!(get(addr, "/healthz").await.expect("get").0, 200);
        assert_eq!(
            get(addr, "/readyz").await.expect("get"),
            (503, "not ready: stream not connected\n".into())
        );
        *probe.0.lock().expect("lock") = Ok(());
        assert_eq!(get(addr, "/readyz?verbose").await.expect("get").0, 200);
        assert_eq!(get(addr, "/other").await.expect("get").0, 404);
        stop.cancel();
        server.await.expect("server task");
    }

    /// Many connections that never send a request: the listener holds a
    /// bounded number of tasks for them, and a probe still gets its answer
    /// once the idle ones have timed out.
    #[tokio::test]
    async fn idle_connections_hold_bounded_tasks_and_health_still_answers() {
        let listener = bind("127.0.0.1:0".parse().expect("addr"), "metrics.listen")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let tasks = tokio::runtime::Handle::current().metrics();
        let before = tasks.num_alive_tasks();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(Fixed(Mutex::new(Ok(())))),
            stop.clone(),
        ));
        let bound = MAX_CONNECTIONS;
        let mut idle = Vec::new();
        for _ in 0..2 * bound + 8 {
            idle.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // Let the server take what it will, watching the task count.
        let mut most = 0;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            most = most.max(tasks.num_alive_tasks().saturating_sub(before));
        }
        assert!(
            most <= bound + 1,
            "{most} tasks alive for {} idle connections (bound {bound} + the server)",
            idle.len()
        );
        let answer = tokio::time::timeout(Duration::from_secs(20), get(addr, "/healthz"))
            .await
            .expect("/healthz answered behind the idle connections");
        assert_eq!(answer.expect("get").0, 200);
        drop(idle);
        stop.cancel();
        server.await.expect("server task");
    }

    #[tokio::test]
    async fn a_held_port_is_a_bind_error_naming_address_and_key() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
        let addr = held.local_addr().expect("addr");
        let started = Instant::now();
        let err = bind(addr, "metrics.listen").await.expect_err("port in use");
        assert_eq!(err.source.kind(), std::io::ErrorKind::AddrInUse);
        let text = err.to_string();
        assert!(
            text.contains(&addr.to_string()) && text.contains("`metrics.listen`"),
            "{text}"
        );
        assert!(
            started.elapsed() >= BIND_RETRY,
            "tried again before failing"
        );
    }
}
