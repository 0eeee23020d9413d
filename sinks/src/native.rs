//! Wire values in the form their users query: the one home of the
//! conversions the sinks share (docs/design.md, "Native values").
//!
//! Capture (and Debezium) write a `date` as days since 1970, a `timestamp`
//! as microseconds since 1970, a `time` as microseconds since midnight and
//! `json`/`jsonb` as the JSON text. A search index or a cache is read by
//! people and programs that expect calendar text and JSON, so the sinks
//! that serve them convert with these pure functions: [`iso_date`],
//! [`iso_timestamp`] and [`iso_time`] turn days, µs and µs of the day into
//! ISO-8601 text, [`json_value`] JSON text into the JSON value, arrays item
//! by item; everything else is already in its users' form and
//! passes untouched. The form of each column type is listed once, in
//! `docs/sinks/native-values.md`.
//!
//! **Years** are written as java.time and capture's `ZonedTimestamp` write
//! them (ISO-8601 expanded years): four digits from 0000 to 9999, a sign
//! and at least four digits outside (`-0043-03-15` is 44 BC, since 1 BC is
//! year 0; `+10000-01-01`). **Infinity**: PostgreSQL's sentinels
//! (`i32::MAX` days, `i64::MAX` µs and their minimums) become `infinity`
//! and `-infinity`, as capture writes a `timestamptz` infinity. A value
//! that is already text (a sentinel some producer wrote as a word) passes
//! as it is.
//!
//! Debezium's other encodings (milliseconds, nanoseconds, Connect `Date`)
//! never reach this module: [`crate::debezium`] normalizes them first.

use std::borrow::Cow;

use oncely_core::calendar::{
    civil_from_days, DATE_INFINITY, DATE_NEG_INFINITY, MICROS_PER_DAY, TIMESTAMP_INFINITY,
    TIMESTAMP_NEG_INFINITY,
};
use serde_json::Value;

/// `value.format`: the form values are written in, for the sinks that
/// convert (Elasticsearch; Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// Calendar text and JSON values (this module).
    #[default]
    Native,
    /// As on the wire (days, µs, JSON text): the form of oncely before
    /// native values.
    Wire,
}

impl ValueFormat {
    /// The setting's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            ValueFormat::Native => "native",
            ValueFormat::Wire => "wire",
        }
    }
}

/// What a column's values become in native form ([`Kind::of_schema`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Days since 1970 -> [`iso_date`].
    Date,
    /// µs since 1970 -> [`iso_timestamp`].
    Timestamp,
    /// µs since midnight -> [`iso_time`].
    Time,
    /// JSON text -> the JSON value ([`json_value`]).
    Json,
    /// Each item of an array (nested arrays included) by its kind.
    Array(Box<Kind>),
}

impl Kind {
    /// The native kind of a Connect field schema; `None` when its values
    /// are already in native form.
    pub fn of_schema(field: &Value) -> Option<Self> {
        let name = field.get("name").and_then(Value::as_str).unwrap_or("");
        Some(match name {
            "io.debezium.time.Date" => Kind::Date,
            "io.debezium.time.MicroTimestamp" => Kind::Timestamp,
            "io.debezium.time.MicroTime" => Kind::Time,
            "io.debezium.data.Json" => Kind::Json,
            _ if field.get("type").and_then(Value::as_str) == Some("array") => {
                Kind::Array(Box::new(Self::of_schema(field.get("items")?)?))
            }
            _ => return None,
        })
    }

    /// Whether values are JSON documents (or arrays of them, nested).
    pub fn is_json(&self) -> bool {
        match self {
            Kind::Json => true,
            Kind::Array(item) => item.is_json(),
            _ => false,
        }
    }

    /// `value` in native form; `null`, text where a number is expected and
    /// JSON text that does not parse stay as they are (nothing is lost).
    pub fn convert<'v>(&self, value: &'v Value) -> Cow<'v, Value> {
        let number = || value.as_i64();
        let text = match (self, value) {
            (_, Value::Null) => return Cow::Borrowed(value),
            // A multi-dimensional array nests arrays of the same items.
            (Kind::Array(item), Value::Array(items)) => {
                return Cow::Owned(Value::Array(
                    items
                        .iter()
                        .map(|v| match v {
                            Value::Array(_) => self.convert(v),
                            _ => item.convert(v),
                        })
                        .map(Cow::into_owned)
                        .collect(),
                ))
            }
            (Kind::Date, Value::Number(_)) => number().map(iso_date),
            (Kind::Timestamp, Value::Number(_)) => number().map(iso_timestamp),
            (Kind::Time, Value::Number(_)) => number().map(iso_time),
            (Kind::Json, Value::String(s)) => {
                return json_value(s).map_or(Cow::Borrowed(value), Cow::Owned)
            }
            _ => None,
        };
        text.map_or(Cow::Borrowed(value), |t| Cow::Owned(Value::String(t)))
    }
}

/// The ISO-8601 date of `days` since 1970-01-01 (`2026-01-01`,
/// `-0043-03-15`, `+10000-01-01`); the sentinels as `infinity` / `-infinity`.
pub fn iso_date(days: i64) -> String {
    if days == i64::from(DATE_INFINITY) {
        return "infinity".into();
    }
    if days == i64::from(DATE_NEG_INFINITY) {
        return "-infinity".into();
    }
    let (year, month, day) = civil_from_days(days);
    format!("{}-{month:02}-{day:02}", iso_year(year))
}

/// The ISO-8601 local date-time of `micros` since 1970-01-01 00:00 with
/// six fraction digits (`2026-01-01T12:34:56.500000`), without a zone; the
/// sentinels as `infinity` / `-infinity`.
pub fn iso_timestamp(micros: i64) -> String {
    match micros {
        TIMESTAMP_INFINITY => "infinity".into(),
        TIMESTAMP_NEG_INFINITY => "-infinity".into(),
        _ => format!(
            "{}T{}",
            iso_date(micros.div_euclid(MICROS_PER_DAY)),
            iso_time(micros.rem_euclid(MICROS_PER_DAY))
        ),
    }
}

/// [`iso_timestamp`] of a UTC instant, with `Z`: the text capture writes
/// for a `timestamptz` (`io.debezium.time.ZonedTimestamp`).
pub fn iso_timestamptz(micros: i64) -> String {
    match micros {
        TIMESTAMP_INFINITY | TIMESTAMP_NEG_INFINITY => iso_timestamp(micros),
        _ => format!("{}Z", iso_timestamp(micros)),
    }
}

/// `HH:MM:SS.ffffff` of `micros` since midnight; the end of the day
/// (86,400,000,000 µs, PostgreSQL's `24:00:00`) is `24:00:00.000000`.
/// Fixed width, so the texts sort in time order.
pub fn iso_time(micros: i64) -> String {
    let micros = if micros == MICROS_PER_DAY {
        micros
    } else {
        micros.rem_euclid(MICROS_PER_DAY)
    };
    let s = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        micros % 1_000_000
    )
}

/// The JSON value of a `json`/`jsonb` column's text; `None` when the text
/// is not JSON (then the text itself is kept).
pub fn json_value(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok()
}

/// The SRID flag of PostGIS's extended WKB type word.
const EWKB_SRID_FLAG: u32 = 0x2000_0000;

/// PostGIS's extended WKB of Debezium's `io.debezium.data.geometry.Geometry`
/// struct (`{"wkb": base64, "srid": n}`), which the warehouse stores as
/// `bytea` (`ST_GeomFromEWKB` or `::geometry` reads it where PostGIS is
/// installed): the WKB itself when the SRID is null or 0 (MySQL's default,
/// so most values are plain WKB), else with the SRID flag set in its type
/// word and the SRID after it, in the WKB's own byte order. `None` when the
/// value is no such struct or its WKB has no header.
pub fn geometry_ewkb(value: &Value) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let wkb = base64::engine::general_purpose::STANDARD
        .decode(value.get("wkb")?.as_str()?)
        .ok()?;
    let srid = match value.get("srid") {
        None | Some(Value::Null) => 0,
        Some(v) => u32::try_from(v.as_i64()?).ok()?,
    };
    let little = match wkb.first()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let word: [u8; 4] = wkb.get(1..5)?.try_into().ok()?;
    if srid == 0 {
        return Some(wkb);
    }
    let (ty, srid) = if little {
        (
            u32::from_le_bytes(word) | EWKB_SRID_FLAG,
            srid.to_le_bytes(),
        )
    } else {
        (
            u32::from_be_bytes(word) | EWKB_SRID_FLAG,
            srid.to_be_bytes(),
        )
    };
    let ty = if little {
        ty.to_le_bytes()
    } else {
        ty.to_be_bytes()
    };
    let mut out = Vec::with_capacity(wkb.len() + 4);
    out.push(wkb[0]);
    out.extend_from_slice(&ty);
    out.extend_from_slice(&srid);
    out.extend_from_slice(&wkb[5..]);
    Some(out)
}

/// The extended WKB ([`geometry_ewkb`]) of a Geometry as a target holds
/// it: the struct (a search index, a cache's JSON), its JSON text (a hash
/// field, a `jsonb` column) or the base64 of the bytes (a `bytea` column,
/// read back). `None` for anything else.
pub fn stored_geometry(value: &Value) -> Option<Vec<u8>> {
    use base64::Engine as _;
    match value {
        Value::Object(_) => geometry_ewkb(value),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => geometry_ewkb(&v),
            _ => base64::engine::general_purpose::STANDARD.decode(text).ok(),
        },
        _ => None,
    }
}

/// An ISO-8601 year: four digits in 0..=9999, else signed (`-0043`, `+10000`).
fn iso_year(year: i64) -> String {
    match year {
        0..=9999 => format!("{year:04}"),
        y if y < 0 => format!("-{:04}", y.unsigned_abs()),
        y => format!("+{y:04}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn geometries_become_extended_wkb_with_their_srid() {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        // POINT(1 2), little-endian, as MariaDB writes it.
        let point: Vec<u8> = [
            &[1u8, 1, 0, 0, 0][..],
            &1f64.to_le_bytes(),
            &2f64.to_le_bytes(),
        ]
        .concat();
        for srid in [json!(null), json!(0)] {
            let g = json!({"wkb": b64(&point), "srid": srid});
            assert_eq!(geometry_ewkb(&g), Some(point.clone()), "{g}");
        }
        let g = json!({"wkb": b64(&point), "srid": 4326});
        let ewkb: Vec<u8> = [
            &[1u8, 1, 0, 0, 0x20][..],
            &4326u32.to_le_bytes(),
            &1f64.to_le_bytes(),
            &2f64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(geometry_ewkb(&g), Some(ewkb));
        // Big-endian WKB keeps its order.
        let be: Vec<u8> = [
            &[0u8, 0, 0, 0, 1][..],
            &1f64.to_be_bytes(),
            &2f64.to_be_bytes(),
        ]
        .concat();
        let g = json!({"wkb": b64(&be), "srid": 3857});
        let want: Vec<u8> = [
            &[0u8, 0x20, 0, 0, 1][..],
            &3857u32.to_be_bytes(),
            &1f64.to_be_bytes(),
            &2f64.to_be_bytes(),
        ]
        .concat();
        assert_eq!(geometry_ewkb(&g), Some(want));
        // As targets hold it: the struct, its JSON text, the bytes' base64.
        let g = json!({"wkb": b64(&point), "srid": null});
        assert_eq!(stored_geometry(&g), Some(point.clone()));
        assert_eq!(stored_geometry(&json!(g.to_string())), Some(point.clone()));
        assert_eq!(stored_geometry(&json!(b64(&point))), Some(point.clone()));
        assert_eq!(stored_geometry(&json!(1)), None);
        for bad in [
            json!({"wkb": "AQ=="}),
            json!({"srid": 0}),
            json!("x"),
            json!({"wkb": b64(&[7, 1, 0, 0, 0])}),
        ] {
            assert_eq!(geometry_ewkb(&bad), None, "{bad}");
        }
    }

    #[test]
    fn days_become_iso_dates_with_expanded_years() {
        assert_eq!(iso_date(0), "1970-01-01");
        assert_eq!(iso_date(20_454), "2026-01-01");
        assert_eq!(iso_date(-1), "1969-12-31");
        assert_eq!(iso_date(-719_162), "0001-01-01");
        assert_eq!(iso_date(-719_528), "0000-01-01");
        // 44 BC is astronomical year -43.
        assert_eq!(iso_date(-735_160), "-0043-03-15");
        assert_eq!(iso_date(-2_440_588), "-4713-11-24");
        assert_eq!(iso_date(2_932_896), "9999-12-31");
        assert_eq!(iso_date(2_932_897), "+10000-01-01");
        assert_eq!(iso_date(2_145_042_905), "+5874897-12-31");
        assert_eq!(iso_date(i64::from(i32::MAX)), "infinity");
        assert_eq!(iso_date(i64::from(i32::MIN)), "-infinity");
    }

    #[test]
    fn micros_become_iso_timestamps_and_times() {
        assert_eq!(iso_timestamp(0), "1970-01-01T00:00:00.000000");
        assert_eq!(iso_timestamp(-1), "1969-12-31T23:59:59.999999");
        assert_eq!(
            iso_timestamp(946_684_788_500_000),
            "1999-12-31T23:59:48.500000"
        );
        assert_eq!(
            iso_timestamp(-210_866_803_200_000_000),
            "-4713-11-24T00:00:00.000000"
        );
        assert_eq!(
            iso_timestamp(9_223_371_244_799_999_999),
            "+294246-12-31T23:59:59.999999"
        );
        assert_eq!(iso_timestamp(i64::MAX), "infinity");
        assert_eq!(iso_timestamp(i64::MIN), "-infinity");
        assert_eq!(iso_timestamptz(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(iso_timestamptz(i64::MIN), "-infinity");
        assert_eq!(iso_time(0), "00:00:00.000000");
        assert_eq!(iso_time(45_296_500_000), "12:34:56.500000");
        assert_eq!(iso_time(86_399_999_999), "23:59:59.999999");
        assert_eq!(iso_time(86_400_000_000), "24:00:00.000000");
    }

    #[test]
    fn schemas_choose_the_conversion_and_values_keep_their_shape() {
        let date = json!({"type": "int32", "name": "io.debezium.time.Date"});
        assert_eq!(Kind::of_schema(&date), Some(Kind::Date));
        let dates = json!({"type": "array", "items": date});
        let kind = Kind::of_schema(&dates).expect("array of dates");
        assert_eq!(
            kind.convert(&json!([[20454, null], [], "infinity"]))
                .into_owned(),
            json!([["2026-01-01", null], [], "infinity"])
        );
        let json_kind =
            Kind::of_schema(&json!({"type": "string", "name": "io.debezium.data.Json"}))
                .expect("json");
        assert_eq!(
            json_kind.convert(&json!("{\"a\": [1, 2.50]}")).into_owned(),
            json!({"a": [1, 2.50]})
        );
        assert_eq!(json_kind.convert(&json!("\"s\"")).into_owned(), json!("s"));
        assert_eq!(
            json_kind.convert(&json!("not json")).into_owned(),
            json!("not json")
        );
        let time = Kind::of_schema(&json!({"type": "int64", "name": "io.debezium.time.MicroTime"}));
        assert_eq!(
            time.expect("time").convert(&json!(1_500_000)).into_owned(),
            json!("00:00:01.500000")
        );
        let ts =
            Kind::of_schema(&json!({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}))
                .expect("timestamp");
        assert_eq!(ts.convert(&Value::Null).into_owned(), Value::Null);
        for passing in [
            json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}),
            json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC"}}),
            json!({"type": "string", "name": "io.debezium.data.Uuid"}),
            json!({"type": "int64"}),
            json!({"type": "array", "items": {"type": "int32"}}),
        ] {
            assert_eq!(Kind::of_schema(&passing), None, "{passing}");
        }
    }
}
