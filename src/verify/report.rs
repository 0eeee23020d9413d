//! What verify found, and how it reads on a terminal.

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::compare::ColumnDiff;
use super::wait::SinkWait;

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
            Self::Missing { key } => write!(f, "missing  {key}"),
            Self::Changed { key, diff } => write!(
                f,
                "changed  {key}: column {}: source {}, target {}",
                diff.column, diff.source, diff.target
            ),
            Self::Extra { key } => write!(f, "extra    {}", key.join(", ")),
        }
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
    fn a_count_mismatch_alone_is_a_difference() {
        assert!(!table(0, 5, 6).is_equal());
    }
}
