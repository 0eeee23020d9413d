//! Capture's functions stay short enough to read: no non-test function in
//! `capture/src` is longer than [`MAX_LINES`] lines (signature, body and
//! closing brace), so a long one is split into named steps instead.
//!
//! Test code is left out: `tests.rs` and `*_tests.rs` files, files whose
//! module is declared behind `#[cfg(test)]`, and items behind
//! `#[cfg(test)]` or `#[test]`.

use std::path::{Path, PathBuf};

/// The longest a non-test function may be, in lines.
const MAX_LINES: usize = 80;

/// Functions allowed to be longer, as `file::function`, each with why it
/// cannot be split. Empty: every function so far could be; a listed
/// function that is short again fails the test, so the list only shrinks.
const ALLOWED: &[(&str, &str)] = &[];

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

/// Each line's code with comments, string and character literals blanked
/// out, so braces inside them do not count.
fn code_lines(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('"') | Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"...", r#"..."#, with as many # as opened it.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), or a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                out.push_str("' '");
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.lines().map(str::to_owned).collect()
}

/// Whether an identifier character comes right before `i` (so an `r` there
/// ends a name such as `for`, not a raw string).
fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The name of the function a code line declares, if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("pub") {
            rest = r.trim_start();
            if rest.starts_with('(') {
                rest = rest.split_once(')')?.1.trim_start();
            }
            continue;
        }
        let qualifier = ["const ", "async ", "unsafe ", "extern \"\" ", "default "]
            .iter()
            .find_map(|q| rest.strip_prefix(q));
        match qualifier {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether an attribute line marks the next item as test code.
fn is_test_attribute(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("#[")
        && (line.contains("cfg(test)")
            || line.contains("cfg(all(test")
            || line == "#[test]"
            || line.ends_with("::test]")
            || line.contains("::test("))
}

/// The line (index) where the item starting at `start` ends: where its
/// braces close again, or its `;` when it has no body.
fn item_end(lines: &[String], start: usize) -> Option<(usize, bool)> {
    let mut depth = 0i64;
    let mut opened = false;
    for (i, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return Some((i, false)),
                _ => {}
            }
            if opened && depth == 0 {
                return Some((i, true));
            }
        }
    }
    None
}

/// What one file says about length: its functions longer than
/// [`MAX_LINES`] as `(name, lines)`, and the modules it declares behind
/// `#[cfg(test)]` (`mod name;`).
fn scan(text: &str) -> (Vec<(String, usize)>, Vec<String>) {
    let lines = code_lines(text);
    let mut long = Vec::new();
    let mut test_modules = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if is_test_attribute(line) {
            // Skip the attributes that follow, then the item itself.
            let mut j = i + 1;
            while j < lines.len()
                && (lines[j].trim().starts_with("#[") || lines[j].trim().is_empty())
            {
                j += 1;
            }
            if let Some(name) = lines.get(j).and_then(|l| declared_mod(l)) {
                test_modules.push(name.to_owned());
            }
            i = item_end(&lines, j).map_or(lines.len(), |(end, _)| end + 1);
            continue;
        }
        if let Some(name) = declared_fn(line) {
            if let Some((end, true)) = item_end(&lines, i) {
                let count = end - i + 1;
                if count > MAX_LINES {
                    long.push((name.to_owned(), count));
                }
            }
        }
        i += 1;
    }
    (long, test_modules)
}

/// The module a `mod name;` line declares from another file.
fn declared_mod(line: &str) -> Option<&str> {
    let line = line.trim();
    let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
    let line = line.strip_prefix("pub ").unwrap_or(line);
    line.strip_prefix("mod ")?.strip_suffix(';')
}

/// Whether `rel` (relative to `capture/src`) is test code as a whole.
fn is_test_file(rel: &str, test_modules: &[String]) -> bool {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    file == "tests.rs"
        || file.ends_with("_tests.rs")
        || test_modules.iter().any(|m| rel == m.as_str())
}

#[test]
fn no_non_test_function_is_longer_than_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut scanned = Vec::new();
    // Files declared behind #[cfg(test)], as paths relative to src.
    let mut test_files = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&root).expect("under src");
        let rel = rel.to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(path).expect("a readable source file");
        let (long, modules) = scan(&text);
        // `a/mod.rs`, `lib.rs` and `a.rs` declare their modules in `a/`
        // (or at the root).
        let dir = match rel.rsplit_once('/') {
            Some((dir, "mod.rs")) => format!("{dir}/"),
            None if rel == "lib.rs" => String::new(),
            Some((dir, file)) => format!("{dir}/{}/", file.trim_end_matches(".rs")),
            None => format!("{}/", rel.trim_end_matches(".rs")),
        };
        for m in modules {
            test_files.push(format!("{dir}{m}.rs"));
            test_files.push(format!("{dir}{m}/mod.rs"));
        }
        scanned.push((rel, long));
    }
    let mut too_long = Vec::new();
    let mut allowed_seen = Vec::new();
    for (rel, long) in &scanned {
        if is_test_file(rel, &test_files) {
            continue;
        }
        for (name, count) in long {
            let id = format!("{rel}::{name}");
            if ALLOWED.iter().any(|(a, _)| *a == id) {
                allowed_seen.push(id);
            } else {
                too_long.push(format!("{id}: {count} lines"));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "these functions are longer than {MAX_LINES} lines; split them into \
         named steps:\n{}",
        too_long.join("\n")
    );
    let short_again: Vec<&str> = ALLOWED
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !allowed_seen.iter().any(|s| s == id))
        .collect();
    assert!(
        short_again.is_empty(),
        "these functions are no longer too long; take them off ALLOWED:\n{}",
        short_again.join("\n")
    );
}

#[test]
fn braces_in_literals_and_comments_and_test_code_do_not_count() {
    let body = "    let x = 1;\n".repeat(MAX_LINES);
    let long = format!("pub(crate) async fn long() {{\n{body}}}\n");
    assert_eq!(
        scan(&long).0,
        vec![("long".to_owned(), MAX_LINES + 2)],
        "a long function is found"
    );
    let short = "fn short() {\n    let s = \"}}}\"; // }\n    let c = '}';\n    let r = r#\"}\"#;\n}\nfn after() {}\n";
    assert!(scan(short).0.is_empty());
    let tested = format!("#[cfg(test)]\nmod tests {{\n{long}}}\n#[cfg(test)]\nmod golden;\n");
    let (long_fns, modules) = scan(&tested);
    assert!(long_fns.is_empty(), "test code is left out");
    assert_eq!(modules, vec!["golden".to_owned()]);
    assert_eq!(
        declared_fn("    pub(in crate::a) const unsafe fn f<'a>("),
        Some("f")
    );
}
