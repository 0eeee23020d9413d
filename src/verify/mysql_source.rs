//! The MySQL/MariaDB source side of verify: the captured tables from
//! `information_schema`, their rows through the MySQL source's own chunk
//! reads (the snapshot reader, without locks: a consistent read view per
//! table pass, primary-key order), each cell mapped by Debezium's MySQL
//! mapping in capture's modes (`decimal.handling.mode`, ...), as capture
//! and Debezium's MySQL connector write it.

use std::sync::Arc;

use oncely_capture::catalog::mysql::{
    Cell, MappingConfig, MySqlCatalog, MySqlOffset, MySqlSourceError, SnapshotReader, TableShape,
};
use oncely_capture::config::CaptureConfig;
use oncely_sinks::verify_reader::wire_text;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use super::source::{Column, ColumnKind, MysqlColumn, SourceRow, SourceTable};
use super::VerifyError;

fn source_error(e: MySqlSourceError) -> VerifyError {
    VerifyError::Source(e.to_string())
}

/// The binlog's end now as the order key of capture's offset records, in
/// the failover epoch of capture's stored offset (one up when it is another
/// server's, which capture takes over): what verify waits for capture to
/// cover, and what a sink's gap recovery waits for capture to pass.
pub async fn binlog_end_key(
    catalog: &mut MySqlCatalog,
    cfg: &CaptureConfig,
) -> Result<u64, VerifyError> {
    let stored = oncely_capture::catalog::read_stored_offset(cfg)
        .await
        .map_err(|e| VerifyError::Kafka(format!("read capture's offset: {e}")))?;
    let part = stored.as_ref().and_then(|o| MySqlOffset::read(o).ok());
    catalog
        .position_now_after(part.as_ref())
        .await
        .map_err(source_error)
}

/// A MySQL or MariaDB source (`source = "mysql"`).
pub struct MySqlSource {
    catalog: Mutex<MySqlCatalog>,
    /// The read of the table being paged through, opened by its first page.
    reading: Mutex<Option<SnapshotReader>>,
    mapping: MappingConfig,
}

impl MySqlSource {
    pub async fn connect(cfg: &CaptureConfig) -> Result<Self, VerifyError> {
        let catalog = MySqlCatalog::connect(cfg)
            .await
            .map_err(|e| VerifyError::Source(format!("connect to the source database: {e}")))?;
        Ok(Self {
            catalog: Mutex::new(catalog),
            reading: Mutex::new(None),
            mapping: cfg.mysql_mapping(),
        })
    }

    /// [`binlog_end_key`]: so that after a failover the wait for capture
    /// does not pass at once.
    pub async fn position_now(&self, cfg: &CaptureConfig) -> Result<u64, VerifyError> {
        binlog_end_key(&mut *self.catalog.lock().await, cfg).await
    }

    /// The tables capture captures, each named `database.table` (a MySQL
    /// database is the envelope's schema: `source.db`).
    pub async fn tables(&self, cfg: &CaptureConfig) -> Result<Vec<SourceTable>, VerifyError> {
        let shapes = self
            .catalog
            .lock()
            .await
            .captured_tables(cfg)
            .await
            .map_err(source_error)?;
        Ok(shapes
            .into_iter()
            .map(|shape| SourceTable {
                filter: None,
                topic: cfg.table_topic(&shape.database, &shape.table),
                schema: shape.database.clone(),
                name: shape.table.clone(),
                columns: shape
                    .columns
                    .iter()
                    .map(|c| Column {
                        name: c.name.clone(),
                        kind: ColumnKind::Mysql(Box::new(MysqlColumn::new(
                            c.clone(),
                            self.mapping,
                        ))),
                        sql_type: c.declared.clone().unwrap_or_default(),
                        // Capture's column settings are PostgreSQL's until
                        // the MySQL source publishes its own topics.
                        mask: None,
                        chars: oncely_capture::catalog::Characters::No,
                    })
                    .collect(),
                key: shape.primary_key.clone(),
                mysql: Some(Arc::new(shape)),
            })
            .collect())
    }

    /// Up to `limit` rows after `after` (from the start when `None`, in a
    /// new read view), in key order.
    pub async fn page(
        &self,
        table: &SourceTable,
        after: Option<&SourceRow>,
        limit: usize,
    ) -> Result<Vec<SourceRow>, VerifyError> {
        let shape = shape(table)?;
        let mut reading = self.reading.lock().await;
        if after.is_none() {
            if let Some(old) = reading.take() {
                old.finish().await.map_err(source_error)?;
            }
        }
        let reader = match reading.as_mut() {
            Some(r) => r,
            None => {
                let catalog = self.catalog.lock().await;
                reading.insert(catalog.read(shape).await.map_err(source_error)?)
            }
        };
        let chunk = reader
            .read_chunk(
                &shape.database,
                &shape.table,
                after.map(|r| r.key_cells.as_slice()),
                limit,
            )
            .await
            .map_err(source_error)?;
        if chunk.next.is_none() {
            if let Some(done) = reading.take() {
                done.finish().await.map_err(source_error)?;
            }
        }
        Ok(chunk
            .rows
            .iter()
            .map(|cells| self.wire_row(table, cells))
            .collect())
    }

    /// A row of cells as the sinks hold what Debezium's MySQL mapping
    /// writes. A value refused (its change dead-lettered) is null, so it
    /// differs.
    fn wire_row(&self, table: &SourceTable, cells: &[Cell]) -> SourceRow {
        let row: Map<String, Value> = table
            .columns
            .iter()
            .zip(cells)
            .map(|(col, cell)| {
                let v = match &col.kind {
                    ColumnKind::Mysql(my) => my.to_json(cell),
                    ColumnKind::Postgres(_) => Err("not a MySQL column".into()),
                };
                let v = v.unwrap_or_else(|e| {
                    tracing::warn!(table = %table.qualified(), column = %col.name, "{e}");
                    Value::Null
                });
                (col.name.clone(), v)
            })
            .collect();
        let key_wire: Vec<Value> = table
            .key
            .iter()
            .map(|&i| row[&table.columns[i].name].clone())
            .collect();
        SourceRow {
            key_text: key_wire
                .iter()
                .map(|v| wire_text(v).unwrap_or_default())
                .collect(),
            key_wire,
            key_cells: table.key.iter().map(|&i| cells[i].clone()).collect(),
            row,
        }
    }

    /// Of `keys` (a target's, as text), those the table holds.
    pub async fn existing(
        &self,
        table: &SourceTable,
        keys: &[Vec<String>],
    ) -> Result<Vec<Vec<String>>, VerifyError> {
        let shape = shape(table)?;
        let found = self
            .catalog
            .lock()
            .await
            .existing(shape, keys)
            .await
            .map_err(source_error)?;
        let texts: Vec<Vec<String>> = found
            .iter()
            .map(|cells| {
                table
                    .key
                    .iter()
                    .zip(cells)
                    .map(|(&i, cell)| match &table.columns[i].kind {
                        ColumnKind::Mysql(my) => my
                            .to_json(cell)
                            .ok()
                            .and_then(|v| wire_text(&v))
                            .unwrap_or_default(),
                        ColumnKind::Postgres(_) => String::new(),
                    })
                    .collect()
            })
            .collect();
        Ok(keys.iter().filter(|k| texts.contains(k)).cloned().collect())
    }
}

fn shape(table: &SourceTable) -> Result<&TableShape, VerifyError> {
    table
        .mysql
        .as_deref()
        .ok_or_else(|| VerifyError::Source(format!("{} is not a MySQL table", table.qualified())))
}
