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
    /// A MySQL source's `database.include.list` (empty: every database).
    databases: Vec<Regex>,
    /// Databases never captured (a MySQL server's own).
    never: Vec<String>,
}

impl TableFilter {
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, regex::Error> {
        let anchored = |p: &String| Regex::new(&format!("^(?:{p})$"));
        Ok(TableFilter {
            include: include.iter().map(anchored).collect::<Result<_, _>>()?,
            exclude: exclude.iter().map(anchored).collect::<Result<_, _>>()?,
            databases: Vec::new(),
            never: Vec::new(),
        })
    }

    /// Also only the databases (schemas) `include` matches whole (empty:
    /// every one), never those of `never`: a MySQL source's
    /// `database.include.list` and the server's own databases, whose
    /// changes share the one binlog with the captured ones.
    pub fn with_databases(
        mut self,
        include: &[String],
        never: &[&str],
    ) -> Result<Self, regex::Error> {
        self.databases = include
            .iter()
            .map(|p| Regex::new(&format!("^(?:{p})$")))
            .collect::<Result<_, _>>()?;
        self.never = never.iter().map(|d| (*d).to_owned()).collect();
        Ok(self)
    }

    fn database_selected(&self, schema: &str) -> bool {
        !self.never.iter().any(|d| d == schema)
            && (self.databases.is_empty() || self.databases.iter().any(|r| r.is_match(schema)))
    }

    /// Captures everything.
    #[cfg(test)]
    pub fn all() -> Self {
        TableFilter {
            include: Vec::new(),
            exclude: Vec::new(),
            databases: Vec::new(),
            never: Vec::new(),
        }
    }

    pub fn matches(&self, schema: &str, table: &str) -> bool {
        let name = format!("{schema}.{table}");
        let included = self.include.is_empty() || self.include.iter().any(|r| r.is_match(&name));
        included
            && !self.exclude.iter().any(|r| r.is_match(&name))
            && self.database_selected(schema)
    }

    /// Whether the include list alone selects the table (the exclude list not applied).
    pub fn included(&self, schema: &str, table: &str) -> bool {
        let name = format!("{schema}.{table}");
        (self.include.is_empty() || self.include.iter().any(|r| r.is_match(&name)))
            && self.database_selected(schema)
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
    fn a_database_list_and_the_servers_own_databases_narrow_the_tables() {
        let f = TableFilter::new(&[], &["shop.audit".to_string()])
            .unwrap()
            .with_databases(&["shop|crm".to_string()], &["mysql"])
            .unwrap();
        assert!(f.matches("shop", "orders"));
        assert!(f.matches("crm", "people"));
        assert!(!f.matches("shop", "audit"));
        assert!(
            !f.matches("shopping", "orders"),
            "the whole name must match"
        );
        assert!(!f.matches("other", "orders"));
        let all = TableFilter::new(&[], &[])
            .unwrap()
            .with_databases(&[], &["mysql"])
            .unwrap();
        assert!(all.matches("any", "t"));
        assert!(!all.matches("mysql", "user"));
        assert!(!all.included("mysql", "user"));
    }

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
