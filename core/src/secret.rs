//! Secrets in configuration: a literal value, or a reference resolved when
//! the configuration is read, in the syntax of Kafka Connect's config providers — `${env:NAME}`
//! or `${file:/path}` — so a password never has to sit in the config file. A
//! [`Secret`] never prints itself (its `Debug` is `***`) and is not
//! `Serialize`. A URL whose path or query is the secret (a Slack-style
//! webhook) is a [`SecretUrl`], shown as its origin only. Two more ways a
//! secret used to leak are closed here: a URL with user info in an error
//! ([`redact_url`], [`redact_url_path`]) and a TOML parse error, which
//! quotes the offending line — often the one holding an inline password
//! ([`toml_error`]).

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A configuration value that must not appear in logs or errors.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

/// Why a secret reference could not be resolved (never contains the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// `${env:NAME}` names a variable that is not set.
    #[error("environment variable {0} is not set (referenced as ${{env:{0}}})")]
    MissingEnv(String),
    /// `${file:PATH}` names a file that cannot be read.
    #[error("cannot read secret file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
}

impl Secret {
    /// A secret holding `value` (a literal or a reference).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value. Call only where it is handed to a client.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces a `${env:NAME}` / `${file:PATH}` reference by what it points to
    /// (a file's trailing newline is dropped); any other text is kept as is.
    /// For a secret built in code: one read from configuration is resolved
    /// already (see its `Deserialize`).
    pub fn resolve(&self) -> Result<Secret, SecretError> {
        resolve_reference(&self.0).map(Secret)
    }
}

/// Resolves one `${env:..}` or `${file:..}` reference; any other text is returned as is.
pub fn resolve_reference(raw: &str) -> Result<String, SecretError> {
    let Some(inner) = raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
        return Ok(raw.to_owned());
    };
    if let Some(name) = inner.strip_prefix("env:") {
        return std::env::var(name).map_err(|_| SecretError::MissingEnv(name.to_owned()));
    }
    if let Some(path) = inner.strip_prefix("file:") {
        return std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
            .map_err(|e| SecretError::File {
                path: path.to_owned(),
                reason: e.to_string(),
            });
    }
    Ok(raw.to_owned())
}

/// `url` with the password of its user info replaced by `***`
/// (`http://user:***@host/`); a URL without one is returned as is. Works on
/// any `scheme://[user[:password]@]host...` text, parsed or not, so a URL
/// that does not parse is still shown safely.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let user = rest[..at].split(':').next().unwrap_or("");
    let shown = if rest[..at].contains(':') {
        format!("{user}:***")
    } else if user.is_empty() {
        String::new()
    } else {
        // `redis://secret@host`: a lone user info is Redis's password form.
        "***".to_owned()
    };
    format!("{}{shown}@{}", &url[..scheme_end], &rest[at + 1..])
}

/// `url` as [`redact_url`] shows it, with its path, query and fragment
/// replaced by `/***` when it has any: where a webhook keeps its secret
/// (`https://hooks.slack.com/services/T…/B…/<secret>` is shown as
/// `https://hooks.slack.com/***`). Text without a `scheme://` is shown as
/// `***`, since where its secret sits cannot be told.
pub fn redact_url_path(url: &str) -> String {
    let url = redact_url(url.trim());
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return "***".to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    match &url[authority_end..] {
        "" | "/" => url,
        _ => format!("{}/***", &url[..authority_end]),
    }
}

/// A URL that may carry a secret in its user info, path or query (a
/// webhook's). Its `Debug` shows only [`redact_url_path`]'s form, it is not
/// `Serialize`, and reading it from configuration resolves `${env:..}` and
/// `${file:..}` like a [`Secret`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// A URL (a literal or a reference).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL. Call only where it is handed to a client.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL as it may be shown: scheme, host and port (see [`redact_url_path`]).
    pub fn redacted(&self) -> String {
        redact_url_path(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SecretUrl").field(&self.redacted()).finish()
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Secret::deserialize(d).map(|s| SecretUrl(s.0))
    }
}

/// A TOML error as `line L, column C, key K: message`, without the excerpt
/// of the file `toml` prints (which would show an inline secret on that
/// line). The key is named because a bad value's message (`unknown variant`)
/// does not say whose value it is; keys are names, never secrets.
pub fn toml_error(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim_end();
    match error.span() {
        Some(span) => {
            let before = &text[..floor_char_boundary(text, span.start)];
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before[line_start..].chars().count() + 1;
            match key_of_value(before, line_start) {
                Some(key) => format!("line {line}, column {column}, key `{key}`: {message}"),
                None => format!("line {line}, column {column}: {message}"),
            }
        }
        None => message.to_owned(),
    }
}

/// A TOML error in a text oncely generated (a flattened configuration), as
/// `key K: message`: its line and column would point into that text, not
/// into the user's file, so only the key is told.
pub fn generated_toml_error(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim_end();
    let key = error.span().and_then(|span| {
        let before = &text[..floor_char_boundary(text, span.start)];
        key_of_value(before, before.rfind('\n').map_or(0, |i| i + 1))
    });
    match key {
        Some(key) => format!("key `{key}`: {message}"),
        None => message.to_owned(),
    }
}

fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The dotted key of the line `before` ends on (`key = <here>`),
/// prefixed by the `[table]` header it sits under.
fn key_of_value(before: &str, line_start: usize) -> Option<String> {
    let on_line = &before[line_start..];
    // The first `=`: a later one may sit inside a (secret) value.
    let key = on_line[..on_line.find('=')?].trim();
    if key.is_empty() || key.starts_with('#') {
        return None;
    }
    let table = before[..line_start].lines().rev().find_map(|l| {
        let l = l.trim();
        l.starts_with('[')
            .then(|| l.trim_matches(['[', ']']).trim().to_owned())
    });
    // Quotes only group a dotted key's parts: `"a.b"` and `a.b` name one key.
    let key = key.replace('"', "");
    Some(match table {
        Some(t) if !t.is_empty() => format!("{}.{key}", t.replace('"', "")),
        _ => key,
    })
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Reading a secret from configuration resolves its `${env:..}` /
/// `${file:..}` reference there and then, so a missing variable or file stops
/// the load (the deserializer's error names the key; the message names the
/// variable or file, never a value) and every later use sees the value.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        resolve_reference(&raw)
            .map(Secret)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        let cases = [
            ("http://user:hunter2@es:9200/x", "http://user:***@es:9200/x"),
            ("redis://:hunter2@r:6379/0", "redis://:***@r:6379/0"),
            ("rediss://hunter2@r", "rediss://***@r"),
            (
                "postgres://u:p%40ss:w@db/x?sslmode=require",
                "postgres://u:***@db/x?sslmode=require",
            ),
            ("http://es:9200/a@b", "http://es:9200/a@b"),
            ("http://es:9200", "http://es:9200"),
            ("not a url", "not a url"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn webhook_urls_lose_their_path_and_query() {
        let cases = [
            (
                "https://hooks.slack.com/services/T000/B000/SECRETXYZ",
                "https://hooks.slack.com/***",
            ),
            ("http://h:8080/hook?token=SECRETXYZ", "http://h:8080/***"),
            ("http://h?token=SECRETXYZ", "http://h/***"),
            ("https://u:SECRETXYZ@h/x", "https://u:***@h/***"),
            ("https://h/", "https://h/"),
            ("https://h", "https://h"),
            ("hooks.slack.com/services/SECRETXYZ", "***"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url_path(url), want, "{url}");
        }
        let url = SecretUrl::new("https://hooks.slack.com/services/T000/B000/SECRETXYZ");
        assert_eq!(
            format!("{url:?}"),
            "SecretUrl(\"https://hooks.slack.com/***\")"
        );
        assert!(url.expose().ends_with("SECRETXYZ"));
    }

    #[test]
    fn toml_errors_do_not_quote_the_line() {
        let text = "name = \"x\"\npassword = \"hunter2\" oops\n";
        let e = toml::from_str::<toml::Table>(text).expect_err("invalid");
        assert!(e.to_string().contains("hunter2"), "toml quotes the line");
        let told = toml_error(&e, text);
        assert!(!told.contains("hunter2"), "{told}");
        assert!(
            told.starts_with("line 2, column 22, key `password`: "),
            "{told}"
        );
        let text = "password = \"a=hunter2\" oops\n";
        let e = toml::from_str::<toml::Table>(text).expect_err("invalid");
        let told = toml_error(&e, text);
        assert!(!told.contains("hunter2"), "{told}");
    }

    #[test]
    fn toml_errors_name_the_key_of_a_bad_value() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        enum Mode {
            #[serde(rename = "on")]
            On,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            mode: Mode,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            name: String,
            kafka: Inner,
        }
        let text = "name = \"x\"\n[kafka]\nmode = \"sometimes\"\n";
        let e = toml::from_str::<Outer>(text).expect_err("invalid");
        let told = toml_error(&e, text);
        assert!(
            told.starts_with("line 3, column 8, key `kafka.mode`: "),
            "{told}"
        );
        assert!(told.contains("sometimes"), "the bad value is named: {told}");
    }

    #[test]
    fn a_literal_is_kept_and_never_printed() {
        let s = Secret::new("hunter2");
        assert_eq!(s.resolve().expect("literal").expose(), "hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }

    #[test]
    fn env_and_file_references_resolve() {
        std::env::set_var("ONCELY_SINKS_TEST_SECRET", "from-env");
        let s = Secret::new("${env:ONCELY_SINKS_TEST_SECRET}");
        assert_eq!(s.resolve().expect("env").expose(), "from-env");
        let path = std::env::temp_dir().join(format!("oncely-sinks-secret-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").expect("write");
        let s = Secret::new(format!("${{file:{}}}", path.display()));
        assert_eq!(s.resolve().expect("file").expose(), "from-file");
        std::fs::remove_file(path).expect("remove");
    }

    #[test]
    fn reading_a_secret_resolves_it_and_names_the_key_when_it_cannot() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Cfg {
            #[serde(rename = "sink.password")]
            password: Secret,
        }
        std::env::set_var("ONCELY_CORE_TEST_READ_SECRET", "from-env");
        let text = "\"sink.password\" = \"${env:ONCELY_CORE_TEST_READ_SECRET}\"\n";
        let cfg: Cfg = toml::from_str(text).expect("resolved");
        assert_eq!(cfg.password.expose(), "from-env");
        let text = "\"sink.password\" = \"${env:ONCELY_CORE_SURELY_UNSET}\"\n";
        let e = toml::from_str::<Cfg>(text).expect_err("unset");
        let told = toml_error(&e, text);
        assert!(
            told.contains("key `sink.password`") && told.contains("ONCELY_CORE_SURELY_UNSET"),
            "{told}"
        );
    }

    #[test]
    fn a_missing_variable_is_named() {
        let e = Secret::new("${env:ONCELY_SINKS_SURELY_UNSET}")
            .resolve()
            .expect_err("unset");
        assert_eq!(
            e,
            SecretError::MissingEnv("ONCELY_SINKS_SURELY_UNSET".into())
        );
    }
}
