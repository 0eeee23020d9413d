//! A Kafka record as the pipeline builds it, before a producer sends it.

use std::sync::Arc;

use crate::envelope::{
    Heads, SourcePosition, TableEncoder, HEADER_POSITION, HEADER_SCHEMA, HEADER_TABLE,
};

/// A record ready for Kafka.
pub(super) struct Record {
    pub(super) topic: Arc<str>,
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Option<Vec<u8>>,
    /// Outbox events carry their id and type as headers.
    pub(super) headers: Vec<(&'static str, Vec<u8>)>,
    /// The topic may not exist yet (outbox routes are known only per row).
    pub(super) ensure_topic: bool,
    /// An explicit partition (truncates go to every partition); else the key's.
    pub(super) partition: Option<i32>,
    /// Set on an outbox dead letter: the outbox table and the reason, which
    /// the pipeline logs and counts (never the row's values).
    pub(super) dead_letter: Option<(String, String)>,
    /// The schema heads its key and value were written without
    /// ([`crate::envelope::HeadsApart`]): the producer converts them, or
    /// [`Record::join_heads`] makes them whole before they are sent.
    pub(super) heads: Heads,
}

impl Record {
    pub(super) fn len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len)
    }

    pub(super) fn new(topic: &Arc<str>, key: Option<Vec<u8>>, value: Option<Vec<u8>>) -> Self {
        Record {
            topic: Arc::clone(topic),
            key,
            value,
            headers: Vec::new(),
            ensure_topic: false,
            partition: None,
            dead_letter: None,
            heads: Heads::default(),
        }
    }

    /// The parts still written apart from their schema head, whole again:
    /// what the JSON converter sends.
    pub(super) fn join_heads(&mut self) {
        let Heads { key, value } = std::mem::take(&mut self.heads);
        for (part, head) in [(&mut self.key, key), (&mut self.value, value)] {
            if let (Some(bytes), Some(head)) = (part.as_mut(), head) {
                *bytes = Heads::whole(&head, bytes);
            }
        }
    }

    /// The dead letter of an outbox row that cannot be routed.
    pub(super) fn dead_letter(dl: crate::outbox::DeadLetter) -> Self {
        use crate::outbox::{HEADER_DLQ_ERROR, HEADER_DLQ_FIX, HEADER_DLQ_TABLE};
        let mut r = Record::new(&dl.topic.as_str().into(), dl.key, Some(dl.value));
        r.headers = vec![
            (HEADER_DLQ_TABLE, dl.table.as_bytes().to_vec()),
            (HEADER_DLQ_ERROR, dl.reason.as_bytes().to_vec()),
            (HEADER_DLQ_FIX, dl.fix.into_bytes()),
        ];
        r.ensure_topic = true;
        // One place for every dead letter, whatever the key (a null one
        // included), so the topic reads in the order they were written.
        r.partition = Some(0);
        r.dead_letter = Some((dl.table, dl.reason));
        r
    }

    /// A change event of a table, its source position in a header too;
    /// `enc` is the table's encoder that wrote it (`None`: not a table's,
    /// written whole).
    pub(super) fn change(
        topic: &Arc<str>,
        key: Vec<u8>,
        value: Vec<u8>,
        src: &SourcePosition,
        enc: Option<&TableEncoder>,
    ) -> Self {
        let mut r = Record::new(topic, Some(key), Some(value));
        if let Some(enc) = enc {
            r.heads = enc.heads();
        }
        r.headers
            .push((HEADER_POSITION, crate::envelope::position_header(src)));
        r
    }

    /// The tombstone after a delete at `src`: it names that position and the
    /// table, so a sink that only sees the tombstone (the delete compacted
    /// away) can apply it as the delete.
    pub(super) fn tombstone(
        topic: &Arc<str>,
        key: Vec<u8>,
        src: &SourcePosition,
        enc: &TableEncoder,
    ) -> Self {
        let (schema, table) = enc.source_names();
        let mut r = Record::new(topic, Some(key), None);
        r.heads = enc.heads();
        r.headers = vec![
            (HEADER_POSITION, crate::envelope::position_header(src)),
            (HEADER_SCHEMA, schema.as_bytes().to_vec()),
            (HEADER_TABLE, table.as_bytes().to_vec()),
        ];
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part still apart from its head is sent whole; a converted one (its
    /// head dropped by the producer) and a missing one stay as they are.
    #[test]
    fn parts_written_apart_are_joined_to_their_heads() {
        let head: Arc<[u8]> = Arc::from(&br#"{"schema":{"type":"int32"},"payload":"#[..]);
        let mut r = Record::new(&"t".into(), Some(b"7".to_vec()), Some(b"\0avro".to_vec()));
        r.heads = Heads {
            key: Some(Arc::clone(&head)),
            value: None,
        };
        r.join_heads();
        assert_eq!(
            r.key.as_deref(),
            Some(&br#"{"schema":{"type":"int32"},"payload":7}"#[..])
        );
        assert_eq!(r.value.as_deref(), Some(&b"\0avro"[..]));
        assert!(r.heads.key.is_none() && r.heads.value.is_none());
        let mut tombstone = Record::new(&"t".into(), Some(b"7".to_vec()), None);
        tombstone.heads = Heads {
            key: None,
            value: Some(head),
        };
        tombstone.join_heads();
        assert_eq!(tombstone.value, None);
    }
}
