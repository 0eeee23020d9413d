//! Which tables are captured (`table.include.list` / `table.exclude.list`) and
//! which columns key them when the table's own key will not do (`message.key.columns`).

use std::collections::HashMap;

use regex::Regex;

/// Debezium's table filter: each entry is a regular expression that must match
/// the whole `schema.table` name. With an include list only matching tables
/// are captured; the exclude list removes tables. Both empty: every table.
#[derive(Debug, Clone)]
pub struct TableFilter {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl TableFilter {
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, regex::Error> {
        let anchored = |p: &String| Regex::new(&format!("^(?:{p})$"));
        Ok(TableFilter {
            include: include.iter().map(anchored).collect::<Result<_, _>>()?,
            exclude: exclude.iter().map(anchored).collect::<Result<_, _>>()?,
        })
    }

    /// Captures everything.
    #[cfg(test)]
    pub fn all() -> Self {
        TableFilter {
            include: Vec::new(),
            exclude: Vec::new(),
        }
    }

    pub fn matches(&self, schema: &str, table: &str) -> bool {
        let name = format!("{schema}.{table}");
        let included = self.include.is_empty() || self.include.iter().any(|r| r.is_match(&name));
        included && !self.exclude.iter().any(|r| r.is_match(&name))
    }

    /// Whether the include list alone selects the table (the exclude list not applied).
    pub fn included(&self, schema: &str, table: &str) -> bool {
        let name = format!("{schema}.{table}");
        self.include.is_empty() || self.include.iter().any(|r| r.is_match(&name))
    }
}

/// Parses `message.key.columns`: `schema.table:col1,col2;schema.other:col`.
/// Returns `schema.table` -> columns.
pub fn parse_key_columns(spec: Option<&str>) -> Result<HashMap<String, Vec<String>>, String> {
    let mut out = HashMap::new();
    let Some(spec) = spec else { return Ok(out) };
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (table, cols) = entry
            .split_once(':')
            .ok_or_else(|| format!("entry {entry:?} must look like `schema.table:col1,col2`"))?;
        let table = table.trim();
        if !table.contains('.') {
            return Err(format!(
                "table {table:?} must be schema-qualified, e.g. public.{table}"
            ));
        }
        let cols: Vec<String> = cols
            .split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        if cols.is_empty() {
            return Err(format!("entry {entry:?} names no columns"));
        }
        out.insert(table.to_string(), cols);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_and_exclude_match_whole_names() {
        let f = TableFilter::new(
            &["public\\..*".to_string()],
            &["public\\.audit_.*".to_string()],
        )
        .unwrap();
        assert!(f.matches("public", "orders"));
        assert!(!f.matches("public", "audit_log"));
        assert!(!f.matches("other", "orders"));
        // Anchored: a partial match is not a match.
        let f = TableFilter::new(&["public.order".to_string()], &[]).unwrap();
        assert!(!f.matches("public", "orders"));
        assert!(TableFilter::all().matches("x", "y"));
        // `included` ignores the exclude list.
        let f = TableFilter::new(
            &["public\\..*".to_string()],
            &["public\\.orders".to_string()],
        )
        .unwrap();
        assert!(!f.matches("public", "orders"));
        assert!(f.included("public", "orders"));
        assert!(!f.included("other", "orders"));
    }

    #[test]
    fn key_columns_parse() {
        let m = parse_key_columns(Some("public.a:id, tenant ; s.b:k")).unwrap();
        assert_eq!(m["public.a"], vec!["id", "tenant"]);
        assert_eq!(m["s.b"], vec!["k"]);
        assert!(parse_key_columns(Some("a:id")).is_err());
        assert!(parse_key_columns(Some("public.a")).is_err());
        assert!(parse_key_columns(Some("public.a:")).is_err());
        assert!(parse_key_columns(None).unwrap().is_empty());
    }
}
