//! The one configuration loader of the sinks: dotted keys flattened once,
//! deserialized with `deny_unknown_fields`, and the one [`ConfigError`] that
//! names the key and the fix.
//!
//! Keys are dotted like Debezium's and Kafka Connect's. TOML reads a bare
//! dotted key (`bulk.max.actions = 500`) as nested tables and a quoted one
//! (`"bulk.max.actions" = 500`) as one key; [`flatten`] turns both into the
//! quoted form, so a config struct names each key once, as
//! `#[serde(rename = "bulk.max.actions")]`, and never copies itself into a
//! nested mirror of its keys.

use serde::de::DeserializeOwned;

/// A bad configuration value, named by its configuration key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}`: {message}")]
pub struct ConfigError {
    /// The configuration key, e.g. `batch.max.records` or `sink.path`.
    pub key: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Checks that `value` of setting `key` lies in `min..=max`; the error names
/// both bounds and the value. The one range check of every config.
pub fn in_range<T: PartialOrd + std::fmt::Display>(
    key: impl Into<String>,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if min <= value && value <= max {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

/// How [`flatten`] treats leaf values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaves {
    /// As they are.
    Typed,
    /// Numbers and booleans as their text; arrays and dates refused (librdkafka
    /// properties are strings). `prefix` names the table in errors.
    Strings {
        /// The table the keys sit in, e.g. `kafka`.
        prefix: &'static str,
    },
}

/// `table` with nested tables turned into dotted keys (`a = { b = 1 }` and
/// `a.b = 1` become `"a.b" = 1`). A key written both bare and quoted is an error.
pub fn flatten(table: toml::Table, leaves: Leaves) -> Result<toml::Table, ConfigError> {
    let mut out = toml::Table::new();
    flatten_into(&mut out, "", table, leaves)?;
    Ok(out)
}

/// Adds `key = value` to `out`, flattening `value` when it is a table.
pub fn flatten_value(
    out: &mut toml::Table,
    key: String,
    value: toml::Value,
    leaves: Leaves,
) -> Result<(), ConfigError> {
    let value = match (value, leaves) {
        (toml::Value::Table(t), _) => return flatten_into(out, &key, t, leaves),
        (
            v @ (toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Float(_)),
            Leaves::Strings { .. },
        ) => toml::Value::String(v.to_string()),
        (v @ (toml::Value::Array(_) | toml::Value::Datetime(_)), Leaves::Strings { prefix }) => {
            let found = v.type_str();
            return Err(ConfigError::new(
                format!("{prefix}.{key}"),
                format!("expected a string, number or boolean, got {found}"),
            ));
        }
        (v, _) => v,
    };
    if out.contains_key(&key) {
        return Err(ConfigError::new(key, "set twice (bare and quoted)"));
    }
    out.insert(key, value);
    Ok(())
}

fn flatten_into(
    out: &mut toml::Table,
    prefix: &str,
    table: toml::Table,
    leaves: Leaves,
) -> Result<(), ConfigError> {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        flatten_value(out, full, value, leaves)?;
    }
    Ok(())
}

/// The section whose keys sit at the top of the file: its keys are told
/// without a prefix.
pub const TOP_SECTION: &str = "config";

/// Deserializes an already flattened table; errors are told under `section`
/// (e.g. `sink`), one line, without quoting the file. A key `T` does not
/// have is told with the nearest key it has ([`check_keys`]).
pub fn from_flat<T: DeserializeOwned>(flat: toml::Table, section: &str) -> Result<T, ConfigError> {
    check_keys(section, flat.keys().map(String::as_str), keys::<T>())?;
    // Through text, so that errors say which key (the line would be the
    // generated text's, so it is not told).
    let text = toml::to_string(&flat).map_err(|e| ConfigError::new(section, e.to_string()))?;
    toml::from_str(&text)
        .map_err(|e| ConfigError::new(section, crate::secret::generated_toml_error(&e, &text)))
}

/// Flattens `table`'s dotted keys and deserializes it; errors under `section`.
pub fn from_table<T: DeserializeOwned>(
    table: toml::Table,
    section: &str,
) -> Result<T, ConfigError> {
    from_flat(flatten(table, Leaves::Typed)?, section)
}

/// [`from_table`] of a TOML text (one section's keys, bare or quoted).
pub fn from_str<T: DeserializeOwned>(text: &str, section: &str) -> Result<T, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        ConfigError::new(
            section,
            format!("not valid TOML: {}", crate::toml_error(&e, text)),
        )
    })?;
    from_table(table, section)
}

/// The keys a configuration struct accepts: the field names its derived
/// `Deserialize` hands to `deserialize_struct` (renames applied, `skip`ped
/// fields left out), read by running it on a deserializer that only records
/// them. Empty when `T` is not a struct. The one source of truth for
/// [`check_keys`] and for the tests that hold the documentation to the code.
pub fn keys<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields = &[][..];
    // The probe always fails: it has no values to give, only the names.
    let _ = T::deserialize(FieldProbe(&mut fields));
    fields
}

/// A deserializer that records the fields of the struct asked of it.
struct FieldProbe<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Probed;

impl std::fmt::Display for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields recorded")
    }
}

impl std::error::Error for Probed {}

impl serde::de::Error for Probed {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Probed
    }
}

impl<'de> serde::Deserializer<'de> for FieldProbe<'_> {
    type Error = Probed;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Probed> {
        *self.0 = fields;
        Err(Probed)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Refuses the first of `present` (keys of `section`) that is not one of
/// `known`, telling the nearest known key when one is near enough to be a
/// slip of the keyboard: a person needs the one key they meant, not a list of
/// forty. Nothing is checked when `known` is empty (not a struct).
pub fn check_keys<'a>(
    section: &str,
    present: impl IntoIterator<Item = &'a str>,
    known: &[&str],
) -> Result<(), ConfigError> {
    if known.is_empty() {
        return Ok(());
    }
    let Some(unknown) = present.into_iter().find(|k| !known.contains(k)) else {
        return Ok(());
    };
    // Keys are told as a person finds them in the file and the docs.
    let told = |key: &str| {
        if section == TOP_SECTION {
            key.to_owned()
        } else {
            format!("{section}.{key}")
        }
    };
    let message = match nearest(unknown, known) {
        Some(near) => format!(
            "unknown key `{}`; did you mean `{}`?",
            told(unknown),
            told(near)
        ),
        None => format!(
            "unknown key `{}` (every key is in docs/configuration.md)",
            told(unknown)
        ),
    };
    Err(ConfigError::new(section, message))
}

/// The known key closest to `key` by edits (a swapped pair of letters counts
/// once), when it is within a third of the key's length: farther than that it
/// is another word, and a guess would mislead.
fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let (distance, near) = known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .min()?;
    (distance <= (key.chars().count() / 3).max(1)).then_some(near)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_range_names_the_bounds_and_the_value() {
        assert_eq!(in_range("batch.max.ms", 1u64, 1, 10), Ok(()));
        assert_eq!(in_range("batch.max.ms", 10u64, 1, 10), Ok(()));
        let e = in_range("batch.max.ms", 0u64, 1, 10).expect_err("below");
        assert_eq!(
            e.to_string(),
            "`batch.max.ms`: must be between 1 and 10, got 0"
        );
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        #[serde(rename = "bulk.max.actions", default)]
        actions: u32,
        #[serde(default)]
        url: String,
    }

    #[test]
    fn bare_and_quoted_dotted_keys_mean_the_same() {
        let bare: Sample = from_str("bulk.max.actions = 7\nurl = \"u\"", "sink").expect("bare");
        let quoted: Sample = from_str("\"bulk.max.actions\" = 7", "sink").expect("quoted");
        assert_eq!((bare.actions, bare.url.as_str()), (7, "u"));
        assert_eq!(quoted.actions, 7);
    }

    #[test]
    fn a_misspelt_key_is_told_the_nearest_valid_key() {
        let e = from_str::<Sample>("bulk.max.actoins = 1", "sink").expect_err("typo");
        assert_eq!(
            e.to_string(),
            "`sink`: unknown key `sink.bulk.max.actoins`; did you mean `sink.bulk.max.actions`?"
        );
        // Under the `config` section, keys sit at the top of the file.
        let e = from_str::<Sample>("ulr = \"u\"", "config").expect_err("typo");
        assert_eq!(e.message, "unknown key `ulr`; did you mean `url`?");
        // Nothing near: no guess, and no list of every key either.
        let e = from_str::<Sample>("compression = \"zstd\"", "config").expect_err("far");
        assert_eq!(
            e.message,
            "unknown key `compression` (every key is in docs/configuration.md)"
        );
    }

    #[test]
    fn unknown_and_doubled_keys_are_named() {
        let e = from_str::<Sample>("bulk.max.actoins = 1", "sink").expect_err("typo");
        assert_eq!(e.key, "sink");
        assert!(e.message.contains("bulk.max.actoins"), "{e}");
        let e = from_str::<Sample>("bulk.max.actions = 1\n\"bulk.max.actions\" = 2", "sink")
            .expect_err("twice");
        assert_eq!(e.key, "bulk.max.actions");
        assert!(e.message.contains("set twice"), "{e}");
    }

    #[test]
    fn a_bad_value_is_told_by_its_key_not_by_a_generated_line() {
        let e = from_str::<Sample>("url = \"u\"\n\n[bulk]\nmax.actions = \"many\"", "sink")
            .expect_err("type");
        assert!(e.message.starts_with("key `bulk.max.actions`: "), "{e}");
        assert!(!e.message.contains("line"), "{e}");
    }

    #[test]
    fn string_leaves_refuse_arrays() {
        let table: toml::Table = toml::from_str("linger.ms = 5\nacks = [1]").expect("toml");
        let e = flatten(table, Leaves::Strings { prefix: "kafka" }).expect_err("array");
        assert_eq!(e.key, "kafka.acks");
        let table: toml::Table = toml::from_str("linger.ms = 5").expect("toml");
        let flat = flatten(table, Leaves::Strings { prefix: "kafka" }).expect("flat");
        assert_eq!(flat["linger.ms"].as_str(), Some("5"));
    }
}
