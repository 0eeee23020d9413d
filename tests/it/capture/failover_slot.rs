//! `slot.failover = true` (docs/capture.md): on PostgreSQL 17 and later
//! capture creates a failover slot (synchronized to standbys that set
//! `sync_replication_slots`) and streams from it; an existing slot that is
//! not one stops start-up with the command that makes it one. Older servers
//! refuse the setting at start with the version and the fix.
//!
//! `scripts/test` runs the capture tests against PostgreSQL 15 and again
//! against 17 and 18 (`ONCELY_PG_URL`), so both branches are checked.
use std::time::Duration;

use anyhow::Result;

use crate::harness::capture;
use crate::harness::capture::CaptureEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_slots_are_created_where_the_server_has_them() -> Result<()> {
    let env = CaptureEnv::new("cap_failover").await?;
    let result = drive(&env).await;
    if result.is_err() {
        eprintln!("logs in {}", env.dir.display());
    }
    env.cleanup().await;
    result
}

async fn drive(env: &CaptureEnv) -> Result<()> {
    env.client
        .batch_execute("CREATE TABLE fo (id int PRIMARY KEY, v text)")
        .await?;
    let version: i32 = env
        .client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    let extra = "slot.failover = true\ntable.include.list = \"public.fo\"\n";
    if version < 170_000 {
        let (ok, err) = env.run_capture(extra, Duration::from_secs(60))?;
        assert!(!ok, "capture started with slot.failover on {version}");
        assert!(
            err.contains("slot.failover") && err.contains("PostgreSQL 17"),
            "{err}"
        );
        let slots: i64 = env
            .client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
                &[&env.slot],
            )
            .await?
            .get(0);
        assert_eq!(slots, 0, "a refused start must not create the slot");
        return Ok(());
    }

    // An existing slot that is not a failover slot is refused, with the fix.
    let plain = format!("{}_plain", env.slot);
    env.client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&plain],
        )
        .await?;
    let text = env.config(extra).replace(
        &format!("slot.name = \"{}\"", env.slot),
        &format!("slot.name = \"{plain}\""),
    );
    let path = env.write_config("capture-plain.toml", &text)?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["capture", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    env.drop_slot(&plain).await;
    assert!(!out.status.success(), "started on a non-failover slot");
    assert!(
        err.contains("not a failover slot") && err.contains("ALTER_REPLICATION_SLOT"),
        "{err}"
    );

    // A new slot is created as a failover slot and the stream runs.
    let config = env.write_config("capture.toml", &env.config(extra))?;
    let _capture = env.spawn_capture(&config)?;
    env.wait_slot_active().await?;
    let failover: bool = env
        .client
        .query_one(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&env.slot],
        )
        .await?
        .get(0);
    assert!(failover, "slot {} is not a failover slot", env.slot);
    env.client
        .batch_execute(
            "INSERT INTO fo VALUES (1, 'a'), (2, 'b'); UPDATE fo SET v = 'c' WHERE id = 1",
        )
        .await?;
    let topics = vec![env.topic("fo")];
    capture::wait_for(&topics, Duration::from_secs(60), |seen| {
        seen.iter().filter(|r| r.value.is_some()).count() >= 3
    })
    .await?;
    Ok(())
}
