//! The metrics documentation matches what the processes register: the
//! metrics table of docs/operating.md lists exactly the metrics of capture's and the
//! sink runner's registries (name, type, labels, meaning), and every metric
//! the Grafana dashboard in `examples/` queries is one of them. No services.

use std::collections::BTreeSet;

use oncely_core::endpoint::MetricInfo;

const BEGIN: &str =
    "<!-- metrics table: tests/it/metrics_catalog.rs checks it against the registries -->";
const END: &str = "<!-- end of metrics table -->";

/// Every metric capture and a sink register, by name.
fn catalog() -> Vec<MetricInfo> {
    let capture = oncely_capture::metrics::CaptureMetrics::new("c");
    let sink = oncely_sinks::metrics::Metrics::new().expect("sink metrics");
    let mut all: Vec<MetricInfo> = capture
        .catalog()
        .iter()
        .chain(sink.catalog())
        .cloned()
        .collect();
    all.sort();
    all
}

fn row(m: &MetricInfo) -> String {
    let labels = if m.labels.is_empty() {
        "-".to_owned()
    } else {
        m.labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("| `{}` | {} | {labels} | {} |", m.name, m.kind, m.help)
}

fn operating_doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md"))
        .expect("docs/operating.md")
}

#[test]
fn the_operating_doc_table_lists_exactly_the_registered_metrics() {
    let all = catalog();
    assert!(all.len() >= 25, "both registries read: {all:?}");
    let names: BTreeSet<&str> = all.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), all.len(), "a name registered twice: {all:?}");
    let text = operating_doc();
    let table = text
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(t, _)| t)
        .unwrap_or_else(|| {
            panic!("docs/operating.md has no metrics table between {BEGIN} and {END}")
        });
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    let expected: Vec<String> = all.iter().map(row).collect();
    assert_eq!(
        rows,
        expected,
        "the metrics table of docs/operating.md differs from the registries; it should read:\n\n| name | type | labels | meaning |\n| --- | --- | --- | --- |\n{}\n",
        expected.join("\n")
    );
}

/// `oncely_...` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("oncely_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_queries_only_registered_metrics() {
    let all = catalog();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/grafana-dashboard.json"
    ))
    .expect("examples/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut used = BTreeSet::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let mut found = Vec::new();
        exprs(panel, &mut found);
        assert!(
            !found.is_empty(),
            "a panel without a query: {}",
            panel["title"]
        );
        for expr in found {
            let names = metric_names(&expr);
            assert!(!names.is_empty(), "{expr}: queries no oncely metric");
            for name in names {
                let known = all.iter().any(|m| {
                    m.name == name
                        || (m.kind == "histogram"
                            && ["_bucket", "_sum", "_count"]
                                .iter()
                                .any(|s| name.strip_suffix(s) == Some(m.name.as_str())))
                });
                assert!(
                    known,
                    "{expr}: {name} is not a metric the processes register"
                );
                used.insert(name);
            }
        }
    }
    assert!(
        used.len() >= 15,
        "the dashboard covers capture and the sinks: {used:?}"
    );
}
