//! Rate-limited warnings: a warning that can repeat per record (hundreds a
//! second) is logged at most `burst` times per `interval`; the occurrences
//! not logged are counted and the next logged line carries the count.
//!
//! One [`LogLimit`] per warning site, usually a `static`:
//!
//! ```
//! use std::time::Duration;
//! use oncely_core::log_limit::LogLimit;
//!
//! static LEFT_OUT: LogLimit = LogLimit::new(Duration::from_secs(10), 5);
//! for id in 0..1000 {
//!     if let Some(suppressed) = LEFT_OUT.admit() {
//!         // tracing::warn!(id, suppressed, "...");
//!         let _ = (id, suppressed);
//!     }
//! }
//! ```

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Admits at most `burst` occurrences per `interval` (see the module docs).
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    burst: u32,
    state: Mutex<Option<Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    admitted: u32,
    /// Occurrences dropped since the last admitted one.
    suppressed: u64,
}

impl LogLimit {
    pub const fn new(interval: Duration, burst: u32) -> Self {
        Self {
            interval,
            burst,
            state: Mutex::new(None),
        }
    }

    /// `Some(n)` when this occurrence is to be logged, `n` being the
    /// occurrences dropped since the last logged one; `None` to drop it.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let w = state.get_or_insert(Window {
            started: now,
            admitted: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(w.started) >= self.interval {
            w.started = now;
            w.admitted = 0;
        }
        if w.admitted < self.burst {
            w.admitted += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }

    /// The interval and burst, to tell them in the logged line.
    pub fn bounds(&self) -> (Duration, u32) {
        (self.interval, self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_logs_a_bounded_number_and_the_next_window_tells_the_count() {
        let limit = LogLimit::new(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        let logged: Vec<u64> = (0..1000)
            .filter_map(|i| limit.admit_at(t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(logged, vec![0, 0, 0], "three lines for a burst of 1000");
        assert_eq!(limit.admit_at(t0 + Duration::from_secs(5)), None);
        assert_eq!(
            limit.admit_at(t0 + Duration::from_secs(11)),
            Some(998),
            "the next window's first line counts what was dropped"
        );
        assert_eq!(limit.admit_at(t0 + Duration::from_secs(12)), Some(0));
    }
}
