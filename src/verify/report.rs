//! What verify found, and how it reads on a terminal.

use std::fmt;
use std::time::Duration;

use serde_json::{json, Value};

use super::compare::ColumnDiff;
use super::wait::SinkWait;

/// A value whose text is longer than this many characters is shown as a
/// prefix, its length and a hash, so that a report of rows with long values
/// stays readable.
pub const SHOWN_MAX_CHARS: usize = 120;
/// Characters of a long value's prefix.
const PREFIX_CHARS: usize = 40;

/// A value as the report shows it: whole when short; else its first
/// [`PREFIX_CHARS`] characters, its length in characters and a hash of all
/// of it (FNV-1a, 64 bits), so two long values can still be told apart.
pub fn shown(v: &Value) -> String {
    match Long::of(v) {
        None => v.to_string(),
        Some(l) => format!(
            "{}... ({} chars, hash {})",
            Value::String(l.prefix.clone())
                .to_string()
                .trim_end_matches('"'),
            l.length,
            l.hash
        ),
    }
}

/// [`shown`] for `--json`: the value, or `{"truncated": {prefix, length, hash}}`.
pub fn shown_json(v: &Value) -> Value {
    match Long::of(v) {
        None => v.clone(),
        Some(l) => json!({"truncated": {"prefix": l.prefix, "length": l.length, "hash": l.hash}}),
    }
}

/// A value too long to show whole.
struct Long {
    prefix: String,
    length: usize,
    hash: String,
}

impl Long {
    fn of(v: &Value) -> Option<Self> {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let length = text.chars().count();
        (length > SHOWN_MAX_CHARS).then(|| Long {
            prefix: text.chars().take(PREFIX_CHARS).collect(),
            length,
            hash: format!("{:016x}", fnv1a(text.as_bytes())),
        })
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where two long values first differ (in characters), when both are
/// strings too long to show whole.
fn first_difference(a: &Value, b: &Value) -> Option<usize> {
    let (Value::String(a), Value::String(b)) = (a, b) else {
        return None;
    };
    if a.chars().count() <= SHOWN_MAX_CHARS && b.chars().count() <= SHOWN_MAX_CHARS {
        return None;
    }
    let same = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    Some(same)
}

/// The outcome of a run: equal when no table of any target differs.
#[derive(Debug, Clone)]
pub struct Report {
    /// `user@host:port/db` of the source.
    pub source: String,
    /// The source position waited for (`None` with `--no-wait`).
    pub source_lsn: Option<String>,
    pub capture_wait: Option<Duration>,
    pub sink_waits: Vec<SinkWait>,
    pub targets: Vec<TargetReport>,
    /// Earlier rounds that found differences (with retries).
    pub retried: u32,
}

/// One sink's target.
#[derive(Debug, Clone)]
pub struct TargetReport {
    pub label: String,
    pub tables: Vec<TableReport>,
}

/// One source table against its copy in one target.
#[derive(Debug, Clone, Default)]
pub struct TableReport {
    /// `schema.table`.
    pub table: String,
    /// Where the target keeps it.
    pub location: String,
    pub source_rows: u64,
    /// Live rows in the target.
    pub target_rows: u64,
    /// Source rows the target lacks (or holds as deleted).
    pub missing: u64,
    /// Rows present on both sides with a different value.
    pub changed: u64,
    /// Live target rows the source does not have.
    pub extra: u64,
    /// The first differences found.
    pub examples: Vec<Difference>,
    /// Columns the target holds though the sink's field selection leaves
    /// them out (e.g. a warehouse table created before the exclusion): told,
    /// not a difference.
    pub held_unselected: std::collections::BTreeSet<String>,
}

/// One differing key.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    Missing {
        key: Value,
    },
    Changed {
        key: Value,
        diff: ColumnDiff,
    },
    /// A key the target holds and the source does not (values as text).
    Extra {
        key: Vec<String>,
    },
}

impl TableReport {
    pub fn is_equal(&self) -> bool {
        self.missing == 0
            && self.changed == 0
            && self.extra == 0
            && self.source_rows == self.target_rows
    }
}

impl Report {
    /// Whether every table of every target equals the source.
    pub fn is_equal(&self) -> bool {
        self.targets
            .iter()
            .all(|t| t.tables.iter().all(TableReport::is_equal))
    }

    /// Table copies that differ.
    pub fn differing(&self) -> usize {
        self.targets
            .iter()
            .flat_map(|t| &t.tables)
            .filter(|t| !t.is_equal())
            .count()
    }

    /// Table copies compared.
    pub fn compared(&self) -> usize {
        self.targets.iter().map(|t| t.tables.len()).sum()
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { key } => write!(f, "missing  {}", shown(key)),
            Self::Changed { key, diff } => {
                write!(
                    f,
                    "changed  {}: column {}: source {}, target {}",
                    shown(key),
                    diff.column,
                    shown(&diff.source),
                    shown(&diff.target)
                )?;
                match first_difference(&diff.source, &diff.target) {
                    Some(at) => write!(f, "; they differ from character {at} on"),
                    None => Ok(()),
                }
            }
            Self::Extra { key } => {
                let key: Vec<String> = key
                    .iter()
                    .map(|k| shown(&Value::String(k.clone())))
                    .collect();
                write!(f, "extra    {}", key.join(", "))
            }
        }
    }
}

impl Difference {
    /// The machine-readable form (`oncely verify --json`), values as [`shown_json`].
    pub fn to_json(&self) -> Value {
        match self {
            Self::Missing { key } => json!({"kind": "missing", "key": shown_json(key)}),
            Self::Changed { key, diff } => json!({
                "kind": "changed",
                "key": shown_json(key),
                "column": diff.column,
                "source": shown_json(&diff.source),
                "target": shown_json(&diff.target),
                "first_difference": first_difference(&diff.source, &diff.target),
            }),
            Self::Extra { key } => json!({
                "kind": "extra",
                "key": key.iter().map(|k| shown_json(&Value::String(k.clone()))).collect::<Vec<_>>(),
            }),
        }
    }
}

impl Report {
    /// The machine-readable report (`oncely verify --json`).
    pub fn to_json(&self) -> Value {
        json!({
            "result": if self.is_equal() { "equal" } else { "different" },
            "source": self.source,
            "source_lsn": self.source_lsn,
            "capture_wait_seconds": self.capture_wait.map(|d| d.as_secs_f64()),
            "sink_waits": self.sink_waits.iter().map(|w| json!({
                "sink": w.label,
                "lag_offsets": w.lag_offsets,
                "waited_seconds": w.waited.as_secs_f64(),
            })).collect::<Vec<_>>(),
            "targets": self.targets.iter().map(|t| json!({
                "target": t.label,
                "tables": t.tables.iter().map(|r| json!({
                    "table": r.table,
                    "location": r.location,
                    "equal": r.is_equal(),
                    "source_rows": r.source_rows,
                    "target_rows": r.target_rows,
                    "missing": r.missing,
                    "changed": r.changed,
                    "extra": r.extra,
                    "examples": r.examples.iter().map(Difference::to_json).collect::<Vec<_>>(),
                    "held_unselected": r.held_unselected,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "rounds": self.retried + 1,
            "compared": self.compared(),
            "differing": self.differing(),
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "source {}", self.source)?;
        if let (Some(lsn), Some(waited)) = (&self.source_lsn, self.capture_wait) {
            writeln!(
                f,
                "capture holds the source position {lsn} (waited {:.1}s)",
                waited.as_secs_f64()
            )?;
        }
        for w in &self.sink_waits {
            writeln!(
                f,
                "{} caught up (was {} offsets behind, waited {:.1}s)",
                w.label,
                w.lag_offsets,
                w.waited.as_secs_f64()
            )?;
        }
        for target in &self.targets {
            writeln!(f, "\n{}", target.label)?;
            if target.tables.is_empty() {
                writeln!(f, "  (consumes none of the captured tables' topics)")?;
            }
            let width = target
                .tables
                .iter()
                .map(|t| t.table.len())
                .max()
                .unwrap_or(0);
            for t in &target.tables {
                let verdict = if t.is_equal() {
                    "equal".to_owned()
                } else if t.missing + t.changed + t.extra == 0 {
                    // Only the counts disagree: e.g. rows appeared while verify ran.
                    "DIFFERENT: row counts differ".to_owned()
                } else {
                    format!(
                        "DIFFERENT: {} missing, {} changed, {} extra",
                        t.missing, t.changed, t.extra
                    )
                };
                writeln!(
                    f,
                    "  {:width$}  {:>9} source rows  {:>9} in {}  {verdict}",
                    t.table, t.source_rows, t.target_rows, t.location
                )?;
                for e in &t.examples {
                    writeln!(f, "      {e}")?;
                }
                if !t.held_unselected.is_empty() {
                    let names: Vec<&str> = t.held_unselected.iter().map(String::as_str).collect();
                    writeln!(
                        f,
                        "      note: holds {}, which the sink's field selection leaves out (not compared)",
                        names.join(", ")
                    )?;
                }
            }
        }
        if self.retried > 0 {
            writeln!(
                f,
                "\n(round {} of the comparison: earlier rounds found differences)",
                self.retried + 1
            )?;
        }
        let compared = self.compared();
        if self.is_equal() {
            write!(f, "\nresult: equal ({compared} table copies)")
        } else {
            write!(
                f,
                "\nresult: {} of {compared} table copies DIFFER",
                self.differing()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn table(missing: u64, source_rows: u64, target_rows: u64) -> TableReport {
        TableReport {
            table: "public.orders".into(),
            location: "table public.public_orders".into(),
            source_rows,
            target_rows,
            missing,
            examples: if missing > 0 {
                vec![Difference::Missing {
                    key: json!({"id": 3}),
                }]
            } else {
                Vec::new()
            },
            ..TableReport::default()
        }
    }

    fn report(t: TableReport) -> Report {
        Report {
            source: "postgres@h:5432/shop".into(),
            source_lsn: None,
            capture_wait: None,
            sink_waits: Vec::new(),
            retried: 0,
            targets: vec![TargetReport {
                label: "postgres (s.toml, group g)".into(),
                tables: vec![t],
            }],
        }
    }

    #[test]
    fn an_equal_report_says_so() {
        let r = report(table(0, 5, 5));
        assert!(r.is_equal());
        assert!(r.to_string().ends_with("result: equal (1 table copies)"));
    }

    #[test]
    fn differences_are_listed_with_their_keys() {
        let r = report(table(1, 5, 4));
        assert!(!r.is_equal());
        let text = r.to_string();
        assert!(
            text.contains("DIFFERENT: 1 missing, 0 changed, 0 extra"),
            "{text}"
        );
        assert!(text.contains("missing  {\"id\":3}"), "{text}");
        assert!(
            text.ends_with("result: 1 of 1 table copies DIFFER"),
            "{text}"
        );
    }

    #[test]
    fn long_values_print_as_prefix_length_and_hash() {
        let long = "a".repeat(6144);
        let other = format!("{}b{}", "a".repeat(3000), "a".repeat(3143));
        let mut t = table(0, 5, 5);
        t.changed = 1;
        t.examples = vec![Difference::Changed {
            key: json!({"id": 7}),
            diff: ColumnDiff {
                column: "body".into(),
                source: json!(long),
                target: json!(other),
            },
        }];
        let text = report(t.clone()).to_string();
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("changed"))
            .expect("the changed line");
        assert!(line.len() < 300, "{line}");
        assert!(line.contains("(6144 chars, hash "), "{line}");
        assert!(line.contains("differ from character 3000 on"), "{line}");
        assert_ne!(shown(&json!(long)), shown(&json!(other)), "hashes differ");
        assert_eq!(shown(&json!("short")), "\"short\"");

        let parsed: Value =
            serde_json::from_str(&report(t).to_json().to_string()).expect("--json parses");
        assert_eq!(parsed["result"], "different");
        let example = &parsed["targets"][0]["tables"][0]["examples"][0];
        assert_eq!(example["kind"], "changed");
        assert_eq!(example["source"]["truncated"]["length"], 6144);
        assert_eq!(example["first_difference"], 3000);
        assert_eq!(example["key"], json!({"id": 7}));
    }

    #[test]
    fn a_count_mismatch_alone_is_a_difference() {
        assert!(!table(0, 5, 6).is_equal());
    }
}
