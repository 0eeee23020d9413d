//! Shapes tied to binlog positions: what a TABLE_MAP lacks, as of a
//! place in the binlog.
//!
//! ```text
//!  snapshot (catalog under its lock) ──▶ ShapeFacts as of the position
//!                                          │ stored with the offset
//!  binlog: QUERY (DDL text) ─▶ apply_ddl ──▶ ShapeFacts as of the DDL
//!          TABLE_MAP ─────────────────────▶ shape = TABLE_MAP + facts
//! ```
//!
//! With `binlog_row_metadata = FULL` every TABLE_MAP carries the table's
//! column names, types, signedness, ENUM/SET labels and primary key as of
//! its event, so those need no history. Only two facts need one, because
//! only the declaration says them: a `tinyint(1)` (the binlog has no
//! display width) and MariaDB's JSON (a `longtext` with a `json_valid`
//! check, a BLOB in the binlog). They are derived from each DDL's text, a
//! pure function of the facts before it, so replaying the binlog from a
//! stored position with the facts stored beside it derives them again
//! exactly, whatever the catalog says now. The invariant: the facts
//! stored with an offset are those as of that offset; a kill between a
//! DDL and the next row event leaves either the offset before the DDL with
//! the facts before it (the replay derives the DDL again) or both after.
//!
//! A DDL this parser does not understand for a table (`CREATE TABLE .. AS
//! SELECT`, an ALTER of a table never seen) forgets that table's facts:
//! its next TABLE_MAP reads them from `information_schema`, which may be
//! ahead of the event if more DDL followed (docs/mysql.md names this).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::shape::CatalogColumn;
use crate::envelope::SourceIdentity;

/// The two facts of one column (columns with neither are not kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Facts {
    tinyint1: bool,
    json: bool,
}

/// One table's facts, as stored: the names of its `tinyint(1)` columns and
/// of its MariaDB JSON columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableFacts {
    pub database: String,
    pub table: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tinyint1: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json: Vec<String>,
    /// The table's identity (see [`TableIds`]); absent in offsets stored
    /// before columns had one, then numbered at the next TABLE_MAP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<TableIds>,
}

type Key = (String, String);

/// Every known table's facts as of one binlog position. A table not in it
/// is unknown: its facts come from the catalog at its next TABLE_MAP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<TableFacts>", into = "Vec<TableFacts>")]
pub struct ShapeFacts {
    /// Column names lower-cased (MySQL compares them so).
    tables: BTreeMap<Key, BTreeMap<String, Facts>>,
    /// Each known table's column identities (a table in `tables` may lack
    /// them: stored before they existed).
    ids: BTreeMap<Key, TableIds>,
}

/// What identifies a table's columns across DDL, as the warehouse needs
/// it (docs/design.md, "Schema changes"): MySQL has no `attnum`, so each
/// column gets a number when the stream first sees it, kept by RENAME
/// COLUMN and CHANGE, never given again after a DROP; and the table a
/// number of its own (`oid`) that a table created again under its name
/// does not share. Derived from DDL text like the other facts, so a
/// replay from a stored position numbers every column the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableIds {
    pub oid: u32,
    /// By lower-cased column name.
    pub columns: BTreeMap<String, i16>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<i16>,
}

impl TableIds {
    fn new(oid: u32) -> Self {
        Self {
            oid,
            ..Self::default()
        }
    }

    /// One above every number given so far (dropped ones included).
    fn next(&self) -> i16 {
        let max = self.columns.values().chain(&self.dropped).copied().max();
        max.unwrap_or(0).saturating_add(1)
    }

    /// Numbers `name` (lower-cased) unless it has a number.
    fn add(&mut self, name: &str) {
        if !self.columns.contains_key(name) {
            let n = self.next();
            self.columns.insert(name.to_owned(), n);
        }
    }

    fn drop_column(&mut self, name: &str) {
        if let Some(n) = self.columns.remove(name) {
            self.dropped.push(n);
        }
    }

    fn rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        if let Some(n) = self.columns.remove(from) {
            if let Some(replaced) = self.columns.insert(to.to_owned(), n) {
                self.dropped.push(replaced);
            }
        }
    }

    fn alter(&mut self, op: &AlterOp) {
        match op {
            AlterOp::Column {
                old: Some(old),
                name,
                ..
            } if old != name => self.rename(old, name),
            AlterOp::Column { name, .. } => self.add(name),
            AlterOp::Drop(name) => self.drop_column(name),
            AlterOp::Rename(from, to) => self.rename(from, to),
            AlterOp::JsonCheck(_) | AlterOp::DropConstraint(_) | AlterOp::RenameTable(_) => {}
        }
    }

    /// Whether every one of `names` has a number.
    pub fn covers<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        names.all(|n| self.columns.contains_key(&n.to_lowercase()))
    }

    /// The identity of a table description with columns `names`, in order.
    pub fn identity<'a>(&self, names: impl Iterator<Item = &'a str>) -> SourceIdentity {
        let attnums: Vec<Option<i16>> = names
            .map(|n| self.columns.get(&n.to_lowercase()).copied())
            .collect();
        let mut dropped: Vec<i16> = self
            .dropped
            .iter()
            .copied()
            .filter(|d| !attnums.contains(&Some(*d)))
            .collect();
        dropped.sort_unstable();
        SourceIdentity {
            table_oid: self.oid,
            attnums,
            dropped,
        }
    }
}

/// A table's number: a checksum of its name and of the statement that
/// created it (none: it was first read from the catalog), so a table
/// created again under its name is another table to the warehouse.
fn table_oid(key: &Key, created_by: &str) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for part in [key.0.as_str(), key.1.as_str(), created_by] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    h.finalize()
}

impl From<Vec<TableFacts>> for ShapeFacts {
    fn from(v: Vec<TableFacts>) -> Self {
        let mut out = Self::default();
        for t in v {
            let key = (t.database, t.table);
            if let Some(ids) = t.ids {
                out.ids.insert(key.clone(), ids);
            }
            let cols = out.tables.entry(key).or_default();
            for c in t.tinyint1 {
                cols.entry(c.to_lowercase()).or_default().tinyint1 = true;
            }
            for c in t.json {
                cols.entry(c.to_lowercase()).or_default().json = true;
            }
        }
        out
    }
}

impl From<ShapeFacts> for Vec<TableFacts> {
    fn from(mut f: ShapeFacts) -> Self {
        f.tables
            .into_iter()
            .map(|((database, table), cols)| {
                let ids = f.ids.remove(&(database.clone(), table.clone()));
                let pick = |p: fn(&Facts) -> bool| {
                    cols.iter()
                        .filter(|(_, f)| p(f))
                        .map(|(n, _)| n.clone())
                        .collect()
                };
                TableFacts {
                    database,
                    table,
                    tinyint1: pick(|f| f.tinyint1),
                    json: pick(|f| f.json),
                    ids,
                }
            })
            .collect()
    }
}

impl ShapeFacts {
    /// Records a table's facts from the catalog (a snapshot's, read under
    /// its lock, or a TABLE_MAP's first sight of an unknown table).
    pub fn set_from_catalog(&mut self, database: &str, table: &str, columns: &[CatalogColumn]) {
        let cols = columns
            .iter()
            .filter_map(|c| {
                let f = Facts {
                    tinyint1: is_tinyint1(&c.column_type),
                    json: c.json,
                };
                (f != Facts::default()).then(|| (c.name.to_lowercase(), f))
            })
            .collect();
        let key: Key = (database.into(), table.into());
        let mut ids = TableIds::new(table_oid(&key, ""));
        for c in columns {
            ids.add(&c.name.to_lowercase());
        }
        self.ids.insert(key.clone(), ids);
        self.tables.insert(key, cols);
    }

    /// [`Self::set_from_catalog`] at a TABLE_MAP's first sight of a table
    /// the facts do not know (never seen, or forgotten after a statement
    /// the parser could not follow): the table gets a number of its own,
    /// from the map's table id (the same when the binlog is read again),
    /// so the warehouse matches its columns by name again rather than
    /// trusting numbers given in another order.
    pub fn set_from_table_map(
        &mut self,
        database: &str,
        table: &str,
        columns: &[CatalogColumn],
        table_id: u64,
    ) {
        self.set_from_catalog(database, table, columns);
        let key: Key = (database.into(), table.into());
        let oid = table_oid(&key, &format!("TABLE_MAP {table_id}"));
        if let Some(ids) = self.ids.get_mut(&key) {
            ids.oid = oid;
        }
    }

    /// The column identities of a known table.
    pub fn ids(&self, database: &str, table: &str) -> Option<&TableIds> {
        self.ids.get(&(database.to_owned(), table.to_owned()))
    }

    /// Numbers the columns of known table `database.table` that have no
    /// number yet, in the order of `names` (a TABLE_MAP's): facts stored
    /// before columns had numbers, or a statement the parser passed over.
    pub fn number_columns(&mut self, database: &str, table: &str, names: &[String]) {
        let key: Key = (database.into(), table.into());
        if !self.tables.contains_key(&key) {
            return;
        }
        let ids = self
            .ids
            .entry(key.clone())
            .or_insert_with(|| TableIds::new(table_oid(&key, "")));
        for n in names {
            ids.add(&n.to_lowercase());
        }
    }

    /// No table is known.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Keeps the tables `keep` says yes to (the captured ones, before the
    /// facts are stored with an offset), forgetting the others.
    pub fn retain_tables(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        self.tables.retain(|(db, table), _| keep(db, table));
        let tables = &self.tables;
        self.ids.retain(|k, _| tables.contains_key(k));
    }

    pub fn knows(&self, database: &str, table: &str) -> bool {
        self.tables
            .contains_key(&(database.to_owned(), table.to_owned()))
    }

    /// The facts of a known table, as catalog columns for
    /// [`super::shape::TableShape::apply_catalog`].
    pub fn catalog(&self, database: &str, table: &str) -> Option<Vec<CatalogColumn>> {
        let cols = self.tables.get(&(database.to_owned(), table.to_owned()))?;
        Some(
            cols.iter()
                .map(|(name, f)| CatalogColumn {
                    name: name.clone(),
                    column_type: if f.tinyint1 { "tinyint(1)" } else { "" }.into(),
                    json: f.json,
                })
                .collect(),
        )
    }

    /// Applies one DDL statement (`default_db`: the QUERY event's schema).
    /// Returns the tables whose facts it changed or forgot.
    pub fn apply_ddl(&mut self, default_db: &str, sql: &str) -> Vec<(String, String)> {
        let toks = tokenize(sql);
        let mut p = Parser {
            toks: &toks,
            i: 0,
            db: default_db,
        };
        let effects = p.statement();
        let mut touched = Vec::new();
        for e in effects {
            self.apply(e, sql, &mut touched);
        }
        touched
    }

    /// Applies one effect of statement `sql`.
    fn apply(&mut self, e: Effect, sql: &str, touched: &mut Vec<Key>) {
        match e {
            Effect::Set(k, cols, names) => {
                touched.push(k.clone());
                let mut ids = TableIds::new(table_oid(&k, sql));
                for n in &names {
                    ids.add(n);
                }
                self.ids.insert(k.clone(), ids);
                self.tables.insert(k, cols);
            }
            Effect::SetIfUnknown(k, cols, names) => {
                if !self.tables.contains_key(&k) {
                    self.apply(Effect::Set(k, cols, names), sql, touched);
                }
            }
            Effect::Forget(k) => {
                touched.push(k.clone());
                self.tables.remove(&k);
                self.ids.remove(&k);
            }
            Effect::Move(from, to) => {
                touched.extend([from.clone(), to.clone()]);
                match self.tables.remove(&from) {
                    Some(cols) => self.tables.insert(to.clone(), cols),
                    None => self.tables.remove(&to),
                };
                match self.ids.remove(&from) {
                    Some(ids) => self.ids.insert(to, ids),
                    None => self.ids.remove(&to),
                };
            }
            Effect::Copy(from, to) => {
                touched.push(to.clone());
                match self.tables.get(&from).cloned() {
                    Some(cols) => self.tables.insert(to.clone(), cols),
                    None => self.tables.remove(&to),
                };
                let copied = self.ids.get(&from).map(|ids| TableIds {
                    oid: table_oid(&to, sql),
                    ..ids.clone()
                });
                match copied {
                    Some(ids) => self.ids.insert(to, ids),
                    None => self.ids.remove(&to),
                };
            }
            Effect::Alter(k, ops) => self.alter(k, ops, sql, touched),
        }
    }

    fn alter(&mut self, k: Key, ops: Vec<AlterOp>, sql: &str, touched: &mut Vec<Key>) {
        touched.push(k.clone());
        let mut renamed = None;
        if let Some(cols) = self.tables.get_mut(&k) {
            let mut ids = self.ids.get_mut(&k);
            for op in ops {
                if let Some(ids) = ids.as_deref_mut() {
                    ids.alter(&op);
                }
                if let AlterOp::RenameTable(to) = op {
                    renamed = Some(to);
                } else {
                    alter_column(cols, op);
                }
            }
        }
        if let Some(to) = renamed {
            self.apply(Effect::Move(k, to), sql, touched);
        }
    }
}

/// The facts now and as of the start of the transaction being read: a
/// stored offset inside a transaction resumes from its start, so it must
/// carry the facts from before any DDL of that transaction. A copy is
/// made only when the facts change inside a transaction.
#[derive(Debug, Clone, Default)]
pub struct TransactionFacts {
    now: ShapeFacts,
    /// `None`: unchanged since the transaction's start.
    at_start: Option<ShapeFacts>,
}

impl TransactionFacts {
    /// Starts from `facts` at a transaction start.
    pub fn new(facts: ShapeFacts) -> Self {
        Self {
            now: facts,
            at_start: None,
        }
    }

    /// The facts as of the last event read.
    pub fn now(&self) -> &ShapeFacts {
        &self.now
    }

    /// The facts as of the start of the current transaction.
    pub fn at_start(&self) -> &ShapeFacts {
        self.at_start.as_ref().unwrap_or(&self.now)
    }

    /// The facts, to change inside the current transaction.
    pub fn change(&mut self) -> &mut ShapeFacts {
        if self.at_start.is_none() {
            self.at_start = Some(self.now.clone());
        }
        &mut self.now
    }

    /// A transaction ended: the next one starts from the facts now.
    pub fn commit(&mut self) {
        self.at_start = None;
    }
}

fn alter_column(cols: &mut BTreeMap<String, Facts>, op: AlterOp) {
    match op {
        AlterOp::Column { old, name, facts } => {
            if let Some(old) = old {
                cols.remove(&old);
            }
            cols.remove(&name);
            if facts != Facts::default() {
                cols.insert(name, facts);
            }
        }
        AlterOp::Drop(name) => {
            cols.remove(&name);
        }
        AlterOp::Rename(from, to) => {
            if let Some(f) = cols.remove(&from) {
                cols.insert(to, f);
            }
        }
        AlterOp::JsonCheck(name) => cols.entry(name).or_default().json = true,
        // MariaDB names a column's own CHECK after the column.
        AlterOp::DropConstraint(name) => {
            if let Some(f) = cols.get_mut(&name) {
                f.json = false;
                if *f == Facts::default() {
                    cols.remove(&name);
                }
            }
        }
        AlterOp::RenameTable(_) => {}
    }
}

fn is_tinyint1(column_type: &str) -> bool {
    column_type
        .trim()
        .to_ascii_lowercase()
        .starts_with("tinyint(1)")
}

/// What one statement does to the facts.
/// The tables a row-changing statement (`INSERT`, `REPLACE`, `UPDATE`,
/// `DELETE`, `LOAD DATA`) writes, `default_db` its QUERY event's schema;
/// `None` when its form is not one of the single-table ones read here
/// (multi-table UPDATE and DELETE, joins): the caller assumes the worst.
pub fn row_change_targets(default_db: &str, sql: &str) -> Option<Vec<(String, String)>> {
    let toks = tokenize(sql);
    let mut p = Parser {
        toks: &toks,
        i: 0,
        db: default_db,
    };
    let modifiers = [
        "LOW_PRIORITY",
        "DELAYED",
        "HIGH_PRIORITY",
        "QUICK",
        "IGNORE",
    ];
    let skip_modifiers = |p: &mut Parser<'_>| while modifiers.iter().any(|m| p.eat_kw(m)) {};
    let single = |p: &mut Parser<'_>, ends: &[&str]| -> Option<Vec<Key>> {
        let key = p.table_name()?;
        // An alias, then what must follow a single table.
        if !ends.iter().any(|e| p.peek_kw(e)) {
            p.eat_kw("AS");
            if matches!(p.toks.get(p.i), Some(Tok::Word(_) | Tok::Quoted(_)))
                && !ends.iter().any(|e| p.peek_kw(e))
            {
                p.i += 1;
            }
        }
        let end = p.i == p.toks.len() || ends.iter().any(|e| p.peek_kw(e));
        end.then(|| vec![key])
    };
    if p.eat_kw("INSERT") || p.eat_kw("REPLACE") {
        skip_modifiers(&mut p);
        p.eat_kw("INTO");
        let key = p.table_name()?;
        return Some(vec![key]);
    }
    if p.eat_kw("UPDATE") {
        skip_modifiers(&mut p);
        return single(&mut p, &["SET"]);
    }
    if p.eat_kw("DELETE") {
        skip_modifiers(&mut p);
        if !p.eat_kw("FROM") {
            return None;
        }
        return single(
            &mut p,
            &["WHERE", "ORDER", "LIMIT", "PARTITION", "RETURNING"],
        );
    }
    if p.eat_kw("LOAD") {
        while p.i < p.toks.len() {
            if p.eat_kw("INTO") && p.eat_kw("TABLE") {
                return Some(vec![p.table_name()?]);
            }
            p.i += 1;
        }
    }
    None
}

#[derive(Debug, PartialEq)]
enum Effect {
    /// A table's facts and its column names, in declaration order.
    Set(Key, BTreeMap<String, Facts>, Vec<String>),
    SetIfUnknown(Key, BTreeMap<String, Facts>, Vec<String>),
    Forget(Key),
    Move(Key, Key),
    Copy(Key, Key),
    Alter(Key, Vec<AlterOp>),
}

#[derive(Debug, PartialEq)]
enum AlterOp {
    /// ADD, MODIFY (old = name) or CHANGE (old) of a column definition.
    Column {
        old: Option<String>,
        name: String,
        facts: Facts,
    },
    Drop(String),
    Rename(String, String),
    JsonCheck(String),
    DropConstraint(String),
    RenameTable(Key),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A bare word: keyword, identifier or number.
    Word(String),
    /// A backquoted identifier.
    Quoted(String),
    /// A string literal (or a double-quoted one).
    Str,
    Punct(char),
}

/// SQL text to tokens; comments dropped, MySQL's executable comments
/// (`/*!50100 ... */`, `/*M!... */`) kept as their text.
fn tokenize(sql: &str) -> Vec<Tok> {
    let c: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '#' || (ch == '-' && next == Some('-')) {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            if matches!(c.get(i + 2), Some('!') | Some('M')) {
                i += 2;
                while i < c.len() && (c[i] == '!' || c[i] == 'M' || c[i].is_ascii_digit()) {
                    i += 1;
                }
            } else {
                i += 2;
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
        } else if ch == '*' && next == Some('/') {
            i += 2;
        } else if ch == '`' || ch == '\'' || ch == '"' {
            let (text, end) = quoted(&c, i);
            out.push(if ch == '`' {
                Tok::Quoted(text)
            } else {
                Tok::Str
            });
            i = end;
        } else if ch.is_alphanumeric() || ch == '_' || ch == '$' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '$') {
                i += 1;
            }
            out.push(Tok::Word(c[start..i].iter().collect()));
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// The text of a quoted token starting at `start` (quote doubled or, in
/// strings, backslash-escaped) and the index after it.
fn quoted(c: &[char], start: usize) -> (String, usize) {
    let q = c[start];
    let mut text = String::new();
    let mut i = start + 1;
    while i < c.len() {
        if c[i] == '\\' && q != '`' {
            text.extend(c.get(i + 1));
            i += 2;
        } else if c[i] == q {
            if c.get(i + 1) == Some(&q) {
                text.push(q);
                i += 2;
            } else {
                return (text, i + 1);
            }
        } else {
            text.push(c[i]);
            i += 1;
        }
    }
    (text, i)
}

struct Parser<'a> {
    toks: &'a [Tok],
    i: usize,
    db: &'a str,
}

impl<'a> Parser<'a> {
    fn peek_kw(&self, kw: &str) -> bool {
        matches!(self.toks.get(self.i), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(kw))
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        let yes = self.peek_kw(kw);
        if yes {
            self.i += 1;
        }
        yes
    }

    fn eat_punct(&mut self, p: char) -> bool {
        let yes = self.toks.get(self.i) == Some(&Tok::Punct(p));
        if yes {
            self.i += 1;
        }
        yes
    }

    fn ident(&mut self) -> Option<String> {
        let t = match self.toks.get(self.i)? {
            Tok::Word(w) | Tok::Quoted(w) => w.clone(),
            _ => return None,
        };
        self.i += 1;
        Some(t)
    }

    /// `[db.]table`.
    fn table_name(&mut self) -> Option<Key> {
        let first = self.ident()?;
        if self.eat_punct('.') {
            Some((first, self.ident()?))
        } else {
            Some((self.db.to_owned(), first))
        }
    }

    /// Eats `IF [NOT] EXISTS`; whether it was there.
    fn if_exists(&mut self) -> bool {
        let save = self.i;
        if self.eat_kw("IF") {
            self.eat_kw("NOT");
            if self.eat_kw("EXISTS") {
                return true;
            }
            self.i = save;
        }
        false
    }

    fn statement(&mut self) -> Vec<Effect> {
        if self.eat_kw("CREATE") {
            if self.eat_kw("OR") {
                self.eat_kw("REPLACE");
            }
            self.eat_kw("TEMPORARY");
            if self.eat_kw("TABLE") {
                return self.create_table().into_iter().collect();
            }
        } else if self.eat_kw("ALTER") {
            self.eat_kw("ONLINE");
            self.eat_kw("IGNORE");
            if self.eat_kw("TABLE") {
                return self.alter_table().into_iter().collect();
            }
        } else if self.eat_kw("RENAME") && (self.eat_kw("TABLE") || self.eat_kw("TABLES")) {
            return self.rename_tables();
        } else if self.eat_kw("DROP") {
            self.eat_kw("TEMPORARY");
            if self.eat_kw("TABLE") || self.eat_kw("TABLES") {
                self.if_exists();
                return self.name_list().into_iter().map(Effect::Forget).collect();
            }
        }
        Vec::new()
    }

    fn name_list(&mut self) -> Vec<Key> {
        let mut out = Vec::new();
        while let Some(k) = self.table_name() {
            out.push(k);
            if !self.eat_punct(',') {
                break;
            }
        }
        out
    }

    fn rename_tables(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        while let Some(from) = self.table_name() {
            // `RENAME TABLE a WAIT n TO b` / `a NOWAIT TO b`.
            if self.eat_kw("WAIT") {
                self.i += 1;
            }
            self.eat_kw("NOWAIT");
            self.eat_kw("TO");
            let Some(to) = self.table_name() else { break };
            out.push(Effect::Move(from, to));
            if !self.eat_punct(',') {
                break;
            }
        }
        out
    }

    fn create_table(&mut self) -> Option<Effect> {
        let if_not_exists = self.if_exists();
        let key = self.table_name()?;
        let paren = self.eat_punct('(');
        if self.eat_kw("LIKE") {
            return Some(match self.table_name() {
                Some(from) => Effect::Copy(from, key),
                None => Effect::Forget(key),
            });
        }
        if !paren {
            return Some(Effect::Forget(key));
        }
        let body = self.group();
        // Columns from a SELECT: not in the text.
        let rest = &self.toks[self.i..];
        if rest
            .iter()
            .any(|t| matches!(t, Tok::Word(w) if w.eq_ignore_ascii_case("SELECT")))
        {
            return Some(Effect::Forget(key));
        }
        let mut cols = BTreeMap::new();
        let mut names = Vec::new();
        for def in split_top(body) {
            for op in definition(def) {
                if let AlterOp::Column { name, .. } = &op {
                    names.push(name.clone());
                }
                alter_column(&mut cols, op);
            }
        }
        // The server logs `CREATE TABLE IF NOT EXISTS` of a table that
        // exists too, changing nothing: a known table keeps its facts.
        Some(if if_not_exists {
            Effect::SetIfUnknown(key, cols, names)
        } else {
            Effect::Set(key, cols, names)
        })
    }

    /// The tokens up to the `)` closing a `(` just eaten; the parser is
    /// left after it.
    fn group(&mut self) -> &'a [Tok] {
        let toks = self.toks;
        let start = self.i;
        let mut depth = 1usize;
        while let Some(t) = toks.get(self.i) {
            self.i += 1;
            match t {
                Tok::Punct('(') => depth += 1,
                Tok::Punct(')') => {
                    depth -= 1;
                    if depth == 0 {
                        return &toks[start..self.i - 1];
                    }
                }
                _ => {}
            }
        }
        &toks[start..]
    }

    fn alter_table(&mut self) -> Option<Effect> {
        self.if_exists();
        let key = self.table_name()?;
        let mut ops = Vec::new();
        for spec in split_top(&self.toks[self.i..]) {
            ops.extend(alter_spec(spec, self.db));
        }
        Some(Effect::Alter(key, ops))
    }
}

/// Splits tokens at the commas outside parentheses.
fn split_top(toks: &[Tok]) -> Vec<&[Tok]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, t) in toks.iter().enumerate() {
        match t {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            Tok::Punct(',') if depth == 0 => {
                out.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < toks.len() {
        out.push(&toks[start..]);
    }
    out
}

/// Words that open a table-level definition rather than a column.
const TABLE_LEVEL: [&str; 11] = [
    "PRIMARY",
    "KEY",
    "INDEX",
    "UNIQUE",
    "FULLTEXT",
    "SPATIAL",
    "FOREIGN",
    "CONSTRAINT",
    "CHECK",
    "PERIOD",
    "SYSTEM",
];

fn kw(t: Option<&Tok>, k: &str) -> bool {
    matches!(t, Some(Tok::Word(w)) if w.eq_ignore_ascii_case(k))
}

/// One element of a CREATE TABLE body: a column, or a table-level
/// definition (only its `json_valid` checks matter).
fn definition(def: &[Tok]) -> Vec<AlterOp> {
    if TABLE_LEVEL.iter().any(|k| kw(def.first(), k)) {
        return json_checks(def)
            .into_iter()
            .map(AlterOp::JsonCheck)
            .collect();
    }
    column(def, None).into_iter().collect()
}

/// `name type[(args)] attributes...`.
fn column(def: &[Tok], old: Option<String>) -> Option<AlterOp> {
    let name = match def.first()? {
        Tok::Word(w) | Tok::Quoted(w) => w.to_lowercase(),
        _ => return None,
    };
    let ty = match def.get(1) {
        Some(Tok::Word(w)) => w.to_ascii_lowercase(),
        _ => String::new(),
    };
    let width_one = def.get(2) == Some(&Tok::Punct('('))
        && kw(def.get(3), "1")
        && def.get(4) == Some(&Tok::Punct(')'));
    let facts = Facts {
        tinyint1: (ty == "tinyint" && width_one) || ty == "bool" || ty == "boolean",
        json: ty == "json" || json_checks(def).contains(&name),
    };
    Some(AlterOp::Column { old, name, facts })
}

/// Columns named by `json_valid(col)` in the tokens.
fn json_checks(toks: &[Tok]) -> Vec<String> {
    toks.windows(4)
        .filter_map(|w| match w {
            [Tok::Word(f), Tok::Punct('('), Tok::Word(c) | Tok::Quoted(c), Tok::Punct(')')]
                if f.eq_ignore_ascii_case("json_valid") =>
            {
                Some(c.to_lowercase())
            }
            _ => None,
        })
        .collect()
}

/// One ALTER TABLE specification.
fn alter_spec(spec: &[Tok], db: &str) -> Vec<AlterOp> {
    let mut p = Parser {
        toks: spec,
        i: 0,
        db,
    };
    if p.eat_kw("ADD") {
        if TABLE_LEVEL.iter().any(|k| p.peek_kw(k)) {
            return definition(&spec[p.i..]);
        }
        p.eat_kw("COLUMN");
        p.if_exists();
        if p.eat_punct('(') {
            let body = p.group();
            return split_top(body)
                .into_iter()
                .filter_map(|d| column(d, None))
                .collect();
        }
        return column(&spec[p.i..], None).into_iter().collect();
    }
    if p.eat_kw("MODIFY") {
        p.eat_kw("COLUMN");
        p.if_exists();
        return column(&spec[p.i..], None).into_iter().collect();
    }
    if p.eat_kw("CHANGE") {
        p.eat_kw("COLUMN");
        p.if_exists();
        let old = p.ident().map(|o| o.to_lowercase());
        return column(&spec[p.i..], old).into_iter().collect();
    }
    if p.eat_kw("DROP") {
        if p.eat_kw("CONSTRAINT") || p.eat_kw("CHECK") {
            p.if_exists();
            return p
                .ident()
                .map(|n| AlterOp::DropConstraint(n.to_lowercase()))
                .into_iter()
                .collect();
        }
        if TABLE_LEVEL.iter().any(|k| p.peek_kw(k)) || p.peek_kw("PARTITION") {
            return Vec::new();
        }
        p.eat_kw("COLUMN");
        p.if_exists();
        return p
            .ident()
            .map(|n| AlterOp::Drop(n.to_lowercase()))
            .into_iter()
            .collect();
    }
    if p.eat_kw("RENAME") {
        if p.eat_kw("COLUMN") {
            let from = p.ident();
            p.eat_kw("TO");
            return match (from, p.ident()) {
                (Some(f), Some(t)) => vec![AlterOp::Rename(f.to_lowercase(), t.to_lowercase())],
                _ => Vec::new(),
            };
        }
        if p.peek_kw("INDEX") || p.peek_kw("KEY") {
            return Vec::new();
        }
        if !p.eat_kw("TO") {
            p.eat_kw("AS");
        }
        return p
            .table_name()
            .map(AlterOp::RenameTable)
            .into_iter()
            .collect();
    }
    Vec::new()
}

#[cfg(test)]
mod tests;
