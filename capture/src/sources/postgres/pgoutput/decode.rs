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
        tag::MESSAGE => r.emitted_message()?,
        tag::RELATION => LogicalMessage::Relation(r.relation()?),
        tag::TYPE => LogicalMessage::Type(TypeMessage {
            oid: r.u32("type_oid")?,
            namespace: r.string("namespace")?,
            name: r.string("name")?,
        }),
        tag::INSERT => r.insert()?,
        tag::UPDATE => r.update()?,
        tag::DELETE => r.delete()?,
        tag::TRUNCATE => r.truncate()?,
        tag => return Err(DecodeError::UnknownTag { tag }),
    };
    r.finish()?;
    Ok(msg)
}

/// Decodes from a borrowed slice. Copies the slice once; prefer [`decode`]
/// with the stream's `Bytes` on the hot path.
#[cfg(test)]
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

    /// A logical decoding message (`pg_logical_emit_message`).
    fn emitted_message(&mut self) -> Result<LogicalMessage, DecodeError> {
        let flags = self.u8("flags")?;
        let lsn = self.u64("lsn")?;
        let prefix = self.string("prefix")?;
        let len = self.length("content_length")?;
        Ok(LogicalMessage::Message {
            transactional: flags & MESSAGE_TRANSACTIONAL != 0,
            lsn,
            prefix,
            content: self.bytes(len, "content")?,
        })
    }

    fn insert(&mut self) -> Result<LogicalMessage, DecodeError> {
        let relation_id = self.u32("relation_id")?;
        self.expect_marker(tuple_marker::NEW, "'N'")?;
        Ok(LogicalMessage::Insert {
            relation_id,
            new: self.tuple()?,
        })
    }

    /// An update: the old key or row when the replica identity sends one,
    /// then the new row.
    fn update(&mut self) -> Result<LogicalMessage, DecodeError> {
        let relation_id = self.u32("relation_id")?;
        let old = match self.u8("tuple_marker")? {
            tuple_marker::KEY => {
                let old = OldTuple::Key(self.tuple()?);
                self.expect_marker(tuple_marker::NEW, "'N'")?;
                Some(old)
            }
            tuple_marker::OLD => {
                let old = OldTuple::Full(self.tuple()?);
                self.expect_marker(tuple_marker::NEW, "'N'")?;
                Some(old)
            }
            tuple_marker::NEW => None,
            byte => {
                return Err(DecodeError::BadTupleMarker {
                    message: self.message,
                    byte,
                    expected: "'K', 'O' or 'N'",
                })
            }
        };
        Ok(LogicalMessage::Update {
            relation_id,
            old,
            new: self.tuple()?,
        })
    }

    fn delete(&mut self) -> Result<LogicalMessage, DecodeError> {
        let relation_id = self.u32("relation_id")?;
        let old = match self.u8("tuple_marker")? {
            tuple_marker::KEY => OldTuple::Key(self.tuple()?),
            tuple_marker::OLD => OldTuple::Full(self.tuple()?),
            byte => {
                return Err(DecodeError::BadTupleMarker {
                    message: self.message,
                    byte,
                    expected: "'K' or 'O'",
                })
            }
        };
        Ok(LogicalMessage::Delete { relation_id, old })
    }

    fn truncate(&mut self) -> Result<LogicalMessage, DecodeError> {
        let count = self.count_i32("relation_count")?;
        let options = self.u8("options")?;
        // Each id is 4 bytes: check up front so a huge count cannot make us
        // reserve memory the payload does not back.
        self.ensure(count.saturating_mul(4), "relation_ids")?;
        let mut relation_ids = Vec::with_capacity(count);
        for _ in 0..count {
            relation_ids.push(self.u32("relation_id")?);
        }
        Ok(LogicalMessage::Truncate {
            options,
            relation_ids,
        })
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
                column_kind::UNCHANGED_TOAST => TupleValue::Unchanged,
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
mod tests;
