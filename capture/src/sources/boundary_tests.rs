//! The source seam's boundary, checked on the source text: outside
//! `src/sources/`, capture names no PostgreSQL client, replication or
//! pgoutput type (docs/design.md, "Architecture: the source seam"). The
//! core reaches a source only through `crate::seam`, and names one
//! implementation where the configuration picks it (`sources::Postgres`).

use std::path::{Path, PathBuf};

/// What only a source may name: its drivers and its message types, under
/// their own paths and under the former paths `lib.rs` kept for callers.
const SOURCE_ONLY: &[&str] = &[
    "tokio_postgres",
    "pgwire_replication",
    "pgoutput::",
    "sources::postgres",
    "crate::pgoutput",
    "crate::source::",
    "crate::source;",
    "crate::value",
    "crate::replica_identity",
];

/// The crate's public facades, relative to `capture/src`: they re-export each
/// source's catalog reads for the root crate's `verify` and `status`
/// (`catalog.rs`) and its service tests (`testing.rs`), and hold no logic.
const FACADES: &[&str] = &["catalog.rs", "testing.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("capture/src is readable");
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source-only names a file's code (not its comments) uses.
fn source_only_names(text: &str) -> Vec<&'static str> {
    let code: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect();
    SOURCE_ONLY
        .iter()
        .copied()
        .filter(|name| code.iter().any(|line| line.contains(name)))
        .collect()
}

#[test]
fn only_sources_name_source_drivers_and_messages() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut crossing = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&root).expect("under src");
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel.starts_with("sources/") || FACADES.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("a readable source file");
        let names = source_only_names(&text);
        if !names.is_empty() {
            crossing.push(format!("{rel}: {}", names.join(", ")));
        }
    }
    assert!(
        crossing.is_empty(),
        "outside capture/src/sources/, these files name a source's driver or \
         messages; reach the source through the seam instead:\n{}",
        crossing.join("\n")
    );
}

#[test]
fn comments_do_not_count_as_crossing() {
    let text = "//! pgoutput::Relation is decoded elsewhere\nuse crate::naming;\n";
    assert!(source_only_names(text).is_empty());
    let text = "use tokio_postgres::Client;\n";
    assert_eq!(source_only_names(text), vec!["tokio_postgres"]);
}
