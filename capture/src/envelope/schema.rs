//! Kafka Connect schemas of the key and value, built once per relation.
//!
//! They are `serde_json::Value`s here because they are built rarely (on a
//! Relation message); the encoder serialises them once and then copies the
//! bytes into every record.

use serde_json::{json, Value};

/// Connect name of the `source` block's struct.
pub const SOURCE_SCHEMA_NAME: &str = "io.debezium.connector.postgresql.Source";

/// Values the `snapshot` field may take, as Debezium declares them.
const SNAPSHOT_ALLOWED: &str = "true,last,false,incremental";

/// A field of a Connect struct schema.
pub(crate) fn field(ty: &str, optional: bool, name: &str) -> Value {
    json!({"type": ty, "optional": optional, "field": name})
}

/// The fields every Debezium connector's `source` struct begins with, its
/// `snapshot` enum allowing `snapshot_allowed`; each source adds its own.
pub(crate) fn common_source_fields(snapshot_allowed: &str) -> Vec<Value> {
    vec![
        field("string", false, "version"),
        field("string", false, "connector"),
        field("string", false, "name"),
        field("int64", false, "ts_ms"),
        json!({
            "type": "string",
            "optional": true,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": snapshot_allowed},
            "default": "false",
            "field": "snapshot"
        }),
        field("string", false, "db"),
        field("string", true, "sequence"),
    ]
}

/// The `source` struct: Debezium's PostgreSQL fields plus oncely's
/// `commit_lsn` and `event_seq`, which sinks use to version rows.
pub fn source_schema() -> Value {
    let mut fields = common_source_fields(SNAPSHOT_ALLOWED);
    fields.extend([
        field("string", false, "schema"),
        field("string", false, "table"),
        field("int64", true, "txId"),
        field("int64", true, "lsn"),
        field("int64", true, "xmin"),
        field("int64", true, "commit_lsn"),
        field("int64", true, "event_seq"),
    ]);
    json!({
        "type": "struct",
        "fields": fields,
        "optional": false,
        "name": SOURCE_SCHEMA_NAME,
        "field": "source"
    })
}

/// Debezium's transaction metadata block; we always send it as null.
fn transaction_schema() -> Value {
    json!({
        "type": "struct",
        "fields": [
            field("string", false, "id"),
            field("int64", false, "total_order"),
            field("int64", false, "data_collection_order"),
        ],
        "optional": true,
        "name": "event.block",
        "version": 1,
        "field": "transaction"
    })
}

/// `<prefix>.<schema>.<table>.Key`: the key columns, none optional.
pub fn key_schema(base_name: &str, fields: Vec<Value>) -> Value {
    json!({
        "type": "struct",
        "fields": fields,
        "optional": false,
        "name": format!("{base_name}.Key")
    })
}

/// Adds `key = value` to a field schema's `parameters`, keeping Connect's
/// key order (`parameters` before `field`).
pub fn add_parameter(field: &mut Value, key: &str, value: String) {
    let Some(map) = field.as_object_mut() else {
        return;
    };
    if let Some(params) = map.get_mut("parameters").and_then(Value::as_object_mut) {
        params.insert(key.into(), Value::String(value));
        return;
    }
    let name = map.remove("field");
    map.insert("parameters".into(), json!({ key: value }));
    if let Some(name) = name {
        map.insert("field".into(), name);
    }
}

/// `<prefix>.<schema>.<table>.Envelope` around two `.Value` row structs,
/// which carry `row_parameters` (the source identity) when given, and the
/// source's own `source` struct.
pub fn value_schema(
    base_name: &str,
    row_fields: Vec<Value>,
    row_parameters: Option<Value>,
    source: Value,
) -> Value {
    let row = |field_name: &str| {
        let mut row = json!({
            "type": "struct",
            "fields": row_fields.clone(),
            "optional": true,
            "name": format!("{base_name}.Value"),
        });
        if let Some(p) = &row_parameters {
            row["parameters"] = p.clone();
        }
        row["field"] = json!(field_name);
        row
    };
    json!({
        "type": "struct",
        "fields": [
            row("before"),
            row("after"),
            source,
            transaction_schema(),
            field("string", false, "op"),
            field("int64", true, "ts_ms"),
        ],
        "optional": false,
        "name": format!("{base_name}.Envelope"),
        "version": 1
    })
}

/// Key of a logical decoding message record.
pub fn message_key_schema() -> Value {
    json!({
        "type": "struct",
        "fields": [field("string", false, "prefix")],
        "optional": false,
        "name": "io.debezium.connector.postgresql.MessageKey"
    })
}

/// Value of a logical decoding message record (op `m`).
pub fn message_value_schema() -> Value {
    json!({
        "type": "struct",
        "fields": [
            field("string", false, "op"),
            field("int64", true, "ts_ms"),
            source_schema(),
            {
                "type": "struct",
                "fields": [
                    field("string", false, "prefix"),
                    field("bytes", true, "content"),
                ],
                "optional": false,
                "name": "io.debezium.connector.postgresql.Message",
                "field": "message"
            },
        ],
        "optional": false,
        "name": "io.debezium.connector.postgresql.MessageValue"
    })
}
