//! Writing JSON tokens straight into a byte buffer.
//!
//! The envelope encoder writes every event payload into one `Vec<u8>`
//! instead of building `serde_json::Value` trees, so it needs infallible
//! writers for strings and integers. String escaping produces the same
//! bytes as `serde_json::to_string` (checked by a property test), so either
//! path yields identical records.

/// Appends `s` as a JSON string literal, quotes included.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0C => b"\\f",
            0x00..=0x1F => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends a signed integer in decimal.
pub fn write_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    write_u64(out, n.unsigned_abs());
}

/// Appends an unsigned integer in decimal.
pub fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        // n % 10 < 10, so the cast cannot truncate.
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends `n` zero-padded to at least `width` digits.
pub fn write_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = Vec::with_capacity(20);
    write_u64(&mut digits, n);
    for _ in digits.len()..width {
        out.push(b'0');
    }
    out.extend_from_slice(&digits);
}

/// Whether `s` is an integer literal JSON accepts as is: `-?(0|[1-9][0-9]*)`.
pub fn is_json_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s).as_bytes();
    match digits {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        _ => digits.iter().all(u8::is_ascii_digit),
    }
}

/// Whether `s` is a number literal JSON accepts as is:
/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
pub fn is_json_number(s: &str) -> bool {
    let b = s.strip_prefix('-').unwrap_or(s).as_bytes();
    let int_end = b
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(b.len());
    if int_end == 0 || (int_end > 1 && b[0] == b'0') {
        return false;
    }
    let mut rest = &b[int_end..];
    if let [b'.', tail @ ..] = rest {
        let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &tail[n..];
    }
    if let [b'e' | b'E', tail @ ..] = rest {
        let tail = match tail {
            [b'+' | b'-', t @ ..] => t,
            t => t,
        };
        let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &tail[n..];
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strings() {
        assert_eq!(s(|o| write_str(o, "")), r#""""#);
        assert_eq!(
            s(|o| write_str(o, "a\"b\\c\nd\u{1}é€")),
            r#""a\"b\\c\nd\u0001é€""#
        );
    }

    #[test]
    fn integers() {
        assert_eq!(s(|o| write_i64(o, 0)), "0");
        assert_eq!(s(|o| write_i64(o, i64::MIN)), i64::MIN.to_string());
        assert_eq!(s(|o| write_u64(o, u64::MAX)), u64::MAX.to_string());
        assert_eq!(s(|o| write_padded(o, 7, 4)), "0007");
        assert_eq!(s(|o| write_padded(o, 12345, 4)), "12345");
    }

    #[test]
    fn number_grammar() {
        for ok in ["0", "-0", "12", "1.5", "-1.25e+20", "1e-07", "3E5"] {
            assert!(is_json_number(ok), "{ok}");
        }
        for bad in [
            "", "-", "01", "1.", ".5", "1e", "+1", "NaN", "Infinity", "1.5x", "0x10",
        ] {
            assert!(!is_json_number(bad), "{bad}");
        }
        assert!(is_json_integer("-42") && is_json_integer("0"));
        assert!(!is_json_integer("007") && !is_json_integer("1.0") && !is_json_integer("-"));
    }

    proptest! {
        #[test]
        fn escaping_matches_serde_json(v in any::<String>()) {
            prop_assert_eq!(s(|o| write_str(o, &v)), serde_json::to_string(&v).unwrap());
        }

        #[test]
        fn i64_matches_display(n in any::<i64>()) {
            prop_assert_eq!(s(|o| write_i64(o, n)), n.to_string());
        }

        #[test]
        fn displayed_floats_are_json_numbers(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let text = serde_json::to_string(&f).unwrap();
            prop_assert!(is_json_number(&text), "{}", text);
        }
    }
}
