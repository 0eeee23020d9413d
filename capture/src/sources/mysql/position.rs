//! Where a MySQL/MariaDB binlog reader stands, and the order of such places.
//!
//! A [`Position`] is Debezium's MySQL offset: the binlog `file` and `pos` of
//! the event that begins the current transaction (where a restart asks the
//! server to send from), the GTIDs the server had committed before it, and
//! how much of the transaction was already published: `event` events after
//! the transaction's first, and `row` rows of the event after those. A
//! restart re-reads from `file`/`pos` and skips exactly `event` events and
//! `row` rows, so a kill in the middle of a large transaction neither loses
//! nor repeats a row.
//!
//! Order: positions of one server are totally ordered by (file sequence
//! number, pos, event, row). The file sequence is the numeric extension of
//! the binlog name (`binlog.000009` < `binlog.000010`, and `.999999` <
//! `.1000000` when MySQL goes past six digits), so the order holds across
//! `FLUSH BINARY LOGS` and rotation. GTID sets are only partially ordered
//! (by inclusion); they identify transactions across a failover, where file
//! names and offsets restart on the new primary.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A binlog file and a byte offset in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BinlogCoordinates {
    pub file: String,
    pub pos: u64,
}

impl BinlogCoordinates {
    /// The file's sequence number and base name: `binlog.000042` is
    /// `(42, "binlog")`. A name without a numeric extension sorts first.
    pub fn file_sequence(&self) -> (u64, &str) {
        file_sequence(&self.file)
    }
}

fn file_sequence(file: &str) -> (u64, &str) {
    match file.rsplit_once('.') {
        Some((base, ext)) if !ext.is_empty() && ext.bytes().all(|b| b.is_ascii_digit()) => {
            (ext.parse().unwrap_or(u64::MAX), base)
        }
        _ => (0, file),
    }
}

impl Ord for BinlogCoordinates {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, a_base) = self.file_sequence();
        let (b, b_base) = other.file_sequence();
        a.cmp(&b)
            .then_with(|| a_base.cmp(b_base))
            .then_with(|| self.file.cmp(&other.file))
            .then_with(|| self.pos.cmp(&other.pos))
    }
}

impl PartialOrd for BinlogCoordinates {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a GTID text does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GtidParseError {
    #[error("MariaDB GTID {0:?} is not domain-server-sequence (e.g. 0-1-42)")]
    MariaDb(String),
    #[error("MariaDB GTID list {0:?} names domain {1} twice")]
    DuplicateDomain(String, u32),
    #[error("MySQL GTID set {0:?} is not uuid:interval[:interval...] (e.g. 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7)")]
    MySql(String),
    #[error("MySQL GTID set {0:?} has tagged GTIDs (uuid:tag:n): {TAGGED_GTIDS}")]
    MySqlTagged(String),
}

/// Why capture refuses tagged GTIDs, and what to do.
pub const TAGGED_GTIDS: &str = "capture does not follow tagged GTIDs (MySQL 8.3+, written under gtid_next = 'AUTOMATIC:<tag>') yet: it would store GTID sets without their tags, and a resume by GTID after a failover would ask the server for the wrong transactions. Write untagged GTIDs only (gtid_next = 'AUTOMATIC'); the server keeps tagged ones in gtid_executed until RESET BINARY LOGS AND GTIDS, and capture cannot start on it until then";

/// One MariaDB GTID: `domain-server-sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariaGtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl fmt::Display for MariaGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl FromStr for MariaGtid {
    type Err = GtidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || GtidParseError::MariaDb(s.to_owned());
        let mut it = s.trim().splitn(3, '-');
        let mut next = || it.next().ok_or_else(bad);
        let (d, sv, q) = (next()?, next()?, next()?);
        Ok(Self {
            domain: d.parse().map_err(|_| bad())?,
            server: sv.parse().map_err(|_| bad())?,
            seq: q.parse().map_err(|_| bad())?,
        })
    }
}

/// MariaDB's `gtid_binlog_pos` form: the last GTID of each replication
/// domain, e.g. `0-1-42,1-2-7`. Under `gtid_strict_mode` sequence numbers
/// grow within a domain, so one GTID per domain names everything before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MariaGtidList(BTreeMap<u32, MariaGtid>);

impl MariaGtidList {
    /// Records `gtid` as the domain's latest.
    pub fn advance(&mut self, gtid: MariaGtid) {
        self.0.insert(gtid.domain, gtid);
    }

    pub fn get(&self, domain: u32) -> Option<MariaGtid> {
        self.0.get(&domain).copied()
    }

    /// Whether every domain of `other` is at or before this list's.
    pub fn includes(&self, other: &Self) -> bool {
        other
            .0
            .iter()
            .all(|(d, g)| self.0.get(d).is_some_and(|mine| mine.seq >= g.seq))
    }
}

impl fmt::Display for MariaGtidList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.0.values().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl FromStr for MariaGtidList {
    type Err = GtidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut list = Self::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let g: MariaGtid = part.parse()?;
            if list.0.insert(g.domain, g).is_some() {
                return Err(GtidParseError::DuplicateDomain(s.to_owned(), g.domain));
            }
        }
        Ok(list)
    }
}

/// A MySQL GTID set, `@@gtid_executed`'s form: per source UUID, closed
/// intervals of transaction numbers, e.g.
/// `3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7`. Kept normalised (sorted,
/// merged), so equal sets format equally.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MySqlGtidSet(BTreeMap<[u8; 16], Vec<(u64, u64)>>);

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    let dashes_ok = s.len() == 36 && [8, 13, 18, 23].iter().all(|&i| s.as_bytes()[i] == b'-');
    if hex.len() != 32 || !dashes_ok {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

fn format_uuid(u: &[u8; 16], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            f.write_str("-")?;
        }
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

impl MySqlGtidSet {
    /// Adds transaction `seq` of source `uuid`.
    pub fn add(&mut self, uuid: [u8; 16], seq: u64) {
        self.add_interval(uuid, seq, seq);
    }

    fn add_interval(&mut self, uuid: [u8; 16], start: u64, end: u64) {
        let list = self.0.entry(uuid).or_default();
        list.push((start, end));
        list.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(list.len());
        for &(s, e) in list.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *list = merged;
    }

    /// Source UUIDs with their closed intervals, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8; 16], &[(u64, u64)])> {
        self.0.iter().map(|(u, l)| (u, l.as_slice()))
    }

    pub fn contains(&self, uuid: &[u8; 16], seq: u64) -> bool {
        self.0
            .get(uuid)
            .is_some_and(|l| l.iter().any(|&(s, e)| s <= seq && seq <= e))
    }

    /// Whether every transaction of `other` is in this set.
    pub fn includes(&self, other: &Self) -> bool {
        other.0.iter().all(|(u, list)| {
            let mine = self.0.get(u);
            list.iter()
                .all(|&(s, e)| mine.is_some_and(|m| m.iter().any(|&(ms, me)| ms <= s && e <= me)))
        })
    }
}

impl fmt::Display for MySqlGtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (uuid, list)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            format_uuid(uuid, f)?;
            for &(s, e) in list {
                if s == e {
                    write!(f, ":{s}")?;
                } else {
                    write!(f, ":{s}-{e}")?;
                }
            }
        }
        Ok(())
    }
}

impl FromStr for MySqlGtidSet {
    type Err = GtidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || GtidParseError::MySql(s.to_owned());
        let mut set = Self::default();
        // `@@gtid_executed` wraps lines after the commas.
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.split(':');
            let uuid = fields.next().and_then(parse_uuid).ok_or_else(bad)?;
            let mut any = false;
            for interval in fields {
                if interval.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    return Err(GtidParseError::MySqlTagged(s.to_owned()));
                }
                let (a, b) = interval.split_once('-').unwrap_or((interval, interval));
                let (a, b): (u64, u64) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a == 0 || b < a {
                    return Err(bad());
                }
                set.add_interval(uuid, a, b);
                any = true;
            }
            if !any {
                return Err(bad());
            }
        }
        Ok(set)
    }
}

/// The GTID state of a position, in the server's own style.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Gtids {
    MariaDb(MariaGtidList),
    MySql(MySqlGtidSet),
}

impl Gtids {
    /// Whether the state names no transaction.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::MariaDb(l) => l.0.is_empty(),
            Self::MySql(s) => s.0.is_empty(),
        }
    }

    /// Whether this state includes everything `other` names (a partial
    /// order: states of different styles never include each other).
    pub fn includes(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::MariaDb(a), Self::MariaDb(b)) => a.includes(b),
            (Self::MySql(a), Self::MySql(b)) => a.includes(b),
            _ => false,
        }
    }
}

impl fmt::Display for Gtids {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MariaDb(l) => l.fmt(f),
            Self::MySql(s) => s.fmt(f),
        }
    }
}

impl FromStr for Gtids {
    type Err = GtidParseError;
    /// MySQL's sets name a UUID followed by `:`; MariaDB's lists never
    /// contain a `:`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.contains(':') {
            s.parse().map(Self::MySql)
        } else {
            s.parse().map(Self::MariaDb)
        }
    }
}

/// A binlog reader's place; see the module doc for what each part means
/// and the order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    /// Binlog file of the transaction's first event.
    pub file: String,
    /// Offset of the transaction's first event in `file`.
    pub pos: u64,
    /// GTIDs committed before the transaction; absent on servers without
    /// GTIDs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_gtids",
        deserialize_with = "de_gtids"
    )]
    pub gtids: Option<Gtids>,
    /// Events of the transaction already published, after its first.
    #[serde(default)]
    pub event: u64,
    /// Rows of the next event already published.
    #[serde(default)]
    pub row: u64,
    /// Failovers followed: how many times capture moved, by GTIDs, onto
    /// another server's binlog. The top of the order key
    /// ([`super::offset::order_key`]), so keys keep growing on a new
    /// primary whose files start over. Absent (0) in records written
    /// before any failover, and in those of earlier releases.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn ser_gtids<S: Serializer>(g: &Option<Gtids>, s: S) -> Result<S::Ok, S::Error> {
    match g {
        Some(g) => s.serialize_str(&g.to_string()),
        None => s.serialize_none(),
    }
}

fn de_gtids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Gtids>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => t.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

impl Position {
    /// The start of a transaction at `file`/`pos`.
    pub fn at(file: impl Into<String>, pos: u64) -> Self {
        Self {
            file: file.into(),
            pos,
            gtids: None,
            event: 0,
            row: 0,
            epoch: 0,
        }
    }

    pub fn coordinates(&self) -> BinlogCoordinates {
        BinlogCoordinates {
            file: self.file.clone(),
            pos: self.pos,
        }
    }

    fn key(&self) -> (u32, (u64, &str), &str, u64, u64, u64) {
        (
            self.epoch,
            file_sequence(&self.file),
            &self.file,
            self.pos,
            self.event,
            self.row,
        )
    }
}

impl Ord for Position {
    /// Epoch, file sequence, file name, pos, event, row. GTIDs do not take part:
    /// two positions at the same place carry the same GTIDs.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key()).then_with(|| {
            self.gtids
                .as_ref()
                .map(|g| g.to_string())
                .cmp(&other.gtids.as_ref().map(|g| g.to_string()))
        })
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Binlog bytes from `from` to `to`: the rest of `from`'s file, every file
/// between, and `to`'s offset in its file, by `binlogs`' sizes (name and
/// size, oldest first, as `SHOW BINARY LOGS` lists them). `None` when it
/// cannot be counted: either file is not listed (purged, or another
/// server's), or `from` is past `to` or past its file's end.
pub fn binlog_bytes_between(
    binlogs: &[(String, u64)],
    from: &BinlogCoordinates,
    to: &BinlogCoordinates,
) -> Option<u64> {
    let index = |file: &str| binlogs.iter().position(|(name, _)| name == file);
    let (i, j) = (index(&from.file)?, index(&to.file)?);
    if i == j {
        return to.pos.checked_sub(from.pos);
    }
    if i > j {
        return None;
    }
    let rest = binlogs[i].1.checked_sub(from.pos)?;
    let between: u64 = binlogs[i + 1..j].iter().map(|(_, size)| size).sum();
    Some(rest + between + to.pos)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    const UUID_A: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";

    fn at(file: &str, pos: u64) -> BinlogCoordinates {
        BinlogCoordinates {
            file: file.into(),
            pos,
        }
    }

    fn logs() -> Vec<(String, u64)> {
        vec![
            ("binlog.000007".into(), 1000),
            ("binlog.000008".into(), 500),
            ("binlog.000009".into(), 300),
            ("binlog.000010".into(), 120),
        ]
    }

    #[test]
    fn order_follows_rotation_not_text() {
        let p = |f: &str, pos| Position::at(f, pos);
        assert!(p("binlog.000009", 900) < p("binlog.000010", 4));
        assert!(p("binlog.999999", 4) < p("binlog.1000000", 4));
        let mut a = p("binlog.000003", 120);
        let mut b = a.clone();
        a.event = 2;
        b.event = 2;
        b.row = 1;
        assert!(a < b);
        assert!(b < p("binlog.000003", 121));
    }

    #[test]
    fn serde_form_is_debezium_like() {
        let mut p = Position::at("binlog.000002", 385);
        p.gtids = Some("0-1-42,1-2-7".parse().unwrap());
        p.event = 3;
        p.row = 1;
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            json!({"file":"binlog.000002","pos":385,"gtids":"0-1-42,1-2-7","event":3,"row":1})
        );
        assert_eq!(serde_json::from_value::<Position>(v).unwrap(), p);
        let bare: Position = serde_json::from_value(json!({"file":"b.1","pos":4})).unwrap();
        assert_eq!(bare, Position::at("b.1", 4));
        let err = serde_json::from_value::<Position>(json!({"file":"b.1","pos":4,"gtid":"x"}));
        assert!(err.unwrap_err().to_string().contains("unknown field"));
        let err = serde_json::from_value::<Position>(json!({"file":"b.1","pos":4,"gtids":"0-1"}));
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("domain-server-sequence"));
    }

    /// MySQL's GTID sets: this server (MariaDB) cannot produce them, so
    /// they are tested from text as `@@gtid_executed` prints it.
    #[test]
    fn mysql_gtid_sets_parse_normalise_and_include() {
        let text = format!("{UUID_A}:1-5:7,\n 3E11FA47-71CA-11E1-9E33-C80AA9429563:3");
        let set: MySqlGtidSet = text.parse().unwrap();
        assert_eq!(
            set.to_string(),
            format!("{UUID_A}:1-5:7,3e11fa47-71ca-11e1-9e33-c80aa9429563:3")
        );
        let mut grown = set.clone();
        let uuid = parse_uuid(UUID_A).unwrap();
        grown.add(uuid, 6);
        assert!(grown.contains(&uuid, 6));
        assert!(grown.to_string().starts_with(&format!("{UUID_A}:1-7,")));
        assert!(grown.includes(&set) && !set.includes(&grown));
        for bad in [
            "3e11fa47:1-5",
            UUID_A,
            &format!("{UUID_A}:0-3"),
            &format!("{UUID_A}:5-3"),
        ] {
            assert!(bad.parse::<MySqlGtidSet>().is_err(), "{bad}");
        }
        assert!(matches!(text.parse::<Gtids>(), Ok(Gtids::MySql(_))));
        assert!(matches!("0-1-9".parse::<Gtids>(), Ok(Gtids::MariaDb(_))));
    }

    /// A tagged GTID set (MySQL 8.3+) is refused by name, not taken as a
    /// set without its tags nor as a syntax error.
    #[test]
    fn a_tagged_mysql_gtid_set_is_refused_naming_the_tags() {
        for text in [format!("{UUID_A}:1-5:blue:1-3"), format!("{UUID_A}:_x:7")] {
            let err = text.parse::<Gtids>().unwrap_err();
            assert_eq!(err, GtidParseError::MySqlTagged(text.clone()));
            assert!(err.to_string().contains("gtid_next = 'AUTOMATIC'"), "{err}");
        }
    }

    #[test]
    fn mariadb_lists_parse_and_include() {
        let l: MariaGtidList = "1-2-7, 0-1-42".parse().unwrap();
        assert_eq!(l.to_string(), "0-1-42,1-2-7");
        let older: MariaGtidList = "0-1-40".parse().unwrap();
        assert!(l.includes(&older) && !older.includes(&l));
        assert!("0-1-4,0-2-5".parse::<MariaGtidList>().is_err());
        assert!("0-1-x".parse::<MariaGtidList>().is_err());
    }

    fn arb_file() -> impl Strategy<Value = String> {
        (1u64..2_000_000).prop_map(|n| format!("binlog.{n:06}"))
    }

    fn arb_position() -> impl Strategy<Value = Position> {
        (arb_file(), 4u64..1 << 40, 0u64..50, 0u64..50).prop_map(|(f, pos, event, row)| {
            let mut p = Position::at(f, pos);
            p.event = event;
            p.row = row;
            p
        })
    }

    fn arb_mysql_set() -> impl Strategy<Value = MySqlGtidSet> {
        prop::collection::vec((any::<[u8; 16]>(), 1u64..1000, 0u64..50), 0..6).prop_map(|v| {
            let mut s = MySqlGtidSet::default();
            for (u, a, len) in v {
                s.add_interval(u, a, a + len);
            }
            s
        })
    }

    fn arb_maria_list() -> impl Strategy<Value = MariaGtidList> {
        prop::collection::btree_map(any::<u32>(), (any::<u32>(), any::<u64>()), 0..5).prop_map(
            |m| {
                let mut l = MariaGtidList::default();
                for (domain, (server, seq)) in m {
                    l.advance(MariaGtid {
                        domain,
                        server,
                        seq,
                    });
                }
                l
            },
        )
    }

    proptest! {
        #[test]
        fn order_is_the_tuple_order(a in arb_position(), b in arb_position()) {
            let num = |p: &Position| p.file.rsplit_once('.').unwrap().1.parse::<u64>().unwrap();
            let ka = (num(&a), a.pos, a.event, a.row);
            let kb = (num(&b), b.pos, b.event, b.row);
            prop_assert_eq!(a.cmp(&b), ka.cmp(&kb));
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        }

        #[test]
        fn mysql_sets_round_trip(s in arb_mysql_set()) {
            let text = s.to_string();
            prop_assert_eq!(text.parse::<MySqlGtidSet>().unwrap(), s.clone());
            if !text.is_empty() {
                prop_assert_eq!(text.parse::<Gtids>().unwrap(), Gtids::MySql(s));
            }
        }

        #[test]
        fn maria_lists_round_trip(l in arb_maria_list()) {
            let text = l.to_string();
            prop_assert_eq!(text.parse::<MariaGtidList>().unwrap(), l.clone());
            if !text.is_empty() {
                prop_assert_eq!(text.parse::<Gtids>().unwrap(), Gtids::MariaDb(l));
            }
        }

        #[test]
        fn positions_round_trip_through_json(p in arb_position(), l in arb_maria_list()) {
            let mut p = p;
            if !l.to_string().is_empty() {
                p.gtids = Some(Gtids::MariaDb(l));
            }
            let v = serde_json::to_string(&p).unwrap();
            prop_assert_eq!(serde_json::from_str::<Position>(&v).unwrap(), p);
        }

        #[test]
        fn adding_keeps_the_set_a_superset(s in arb_mysql_set(), u in any::<[u8; 16]>(), q in 1u64..2000) {
            let mut g = s.clone();
            g.add(u, q);
            prop_assert!(g.includes(&s));
            prop_assert!(g.contains(&u, q));
        }
    }

    #[test]
    fn bytes_in_one_file_are_the_offsets_difference() {
        let l = logs();
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000010", 120), &at("binlog.000010", 120)),
            Some(0)
        );
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000008", 256), &at("binlog.000008", 400)),
            Some(144)
        );
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000008", 401), &at("binlog.000008", 400)),
            None,
            "a stored position past the end is another server's"
        );
    }

    #[test]
    fn bytes_across_files_count_each_files_size() {
        let l = logs();
        // 1000 - 900 of .07, all of .08 and .09, 100 of .10.
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000007", 900), &at("binlog.000010", 100)),
            Some(100 + 500 + 300 + 100)
        );
        // The next file only: no file between.
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000009", 300), &at("binlog.000010", 4)),
            Some(4)
        );
        // The end in a file listed after the list was read as its last.
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000008", 0), &at("binlog.000009", 7)),
            Some(507)
        );
    }

    #[test]
    fn bytes_are_not_counted_from_a_purged_foreign_or_later_file() {
        let l = logs();
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000006", 4), &at("binlog.000010", 100)),
            None,
            "purged"
        );
        assert_eq!(
            binlog_bytes_between(&l, &at("other.000008", 4), &at("binlog.000010", 100)),
            None
        );
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000010", 4), &at("binlog.000009", 100)),
            None,
            "the stored position after the end"
        );
        assert_eq!(
            binlog_bytes_between(&l, &at("binlog.000007", 1001), &at("binlog.000010", 100)),
            None,
            "past its file's end"
        );
        assert_eq!(
            binlog_bytes_between(&[], &at("binlog.000007", 4), &at("binlog.000007", 4)),
            None
        );
    }
}
