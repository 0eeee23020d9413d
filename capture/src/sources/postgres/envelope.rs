//! PostgreSQL's tables as the envelope writes them: a Relation and the type
//! registry give a [`TableShape`] whose columns write pgoutput's text values
//! by their [`ValueKind`] (a pgoutput tuple is the core's row image, a [`Row`]).

#[cfg(test)]
mod golden;
mod source_type;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde_json::Value;

use super::pgoutput::{Relation, ReplicaIdentity};
use super::value::{TypeRegistry, ValueKind};
use crate::envelope::{
    Characters, ColumnShape, ColumnType, EnvelopeConfig, EnvelopeError, SourceIdentity, SourceType,
    TableEncoder, TableShape, Unrepresentable,
};

/// A PostgreSQL column: its kind and its type modifier (`numeric(p,s)`,
/// `varchar(n)`, ... name their parameters in the field's schema).
#[derive(Debug)]
struct PgColumn {
    kind: ValueKind,
    type_modifier: i32,
    /// The type whose length and scale the column has: its own, a
    /// domain's base type's.
    size_oid: u32,
    /// `pg_type.typname` without its schema (`None`: an OID the registry
    /// does not know).
    type_name: Option<String>,
}

impl ColumnType for PgColumn {
    fn field_schema(&self, field: &str, optional: bool) -> Value {
        self.kind.field_schema(self.type_modifier, field, optional)
    }

    fn write_json(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Unrepresentable> {
        self.kind.write_json(text, out).map_err(|_| Unrepresentable)
    }

    fn refusal_help(&self) -> (&'static str, &'static str) {
        refusal_help(&self.kind)
    }

    fn characters(&self) -> Characters {
        self.kind.characters(self.type_modifier)
    }

    fn source_type(&self) -> Option<SourceType> {
        let name = self.type_name.as_deref()?.to_uppercase();
        let (length, scale) = source_type::debezium_size(self.size_oid, self.type_modifier);
        Some(SourceType {
            name,
            length,
            scale: Some(scale),
        })
    }
}

impl TableEncoder {
    /// Prepares the encoder for `rel`.
    ///
    /// The key is `key_columns` when given (`message.key.columns`, or the
    /// primary key read from the catalog), else the columns pgoutput flags
    /// as replica identity. Under REPLICA IDENTITY FULL pgoutput flags every
    /// column, which would make the whole row the key (a key that changes on
    /// every update breaks per-key ordering and compaction), so such a table
    /// needs `key_columns`.
    #[cfg(test)]
    pub fn new(
        rel: &Relation,
        reg: &TypeRegistry,
        key_columns: Option<&[String]>,
        cfg: &EnvelopeConfig,
    ) -> Result<Self, EnvelopeError> {
        Self::identified(rel, reg, key_columns, cfg, None)
    }

    /// [`TableEncoder::new`] whose value schema also says which source
    /// columns the fields are ([`SourceIdentity`]).
    pub fn identified(
        rel: &Relation,
        reg: &TypeRegistry,
        key_columns: Option<&[String]>,
        cfg: &EnvelopeConfig,
        identity: Option<&SourceIdentity>,
    ) -> Result<Self, EnvelopeError> {
        Self::from_shape(&table_shape(rel, reg, key_columns)?, cfg, identity)
    }
}

/// The shape of `rel` with the key [`TableEncoder::new`] describes.
fn table_shape(
    rel: &Relation,
    reg: &TypeRegistry,
    key_columns: Option<&[String]>,
) -> Result<TableShape, EnvelopeError> {
    let table = format!("{}.{}", rel.namespace, rel.name);
    let key = key_indices(rel, key_columns, &table)?;
    let columns = rel
        .columns
        .iter()
        .map(|c| ColumnShape {
            name: c.name.clone(),
            ty: Arc::new(PgColumn {
                kind: reg.value_kind(c.type_oid),
                type_modifier: c.type_modifier,
                size_oid: reg.base_oid(c.type_oid),
                type_name: reg.get(c.type_oid).map(|t| unqualified(&t.name).to_owned()),
            }),
        })
        .collect();
    Ok(TableShape {
        namespace: rel.namespace.clone(),
        name: rel.name.clone(),
        columns,
        key,
    })
}

/// A registry name without its schema (`public.mood` -> `mood`), as
/// Debezium names a type.
fn unqualified(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(_, n)| n)
}

/// The positions of the key columns: `key_columns` when configured, else the
/// relation's replica identity key. A table must have one, and a `FULL`
/// identity has no key to name (see [`TableEncoder::new`]).
fn key_indices(
    rel: &Relation,
    key_columns: Option<&[String]>,
    table: &str,
) -> Result<Vec<usize>, EnvelopeError> {
    let key_indices = match key_columns {
        Some(names) => names
            .iter()
            .map(|n| {
                rel.columns
                    .iter()
                    .position(|c| &c.name == n)
                    .ok_or_else(|| EnvelopeError::UnknownKeyColumn {
                        table: table.to_string(),
                        column: n.clone(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None if rel.replica_identity == ReplicaIdentity::Full => {
            return Err(EnvelopeError::FullIdentityNeedsKeyColumns {
                table: table.to_string(),
            })
        }
        None => rel.key_indices().collect(),
    };
    if key_indices.is_empty() {
        return Err(EnvelopeError::NoKeyColumns {
            table: table.to_string(),
        });
    }
    Ok(key_indices)
}

/// The field and the fix named when a value of `kind` is refused.
fn refusal_help(kind: &ValueKind) -> (&'static str, &'static str) {
    match kind {
        ValueKind::Array { element, .. } => refusal_help(element),
        ValueKind::MicroDuration => (
            "io.debezium.time.MicroDuration (int64 µs)",
            "set interval.handling.mode = \"string\" in the capture config (exact ISO-8601 intervals, any size), restart capture, then snapshot the table (oncely capture snapshot --table ...) to bring the refused rows to the targets",
        ),
        ValueKind::MicroTimestamp => (
            "io.debezium.time.MicroTimestamp (int64 µs since 1970, up to 294247-01-10 04:00:54.775806)",
            "timestamps from 294247-01-10 04:00:54.775807 on do not fit; store such values as timestamptz (a string field) or bring them into range, then snapshot the table (oncely capture snapshot --table ...)",
        ),
        _ => (
            "its integer field",
            "bring the value into the field's range, then snapshot the table",
        ),
    }
}
