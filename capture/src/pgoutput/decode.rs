//! Bytes -> [`LogicalMessage`].
//!
//! The reader never trusts a length or count from the wire: every read checks
//! the remaining bytes first and reports which field of which message was cut
//! short, so a corrupt or truncated payload is an error, never a panic.

use bytes::Bytes;

use super::{
    column_kind, tag, tuple_marker, Begin, Column, Commit, DecodeError, LogicalMessage, OldTuple,
    Relation, ReplicaIdentity, TupleData, TupleValue, TypeMessage, COLUMN_IS_KEY,
    MESSAGE_TRANSACTIONAL,
};

/// Decodes one pgoutput message. Column values are slices of `buf`, not copies.
pub fn decode(buf: Bytes) -> Result<LogicalMessage, DecodeError> {
    let Some(&first) = buf.first() else {
        return Err(DecodeError::Empty);
    };
    let message = message_name(first).ok_or(DecodeError::UnknownTag { tag: first })?;
    let mut r = Reader {
        buf,
        pos: 1,
        message,
    };
    let msg = match first {
        tag::BEGIN => LogicalMessage::Begin(Begin {
            final_lsn: r.u64("final_lsn")?,
            commit_ts_us: r.i64("commit_timestamp")?,
            xid: r.u32("xid")?,
        }),
        tag::COMMIT => LogicalMessage::Commit(Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.u64("commit_lsn")?,
            end_lsn: r.u64("end_lsn")?,
            commit_ts_us: r.i64("commit_timestamp")?,
        }),
        tag::ORIGIN => LogicalMessage::Origin {
            commit_lsn: r.u64("commit_lsn")?,
            name: r.string("name")?,
        },
        tag::MESSAGE => {
            let flags = r.u8("flags")?;
            let lsn = r.u64("lsn")?;
            let prefix = r.string("prefix")?;
            let len = r.length("content_length")?;
            LogicalMessage::Message {
                transactional: flags & MESSAGE_TRANSACTIONAL != 0,
                lsn,
                prefix,
                content: r.bytes(len, "content")?,
            }
        }
        tag::RELATION => LogicalMessage::Relation(r.relation()?),
        tag::TYPE => LogicalMessage::Type(TypeMessage {
            oid: r.u32("type_oid")?,
            namespace: r.string("namespace")?,
            name: r.string("name")?,
        }),
        tag::INSERT => {
            let relation_id = r.u32("relation_id")?;
            r.expect_marker(tuple_marker::NEW, "'N'")?;
            LogicalMessage::Insert {
                relation_id,
                new: r.tuple()?,
            }
        }
        tag::UPDATE => {
            let relation_id = r.u32("relation_id")?;
            let old = match r.u8("tuple_marker")? {
                tuple_marker::KEY => {
                    let old = OldTuple::Key(r.tuple()?);
                    r.expect_marker(tuple_marker::NEW, "'N'")?;
                    Some(old)
                }
                tuple_marker::OLD => {
                    let old = OldTuple::Full(r.tuple()?);
                    r.expect_marker(tuple_marker::NEW, "'N'")?;
                    Some(old)
                }
                tuple_marker::NEW => None,
                byte => {
                    return Err(DecodeError::BadTupleMarker {
                        message,
                        byte,
                        expected: "'K', 'O' or 'N'",
                    })
                }
            };
            LogicalMessage::Update {
                relation_id,
                old,
                new: r.tuple()?,
            }
        }
        tag::DELETE => {
            let relation_id = r.u32("relation_id")?;
            let old = match r.u8("tuple_marker")? {
                tuple_marker::KEY => OldTuple::Key(r.tuple()?),
                tuple_marker::OLD => OldTuple::Full(r.tuple()?),
                byte => {
                    return Err(DecodeError::BadTupleMarker {
                        message,
                        byte,
                        expected: "'K' or 'O'",
                    })
                }
            };
            LogicalMessage::Delete { relation_id, old }
        }
        tag::TRUNCATE => {
            let count = r.count_i32("relation_count")?;
            let options = r.u8("options")?;
            // Each id is 4 bytes: check up front so a huge count cannot make
            // us reserve memory the payload does not back.
            r.ensure(count.saturating_mul(4), "relation_ids")?;
            let mut relation_ids = Vec::with_capacity(count);
            for _ in 0..count {
                relation_ids.push(r.u32("relation_id")?);
            }
            LogicalMessage::Truncate {
                options,
                relation_ids,
            }
        }
        tag => return Err(DecodeError::UnknownTag { tag }),
    };
    r.finish()?;
    Ok(msg)
}

/// Decodes from a borrowed slice. Copies the slice once; prefer [`decode`]
/// with the stream's `Bytes` on the hot path.
pub fn decode_slice(buf: &[u8]) -> Result<LogicalMessage, DecodeError> {
    decode(Bytes::copy_from_slice(buf))
}

fn message_name(tag: u8) -> Option<&'static str> {
    Some(match tag {
        tag::BEGIN => "Begin",
        tag::COMMIT => "Commit",
        tag::ORIGIN => "Origin",
        tag::MESSAGE => "Message",
        tag::RELATION => "Relation",
        tag::TYPE => "Type",
        tag::INSERT => "Insert",
        tag::UPDATE => "Update",
        tag::DELETE => "Delete",
        tag::TRUNCATE => "Truncate",
        _ => return None,
    })
}

/// Cursor over one message; `message` names it in errors.
struct Reader {
    buf: Bytes,
    pos: usize,
    message: &'static str,
}

impl Reader {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn ensure(&self, needed: usize, field: &'static str) -> Result<(), DecodeError> {
        if self.remaining() < needed {
            return Err(DecodeError::Truncated {
                message: self.message,
                field,
                offset: self.pos,
                needed,
                available: self.remaining(),
            });
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        self.ensure(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// An Int32 byte length; negative is corrupt (NULLs have their own kind byte).
    fn length(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        self.count_i32(field)
    }

    fn count_i32(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let v = self.i32(field)?;
        usize::try_from(v).map_err(|_| DecodeError::NegativeLength {
            message: self.message,
            field,
            value: i64::from(v),
        })
    }

    fn count_i16(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let v = self.i16(field)?;
        usize::try_from(v).map_err(|_| DecodeError::NegativeLength {
            message: self.message,
            field,
            value: i64::from(v),
        })
    }

    fn bytes(&mut self, len: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        self.ensure(len, field)?;
        let out = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(out)
    }

    /// A NUL-terminated string, which must be UTF-8 (we run with a UTF8
    /// client encoding; anything else is corruption, not data to guess at).
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let rest = &self.buf[self.pos..];
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return Err(DecodeError::UnterminatedString {
                message: self.message,
                field,
                offset: self.pos,
            });
        };
        let s = std::str::from_utf8(&rest[..nul])
            .map_err(|_| DecodeError::InvalidUtf8 {
                message: self.message,
                field,
            })?
            .to_owned();
        self.pos += nul + 1;
        Ok(s)
    }

    fn expect_marker(&mut self, want: u8, expected: &'static str) -> Result<(), DecodeError> {
        let byte = self.u8("tuple_marker")?;
        if byte != want {
            return Err(DecodeError::BadTupleMarker {
                message: self.message,
                byte,
                expected,
            });
        }
        Ok(())
    }

    fn relation(&mut self) -> Result<Relation, DecodeError> {
        let id = self.u32("relation_id")?;
        let namespace = self.string("namespace")?;
        let name = self.string("relation_name")?;
        let byte = self.u8("replica_identity")?;
        let replica_identity =
            ReplicaIdentity::from_byte(byte).ok_or(DecodeError::UnknownReplicaIdentity {
                relation_id: id,
                byte,
            })?;
        let ncols = self.count_i16("column_count")?;
        // Smallest column: flags + empty name + oid + typmod = 10 bytes.
        self.ensure(ncols.saturating_mul(10), "columns")?;
        let mut columns = Vec::with_capacity(ncols);
        for _ in 0..ncols {
            let flags = self.u8("column_flags")?;
            columns.push(Column {
                is_key: flags & COLUMN_IS_KEY != 0,
                name: self.string("column_name")?,
                type_oid: self.u32("column_type_oid")?,
                type_modifier: self.i32("column_type_modifier")?,
            });
        }
        Ok(Relation {
            id,
            namespace,
            name,
            replica_identity,
            columns,
        })
    }

    fn tuple(&mut self) -> Result<TupleData, DecodeError> {
        let ncols = self.count_i16("tuple_column_count")?;
        // Every column has at least its kind byte.
        self.ensure(ncols, "tuple_columns")?;
        let mut values = Vec::with_capacity(ncols);
        for column in 0..ncols {
            let value = match self.u8("column_kind")? {
                column_kind::NULL => TupleValue::Null,
                column_kind::UNCHANGED_TOAST => TupleValue::UnchangedToast,
                column_kind::TEXT => {
                    let len = self.length("column_length")?;
                    TupleValue::Text(self.bytes(len, "column_value")?)
                }
                column_kind::BINARY => {
                    let len = self.length("column_length")?;
                    TupleValue::Binary(self.bytes(len, "column_value")?)
                }
                byte => {
                    return Err(DecodeError::BadColumnKind {
                        message: self.message,
                        column,
                        byte,
                    })
                }
            };
            values.push(value);
        }
        Ok(TupleData(values))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes {
                message: self.message,
                extra,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Hand-written byte fixtures, laid out field by field as the PostgreSQL
    //! 15 documentation describes each message.

    use super::*;

    fn d(bytes: &[u8]) -> Result<LogicalMessage, DecodeError> {
        decode_slice(bytes)
    }

    fn text(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn begin() {
        let bytes = [
            b'B', //
            0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x30, // final LSN 0/16B5A30
            0, 0x02, 0xC8, 0x4E, 0x9E, 0x23, 0x3A, 0x10, // commit ts
            0, 0, 0x02, 0xF2, // xid 754
        ];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Begin(Begin {
                final_lsn: 0x016B_5A30,
                commit_ts_us: 0x0002_C84E_9E23_3A10,
                xid: 754,
            })
        );
    }

    #[test]
    fn commit() {
        let bytes = [
            b'C', 0, // flags
            0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x30, // commit LSN
            0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x60, // end LSN
            0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE, // ts -2 (before 2000)
        ];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: 0x016B_5A30,
                end_lsn: 0x016B_5A60,
                commit_ts_us: -2,
            })
        );
    }

    #[test]
    fn origin() {
        let mut bytes = vec![b'O', 0, 0, 0, 1, 0, 0, 0, 0x10];
        bytes.extend_from_slice(b"node_a\0");
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Origin {
                commit_lsn: 0x1_0000_0010,
                name: "node_a".into(),
            }
        );
    }

    #[test]
    fn message_transactional_and_not() {
        let mut bytes = vec![b'M', 1, 0, 0, 0, 0, 0, 0, 0, 0x20];
        bytes.extend_from_slice(b"heartbeat\0");
        bytes.extend_from_slice(&[0, 0, 0, 3, b'a', 0, b'z']);
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Message {
                transactional: true,
                lsn: 0x20,
                prefix: "heartbeat".into(),
                content: Bytes::from_static(b"a\0z"),
            }
        );
        bytes[1] = 0;
        assert!(matches!(
            d(&bytes).unwrap(),
            LogicalMessage::Message {
                transactional: false,
                ..
            }
        ));
    }

    #[test]
    fn relation() {
        let mut bytes = vec![b'R', 0, 0, 0x40, 0x00]; // oid 16384
        bytes.extend_from_slice(b"public\0orders\0");
        bytes.push(b'd');
        bytes.extend_from_slice(&[0, 2]); // 2 columns
        bytes.push(1); // key
        bytes.extend_from_slice(b"id\0");
        bytes.extend_from_slice(&[0, 0, 0, 20]); // int8
        bytes.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]); // typmod -1
        bytes.push(0);
        bytes.extend_from_slice(b"total\0");
        bytes.extend_from_slice(&[0, 0, 0x06, 0xA4]); // numeric 1700
        bytes.extend_from_slice(&[0, 0x0C, 0, 0x06]); // numeric(12,2): (12<<16|2)+4
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Relation(Relation {
                id: 16384,
                namespace: "public".into(),
                name: "orders".into(),
                replica_identity: ReplicaIdentity::Default,
                columns: vec![
                    Column {
                        is_key: true,
                        name: "id".into(),
                        type_oid: 20,
                        type_modifier: -1,
                    },
                    Column {
                        is_key: false,
                        name: "total".into(),
                        type_oid: 1700,
                        type_modifier: (12 << 16 | 2) + 4,
                    },
                ],
            })
        );
    }

    #[test]
    fn relation_replica_identities() {
        for (byte, want) in [
            (b'd', ReplicaIdentity::Default),
            (b'n', ReplicaIdentity::Nothing),
            (b'f', ReplicaIdentity::Full),
            (b'i', ReplicaIdentity::Index),
        ] {
            let mut bytes = vec![b'R', 0, 0, 0, 7];
            bytes.extend_from_slice(b"\0t\0");
            bytes.extend_from_slice(&[byte, 0, 0]);
            match d(&bytes).unwrap() {
                LogicalMessage::Relation(r) => {
                    assert_eq!(r.replica_identity, want);
                    assert_eq!(r.namespace, "", "pg_catalog is sent as empty");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn type_message() {
        let mut bytes = vec![b'Y', 0, 0, 0x40, 0x10];
        bytes.extend_from_slice(b"public\0mood\0");
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Type(TypeMessage {
                oid: 16400,
                namespace: "public".into(),
                name: "mood".into(),
            })
        );
    }

    #[test]
    fn insert_with_every_column_kind() {
        let mut bytes = vec![b'I', 0, 0, 0x40, 0, b'N', 0, 4];
        bytes.extend_from_slice(&[b't', 0, 0, 0, 2, b'4', b'2']);
        bytes.push(b'n');
        bytes.push(b'u');
        bytes.extend_from_slice(&[b'b', 0, 0, 0, 1, 0xFF]);
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Insert {
                relation_id: 16384,
                new: TupleData(vec![
                    text("42"),
                    TupleValue::Null,
                    TupleValue::UnchangedToast,
                    TupleValue::Binary(Bytes::from_static(&[0xFF])),
                ]),
            }
        );
    }

    #[test]
    fn insert_values_are_slices_of_the_input() {
        let bytes = Bytes::from_static(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0, 0, 0, 1, b'x']);
        let LogicalMessage::Insert { new, .. } = decode(bytes.clone()).unwrap() else {
            panic!("not an insert");
        };
        let TupleValue::Text(v) = &new.0[0] else {
            panic!("not text");
        };
        assert_eq!(v.as_ptr(), bytes[13..].as_ptr());
    }

    #[test]
    fn update_without_old_tuple() {
        let bytes = [b'U', 0, 0, 0, 9, b'N', 0, 1, b't', 0, 0, 0, 1, b'a'];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Update {
                relation_id: 9,
                old: None,
                new: TupleData(vec![text("a")]),
            }
        );
    }

    #[test]
    fn update_with_key_and_with_full_old_tuple() {
        for (marker, wrap) in [
            (b'K', OldTuple::Key as fn(TupleData) -> OldTuple),
            (b'O', OldTuple::Full),
        ] {
            let bytes = [
                b'U', 0, 0, 0, 9, marker, 0, 2, b't', 0, 0, 0, 1, b'1', b'n', b'N', 0, 2, b't', 0,
                0, 0, 1, b'2', b'u',
            ];
            assert_eq!(
                d(&bytes).unwrap(),
                LogicalMessage::Update {
                    relation_id: 9,
                    old: Some(wrap(TupleData(vec![text("1"), TupleValue::Null]))),
                    new: TupleData(vec![text("2"), TupleValue::UnchangedToast]),
                }
            );
        }
    }

    #[test]
    fn delete_key_and_full() {
        let bytes = [b'D', 0, 0, 0, 9, b'K', 0, 1, b't', 0, 0, 0, 1, b'7'];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Delete {
                relation_id: 9,
                old: OldTuple::Key(TupleData(vec![text("7")])),
            }
        );
        let bytes = [b'D', 0, 0, 0, 9, b'O', 0, 1, b'n'];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Delete {
                relation_id: 9,
                old: OldTuple::Full(TupleData(vec![TupleValue::Null])),
            }
        );
    }

    #[test]
    fn truncate() {
        let bytes = [
            b'T', 0, 0, 0, 2, 3, // 2 relations, cascade | restart identity
            0, 0, 0x40, 0, 0, 0, 0x40, 1,
        ];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Truncate {
                options: 3,
                relation_ids: vec![16384, 16385],
            }
        );
    }

    #[test]
    fn empty_and_unknown_tag() {
        assert_eq!(d(&[]), Err(DecodeError::Empty));
        assert_eq!(d(&[b'Z', 0]), Err(DecodeError::UnknownTag { tag: b'Z' }));
        // Streaming (protocol 2) messages are not part of protocol 1.
        assert_eq!(d(b"S"), Err(DecodeError::UnknownTag { tag: b'S' }));
    }

    #[test]
    fn every_truncation_of_a_valid_message_is_an_error() {
        let mut full = vec![b'U', 0, 0, 0, 9, b'O', 0, 2, b't', 0, 0, 0, 3];
        full.extend_from_slice(b"abc");
        full.extend_from_slice(&[b'n', b'N', 0, 1, b'u']);
        assert!(d(&full).is_ok());
        for cut in 1..full.len() {
            let err = d(&full[..cut]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { .. }),
                "cut at {cut}: {err:?}"
            );
        }
    }

    #[test]
    fn truncated_error_names_the_field() {
        let err = d(&[b'B', 0, 0, 0]).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Truncated {
                message: "Begin",
                field: "final_lsn",
                offset: 1,
                needed: 8,
                available: 3,
            }
        );
        assert!(err.to_string().contains("Begin"));
    }

    #[test]
    fn bad_column_kind() {
        let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 2, b'n', b'x'];
        assert_eq!(
            d(&bytes),
            Err(DecodeError::BadColumnKind {
                message: "Insert",
                column: 1,
                byte: b'x',
            })
        );
    }

    #[test]
    fn bad_tuple_markers() {
        assert!(matches!(
            d(&[b'I', 0, 0, 0, 1, b'K', 0, 0]),
            Err(DecodeError::BadTupleMarker { byte: b'K', .. })
        ));
        assert!(matches!(
            d(&[b'U', 0, 0, 0, 1, b'X', 0, 0]),
            Err(DecodeError::BadTupleMarker { byte: b'X', .. })
        ));
        // Old tuple must be followed by 'N'.
        assert!(matches!(
            d(&[b'U', 0, 0, 0, 1, b'K', 0, 0, b'K', 0, 0]),
            Err(DecodeError::BadTupleMarker { byte: b'K', .. })
        ));
        assert!(matches!(
            d(&[b'D', 0, 0, 0, 1, b'N', 0, 0]),
            Err(DecodeError::BadTupleMarker { byte: b'N', .. })
        ));
    }

    #[test]
    fn invalid_utf8_and_unterminated_names() {
        let mut bytes = vec![b'Y', 0, 0, 0, 1];
        bytes.extend_from_slice(&[b'p', 0xC3, 0x28, 0]);
        bytes.extend_from_slice(b"t\0");
        assert_eq!(
            d(&bytes),
            Err(DecodeError::InvalidUtf8 {
                message: "Type",
                field: "namespace",
            })
        );
        let bytes = [b'Y', 0, 0, 0, 1, b'p', 0, b't'];
        assert!(matches!(
            d(&bytes),
            Err(DecodeError::UnterminatedString { field: "name", .. })
        ));
    }

    #[test]
    fn unknown_replica_identity() {
        let mut bytes = vec![b'R', 0, 0, 0, 7];
        bytes.extend_from_slice(b"s\0t\0x\0\0");
        assert_eq!(
            d(&bytes),
            Err(DecodeError::UnknownReplicaIdentity {
                relation_id: 7,
                byte: b'x',
            })
        );
    }

    #[test]
    fn negative_lengths_and_counts() {
        let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xFF, 0xFF, 0xFF, 0xFF];
        assert!(matches!(
            d(&bytes),
            Err(DecodeError::NegativeLength { value: -1, .. })
        ));
        let bytes = [b'I', 0, 0, 0, 1, b'N', 0x80, 0];
        assert!(matches!(d(&bytes), Err(DecodeError::NegativeLength { .. })));
        let bytes = [b'T', 0xFF, 0xFF, 0xFF, 0xFE, 0];
        assert!(matches!(
            d(&bytes),
            Err(DecodeError::NegativeLength { value: -2, .. })
        ));
    }

    #[test]
    fn huge_counts_fail_without_allocating() {
        // Claims i32::MAX relations with none present.
        let bytes = [b'T', 0x7F, 0xFF, 0xFF, 0xFF, 0];
        assert!(matches!(d(&bytes), Err(DecodeError::Truncated { .. })));
        let bytes = [b'I', 0, 0, 0, 1, b'N', 0x7F, 0xFF];
        assert!(matches!(d(&bytes), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 1, b'n', 0];
        assert_eq!(
            d(&bytes),
            Err(DecodeError::TrailingBytes {
                message: "Insert",
                extra: 1,
            })
        );
    }
}
