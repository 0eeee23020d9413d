//! Kafka settings shared by every client oncely opens.

/// Whether a librdkafka property is about reaching the cluster (security,
/// authentication, TLS, sockets, name lookup) rather than one client's
/// behaviour. Every Kafka client opened for a capture — the transactional
/// producer, the topic admin, the offset reader, `oncely verify` — needs these
/// to get in; the rest of `[kafka.producer]` is for the producer alone.
pub fn is_connection_property(key: &str) -> bool {
    const PREFIXES: [&str; 6] = [
        "security.",
        "sasl.",
        "ssl.",
        "ssl_",
        "socket.",
        "broker.address.",
    ];
    const NAMES: [&str; 4] = [
        "client.dns.lookup",
        "client.id",
        "enable.ssl.certificate.verification",
        "https.ca.location",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p)) || NAMES.contains(&key)
}
