//! Parsers for the non-temporal scalar text forms: boolean, floats, money,
//! bytea.
//!
//! Each returns `None` for input it does not recognise; the caller then
//! emits the text unchanged, so an unexpected server setting degrades to a
//! string instead of failing the event.

use base64::Engine as _;

/// `boolean` output is `t`/`f`; the long forms are accepted for safety.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "t" | "true" => Some(true),
        "f" | "false" => Some(false),
        _ => None,
    }
}

/// A `float4`/`float8` value on the wire: a JSON number, or one of the
/// three strings JSON has for what it cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloatText<'a> {
    /// Text that is a JSON number literal, written as it is (PostgreSQL's
    /// shortest exact spelling, e.g. `1e+308`).
    Number(std::borrow::Cow<'a, str>),
    /// `"NaN"`, `"Infinity"` or `"-Infinity"`: exactly what Kafka Connect's
    /// JSON converter (Jackson, `QUOTE_NON_NUMERIC_NUMBERS`) writes for a
    /// non-finite double, so Debezium consumers read them unchanged.
    NonFinite(&'static str),
}

/// The wire form of float text; `None` for text that is no float at all.
///
/// PostgreSQL writes `NaN`, `Infinity` and `-Infinity`; other spellings a
/// float parser takes (`nan`, `inf`, `+Infinity`) map to the same three
/// strings, and finite text that is not a JSON literal (`.5`, `+1`, `1.`)
/// is respelled as one, so a float field never carries any other string.
pub fn parse_float(s: &str) -> Option<FloatText<'_>> {
    if crate::json::is_json_number(s) {
        return Some(FloatText::Number(std::borrow::Cow::Borrowed(s)));
    }
    let f: f64 = s.trim().parse().ok()?;
    Some(if f.is_nan() {
        FloatText::NonFinite(NAN)
    } else if f == f64::INFINITY {
        FloatText::NonFinite(INFINITY)
    } else if f == f64::NEG_INFINITY {
        FloatText::NonFinite(NEG_INFINITY)
    } else {
        // `{:?}` is Rust's shortest round-trip spelling, always with a
        // fraction or an exponent (`0.5`, `1e300`): a JSON literal.
        FloatText::Number(std::borrow::Cow::Owned(format!("{f:?}")))
    })
}

/// The wire strings of the non-finite floats (Jackson's spelling).
pub const NAN: &str = "NaN";
/// See [`NAN`].
pub const INFINITY: &str = "Infinity";
/// See [`NAN`].
pub const NEG_INFINITY: &str = "-Infinity";

/// `money` text -> exact decimal digits, e.g. `-$1,234.56` -> `-1234.56`.
///
/// PostgreSQL formats `money` with the session's `lc_monetary`: a currency
/// symbol, thousands separators and a locale's decimal mark. We drop the
/// symbol and any other non-digit decoration, and read the sign from a `-`
/// or from accounting parentheses. The decimal mark is the last `.` or `,`
/// when both occur (`1.234,56 €`); when only one kind occurs it is a
/// thousands separator if it repeats or if exactly three digits follow it
/// (`￥1,234`), else the decimal mark (`12,34 €`). This is exact for the
/// `C`/`en_US` style that replication sessions normally use; a locale with
/// three fraction digits and no thousands group is misread, which is why
/// `lc_monetary=C` is the recommended setting.
pub fn normalize_money(s: &str) -> Option<String> {
    let negative = s.contains('-') || (s.trim().starts_with('(') && s.trim().ends_with(')'));
    let kept: Vec<u8> = s
        .bytes()
        .filter(|b| b.is_ascii_digit() || *b == b'.' || *b == b',')
        .collect();
    if !kept.iter().any(u8::is_ascii_digit) {
        return None;
    }
    let dots = kept.iter().filter(|&&b| b == b'.').count();
    let commas = kept.iter().filter(|&&b| b == b',').count();
    let decimal_at = match (dots, commas) {
        (0, 0) => None,
        (_, 0) | (0, _) => {
            let pos = kept.iter().rposition(|&b| b == b'.' || b == b',')?;
            let after = kept.len() - pos - 1;
            if dots + commas > 1 || after == 3 {
                None
            } else {
                Some(pos)
            }
        }
        _ => kept.iter().rposition(|&b| b == b'.' || b == b','),
    };
    let (int_part, frac_part) = match decimal_at {
        Some(p) => (&kept[..p], &kept[p + 1..]),
        None => (&kept[..], &[][..]),
    };
    let int_digits: Vec<u8> = int_part
        .iter()
        .copied()
        .filter(u8::is_ascii_digit)
        .collect();
    if !frac_part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let int_trimmed = match int_digits.iter().position(|&b| b != b'0') {
        Some(first) => &int_digits[first..],
        None => b"0",
    };
    let mut out = String::with_capacity(int_trimmed.len() + frac_part.len() + 2);
    let is_zero = int_trimmed == b"0" && frac_part.iter().all(|&b| b == b'0');
    if negative && !is_zero {
        out.push('-');
    }
    out.extend(int_trimmed.iter().map(|&b| char::from(b)));
    if !frac_part.is_empty() {
        out.push('.');
        out.extend(frac_part.iter().map(|&b| char::from(b)));
    }
    Some(out)
}

/// `bytea` text -> base64 of the bytes. Understands both `bytea_output`
/// settings: `hex` (`\x0a0b`, the default) and `escape` (`a\000\\b`).
pub fn bytea_to_base64(s: &str) -> Option<String> {
    let bytes = decode_bytea(s)?;
    Some(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn decode_bytea(s: &str) -> Option<Vec<u8>> {
    if let Some(hex) = s.strip_prefix("\\x") {
        let h = hex.as_bytes();
        if h.len() % 2 != 0 {
            return None;
        }
        return h
            .chunks_exact(2)
            .map(|pair| Some(hex_val(pair[0])? << 4 | hex_val(pair[1])?))
            .collect();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
        } else if b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let oct = b.get(i + 1..i + 4)?;
            if !oct.iter().all(|c| (b'0'..=b'7').contains(c)) || oct[0] > b'3' {
                return None;
            }
            out.push((oct[0] - b'0') << 6 | (oct[1] - b'0') << 3 | (oct[2] - b'0'));
            i += 4;
        }
    }
    Some(out)
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans() {
        assert_eq!(parse_bool("t"), Some(true));
        assert_eq!(parse_bool("f"), Some(false));
        assert_eq!(parse_bool("yes"), None);
    }

    #[test]
    fn money_c_locale() {
        assert_eq!(normalize_money("$1,234.56").as_deref(), Some("1234.56"));
        assert_eq!(normalize_money("-$1,234.56").as_deref(), Some("-1234.56"));
        assert_eq!(normalize_money("$-0.01").as_deref(), Some("-0.01"));
        assert_eq!(normalize_money("($5.00)").as_deref(), Some("-5.00"));
        assert_eq!(normalize_money("$0.00").as_deref(), Some("0.00"));
        assert_eq!(normalize_money("-$0.00").as_deref(), Some("0.00"));
        assert_eq!(
            normalize_money("$92,233,720,368,547,758.07").as_deref(),
            Some("92233720368547758.07")
        );
    }

    #[test]
    fn money_other_locales() {
        assert_eq!(normalize_money("1.234,56 €").as_deref(), Some("1234.56"));
        assert_eq!(normalize_money("12,34 €").as_deref(), Some("12.34"));
        assert_eq!(normalize_money("￥1,234").as_deref(), Some("1234"));
        assert_eq!(normalize_money("1 234,56 zł").as_deref(), Some("1234.56"));
        assert_eq!(normalize_money("CHF 1'234.50").as_deref(), Some("1234.50"));
        assert_eq!(normalize_money("-1.234.567 ₫").as_deref(), Some("-1234567"));
    }

    #[test]
    fn money_garbage() {
        assert_eq!(normalize_money(""), None);
        assert_eq!(normalize_money("$"), None);
        assert_eq!(normalize_money("..."), None);
    }

    #[test]
    fn bytea_hex_and_escape() {
        assert_eq!(bytea_to_base64("\\x").as_deref(), Some(""));
        assert_eq!(bytea_to_base64("\\x0a0bFF").as_deref(), Some("Cgv/"));
        assert_eq!(
            bytea_to_base64("ab\\000\\\\\\377").as_deref(),
            Some("YWIAXP8=")
        );
        assert_eq!(bytea_to_base64("\\x0"), None);
        assert_eq!(bytea_to_base64("\\xzz"), None);
        assert_eq!(bytea_to_base64("\\9"), None);
        assert_eq!(bytea_to_base64("\\4000"), None);
    }
}
