//! What capture's `/readyz` answers: the replication stream is connected and
//! changes read do not wait longer than `health.ready.max.lag.ms` for their
//! Kafka commit.
//!
//! The pipeline reports; the listener (`oncely_core::endpoint`) asks. An idle
//! capture (nothing read and not committed) is ready however long ago its
//! last commit was.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shared between the pipeline and the listener; cheap to clone.
#[derive(Clone, Debug)]
pub struct CaptureHealth {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    max_lag: Duration,
    stream: Stream,
    /// Since when records read wait for a commit (`None`: nothing waits).
    waiting_since: Option<Instant>,
    last_commit: Option<Instant>,
    /// Why the slot is over `slot.max.retained.bytes`, while it is.
    slot_over: Option<String>,
    /// Tables set aside, each with the reason and the fix.
    quarantined: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
enum Stream {
    Starting,
    Connected,
    Down(String),
}

impl Default for CaptureHealth {
    fn default() -> Self {
        Self::new(Duration::from_millis(
            crate::config::DEFAULT_READY_MAX_LAG_MS,
        ))
    }
}

impl CaptureHealth {
    /// Ready only while changes wait at most `max_lag` for their commit.
    pub fn new(max_lag: Duration) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                max_lag,
                stream: Stream::Starting,
                waiting_since: None,
                last_commit: None,
                slot_over: None,
                quarantined: Vec::new(),
            })),
        }
    }

    /// `health.ready.max.lag.ms` from the configuration.
    pub fn set_max_lag(&self, max_lag: Duration) {
        self.lock().max_lag = max_lag;
    }

    /// The replication stream is up (a new life of the pipeline).
    pub fn connected(&self) {
        let mut s = self.lock();
        s.stream = Stream::Connected;
        s.waiting_since = None;
    }

    /// The pipeline lost its connections and restarts; `why` is the error.
    pub fn down(&self, why: &str) {
        let mut s = self.lock();
        s.stream = Stream::Down(why.to_owned());
        s.waiting_since = None;
    }

    /// Records were read into a Kafka transaction that is not committed yet.
    pub fn waiting(&self) {
        self.lock().waiting_since.get_or_insert_with(Instant::now);
    }

    /// A Kafka transaction committed; what is read after it waits anew.
    pub fn committed(&self) {
        let mut s = self.lock();
        s.last_commit = Some(Instant::now());
        s.waiting_since = None;
    }

    /// The slot retains more WAL than allowed (`Some(why)`), or no longer (`None`).
    pub fn slot_over(&self, why: Option<String>) {
        self.lock().slot_over = why;
    }

    /// The tables quarantined now (`schema.table`, reason and fix).
    pub fn quarantined(&self, tables: Vec<(String, String)>) {
        self.lock().quarantined = tables;
    }

    /// `Ok` when ready, else the reason.
    pub fn ready(&self) -> Result<(), String> {
        self.ready_at(Instant::now())
    }

    fn ready_at(&self, now: Instant) -> Result<(), String> {
        let s = self.lock();
        match &s.stream {
            Stream::Starting => {
                return Err("starting: the replication stream is not connected yet".into())
            }
            Stream::Down(why) => {
                return Err(format!(
                    "the replication stream is not connected (capture retries): {why}"
                ))
            }
            Stream::Connected => {}
        }
        if let Some(why) = &s.slot_over {
            return Err(why.clone());
        }
        if !s.quarantined.is_empty() {
            // Never silent: the other tables flow, but these do not.
            let each: Vec<String> = s
                .quarantined
                .iter()
                .map(|(table, why)| format!("table {table} is quarantined: {why}"))
                .collect();
            return Err(each.join("; "));
        }
        if let Some(since) = s.waiting_since {
            let waited = now.saturating_duration_since(since);
            if waited > s.max_lag {
                let last = s.last_commit.map_or_else(
                    || "none yet".to_owned(),
                    |t| {
                        format!(
                            "{:.0} s ago",
                            now.saturating_duration_since(t).as_secs_f64()
                        )
                    },
                );
                return Err(format!(
                    "changes read have waited {:.0} s for a Kafka commit, longer than health.ready.max.lag.ms = {} (last commit: {last})",
                    waited.as_secs_f64(),
                    s.max_lag.as_millis()
                ));
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_connected_and_commits_keep_up_or_nothing_waits() {
        let h = CaptureHealth::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(h.ready_at(t0).unwrap_err().contains("starting"));
        h.connected();
        assert_eq!(
            h.ready_at(t0 + Duration::from_secs(3600)),
            Ok(()),
            "idle is ready"
        );
        h.waiting();
        h.waiting();
        assert_eq!(h.ready_at(Instant::now() + Duration::from_secs(9)), Ok(()));
        let late = h
            .ready_at(Instant::now() + Duration::from_secs(11))
            .unwrap_err();
        assert!(late.contains("health.ready.max.lag.ms = 10000"), "{late}");
        h.committed();
        assert_eq!(h.ready_at(Instant::now() + Duration::from_secs(11)), Ok(()));
        h.down("connection refused");
        let down = h.ready_at(Instant::now()).unwrap_err();
        assert!(
            down.contains("not connected") && down.contains("connection refused"),
            "{down}"
        );
    }

    /// A quarantined table keeps capture not ready, naming it, the reason and the fix.
    #[test]
    fn a_quarantined_table_is_not_ready_until_released() {
        let h = CaptureHealth::new(Duration::from_secs(10));
        h.connected();
        h.quarantined(vec![(
            "public.bare".into(),
            "no primary key: add one".into(),
        )]);
        let why = h.ready_at(Instant::now()).unwrap_err();
        assert_eq!(
            why,
            "table public.bare is quarantined: no primary key: add one"
        );
        h.quarantined(Vec::new());
        assert_eq!(h.ready_at(Instant::now()), Ok(()));
    }
}
