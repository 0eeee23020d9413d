//! One field's value of a Debezium-written event in oncely's wire form:
//! decimals as exact text, temporal precisions as µs, bits as bit strings.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::Value;

use super::{Conv, UNAVAILABLE, UNAVAILABLE_BASE64, UNAVAILABLE_HEX};

pub(super) fn convert(conv: &Conv, value: &mut Value) -> Result<(), String> {
    if value.is_null() || value.as_str() == Some(UNAVAILABLE) {
        return Ok(());
    }
    let new = match conv {
        Conv::Decimal { scale } => {
            let text = value
                .as_str()
                .ok_or("a Decimal must be base64 text".to_owned())?;
            Value::String(decimal_text(text, *scale)?)
        }
        Conv::VariableScaleDecimal => {
            let scale = value
                .get("scale")
                .and_then(Value::as_i64)
                .and_then(|s| i32::try_from(s).ok())
                .ok_or("a VariableScaleDecimal needs an integer `scale`".to_owned())?;
            let text = value
                .get("value")
                .and_then(Value::as_str)
                .ok_or("a VariableScaleDecimal needs base64 `value`".to_owned())?;
            Value::String(decimal_text(text, scale)?)
        }
        Conv::Multiply(factor) => {
            let n = integer(value)?;
            Value::from(
                n.checked_mul(*factor)
                    .ok_or_else(|| format!("{n} is out of range"))?,
            )
        }
        Conv::Divide(divisor) => Value::from(integer(value)?.div_euclid(*divisor)),
        Conv::SixDigitFraction => {
            let text = value.as_str().ok_or("expected text".to_owned())?;
            Value::String(six_digit_fraction(text))
        }
        Conv::Bits { length } => {
            let text = value
                .as_str()
                .ok_or("Bits must be base64 text".to_owned())?;
            let bytes = BASE64
                .decode(text)
                .map_err(|e| format!("Bits are not base64: {e}"))?;
            Value::String(bit_string(&bytes, *length))
        }
        Conv::Point => {
            let coordinate = |k: &str| {
                value
                    .get(k)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| format!("a Point needs a numeric `{k}`"))
            };
            Value::String(format!("({},{})", coordinate("x")?, coordinate("y")?))
        }
        Conv::Bytes => match value.as_str() {
            Some(s) if s == UNAVAILABLE_BASE64 || s == UNAVAILABLE_HEX => {
                Value::String(UNAVAILABLE.to_owned())
            }
            _ => return Ok(()),
        },
        Conv::Array(element) => {
            let items = value.as_array_mut().ok_or("expected an array".to_owned())?;
            for item in items {
                convert(element, item)?;
            }
            return Ok(());
        }
    };
    *value = new;
    Ok(())
}

pub(super) fn integer(value: &Value) -> Result<i64, String> {
    value
        .as_i64()
        .ok_or_else(|| format!("expected an integer, got {value}"))
}

/// The decimal text of a base64 big-endian two's-complement unscaled value
/// with `scale` digits after the point, as PostgreSQL prints a `numeric`.
pub fn decimal_text(base64: &str, scale: i32) -> Result<String, String> {
    let mut bytes = BASE64
        .decode(base64)
        .map_err(|e| format!("a Decimal must be base64 ({e})"))?;
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    if negative {
        // Two's complement: the magnitude is the inverted bits plus one.
        for b in bytes.iter_mut() {
            *b = !*b;
        }
        for b in bytes.iter_mut().rev() {
            let (sum, carry) = b.overflowing_add(1);
            *b = sum;
            if !carry {
                break;
            }
        }
    }
    let mut digits = magnitude_digits(&bytes);
    let mut out = String::with_capacity(digits.len() + 3);
    if negative && digits != "0" {
        out.push('-');
    }
    if scale <= 0 {
        if digits != "0" {
            digits.extend(std::iter::repeat_n('0', scale.unsigned_abs() as usize));
        }
        out.push_str(&digits);
        return Ok(out);
    }
    let scale = scale as usize;
    if digits.len() <= scale {
        let zeros = scale + 1 - digits.len();
        digits.insert_str(0, &"0".repeat(zeros));
    }
    let point = digits.len() - scale;
    out.push_str(&digits[..point]);
    out.push('.');
    out.push_str(&digits[point..]);
    Ok(out)
}

/// The decimal digits of a big-endian unsigned integer (`"0"` for none).
pub(super) fn magnitude_digits(bytes: &[u8]) -> String {
    // Little-endian limbs of 10^9, filled by schoolbook base conversion.
    let mut limbs: Vec<u32> = Vec::new();
    for &byte in bytes {
        let mut carry = u64::from(byte);
        for limb in limbs.iter_mut() {
            let v = u64::from(*limb) * 256 + carry;
            *limb = (v % 1_000_000_000) as u32;
            carry = v / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push((carry % 1_000_000_000) as u32);
            carry /= 1_000_000_000;
        }
    }
    let Some((top, rest)) = limbs.split_last() else {
        return "0".to_owned();
    };
    let mut out = top.to_string();
    for limb in rest.iter().rev() {
        out.push_str(&format!("{limb:09}"));
    }
    out
}

/// ISO-8601 text with exactly six fraction digits before its zone (`Z` or
/// an offset), as capture writes `ZonedTimestamp` and `ZonedTime`.
pub(super) fn six_digit_fraction(text: &str) -> String {
    // The seconds end where the zone begins: at `Z`, or at a sign after the time.
    let time_start = text.find('T').map_or(0, |t| t + 1);
    let zone = text[time_start..]
        .find(['Z', '+', '-'])
        .map_or(text.len(), |z| time_start + z);
    let (clock, tail) = text.split_at(zone);
    let (whole, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return text.to_owned();
    }
    let mut six: String = fraction.chars().take(6).collect();
    while six.len() < 6 {
        six.push('0');
    }
    format!("{whole}.{six}{tail}")
}

/// The bit string of Debezium's `Bits` bytes (bit 0 is the last character).
pub(super) fn bit_string(bytes: &[u8], length: Option<u32>) -> String {
    let set = |i: usize| bytes.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1);
    let length = match length {
        Some(n) => n as usize,
        // Unknown length (`varbit`): as many bits as the highest set one needs.
        None => (0..bytes.len() * 8)
            .rev()
            .find(|&i| set(i))
            .map_or(1, |i| i + 1),
    };
    (0..length)
        .rev()
        .map(|i| if set(i) { '1' } else { '0' })
        .collect()
}
