//! Column generations: a source `ALTER COLUMN ... TYPE` the warehouse cannot
//! follow by a cast (docs/design.md, "A type the warehouse cannot cast to
//! moves the column to a new generation").
//!
//! ```text
//!   event type fits the live column ──────────────────────────▶ live column
//!   older than the live column's generation (`oncely.since`) ─▶ newest retired
//!                                                               column taking it,
//!                                                               else left out
//!   newer, one-way cast (integer → text) ─────────────────────▶ ALTER ... USING c::new
//!   newer, neither way, or that cast fails on a held value ───▶ new generation:
//!       c renamed to `<prefix>g<N>_c` (retired), c added with the event's type
//! ```
//!
//! The one invariant: every event written before a source's `ALTER ...
//! TYPE` has a smaller version than every event written after it (the
//! ALTER holds an exclusive lock, and backfill rows carry their high
//! watermark's LSN), so a generation records the smallest version of the
//! rows that asked for it (`oncely.since`), and a row of another type older
//! than that is from before the change: it never moves the column back.
//! Columns that record no generation use the version that named them
//! (`oncely.at`, [`super::identity`]).

use super::compat::{canonical, compatible, widened};
use super::types::{is_text, ColumnSpec};
use crate::event::Version;
use oncely_core::sql::{quote_ident as quote, quote_literal as literal};

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER: usize = 63;

/// `name` as PostgreSQL keeps it: cut to 63 bytes at a character boundary,
/// as it cuts every longer identifier in DDL and queries alike (with only a
/// NOTICE). A MySQL column name may have 64 characters, up to 256 bytes.
pub fn stored_identifier(name: &str) -> &str {
    let mut end = name.len().min(MAX_IDENTIFIER);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Comment word: the version from which a live column holds its type.
const SINCE: &str = "oncely.since";
/// Comment words of a retired column.
const RETIRED_GENERATION: &str = "oncely.retired.generation";
const RETIRED_UNTIL: &str = "oncely.retired.until";
const RETIRED_ATTNUM: &str = "oncely.retired.attnum";

/// A retired column: the values of a column before a change the warehouse
/// moved to a new generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// Its name (`<prefix>g<N>_<column>`).
    pub column: String,
    /// Its type.
    pub ty: String,
    /// N.
    pub generation: u32,
    /// The source column's attnum, when recorded.
    pub attnum: Option<i16>,
    /// The version from which the live column took over.
    pub until: Version,
}

impl Retired {
    /// A retired column's record from its comment; `None` for other comments.
    pub fn parse(column: &str, ty: &str, comment: &str) -> Option<Self> {
        let w = words(comment);
        Some(Self {
            column: column.to_owned(),
            ty: ty.to_owned(),
            generation: w.get(RETIRED_GENERATION)?.parse().ok()?,
            attnum: w.get(RETIRED_ATTNUM).and_then(|a| a.parse().ok()),
            until: version(w.get(RETIRED_UNTIL)?)?,
        })
    }

    fn comment(&self) -> String {
        let attnum = self
            .attnum
            .map(|a| format!(" {RETIRED_ATTNUM}={a}"))
            .unwrap_or_default();
        format!(
            "{RETIRED_GENERATION}={} {RETIRED_UNTIL}={}{attnum}",
            self.generation, self.until
        )
    }

    /// Whether this is a retired generation of live column `column` (source
    /// column `attnum` when recorded, else by name).
    pub fn of(&self, column: &str, attnum: Option<i16>, prefix: &str) -> bool {
        match (self.attnum, attnum) {
            (Some(a), Some(b)) => a == b,
            _ => retired_name(prefix, column, self.generation) == self.column,
        }
    }
}

fn words(comment: &str) -> std::collections::HashMap<&str, &str> {
    comment
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn version(text: &str) -> Option<Version> {
    let (lsn, seq) = text.split_once('/')?;
    Some(Version::new(lsn.parse().ok()?, seq.parse().ok()?))
}

/// The `oncely.since` version a column comment records.
pub fn since_of(comment: &str) -> Option<Version> {
    version(words(comment).get(SINCE)?)
}

/// `comment` with its `oncely.since` word set to `since`.
fn with_since(comment: Option<&str>, since: Version) -> String {
    let mut kept: Vec<&str> = comment
        .unwrap_or_default()
        .split_whitespace()
        .filter(|w| !w.starts_with("oncely.since="))
        .collect();
    let word = format!("{SINCE}={since}");
    kept.push(&word);
    kept.join(" ")
}

/// The name of generation `n` of `column` retired: `<prefix>g<n>_<column>`,
/// the column's name cut (at a character boundary) to fit PostgreSQL's 63
/// bytes. Deterministic; [`next_generation`] picks an `n` whose name is free.
pub fn retired_name(prefix: &str, column: &str, n: u32) -> String {
    let head = format!("{prefix}g{n}_");
    let room = MAX_IDENTIFIER.saturating_sub(head.len());
    let mut end = column.len().min(room);
    while !column.is_char_boundary(end) {
        end -= 1;
    }
    format!("{head}{}", &column[..end])
}

/// The generation number a column's next retirement gets: one above the
/// highest retired generation of that column, and then the first whose
/// name no column of the table has (a cut name can equal another's).
pub fn next_generation(
    prefix: &str,
    column: &str,
    generations: impl Iterator<Item = u32>,
    mut taken: impl FnMut(&str) -> bool,
) -> (u32, String) {
    let mut n = generations.max().unwrap_or(0) + 1;
    loop {
        let name = retired_name(prefix, column, n);
        if !taken(&name) {
            return (n, name);
        }
        n += 1;
    }
}

/// The live column an event field is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Live<'a> {
    /// Its type (`format_type`).
    pub ty: &'a str,
    /// The version from which it holds this type: `oncely.since`, else
    /// the version that named it (`oncely.at`); `None` when unrecorded
    /// (a column of an older version, or events without attnums).
    pub since: Option<Version>,
    /// A primary-key column: never moved (its rows would lose their key).
    pub key: bool,
}

/// Where the value of one field of a row goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// The live column takes it (or widens to, or refuses it as before:
    /// keys, schemas off).
    Live,
    /// From before the live column's generation: into this retired column.
    Retired(String),
    /// From before the live column's generation, and no retired column
    /// takes it: the field is left out (the live column keeps its value).
    Left,
    /// A change of type newer than the live column's: the column must
    /// follow it (by cast when one-way, else a new generation).
    Change,
}

/// Where a field of spec `spec` of a row at `version` goes, given its live
/// column and the column's retired generations (newest first).
pub fn fit(spec: &ColumnSpec, version: Version, live: Live<'_>, retired: &[&Retired]) -> Fit {
    // Schemas off say nothing of a type; a key column is never moved.
    if spec.inferred || live.key {
        return Fit::Live;
    }
    let newer = live.since.is_none_or(|s| version > s);
    if compatible(spec, live.ty).is_ok() {
        // A text column takes every value, so a source column changed from
        // text to another type (`text` → `integer`) would never be seen as
        // a change; it is one when the event is newer than the column's
        // type. Unrecorded columns keep taking them, as before.
        let typed = !is_text(&canonical(&spec.ddl));
        if is_text(live.ty) && typed && live.since.is_some_and(|s| version > s) {
            return Fit::Change;
        }
        return Fit::Live;
    }
    if widened(spec, live.ty).is_some() {
        return Fit::Live;
    }
    if newer {
        return Fit::Change;
    }
    retired
        .iter()
        .find(|r| compatible(spec, &r.ty).is_ok())
        .map_or(Fit::Left, |r| Fit::Retired(r.column.clone()))
}

/// The statements moving `column` of table `q` (type `from`, comment
/// `comment`, source attnum `attnum`) to a new generation of type `to`
/// from version `since`: renamed to `retired` (generation `n`, nullable so
/// new rows need no value), a column of type `to` added under the name
/// with the old comment (the attnum record follows the name) and
/// `oncely.since`.
pub fn move_statements(
    q: &str,
    (column, comment, attnum): (&str, Option<&str>, Option<i16>),
    (n, retired): (u32, &str),
    to: &str,
    since: Version,
) -> Vec<String> {
    let record = Retired {
        column: retired.to_owned(),
        ty: String::new(),
        generation: n,
        attnum,
        until: since,
    };
    let (c, r) = (quote(column), quote(retired));
    vec![
        format!("ALTER TABLE {q} RENAME COLUMN {c} TO {r}"),
        format!("ALTER TABLE {q} ALTER COLUMN {r} DROP NOT NULL"),
        format!("ALTER TABLE {q} ADD COLUMN {c} {to}"),
        format!(
            "COMMENT ON COLUMN {q}.{r} IS {}",
            literal(&record.comment())
        ),
        since_statement(q, column, comment, since),
    ]
}

/// The statement recording that `column` holds its type from `since`.
pub fn since_statement(q: &str, column: &str, comment: Option<&str>, since: Version) -> String {
    format!(
        "COMMENT ON COLUMN {q}.{} IS {}",
        quote(column),
        literal(&with_since(comment, since))
    )
}

#[cfg(test)]
mod tests;
