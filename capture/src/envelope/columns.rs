//! Which columns leave the database, and how masked: Debezium's
//! `column.include.list` / `column.exclude.list`, `column.mask.with.<N>.chars`,
//! `column.truncate.to.<N>.chars` and `column.mask.hash[.v2].<algorithm>.with.salt.<salt>`
//! (docs/design.md, "Column selection and masking").
//!
//! The policy is applied by the [`super::TableEncoder`], the one place a row
//! becomes bytes, so snapshot rows, streamed rows, a primary-key change's old
//! row, REPLICA IDENTITY FULL `before` images and rows completed from the
//! source all pass through it; `oncely verify` masks the source's values with
//! the same [`Mask::apply`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use regex::{Regex, RegexBuilder};

use crate::secret::{resolve_reference, Secret};

/// Whether a column holds character data, and its declared length: masks
/// apply to character columns only, and a hash is cut to the declared length
/// (as Debezium's `MaskStrings` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Characters {
    /// Not character data (numbers, times, bytes...).
    No,
    /// Character data of any length (`text`).
    Unbounded,
    /// Character data of at most this many characters (`varchar(n)`, `char(n)`).
    UpTo(usize),
}

/// Why the column settings cannot be used; names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ColumnSettingError {
    pub key: String,
    pub message: String,
}

fn setting_error(key: impl Into<String>, message: impl Into<String>) -> ColumnSettingError {
    ColumnSettingError {
        key: key.into(),
        message: message.into(),
    }
}

/// A digest Java's `MessageDigest` knows by this name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashAlgorithm {
    Md5,
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl HashAlgorithm {
    /// Java's standard names, case-insensitive as Java's are.
    fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "MD5" => Self::Md5,
            "SHA-1" | "SHA1" | "SHA" => Self::Sha1,
            "SHA-224" => Self::Sha224,
            "SHA-256" => Self::Sha256,
            "SHA-384" => Self::Sha384,
            "SHA-512" => Self::Sha512,
            _ => return None,
        })
    }

    fn digest(self, salt: &[u8], data: &[u8]) -> Vec<u8> {
        fn run<D: sha2::Digest>(salt: &[u8], data: &[u8]) -> Vec<u8> {
            let mut d = D::new();
            d.update(salt);
            d.update(data);
            d.finalize().to_vec()
        }
        match self {
            Self::Md5 => run::<md5::Md5>(salt, data),
            Self::Sha1 => {
                use sha1::Digest as _;
                let mut d = sha1::Sha1::new();
                d.update(salt);
                d.update(data);
                d.finalize().to_vec()
            }
            Self::Sha224 => run::<sha2::Sha224>(salt, data),
            Self::Sha256 => run::<sha2::Sha256>(salt, data),
            Self::Sha384 => run::<sha2::Sha384>(salt, data),
            Self::Sha512 => run::<sha2::Sha512>(salt, data),
        }
    }
}

/// Which bytes of a value are hashed: Debezium's `HashingByteArrayStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashVersion {
    /// `V1`: the value as Java serialization writes a `String` (a stream
    /// header, a type tag and a length, then modified UTF-8).
    V1,
    /// `V2`: the value's UTF-8 bytes alone, so any other tool can compute
    /// the same pseudonym.
    V2,
}

/// What happens to one column's values.
#[derive(Clone, PartialEq, Eq)]
pub enum Mask {
    /// `column.mask.with.<N>.chars`: `*` × N.
    Chars(usize),
    /// `column.truncate.to.<N>.chars`: the first N characters (UTF-16 units,
    /// as Java counts them, never splitting a surrogate pair).
    Truncate(usize),
    /// `column.mask.hash...`: the lowercase hex digest of the salt and the
    /// value, cut to the column's declared length.
    Hash {
        algorithm: HashAlgorithm,
        version: HashVersion,
        salt: Secret,
    },
}

impl fmt::Debug for Mask {
    // The salt is a secret: never in a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mask::Chars(n) => write!(f, "Chars({n})"),
            Mask::Truncate(n) => write!(f, "Truncate({n})"),
            Mask::Hash {
                algorithm, version, ..
            } => write!(f, "Hash({algorithm:?}, {version:?}, salt: ***)"),
        }
    }
}

impl Mask {
    /// The value `text` of a column whose characters are `chars`, masked.
    pub fn apply<'a>(&self, text: &'a str, chars: Characters) -> Cow<'a, str> {
        match self {
            Mask::Chars(n) => Cow::Owned("*".repeat(*n)),
            Mask::Truncate(n) => Cow::Borrowed(truncate_utf16(text, *n)),
            Mask::Hash {
                algorithm,
                version,
                salt,
            } => {
                let data = match version {
                    HashVersion::V1 => java_serialized_string(text),
                    HashVersion::V2 => text.as_bytes().to_vec(),
                };
                let digest = algorithm.digest(salt.expose().as_bytes(), &data);
                let mut hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                if let Characters::UpTo(len) = chars {
                    hex.truncate(len.min(hex.len()));
                }
                Cow::Owned(hex)
            }
        }
    }

    /// The parameter Debezium adds to the field's Connect schema, if any
    /// (`truncateLength` only where a value can be longer than N).
    pub fn schema_parameter(&self, chars: Characters) -> Option<(&'static str, String)> {
        match self {
            Mask::Chars(_) | Mask::Hash { .. } => Some(("masked", "true".into())),
            Mask::Truncate(n) => match chars {
                Characters::UpTo(len) if len <= *n => None,
                _ => Some(("truncateLength", n.to_string())),
            },
        }
    }

    /// Whether the mask changes nothing for a column of `chars` (a
    /// truncation longer than the declared length).
    fn is_noop(&self, chars: Characters) -> bool {
        matches!((self, chars), (Mask::Truncate(n), Characters::UpTo(len)) if len <= *n)
    }
}

/// At most `n` UTF-16 units of `text` (Java's `String.substring(0, n)`),
/// ending before a surrogate pair that would be cut.
fn truncate_utf16(text: &str, n: usize) -> &str {
    let mut units = 0;
    for (at, c) in text.char_indices() {
        units += c.len_utf16();
        if units > n {
            return &text[..at];
        }
    }
    text
}

/// `text` as `ObjectOutputStream.writeObject(String)` writes it into a fresh
/// stream: magic `AC ED`, version `00 05`, then `TC_STRING` and a 2-byte
/// length, or `TC_LONGSTRING` and an 8-byte length past 65535 bytes, then
/// Java's modified UTF-8 (NUL as two bytes, supplementary characters as two
/// 3-byte surrogates).
fn java_serialized_string(text: &str) -> Vec<u8> {
    let mut utf = Vec::with_capacity(text.len() + 8);
    for unit in text.encode_utf16() {
        match unit {
            0x0001..=0x007F => utf.push(unit as u8),
            0x0000 | 0x0080..=0x07FF => {
                utf.push(0xC0 | (unit >> 6) as u8);
                utf.push(0x80 | (unit & 0x3F) as u8);
            }
            _ => {
                utf.push(0xE0 | (unit >> 12) as u8);
                utf.push(0x80 | ((unit >> 6) & 0x3F) as u8);
                utf.push(0x80 | (unit & 0x3F) as u8);
            }
        }
    }
    let mut out = vec![0xAC, 0xED, 0x00, 0x05];
    match u16::try_from(utf.len()) {
        Ok(len) => {
            out.push(0x74);
            out.extend_from_slice(&len.to_be_bytes());
        }
        Err(_) => {
            out.push(0x7C);
            out.extend_from_slice(&(utf.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&utf);
    out
}

/// What the policy does with one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnAction<'a> {
    Keep,
    /// Not published (`column.include.list` / `column.exclude.list`).
    Exclude,
    Mask(&'a Mask),
}

/// One masking rule: the columns it names (whole-name regular expressions
/// on `<schema>.<table>.<column>`) and its mask; `key` is its setting.
struct Rule {
    key: String,
    columns: Vec<Regex>,
    mask: Mask,
}

#[derive(Default)]
struct Policy {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
    /// Masks before truncations (a column both name is masked, never sent
    /// cut but readable), in the order of their keys.
    rules: Vec<Rule>,
    /// `column.propagate.source.type`: on `<schema>.<table>.<column>`.
    propagate_columns: Vec<Regex>,
    /// `datatype.propagate.source.type`: on the column's type name.
    propagate_types: Vec<Regex>,
    /// The settings as given, to compare two policies (never shown: a
    /// hash key may hold its salt).
    spec: Vec<String>,
}

/// The column settings of a capture, compiled once; cheap to clone.
#[derive(Clone, Default)]
pub struct ColumnPolicy(Arc<Policy>);

impl fmt::Debug for ColumnPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ColumnPolicy")
            .field("include", &self.0.include.len())
            .field("exclude", &self.0.exclude.len())
            .field("rules", &self.0.rules.len())
            .finish()
    }
}

impl PartialEq for ColumnPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.0.spec == other.0.spec
    }
}

impl Eq for ColumnPolicy {}

/// The column settings as the configuration holds them.
#[derive(Debug, Clone, Copy)]
pub struct ColumnSettings<'a> {
    pub include: &'a [String],
    pub exclude: &'a [String],
    /// `column.mask.*`, keyed by what follows `column.mask.`.
    pub mask: &'a BTreeMap<String, String>,
    /// `column.truncate.*`, keyed by what follows `column.truncate.`.
    pub truncate: &'a BTreeMap<String, String>,
    /// `column.propagate.source.type`.
    pub propagate_columns: &'a [String],
    /// `datatype.propagate.source.type`.
    pub propagate_types: &'a [String],
}

/// Whole-name, case-insensitive (as Debezium's column lists) regular expressions.
fn column_regexes<'a>(
    key: &str,
    patterns: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Regex>, ColumnSettingError> {
    patterns
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            RegexBuilder::new(&format!("^(?:{p})$"))
                .case_insensitive(true)
                .build()
                .map_err(|e| setting_error(key, format!("{p:?} is not a regular expression: {e}")))
        })
        .collect()
}

/// `with.<N>.chars` or `hash[.v2].<algorithm>.with.salt.<salt>` (the rest of
/// a `column.mask.` key); the salt may be a `${env:}`/`${file:}` reference.
fn parse_mask(key: &str, rest: &str) -> Result<Mask, ColumnSettingError> {
    if let Some(n) = rest
        .strip_prefix("with.")
        .and_then(|r| r.strip_suffix(".chars"))
    {
        let n = n
            .parse()
            .map_err(|_| setting_error(key, "expected column.mask.with.<N>.chars, N a number"))?;
        return Ok(Mask::Chars(n));
    }
    let Some(hash) = rest.strip_prefix("hash.") else {
        return Err(setting_error(
            key,
            "expected column.mask.with.<N>.chars or column.mask.hash[.v2].<algorithm>.with.salt.<salt>",
        ));
    };
    let (version, hash) = match hash.strip_prefix("v2.") {
        Some(h) => (HashVersion::V2, h),
        None => (HashVersion::V1, hash),
    };
    let (name, salt) = hash
        .split_once(".with.salt.")
        .filter(|(name, salt)| !name.contains('.') && !salt.is_empty())
        .ok_or_else(|| {
            setting_error(
                key,
                "expected column.mask.hash[.v2].<algorithm>.with.salt.<salt>",
            )
        })?;
    let algorithm = HashAlgorithm::parse(name).ok_or_else(|| {
        setting_error(
            key,
            format!(
                "unknown hash algorithm {name:?}: MD5, SHA-1, SHA-224, SHA-256, SHA-384 or SHA-512"
            ),
        )
    })?;
    // The key text holds the salt or its reference: the error names neither.
    let salt = resolve_reference(salt)
        .map_err(|e| setting_error("column.mask.hash", format!("the salt of a hash mask: {e}")))?;
    Ok(Mask::Hash {
        algorithm,
        version,
        salt: Secret::new(salt),
    })
}

fn parse_truncate(key: &str, rest: &str) -> Result<Mask, ColumnSettingError> {
    let n: usize = rest
        .strip_prefix("to.")
        .and_then(|r| r.strip_suffix(".chars"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| setting_error(key, "expected column.truncate.to.<N>.chars, N a number"))?;
    if n == 0 {
        return Err(setting_error(key, "N must be positive"));
    }
    Ok(Mask::Truncate(n))
}

/// A hash key names its salt: errors name the key without it.
fn shown_key(prefix: &str, rest: &str) -> String {
    match rest.split_once(".with.salt.") {
        Some((head, _)) => format!("{prefix}.{head}.with.salt.***"),
        None => format!("{prefix}.{rest}"),
    }
}

impl ColumnPolicy {
    /// Compiles the settings; an error names the key (a hash key without its salt).
    pub fn new(s: ColumnSettings<'_>) -> Result<Self, ColumnSettingError> {
        if !s.include.is_empty() && !s.exclude.is_empty() {
            return Err(setting_error(
                "column.include.list",
                "column.include.list and column.exclude.list cannot both be set",
            ));
        }
        let mut policy = Policy {
            include: column_regexes("column.include.list", s.include.iter().map(String::as_str))?,
            exclude: column_regexes("column.exclude.list", s.exclude.iter().map(String::as_str))?,
            propagate_columns: column_regexes(
                "column.propagate.source.type",
                s.propagate_columns.iter().map(String::as_str),
            )?,
            propagate_types: column_regexes(
                "datatype.propagate.source.type",
                s.propagate_types.iter().map(String::as_str),
            )?,
            ..Policy::default()
        };
        let mut truncations = Vec::new();
        for (prefix, table, parse) in [
            ("column.mask", s.mask, parse_mask as fn(&str, &str) -> _),
            ("column.truncate", s.truncate, parse_truncate),
        ] {
            for (rest, columns) in table {
                let key = shown_key(prefix, rest);
                let mask = parse(&key, rest)?;
                let rule = Rule {
                    columns: column_regexes(&key, columns.split(','))?,
                    key: key.clone(),
                    mask,
                };
                // The key as written (a salt's reference, or the salt): never shown.
                let spec = format!("{prefix}.{rest}={columns}");
                policy.spec.push(spec);
                match rule.mask {
                    Mask::Truncate(_) => truncations.push(rule),
                    _ => policy.rules.push(rule),
                }
            }
        }
        policy.rules.extend(truncations);
        policy.spec.push(format!("include={:?}", s.include));
        policy.spec.push(format!("exclude={:?}", s.exclude));
        policy
            .spec
            .push(format!("propagate={:?}", s.propagate_columns));
        policy
            .spec
            .push(format!("propagate.types={:?}", s.propagate_types));
        Ok(Self(Arc::new(policy)))
    }

    /// Whether the policy leaves every column as it is.
    pub fn is_empty(&self) -> bool {
        self.0.include.is_empty() && self.0.exclude.is_empty() && self.0.rules.is_empty()
    }

    /// Whether column `column` of table `namespace.table`, of the source type
    /// named `type_name`, carries its source type in its field schema
    /// (`column.propagate.source.type` names the column or
    /// `datatype.propagate.source.type` its type, as Debezium matches them:
    /// whole name, any case). A type expression matches the type's name
    /// alone or qualified by its table, `namespace.table.TYPE` (the form
    /// Debezium's MySQL connector documents).
    pub fn propagates(&self, namespace: &str, table: &str, column: &str, type_name: &str) -> bool {
        let p = &self.0;
        if p.propagate_columns.is_empty() && p.propagate_types.is_empty() {
            return false;
        }
        let name = format!("{namespace}.{table}.{column}");
        let qualified_type = format!("{namespace}.{table}.{type_name}");
        p.propagate_columns.iter().any(|r| r.is_match(&name))
            || p.propagate_types
                .iter()
                .any(|r| r.is_match(type_name) || r.is_match(&qualified_type))
    }

    /// What happens to column `column` of table `namespace.table`.
    pub fn action(&self, namespace: &str, table: &str, column: &str) -> ColumnAction<'_> {
        if self.is_empty() {
            return ColumnAction::Keep;
        }
        let name = format!("{namespace}.{table}.{column}");
        let p = &self.0;
        let included = p.include.is_empty() || p.include.iter().any(|r| r.is_match(&name));
        if !included || p.exclude.iter().any(|r| r.is_match(&name)) {
            return ColumnAction::Exclude;
        }
        self.masked(&name)
    }

    /// The mask of the column named `name` (`schema.table.column`), if any.
    fn masked(&self, name: &str) -> ColumnAction<'_> {
        let rule = self
            .0
            .rules
            .iter()
            .find(|r| r.columns.iter().any(|c| c.is_match(name)));
        match rule {
            Some(rule) => ColumnAction::Mask(&rule.mask),
            None => ColumnAction::Keep,
        }
    }

    /// What happens to a key column: kept (never excluded) when only an
    /// include list leaves it out, as a sink's `fields.include` keeps key
    /// fields; `Exclude` when `column.exclude.list` names it.
    fn key_action(&self, namespace: &str, table: &str, column: &str) -> ColumnAction<'_> {
        let name = format!("{namespace}.{table}.{column}");
        if self.0.exclude.iter().any(|r| r.is_match(&name)) {
            return ColumnAction::Exclude;
        }
        self.masked(&name)
    }

    /// The setting whose rule masks `column` (for messages).
    pub fn rule_key(&self, namespace: &str, table: &str, column: &str) -> Option<&str> {
        let name = format!("{namespace}.{table}.{column}");
        self.0
            .rules
            .iter()
            .find(|r| r.columns.iter().any(|c| c.is_match(&name)))
            .map(|r| r.key.as_str())
    }
}

/// What the policy makes of one column of a table, checked: `Ok(None)` when
/// excluded, `Ok(Some(mask))` when kept (masked or not). A key column can
/// be neither excluded nor masked (its records would merge rows; an include
/// list need not name it, it is always kept), and a
/// mask applies to character columns only (Debezium would pass any other
/// value through unmasked: oncely refuses instead).
pub fn checked_action(
    policy: &ColumnPolicy,
    namespace: &str,
    table: &str,
    column: &str,
    is_key: bool,
    chars: Characters,
) -> Result<Option<Option<Mask>>, String> {
    let qualified = format!("{namespace}.{table}");
    let action = match is_key {
        true => policy.key_action(namespace, table, column),
        false => policy.action(namespace, table, column),
    };
    match action {
        ColumnAction::Keep => Ok(Some(None)),
        ColumnAction::Exclude if is_key => Err(format!(
            "key column {column} of table {qualified} is excluded by column.exclude.list: every record is keyed by it; remove it from the list, or key the table by other columns (message.key.columns)"
        )),
        ColumnAction::Exclude => Ok(None),
        ColumnAction::Mask(mask) => {
            let key = policy.rule_key(namespace, table, column).unwrap_or("column.mask");
            if is_key {
                return Err(format!(
                    "key column {column} of table {qualified} is masked by {key}: records of different rows would share a key; mask only non-key columns, or key the table by other columns (message.key.columns)"
                ));
            }
            if chars == Characters::No {
                return Err(format!(
                    "column {column} of table {qualified} is masked by {key}, but it does not hold character data; masks apply to character columns only: exclude it (column.exclude.list) instead"
                ));
            }
            Ok(Some((!mask.is_noop(chars)).then(|| mask.clone())))
        }
    }
}

#[cfg(test)]
impl ColumnPolicy {
    /// A policy that only propagates source types (the envelope tests' configs).
    pub(crate) fn propagating(columns: &[&str], types: &[&str]) -> Self {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ColumnPolicy::new(ColumnSettings {
            include: &[],
            exclude: &[],
            mask: &Default::default(),
            truncate: &Default::default(),
            propagate_columns: &strings(columns),
            propagate_types: &strings(types),
        })
        .expect("valid propagation patterns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(
        include: &[&str],
        exclude: &[&str],
        mask: &[(&str, &str)],
        truncate: &[(&str, &str)],
    ) -> Result<ColumnPolicy, ColumnSettingError> {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let table = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        ColumnPolicy::new(ColumnSettings {
            include: &strings(include),
            exclude: &strings(exclude),
            mask: &table(mask),
            truncate: &table(truncate),
            propagate_columns: &[],
            propagate_types: &[],
        })
    }

    fn hash(version: HashVersion, salt: &str) -> Mask {
        Mask::Hash {
            algorithm: HashAlgorithm::Sha256,
            version,
            salt: Secret::new(salt),
        }
    }

    #[test]
    fn lists_match_whole_names_case_insensitively() {
        let p = policy(&[], &["public\\.users\\.e.*"], &[], &[]).unwrap();
        assert_eq!(p.action("public", "users", "email"), ColumnAction::Exclude);
        assert_eq!(p.action("public", "Users", "EMAIL"), ColumnAction::Exclude);
        assert_eq!(p.action("public", "users", "name"), ColumnAction::Keep);
        // Whole names only: a prefix or a suffix is no match.
        assert_eq!(p.action("xpublic", "users", "email"), ColumnAction::Keep);
        let p = policy(&["public.users.(id|name)"], &[], &[], &[]).unwrap();
        assert_eq!(p.action("public", "users", "id"), ColumnAction::Keep);
        assert_eq!(p.action("public", "users", "name"), ColumnAction::Keep);
        assert_eq!(p.action("public", "users", "name2"), ColumnAction::Exclude);
        assert_eq!(p.action("public", "orders", "id"), ColumnAction::Exclude);
    }

    #[test]
    fn both_lists_or_a_bad_regex_are_refused_naming_the_key() {
        let e = policy(&["a.b.c"], &["a.b.d"], &[], &[]).unwrap_err();
        assert_eq!(e.key, "column.include.list");
        let e = policy(&[], &["a.b.("], &[], &[]).unwrap_err();
        assert_eq!(e.key, "column.exclude.list");
        let e = policy(&[], &[], &[("with.x.chars", "a.b.c")], &[]).unwrap_err();
        assert_eq!(e.key, "column.mask.with.x.chars");
        let e = policy(&[], &[], &[], &[("to.0.chars", "a.b.c")]).unwrap_err();
        assert_eq!(e.key, "column.truncate.to.0.chars");
        let e = policy(&[], &[], &[("hash.SHA-3.with.salt.pepper", "a.b.c")], &[]).unwrap_err();
        assert_eq!(e.key, "column.mask.hash.SHA-3.with.salt.***");
        assert!(!e.to_string().contains("pepper"), "{e}");
    }

    #[test]
    fn mask_keys_parse_as_debezium_names_them() {
        let p = policy(
            &[],
            &[],
            &[
                ("with.5.chars", "public.t.a"),
                ("hash.SHA-256.with.salt.s.a.l.t", "public.t.b"),
                (
                    "hash.v2.SHA-256.with.salt.pepper",
                    "public.t.c , public.t.d",
                ),
            ],
            &[("to.3.chars", "public.t.e,public.t.a")],
        )
        .unwrap();
        assert_eq!(
            p.action("public", "t", "a"),
            ColumnAction::Mask(&Mask::Chars(5))
        );
        assert_eq!(
            p.action("public", "t", "b"),
            ColumnAction::Mask(&hash(HashVersion::V1, "s.a.l.t"))
        );
        assert_eq!(
            p.action("public", "t", "d"),
            ColumnAction::Mask(&hash(HashVersion::V2, "pepper"))
        );
        assert_eq!(
            p.action("public", "t", "e"),
            ColumnAction::Mask(&Mask::Truncate(3))
        );
        assert!(!format!("{p:?}{:?}", hash(HashVersion::V1, "pepper")).contains("pepper"));
        // Policies differing only in a salt differ.
        let with_salt = |salt: &str| {
            let key = format!("hash.SHA-256.with.salt.{salt}");
            policy(&[], &[], &[(key.as_str(), "a.b.c")], &[]).unwrap()
        };
        assert_eq!(with_salt("one"), with_salt("one"));
        assert_ne!(with_salt("one"), with_salt("two"));
    }

    #[test]
    fn a_salt_may_be_a_reference() {
        std::env::set_var("ONCELY_TEST_COLUMN_SALT", "pepper");
        let p = policy(
            &[],
            &[],
            &[(
                "hash.SHA-256.with.salt.${env:ONCELY_TEST_COLUMN_SALT}",
                "a.b.c",
            )],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.action("a", "b", "c"),
            ColumnAction::Mask(&hash(HashVersion::V1, "pepper"))
        );
        let e = policy(
            &[],
            &[],
            &[(
                "hash.SHA-256.with.salt.${env:ONCELY_TEST_UNSET_SALT}",
                "a.b.c",
            )],
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("ONCELY_TEST_UNSET_SALT"), "{e}");
    }

    #[test]
    fn masks_apply_to_text() {
        let apply = |m: &Mask, t: &str, c| m.apply(t, c).into_owned();
        assert_eq!(
            apply(&Mask::Chars(4), "secret", Characters::Unbounded),
            "****"
        );
        assert_eq!(
            apply(&Mask::Truncate(3), "secret", Characters::Unbounded),
            "sec"
        );
        assert_eq!(
            apply(&Mask::Truncate(9), "secret", Characters::Unbounded),
            "secret"
        );
        // Java counts UTF-16 units; a pair is never cut in two.
        assert_eq!(
            apply(&Mask::Truncate(2), "é😀x", Characters::Unbounded),
            "é"
        );
        assert_eq!(
            apply(&Mask::Truncate(3), "é😀x", Characters::Unbounded),
            "é😀"
        );
        let h = apply(&hash(HashVersion::V2, "s"), "v", Characters::Unbounded);
        assert_eq!(h.len(), 64);
        assert_eq!(
            apply(&hash(HashVersion::V2, "s"), "v", Characters::UpTo(10)),
            h[..10]
        );
    }

    /// tests/fixtures/debezium_mask/expected.txt: Debezium 3.6's
    /// `MaskStrings` and `TruncateColumn` run on the values of
    /// `MaskFixture.java` (a `text` column, and a `varchar(20)` one).
    #[test]
    fn hashes_match_debezium_s_own_mask_strings() {
        let expected = include_str!("../../../tests/fixtures/debezium_mask/expected.txt");
        let values = [
            "alice@example.com".to_string(),
            String::new(),
            "Zoë 😀 \u{0} naïve".to_string(),
            "x".repeat(70_000),
        ];
        let mut checked = 0;
        for line in expected.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts[..] {
                [alg, version, column, i, hex] => {
                    let mask = Mask::Hash {
                        algorithm: HashAlgorithm::parse(alg).unwrap(),
                        version: if version == "V1" {
                            HashVersion::V1
                        } else {
                            HashVersion::V2
                        },
                        salt: Secret::new("CzQMA0cB5K"),
                    };
                    let chars = match column {
                        "text" => Characters::Unbounded,
                        _ => Characters::UpTo(20),
                    };
                    let value = &values[i.parse::<usize>().unwrap()];
                    assert_eq!(mask.apply(value, chars), hex, "{line}");
                    checked += 1;
                }
                ["trunc", cut] => {
                    assert_eq!(Mask::Truncate(3).apply("é😀x", Characters::Unbounded), cut);
                    checked += 1;
                }
                _ => {}
            }
        }
        assert_eq!(checked, 65);
    }

    #[test]
    fn java_serialization_of_strings() {
        assert_eq!(
            java_serialized_string("ab"),
            [0xAC, 0xED, 0x00, 0x05, 0x74, 0x00, 0x02, b'a', b'b']
        );
        // NUL in two bytes, a supplementary character as two 3-byte surrogates.
        assert_eq!(
            java_serialized_string("\0😀")[5..],
            [0x00, 0x08, 0xC0, 0x80, 0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80]
        );
        let long = "x".repeat(70_000);
        let bytes = java_serialized_string(&long);
        assert_eq!(bytes[4], 0x7C);
        assert_eq!(bytes[5..13], 70_000u64.to_be_bytes());
    }

    #[test]
    fn key_columns_and_non_character_columns_cannot_be_masked_or_excluded() {
        let p = policy(
            &[],
            &["public.t.id"],
            &[("with.3.chars", "public.t.(n|k)")],
            &[],
        )
        .unwrap();
        let e = checked_action(&p, "public", "t", "id", true, Characters::No).unwrap_err();
        assert!(
            e.contains("key column id of table public.t is excluded"),
            "{e}"
        );
        let e = checked_action(&p, "public", "t", "k", true, Characters::Unbounded).unwrap_err();
        assert!(
            e.contains("key column k of table public.t is masked by column.mask.with.3.chars"),
            "{e}"
        );
        let e = checked_action(&p, "public", "t", "n", false, Characters::No).unwrap_err();
        assert!(e.contains("does not hold character data"), "{e}");
        assert_eq!(
            checked_action(&p, "public", "t", "n", false, Characters::UpTo(3)),
            Ok(Some(Some(Mask::Chars(3))))
        );
        assert_eq!(
            checked_action(&p, "public", "t", "id", false, Characters::No),
            Ok(None)
        );
        // An include list need not name the key: it is kept, still unmasked.
        let p = policy(&["public.t.name"], &[], &[], &[]).unwrap();
        assert_eq!(
            checked_action(&p, "public", "t", "id", true, Characters::No),
            Ok(Some(None))
        );
        assert_eq!(
            checked_action(&p, "public", "t", "other", false, Characters::No),
            Ok(None)
        );
        let p = policy(&[], &[], &[], &[("to.5.chars", "public.t.n")]).unwrap();
        assert_eq!(
            checked_action(&p, "public", "t", "n", false, Characters::UpTo(5)),
            Ok(Some(None))
        );
    }
}
