//! Kafka record keys and values in the layout Debezium's connectors write
//! through Kafka Connect's JSON converter (docs/design.md, "Wire format"):
//! with schemas enabled each key and value is `{"schema": ..., "payload":
//! ...}`, otherwise just the payload.
//!
//! Capture must sustain tens of thousands of events per second on two
//! cores, so a [`TableEncoder`] does the expensive work once per table shape
//! (a source's [`TableShape`]: serialising the schemas, escaping names) and
//! then writes each payload straight into a byte buffer, each value by its
//! column's [`ColumnType`], which the source provides.
//!
//! Column values ([`Cell`]): SQL NULL is `null`; a value not in the change
//! (an unchanged TOASTed value) is the string `UNAVAILABLE_VALUE`, never
//! null, so sinks keep what they store; an old row that carries only its
//! key has nulls for the other columns and they are written as nulls. Bytes
//! no type mapping applies to are written as base64 strings.

mod columns;
mod error;
mod message;
mod schema;
pub(crate) use schema::{common_source_fields, field as schema_field};
mod shape;
mod source;

use std::sync::Arc;

use base64::Engine as _;
use oncely_core::wire::UNAVAILABLE_VALUE;
use serde_json::Value;

use crate::json::{write_i64, write_str};

pub use columns::{checked_action, Characters, ColumnAction, ColumnPolicy, ColumnSettings, Mask};
pub use error::EnvelopeError;
pub use message::message_record;
pub use shape::{Cell, ColumnShape, ColumnType, Row, SourceType, TableShape, Unrepresentable};

use shape::NoRow;
use source::SourceWriter;

/// `source.version`: the oncely release that wrote the record.
pub const SOURCE_VERSION: &str = env!("CARGO_PKG_VERSION");

pub use oncely_core::wire::{HEADER_POSITION, HEADER_SCHEMA, HEADER_TABLE};

/// The text of [`HEADER_POSITION`] for `src`.
pub fn position_header(src: &SourcePosition) -> Vec<u8> {
    format!("{}/{}", src.commit_lsn, src.event_seq).into_bytes()
}

/// Settings shared by every table's encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeConfig {
    /// `topic.prefix`: first part of every topic and schema name, and
    /// `source.name`.
    pub topic_prefix: String,
    /// `topic.name.mapping`: tables whose topic is not the default one.
    pub topic_mapping: std::collections::BTreeMap<String, String>,
    /// `source.db`.
    pub database: String,
    /// Wrap keys and values in `{"schema", "payload"}`.
    pub schemas_enable: bool,
    /// Which columns are published, and masked how (`column.*`).
    pub columns: ColumnPolicy,
}

pub use oncely_core::wire::Op;

/// `source.snapshot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotMarker {
    /// A streamed change.
    False,
    /// A row of an initial snapshot.
    True,
    /// The last row of an initial snapshot.
    Last,
    /// A row of an incremental (chunked, watermarked) snapshot.
    Incremental,
}

impl SnapshotMarker {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMarker::False => "false",
            SnapshotMarker::True => "true",
            SnapshotMarker::Last => "last",
            SnapshotMarker::Incremental => "incremental",
        }
    }
}

/// Where an event comes from; becomes the `source` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePosition {
    pub tx_id: u32,
    /// The event's own WAL position (`source.lsn`).
    pub lsn: u64,
    /// Commit LSN of its transaction; with `event_seq` the version sinks
    /// order rows by. Snapshot rows use their chunk's high watermark.
    pub commit_lsn: u64,
    /// Ordinal of the event inside its transaction, from 1.
    pub event_seq: u64,
    /// Commit time in ms since the Unix epoch (`source.ts_ms`).
    pub commit_ts_ms: i64,
    pub snapshot: SnapshotMarker,
}

/// A source's own `source` block, written from the core's position of
/// each record: what a [`TableEncoder`] built with
/// [`TableEncoder::with_source_block`] writes on every path (changes,
/// snapshot rows, truncates), so the router names no source.
///
/// Contract: `write` appends one JSON object matching the encoder's source
/// schema; it never fails.
pub trait SourceBlock: std::fmt::Debug + Send + Sync {
    fn write(&self, out: &mut Vec<u8>, src: &SourcePosition);
}

/// Which parts of a table's records are written without their
/// `{"schema":..,"payload":` head and closing `}`, the payload alone: the
/// parts an Avro converter turns into Avro, which registers a schema once
/// and never needs its ~3 kB of JSON per record again. The record carries
/// the [`Heads`] instead, and a part sent as JSON after all is made whole
/// ([`Heads::whole`]) before it is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadsApart {
    pub key: bool,
    pub value: bool,
}

/// The heads a record's key and value were written without (`None`: the
/// part is whole), shared by every record of a table shape, so that a
/// known head is told by its pointer.
#[derive(Debug, Clone, Default)]
pub struct Heads {
    pub key: Option<Arc<[u8]>>,
    pub value: Option<Arc<[u8]>>,
}

impl Heads {
    /// The whole record of `payload` written apart from `head`: what the
    /// encoder writes when nothing is apart.
    pub fn whole(head: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(head.len() + payload.len() + 1);
        out.extend_from_slice(head);
        out.extend_from_slice(payload);
        out.push(b'}');
        out
    }
}

/// One column as the encoder writes it.
#[derive(Debug, Clone)]
struct ColumnEncoder {
    name: String,
    /// `"<name>":`, escaped.
    label: Vec<u8>,
    ty: Arc<dyn ColumnType>,
    /// Its position in a row (excluded columns are not written).
    source: usize,
    /// Applied to every value before it is written (`column.mask.*`).
    mask: Option<Mask>,
    chars: Characters,
}

/// Which source columns a table's fields are (docs/design.md, "Schema
/// changes"): written into the Connect schema so that a sink can tell a
/// renamed column from a dropped one and a new one, without reading the
/// schema-change topic. Extra schema parameters, which Debezium consumers
/// ignore: [`PARAM_ATTNUM`] on each row field, [`PARAM_TABLE_OID`] and
/// [`PARAM_DROPPED_ATTNUMS`] on the `before`/`after` row structs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceIdentity {
    /// The table's oid (a partitioned table's root): a table dropped and
    /// created again under its name has another.
    pub table_oid: u32,
    /// `attnum` of each Relation column, in the Relation's order (`None`
    /// when it could not be told).
    pub attnums: Vec<Option<i16>>,
    /// `attnum`s of the table's dropped columns (never reused).
    pub dropped: Vec<i16>,
}

/// Field parameter: the column's `attnum`, stable across RENAME and ALTER
/// TYPE and never reused by PostgreSQL.
pub const PARAM_ATTNUM: &str = "__oncely.attnum";
/// Row-struct parameter: the source table's oid.
pub const PARAM_TABLE_OID: &str = "__oncely.table.oid";
/// Row-struct parameter: the table's dropped columns' `attnum`s, comma
/// separated (empty when none).
pub const PARAM_DROPPED_ATTNUMS: &str = "__oncely.dropped.attnums";

/// Field parameters of `column.propagate.source.type` (Debezium's names).
pub const PARAM_SOURCE_TYPE: &str = "__debezium.source.column.type";
pub const PARAM_SOURCE_LENGTH: &str = "__debezium.source.column.length";
pub const PARAM_SOURCE_SCALE: &str = "__debezium.source.column.scale";
pub const PARAM_SOURCE_NAME: &str = "__debezium.source.column.name";

/// Record builder for one shape of one table; build a new one whenever a
/// Relation message changes the shape.
#[derive(Debug, Clone)]
pub struct TableEncoder {
    /// `schema.table`, for error messages.
    table: String,
    /// Bytes of the schema name at the start of `table` (tombstone headers
    /// name schema and table apart; either may contain dots).
    schema_len: usize,
    topic: String,
    /// The columns written, excluded ones left out.
    columns: Vec<ColumnEncoder>,
    /// Positions of the key columns in `columns`.
    key_indices: Vec<usize>,
    /// Cells of a row: the table's columns, excluded ones included.
    width: usize,
    /// `{"schema":<key schema>,"payload":` or empty.
    key_head: Arc<[u8]>,
    /// `{"schema":<value schema>,"payload":` or empty.
    value_head: Arc<[u8]>,
    /// `}` closing the wrapper, or empty.
    tail: &'static [u8],
    /// The parts written without their head and tail ([`HeadsApart`]).
    apart: HeadsApart,
    source: SourceWriter,
    /// The source's own block, when it has one (else `source`'s).
    block: Option<Arc<dyn SourceBlock>>,
    /// Typical payload size (the head aside), to size buffers in one allocation.
    value_capacity: usize,
}

impl TableEncoder {
    /// Prepares the encoder for `shape`, whose value schema also says which
    /// source columns the fields are when `identity` is given
    /// ([`SourceIdentity`]). Each source builds the shape of its tables
    /// (PostgreSQL: `TableEncoder::identified` from a Relation). The
    /// columns `cfg.columns` excludes are never written and those it masks
    /// are written masked, whatever path a row takes; a policy the table
    /// cannot take (a key column excluded or masked, a mask on a column
    /// without character data) is an error naming the column.
    pub fn from_shape(
        shape: &TableShape,
        cfg: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<Self, EnvelopeError> {
        Self::with_source_schema(shape, cfg, identity, schema::source_schema())
    }

    /// [`TableEncoder::from_shape`] for a source whose `source` block is its
    /// own: `source_schema` is its Connect struct (named `source`), and its
    /// records are written by [`TableEncoder::value_with_source_into`],
    /// which the source hands the block's fields.
    pub fn with_source_schema(
        shape: &TableShape,
        cfg: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
        source_schema: Value,
    ) -> Result<Self, EnvelopeError> {
        let table = format!("{}.{}", shape.namespace, shape.name);
        let (columns, key_indices) = column_encoders(shape, &cfg.columns)?;
        let (key_head, value_head, tail) = if cfg.schemas_enable {
            let parts = SchemaParts {
                shape,
                columns: &columns,
                key: &key_indices,
                identity,
            };
            schema_heads(&parts, cfg, source_schema)
        } else {
            (Vec::new(), Vec::new(), &b""[..])
        };
        let (key_head, value_head): (Arc<[u8]>, Arc<[u8]>) = (key_head.into(), value_head.into());

        let value_capacity = 320 + 48 * columns.len() * 2;
        Ok(Self {
            topic: crate::naming::table_topic(
                &cfg.topic_prefix,
                &cfg.topic_mapping,
                &shape.namespace,
                &shape.name,
            ),
            source: SourceWriter::new(cfg, &shape.namespace, &shape.name),
            block: None,
            schema_len: shape.namespace.len(),
            table,
            columns,
            key_indices,
            width: shape.columns.len(),
            key_head,
            value_head,
            tail,
            apart: HeadsApart::default(),
            value_capacity,
        })
    }

    /// This encoder writing the parts `apart` names as their payload alone,
    /// when schemas are enabled ([`HeadsApart`]); [`TableEncoder::heads`]
    /// are then what they were written without. Truncate values stay whole.
    pub fn with_heads_apart(mut self, apart: HeadsApart) -> Self {
        if !self.tail.is_empty() {
            self.apart = apart;
        }
        self
    }

    /// The heads of the parts this encoder writes apart.
    pub fn heads(&self) -> Heads {
        Heads {
            key: self.apart.key.then(|| Arc::clone(&self.key_head)),
            value: self.apart.value.then(|| Arc::clone(&self.value_head)),
        }
    }

    /// The head and tail written around a key's (`true`) or a value's payload.
    fn wrapper(&self, is_key: bool) -> (&[u8], &[u8]) {
        match (is_key, self.apart) {
            (true, HeadsApart { key: true, .. }) | (false, HeadsApart { value: true, .. }) => {
                (b"", b"")
            }
            (true, _) => (&self.key_head, self.tail),
            (false, _) => (&self.value_head, self.tail),
        }
    }

    /// [`TableEncoder::with_source_schema`] whose records' `source` block
    /// `block` writes on every path ([`SourceBlock`]).
    pub fn with_source_block(
        shape: &TableShape,
        cfg: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
        source_schema: Value,
        block: Arc<dyn SourceBlock>,
    ) -> Result<Self, EnvelopeError> {
        let mut encoder = Self::with_source_schema(shape, cfg, identity, source_schema)?;
        encoder.block = Some(block);
        Ok(encoder)
    }

    /// Appends the `source` block of a record at `src`.
    fn write_source(&self, out: &mut Vec<u8>, src: &SourcePosition) {
        match &self.block {
            Some(block) => block.write(out, src),
            None => self.source.write(out, src, Some(src.tx_id)),
        }
    }

    /// The source schema and table of the events.
    pub fn source_names(&self) -> (&str, &str) {
        (
            &self.table[..self.schema_len],
            &self.table[self.schema_len + 1..],
        )
    }

    /// `<prefix>.<schema>.<table>`, with characters Kafka does not allow in
    /// topic names replaced by `_` (as Debezium does), or the table's
    /// `topic.name.mapping` entry ([`crate::naming::table_topic`]).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Names of the key columns, in key order.
    pub fn key_column_names(&self) -> impl Iterator<Item = &str> {
        self.key_indices
            .iter()
            .map(|&i| self.columns[i].name.as_str())
    }

    /// The record key: a JSON object of the key columns of `row` (a new
    /// tuple, or the old tuple of a delete).
    pub fn key<R: Row + ?Sized>(&self, row: &R) -> Result<Vec<u8>, EnvelopeError> {
        let head = self.wrapper(true).0.len();
        let mut out = Vec::with_capacity(head + 16 * self.key_indices.len() + 8);
        self.key_into(row, &mut out)?;
        Ok(out)
    }

    /// [`TableEncoder::key`] appending to a caller's buffer (reusable,
    /// since the Kafka producer copies the bytes).
    pub fn key_into<R: Row + ?Sized>(
        &self,
        row: &R,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        self.check_len(row)?;
        let (head, tail) = self.wrapper(true);
        out.extend_from_slice(head);
        out.push(b'{');
        for (n, &i) in self.key_indices.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let col = &self.columns[i];
            let cell = row.cell(col.source);
            if cell == Cell::Unavailable {
                return Err(EnvelopeError::KeyValueUnavailable {
                    table: self.table.clone(),
                    column: col.name.clone(),
                });
            }
            out.extend_from_slice(&col.label);
            self.write_value(col, cell, out)?;
        }
        out.push(b'}');
        out.extend_from_slice(tail);
        Ok(())
    }

    /// The record value: the change envelope. `now_ms` is the top-level
    /// `ts_ms` (when the event was processed), passed in so records are
    /// reproducible.
    pub fn value<R: Row + ?Sized>(
        &self,
        op: Op,
        before: Option<&R>,
        after: Option<&R>,
        src: &SourcePosition,
        now_ms: i64,
    ) -> Result<Vec<u8>, EnvelopeError> {
        let mut out = Vec::with_capacity(self.wrapper(false).0.len() + self.value_capacity);
        self.value_into(op, before, after, src, now_ms, &mut out)?;
        Ok(out)
    }

    /// [`TableEncoder::value`] appending to a caller's buffer.
    pub fn value_into<R: Row + ?Sized>(
        &self,
        op: Op,
        before: Option<&R>,
        after: Option<&R>,
        src: &SourcePosition,
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        let write_source = |out: &mut Vec<u8>| self.write_source(out, src);
        self.value_with_source_into(op, before, after, write_source, now_ms, out)
    }

    /// The change envelope with a `source` block `write_source` appends
    /// (one JSON object matching the encoder's source schema, see
    /// [`TableEncoder::with_source_schema`]); on an error `out` is as it was.
    pub fn value_with_source_into<R: Row + ?Sized>(
        &self,
        op: Op,
        before: Option<&R>,
        after: Option<&R>,
        write_source: impl FnOnce(&mut Vec<u8>),
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        let start = out.len();
        let result = self.write_envelope(op, before, after, write_source, now_ms, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Value of a truncate event: op `t`, no row images. Truncate records
    /// have no key (the caller sends a null key).
    pub fn truncate_value(&self, src: &SourcePosition, now_ms: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.value_head.len() + 320);
        // Without rows nothing can fail; the error arm is unreachable.
        let write_source = |out: &mut Vec<u8>| self.write_source(out, src);
        if self
            .write_envelope::<NoRow>(Op::Truncate, None, None, write_source, now_ms, &mut out)
            .is_err()
        {
            out.clear();
        }
        match self.heads().value {
            Some(head) => Heads::whole(&head, &out),
            None => out,
        }
    }

    fn write_envelope<R: Row + ?Sized>(
        &self,
        op: Op,
        before: Option<&R>,
        after: Option<&R>,
        write_source: impl FnOnce(&mut Vec<u8>),
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        let (head, tail) = self.wrapper(false);
        out.extend_from_slice(head);
        out.extend_from_slice(b"{\"before\":");
        self.write_row(before, out)?;
        out.extend_from_slice(b",\"after\":");
        self.write_row(after, out)?;
        out.extend_from_slice(b",\"source\":");
        write_source(out);
        out.extend_from_slice(b",\"transaction\":null,\"op\":\"");
        out.extend_from_slice(op.code().as_bytes());
        out.extend_from_slice(b"\",\"ts_ms\":");
        write_i64(out, now_ms);
        out.push(b'}');
        out.extend_from_slice(tail);
        Ok(())
    }

    fn write_row<R: Row + ?Sized>(
        &self,
        row: Option<&R>,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        let Some(row) = row else {
            out.extend_from_slice(b"null");
            return Ok(());
        };
        self.check_len(row)?;
        out.push(b'{');
        for (i, col) in self.columns.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&col.label);
            self.write_value(col, row.cell(col.source), out)?;
        }
        out.push(b'}');
        Ok(())
    }

    fn write_value(
        &self,
        col: &ColumnEncoder,
        value: Cell<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), EnvelopeError> {
        match value {
            Cell::Null => out.extend_from_slice(b"null"),
            Cell::Unavailable => write_str(out, UNAVAILABLE_VALUE),
            Cell::Text(bytes) => {
                let text = std::str::from_utf8(bytes).map_err(|_| EnvelopeError::InvalidUtf8 {
                    table: self.table.clone(),
                    column: col.name.clone(),
                })?;
                // Masked first: no error below may quote the original.
                let text = match &col.mask {
                    Some(mask) => mask.apply(text, col.chars),
                    None => std::borrow::Cow::Borrowed(text),
                };
                let text = text.as_ref();
                col.ty.write_json(text, out).map_err(|_| {
                    let (field, fix) = col.ty.refusal_help();
                    EnvelopeError::Unrepresentable {
                        table: self.table.clone(),
                        column: col.name.clone(),
                        value: text.chars().take(200).collect(),
                        field,
                        fix,
                    }
                })?;
            }
            Cell::Binary(bytes) => match &col.mask {
                Some(mask) => {
                    write_str(out, &mask.apply(&String::from_utf8_lossy(bytes), col.chars))
                }
                None => write_str(
                    out,
                    &base64::engine::general_purpose::STANDARD.encode(bytes),
                ),
            },
        }
        Ok(())
    }

    fn check_len<R: Row + ?Sized>(&self, row: &R) -> Result<(), EnvelopeError> {
        if row.width() != self.width {
            return Err(EnvelopeError::ColumnCount {
                table: self.table.clone(),
                expected: self.width,
                got: row.width(),
            });
        }
        Ok(())
    }
}

/// One encoder per column `policy` keeps, its JSON label (`"name":`)
/// written once and its mask; and the key's positions among them.
fn column_encoders(
    shape: &TableShape,
    policy: &ColumnPolicy,
) -> Result<(Vec<ColumnEncoder>, Vec<usize>), EnvelopeError> {
    let mut columns = Vec::with_capacity(shape.columns.len());
    let mut key = shape.key.clone();
    for (i, c) in shape.columns.iter().enumerate() {
        let key_position = shape.key.iter().position(|&k| k == i);
        let chars = c.ty.characters();
        let (ns, name) = (&shape.namespace, &shape.name);
        let kept = checked_action(policy, ns, name, &c.name, key_position.is_some(), chars)
            .map_err(|reason| EnvelopeError::ColumnPolicy {
                table: format!("{ns}.{name}"),
                reason,
            })?;
        // Excluded: a key column never is (checked above).
        let Some(mask) = kept else { continue };
        if let Some(k) = key_position {
            key[k] = columns.len();
        }
        let mut label = Vec::with_capacity(c.name.len() + 3);
        write_str(&mut label, &c.name);
        label.push(b':');
        columns.push(ColumnEncoder {
            name: c.name.clone(),
            label,
            ty: Arc::clone(&c.ty),
            source: i,
            mask,
            chars,
        });
    }
    Ok((columns, key))
}

/// What the schemas are built from: the table, the columns written and the
/// key's positions among them, and the source identity if any.
#[derive(Clone, Copy)]
struct SchemaParts<'a> {
    shape: &'a TableShape,
    columns: &'a [ColumnEncoder],
    key: &'a [usize],
    identity: Option<&'a SourceIdentity>,
}

/// The `{"schema": ..., "payload":` heads of the key and the value, and the
/// tail that closes them, for `schemas.enable`.
fn schema_heads(
    parts: &SchemaParts<'_>,
    cfg: &EnvelopeConfig,
    source_schema: Value,
) -> (Vec<u8>, Vec<u8>, &'static [u8]) {
    let SchemaParts {
        shape,
        columns,
        key,
        identity,
    } = *parts;
    let base_name = format!("{}.{}.{}", cfg.topic_prefix, shape.namespace, shape.name);
    let key_fields = key
        .iter()
        .map(|&i| {
            let c = &columns[i];
            let mut field = c.ty.field_schema(&c.name, false);
            propagate_source_type(&mut field, shape, c, &cfg.columns);
            field
        })
        .collect();
    // Only key columns are declared required: pgoutput does not say which
    // columns are NOT NULL.
    let row_fields = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut field = c.ty.field_schema(&c.name, !key.contains(&i));
            if let Some((name, value)) = c.mask.as_ref().and_then(|m| m.schema_parameter(c.chars)) {
                schema::add_parameter(&mut field, name, value);
            }
            propagate_source_type(&mut field, shape, c, &cfg.columns);
            if let Some(attnum) = identity.and_then(|id| id.attnums.get(c.source).copied()?) {
                schema::add_parameter(&mut field, PARAM_ATTNUM, attnum.to_string());
            }
            field
        })
        .collect();
    let row_parameters = identity.map(|id| {
        let dropped: Vec<String> = id.dropped.iter().map(i16::to_string).collect();
        serde_json::json!({
            PARAM_TABLE_OID: id.table_oid.to_string(),
            PARAM_DROPPED_ATTNUMS: dropped.join(","),
        })
    });
    (
        wrapper_head(&schema::key_schema(&base_name, key_fields)),
        wrapper_head(&schema::value_schema(
            &base_name,
            row_fields,
            row_parameters,
            source_schema,
        )),
        b"}",
    )
}

/// Debezium's `PropagateSourceMetadataToSchemaParameter`, for a column the
/// policy names: the type, its length and scale where declared, and the
/// column's name, in that order after the field's own parameters (a
/// parameter the mapping already wrote, as NUMERIC's, is set in place).
/// Debezium also adds `__debezium.source.column.comment`; sources do not
/// read comments.
fn propagate_source_type(
    field: &mut Value,
    shape: &TableShape,
    c: &ColumnEncoder,
    policy: &ColumnPolicy,
) {
    let Some(ty) = c.ty.source_type() else {
        return;
    };
    if !policy.propagates(&shape.namespace, &shape.name, &c.name, &ty.name) {
        return;
    }
    schema::add_parameter(field, PARAM_SOURCE_TYPE, ty.name);
    if let Some(length) = ty.length {
        schema::add_parameter(field, PARAM_SOURCE_LENGTH, length.to_string());
    }
    if let Some(scale) = ty.scale {
        schema::add_parameter(field, PARAM_SOURCE_SCALE, scale.to_string());
    }
    schema::add_parameter(field, PARAM_SOURCE_NAME, c.name.clone());
}

/// `{"schema":<schema>,"payload":` — the payload and a closing `}` follow.
fn wrapper_head(schema: &Value) -> Vec<u8> {
    let mut out = b"{\"schema\":".to_vec();
    out.extend_from_slice(schema.to_string().as_bytes());
    out.extend_from_slice(b",\"payload\":");
    out
}
