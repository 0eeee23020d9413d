//! A real HTTP/1.1 webhook receiver for tests: listens on 127.0.0.1, records
//! every request, and applies each `Idempotency-Key` once (a repeat is
//! answered 200 and counted as a duplicate, as a receiver honouring the key
//! does). Answers can be scripted per key: a fixed status for ever, or a list
//! of answers for the first requests. `GET /stats` answers its counts as
//! JSON. `examples/webhook_receiver.rs` serves it as a process (the demo and
//! the webhook benchmark use that).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One answer: status, extra headers, body.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn new(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Request {
    pub key: String,
    pub authorization: Option<String>,
    pub body: Value,
    pub at: Instant,
    pub status: u16,
}

#[derive(Default)]
struct State {
    requests: Vec<Request>,
    /// Keys applied, in the order they were first applied.
    applied: Vec<String>,
    applied_set: HashSet<String>,
    /// Bodies of the requests applied, in that order.
    applied_bodies: Vec<Value>,
    duplicates: u64,
    /// Keep each request and applied body (tests); off, only keys and counts.
    keep: bool,
    /// Requests answered, kept or not.
    request_count: u64,
    /// When the first and the latest webhook request arrived.
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    always: HashMap<String, Answer>,
    first: HashMap<String, VecDeque<Answer>>,
}

/// The receiver; dropped, it keeps serving until the test process ends.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    url: String,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Starts listening on an ephemeral port.
    pub async fn start() -> Self {
        Self::listen(None, "127.0.0.1:0", true).await
    }

    /// Starts listening on `addr`, keeping only the applied keys and the
    /// counts (memory stays small over millions of requests).
    pub async fn start_counting(addr: &str) -> Self {
        Self::listen(None, addr, false).await
    }

    /// Starts listening with TLS, presenting the PEM `cert` chain and `key`.
    pub async fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Self {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("cert file")
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(key).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(oncely_core::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::listen(Some(tls), "127.0.0.1:0", true).await
    }

    async fn listen(tls: Option<tokio_rustls::TlsAcceptor>, addr: &str, keep: bool) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            keep,
            ..State::default()
        }));
        let shared = state.clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (shared, tls) = (shared.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve(stream, shared).await,
                        // A refused handshake is the client's to report.
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                serve(stream, shared).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            url: format!("{scheme}://{addr}/hook"),
            addr,
            state,
        }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Answers every request with `key` by `answer` (never applied).
    pub fn always(&self, key: &str, answer: Answer) {
        self.with(|s| s.always.insert(key.to_owned(), answer));
    }

    /// Answers the first requests with `key` by `answers`, in order.
    pub fn first(&self, key: &str, answers: Vec<Answer>) {
        self.with(|s| s.first.insert(key.to_owned(), answers.into()));
    }

    pub fn requests(&self) -> Vec<Request> {
        self.with(|s| s.requests.clone())
    }

    pub fn request_count(&self) -> usize {
        self.with(|s| s.request_count as usize)
    }

    /// From the first webhook request to the latest one.
    pub fn span(&self) -> Option<std::time::Duration> {
        self.with(|s| Some(s.last_at?.duration_since(s.first_at?)))
    }

    /// `{"requests", "applied", "duplicates"}`, as `GET /stats` answers.
    pub fn stats(&self) -> Value {
        self.with(|s| stats(s))
    }

    /// Keys applied, in first-applied order (each once).
    pub fn applied(&self) -> Vec<String> {
        self.with(|s| s.applied.clone())
    }

    pub fn applied_count(&self) -> usize {
        self.with(|s| s.applied.len())
    }

    /// Bodies of the requests applied (first of each key), in that order.
    pub fn applied_bodies(&self) -> Vec<Value> {
        self.with(|s| s.applied_bodies.clone())
    }

    /// Requests whose key had been applied already.
    pub fn duplicates(&self) -> u64 {
        self.with(|s| s.duplicates)
    }
}

fn stats(s: &State) -> Value {
    serde_json::json!({
        "requests": s.request_count,
        "applied": s.applied.len(),
        "duplicates": s.duplicates,
    })
}

async fn serve(stream: impl AsyncRead + AsyncWrite + Unpin, state: Arc<Mutex<State>>) {
    let (read, mut write) = tokio::io::split(stream);
    let mut reader = BufReader::new(read);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let key = headers.get("idempotency-key").cloned().unwrap_or_default();
        // An HTTP/1.0 client (the demo's `GET /stats`) reads until the connection closes.
        let close = line.trim_end().ends_with("HTTP/1.0")
            || headers
                .get("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let answer = {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            if line.starts_with("GET /stats") {
                Answer::new(200, &stats(&s).to_string())
            } else {
                webhook_answer(&mut s, key, &headers, &body)
            }
        };
        let mut out = format!(
            "HTTP/1.1 {} X\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n",
            answer.status,
            answer.body.len()
        );
        for (n, v) in &answer.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&answer.body);
        if write.write_all(out.as_bytes()).await.is_err() || write.flush().await.is_err() || close {
            let _ = write.shutdown().await;
            return;
        }
    }
}

/// Answers one webhook request (scripted, or 200 and applied once per key) and records it.
fn webhook_answer(
    s: &mut State,
    key: String,
    headers: &HashMap<String, String>,
    body: &[u8],
) -> Answer {
    let scripted = s
        .first
        .get_mut(&key)
        .and_then(VecDeque::pop_front)
        .or_else(|| s.always.get(&key).cloned());
    let answer = match scripted {
        Some(a) => a,
        None => {
            if s.applied_set.insert(key.clone()) {
                s.applied.push(key.clone());
                if s.keep {
                    let body = serde_json::from_slice(body).unwrap_or(Value::Null);
                    s.applied_bodies.push(body);
                }
            } else {
                s.duplicates += 1;
            }
            Answer::new(200, "ok")
        }
    };
    s.request_count += 1;
    let now = Instant::now();
    s.first_at.get_or_insert(now);
    s.last_at = Some(now);
    if s.keep {
        s.requests.push(Request {
            key,
            authorization: headers.get("authorization").cloned(),
            body: serde_json::from_slice(body).unwrap_or(Value::Null),
            at: Instant::now(),
            status: answer.status,
        });
    }
    answer
}
