//! Secrets in a sink's configuration: a literal value, or a reference resolved
//! at start-up in the syntax of Kafka Connect's config providers —
//! `${env:NAME}` or `${file:/path}` — so a password never has to sit in the
//! config file. A [`Secret`] never prints itself (its `Debug` is `***`) and is
//! not `Serialize`.
//!
//! The same syntax as the capture's; kept here because sinks do not depend on
//! capture.

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
    pub fn resolve(&self) -> Result<Secret, SecretError> {
        let raw = self.0.as_str();
        let Some(inner) = raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
            return Ok(self.clone());
        };
        if let Some(name) = inner.strip_prefix("env:") {
            return std::env::var(name)
                .map(Secret)
                .map_err(|_| SecretError::MissingEnv(name.to_owned()));
        }
        if let Some(path) = inner.strip_prefix("file:") {
            return std::fs::read_to_string(path)
                .map(|s| Secret(s.trim_end_matches(['\n', '\r']).to_owned()))
                .map_err(|e| SecretError::File {
                    path: path.to_owned(),
                    reason: e.to_string(),
                });
        }
        Ok(self.clone())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
