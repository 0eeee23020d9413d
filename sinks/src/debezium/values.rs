//! One field's value of a Debezium-written event in oncely's wire form:
//! decimals as exact text, temporal precisions as µs, bits as bit strings.
//!
//! **Every size is bounded before anything is allocated**: a decimal's scale
//! and unscaled value by what PostgreSQL's `numeric` can hold, a bit
//! string's length by the bytes sent for it, and all converted values of one
//! record together by its [`Budget`]. A value beyond them is the record's
//! failure (a dead letter naming the column), never an allocation of
//! gigabytes or minutes of arithmetic: a `scale` of 2,000,000,000 would
//! write that many zeros, a `Bits` length of `i32::MAX` as many characters,
//! and a 700 KB unscaled value took ~10^11 steps to print.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::Value;

use super::{Conv, UNAVAILABLE, UNAVAILABLE_BASE64, UNAVAILABLE_HEX};

/// Largest scale of a PostgreSQL `numeric` value (`NUMERIC_MAX_DSCALE`):
/// digits after the point.
pub const MAX_NUMERIC_SCALE: i32 = 16_383;
/// Smallest declared scale of a PostgreSQL `numeric` column
/// (`NUMERIC_MIN_SCALE`, PostgreSQL 15: `numeric(p, -1000)`).
pub const MIN_NUMERIC_SCALE: i32 = -1_000;
/// Digits of the largest PostgreSQL `numeric`: 131,072 before the point
/// and [`MAX_NUMERIC_SCALE`] after it.
pub const MAX_NUMERIC_DIGITS: usize = 131_072 + MAX_NUMERIC_SCALE as usize;
/// Bytes of the two's-complement unscaled value of the largest `numeric`
/// ([`MAX_NUMERIC_DIGITS`] digits need 489,835 bits, and a sign bit).
pub const MAX_DECIMAL_BYTES: usize = 61_230;

/// What the converted values of one record may take together: the record's
/// own size times [`Budget::GROWTH`] plus [`Budget::ALLOWANCE`]. Debezium's
/// encodings are at most that much larger than oncely's (8 characters per
/// byte of bits; a fraction of `numeric`'s 16,383 digits from one byte), so
/// only a record made to blow up exhausts it.
#[derive(Debug, Clone)]
pub struct Budget {
    total: usize,
    left: usize,
}

impl Budget {
    /// Growth allowed per byte of the record.
    pub const GROWTH: usize = 8;
    /// Bytes allowed on top, whatever the record's size.
    pub const ALLOWANCE: usize = 256 * 1024;

    /// The budget of a record of `bytes` bytes (key or value).
    pub fn for_record(bytes: usize) -> Self {
        let total = bytes
            .saturating_mul(Self::GROWTH)
            .saturating_add(Self::ALLOWANCE);
        Self { total, left: total }
    }

    /// Takes `bytes` for a value about to be built, or says why it may not be.
    fn take(&mut self, bytes: usize) -> Result<(), String> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(format!(
                "its converted value needs {bytes} bytes, beyond what is left of the record's \
                 budget of {} bytes ({} times the record's size plus {} KiB)",
                self.total,
                Self::GROWTH,
                Self::ALLOWANCE / 1024
            )),
        }
    }
}

pub(super) fn convert(conv: &Conv, value: &mut Value, budget: &mut Budget) -> Result<(), String> {
    if value.is_null() || value.as_str() == Some(UNAVAILABLE) {
        return Ok(());
    }
    let new = match conv {
        Conv::Decimal { scale } => {
            let text = value
                .as_str()
                .ok_or("a Decimal must be base64 text".to_owned())?;
            budget.take(decimal_text_len(text, *scale)?)?;
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
            budget.take(decimal_text_len(text, scale)?)?;
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
            budget.take(text.len() + 7)?;
            Value::String(six_digit_fraction(text))
        }
        Conv::Bits { length } => {
            let text = value
                .as_str()
                .ok_or("Bits must be base64 text".to_owned())?;
            let bytes = BASE64
                .decode(text)
                .map_err(|e| format!("Bits are not base64: {e}"))?;
            let held = bytes.len().saturating_mul(8);
            if let Some(n) = length.filter(|n| *n as usize > held) {
                // Debezium pads `bit(n)` to whole bytes: a longer length is
                // not from a real column, and would be built bit by bit.
                return Err(format!(
                    "Bits of {n} bits sent in {} bytes, which hold at most {held}",
                    bytes.len()
                ));
            }
            budget.take(held.max(1))?;
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
                convert(element, item, budget)?;
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
        .ok_or_else(|| format!("expected an integer, got {}", crate::event::excerpt(value)))
}

/// Bytes of base64 text that decode to `bytes` bytes, padded.
const fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Bytes `base64` decodes to (its length without padding, times 3/4).
fn decoded_len(base64: &str) -> usize {
    let unpadded = base64.trim_end_matches('=').len();
    unpadded / 4 * 3 + (unpadded % 4).saturating_sub(1)
}

/// Checks a decimal's scale and the size of its unscaled value against
/// what a PostgreSQL `numeric` can hold, and returns an upper bound of the
/// length of its [`decimal_text`], all before anything is decoded.
fn decimal_text_len(base64: &str, scale: i32) -> Result<usize, String> {
    if !(MIN_NUMERIC_SCALE..=MAX_NUMERIC_SCALE).contains(&scale) {
        return Err(format!(
            "a decimal of scale {scale}: PostgreSQL's numeric has scales \
             {MIN_NUMERIC_SCALE}..={MAX_NUMERIC_SCALE}"
        ));
    }
    if base64.len() > base64_len(MAX_DECIMAL_BYTES) {
        return Err(format!(
            "a decimal whose unscaled value is {} bytes: PostgreSQL's largest numeric \
             needs {MAX_DECIMAL_BYTES}",
            decoded_len(base64)
        ));
    }
    // 8 bits of a byte need at most log10(256) < 2.41 digits; sign, point,
    // a leading zero and the zeros of the scale come on top.
    let digits = decoded_len(base64) * 241 / 100 + 1;
    Ok(digits + scale.unsigned_abs() as usize + 3)
}

/// The decimal text of a base64 big-endian two's-complement unscaled value
/// with `scale` digits after the point, as PostgreSQL prints a `numeric`.
/// Scales and values beyond PostgreSQL's `numeric` are refused (see the
/// module docs).
pub fn decimal_text(base64: &str, scale: i32) -> Result<String, String> {
    decimal_text_len(base64, scale)?;
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
    let whole = if scale <= 0 {
        digits.len() + scale.unsigned_abs() as usize
    } else {
        digits.len().saturating_sub(scale as usize)
    };
    if digits != "0" && whole > MAX_NUMERIC_DIGITS - MAX_NUMERIC_SCALE as usize {
        return Err(format!(
            "a decimal of {whole} digits before the point: PostgreSQL's numeric holds {}",
            MAX_NUMERIC_DIGITS - MAX_NUMERIC_SCALE as usize
        ));
    }
    let mut out = String::with_capacity(digits.len() + scale.unsigned_abs() as usize + 3);
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
/// Quadratic in the length, so only called within [`MAX_DECIMAL_BYTES`].
pub(super) fn magnitude_digits(bytes: &[u8]) -> String {
    // Little-endian limbs of 10^9, filled by schoolbook base conversion four
    // bytes at a time: a limb (< 2^30) times 2^32 plus the carry (< 2^33)
    // stays below 2^63.
    let mut limbs: Vec<u32> = Vec::with_capacity(bytes.len() * 241 / 900 + 1);
    let head = bytes.len() % 4;
    let chunks = (head > 0)
        .then(|| &bytes[..head])
        .into_iter()
        .chain(bytes[head..].chunks(4));
    for chunk in chunks {
        let shift = 8 * chunk.len() as u32;
        let mut carry = chunk.iter().fold(0u64, |n, &b| n << 8 | u64::from(b));
        for limb in limbs.iter_mut() {
            let v = (u64::from(*limb) << shift) + carry;
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
    let mut out = String::with_capacity(limbs.len() * 9);
    out.push_str(&top.to_string());
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
