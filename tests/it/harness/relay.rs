//! A TCP relay in front of a service, for tests that make the service's
//! connection fail or slow: cut (listener and every connection gone) and
//! opened again on the same port, or its replies held to a byte rate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Relay {
    pub addr: SocketAddr,
    upstream: SocketAddr,
    /// Bytes per second of the service's replies; 0: as fast as they come.
    rate: Arc<AtomicU64>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    /// A relay to `upstream` (host and port) on a port of its own.
    pub async fn start(host: &str, port: u16) -> Result<Self> {
        let upstream = tokio::net::lookup_host((host, port))
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("no address for {host}:{port}"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let relay = Relay {
            addr: listener.local_addr()?,
            upstream,
            rate: Arc::default(),
            tasks: Arc::default(),
        };
        relay.serve(listener);
        Ok(relay)
    }

    fn serve(&self, listener: TcpListener) {
        let (tasks, upstream, rate) = (self.tasks.clone(), self.upstream, self.rate.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conn = tokio::spawn(relay(client, upstream, rate.clone()));
                tasks.lock().expect("tasks").push(conn);
            }
        });
        self.tasks.lock().expect("tasks").push(accept);
    }

    /// Holds the service's replies, on every connection, to
    /// `bytes_per_second` from now (0: no limit). A test slows a binlog
    /// stream this way so a kill lands inside a transaction however late
    /// the test looks: what capture has not received it cannot publish.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.rate.store(bytes_per_second, Ordering::Relaxed);
    }

    /// Closes the listener and every connection.
    pub fn cut(&self) {
        for t in self.tasks.lock().expect("tasks").drain(..) {
            t.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn reopen(&self) -> Result<()> {
        self.serve(TcpListener::bind(self.addr).await?);
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Relays one connection until either side closes it.
async fn relay(client: TcpStream, upstream: SocketAddr, rate: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let requests = tokio::io::copy(&mut from_client, &mut to_server);
    let replies = async {
        // Small reads: a read waiting when the rate is set passes its
        // bytes at the old rate.
        let mut buf = vec![0u8; 4096];
        loop {
            let limit = rate.load(Ordering::Relaxed);
            // A twentieth of a second's worth at a time when held.
            let most = match limit {
                0 => buf.len(),
                l => (l / 20).clamp(1, buf.len() as u64) as usize,
            };
            let n = match from_server.read(&mut buf[..most]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
            if limit > 0 {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / limit as f64)).await;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        () = replies => {}
    }
}

#[tokio::test]
async fn relays_both_ways_and_holds_replies_to_the_rate() -> Result<()> {
    let echo = TcpListener::bind("127.0.0.1:0").await?;
    let port = echo.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let relay = Relay::start("127.0.0.1", port).await?;
    let mut c = TcpStream::connect(relay.addr).await?;
    c.write_all(b"hello").await?;
    let mut got = [0u8; 5];
    c.read_exact(&mut got).await?;
    assert_eq!(&got, b"hello");
    relay.throttle(2_000);
    let started = std::time::Instant::now();
    c.write_all(&[7u8; 6_000]).await?;
    let mut back = vec![0u8; 6_000];
    c.read_exact(&mut back).await?;
    // At most the 4096 bytes of a read already waiting pass at once.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    relay.throttle(0);
    relay.cut();
    let mut rest = Vec::new();
    assert_eq!(
        c.read_to_end(&mut rest).await?,
        0,
        "cut closes the connection"
    );
    Ok(())
}
