//! One decoded column value, independent of the decoding crate: what
//! mysql_common's binlog row parser gives, put in the form the Debezium
//! mapping ([`super::mapping`]) needs.

use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;

use super::shape::ColumnShape;
use oncely_core::calendar::days_from_civil;

/// Serializable, so a snapshot's last key can be stored to resume from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Cell {
    Null,
    Int(i64),
    UInt(u64),
    Float(f32),
    Double(f64),
    /// DECIMAL as exact text.
    Decimal(String),
    /// CHAR/VARCHAR/TEXT/BINARY/BLOB/GEOMETRY: the stored bytes.
    Bytes(Vec<u8>),
    /// DATE; `0000-00-00` is all zeros.
    Date {
        year: u16,
        month: u8,
        day: u8,
    },
    /// DATETIME: a wall-clock reading without zone.
    DateTime {
        year: u16,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
        micros: u32,
    },
    /// TIMESTAMP: seconds since 1970 UTC (0 is the zero timestamp).
    Timestamp {
        secs: i64,
        micros: u32,
    },
    /// TIME, a duration of up to ±838:59:59.
    Time {
        negative: bool,
        hours: u32,
        minutes: u8,
        seconds: u8,
        micros: u32,
    },
    /// YEAR (0 for `0000`).
    Year(u16),
    /// MySQL's JSON, decoded from its binary form.
    Json(serde_json::Value),
    /// MariaDB's JSON (a LONGTEXT): the text as stored.
    JsonText(String),
    /// BIT(n), big-endian as stored.
    Bit(Vec<u8>),
    /// ENUM: the 1-based label index (0: the empty error value).
    Enum(u16),
    /// SET: bit i set means label i is in the set.
    Set(u64),
}

impl Cell {
    /// Converts a decoded binlog value of column `col`. The error says
    /// what did not fit (a protocol problem: the event is not what its
    /// TABLE_MAP announced).
    pub fn from_binlog(col: &ColumnShape, value: BinlogValue<'_>) -> Result<Self, String> {
        let value = match value {
            BinlogValue::Value(v) => v,
            BinlogValue::Jsonb(j) => {
                return serde_json::Value::try_from(j)
                    .map(Cell::Json)
                    .map_err(|e| format!("JSON value does not decode: {e}"));
            }
            BinlogValue::JsonDiff(_) => {
                return Err("a partial JSON update (binlog_row_value_options=PARTIAL_JSON): set binlog_row_value_options to '' so row images carry whole JSON documents".into());
            }
        };
        if value == Value::NULL {
            return Ok(Cell::Null);
        }
        use ColumnType::*;
        match col.ty {
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG => integer(col, value),
            MYSQL_TYPE_DATE
            | MYSQL_TYPE_NEWDATE
            | MYSQL_TYPE_DATETIME
            | MYSQL_TYPE_DATETIME2
            | MYSQL_TYPE_TIMESTAMP
            | MYSQL_TYPE_TIMESTAMP2
            | MYSQL_TYPE_TIME
            | MYSQL_TYPE_TIME2
            | MYSQL_TYPE_YEAR => temporal(col, value),
            _ => other(col, value),
        }
    }
}

impl Cell {
    /// Converts a value a snapshot's SELECT returned (the binary protocol,
    /// in a session with `time_zone = '+00:00'`) into the cell the binlog
    /// decoder gives for the same stored value, so the mapping writes the
    /// same JSON for a row whether a snapshot or the stream read it. The
    /// binary protocol differs from the binlog for TIMESTAMP (a UTC
    /// reading, not seconds), ENUM and SET (labels, not numbers) and JSON
    /// (text, not MySQL's binary form); the rest is shared.
    pub fn from_query(col: &ColumnShape, value: Value) -> Result<Self, String> {
        use ColumnType::*;
        if value == Value::NULL {
            return Ok(Cell::Null);
        }
        match (col.ty, value) {
            (
                MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2,
                Value::Date(year, month, day, hour, minute, second, micros),
            ) => {
                if year == 0 && month == 0 && day == 0 {
                    return Ok(Cell::Timestamp { secs: 0, micros: 0 });
                }
                let days = days_from_civil(i64::from(year), u32::from(month), u32::from(day))
                    .ok_or_else(|| format!("TIMESTAMP {year}-{month}-{day} is not a date"))?;
                let secs = days * 86_400
                    + i64::from(hour) * 3600
                    + i64::from(minute) * 60
                    + i64::from(second);
                Ok(Cell::Timestamp { secs, micros })
            }
            (MYSQL_TYPE_ENUM, Value::Bytes(b)) => {
                if b.is_empty() {
                    return Ok(Cell::Enum(0));
                }
                let i = col
                    .labels
                    .iter()
                    .position(|l| l.as_bytes() == b.as_slice())
                    .ok_or_else(|| format!("ENUM value {:?} is not a label", bytes_text(&b)))?;
                Ok(Cell::Enum(u16::try_from(i + 1).map_err(|e| e.to_string())?))
            }
            (MYSQL_TYPE_SET, Value::Bytes(b)) => {
                let mut mask = 0u64;
                for member in b.split(|c| *c == b',').filter(|m| !m.is_empty()) {
                    let i = col
                        .labels
                        .iter()
                        .position(|l| l.as_bytes() == member)
                        .filter(|i| *i < 64)
                        .ok_or_else(|| {
                            format!("SET member {:?} is not a label", bytes_text(member))
                        })?;
                    mask |= 1 << i;
                }
                Ok(Cell::Set(mask))
            }
            (MYSQL_TYPE_JSON, Value::Bytes(b)) => serde_json::from_slice(&b)
                .map(Cell::Json)
                .map_err(|e| format!("JSON text does not parse: {e}")),
            (_, value) => Cell::from_binlog(col, BinlogValue::Value(value)),
        }
    }
}

fn bytes_text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn unexpected(col: &ColumnShape, v: &Value) -> String {
    format!("{:?} column holds unexpected {v:?}", col.ty)
}

/// An integer column's value, signed or not.
fn integer(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match value {
        Value::Int(i) if col.unsigned => {
            // Narrow unsigned types come back as Int; they are never negative.
            Cell::UInt(u64::try_from(i).map_err(|_| unexpected(col, &value))?)
        }
        // mysql_common returns a signed MEDIUMINT's 24 bits without
        // their sign (-8388608 comes as 8388608): extend it.
        Value::Int(i) if col.ty == MYSQL_TYPE_INT24 && i >= 1 << 23 => Cell::Int(i - (1 << 24)),
        Value::Int(i) => Cell::Int(i),
        Value::UInt(u) => Cell::UInt(u),
        v => return Err(unexpected(col, &v)),
    })
}

/// A date or time column's value.
fn temporal(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => match value {
            Value::Date(year, month, day, ..) => Cell::Date { year, month, day },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => match value {
            Value::Date(year, month, day, hour, minute, second, micros) => Cell::DateTime {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micros,
            },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => match value {
            Value::Int(secs) => Cell::Timestamp { secs, micros: 0 },
            // TIMESTAMP2 comes as `secs` or `secs.ffffff` text.
            Value::Bytes(ref b) => {
                let text = std::str::from_utf8(b).map_err(|_| unexpected(col, &value))?;
                let (s, f) = text.split_once('.').unwrap_or((text, "0"));
                Cell::Timestamp {
                    secs: s.parse().map_err(|_| unexpected(col, &value))?,
                    micros: f.parse().map_err(|_| unexpected(col, &value))?,
                }
            }
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => match value {
            Value::Time(negative, days, h, minutes, seconds, micros) => Cell::Time {
                negative,
                hours: days * 24 + u32::from(h),
                minutes,
                seconds,
                micros,
            },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_YEAR => match value {
            // The parser adds 1900 to the stored byte; 0 stands for
            // `0000` (1901..=2155 are the real years).
            Value::Bytes(ref b) => {
                let y: u16 = std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| unexpected(col, &value))?;
                Cell::Year(if y == 1900 { 0 } else { y })
            }
            Value::Int(y) => Cell::Year(u16::try_from(y).map_err(|_| unexpected(col, &value))?),
            v => return Err(unexpected(col, &v)),
        },
        _ => return Err(unexpected(col, &value)),
    })
}

/// Any other column's value: floating point, decimal, bit, enum, set, JSON
/// text, and bytes (strings and blobs).
fn other(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_FLOAT => match value {
            Value::Float(f) => Cell::Float(f),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_DOUBLE => match value {
            Value::Double(f) => Cell::Double(f),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => match value {
            Value::Bytes(b) => Cell::Decimal(String::from_utf8(b).map_err(|e| e.to_string())?),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_BIT => match value {
            Value::Bytes(b) => Cell::Bit(b),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_ENUM => match value {
            Value::Int(i) => Cell::Enum(u16::try_from(i).map_err(|_| unexpected(col, &value))?),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_SET => match value {
            Value::Bytes(b) => {
                let mut mask = 0u64;
                for (i, byte) in b.iter().take(8).enumerate() {
                    mask |= u64::from(*byte) << (8 * i);
                }
                Cell::Set(mask)
            }
            v => return Err(unexpected(col, &v)),
        },
        // MariaDB's JSON is a LONGTEXT: its text as stored (Debezium
        // publishes it so), checked to parse when the catalog says it is
        // JSON.
        MYSQL_TYPE_BLOB | MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB
            if col.json =>
        {
            match value {
                Value::Bytes(b) => {
                    serde_json::from_slice::<serde::de::IgnoredAny>(&b)
                        .map_err(|e| format!("JSON text does not parse: {e}"))?;
                    Cell::JsonText(String::from_utf8(b).map_err(|e| format!("JSON text: {e}"))?)
                }
                v => return Err(unexpected(col, &v)),
            }
        }
        // The binlog drops a BINARY(n)'s trailing zero bytes (its padding):
        // put them back, so the value is the n bytes a SELECT returns (and
        // Debezium publishes).
        MYSQL_TYPE_STRING if col.binary => match value {
            Value::Bytes(mut b) => {
                let n = string_length(col);
                if b.len() < n {
                    b.resize(n, 0);
                }
                Cell::Bytes(b)
            }
            v => return Err(unexpected(col, &v)),
        },
        _ => match value {
            Value::Bytes(b) => Cell::Bytes(b),
            v => return Err(unexpected(col, &v)),
        },
    })
}

/// A CHAR/BINARY column's length in bytes from its TABLE_MAP metadata (the
/// real type's byte carries the length's high bits); 0 without metadata.
fn string_length(col: &ColumnShape) -> usize {
    let (b0, b1) = (col.meta_byte(0), col.meta_byte(1));
    let high = if b0 != 0 && b0 & 0x30 != 0x30 {
        (usize::from(b0 & 0x30) ^ 0x30) << 4
    } else {
        0
    };
    high | usize::from(b1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(meta: Vec<u8>) -> ColumnShape {
        ColumnShape {
            meta,
            binary: true,
            ..ColumnShape::new("b", ColumnType::MYSQL_TYPE_STRING)
        }
    }

    /// BINARY(4) holding 0x00ff comes from the binlog as 0x00ff (the
    /// padding dropped) and from a SELECT as 0x00ff0000: one cell.
    #[test]
    fn binary_n_is_padded_back_to_its_length() {
        let col = binary(vec![0xfe, 4]);
        let from_binlog = Cell::from_binlog(&col, BinlogValue::Value(Value::Bytes(vec![0, 255])));
        assert_eq!(from_binlog, Ok(Cell::Bytes(vec![0, 255, 0, 0])));
        let from_query = Cell::from_query(
            &ColumnShape::new("b", ColumnType::MYSQL_TYPE_STRING),
            Value::Bytes(vec![0, 255, 0, 0]),
        );
        assert_eq!(from_query, from_binlog);
        // 400 bytes: the length's high bits ride in the type byte.
        assert_eq!(string_length(&binary(vec![0xee, 0x90])), 400);
        // Text CHAR keeps what the binlog says (trailing spaces are not stored).
        let text = ColumnShape::new("c", ColumnType::MYSQL_TYPE_STRING);
        assert_eq!(
            Cell::from_binlog(&text, BinlogValue::Value(Value::Bytes(b"ab".to_vec()))),
            Ok(Cell::Bytes(b"ab".to_vec()))
        );
    }

    #[test]
    fn snapshot_labels_and_utc_readings_become_binlog_cells() {
        let mut en = ColumnShape::new("e", ColumnType::MYSQL_TYPE_ENUM);
        en.labels = vec!["small".into(), "medium".into()];
        assert_eq!(
            Cell::from_query(&en, Value::Bytes(b"medium".to_vec())),
            Ok(Cell::Enum(2))
        );
        assert_eq!(
            Cell::from_query(&en, Value::Bytes(vec![])),
            Ok(Cell::Enum(0))
        );
        assert!(Cell::from_query(&en, Value::Bytes(b"huge".to_vec())).is_err());
        let mut set = ColumnShape::new("s", ColumnType::MYSQL_TYPE_SET);
        set.labels = vec!["a".into(), "b".into(), "c".into()];
        assert_eq!(
            Cell::from_query(&set, Value::Bytes(b"a,c".to_vec())),
            Ok(Cell::Set(5))
        );
        let ts = ColumnShape::new("t", ColumnType::MYSQL_TYPE_TIMESTAMP2);
        assert_eq!(
            Cell::from_query(&ts, Value::Date(2026, 12, 5, 1, 2, 3, 456_000)),
            Ok(Cell::Timestamp {
                secs: 1_796_432_523,
                micros: 456_000
            })
        );
        assert_eq!(
            Cell::from_query(&ts, Value::Date(0, 0, 0, 0, 0, 0, 0)),
            Ok(Cell::Timestamp { secs: 0, micros: 0 })
        );
    }
}
