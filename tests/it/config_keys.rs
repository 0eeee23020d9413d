//! Configuration keys as a person meets them: a misspelt key is told with
//! the key meant, once; and docs/configuration.md lists exactly the keys the
//! config structs accept. No services.

use std::process::Command;

/// Runs `oncely <command> --config <text>` and returns (success, stderr).
fn run(command: &str, name: &str, text: &str) -> anyhow::Result<(bool, String)> {
    let dir = std::env::temp_dir().join(format!("oncely-config-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args([command, "--config"])
        .arg(&path)
        // The example configs read the password from here.
        .env("PGPASSWORD", "unused")
        .env("RUST_LOG", "info")
        .output()?;
    let _ = std::fs::remove_file(&path);
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn example(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/");
    std::fs::read_to_string(format!("{path}{name}")).expect("example config")
}

/// A misspelt key stops capture and the sink runner at start with the nearest
/// valid key, told once on stderr: not as a log line and again as `error:`,
/// and not as a list of every key.
#[test]
fn a_misspelt_key_is_told_once_with_the_key_meant() -> anyhow::Result<()> {
    let capture = example("capture.toml").replacen("\nslot.name =", "\nslot.nmae =", 1);
    let sink = example("sink.toml").replacen("\ngroup.id =", "\ngroup.di =", 1);
    for (command, text, told) in [
        (
            "capture",
            capture,
            "unknown key `slot.nmae`; did you mean `slot.name`?",
        ),
        (
            "sink",
            sink,
            "unknown key `group.di`; did you mean `group.id`?",
        ),
    ] {
        let (ok, stderr) = run(command, &format!("{command}-misspelt.toml"), &text)?;
        assert!(!ok, "{command} started with a misspelt key:\n{stderr}");
        assert_eq!(
            stderr.matches(told).count(),
            1,
            "{command}: `{told}` not told exactly once:\n{stderr}"
        );
        assert_eq!(
            stderr.lines().filter(|l| !l.trim().is_empty()).count(),
            1,
            "{command}: one line of error, nothing else:\n{stderr}"
        );
        assert!(!stderr.contains("expected one of"), "{stderr}");
    }
    Ok(())
}
