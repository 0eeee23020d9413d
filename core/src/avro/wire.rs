//! Confluent's wire format: magic byte 0, the schema id as 4 big-endian
//! bytes, then the Avro binary body.

use super::AvroError;

/// The first byte of every framed record.
pub const MAGIC: u8 = 0;

/// `body` framed with schema `id`.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.extend_from_slice(&header(id));
    out.extend_from_slice(body);
    out
}

/// The header of a record of schema `id`, its body to follow.
pub fn header(id: u32) -> [u8; 5] {
    let [a, b, c, d] = id.to_be_bytes();
    [MAGIC, a, b, c, d]
}

/// The schema id and the body of a framed record.
pub fn unframe(bytes: &[u8]) -> Result<(u32, &[u8]), AvroError> {
    match bytes {
        [MAGIC, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        [first, ..] if *first != MAGIC => Err(AvroError::NotFramed(format!(
            "the first byte is {first:#04x}, not the magic byte 0{}",
            if *first == b'{' {
                " (a JSON record?)"
            } else {
                ""
            }
        ))),
        _ => Err(AvroError::NotFramed(format!(
            "{} bytes, fewer than the 5 of the header",
            bytes.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_unframes() {
        let framed = frame(0x0102_0304, b"body");
        assert_eq!(framed, b"\0\x01\x02\x03\x04body");
        assert_eq!(unframe(&framed).unwrap(), (0x0102_0304, &b"body"[..]));
        assert_eq!(unframe(&frame(7, b"")).unwrap(), (7, &b""[..]));
    }

    #[test]
    fn json_and_short_records_are_not_framed() {
        let e = unframe(b"{\"a\":1}").unwrap_err().to_string();
        assert!(e.contains("JSON record"), "{e}");
        assert!(unframe(b"\0\0\0").is_err());
        assert!(unframe(b"").is_err());
    }
}
