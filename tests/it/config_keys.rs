//! Configuration keys as a person meets them: a misspelt key is told with
//! the key meant, once; and docs/configuration.md lists exactly the keys the
//! config structs accept. No services.

use std::collections::{BTreeMap, BTreeSet};
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

const BEGIN: &str = "<!-- keys: ";
const END: &str = "<!-- end of keys -->";

/// The keys of each marked table of docs/configuration.md (the first column),
/// by the table's name.
fn documented() -> BTreeMap<String, Vec<String>> {
    let doc = include_str!("../../docs/configuration.md");
    let mut tables = BTreeMap::new();
    for part in doc.split(BEGIN).skip(1) {
        let (head, rest) = part.split_once("-->").expect("a closed marker");
        let name = head.split(" (").next().unwrap_or(head).trim().to_owned();
        let body = rest.split(END).next().expect("an end marker");
        let keys: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|l| {
                let (key, rest) = l.split_once('`').expect("a quoted key");
                let columns = rest.matches(" | ").count();
                assert!(columns >= 2, "{name}: `{key}` lacks its default or meaning");
                key.to_owned()
            })
            .collect();
        assert!(
            tables.insert(name.clone(), keys).is_none(),
            "two tables {name}"
        );
    }
    tables
}

/// `outer`'s keys with `field` (a nested table) replaced by its own keys,
/// written `field.key` as in the file.
fn nested(outer: &[&str], field: &str, inner: &[&str]) -> BTreeSet<String> {
    assert!(outer.contains(&field), "no field {field}");
    outer
        .iter()
        .filter(|k| **k != field)
        .map(|k| k.to_string())
        .chain(inner.iter().map(|k| format!("{field}.{k}")))
        .collect()
}

fn all(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// docs/configuration.md has one table per configuration (capture, the sink
/// runner, each sink), and each lists exactly the keys its config struct
/// accepts, read from the struct's `Deserialize` (so a key added, renamed or
/// removed in the code fails here until the doc says so), each once.
#[test]
fn the_configuration_doc_lists_exactly_the_keys_the_configs_accept() {
    use oncely_capture::config::{CaptureConfig, OutboxConfig};
    use oncely_core::config::keys;
    use oncely_sinks::config::RunnerConfig;
    use oncely_sinks::kinds::{elasticsearch, file, http, journal, postgres, redis};
    use oncely_sinks::runner::dedup::DedupConfig;

    let expected: BTreeMap<&str, BTreeSet<String>> = [
        (
            "capture",
            nested(keys::<CaptureConfig>(), "outbox", keys::<OutboxConfig>()),
        ),
        (
            "runner",
            nested(keys::<RunnerConfig>(), "dedup", keys::<DedupConfig>()),
        ),
        ("sink postgres", all(keys::<postgres::PostgresConfig>())),
        (
            "sink elasticsearch",
            all(keys::<elasticsearch::ElasticsearchConfig>()),
        ),
        ("sink redis", all(keys::<redis::RedisConfig>())),
        ("sink http", all(keys::<http::HttpConfig>())),
        ("sink journal", all(keys::<journal::JournalConfig>())),
        ("sink file", all(keys::<file::FileConfig>())),
        ("sink stdout", all(keys::<file::StdoutConfig>())),
    ]
    .into_iter()
    .collect();
    let documented = documented();
    assert_eq!(
        documented.keys().map(String::as_str).collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>(),
        "the tables of docs/configuration.md"
    );
    for (name, keys) in &documented {
        let listed: BTreeSet<String> = keys.iter().cloned().collect();
        assert_eq!(listed.len(), keys.len(), "{name}: a key listed twice");
        let accepted = &expected[name.as_str()];
        let missing: Vec<_> = accepted.difference(&listed).collect();
        let stale: Vec<_> = listed.difference(accepted).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "{name}: accepted but not documented: {missing:?}; documented but not accepted: {stale:?}"
        );
    }
}
