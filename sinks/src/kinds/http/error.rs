//! How a webhook's answer is classified: by status code and error kind, never by text.
//!
//! | answer | kind |
//! | --- | --- |
//! | 2xx | delivered |
//! | timeout, connection error, 408, 425, 429, 5xx | [`HttpError::Transient`], after `Retry-After` if given |
//! | 401, 403 | [`HttpError::Fatal`]: the credentials are wrong for every event |
//! | 3xx | [`HttpError::Fatal`]: redirects are not followed, configure the final URL |
//! | other 4xx | [`HttpError::Rejected`]: a dead letter with the status and a body excerpt |
//! | refused server certificate | [`HttpError::Fatal`] |

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use crate::error::{BoxError, RecordFailure, SinkError};

/// Bytes of a rejecting answer's body kept in the dead letter's reason.
pub const BODY_EXCERPT_BYTES: usize = 512;

/// What went wrong with one request.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Try again later (no earlier than `retry_after`, when the server said so).
    #[error("{what}")]
    Transient {
        /// What failed (status or client error).
        what: String,
        /// The server's `Retry-After`, capped by `retry.after.max.ms`.
        retry_after: Option<Duration>,
        /// The client error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The receiver refused these changes for good: dead-letter them.
    #[error("webhook answered {status}: {body}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// Nothing will work until the configuration changes.
    #[error("{what}")]
    Fatal {
        /// What failed.
        what: String,
        /// The client error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl HttpError {
    /// True when the same request may succeed later.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    /// The least delay the server asked for before the next attempt.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A client error: a refused certificate or an unusable request is fatal,
    /// the rest transient. `shown` is the URL as it may be shown
    /// ([`oncely_core::secret::redact_url_path`]): the client's own error
    /// loses its URL, whose path or query may be the webhook's secret.
    pub fn from_client(e: reqwest::Error, shown: &str) -> Self {
        let e = e.without_url();
        if let Some(reason) = oncely_core::tls::refused_certificate(&e) {
            return Self::Fatal {
                what: format!("webhook {shown}: TLS refused the server certificate ({reason}); check sink.tls.ca.file"),
                source: Some(Box::new(e)),
            };
        }
        if e.is_builder() {
            return Self::Fatal {
                what: format!("webhook {shown}: cannot build the request"),
                source: Some(Box::new(e)),
            };
        }
        Self::Transient {
            what: if e.is_timeout() {
                format!("webhook {shown}: request timed out (sink.request.timeout.ms)")
            } else {
                format!("webhook {shown}: request failed")
            },
            retry_after: None,
            source: Some(Box::new(e)),
        }
    }

    /// Classifies a non-2xx answer (see the module docs); `body` is read only for a rejection.
    pub fn from_status(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        retry_after_max: Duration,
    ) -> Self {
        let code = status.as_u16();
        match code {
            408 | 425 | 429 | 500..=599 => Self::Transient {
                what: format!("webhook answered {status}"),
                retry_after: retry_after(headers).map(|d| d.min(retry_after_max)),
                source: None,
            },
            401 | 403 => Self::Fatal {
                what: format!("webhook answered {status}: check sink.auth.header / sink.auth.value"),
                source: None,
            },
            300..=399 => Self::Fatal {
                what: format!("webhook answered {status} (redirects are not followed): set sink.url to the final URL"),
                source: None,
            },
            400..=499 => Self::Rejected {
                status: code,
                body: excerpt(body),
            },
            _ => Self::Transient {
                what: format!("webhook answered {status}"),
                retry_after: None,
                source: None,
            },
        }
    }

    /// This error, for the records at `offsets`, as the runner's error.
    pub fn into_sink_error(self, offsets: &[i64]) -> SinkError {
        match self {
            Self::Rejected { .. } => {
                let reason = self.to_string();
                SinkError::Rejected(
                    offsets
                        .iter()
                        .map(|o| RecordFailure::new(*o, reason.clone()))
                        .collect(),
                )
            }
            Self::Transient { ref what, .. } => {
                let what = what.clone();
                SinkError::retriable_from(what, self)
            }
            Self::Fatal { ref what, .. } => {
                let what = what.clone();
                SinkError::fatal_from(what, self)
            }
        }
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date (the
/// time until it, zero when already past); unreadable: `None`, the backoff applies.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    // All three forms RFC 9110 makes recipients accept (IMF-fixdate, RFC 850, asctime).
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The first [`BODY_EXCERPT_BYTES`] of `body` as text (lossy), on a char boundary.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT_BYTES)]);
    let text = text.trim();
    if body.len() > BODY_EXCERPT_BYTES {
        format!("{text}...")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    const CAP: Duration = Duration::from_secs(60);

    fn classify(code: u16, retry: Option<&str>, body: &str) -> HttpError {
        let mut h = HeaderMap::new();
        if let Some(r) = retry {
            h.insert(RETRY_AFTER, HeaderValue::from_str(r).expect("header"));
        }
        HttpError::from_status(
            StatusCode::from_u16(code).expect("status"),
            &h,
            body.as_bytes(),
            CAP,
        )
    }

    #[test]
    fn statuses_are_classified() {
        let e = classify(429, Some("3"), "");
        assert!(e.is_retriable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(
            classify(503, Some("9999"), "").retry_after(),
            Some(CAP),
            "capped"
        );
        assert!(classify(500, None, "").is_retriable());
        assert!(classify(408, None, "").is_retriable());
        assert!(matches!(classify(401, None, ""), HttpError::Fatal { .. }));
        assert!(matches!(classify(302, None, ""), HttpError::Fatal { .. }));
        match classify(422, None, "field `x` is required") {
            HttpError::Rejected { status, body } => {
                assert_eq!(status, 422);
                assert_eq!(body, "field `x` is required");
            }
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[test]
    fn a_rejection_names_each_record_with_status_and_body() {
        let e = classify(400, None, &"x".repeat(2000)).into_sink_error(&[4, 5]);
        let failures = e.rejected().expect("rejected");
        assert_eq!(failures.len(), 2);
        assert!(failures[0].reason.starts_with("webhook answered 400: xxx"));
        assert!(failures[0].reason.len() < BODY_EXCERPT_BYTES + 64);
    }

    fn retry_after_header(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(value).expect("header"));
        h
    }

    #[test]
    fn retry_after_as_an_http_date_is_the_time_until_it() {
        // 1994-11-06 08:49:37 UTC, the date RFC 9110 uses in its examples.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        for form in [
            "Sun, 06 Nov 1994 08:50:07 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:50:07 GMT", // obsolete RFC 850
            "Sun Nov  6 08:50:07 1994",       // obsolete asctime
        ] {
            assert_eq!(
                retry_after_at(&retry_after_header(form), now),
                Some(Duration::from_secs(30)),
                "{form}"
            );
        }
        assert_eq!(
            retry_after_at(&retry_after_header("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            Some(Duration::ZERO),
            "a date already past: no extra wait"
        );
        assert_eq!(retry_after_at(&retry_after_header("soon"), now), None);
        assert_eq!(retry_after_at(&HeaderMap::new(), now), None);
    }

    #[test]
    fn an_http_date_retry_after_is_capped() {
        let far = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
        let e = classify(503, Some(&far), "");
        assert_eq!(
            e.retry_after(),
            Some(CAP),
            "an hour away, capped at retry.after.max.ms"
        );
    }
}
