//! The wire contract between capture and the sinks (docs/design.md, "The
//! wire format"): what capture writes and every sink and `oncely verify`
//! read, defined once.

use pgwire_replication::Lsn;

/// The kind of change: `op` in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `c`: a row was inserted.
    Create,
    /// `u`: a row was updated.
    Update,
    /// `d`: a row was deleted.
    Delete,
    /// `r`: a row read by a snapshot.
    Read,
    /// `t`: a table was truncated.
    Truncate,
    /// `m`: a logical decoding message.
    Message,
}

impl Op {
    /// Parses the one-letter code of the envelope.
    pub fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "c" => Self::Create,
            "u" => Self::Update,
            "d" => Self::Delete,
            "r" => Self::Read,
            "t" => Self::Truncate,
            "m" => Self::Message,
            _ => return None,
        })
    }

    /// The one-letter code of the envelope.
    pub fn code(self) -> &'static str {
        match self {
            Self::Create => "c",
            Self::Update => "u",
            Self::Delete => "d",
            Self::Read => "r",
            Self::Truncate => "t",
            Self::Message => "m",
        }
    }
}

/// The session settings of capture's replication connection: values are
/// read (by capture, and by verify from the source and the warehouse) in the
/// text form pgoutput sends under them.
pub const SESSION_OPTIONS: &str =
    "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3";

/// The value of a column whose value the change does not carry (an
/// unchanged TOASTed value): Debezium's `unavailable.value.placeholder`
/// default. A sink keeps the value it holds for such a column.
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

/// Kafka header on every table record, tombstones included: the event's source
/// position, `<commit_lsn>/<event_seq>` in decimal (a tombstone takes its
/// delete's).
pub const HEADER_POSITION: &str = "oncely.position";
/// Kafka header on a tombstone: the deleted row's source schema.
pub const HEADER_SCHEMA: &str = "oncely.schema";
/// Kafka header on a tombstone: the deleted row's source table.
pub const HEADER_TABLE: &str = "oncely.table";

/// The PostgreSQL text of an LSN, e.g. `0/16B3748`.
pub fn format_lsn(lsn: u64) -> String {
    Lsn::from_u64(lsn).to_pg_string()
}

/// The LSN of its PostgreSQL text (`0/16B3748`).
pub fn parse_lsn(text: &str) -> Option<u64> {
    Lsn::parse(text).ok().map(|l| l.as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_round_trip() {
        for op in [
            Op::Create,
            Op::Update,
            Op::Delete,
            Op::Read,
            Op::Truncate,
            Op::Message,
        ] {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::from_code("x"), None);
    }

    #[test]
    fn lsns_are_spelled_as_postgres_does() {
        assert_eq!(format_lsn((1 << 32) | 0x16B_3748), "1/16B3748");
        assert_eq!(parse_lsn("1/16B3748"), Some((1 << 32) | 0x16B_3748));
        assert_eq!(parse_lsn("nope"), None);
    }
}
