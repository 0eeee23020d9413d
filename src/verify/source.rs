//! The source side: the captured tables, read in primary-key order in pages
//! (keyset pagination, so memory stays bounded and each page is an index
//! range scan), each value mapped to the JSON capture would put on the wire.

use std::sync::Arc;

use oncely_capture::catalog::mysql::{self, Cell, ColumnShape, MappingConfig, TableShape};
use oncely_capture::catalog::{
    checked_action, Characters, ColumnPolicy, Mask, TypeRegistry, ValueKind, FILTER_SEARCH_PATH,
};
use oncely_capture::config::CaptureConfig;
use oncely_sinks::debezium::DebeziumColumn;
use serde_json::{Map, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::VerifyError;

use oncely_core::wire::SESSION_OPTIONS;

/// One column of a captured table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    /// How its values map to JSON (capture's mapping).
    pub kind: ColumnKind,
    /// PostgreSQL: `format_type(atttypid, atttypmod)`, to cast key text
    /// back in queries; MySQL: `information_schema`'s `COLUMN_TYPE`.
    pub sql_type: String,
    /// Capture's mask of its values (`column.mask.*`, `column.truncate.*`),
    /// applied to the source's values before they are compared.
    pub mask: Option<Mask>,
    pub chars: Characters,
}

/// Whose mapping a column's values take: each source keeps its own.
#[derive(Debug, Clone)]
pub enum ColumnKind {
    /// PostgreSQL's type registry.
    Postgres(ValueKind),
    /// Debezium's MySQL mapping of the column's shape, in capture's modes.
    Mysql(Box<MysqlColumn>),
}

/// A MySQL column: its shape, the mapping's modes, and how the sinks hold
/// what that mapping writes (they turn Debezium's encodings into oncely's
/// wire form: decimals as text, times in µs, bits as a bit string).
#[derive(Debug, Clone)]
pub struct MysqlColumn {
    pub shape: ColumnShape,
    pub mapping: MappingConfig,
    pub held: DebeziumColumn,
}

impl MysqlColumn {
    pub fn new(shape: ColumnShape, mapping: MappingConfig) -> Self {
        let held = DebeziumColumn::new(&mysql::field_schema(&mapping, &shape, true));
        Self {
            shape,
            mapping,
            held,
        }
    }

    /// A cell as the sinks hold it; why not, where capture or the sinks
    /// would dead-letter its change.
    pub fn to_json(&self, cell: &Cell) -> Result<Value, String> {
        let mut v = mysql::to_json(&self.mapping, &self.shape, cell).map_err(|e| e.to_string())?;
        self.held.convert(&mut v)?;
        Ok(v)
    }
}

impl ColumnKind {
    /// The column's Connect field schema, as capture writes it
    /// (PostgreSQL) or as the sinks hold Debezium's (MySQL).
    pub fn field_schema(&self, name: &str) -> Value {
        match self {
            ColumnKind::Postgres(kind) => kind.field_schema(-1, name, true),
            ColumnKind::Mysql(column) => column.held.schema.clone(),
        }
    }
}

/// A captured table: its columns (in table order) and key columns.
#[derive(Debug, Clone)]
pub struct SourceTable {
    pub schema: String,
    pub name: String,
    pub columns: Vec<Column>,
    /// Indexes into `columns`, in key order.
    pub key: Vec<usize>,
    /// The Kafka topic capture writes it to.
    pub topic: String,
    /// Its row filter (`table.filter`): only matching rows are meant to be
    /// in the targets, so only they are read.
    pub filter: Option<String>,
    /// A MySQL table's shape, which its chunk reads and key look-ups take.
    pub mysql: Option<Arc<TableShape>>,
}

/// The columns of `t` capture publishes (`column.include.list` /
/// `column.exclude.list`), each with the mask capture applies; a setting
/// capture would refuse for the table is refused here too.
fn published_columns(
    policy: &ColumnPolicy,
    t: &oncely_capture::catalog::CapturedTable,
    types: &TypeRegistry,
    rows: &[tokio_postgres::Row],
) -> Result<Vec<Column>, VerifyError> {
    let mut columns = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        let kind = types.value_kind(r.get::<_, u32>(1));
        let chars = kind.characters(r.get(3));
        let is_key = t.key_columns.contains(&name);
        let kept = checked_action(policy, &t.schema, &t.name, &name, is_key, chars)
            .map_err(VerifyError::Source)?;
        if let Some(mask) = kept {
            columns.push(Column {
                name,
                kind: ColumnKind::Postgres(kind),
                sql_type: r.get(2),
                mask,
                chars,
            });
        }
    }
    Ok(columns)
}

impl SourceTable {
    /// `schema.table`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The key columns' names, in key order.
    pub fn key_names(&self) -> Vec<&str> {
        self.key
            .iter()
            .map(|&i| self.columns[i].name.as_str())
            .collect()
    }

    /// What the queries read as `s`: the table, or its rows matching its
    /// row filter (a subquery, so a column the filter qualifies by the
    /// table's name still resolves).
    fn relation(&self) -> String {
        let table = format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name));
        match &self.filter {
            Some(filter) => format!("(SELECT * FROM {table} WHERE ({filter}))"),
            None => table,
        }
    }

    /// The key columns qualified by the alias `s`: a bare name in ORDER BY
    /// would pick the select list's `::text` column and order as text.
    fn key_list(&self) -> String {
        self.key_names()
            .iter()
            .map(|c| format!("s.{}", quote_ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Column `name` of alias `s` in its type's text output form
/// ([`output_text_of`]).
fn output_text(name: &str) -> String {
    output_text_of("s", name)
}

use oncely_core::sql::output_text_of;

/// One source row: its key (source text and wire JSON) and its wire row.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRow {
    /// Key values in PostgreSQL text form, in key order.
    pub key_text: Vec<String>,
    /// Key values as capture writes them, in key order.
    pub key_wire: Vec<Value>,
    /// Every column as capture writes it in `after` (nulls included).
    pub row: Map<String, Value>,
    /// A MySQL row's key cells, to read the next page after (empty for
    /// PostgreSQL, which pages by `key_text`).
    pub key_cells: Vec<Cell>,
}

impl SourceRow {
    /// The key as a JSON object, for reports.
    pub fn key_json(&self, table: &SourceTable) -> Value {
        Value::Object(
            table
                .key_names()
                .into_iter()
                .map(str::to_owned)
                .zip(self.key_wire.iter().cloned())
                .collect(),
        )
    }
}

/// A PostgreSQL source database as capture's configuration describes it.
pub struct PgSource {
    client: Client,
    types: TypeRegistry,
}

impl PgSource {
    /// Connects with capture's `database.*` settings and the session settings of
    /// its replication connection, and loads user types (enums, domains).
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, VerifyError> {
        let mut pg = oncely_capture::catalog::pg_config(cfg, "oncely-verify");
        pg.options(SESSION_OPTIONS);
        let client = oncely_capture::catalog::connect_with(cfg, &pg, "source")
            .await
            .map_err(|e| VerifyError::Source(format!("connect to the source database: {e}")))?;
        // Intervals as capture writes them: the ISO string or the µs.
        let mut types = TypeRegistry::builtin().with_interval_mode(cfg.interval_handling_mode);
        types
            .load_user_types(&client)
            .await
            .map_err(VerifyError::pg("read the source's user types"))?;
        Ok(Self { client, types })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The tables capture captures (its include/exclude lists and key columns).
    pub async fn tables(&self, cfg: &CaptureConfig) -> Result<Vec<SourceTable>, VerifyError> {
        let captured = oncely_capture::catalog::captured_tables(&self.client, cfg)
            .await
            .map_err(|e| VerifyError::Source(e.to_string()))?;
        self.describe(cfg, captured).await
    }

    /// [`Self::tables`] less the tables without a key, which capture sets
    /// aside (`oncely status` reports them from capture's offset record).
    pub async fn keyed_tables(&self, cfg: &CaptureConfig) -> Result<Vec<SourceTable>, VerifyError> {
        let selected = oncely_capture::catalog::selected_tables(&self.client, cfg)
            .await
            .map_err(|e| VerifyError::Source(e.to_string()))?;
        self.describe(cfg, selected.tables).await
    }

    async fn describe(
        &self,
        cfg: &CaptureConfig,
        captured: Vec<oncely_capture::catalog::CapturedTable>,
    ) -> Result<Vec<SourceTable>, VerifyError> {
        let policy = cfg
            .column_policy()
            .map_err(|e| VerifyError::Source(e.to_string()))?;
        let mut out = Vec::with_capacity(captured.len());
        for t in captured {
            // The columns pgoutput sends: stored generated ones from
            // PostgreSQL 18 on, virtual ones never.
            // Type names as format_type renders them under capture's
            // filter search_path: qualified unless built in, so the casts
            // of key text resolve the same under either path.
            let rows = self
                .query_confined(
                    true,
                    &format!(
                        "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), a.atttypmod
                         FROM pg_attribute a
                         WHERE a.attrelid = format('%I.%I', $1::text, $2::text)::regclass
                           AND a.attnum > 0 AND NOT a.attisdropped AND {}
                         ORDER BY a.attnum",
                        oncely_capture::catalog::PUBLISHED_COLUMN
                    ),
                    &[&t.schema, &t.name],
                )
                .await
                .map_err(VerifyError::pg("read the columns of a captured table"))?;
            let columns = published_columns(&policy, &t, &self.types, &rows)?;
            let key = t
                .key_columns
                .iter()
                .map(|k| {
                    columns.iter().position(|c| &c.name == k).ok_or_else(|| {
                        VerifyError::Source(format!(
                            "key column {k} of {}.{} does not exist",
                            t.schema, t.name
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.push(SourceTable {
                // Capture's own naming, mapping and replaced characters
                // included: the sinks name their targets after it.
                topic: cfg.table_topic(&t.schema, &t.name),
                filter: cfg.row_filter(&t.schema, &t.name).map(str::to_owned),
                schema: t.schema,
                name: t.name,
                columns,
                key,
                mysql: None,
            });
        }
        Ok(out)
    }

    /// The server's current WAL write position.
    pub async fn current_wal_lsn(&self) -> Result<u64, VerifyError> {
        let row = self
            .client
            .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
            .await
            .map_err(VerifyError::pg("read pg_current_wal_lsn()"))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// `sql`, and when `confined` as capture runs a filtered chunk: in a
    /// read-only transaction with names resolved among the built-in
    /// functions and operators only (`FILTER_SEARCH_PATH`), so a filter
    /// means what capture and the publication take it to mean, and a
    /// same-named function elsewhere on the path never runs as verify's role.
    async fn query_confined(
        &self,
        confined: bool,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        if !confined {
            return self.client.query(sql, params).await;
        }
        self.client
            .batch_execute(&format!(
                "BEGIN READ ONLY; SET LOCAL search_path = {FILTER_SEARCH_PATH}"
            ))
            .await?;
        let rows = self.client.query(sql, params).await;
        // Read-only: ending it either way changes nothing.
        let end = if rows.is_ok() { "COMMIT" } else { "ROLLBACK" };
        self.client.batch_execute(end).await?;
        rows
    }

    /// Up to `limit` rows with keys after `after` (from the start when `None`), in key order.
    pub async fn page(
        &self,
        table: &SourceTable,
        after: Option<&SourceRow>,
        limit: usize,
    ) -> Result<Vec<SourceRow>, VerifyError> {
        let after = after.map(|r| r.key_text.as_slice());
        let select = table
            .columns
            .iter()
            .map(|c| output_text(&c.name))
            .collect::<Vec<_>>()
            .join(", ");
        let keys = table.key_list();
        let mut sql = format!("SELECT {select} FROM {} s", table.relation());
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
        if let Some(after) = after {
            let bound = table
                .key
                .iter()
                .enumerate()
                .map(|(i, &c)| format!("${}::text::{}", i + 1, table.columns[c].sql_type))
                .collect::<Vec<_>>()
                .join(", ");
            sql.push_str(&format!(" WHERE ({keys}) > ({bound})"));
            params.extend(after.iter().map(|s| s as &(dyn ToSql + Sync)));
        }
        sql.push_str(&format!(" ORDER BY {keys} LIMIT {limit}"));
        let rows = self
            .query_confined(table.filter.is_some(), &sql, &params)
            .await
            .map_err(VerifyError::pg("read a page of a source table"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let texts: Vec<Option<&str>> = (0..table.columns.len()).map(|i| r.get(i)).collect();
                self.wire_row(table, &texts)
            })
            .collect())
    }

    /// A row from its columns' text, mapped as capture maps them.
    pub fn wire_row(&self, table: &SourceTable, texts: &[Option<&str>]) -> SourceRow {
        let row: Map<String, Value> = table
            .columns
            .iter()
            .zip(texts)
            .map(|(c, t)| {
                let v = match (t, &c.kind) {
                    (None, _) => Value::Null,
                    // A PostgreSQL table has no MySQL column.
                    (Some(t), ColumnKind::Mysql(..)) => Value::String((*t).to_owned()),
                    (Some(t), ColumnKind::Postgres(kind)) => match &c.mask {
                        None => kind.to_json(t),
                        // Masked as capture masks it: one implementation.
                        Some(mask) => kind.to_json(&mask.apply(t, c.chars)),
                    },
                };
                (c.name.clone(), v)
            })
            .collect();
        let key_text = table
            .key
            .iter()
            .map(|&i| texts[i].unwrap_or_default().to_owned())
            .collect();
        let key_wire = table
            .key
            .iter()
            .map(|&i| row[&table.columns[i].name].clone())
            .collect();
        SourceRow {
            key_text,
            key_wire,
            row,
            key_cells: Vec::new(),
        }
    }

    /// Of `keys` (key values in text form), those the table holds. A key whose
    /// text does not cast to the key column types cannot be there.
    pub async fn existing(
        &self,
        table: &SourceTable,
        keys: &[Vec<String>],
    ) -> Result<Vec<Vec<String>>, VerifyError> {
        match self.existing_batch(table, keys).await {
            Ok(found) => Ok(found),
            Err(e) if e.code().is_some_and(|c| c.code().starts_with("22")) => {
                // A key that is not valid text of the key type (class 22, data
                // exception): check one by one, the bad ones are absent.
                let mut found = Vec::new();
                for key in keys {
                    if let Ok(mut f) = self.existing_batch(table, std::slice::from_ref(key)).await {
                        found.append(&mut f);
                    }
                }
                Ok(found)
            }
            Err(e) => Err(VerifyError::pg("look up keys in a source table")(e)),
        }
    }

    async fn existing_batch(
        &self,
        table: &SourceTable,
        keys: &[Vec<String>],
    ) -> Result<Vec<Vec<String>>, tokio_postgres::Error> {
        let n = table.key.len();
        let columns: Vec<Vec<&str>> = (0..n)
            .map(|i| {
                keys.iter()
                    .map(|k| k.get(i).map(String::as_str).unwrap_or(""))
                    .collect()
            })
            .collect();
        let unnest = (1..=n)
            .map(|i| format!("${i}::text[]"))
            .collect::<Vec<_>>()
            .join(", ");
        let names = (1..=n).map(|i| format!("k{i}")).collect::<Vec<_>>();
        let casts = table
            .key
            .iter()
            .enumerate()
            .map(|(i, &c)| format!("u.k{}::{}", i + 1, table.columns[c].sql_type))
            .collect::<Vec<_>>()
            .join(", ");
        let select = table
            .key_names()
            .iter()
            .map(|c| output_text(c))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT {select} FROM {} s WHERE ({}) IN (SELECT {casts} FROM unnest({unnest}) AS u({}))",
            table.relation(),
            table.key_list(),
            names.join(", ")
        );
        let params: Vec<&(dyn ToSql + Sync)> =
            columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        let rows = self
            .query_confined(table.filter.is_some(), &sql, &params)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (0..n).map(|i| r.get::<_, String>(i)).collect())
            .collect())
    }
}

/// A PostgreSQL identifier, quoted (capture's one definition).
pub use oncely_capture::catalog::quote_ident;

pub use oncely_core::wire::format_lsn;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_text_matches_postgres() {
        assert_eq!(format_lsn(0x016B_3748), "0/16B3748");
        assert_eq!(format_lsn((3 << 32) | 0x10), "3/10");
    }
}
