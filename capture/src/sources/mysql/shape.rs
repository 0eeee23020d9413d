//! A table's shape as the binlog describes it (TABLE_MAP with the optional
//! metadata of `binlog_row_metadata = FULL`), completed from
//! `information_schema` where the binlog says nothing: the declared
//! `tinyint(1)` (the binlog carries no display width) and MariaDB's JSON
//! columns (a `longtext` with a `json_valid` check, a BLOB in the binlog).

use mysql_async::binlog::events::{OptionalMetaExtractor, OptionalMetadataField, TableMapEvent};
use mysql_async::consts::ColumnType;

use super::checks::Flavor;
use super::error::MySqlSourceError;
use crate::envelope::SourceIdentity;

/// The character set number MySQL and MariaDB give binary strings.
pub const BINARY_CHARSET: u16 = 63;

/// One column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnShape {
    pub name: String,
    /// The binlog type, the real one for ENUM and SET.
    pub ty: ColumnType,
    /// The type's TABLE_MAP metadata bytes (precision and scale, fractional
    /// seconds, bit length, length-prefix sizes).
    pub meta: Vec<u8>,
    pub unsigned: bool,
    pub nullable: bool,
    /// A character column with the binary character set (BINARY,
    /// VARBINARY, BLOB): bytes, not text.
    pub binary: bool,
    /// ENUM or SET labels, in declaration order.
    pub labels: Vec<String>,
    /// `information_schema.COLUMNS.COLUMN_TYPE`, when read.
    pub declared: Option<String>,
    /// A JSON column (MySQL's own type, or MariaDB's alias).
    pub json: bool,
}

impl ColumnShape {
    /// A column of `ty` with no metadata, for tests and catalog-built shapes.
    pub fn new(name: &str, ty: ColumnType) -> Self {
        Self {
            name: name.into(),
            ty,
            meta: Vec::new(),
            unsigned: false,
            nullable: true,
            binary: false,
            labels: Vec::new(),
            declared: None,
            json: ty == ColumnType::MYSQL_TYPE_JSON,
        }
    }

    pub fn meta_byte(&self, i: usize) -> u8 {
        self.meta.get(i).copied().unwrap_or(0)
    }

    /// Whether the declared type is `tinyint(1)` (Debezium's rule needs
    /// the width, which only the catalog has).
    pub fn is_tinyint1(&self) -> bool {
        self.ty == ColumnType::MYSQL_TYPE_TINY
            && self
                .declared
                .as_deref()
                .is_some_and(|d| d.trim().to_ascii_lowercase().starts_with("tinyint(1)"))
    }
}

/// One table as of a TABLE_MAP event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    pub database: String,
    pub table: String,
    pub columns: Vec<ColumnShape>,
    /// Indexes of the primary key columns, in key order.
    pub primary_key: Vec<usize>,
    /// Which columns these are across DDL, as of the event (the shape
    /// facts' [`super::history::TableIds`]); `None` for a table the facts
    /// do not number.
    pub identity: Option<SourceIdentity>,
}

impl TableShape {
    /// `database.table`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.database, self.table)
    }

    /// Reads the shape out of a TABLE_MAP event. Without column names in
    /// it (`binlog_row_metadata` is not FULL) this fails: the start-up
    /// checks refuse such a server before any event is read.
    pub fn from_table_map(tme: &TableMapEvent<'_>) -> Result<Self, MySqlSourceError> {
        let bad = |what: String| {
            MySqlSourceError::Protocol(format!(
                "TABLE_MAP of {}.{}: {what}",
                tme.database_name(),
                tme.table_name()
            ))
        };
        let n = usize::try_from(tme.columns_count()).map_err(|_| bad("column count".into()))?;
        let extractor =
            OptionalMetaExtractor::new(tme.iter_optional_meta()).map_err(|e| bad(e.to_string()))?;
        let mut signedness = extractor.iter_signedness();
        let mut charsets = extractor.iter_charset();
        let mut names = extractor.iter_column_name();
        let nulls = tme.null_bitmask();
        let (enum_labels, set_labels) = column_labels(tme)?;
        let (mut enums, mut sets) = (enum_labels.into_iter(), set_labels.into_iter());
        let mut columns = Vec::with_capacity(n);
        for i in 0..n {
            let ty = match tme.get_column_type(i) {
                Ok(Some(ty)) => ty,
                Ok(None) => return Err(bad(format!("no type for column {i}"))),
                Err(e) => return Err(bad(format!("column {i}: {e}"))),
            };
            let meta = tme.get_column_metadata(i).unwrap_or(&[]).to_vec();
            let unsigned = ty.is_numeric_type() && signedness.next().unwrap_or(false);
            let charset = if ty.is_character_type() {
                charsets
                    .next()
                    .transpose()
                    .map_err(|e| bad(e.to_string()))?
            } else {
                None
            };
            let name = match names.next().transpose().map_err(|e| bad(e.to_string()))? {
                Some(n) => n.name().into_owned(),
                None => {
                    return Err(bad(format!(
                        "no name for column {i}: binlog_row_metadata is not FULL"
                    )))
                }
            };
            let labels = if ty == ColumnType::MYSQL_TYPE_ENUM {
                enums.next().unwrap_or_default()
            } else if ty == ColumnType::MYSQL_TYPE_SET {
                sets.next().unwrap_or_default()
            } else {
                Vec::new()
            };
            columns.push(ColumnShape {
                name,
                json: ty == ColumnType::MYSQL_TYPE_JSON,
                ty,
                meta,
                unsigned,
                nullable: nulls.get(i).is_some_and(|b| *b),
                binary: charset == Some(BINARY_CHARSET),
                labels,
                declared: None,
            });
        }
        let mut primary_key = Vec::new();
        for k in extractor.iter_primary_key() {
            let k = k.map_err(|e| bad(e.to_string()))?;
            primary_key.push(usize::try_from(k).map_err(|_| bad("primary key index".into()))?);
        }
        Ok(Self {
            database: tme.database_name().into_owned(),
            table: tme.table_name().into_owned(),
            columns,
            primary_key,
            identity: None,
        })
    }

    /// Completes the shape with the catalog's declared types (by column
    /// name): `tinyint(1)` and MariaDB's JSON alias.
    pub fn apply_catalog(&mut self, catalog: &[CatalogColumn]) {
        for col in &mut self.columns {
            if let Some(c) = catalog
                .iter()
                .find(|c| c.name.eq_ignore_ascii_case(&col.name))
            {
                col.declared = Some(c.column_type.clone());
                col.json |= c.json;
            }
        }
    }
}

/// Labels of each ENUM and of each SET column, in column order.
type Labels = Vec<Vec<String>>;

/// The ENUM and SET labels a TABLE_MAP carries (`binlog_row_metadata = FULL`).
fn column_labels(tme: &TableMapEvent<'_>) -> Result<(Labels, Labels), MySqlSourceError> {
    let bad = |what: String| {
        MySqlSourceError::Protocol(format!(
            "TABLE_MAP of {}.{}: {what}",
            tme.database_name(),
            tme.table_name()
        ))
    };
    let mut enum_labels = Vec::new();
    let mut set_labels = Vec::new();
    for field in tme.iter_optional_meta() {
        match field.map_err(|e| bad(e.to_string()))? {
            OptionalMetadataField::EnumStrValue(v) => {
                for labels in v.iter_values() {
                    let labels = labels.map_err(|e| bad(e.to_string()))?;
                    enum_labels.push(
                        labels
                            .values()
                            .iter()
                            .map(|l| l.value().into_owned())
                            .collect::<Vec<_>>(),
                    );
                }
            }
            OptionalMetadataField::SetStrValue(v) => {
                for labels in v.iter_values() {
                    let labels = labels.map_err(|e| bad(e.to_string()))?;
                    set_labels.push(
                        labels
                            .values()
                            .iter()
                            .map(|l| l.value().into_owned())
                            .collect::<Vec<_>>(),
                    );
                }
            }
            _ => {}
        }
    }
    Ok((enum_labels, set_labels))
}

/// What `information_schema` says of one column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogColumn {
    pub name: String,
    /// `COLUMN_TYPE`, e.g. `tinyint(1)`, `bigint(20) unsigned`.
    pub column_type: String,
    /// MySQL's `json`, or MariaDB's `longtext` checked by `json_valid`.
    pub json: bool,
}

/// The catalog's columns of `database.table`, in ordinal order.
pub async fn load_catalog(
    conn: &mut mysql_async::Conn,
    flavor: Flavor,
    database: &str,
    table: &str,
) -> Result<Vec<CatalogColumn>, MySqlSourceError> {
    use mysql_async::prelude::Queryable;
    // MariaDB declares JSON as LONGTEXT with CHECK (json_valid(`col`)), in
    // its information_schema.CHECK_CONSTRAINTS (which has TABLE_NAME there,
    // not in MySQL, whose JSON is a type of its own).
    let rows: Vec<(String, String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        .await
        .map_err(|e| MySqlSourceError::server("read information_schema.COLUMNS", e))?;
    let checks: Vec<String> = if flavor != Flavor::MariaDb {
        Vec::new()
    } else {
        conn.exec(
            "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?",
            (database, table),
        )
        .await
        .map_err(|e| MySqlSourceError::server("read information_schema.CHECK_CONSTRAINTS", e))?
    };
    Ok(rows
        .into_iter()
        .map(|(name, column_type, data_type)| {
            let check = format!("json_valid(`{name}`)");
            let json = data_type.eq_ignore_ascii_case("json")
                || checks.iter().any(|c| c.eq_ignore_ascii_case(&check));
            CatalogColumn {
                name,
                column_type,
                json,
            }
        })
        .collect())
}

/// One row of `information_schema.COLUMNS` as [`TableShape::from_catalog`]
/// reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredColumn {
    pub name: String,
    /// `DATA_TYPE`, e.g. `int`, `longtext`, `point`.
    pub data_type: String,
    /// `COLUMN_TYPE`, e.g. `int(10) unsigned`, `enum('a','b')`.
    pub column_type: String,
    pub nullable: bool,
    pub precision: Option<u64>,
    pub scale: Option<u64>,
    pub datetime_precision: Option<u64>,
    /// MySQL's JSON, or MariaDB's `longtext` checked by `json_valid`.
    pub json: bool,
}

impl ColumnShape {
    /// The shape a TABLE_MAP would give the declared column (what
    /// [`super::mapping`] reads of it: type, the metadata of precision,
    /// fractional seconds and bit length, signedness, binary strings,
    /// ENUM/SET labels), for rows a snapshot reads with SELECT.
    pub fn from_declared(d: &DeclaredColumn) -> Self {
        use ColumnType::*;
        let data_type = d.data_type.to_ascii_lowercase();
        let byte = |v: Option<u64>| u8::try_from(v.unwrap_or(0)).unwrap_or(u8::MAX);
        let (ty, meta) = match data_type.as_str() {
            "tinyint" => (MYSQL_TYPE_TINY, vec![]),
            "smallint" => (MYSQL_TYPE_SHORT, vec![]),
            "mediumint" => (MYSQL_TYPE_INT24, vec![]),
            "int" | "integer" => (MYSQL_TYPE_LONG, vec![]),
            "bigint" => (MYSQL_TYPE_LONGLONG, vec![]),
            "float" => (MYSQL_TYPE_FLOAT, vec![4]),
            "double" | "real" => (MYSQL_TYPE_DOUBLE, vec![8]),
            "decimal" | "numeric" => (
                MYSQL_TYPE_NEWDECIMAL,
                vec![byte(d.precision), byte(d.scale)],
            ),
            "date" => (MYSQL_TYPE_DATE, vec![]),
            "datetime" => (MYSQL_TYPE_DATETIME2, vec![byte(d.datetime_precision)]),
            "timestamp" => (MYSQL_TYPE_TIMESTAMP2, vec![byte(d.datetime_precision)]),
            "time" => (MYSQL_TYPE_TIME2, vec![byte(d.datetime_precision)]),
            "year" => (MYSQL_TYPE_YEAR, vec![]),
            // BIT(n): n % 8, then whole bytes, as TABLE_MAP has it.
            "bit" => {
                let n = d.precision.unwrap_or(1);
                (MYSQL_TYPE_BIT, vec![byte(Some(n % 8)), byte(Some(n / 8))])
            }
            "enum" => (MYSQL_TYPE_ENUM, vec![]),
            "set" => (MYSQL_TYPE_SET, vec![]),
            "json" => (MYSQL_TYPE_JSON, vec![]),
            "char" | "binary" => (MYSQL_TYPE_STRING, vec![]),
            "varchar" | "varbinary" => (MYSQL_TYPE_VARCHAR, vec![]),
            "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
            | "multipolygon" | "geometrycollection" => (MYSQL_TYPE_GEOMETRY, vec![]),
            // TEXT and BLOB of every size (and anything else stored as bytes).
            _ => (MYSQL_TYPE_BLOB, vec![]),
        };
        let column_type = d.column_type.to_ascii_lowercase();
        let labels = match ty {
            MYSQL_TYPE_ENUM | MYSQL_TYPE_SET => declared_labels(&d.column_type),
            _ => Vec::new(),
        };
        Self {
            name: d.name.clone(),
            ty,
            meta,
            unsigned: ty.is_numeric_type() && column_type.contains("unsigned"),
            nullable: d.nullable,
            binary: matches!(
                data_type.as_str(),
                "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob"
            ),
            labels,
            declared: Some(d.column_type.clone()),
            json: d.json,
        }
    }
}

/// The labels of `enum('a','b''c')` or `set(...)`, quotes undoubled.
pub fn declared_labels(column_type: &str) -> Vec<String> {
    let Some(open) = column_type.find('(') else {
        return Vec::new();
    };
    let mut labels = Vec::new();
    let mut chars = column_type[open + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut label = String::new();
        while let Some(c) = chars.next() {
            if c == '\'' {
                if chars.peek() == Some(&'\'') {
                    chars.next();
                    label.push('\'');
                } else {
                    break;
                }
            } else {
                label.push(c);
            }
        }
        labels.push(label);
    }
    labels
}

impl TableShape {
    /// The table's shape as `information_schema` declares it now, with its
    /// primary key: what a snapshot, which reads rows with SELECT rather
    /// than from the binlog, describes its rows by. Read under the
    /// snapshot's lock it is the shape at the snapshot's position.
    pub async fn from_catalog(
        conn: &mut mysql_async::Conn,
        flavor: Flavor,
        database: &str,
        table: &str,
    ) -> Result<Self, MySqlSourceError> {
        use mysql_async::prelude::Queryable;
        type Row = (
            String,
            String,
            String,
            String,
            Option<u64>,
            Option<u64>,
            Option<u64>,
        );
        let rows: Vec<Row> = conn
            .exec(
                "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, \
                 NUMERIC_SCALE, DATETIME_PRECISION FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (database, table),
            )
            .await
            .map_err(|e| MySqlSourceError::server("read information_schema.COLUMNS", e))?;
        if rows.is_empty() {
            return Err(MySqlSourceError::Protocol(format!(
                "table {database}.{table} is not in information_schema (missing, or the user lacks SELECT on it)"
            )));
        }
        let json_of = load_catalog(conn, flavor, database, table).await?;
        let key: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? \
                 AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
                (database, table),
            )
            .await
            .map_err(|e| MySqlSourceError::server("read information_schema.STATISTICS", e))?;
        let columns: Vec<ColumnShape> = rows
            .into_iter()
            .map(|(name, data_type, column_type, nullable, p, s, dp)| {
                let json = json_of.iter().any(|c| c.name == name && c.json);
                ColumnShape::from_declared(&DeclaredColumn {
                    name,
                    data_type,
                    column_type,
                    nullable: nullable.eq_ignore_ascii_case("YES"),
                    precision: p,
                    scale: s,
                    datetime_precision: dp,
                    json,
                })
            })
            .collect();
        let primary_key = key
            .iter()
            .filter_map(|k| columns.iter().position(|c| &c.name == k))
            .collect();
        Ok(Self {
            database: database.into(),
            table: table.into(),
            columns,
            primary_key,
            identity: None,
        })
    }
}
