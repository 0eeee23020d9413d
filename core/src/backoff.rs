//! Jittered, capped exponential backoff, and a retry loop that keeps the caller's error.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// Exponential backoff: each delay doubles up to `max`; the delay actually slept
/// is drawn uniformly from `[d/2, d]` ("equal jitter"), so that runners retrying
/// together spread out while the delay still grows.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max` (`max` is raised to `initial` if lower).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The un-jittered delay the next call to [`Backoff::next_delay`] is based on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// The next delay to sleep, with jitter; advances the exponential.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        let half = base / 2;
        let spread = base.saturating_sub(half);
        let nanos = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if nanos == 0 {
            0
        } else {
            rand::rng().random_range(0..=nanos)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// How a retry loop ended without success.
#[derive(Debug, PartialEq, Eq)]
pub enum RetryOutcome<E> {
    /// The error is not retriable; returned as is.
    Failed(E),
    /// `cancel` fired while waiting to retry; the last error is kept.
    Cancelled(E),
}

/// Runs `op` until it succeeds, fails with an error `is_retriable` rejects, or
/// `cancel` fires during a backoff wait. An attempt in progress is never cut
/// short: cancellation only stops the waiting. `on_retry` is told of each
/// retried error and the delay before the next attempt (for logs and metrics).
pub async fn retry<T, E, Op, Fut>(
    backoff: &mut Backoff,
    cancel: &CancellationToken,
    op: Op,
    is_retriable: impl Fn(&E) -> bool,
    on_retry: impl FnMut(&E, Duration),
) -> Result<T, RetryOutcome<E>>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    retry_hinted(backoff, cancel, op, (is_retriable, |_: &E| None), on_retry).await
}

/// [`retry`], where an error may also name the least delay before the next
/// attempt (an HTTP `Retry-After`): `policy` is `(is_retriable, least_delay)`,
/// and the delay slept is the longer of that and the backoff's.
pub async fn retry_hinted<T, E, Op, Fut>(
    backoff: &mut Backoff,
    cancel: &CancellationToken,
    mut op: Op,
    (is_retriable, least_delay): (impl Fn(&E) -> bool, impl Fn(&E) -> Option<Duration>),
    mut on_retry: impl FnMut(&E, Duration),
) -> Result<T, RetryOutcome<E>>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        match op().await {
            Ok(value) => {
                backoff.reset();
                return Ok(value);
            }
            Err(e) if !is_retriable(&e) => return Err(RetryOutcome::Failed(e)),
            Err(e) => {
                let delay = backoff
                    .next_delay()
                    .max(least_delay(&e).unwrap_or_default());
                on_retry(&e, delay);
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(RetryOutcome::Cancelled(e)),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn delays_double_jitter_and_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let expected = [100u64, 200, 350, 350];
        for base in expected {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(base / 2),
                "{d:?} below half of {base}"
            );
            assert!(d <= Duration::from_millis(base), "{d:?} above {base}");
        }
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_success_then_resets() {
        let calls = AtomicU32::new(0);
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let cancel = CancellationToken::new();
        let mut seen = Vec::new();
        let start = tokio::time::Instant::now();
        let result = retry(
            &mut b,
            &cancel,
            || async {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 3 {
                    Err("transient")
                } else {
                    Ok(n)
                }
            },
            |_| true,
            |_, d| seen.push(d),
        )
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(seen.len(), 3);
        // Slept at least the halves of 1s + 2s + 4s with time paused.
        assert!(start.elapsed() >= Duration::from_millis(3500));
        assert_eq!(b.peek(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hinted_delay_is_honoured_when_longer_than_the_backoff() {
        let calls = AtomicU32::new(0);
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(10));
        let cancel = CancellationToken::new();
        let mut seen = Vec::new();
        let result = retry_hinted(
            &mut b,
            &cancel,
            || async {
                (calls.fetch_add(1, Ordering::SeqCst) >= 2)
                    .then_some(())
                    .ok_or(7u64)
            },
            (|_: &u64| true, |s: &u64| Some(Duration::from_secs(*s))),
            |_, d| seen.push(d),
        )
        .await;
        assert_eq!(result, Ok(()));
        assert_eq!(seen, [Duration::from_secs(7), Duration::from_secs(7)]);
    }

    #[tokio::test(start_paused = true)]
    async fn non_retriable_errors_return_at_once() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let cancel = CancellationToken::new();
        let result: Result<(), _> = retry(
            &mut b,
            &cancel,
            || async { Err("fatal") },
            |e| *e != "fatal",
            |_, _| panic!("must not retry"),
        )
        .await;
        assert_eq!(result, Err(RetryOutcome::Failed("fatal")));
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_the_wait_and_keeps_the_error() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            trigger.cancel();
        });
        let result: Result<(), _> = retry(
            &mut b,
            &cancel,
            || async { Err("down") },
            |_| true,
            |_, _| {},
        )
        .await;
        assert_eq!(result, Err(RetryOutcome::Cancelled("down")));
    }
}
