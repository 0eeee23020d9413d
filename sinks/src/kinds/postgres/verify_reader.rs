//! The warehouse read back for `oncely verify`, with the sink's own names:
//! one table per source table (`target.schema`.`table.name.format`), typed
//! columns, deleted rows kept as tombstones (`__oncely_deleted`) unless
//! `delete.mode = "hard"`, positions in `positions.table`. Values are mapped
//! back to wire JSON by the warehouse column's own type (capture's mapping,
//! [`WireTypes`]), so a `timestamptz` compares as the same ISO string capture
//! wrote, a `numeric(12,2)` as the same digits.

use std::collections::HashMap;

use async_trait::async_trait;
use oncely_core::sql::{output_text_of, quote_ident};
use oncely_core::wire::SESSION_OPTIONS;
use serde_json::{Map, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::generation::stored_identifier;
use super::{connector, expand_name, place_of, MetaColumns, PostgresConfig};
use crate::sink::TopicPartition;
use crate::verify_reader::{
    Fetched, KeyPage, RowKey, StoredForm, StoredRow, VerifiedTable, VerifyContext, VerifyReadError,
    VerifyReader, WireMapping, WireTypes, PAGE,
};

/// A warehouse error as a reader's, with what was being done.
fn pg(context: &'static str) -> impl Fn(tokio_postgres::Error) -> VerifyReadError {
    move |e| VerifyReadError::Target(format!("{context}: {e}"))
}

/// A PostgreSQL sink's warehouse, read the way the sink writes it.
pub struct PostgresVerifyReader {
    client: Client,
    config: PostgresConfig,
    group: String,
    types: Box<dyn WireMapping>,
}

/// A warehouse table as it exists.
struct Shape {
    qualified: String,
    /// Column name -> (its type's oid, its SQL type).
    columns: HashMap<String, (u32, String)>,
    /// The tombstone flag column, when the table has one.
    tombstones: Option<String>,
}

impl PostgresVerifyReader {
    /// Connects with the sink's URL, password, TLS settings and timeout, in
    /// capture's session settings, and loads the warehouse's types.
    pub async fn connect(
        config: &PostgresConfig,
        ctx: &VerifyContext<'_>,
        types: &dyn WireTypes,
    ) -> Result<Self, VerifyReadError> {
        let mut pg: tokio_postgres::Config = config.url.expose().parse().map_err(|_| {
            VerifyReadError::Config("sink.url is not a valid PostgreSQL connection string".into())
        })?;
        if let Some(password) = &config.password {
            pg.password(password.expose());
        }
        let place = place_of(&pg);
        pg.application_name("oncely-verify")
            .options(SESSION_OPTIONS)
            .connect_timeout(std::time::Duration::from_millis(config.connect_timeout_ms));
        // The sink's own TLS settings (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`).
        let tls = connector(config)
            .map_err(|e| VerifyReadError::Config(format!("warehouse TLS: {e}")))?;
        let client = tls.connect(&pg, "warehouse").await.map_err(|e| {
            VerifyReadError::Target(format!("connect to the warehouse at {place}: {e}"))
        })?;
        let types = types.load(&client).await?;
        Ok(Self {
            client,
            config: config.clone(),
            group: ctx.runner.group_id.clone(),
            types,
        })
    }

    fn name(&self, table: &VerifiedTable) -> String {
        target_name(&self.config, table)
            .unwrap_or_else(|_| format!("{}_{}", table.schema, table.name))
    }

    /// The table's columns, or `None` when the sink has not created it.
    async fn shape(&self, table: &VerifiedTable) -> Result<Option<Shape>, VerifyReadError> {
        let name = target_name(&self.config, table)?;
        let rows = self
            .client
            .query(
                "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod)
                 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                &[&self.config.target_schema, &name],
            )
            .await
            .map_err(pg("read the columns of a warehouse table"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let columns: HashMap<String, (u32, String)> = rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    (r.get::<_, u32>(1), r.get::<_, String>(2)),
                )
            })
            .collect();
        let deleted = MetaColumns::new(&self.config.meta_column_prefix).deleted;
        let tombstones = columns.contains_key(&deleted).then_some(deleted);
        Ok(Some(Shape {
            qualified: format!(
                "{}.{}",
                quote_ident(&self.config.target_schema),
                quote_ident(&name)
            ),
            columns,
            tombstones,
        }))
    }

    fn live(shape: &Shape) -> String {
        match &shape.tombstones {
            Some(deleted) => format!("NOT {}", quote_ident(deleted)),
            None => "true".into(),
        }
    }
}

/// The warehouse table of `table`, as the sink names it; a name over 63
/// bytes, which the sink refuses (its changes are dead letters), is said
/// so with the setting that shortens it.
fn target_name(config: &PostgresConfig, table: &VerifiedTable) -> Result<String, VerifyReadError> {
    let format = &config.table_name_format;
    expand_name(format, &table.topic, &table.schema, &table.name).ok_or_else(|| {
        VerifyReadError::Config(format!(
            "the warehouse table of {}.{} from table.name.format {format:?} would be longer than PostgreSQL's 63 bytes, so the sink dead-letters its changes: set table.name.format so that it fits (e.g. \"${{table}}\")",
            table.schema, table.name
        ))
    })
}

#[async_trait]
impl VerifyReader for PostgresVerifyReader {
    fn location(&self, table: &VerifiedTable) -> String {
        format!("table {}.{}", self.config.target_schema, self.name(table))
    }

    async fn fetch(
        &self,
        table: &VerifiedTable,
        rows: &[RowKey<'_>],
    ) -> Result<Fetched, VerifyReadError> {
        let Some(shape) = self.shape(table).await? else {
            return Ok(Fetched {
                rows: vec![None; rows.len()],
                form: StoredForm::WIRE,
            });
        };
        // Source columns the warehouse lacks read as null (and so differ where the source has a value).
        let present: Vec<&str> = table
            .columns
            .iter()
            .map(|(c, _)| c.as_str())
            .filter(|c| shape.columns.contains_key(stored_identifier(c)))
            .collect();
        let keys = table.key_names();
        // In the types' output form, as the source is read.
        let select = keys
            .iter()
            .chain(present.iter())
            .map(|c| output_text_of("t", c))
            .collect::<Vec<_>>()
            .join(", ");
        let key_params: Vec<Vec<&str>> = (0..keys.len())
            .map(|i| rows.iter().map(|r| r.text[i].as_str()).collect())
            .collect();
        let (filter, params) = key_filter(&shape, &keys, &key_params)?;
        let sql = format!(
            "SELECT {select} FROM {} t WHERE {} AND {filter}",
            shape.qualified,
            Self::live(&shape)
        );
        let found = self
            .client
            .query(&sql, &params)
            .await
            .map_err(pg("read rows of a warehouse table"))?;
        let mut by_key: HashMap<Vec<String>, StoredRow> = HashMap::with_capacity(found.len());
        for r in &found {
            let key: Vec<String> = (0..keys.len())
                .map(|i| r.get::<_, Option<String>>(i).unwrap_or_default())
                .collect();
            let mut row = Map::with_capacity(present.len());
            for (j, column) in present.iter().enumerate() {
                let text: Option<&str> = r.get(keys.len() + j);
                let v = match text {
                    None => Value::Null,
                    Some(t) => self
                        .types
                        .to_json(shape.columns[stored_identifier(column)].0, t),
                };
                row.insert((*column).to_owned(), v);
            }
            by_key.insert(key, StoredRow::Json(row));
        }
        // Values are mapped back to the wire form by the warehouse's types.
        Ok(Fetched {
            rows: rows.iter().map(|r| by_key.remove(r.text)).collect(),
            form: StoredForm::WIRE,
        })
    }

    async fn count(&self, table: &VerifiedTable) -> Result<u64, VerifyReadError> {
        let Some(shape) = self.shape(table).await? else {
            return Ok(0);
        };
        let row = self
            .client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE {}",
                    shape.qualified,
                    Self::live(&shape)
                ),
                &[],
            )
            .await
            .map_err(pg("count rows of a warehouse table"))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn scan_keys(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyReadError> {
        let Some(shape) = self.shape(table).await? else {
            return Ok((Vec::new(), None));
        };
        let keys = table.key_names();
        // Qualified: a bare name in ORDER BY would pick the `::text` output column.
        let list = keys
            .iter()
            .map(|c| format!("t.{}", quote_ident(c)))
            .collect::<Vec<_>>()
            .join(", ");
        let select = keys
            .iter()
            .map(|c| format!("{}::text", quote_ident(c)))
            .collect::<Vec<_>>()
            .join(", ");
        let after: Vec<String> = match &cursor {
            Some(c) => serde_json::from_str(c)
                .map_err(|e| VerifyReadError::Target(format!("bad scan cursor: {e}")))?,
            None => Vec::new(),
        };
        let mut sql = format!(
            "SELECT {select} FROM {} t WHERE {}",
            shape.qualified,
            Self::live(&shape)
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
        if !after.is_empty() {
            let bound = keys
                .iter()
                .enumerate()
                .map(|(i, k)| Ok(format!("${}::text::{}", i + 1, column_type(&shape, k)?)))
                .collect::<Result<Vec<_>, VerifyReadError>>()?
                .join(", ");
            sql.push_str(&format!(" AND ({list}) > ({bound})"));
            params.extend(after.iter().map(|s| s as &(dyn ToSql + Sync)));
        }
        sql.push_str(&format!(" ORDER BY {list} LIMIT {PAGE}"));
        let rows = self
            .client
            .query(&sql, &params)
            .await
            .map_err(pg("scan keys of a warehouse table"))?;
        let page: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                (0..keys.len())
                    .map(|i| r.get::<_, Option<String>>(i).unwrap_or_default())
                    .collect()
            })
            .collect();
        let next = if page.len() < PAGE {
            None
        } else {
            page.last().map(|k| Value::from(k.clone()).to_string())
        };
        Ok((page, next))
    }

    async fn positions(
        &self,
        _partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, VerifyReadError> {
        let sql = format!(
            "SELECT topic, partition, next_offset FROM {}.{} WHERE group_id = $1",
            quote_ident(&self.config.target_schema),
            quote_ident(&self.config.positions_table)
        );
        match self.client.query(&sql, &[&self.group]).await {
            Ok(rows) => Ok(rows
                .iter()
                .map(|r| {
                    (
                        TopicPartition::new(r.get::<_, String>(0), r.get::<_, i32>(1)),
                        r.get::<_, i64>(2),
                    )
                })
                .collect()),
            // The sink has not created its positions table yet: nothing applied.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Ok(HashMap::new())
            }
            Err(e) => Err(pg("read the warehouse positions")(e)),
        }
    }
}

fn column_type(shape: &Shape, column: &str) -> Result<String, VerifyReadError> {
    shape
        .columns
        .get(stored_identifier(column))
        .map(|(_, t)| t.clone())
        .ok_or_else(|| {
            VerifyReadError::Target(format!(
                "warehouse table {} has no key column {column}",
                shape.qualified
            ))
        })
}

/// `(k1, k2) IN (SELECT ... FROM unnest($1, $2))` with the keys cast to the
/// warehouse key types, so the lookup uses the primary key index.
fn key_filter<'a>(
    shape: &Shape,
    keys: &[&str],
    values: &'a [Vec<&'a str>],
) -> Result<(String, Vec<&'a (dyn ToSql + Sync)>), VerifyReadError> {
    let list = keys
        .iter()
        .map(|c| format!("t.{}", quote_ident(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let casts = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Ok(format!("u.k{}::{}", i + 1, column_type(shape, k)?)))
        .collect::<Result<Vec<_>, VerifyReadError>>()?
        .join(", ");
    let unnest = (1..=keys.len())
        .map(|i| format!("${i}::text[]"))
        .collect::<Vec<_>>()
        .join(", ");
    let names = (1..=keys.len())
        .map(|i| format!("k{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let params = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    Ok((
        format!("({list}) IN (SELECT {casts} FROM unnest({unnest}) AS u({names}))"),
        params,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table name the sink cannot create is said so, naming the setting,
    /// instead of a query PostgreSQL refuses ("db error").
    #[test]
    fn a_warehouse_name_over_63_bytes_names_table_name_format() {
        let config = PostgresConfig::new("postgres://x@h/db");
        let table = |name: &str| VerifiedTable {
            topic: format!("p.shop.{name}"),
            schema: "shop".into(),
            name: name.into(),
            columns: Vec::new(),
            key: Vec::new(),
        };
        assert_eq!(
            target_name(&config, &table("orders")).ok().as_deref(),
            Some("shop_orders")
        );
        let err = target_name(&config, &table(&"t".repeat(64)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("table.name.format") && err.contains("63 bytes"),
            "{err}"
        );
    }
}
