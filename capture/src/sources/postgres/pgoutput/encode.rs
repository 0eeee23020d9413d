//! [`LogicalMessage`] -> bytes, the exact inverse of [`super::decode`].
//!
//! Used to build fixtures and for round-trip property tests, so it writes
//! exactly what PostgreSQL would. Values PostgreSQL can never produce cannot
//! be represented faithfully: names containing NUL are cut at the NUL by the
//! decoder, and more than `i16::MAX` columns would not fit the Int16 count.

use super::{
    column_kind, tag, tuple_marker, LogicalMessage, Lsn, OldTuple, Relation, TupleData, TupleValue,
    COLUMN_IS_KEY, MESSAGE_TRANSACTIONAL,
};

/// Encodes one message into a new buffer.
pub fn encode(msg: &LogicalMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_into(msg, &mut out);
    out
}

/// Appends one encoded message to `out`.
pub fn encode_into(msg: &LogicalMessage, out: &mut Vec<u8>) {
    match msg {
        LogicalMessage::Begin(b) => {
            out.push(tag::BEGIN);
            out.extend_from_slice(&b.final_lsn.to_be_bytes());
            out.extend_from_slice(&b.commit_ts_us.to_be_bytes());
            out.extend_from_slice(&b.xid.to_be_bytes());
        }
        LogicalMessage::Commit(c) => {
            out.push(tag::COMMIT);
            out.push(c.flags);
            out.extend_from_slice(&c.commit_lsn.to_be_bytes());
            out.extend_from_slice(&c.end_lsn.to_be_bytes());
            out.extend_from_slice(&c.commit_ts_us.to_be_bytes());
        }
        LogicalMessage::Origin { commit_lsn, name } => {
            out.push(tag::ORIGIN);
            out.extend_from_slice(&commit_lsn.to_be_bytes());
            cstr(out, name);
        }
        LogicalMessage::Message {
            transactional,
            lsn,
            prefix,
            content,
        } => emitted_message(out, *transactional, *lsn, prefix, content),
        LogicalMessage::Relation(r) => relation(out, r),
        LogicalMessage::Type(t) => {
            out.push(tag::TYPE);
            out.extend_from_slice(&t.oid.to_be_bytes());
            cstr(out, &t.namespace);
            cstr(out, &t.name);
        }
        LogicalMessage::Insert { relation_id, new } => {
            out.push(tag::INSERT);
            out.extend_from_slice(&relation_id.to_be_bytes());
            out.push(tuple_marker::NEW);
            tuple(out, new);
        }
        LogicalMessage::Update {
            relation_id,
            old,
            new,
        } => {
            out.push(tag::UPDATE);
            out.extend_from_slice(&relation_id.to_be_bytes());
            if let Some(old) = old {
                old_tuple(out, old);
            }
            out.push(tuple_marker::NEW);
            tuple(out, new);
        }
        LogicalMessage::Delete { relation_id, old } => {
            out.push(tag::DELETE);
            out.extend_from_slice(&relation_id.to_be_bytes());
            old_tuple(out, old);
        }
        LogicalMessage::Truncate {
            options,
            relation_ids,
        } => truncate(out, *options, relation_ids),
    }
}

/// A logical decoding message (`pg_logical_emit_message`).
fn emitted_message(out: &mut Vec<u8>, transactional: bool, lsn: Lsn, prefix: &str, content: &[u8]) {
    out.push(tag::MESSAGE);
    out.push(if transactional {
        MESSAGE_TRANSACTIONAL
    } else {
        0
    });
    out.extend_from_slice(&lsn.to_be_bytes());
    cstr(out, prefix);
    len_i32(out, content.len());
    out.extend_from_slice(content);
}

fn relation(out: &mut Vec<u8>, r: &Relation) {
    out.push(tag::RELATION);
    out.extend_from_slice(&r.id.to_be_bytes());
    cstr(out, &r.namespace);
    cstr(out, &r.name);
    out.push(r.replica_identity.as_byte());
    count_i16(out, r.columns.len());
    for c in &r.columns {
        out.push(if c.is_key { COLUMN_IS_KEY } else { 0 });
        cstr(out, &c.name);
        out.extend_from_slice(&c.type_oid.to_be_bytes());
        out.extend_from_slice(&c.type_modifier.to_be_bytes());
    }
}

fn truncate(out: &mut Vec<u8>, options: u8, relation_ids: &[u32]) {
    out.push(tag::TRUNCATE);
    len_i32(out, relation_ids.len());
    out.push(options);
    for id in relation_ids {
        out.extend_from_slice(&id.to_be_bytes());
    }
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// Int32 length; saturates (a >2 GiB value cannot come from PostgreSQL).
fn len_i32(out: &mut Vec<u8>, len: usize) {
    let len = i32::try_from(len).unwrap_or(i32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
}

/// Int16 count; saturates (PostgreSQL tables have at most 1600 columns).
fn count_i16(out: &mut Vec<u8>, n: usize) {
    let n = i16::try_from(n).unwrap_or(i16::MAX);
    out.extend_from_slice(&n.to_be_bytes());
}

fn old_tuple(out: &mut Vec<u8>, old: &OldTuple) {
    match old {
        OldTuple::Key(t) => {
            out.push(tuple_marker::KEY);
            tuple(out, t);
        }
        OldTuple::Full(t) => {
            out.push(tuple_marker::OLD);
            tuple(out, t);
        }
    }
}

fn tuple(out: &mut Vec<u8>, t: &TupleData) {
    count_i16(out, t.0.len());
    for v in &t.0 {
        match v {
            TupleValue::Null => out.push(column_kind::NULL),
            TupleValue::Unchanged => out.push(column_kind::UNCHANGED_TOAST),
            TupleValue::Text(b) => {
                out.push(column_kind::TEXT);
                len_i32(out, b.len());
                out.extend_from_slice(b);
            }
            TupleValue::Binary(b) => {
                out.push(column_kind::BINARY);
                len_i32(out, b.len());
                out.extend_from_slice(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::sources::postgres::pgoutput::{Begin, Column, Relation, ReplicaIdentity};

    #[test]
    fn begin_layout() {
        let m = LogicalMessage::Begin(Begin {
            final_lsn: 0x0102_0304_0506_0708,
            commit_ts_us: -1,
            xid: 0x0A0B_0C0D,
        });
        assert_eq!(
            encode(&m),
            [
                b'B', 1, 2, 3, 4, 5, 6, 7, 8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x0A,
                0x0B, 0x0C, 0x0D
            ]
        );
    }

    #[test]
    fn relation_layout() {
        let m = LogicalMessage::Relation(Relation {
            id: 1,
            namespace: "s".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Full,
            columns: vec![Column {
                is_key: true,
                name: "c".into(),
                type_oid: 23,
                type_modifier: -1,
            }],
        });
        assert_eq!(
            encode(&m),
            [
                b'R', 0, 0, 0, 1, b's', 0, b't', 0, b'f', 0, 1, 1, b'c', 0, 0, 0, 0, 23, 0xFF,
                0xFF, 0xFF, 0xFF
            ]
        );
    }

    #[test]
    fn update_with_old_key_layout() {
        let m = LogicalMessage::Update {
            relation_id: 2,
            old: Some(OldTuple::Key(TupleData(vec![TupleValue::Text(
                Bytes::from_static(b"1"),
            )]))),
            new: TupleData(vec![TupleValue::Unchanged]),
        };
        assert_eq!(
            encode(&m),
            [b'U', 0, 0, 0, 2, b'K', 0, 1, b't', 0, 0, 0, 1, b'1', b'N', 0, 1, b'u']
        );
    }

    #[test]
    fn encode_into_appends() {
        let mut out = vec![0xAA];
        encode_into(
            &LogicalMessage::Truncate {
                options: 0,
                relation_ids: vec![],
            },
            &mut out,
        );
        assert_eq!(out, [0xAA, b'T', 0, 0, 0, 0, 0]);
    }
}
