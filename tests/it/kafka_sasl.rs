//! The pipeline on a Kafka cluster that requires authentication: capture, the
//! sinks and `oncely verify` reach the brokers only through the SASL/PLAIN
//! listener of `scripts/services` (`ONCELY_KAFKA_SASL_*`), with the password
//! read from a file. Capture's admin client and offset reader, and verify's
//! readers, must carry the connection properties of `[kafka.producer]`, not
//! only the producer: without them capture cannot start (nor resume from its
//! offset) and verify cannot wait.
use std::time::{Duration, Instant};

use crate::harness::capture::terminate;
use crate::harness::checks::scan_changes;
use crate::harness::common;
use crate::harness::e2e::Pipeline;

const SCHEMA: &str =
    "CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL);";

/// The SASL listener's address, user and password file, with a hint when the
/// Kafka of `scripts/services` predates that listener.
fn sasl() -> (String, String, String) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run `eval \"$(scripts/services env)\"` with the Kafka of \
                 scripts/services running (`scripts/services restart kafka` if it was started \
                 before its SASL listener existed)"
            )
        })
    };
    (
        var("ONCELY_KAFKA_SASL_BROKERS"),
        var("ONCELY_KAFKA_SASL_USERNAME"),
        var("ONCELY_KAFKA_SASL_PASSWORD_FILE"),
    )
}

/// librdkafka properties for the SASL listener, as TOML lines.
fn credentials(user: &str, password: &str) -> String {
    format!(
        "\"security.protocol\" = \"sasl_plaintext\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\
         \"sasl.username\" = \"{user}\"\n\"sasl.password\" = \"{password}\"\n"
    )
}

/// Points a config written for the plaintext listener at the SASL one.
fn secure(path: &std::path::Path, brokers: &str, section: &str, props: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)?.replace(&common::kafka_brokers(), brokers);
    let text = if text.contains(&format!("[{section}]\n")) {
        text.replace(&format!("[{section}]\n"), &format!("[{section}]\n{props}"))
    } else {
        format!("{text}\n[{section}]\n{props}")
    };
    std::fs::write(path, text)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_sinks_and_verify_work_through_a_sasl_listener() -> anyhow::Result<()> {
    let (brokers, user, password_file) = sasl();
    assert_ne!(brokers, common::kafka_brokers());
    let mut p = Pipeline::new("kafka_sasl", SCHEMA, &["accounts"], "").await?;
    let props = credentials(&user, &format!("${{file:{password_file}}}"));
    secure(&p.capture_config, &brokers, "kafka.producer", &props)?;
    // The warehouse keeps its positions itself; Elasticsearch's are the
    // group's Kafka offsets, which verify reads through the same listener.
    p.sinks.truncate(2);
    for sink in &p.sinks {
        secure(sink, &brokers, "kafka", &props)?;
    }

    // A wrong password is refused: the listener really checks credentials,
    // and capture says so instead of running without Kafka.
    let wrong = p.env.write_config(
        "capture-wrong.toml",
        &std::fs::read_to_string(&p.capture_config)?
            .replace(&format!("${{file:{password_file}}}"), "not-the-password"),
    )?;
    let mut refused = p.env.spawn_capture(&wrong)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = refused.try_wait()? {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "capture with a wrong password still running after 120 s:\n{}",
            p.env.capture_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!status.success(), "a refused login must fail start-up");
    let log = p.env.capture_log();
    assert!(
        log.contains("Authentication failed") || log.contains("SASL authentication error"),
        "the log names the refused login:\n{log}"
    );
    std::fs::write(p.env.dir.join("capture.log"), "")?;

    // The right password: capture streams, the sinks apply, verify waits and compares.
    let mut capture = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    let sinks: Vec<_> = (0..p.sinks.len())
        .map(|i| p.spawn_sink(i))
        .collect::<Result<_, _>>()?;
    p.env
        .client
        .batch_execute(
            "INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 200) g;
             UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0;
             DELETE FROM accounts WHERE id % 10 = 0;",
        )
        .await?;
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "targets equal the source:\n{report}");
    assert_eq!(report.compared(), 2, "{report}");

    // A restart resumes from the offset it reads back through the listener:
    // nothing is published twice.
    let status = terminate(&mut capture, Duration::from_secs(30))?;
    assert!(status.success(), "clean stop:\n{}", p.env.capture_log());
    let restarted = p.spawn_capture()?;
    p.env.wait_slot_active().await?;
    p.env
        .client
        .batch_execute("UPDATE accounts SET owner = owner || ' (moved)' WHERE id <= 50;")
        .await?;
    let report = p.verify(Duration::from_secs(120)).await?;
    assert!(report.is_equal(), "targets equal the source:\n{report}");
    let (status, out) = p.verify_cli(&["--timeout", "60s"])?;
    assert!(status.success(), "verify exits 0 when equal:\n{out}");

    let topics = p.topics();
    let scan = tokio::task::spawn_blocking(move || scan_changes(&topics)).await??;
    // 200 inserts, 66 updates, 20 deletes, then 45 updates (ids 1..=50 less 5 deleted).
    assert_eq!(scan.events, 200 + 66 + 20 + 45, "{scan:?}");
    assert_eq!(scan.duplicate_count, 0, "{scan:?}");
    drop(sinks);
    drop(restarted);
    p.cleanup().await;
    Ok(())
}
