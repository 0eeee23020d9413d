//! What the poll thread keeps of a Kafka record: key, value, and of its
//! headers only the two things the runner reads — a tombstone's origin and the
//! `dedup.identity.header` value — so memory stays bounded by the byte budget.

use rdkafka::message::{BorrowedMessage, Headers, Message};

use crate::event::TombstoneOrigin;

/// A record's bytes as handed to its partition's worker.
pub(crate) struct Payloads {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// A tombstone's origin, from its headers (see [`TombstoneOrigin`]).
    pub tombstone: Option<TombstoneOrigin>,
    /// The value of the header named `identity_header` (when set and present).
    pub identity_header: Option<Vec<u8>>,
}

impl Payloads {
    /// Copies what the runner needs out of `message`.
    pub(crate) fn of(message: &BorrowedMessage<'_>, identity_header: Option<&str>) -> Self {
        Self {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            tombstone: match message.payload() {
                None => tombstone_origin(message),
                Some(_) => None,
            },
            identity_header: identity_header.and_then(|name| header(message, name)),
        }
    }

    /// Bytes held, counted against `max.inflight.bytes`.
    pub(crate) fn size(&self) -> usize {
        [&self.key, &self.value, &self.identity_header]
            .iter()
            .map(|b| b.as_ref().map_or(0, Vec::len))
            .sum()
    }
}

/// The value of the first header named `name` (a header without a value counts as absent).
fn header(message: &BorrowedMessage<'_>, name: &str) -> Option<Vec<u8>> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(<[u8]>::to_vec)
}

/// The origin a tombstone's headers name, if they do.
fn tombstone_origin(message: &BorrowedMessage<'_>) -> Option<TombstoneOrigin> {
    let headers = message.headers()?;
    TombstoneOrigin::from_headers(|name| {
        headers.iter().find(|h| h.key == name).and_then(|h| h.value)
    })
}
