//! The mapping of every type, checked against the golden file
//! `tests/fixtures/mysql/types.json` (`UPDATE_GOLDEN=1 cargo test -p
//! oncely-capture --lib sources::mysql::mapping` rewrites it). Each entry is
//! one column under one set of modes: its declaration, the cell, the
//! Connect field schema and the JSON value.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;

fn col(name: &str, ty: ColumnType, meta: &[u8]) -> ColumnShape {
    let mut c = ColumnShape::new(name, ty);
    c.meta = meta.to_vec();
    c
}

fn unsigned(mut c: ColumnShape) -> ColumnShape {
    c.unsigned = true;
    c
}

fn not_null(mut c: ColumnShape) -> ColumnShape {
    c.nullable = false;
    c
}

fn declared(mut c: ColumnShape, d: &str) -> ColumnShape {
    c.declared = Some(d.into());
    c
}

fn labels(mut c: ColumnShape, l: &[&str]) -> ColumnShape {
    c.labels = l.iter().map(|s| s.to_string()).collect();
    c
}

fn json_text(mut c: ColumnShape) -> ColumnShape {
    c.json = true;
    c.declared = Some("longtext".into());
    c
}

fn binary(mut c: ColumnShape) -> ColumnShape {
    c.binary = true;
    c
}

fn dt(year: u16, month: u8, day: u8, hour: u8, minute: u8, second: u8, micros: u32) -> Cell {
    Cell::DateTime {
        year,
        month,
        day,
        hour,
        minute,
        second,
        micros,
    }
}

/// (case name, modes, column, cell).
fn cases() -> Vec<(&'static str, MappingConfig, ColumnShape, Cell)> {
    use ColumnType::*;
    let d = MappingConfig::default();
    let precise_bigint = MappingConfig {
        bigint_unsigned: BigintUnsignedHandlingMode::Precise,
        ..d
    };
    let dec_string = MappingConfig {
        decimal: DecimalHandlingMode::String,
        ..d
    };
    let dec_double = MappingConfig {
        decimal: DecimalHandlingMode::Double,
        ..d
    };
    let connect = MappingConfig {
        time: TimePrecisionMode::Connect,
        ..d
    };
    let bool1 = MappingConfig {
        tinyint_one_as_boolean: true,
        ..d
    };
    vec![
        (
            "tinyint",
            d,
            col("c", MYSQL_TYPE_TINY, &[]),
            Cell::Int(-128),
        ),
        (
            "tinyint_unsigned",
            d,
            unsigned(col("c", MYSQL_TYPE_TINY, &[])),
            Cell::UInt(255),
        ),
        (
            "tinyint1_default_int16",
            d,
            declared(col("c", MYSQL_TYPE_TINY, &[]), "tinyint(1)"),
            Cell::Int(1),
        ),
        (
            "tinyint1_as_boolean",
            bool1,
            declared(col("c", MYSQL_TYPE_TINY, &[]), "tinyint(1)"),
            Cell::Int(1),
        ),
        (
            "smallint",
            d,
            col("c", MYSQL_TYPE_SHORT, &[]),
            Cell::Int(-32768),
        ),
        (
            "smallint_unsigned",
            d,
            unsigned(col("c", MYSQL_TYPE_SHORT, &[])),
            Cell::UInt(65535),
        ),
        (
            "mediumint_unsigned",
            d,
            unsigned(col("c", MYSQL_TYPE_INT24, &[])),
            Cell::UInt(16_777_215),
        ),
        (
            "int",
            d,
            col("c", MYSQL_TYPE_LONG, &[]),
            Cell::Int(-2_147_483_648),
        ),
        (
            "int_unsigned",
            d,
            unsigned(col("c", MYSQL_TYPE_LONG, &[])),
            Cell::UInt(4_294_967_295),
        ),
        (
            "bigint",
            d,
            col("c", MYSQL_TYPE_LONGLONG, &[]),
            Cell::Int(i64::MIN),
        ),
        (
            "bigint_unsigned_long",
            d,
            unsigned(col("c", MYSQL_TYPE_LONGLONG, &[])),
            Cell::UInt(9_223_372_036_854_775_807),
        ),
        (
            "bigint_unsigned_precise",
            precise_bigint,
            unsigned(col("c", MYSQL_TYPE_LONGLONG, &[])),
            Cell::UInt(u64::MAX),
        ),
        (
            "float",
            d,
            col("c", MYSQL_TYPE_FLOAT, &[4]),
            Cell::Float(1.5),
        ),
        // Debezium writes the float's shortest text, not the double it
        // widens to (0.10000000149011612).
        (
            "float_shortest",
            d,
            col("c", MYSQL_TYPE_FLOAT, &[4]),
            Cell::Float(0.1),
        ),
        (
            "double",
            d,
            col("c", MYSQL_TYPE_DOUBLE, &[8]),
            Cell::Double(-2.25e10),
        ),
        (
            "decimal_precise",
            d,
            col("c", MYSQL_TYPE_NEWDECIMAL, &[10, 2]),
            Cell::Decimal("-12345678.90".into()),
        ),
        (
            "decimal_precise_65",
            d,
            col("c", MYSQL_TYPE_NEWDECIMAL, &[65, 30]),
            Cell::Decimal(
                "12345678901234567890123456789012345.123456789012345678901234567890".into(),
            ),
        ),
        (
            "decimal_string",
            dec_string,
            col("c", MYSQL_TYPE_NEWDECIMAL, &[10, 2]),
            Cell::Decimal("163.38".into()),
        ),
        (
            "decimal_double",
            dec_double,
            col("c", MYSQL_TYPE_NEWDECIMAL, &[10, 2]),
            Cell::Decimal("163.38".into()),
        ),
        (
            "date",
            d,
            col("c", MYSQL_TYPE_DATE, &[]),
            Cell::Date {
                year: 2026,
                month: 12,
                day: 5,
            },
        ),
        (
            "date_connect",
            connect,
            col("c", MYSQL_TYPE_DATE, &[]),
            Cell::Date {
                year: 1969,
                month: 12,
                day: 31,
            },
        ),
        (
            "date_zero_nullable",
            d,
            col("c", MYSQL_TYPE_DATE, &[]),
            Cell::Date {
                year: 0,
                month: 0,
                day: 0,
            },
        ),
        (
            "date_zero_not_null",
            d,
            not_null(col("c", MYSQL_TYPE_DATE, &[])),
            Cell::Date {
                year: 0,
                month: 0,
                day: 0,
            },
        ),
        (
            "datetime0",
            d,
            col("c", MYSQL_TYPE_DATETIME2, &[0]),
            dt(2026, 12, 5, 1, 2, 3, 0),
        ),
        (
            "datetime3",
            d,
            col("c", MYSQL_TYPE_DATETIME2, &[3]),
            dt(2026, 12, 5, 1, 2, 3, 456_000),
        ),
        (
            "datetime6",
            d,
            col("c", MYSQL_TYPE_DATETIME2, &[6]),
            dt(1900, 1, 1, 0, 0, 0, 1),
        ),
        (
            "datetime6_connect",
            connect,
            col("c", MYSQL_TYPE_DATETIME2, &[6]),
            dt(2026, 12, 5, 1, 2, 3, 456_789),
        ),
        (
            "datetime_zero_not_null",
            d,
            not_null(col("c", MYSQL_TYPE_DATETIME2, &[0])),
            dt(0, 0, 0, 0, 0, 0, 0),
        ),
        (
            "timestamp0",
            d,
            col("c", MYSQL_TYPE_TIMESTAMP2, &[0]),
            Cell::Timestamp {
                secs: 1_796_432_523,
                micros: 0,
            },
        ),
        (
            "timestamp6",
            d,
            col("c", MYSQL_TYPE_TIMESTAMP2, &[6]),
            Cell::Timestamp {
                secs: 1_796_432_523,
                micros: 123_456,
            },
        ),
        (
            "timestamp_zero_nullable",
            d,
            col("c", MYSQL_TYPE_TIMESTAMP2, &[0]),
            Cell::Timestamp { secs: 0, micros: 0 },
        ),
        (
            "timestamp_zero_not_null",
            d,
            not_null(col("c", MYSQL_TYPE_TIMESTAMP2, &[2])),
            Cell::Timestamp { secs: 0, micros: 0 },
        ),
        (
            "time6",
            d,
            col("c", MYSQL_TYPE_TIME2, &[6]),
            Cell::Time {
                negative: false,
                hours: 838,
                minutes: 59,
                seconds: 59,
                micros: 0,
            },
        ),
        (
            "time_negative",
            d,
            col("c", MYSQL_TYPE_TIME2, &[3]),
            Cell::Time {
                negative: true,
                hours: 1,
                minutes: 2,
                seconds: 3,
                micros: 500_000,
            },
        ),
        (
            "time_connect",
            connect,
            col("c", MYSQL_TYPE_TIME2, &[3]),
            Cell::Time {
                negative: false,
                hours: 1,
                minutes: 2,
                seconds: 3,
                micros: 500_000,
            },
        ),
        ("year", d, col("c", MYSQL_TYPE_YEAR, &[]), Cell::Year(2155)),
        (
            "char",
            d,
            col("c", MYSQL_TYPE_STRING, &[0xfe, 40]),
            Cell::Bytes("héllo".as_bytes().to_vec()),
        ),
        (
            "varchar",
            d,
            col("c", MYSQL_TYPE_VARCHAR, &[200, 0]),
            Cell::Bytes("日本".as_bytes().to_vec()),
        ),
        (
            "text",
            d,
            col("c", MYSQL_TYPE_BLOB, &[2]),
            Cell::Bytes(b"long text".to_vec()),
        ),
        (
            "varbinary",
            d,
            binary(col("c", MYSQL_TYPE_VARCHAR, &[16, 0])),
            Cell::Bytes(vec![0, 1, 0xfe, 0xff]),
        ),
        (
            "blob",
            d,
            binary(col("c", MYSQL_TYPE_BLOB, &[2])),
            Cell::Bytes(vec![0xde, 0xad, 0xbe, 0xef]),
        ),
        (
            "enum",
            d,
            labels(
                col("c", MYSQL_TYPE_ENUM, &[0xf7, 1]),
                &["small", "medium", "large"],
            ),
            Cell::Enum(2),
        ),
        (
            "set",
            d,
            labels(col("c", MYSQL_TYPE_SET, &[0xf8, 1]), &["a", "b", "c", "d"]),
            Cell::Set(0b1101),
        ),
        (
            "json",
            d,
            col("c", MYSQL_TYPE_JSON, &[4]),
            Cell::Json(json!({"k": [1, 2.5, "x", null, true]})),
        ),
        // MariaDB's JSON, a LONGTEXT: the text as stored.
        (
            "json_mariadb_text",
            d,
            json_text(col("c", MYSQL_TYPE_BLOB, &[4])),
            Cell::JsonText("{\"k\": [1, 2.5], \"u\": \"\\u00e9\"}".into()),
        ),
        (
            "bit1",
            d,
            col("c", MYSQL_TYPE_BIT, &[1, 0]),
            Cell::Bit(vec![1]),
        ),
        (
            "bit12",
            d,
            col("c", MYSQL_TYPE_BIT, &[4, 1]),
            Cell::Bit(vec![0x0a, 0xbc]),
        ),
        (
            "geometry_point",
            d,
            col("c", MYSQL_TYPE_GEOMETRY, &[4]),
            Cell::Bytes(vec![
                0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0x40,
            ]),
        ),
        // A POINT column (declared so) is Debezium's Point, with x and y.
        (
            "point",
            d,
            declared(col("c", MYSQL_TYPE_GEOMETRY, &[4]), "point"),
            Cell::Bytes(vec![
                0xe6, 0x10, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0,
                0x40,
            ]),
        ),
        ("null", d, col("c", MYSQL_TYPE_LONG, &[]), Cell::Null),
    ]
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mysql/types.json")
}

/// `AdaptiveTimeMicroseconds` -> `adaptive_time_microseconds`, the config value.
fn snake(debug: String) -> String {
    let mut out = String::new();
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn modes(cfg: &MappingConfig) -> Value {
    json!({
        "decimal.handling.mode": snake(format!("{:?}", cfg.decimal)),
        "time.precision.mode": snake(format!("{:?}", cfg.time)),
        "bigint.unsigned.handling.mode": snake(format!("{:?}", cfg.bigint_unsigned)),
        "tinyint.one.as.boolean": cfg.tinyint_one_as_boolean,
    })
}

#[test]
fn every_type_matches_the_golden_file() {
    let mut out = serde_json::Map::new();
    for (name, cfg, col, cell) in cases() {
        let value = to_json(&cfg, &col, &cell).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.insert(
            name.into(),
            json!({
                "modes": modes(&cfg),
                "column": {"type": format!("{:?}", col.ty), "meta": col.meta, "unsigned": col.unsigned,
                           "nullable": col.nullable, "declared": col.declared},
                "schema": field_schema(&cfg, &col, col.nullable),
                "value": value,
            }),
        );
    }
    let got = Value::Object(out);
    let path = golden_path();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
        return;
    }
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display())),
    )
    .unwrap();
    for (name, w) in want.as_object().unwrap() {
        assert_eq!(
            got.get(name),
            Some(w),
            "case {name} differs from {}",
            path.display()
        );
    }
    assert_eq!(got, want);
}

/// Spot checks of values the golden file holds, so a regeneration cannot
/// silently bless a wrong one.
#[test]
fn known_values() {
    let all: Vec<_> = cases();
    let get = |n: &str| {
        let (_, cfg, col, cell) = all.iter().find(|c| c.0 == n).unwrap();
        (
            to_json(cfg, col, cell).unwrap(),
            field_schema(cfg, col, true),
        )
    };
    // 163.38 at scale 2 is 16338 = 0x3FD2: "P9I=", as Debezium writes it.
    let cfg = MappingConfig::default();
    let c = col("c", ColumnType::MYSQL_TYPE_NEWDECIMAL, &[10, 2]);
    assert_eq!(
        to_json(&cfg, &c, &Cell::Decimal("163.38".into())).unwrap(),
        json!("P9I=")
    );
    assert_eq!(
        to_json(&cfg, &c, &Cell::Decimal("-1.00".into())).unwrap(),
        json!("nA==")
    ); // -100: one byte, 0x9c
    assert_eq!(
        to_json(&cfg, &c, &Cell::Decimal("0.00".into())).unwrap(),
        json!("AA==")
    );
    // u64::MAX as a 9-byte positive BigInteger.
    assert_eq!(get("bigint_unsigned_precise").0, json!("AP//////////"));
    assert_eq!(get("date").0, json!(20_792));
    assert_eq!(get("date_zero_nullable").0, Value::Null);
    assert_eq!(get("date_zero_not_null").0, json!(0));
    assert_eq!(get("timestamp6").0, json!("2026-12-05T01:02:03.123456Z"));
    assert_eq!(
        get("timestamp_zero_not_null").0,
        json!("1970-01-01T00:00:00.00Z")
    );
    assert_eq!(get("datetime3").0, json!(1_796_432_523_456_i64));
    assert_eq!(get("datetime6").0, json!(-2_208_988_799_999_999_i64));
    assert_eq!(get("time_negative").0, json!(-3_723_500_000_i64));
    assert_eq!(get("enum").0, json!("medium"));
    assert_eq!(get("set").0, json!("a,c,d"));
    assert_eq!(get("bit12").0, json!("vAo="));
    assert_eq!(get("bit1").0, json!(true));
    assert_eq!(get("tinyint1_as_boolean").0, json!(true));
    assert_eq!(get("tinyint1_default_int16").1["type"], json!("int16"));
    assert_eq!(
        get("datetime6").1["name"],
        json!("io.debezium.time.MicroTimestamp")
    );
    assert_eq!(
        get("datetime3").1["name"],
        json!("io.debezium.time.Timestamp")
    );
}

#[test]
fn unsigned_bigint_above_int64_is_refused_in_long_mode() {
    let c = unsigned(col("c", ColumnType::MYSQL_TYPE_LONGLONG, &[]));
    let err = to_json(&MappingConfig::default(), &c, &Cell::UInt(u64::MAX)).unwrap_err();
    assert_eq!(err, MappingError::UnsignedOverflow { value: u64::MAX });
    assert!(err
        .to_string()
        .contains("bigint.unsigned.handling.mode = \"precise\""));
}

#[test]
fn mapping_config_uses_debezium_keys_and_refuses_unknown_ones() {
    let cfg: MappingConfig = toml::from_str(
        "\"decimal.handling.mode\" = \"string\"\n\"time.precision.mode\" = \"connect\"\n\"bigint.unsigned.handling.mode\" = \"precise\"\n",
    )
    .unwrap();
    assert_eq!(cfg.decimal, DecimalHandlingMode::String);
    assert_eq!(cfg.time, TimePrecisionMode::Connect);
    assert_eq!(cfg.bigint_unsigned, BigintUnsignedHandlingMode::Precise);
    assert!(toml::from_str::<MappingConfig>("\"decimal.mode\" = \"string\"").is_err());
}
