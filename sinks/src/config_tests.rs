use super::*;

const MINIMAL: &str = r#"
bootstrap.servers = "127.0.0.1:9092"
group.id = "g"
topics = ["a", "b"]
[sink]
kind = "stdout"
"#;

fn parse(text: &str) -> Result<RunnerConfig, ConfigError> {
    let (c, _) = parse_runner_config(text)?;
    c.validate()?;
    Ok(c)
}

fn err(text: &str) -> ConfigError {
    match parse(text) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn minimal_file_gets_defaults() {
    let (c, sink) = parse_runner_config(MINIMAL).expect("parses");
    c.validate().expect("valid");
    assert_eq!(c.bootstrap_servers, "127.0.0.1:9092");
    assert_eq!(c.topics, vec!["a", "b"]);
    assert_eq!(c.batch_max_records, DEFAULT_BATCH_MAX_RECORDS);
    assert_eq!(
        c.ignore_topics,
        vec![DEFAULT_IGNORED_TOPIC, DEFAULT_IGNORED_SCHEMA_TOPIC]
    );
    assert_eq!(c.auto_offset_reset, OffsetReset::Earliest);
    assert!(sink.is_some_and(|t| t.get("kind").and_then(|k| k.as_str()) == Some("stdout")));
}

#[test]
fn bare_and_quoted_dotted_keys_mean_the_same() {
    let c = parse(
        r#"
"bootstrap.servers" = "k:9092"
group.id = "g"
topics = ["a"]
"topics.regex" = "^cdc\\..*"
batch.max.records = 10
"batch.max.ms" = 5
errors.deadletterqueue.topic.name = "dlq"
metrics.listen = "127.0.0.1:0"
auto.offset.reset = "latest"
[kafka]
session.timeout.ms = 6000
"client.id" = "x"
"#,
    )
    .expect("valid");
    assert_eq!(c.batch_max_records, 10);
    assert_eq!(c.batch_max_ms, 5);
    assert_eq!(c.topics_regex.as_deref(), Some("^cdc\\..*"));
    assert_eq!(c.dlq_topic.as_deref(), Some("dlq"));
    assert_eq!(c.auto_offset_reset, OffsetReset::Latest);
    assert_eq!(
        c.kafka.get("session.timeout.ms").map(String::as_str),
        Some("6000")
    );
    assert_eq!(c.kafka.get("client.id").map(String::as_str), Some("x"));
}

#[test]
fn unknown_keys_are_rejected_by_name() {
    let e = err(&format!("{MINIMAL}\n").replace(
        "topics = [\"a\", \"b\"]",
        "topics = [\"a\"]\nbatch.max.recrds = 3",
    ));
    assert!(e.message.contains("batch.max.recrds"), "{e}");
}

#[test]
fn bad_values_name_their_field() {
    let cases = [
        ("batch.max.records = 0", "batch.max.records"),
        ("batch.max.ms = 0", "batch.max.ms"),
        ("max.inflight.bytes = 10", "max.inflight.bytes"),
        (
            "retry.backoff.ms = 500\nretry.backoff.max.ms = 100",
            "retry.backoff.max.ms",
        ),
        ("metrics.listen = \"localhost\"", "metrics.listen"),
        ("\"topics.regex\" = \"(\"", "topics.regex"),
        ("ignore.topics = [\"[\"]", "ignore.topics[0]"),
        (
            "errors.deadletterqueue.topic.name = \"a\"",
            "errors.deadletterqueue.topic.name",
        ),
        (
            "kafka.\"isolation.level\" = \"read_uncommitted\"",
            "kafka.isolation.level",
        ),
    ];
    for (line, field) in cases {
        let text = MINIMAL.replace(
            "topics = [\"a\", \"b\"]",
            &format!("topics = [\"a\", \"b\"]\n{line}"),
        );
        let e = err(&text);
        assert_eq!(e.key, field, "{line}: {e}");
    }
}

#[test]
fn wrong_types_quote_the_key() {
    let e = err(&MINIMAL.replace(
        "topics = [\"a\", \"b\"]",
        "topics = [\"a\"]\nbatch.max.records = \"many\"",
    ));
    assert!(e.message.contains("batch.max.records"), "{e}");
}

#[test]
fn topics_are_required() {
    let e = err("bootstrap.servers = \"k\"\ngroup.id = \"g\"\n");
    assert_eq!(e.key, "topics");
    let e = err("bootstrap.servers = \"k\"\ngroup.id = \" \"\ntopics = [\"a\"]\n");
    assert_eq!(e.key, "group.id");
}

#[test]
fn kafka_properties_resolve_secret_references() {
    let dir = std::env::temp_dir().join(format!("oncely-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("kafka-password");
    std::fs::write(&file, "from-a-file\n").expect("write secret");
    let text = format!(
        "bootstrap.servers = \"b:9092\"\ngroup.id = \"g\"\ntopics = [\"a\"]\n[kafka]\n\
         \"sasl.password\" = \"${{file:{}}}\"\n\"security.protocol\" = \"sasl_ssl\"\n",
        file.display()
    );
    let c = parse(&text).expect("parses");
    assert_eq!(c.kafka["sasl.password"], "from-a-file");
    assert_eq!(c.kafka["security.protocol"], "sasl_ssl");

    // A reference that cannot be resolved names the property, not the secret.
    let missing = text.replace(&file.display().to_string(), "/nonexistent/oncely-secret");
    let e = err(&missing);
    assert_eq!(e.key, "kafka.sasl.password", "{e}");
    assert!(e.message.contains("/nonexistent/oncely-secret"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gap_recovery_defaults_to_stop_and_a_snapshot_needs_the_capture() {
    let c = parse(MINIMAL).expect("valid");
    assert_eq!(c.gap_recovery, crate::config::GapRecovery::Stop);
    let with = |lines: &str| MINIMAL.replace("[sink]", &format!("{lines}\n[sink]"));
    let e = err(&with("gap.recovery = \"snapshot\""));
    assert_eq!(e.key, "gap.recovery");
    assert!(e.message.contains("gap.capture.config"), "{e}");
    let c = parse(&with(
        "[gap]\nrecovery = \"snapshot\"\ncapture.config = \"capture.toml\"",
    ))
    .expect("valid");
    assert_eq!(c.gap_recovery, crate::config::GapRecovery::Snapshot);
    assert_eq!(
        c.gap_capture_config.as_deref(),
        Some(std::path::Path::new("capture.toml"))
    );
    let e = err(&with("gap.recovery = \"resume\""));
    assert!(e.message.contains("gap.recovery"), "{e}");
}

#[test]
fn a_misspelt_key_is_told_the_nearest_one() {
    let cases = [
        (
            MINIMAL.replace("group.id", "group.di"),
            "unknown key `group.di`; did you mean `group.id`?",
        ),
        (
            MINIMAL.replace("[sink]", "[dedup]\nttl.sm = 5\n[sink]"),
            "unknown key `dedup.ttl.sm`; did you mean `dedup.ttl.ms`?",
        ),
        (
            MINIMAL.replace("kind = \"stdout\"", "kind = \"stdout\"\nrwos = true"),
            "unknown key `sink.rwos`; did you mean `sink.rows`?",
        ),
    ];
    for (text, told) in cases {
        let e = crate::kinds::parse_config(&text).expect_err("misspelt");
        assert_eq!(e.message, told, "{text}");
    }
}
