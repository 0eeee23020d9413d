use super::*;

#[test]
fn admin_and_reader_clients_get_the_connection_properties_only() {
    let cfg = CaptureConfig::parse(
        r#"
topic.prefix = "shop"
database.hostname = "127.0.0.1"
database.user = "postgres"
database.dbname = "shop"
kafka.bootstrap.servers = "broker:9093"
[kafka.producer]
"security.protocol" = "sasl_ssl"
"sasl.mechanisms" = "SCRAM-SHA-512"
"sasl.username" = "capture"
"sasl.password" = "s3cret"
"ssl.ca.location" = "/etc/kafka/ca.pem"
"client.id" = "shop-capture"
"compression.type" = "zstd"
"linger.ms" = "50"
"#,
        "test",
    )
    .expect("valid config");
    let client = cfg.kafka_client();
    assert_eq!(client.get("bootstrap.servers"), Some("broker:9093"));
    for (key, value) in [
        ("security.protocol", "sasl_ssl"),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", "capture"),
        ("sasl.password", "s3cret"),
        ("ssl.ca.location", "/etc/kafka/ca.pem"),
        ("client.id", "shop-capture"),
    ] {
        assert_eq!(client.get(key), Some(value), "{key}");
    }
    // Producer tuning stays with the producer (a consumer would warn about it).
    assert_eq!(client.get("compression.type"), None);
    assert_eq!(client.get("linger.ms"), None);
}

#[test]
fn connection_properties_are_recognised_by_name() {
    for key in [
        "security.protocol",
        "sasl.oauthbearer.token.endpoint.url",
        "ssl.keystore.location",
        "ssl_engine_callback_data",
        "socket.keepalive.enable",
        "broker.address.family",
        "client.dns.lookup",
        "enable.ssl.certificate.verification",
    ] {
        assert!(is_connection_property(key), "{key}");
    }
    for key in [
        "acks",
        "compression.type",
        "batch.size",
        "message.max.bytes",
    ] {
        assert!(!is_connection_property(key), "{key}");
    }
}

#[test]
fn the_default_transaction_timeout_is_the_documented_one() {
    let set = PRODUCER_SETTINGS
        .iter()
        .find(|(k, _)| *k == "transaction.timeout.ms")
        .map(|(_, v)| v.parse::<u64>());
    assert_eq!(set, Some(Ok(crate::config::DEFAULT_TRANSACTION_TIMEOUT_MS)));
}
