//! Secrets in configuration: literal values, or references resolved at start-up
//! in the syntax of Kafka Connect's config providers, `${env:NAME}` and
//! `${file:/path}`, so a password never has to sit in the config file. A secret
//! never prints itself.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A configuration value that must not appear in logs or errors.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

/// Why a secret reference could not be resolved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("environment variable {0} is not set (referenced as ${{env:{0}}})")]
    MissingEnv(String),
    #[error("cannot read secret file {path}: {reason}")]
    File { path: String, reason: String },
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret's value. Call only where the value is handed to a client.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces `${env:NAME}` / `${file:PATH}` references by what they point to.
    /// A file's trailing newline is dropped.
    pub fn resolve(&self) -> Result<Secret, SecretError> {
        resolve_reference(&self.0).map(Secret)
    }
}

/// Resolves one `${env:..}` or `${file:..}` reference; any other text is returned as is.
pub fn resolve_reference(raw: &str) -> Result<String, SecretError> {
    let Some(inner) = raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
        return Ok(raw.to_string());
    };
    if let Some(name) = inner.strip_prefix("env:") {
        return std::env::var(name).map_err(|_| SecretError::MissingEnv(name.to_string()));
    }
    if let Some(path) = inner.strip_prefix("file:") {
        return std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
            .map_err(|e| SecretError::File {
                path: path.to_string(),
                reason: e.to_string(),
            });
    }
    Ok(raw.to_string())
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
    fn literal_is_kept_and_never_printed() {
        let s = Secret::new("hunter2");
        assert_eq!(s.resolve().unwrap().expose(), "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn env_and_file_references_resolve() {
        std::env::set_var("ONCELY_TEST_SECRET_XYZ", "from-env");
        assert_eq!(
            Secret::new("${env:ONCELY_TEST_SECRET_XYZ}")
                .resolve()
                .unwrap()
                .expose(),
            "from-env"
        );
        let path = std::env::temp_dir().join(format!("oncely-secret-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").unwrap();
        let reference = format!("${{file:{}}}", path.display());
        assert_eq!(
            Secret::new(reference).resolve().unwrap().expose(),
            "from-file"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn missing_env_names_the_variable() {
        let err = Secret::new("${env:ONCELY_SURELY_UNSET_42}")
            .resolve()
            .unwrap_err();
        assert_eq!(
            err,
            SecretError::MissingEnv("ONCELY_SURELY_UNSET_42".into())
        );
        assert!(err.to_string().contains("ONCELY_SURELY_UNSET_42"));
    }
}
