//! The form of an index's values (`value.format`, `json.handling.mode`),
//! the mapping of a column in that form, and a row's document in it.
//!
//! Under `value.format = "native"` (the default) a document carries what
//! its readers query (the conversions are [`crate::native`]'s) and each
//! column is mapped from its Connect schema. Each column type's document value and mapping are listed once, in
//! `docs/sinks/native-values.md`. Columns without a native form (integers,
//! text, intervals, bytea as base64, ...) are written as capture writes them
//! and mapped dynamically, as are all columns of schemaless topics (no
//! schema: nothing to derive a type from).
//!
//! **Dates Elasticsearch cannot index.** `date` holds milliseconds (the
//! index keeps a timestamp's microseconds only in `_source`), and a value it
//! cannot parse — `infinity`, `-infinity`, a year beyond its range — is
//! kept exactly in `_source` and left out of the field's index
//! (`ignore_malformed`), as non-finite floats are. So is a decimal beyond
//! `double`'s range or `NaN`. `date_nanos` is not used: it refuses every
//! date before 1970.
//!
//! **An index keeps its form.** The form an index was created in is
//! recorded in its `_meta.oncely` mark; the sink writes an index of its own
//! in that form whatever the settings say now, and an index an older
//! version created (a mark without `value.format`) in the wire form its
//! mapping was made for. Indexes that are not the sink's (a template's, made
//! by hand) get the configured form.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use oncely_core::wire::UNAVAILABLE_VALUE;

use super::config::{ElasticsearchConfig, JsonMode};
use crate::event::row_fields;
use crate::native::{Kind, ValueFormat};
use crate::verify_reader::StoredForm;

/// The `_meta.oncely` key recording [`ValueFormat`].
const META_VALUE_FORMAT: &str = "value.format";
/// The `_meta.oncely` key recording [`JsonMode`].
const META_JSON_MODE: &str = "json.handling.mode";

/// The form of one index's values; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// `value.format`.
    pub values: ValueFormat,
    /// `json.handling.mode` (under `native` only).
    pub json: JsonMode,
}

impl Format {
    /// The configured form: that of the indexes the sink creates from now on.
    pub fn of_config(config: &ElasticsearchConfig) -> Self {
        Self {
            values: config.value_format,
            json: config.json_mode,
        }
    }

    /// The form recorded in an index's `_meta.oncely` mark. A mark without
    /// `value.format` was made before native values: wire.
    pub fn of_mark(mark: &Value) -> Self {
        Self {
            values: recorded(mark, META_VALUE_FORMAT).unwrap_or(ValueFormat::Wire),
            json: recorded(mark, META_JSON_MODE).unwrap_or(JsonMode::Text),
        }
    }

    /// The `_meta.oncely` mark of an index created in this form.
    pub fn mark(self) -> Value {
        json!({
            "floating_point": "double",
            META_VALUE_FORMAT: self.values.as_str(),
            META_JSON_MODE: self.json.as_str(),
        })
    }

    /// How this form stores values, as verify and the other sinks tell it.
    pub fn stored_form(self) -> StoredForm {
        StoredForm {
            values: self.values,
            nest_json: self.json != JsonMode::Text,
            json_arrays_as_text: true,
        }
    }

    /// How a column of Connect schema `field` is converted; `None`: not.
    pub fn kind(self, field: &Value) -> Option<Kind> {
        self.stored_form().kind(field)
    }

    /// The mapping of a column of Connect schema `field`; `None`: dynamic.
    pub fn field_mapping(self, field: &Value) -> Option<Value> {
        let ty = field.get("type").and_then(Value::as_str)?;
        if ty == "array" {
            return self.field_mapping(field.get("items")?);
        }
        let floating = |t: &str| json!({"type": t, "ignore_malformed": true});
        match ty {
            "float" | "float32" => return Some(floating("float")),
            "double" | "float64" => return Some(floating("double")),
            _ if self.values == ValueFormat::Wire => return None,
            _ => {}
        }
        let name = field.get("name").and_then(Value::as_str).unwrap_or("");
        let source_type = field
            .get("parameters")
            .and_then(|p| p.get("__debezium.source.column.type"))
            .and_then(Value::as_str);
        Some(match name {
            "io.debezium.time.Date"
            | "io.debezium.time.MicroTimestamp"
            | "io.debezium.time.ZonedTimestamp" => json!({
                "type": "date",
                "format": "strict_date_optional_time",
                "ignore_malformed": true
            }),
            "io.debezium.time.MicroTime"
            | "io.debezium.time.ZonedTime"
            | "io.debezium.data.Uuid"
            | "io.debezium.data.Enum" => json!({"type": "keyword"}),
            "io.debezium.data.Json" => match self.json {
                // Long leaves stay in `_source` unindexed rather than refuse
                // the document (a keyword term holds 32766 bytes).
                JsonMode::Flattened => json!({"type": "flattened", "ignore_above": 8191}),
                JsonMode::Object => json!({"type": "object"}),
                JsonMode::Text => return None,
            },
            // MySQL's names carry attributes: `DECIMAL UNSIGNED ZEROFILL`.
            _ if ty == "string"
                && matches!(
                    source_type.and_then(|t| t.split(' ').next()),
                    Some("NUMERIC" | "DECIMAL" | "MONEY")
                ) =>
            {
                json!({
                    "type": "double",
                    "ignore_malformed": true,
                    "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}
                })
            }
            _ => return None,
        })
    }
}

/// A setting recorded in a mark; `None` when absent (or unknown).
fn recorded<T: serde::de::DeserializeOwned>(mark: &Value, key: &str) -> Option<T> {
    serde_json::from_value(mark.get(key)?.clone()).ok()
}

/// The converted columns of a value schema, in one form.
pub type Columns = Vec<(String, Kind)>;

/// A row's document and the names of the columns left out of it.
pub type Document<'a> = (Cow<'a, Map<String, Value>>, Vec<String>);

/// The columns `format` converts, of the row schema in `schema`.
pub fn columns(schema: Option<&Value>, format: Format) -> Columns {
    row_fields(schema)
        .map(|fields| format.stored_form().columns(fields))
        .unwrap_or_default()
}

/// The document of a row: its values converted by `columns`, without the
/// values marked unavailable (unchanged TOAST), whose names come second.
/// Borrowed when nothing changes. `Err` names a JSON column whose value a
/// `flattened` or `object` field cannot hold (not an object), and the fix.
pub fn document<'a>(
    row: &'a Map<String, Value>,
    columns: &Columns,
) -> Result<Document<'a>, String> {
    let missing: Vec<String> = row
        .iter()
        .filter(|(_, v)| v.as_str() == Some(UNAVAILABLE_VALUE))
        .map(|(k, _)| k.clone())
        .collect();
    let mut converted: Vec<(&String, Value)> = Vec::new();
    for (name, kind) in columns {
        let Some(v) = row.get(name) else {
            continue;
        };
        if v.is_null() || missing.contains(name) {
            continue;
        }
        let new = kind.convert(v);
        if kind.is_json() && !objects_only(&new) {
            return Err(not_an_object(name));
        }
        if let Cow::Owned(new) = new {
            converted.push((name, new));
        }
    }
    if missing.is_empty() && converted.is_empty() {
        return Ok((Cow::Borrowed(row), missing));
    }
    let mut doc = row.clone();
    for k in &missing {
        doc.remove(k);
    }
    for (name, value) in converted {
        doc.insert(name.clone(), value);
    }
    Ok((Cow::Owned(doc), missing))
}

/// Whether a `flattened` or `object` field holds `v`: an object, or an
/// array (at any depth) of objects and nulls.
fn objects_only(v: &Value) -> bool {
    match v {
        Value::Object(_) | Value::Null => true,
        Value::Array(items) => items.iter().all(objects_only),
        _ => false,
    }
}

fn not_an_object(column: &str) -> String {
    format!(
        "column `{column}` holds JSON that is not an object (a scalar, or an array of \
         scalars), which the index's `flattened`/`object` field cannot hold: set \
         `sink.json.handling.mode = \"text\"` to index JSON columns as text (a new index, \
         or a reindex: an index keeps the form it was created in)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(json: JsonMode) -> Format {
        Format {
            values: ValueFormat::Native,
            json,
        }
    }

    fn schema(columns: Value) -> Value {
        json!({"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": columns}]})
    }

    #[test]
    fn columns_map_to_typed_fields() {
        let f = native(JsonMode::Flattened);
        let m = |field: Value| f.field_mapping(&field);
        let date = m(json!({"type": "int32", "name": "io.debezium.time.Date"})).expect("date");
        assert_eq!(date["type"], "date");
        assert_eq!(date["ignore_malformed"], true);
        for name in [
            "io.debezium.time.MicroTimestamp",
            "io.debezium.time.ZonedTimestamp",
        ] {
            assert_eq!(
                m(json!({"type": "int64", "name": name})).expect(name)["type"],
                "date"
            );
        }
        for name in [
            "io.debezium.time.MicroTime",
            "io.debezium.data.Uuid",
            "io.debezium.data.Enum",
        ] {
            assert_eq!(
                m(json!({"type": "string", "name": name})).expect(name)["type"],
                "keyword"
            );
        }
        let n = m(
            json!({"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC"}}),
        )
        .expect("numeric");
        assert_eq!(n["type"], "double");
        assert_eq!(n["fields"]["keyword"]["type"], "keyword");
        let unsigned = m(json!({"type": "string",
            "parameters": {"__debezium.source.column.type": "DECIMAL UNSIGNED ZEROFILL"}}))
        .expect("MySQL's decimal with its attributes");
        assert_eq!(unsigned["type"], "double");
        let j = json!({"type": "string", "name": "io.debezium.data.Json"});
        assert_eq!(m(j.clone()).expect("json")["type"], "flattened");
        assert_eq!(
            native(JsonMode::Object).field_mapping(&j).expect("object")["type"],
            "object"
        );
        assert_eq!(native(JsonMode::Text).field_mapping(&j), None);
        assert_eq!(
            m(
                json!({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}})
            ),
            Some(date)
        );
        assert_eq!(m(json!({"type": "int64"})), None);
        assert_eq!(m(json!({"type": "string"})), None);
        // Wire: only the floating-point fields, as before native values.
        let wire = Format {
            values: ValueFormat::Wire,
            json: JsonMode::Text,
        };
        assert_eq!(
            wire.field_mapping(&json!({"type": "int32", "name": "io.debezium.time.Date"})),
            None
        );
        assert_eq!(
            wire.field_mapping(&json!({"type": "double"}))
                .expect("double")["type"],
            "double"
        );
    }

    #[test]
    fn marks_record_the_form_and_old_marks_are_wire() {
        let f = native(JsonMode::Object);
        assert_eq!(Format::of_mark(&f.mark()), f);
        // The mark of an index created before native values.
        let old = json!({"floating_point": "double"});
        assert_eq!(Format::of_mark(&old).values, ValueFormat::Wire);
        assert_eq!(
            Format::of_mark(&old).kind(&json!({"type": "int32", "name": "io.debezium.time.Date"})),
            None
        );
    }

    #[test]
    fn documents_carry_native_values_and_leave_unavailable_ones_out() {
        let s = schema(json!([
            {"field": "id", "type": "int32"},
            {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
            {"field": "j", "type": "string", "name": "io.debezium.data.Json"},
            {"field": "big", "type": "string", "name": "io.debezium.data.Json"}
        ]));
        let cols = columns(Some(&s), native(JsonMode::Flattened));
        let row = json!({"id": 1, "d": 20454, "j": "{\"a\": 1}", "big": UNAVAILABLE_VALUE});
        let row = row.as_object().expect("object");
        let (doc, missing) = document(row, &cols).expect("document");
        assert_eq!(
            Value::Object(doc.into_owned()),
            json!({"id": 1, "d": "2026-01-01", "j": {"a": 1}})
        );
        assert_eq!(missing, vec!["big".to_owned()]);
        // JSON a flattened field cannot hold is refused with the fix.
        let scalar = json!({"id": 2, "j": "[1, \"two\"]"});
        let e = document(scalar.as_object().expect("object"), &cols).expect_err("array of scalars");
        assert!(e.contains("`j`") && e.contains("json.handling.mode"), "{e}");
        let arrays = json!({"id": 2, "j": "[{\"a\": 1}, null]"});
        assert!(document(arrays.as_object().expect("object"), &cols).is_ok());
        // Text: the JSON stays text; wire: nothing converts.
        let text = columns(Some(&s), native(JsonMode::Text));
        let (doc, _) = document(scalar.as_object().expect("object"), &text).expect("text");
        assert_eq!(doc["j"], "[1, \"two\"]");
        let wire = Format {
            values: ValueFormat::Wire,
            json: JsonMode::Flattened,
        };
        let plain = json!({"id": 3, "d": 1});
        let (doc, _) =
            document(plain.as_object().expect("object"), &columns(Some(&s), wire)).expect("wire");
        assert!(matches!(doc, Cow::Borrowed(_)));
    }
}
