//! Elasticsearch failures and their class, decided by HTTP status and error
//! `type` — never by message text.
//!
//! | where | status / type | class |
//! | --- | --- | --- |
//! | bulk item | 2xx | applied |
//! | bulk item | 409 `version_conflict_engine_exception` | settled: the stored version is newer or equal |
//! | bulk item | 404 on a delete | settled: nothing stored, the tombstone version is kept |
//! | bulk item | 400 (mapping, parsing, illegal argument, bad index name) | per record: dead letter |
//! | bulk item | 404 `index_not_found_exception` on an index | fatal: auto-creation is off and no index exists |
//! | bulk item, or a request of one item | 429 `es_rejected_execution_exception` whose operation alone exceeds the indexing-pressure limit | per record: dead letter (see [`exceeds_indexing_limit`]) |
//! | any | 401, 403 `security_exception` | fatal |
//! | any | 403 `cluster_block_exception`, 408, 429, 5xx, unknown | retriable |
//! | request | 400, 404, 405, 413 | fatal: a request the cluster will never accept as sent |
//! | request | no response (connection, timeout) | retriable |

use crate::error::SinkError;

/// How a failure is handled (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Nothing to do: applied, or superseded by a newer stored version.
    Settled,
    /// Retry the batch after a backoff.
    Retriable,
    /// This record can never be applied: dead-letter it.
    Record,
    /// Stop the runner.
    Fatal,
}

/// The bulk operation an item answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// `index`.
    Index,
    /// `delete`.
    Delete,
}

/// Classifies one bulk item by its status, `error.type` and (for one
/// rejection only, see [`exceeds_indexing_limit`]) `error.reason`.
pub fn classify_item(op: OpKind, status: u16, error_type: Option<&str>, reason: &str) -> Class {
    match (status, error_type) {
        (200..=299, _) => Class::Settled,
        (429, Some(REJECTED)) if exceeds_indexing_limit(reason).is_some() => Class::Record,
        (409, Some("version_conflict_engine_exception")) => Class::Settled,
        (404, _) if op == OpKind::Delete => Class::Settled,
        (404, Some("index_not_found_exception")) => Class::Fatal,
        (400, _) => Class::Record,
        (401, _) | (403, Some("security_exception")) => Class::Fatal,
        _ => Class::Retriable,
    }
}

/// `error.type` of a rejection by a thread pool or by indexing pressure.
pub const REJECTED: &str = "es_rejected_execution_exception";

/// What to do about a document too large for the cluster's indexing memory.
pub const INDEXING_LIMIT_HINT: &str = "this one operation is larger than the node's \
     indexing-pressure limit, so Elasticsearch can never accept it: raise \
     `indexing_pressure.memory.limit` (default 10% of the heap) or the heap, or \
     leave the large column out of the index";

/// `(operation bytes, limit)` when an indexing-pressure rejection says that
/// the operation by itself is over the limit of its stage: such a document
/// is refused however idle the cluster is, so retrying it would stall the
/// partition for ever. Every other rejection is load and passes.
///
/// Elasticsearch reports these numbers only in `reason`, e.g. `rejected
/// execution of primary operation [coordinating_and_primary_bytes=..,
/// replica_bytes=0, all_bytes=.., primary_operation_bytes=83886128,
/// max_primary_bytes=53687091]`, the one place this module reads text.
pub fn exceeds_indexing_limit(reason: &str) -> Option<(u64, u64)> {
    let number = |key: &str| -> Option<u64> {
        let start = reason.find(key)? + key.len();
        let digits: String = reason[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    ["primary", "coordinating", "replica"]
        .into_iter()
        .find_map(|stage| {
            let op = number(&format!("{stage}_operation_bytes="))?;
            let max = number(&format!("max_{stage}_bytes="))?;
            (op > max).then_some((op, max))
        })
}

/// Classifies a whole request that failed with `status` (and `error.type`, when the body has one).
pub fn classify_request(status: u16, error_type: Option<&str>) -> Class {
    match (status, error_type) {
        (401, _) | (403, Some("security_exception")) => Class::Fatal,
        (400 | 404 | 405 | 413, _) => Class::Fatal,
        _ => Class::Retriable,
    }
}

/// A failed Elasticsearch call.
#[derive(Debug, thiserror::Error)]
pub enum EsError {
    /// No HTTP response: connection refused or reset, timeout, TLS.
    #[error("{what}: no response from Elasticsearch")]
    Transport {
        /// The call.
        what: &'static str,
        /// The client error.
        #[source]
        source: elasticsearch::Error,
    },
    /// An HTTP error status for the whole request.
    #[error("{what}: HTTP {status} {}: {reason}", .error_type.as_deref().unwrap_or("(no error type)"))]
    Status {
        /// The call.
        what: &'static str,
        /// HTTP status.
        status: u16,
        /// `error.type` of the body, if any.
        error_type: Option<String>,
        /// `error.reason` of the body (or its beginning).
        reason: String,
    },
    /// A 2xx response whose body is not what the API documents.
    #[error("{what}: unexpected response: {reason}")]
    Response {
        /// The call.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A bulk item that failed; see [`classify_item`].
    #[error("{index}/{id}: HTTP {status} {error_type}: {reason}")]
    Item {
        /// Its index.
        index: String,
        /// Its id.
        id: String,
        /// Item status.
        status: u16,
        /// `error.type`.
        error_type: String,
        /// `error.reason`.
        reason: String,
        /// Its class.
        class: Class,
    },
}

impl EsError {
    /// The class of this error.
    pub fn class(&self) -> Class {
        match self {
            Self::Transport { .. } | Self::Response { .. } => Class::Retriable,
            Self::Status {
                status, error_type, ..
            } => classify_request(*status, error_type.as_deref()),
            Self::Item { class, .. } => *class,
        }
    }
}

impl From<EsError> for SinkError {
    fn from(e: EsError) -> Self {
        // The message carries the cause: the runner logs the message, not the chain.
        let message = format!("elasticsearch: {e}");
        match e.class() {
            Class::Fatal => SinkError::fatal_from(message, e),
            _ => SinkError::retriable_from(message, e),
        }
    }
}

/// `error.type` and `error.reason` of an Elasticsearch error body, if it has them.
pub fn error_fields(body: &serde_json::Value) -> (Option<String>, Option<String>) {
    let err = &body["error"];
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    (text(&err["type"]), text(&err["reason"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_classified_by_status_and_type() {
        use Class::*;
        use OpKind::*;
        let cases = [
            (Index, 201, None, Settled),
            (
                Index,
                409,
                Some("version_conflict_engine_exception"),
                Settled,
            ),
            (Delete, 404, None, Settled),
            (Index, 400, Some("document_parsing_exception"), Record),
            (Index, 400, Some("mapper_parsing_exception"), Record),
            (Index, 404, Some("index_not_found_exception"), Fatal),
            (
                Index,
                429,
                Some("es_rejected_execution_exception"),
                Retriable,
            ),
            (Index, 503, Some("unavailable_shards_exception"), Retriable),
            (Index, 403, Some("cluster_block_exception"), Retriable),
            (Index, 403, Some("security_exception"), Fatal),
            (Index, 409, Some("something_else"), Retriable),
        ];
        for (op, status, ty, want) in cases {
            assert_eq!(
                classify_item(
                    op,
                    status,
                    ty,
                    "rejected execution of primary operation [all_bytes=0]"
                ),
                want,
                "{op:?} {status} {ty:?}"
            );
        }
    }

    #[test]
    fn an_operation_over_the_indexing_limit_is_a_record_failure() {
        let primary =
            "rejected execution of primary operation [coordinating_and_primary_bytes=20971724, \
                       replica_bytes=0, all_bytes=20971724, primary_operation_bytes=83886128, \
                       max_primary_bytes=53687091]";
        assert_eq!(exceeds_indexing_limit(primary), Some((83886128, 53687091)));
        let coordinating =
            "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, \
                            replica_bytes=0, all_bytes=0, coordinating_operation_bytes=60000000, \
                            max_coordinating_bytes=53687091]";
        assert_eq!(
            exceeds_indexing_limit(coordinating),
            Some((60000000, 53687091))
        );
        // Load: the operation fits, the node is busy.
        let busy =
            "rejected execution of primary operation [coordinating_and_primary_bytes=53000000, \
                    replica_bytes=0, all_bytes=53000000, primary_operation_bytes=1000, \
                    max_primary_bytes=53687091]";
        assert_eq!(exceeds_indexing_limit(busy), None);
        let queue =
            "rejected execution of org.elasticsearch.common.util.concurrent.TimedRunnable@1 on \
                     EsThreadPoolExecutor[name = n/write, queue capacity = 10000]";
        assert_eq!(exceeds_indexing_limit(queue), None);
        assert_eq!(
            classify_item(OpKind::Index, 429, Some(REJECTED), primary),
            Class::Record
        );
        assert_eq!(
            classify_item(OpKind::Index, 429, Some(REJECTED), busy),
            Class::Retriable
        );
    }

    #[test]
    fn requests_are_classified_by_status() {
        assert_eq!(classify_request(401, None), Class::Fatal);
        assert_eq!(classify_request(413, None), Class::Fatal);
        assert_eq!(classify_request(429, None), Class::Retriable);
        assert_eq!(classify_request(503, None), Class::Retriable);
        assert_eq!(classify_request(502, None), Class::Retriable);
    }
}
