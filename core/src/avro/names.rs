//! Names Avro refuses, adjusted as Debezium's `schema.name.adjustment.mode`
//! and `field.name.adjustment.mode` say: `avro` replaces each character
//! Avro does not allow with `_`, `avro_unicode` with `_uXXXX` (its code
//! point, four lowercase hex digits), `none` leaves the name as it is.
//!
//! Avro allows letters, digits and `_` in a name, not a digit first; a full
//! name is such names joined by `.`. Debezium replaces a leading digit too
//! (`1st` becomes `_st`), and so do these.

use std::str::FromStr;

/// One of Debezium's name adjustment modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NameMode {
    /// No adjustment: a field name Avro refuses is an error naming it.
    #[default]
    None,
    /// Each refused character becomes `_`.
    Avro,
    /// Each refused character becomes `_uXXXX`.
    AvroUnicode,
}

impl FromStr for NameMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "avro" => Ok(Self::Avro),
            "avro_unicode" => Ok(Self::AvroUnicode),
            other => Err(format!("`{other}` is not one of none, avro, avro_unicode")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for NameMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How capture adjusts the names of the schemas it registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NameAdjustment {
    /// `schema.name.adjustment.mode`: record names.
    pub schema: NameMode,
    /// `field.name.adjustment.mode`: field names.
    pub field: NameMode,
}

/// Letters, digits and `_`, not starting with a digit.
pub(super) fn is_avro_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name` made a valid Avro name under `mode` (`None`: unchanged).
pub fn adjust(name: &str, mode: NameMode) -> String {
    if mode == NameMode::None || is_avro_name(name) {
        return name.to_owned();
    }
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        let allowed = c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit());
        if allowed {
            out.push(c);
        } else if mode == NameMode::Avro {
            out.push('_');
        } else {
            // Debezium writes the UTF-16 unit, four hex digits each.
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("_u{u:04x}"));
            }
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// A dotted full name made valid part by part. Record names are always
/// made valid (`none` adjusts as `avro`, as oncely always did: a part
/// starting with a digit gets a `_` first, so `2t` and `3t` stay apart):
/// the exact Connect name travels in `connect.name`, so nothing is lost and
/// readers get it back.
pub(super) fn adjust_fullname(name: &str, mode: NameMode) -> String {
    name.split('.')
        .map(|part| match mode {
            NameMode::AvroUnicode => adjust(part, mode),
            NameMode::None | NameMode::Avro => {
                let mut p: String = part
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '_' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                if !p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    p.insert(0, '_');
                }
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_adjusted_as_debezium_does() {
        for (name, avro, unicode) in [
            ("my-col", "my_col", "my_u002dcol"),
            ("1st", "_st", "_u0031st"),
            ("é", "_", "_u00e9"),
            ("ok_1", "ok_1", "ok_1"),
        ] {
            assert_eq!(adjust(name, NameMode::Avro), avro, "{name}");
            assert_eq!(adjust(name, NameMode::AvroUnicode), unicode, "{name}");
            assert_eq!(adjust(name, NameMode::None), name);
            assert!(is_avro_name(avro) && is_avro_name(unicode), "{name}");
        }
        assert_eq!(
            adjust_fullname("my-shop.public.2t.Value", NameMode::None),
            "my_shop.public._2t.Value"
        );
        assert_eq!(
            adjust_fullname("my-shop.t", NameMode::AvroUnicode),
            "my_u002dshop.t"
        );
        assert_eq!("avro_unicode".parse(), Ok(NameMode::AvroUnicode));
        assert!("AVRO".parse::<NameMode>().is_err());
    }
}
