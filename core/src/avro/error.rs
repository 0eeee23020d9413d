//! What the Avro converter can fail with, by what to do about it.

/// An Avro conversion or schema registry failure.
#[derive(Debug, thiserror::Error)]
pub enum AvroError {
    /// A Connect or Avro schema with no counterpart in the other form
    /// (definite: the same schema fails again).
    #[error("schema: {0}")]
    Schema(String),
    /// A value that does not fit its schema, or bytes that are not an Avro
    /// record of it (definite, per record: a dead letter).
    #[error("value: {0}")]
    Value(String),
    /// Bytes that are not in Confluent's wire format (magic byte 0, a
    /// 4-byte schema id, the body): definite, per record.
    #[error("not in Confluent's Avro wire format: {0}")]
    NotFramed(String),
    /// The registry does not know this schema id: definite, per record (a
    /// dead letter naming the id).
    #[error("schema id {id} is unknown to the schema registry at {url}")]
    UnknownId { id: u32, url: String },
    /// The registry cannot be reached or answered with a server error:
    /// retriable (it may be restarting).
    #[error("schema registry {url} is unavailable: {message}")]
    Unavailable { url: String, message: String },
    /// TLS verification refused the registry's certificate: definite
    /// (retrying cannot fix a certificate or a CA file).
    #[error("schema registry {url}: its TLS certificate is refused ({reason}); check schema.registry.ssl.ca.location")]
    Certificate { url: String, reason: String },
    /// The registry refused a request (authentication, an incompatible
    /// schema, a malformed request): definite until the registry or the
    /// configuration changes.
    #[error("schema registry {url} refused {what}: HTTP {status}: {message}")]
    Refused {
        url: String,
        what: String,
        status: u16,
        message: String,
    },
}

impl AvroError {
    /// Whether trying again later may succeed (the registry is unreachable).
    pub fn is_retriable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the registry or the configuration is to blame (the registry
    /// refused the request, or its certificate was refused): a setting to
    /// fix, never a record's fault.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused { .. } | Self::Certificate { .. })
    }

    /// Whether the error belongs to one record (a dead letter), not to the
    /// registry or the configuration.
    pub fn is_per_record(&self) -> bool {
        matches!(
            self,
            Self::Value(_) | Self::NotFramed(_) | Self::UnknownId { .. }
        )
    }

    pub(super) fn avro(e: apache_avro::Error) -> Self {
        Self::Value(e.to_string())
    }
}
