//! Rows of `COPY (SELECT ...) TO STDOUT` in text format, as the tuples a
//! pgoutput text row decodes to.
//!
//! COPY text renders each value with the type's output function under the
//! session's settings — the same text a plain SELECT (and pgoutput) gives —
//! then escapes backslash and control characters and writes NULL as `\N`.
//! Undoing exactly that gives byte-identical [`TupleValue::Text`] values, so
//! the rows go through the same conversion as streamed changes. Values
//! without a backslash (nearly all) are slices of the message, not copies.

use bytes::{Bytes, BytesMut};
use memchr::memchr;

use crate::sources::postgres::pgoutput::{TupleData, TupleValue};

/// A COPY text line that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("COPY row {row}: {reason}")]
pub struct CopyFormatError {
    pub row: usize,
    pub reason: String,
}

/// Splits COPY text output into rows of `columns` values. The server sends
/// one row per message, but a row split across messages is joined.
#[derive(Debug)]
pub struct CopyRows {
    columns: usize,
    /// The start of a row whose end has not arrived yet.
    partial: BytesMut,
    rows: Vec<TupleData>,
}

impl CopyRows {
    pub fn new(columns: usize, capacity: usize) -> Self {
        CopyRows {
            columns,
            partial: BytesMut::new(),
            rows: Vec::with_capacity(capacity),
        }
    }

    /// Takes one CopyData message.
    pub fn push(&mut self, data: Bytes) -> Result<(), CopyFormatError> {
        let data = if self.partial.is_empty() {
            data
        } else {
            self.partial.extend_from_slice(&data);
            self.partial.split().freeze()
        };
        let mut start = 0;
        while let Some(end) = memchr(b'\n', &data[start..]) {
            let line = data.slice(start..start + end);
            let row = parse_line(&line, self.columns).map_err(|reason| CopyFormatError {
                row: self.rows.len() + 1,
                reason,
            })?;
            self.rows.push(row);
            start += end + 1;
        }
        if start < data.len() {
            self.partial.extend_from_slice(&data[start..]);
        }
        Ok(())
    }

    /// The rows, once the COPY ended.
    pub fn finish(self) -> Result<Vec<TupleData>, CopyFormatError> {
        if !self.partial.is_empty() {
            return Err(CopyFormatError {
                row: self.rows.len() + 1,
                reason: "the last row has no line end".into(),
            });
        }
        Ok(self.rows)
    }
}

/// One line (without its `\n`) into `columns` values.
fn parse_line(line: &Bytes, columns: usize) -> Result<TupleData, String> {
    let mut values = Vec::with_capacity(columns);
    let mut start = 0;
    loop {
        let end = memchr(b'\t', &line[start..]).map_or(line.len(), |i| start + i);
        values.push(field(line.slice(start..end)));
        if end == line.len() {
            break;
        }
        start = end + 1;
    }
    if values.len() != columns {
        return Err(format!(
            "{} values, the query has {columns} columns",
            values.len()
        ));
    }
    Ok(TupleData(values))
}

/// One field: `\N` is NULL, anything else text with its escapes undone.
fn field(raw: Bytes) -> TupleValue {
    if raw.as_ref() == b"\\N" {
        return TupleValue::Null;
    }
    if memchr(b'\\', &raw).is_none() {
        return TupleValue::Text(raw);
    }
    TupleValue::Text(unescape(&raw).into())
}

/// Undoes COPY text escapes (`\\`, `\b \f \n \r \t \v`, `\ooo` octal,
/// `\xhh` hex; any other escaped character stands for itself), as COPY
/// FROM reads them.
fn unescape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        i += 1;
        if b != b'\\' || i == raw.len() {
            out.push(b);
            continue;
        }
        let c = raw[i];
        i += 1;
        match c {
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' if raw.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut v = 0u32;
                for _ in 0..2 {
                    match raw.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &[u8]) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s))
    }

    #[test]
    fn rows_nulls_and_escapes() {
        let mut rows = CopyRows::new(3, 2);
        rows.push(Bytes::from_static(b"1\t\\N\tplain\n")).unwrap();
        rows.push(Bytes::from_static(b"2\ta\\\\b\\tc\\nd\\re\tx\\by\\fz\\v\n"))
            .unwrap();
        let rows = rows.finish().unwrap();
        assert_eq!(
            rows,
            vec![
                TupleData(vec![text(b"1"), TupleValue::Null, text(b"plain")]),
                TupleData(vec![
                    text(b"2"),
                    text(b"a\\b\tc\nd\re"),
                    text(b"x\x08y\x0cz\x0b")
                ]),
            ]
        );
    }

    #[test]
    fn empty_strings_are_not_null_and_rows_may_span_messages() {
        let mut rows = CopyRows::new(2, 1);
        rows.push(Bytes::from_static(b"\t")).unwrap();
        assert!(rows.rows.is_empty());
        rows.push(Bytes::from_static(b"\\N\n3\t")).unwrap();
        rows.push(Bytes::from_static(b"\n")).unwrap();
        assert_eq!(
            rows.finish().unwrap(),
            vec![
                TupleData(vec![text(b""), TupleValue::Null]),
                TupleData(vec![text(b"3"), text(b"")]),
            ]
        );
    }

    #[test]
    fn octal_hex_and_literal_escapes() {
        assert_eq!(unescape(b"\\101\\x42\\x4\\q\\"), b"AB\x04q\\");
        // A field that merely contains `\N` is text.
        assert_eq!(field(Bytes::from_static(b"\\\\N")), text(b"\\N"));
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let mut rows = CopyRows::new(2, 1);
        assert!(rows.push(Bytes::from_static(b"1\t2\t3\n")).is_err());
        let mut rows = CopyRows::new(2, 1);
        rows.push(Bytes::from_static(b"1\t2")).unwrap();
        assert!(rows.finish().is_err());
    }
}
