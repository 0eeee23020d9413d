//! Every relative link in README.md and docs/**/*.md resolves: the file (or
//! folder) it names exists, and a `#anchor` names a heading of the target
//! (GitHub's slug: lower case, punctuation dropped, spaces as `-`, a
//! repeated heading `-1`, `-2`, ...). Links with a scheme (`https:`,
//! `mailto:`) are not followed. Code blocks and code spans are skipped. No
//! services.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every `.md` under docs/.
fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The lines outside fenced code blocks, code spans removed.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push(String::new());
            continue;
        }
        if fenced {
            out.push(String::new());
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push(kept);
    }
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fenced || !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let s = slug(&line[hashes..]);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links in a document's prose.
fn links(text: &str) -> Vec<String> {
    let joined = prose(text).join("\n");
    let mut out = Vec::new();
    let mut rest = joined.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(rest.len());
        out.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    out
}

fn has_scheme(target: &str) -> bool {
    match target.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        }
        None => false,
    }
}

fn broken_links(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let dir = doc.parent().expect("a document's folder");
    let mut broken = Vec::new();
    for target in links(&text) {
        if has_scheme(&target) {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            doc.to_path_buf()
        } else {
            dir.join(path)
        };
        if !file.exists() {
            broken.push(format!("{target}: no such file"));
            continue;
        }
        if let Some(anchor) = anchor.filter(|_| file.extension().is_some_and(|e| e == "md")) {
            let heads = anchors(&std::fs::read_to_string(&file).expect("a linked document"));
            if !heads.contains(anchor) {
                broken.push(format!("{target}: no heading with that anchor"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let docs = documents();
    assert!(docs.len() >= 10, "README and docs/ read: {docs:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        checked += links(&std::fs::read_to_string(doc).expect("document")).len();
        let name = doc
            .strip_prefix(root())
            .unwrap_or(doc)
            .display()
            .to_string();
        broken.extend(
            broken_links(doc)
                .into_iter()
                .map(|b| format!("{name}: {b}")),
        );
    }
    assert!(checked >= 50, "links found: {checked}");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_sees_what_github_sees() {
    assert_eq!(
        slug("The dedup window (`[dedup]`)"),
        "the-dedup-window-dedup"
    );
    assert_eq!(
        slug("Is it healthy? `oncely status`"),
        "is-it-healthy-oncely-status"
    );
    assert_eq!(
        slug("Names, keys and reserved names"),
        "names-keys-and-reserved-names"
    );
    let heads = anchors("# A\n```\n# not a heading\n```\n## A\n#no\n");
    assert_eq!(heads, BTreeSet::from(["a".to_owned(), "a-1".to_owned()]));
    assert_eq!(
        links("[x](a.md#b) `[y](c.md)`\n```\n[z](d.md)\n```\n[w](https://e)"),
        ["a.md#b", "https://e"]
    );
    assert!(has_scheme("https://example.com") && !has_scheme("docs/a.md"));
}
