//! Connect schemas (the JSON converter's `schema` object) to Avro schemas
//! and back, by Confluent's `AvroData` conventions (see the module above).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::names::{adjust, adjust_fullname, is_avro_name, NameAdjustment, NameMode};
use super::AvroError;

pub(super) const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";
pub(super) const DATE: &str = "org.apache.kafka.connect.data.Date";
pub(super) const TIME: &str = "org.apache.kafka.connect.data.Time";
pub(super) const TIMESTAMP: &str = "org.apache.kafka.connect.data.Timestamp";
/// `AvroData`'s precision of a decimal whose schema does not say.
const DEFAULT_DECIMAL_PRECISION: u64 = 64;
const PRECISION_PARAM: &str = "connect.decimal.precision";
/// `AvroData`'s name of a struct without one.
const DEFAULT_NAMESPACE: &str = "io.confluent.connect.avro";
const DEFAULT_RECORD: &str = "ConnectDefault";

/// A field property holding the Connect field name when
/// `field.name.adjustment.mode` changed it, so oncely's readers give the
/// record back exactly as its JSON twin (other readers see the adjusted name).
pub(super) const FIELD_NAME_PROP: &str = "oncely.field.name";

/// The Avro schema (as JSON) of a Connect schema, names not adjusted.
pub fn connect_to_avro(connect: &Value) -> Result<Value, AvroError> {
    connect_to_avro_adjusted(connect, NameAdjustment::default())
}

/// The Avro schema (as JSON) of a Connect schema, names adjusted as `names` says.
pub fn connect_to_avro_adjusted(
    connect: &Value,
    names: NameAdjustment,
) -> Result<Value, AvroError> {
    let mut to = ToAvro {
        names,
        ..ToAvro::default()
    };
    to.schema(connect, "")
}

/// Records defined so far: a second struct of the same name is a reference.
#[derive(Default)]
struct ToAvro {
    defined: HashMap<String, Value>,
    anonymous: usize,
    names: NameAdjustment,
}

fn schema_err(path: &str, message: impl std::fmt::Display) -> AvroError {
    let at = if path.is_empty() { "the root" } else { path };
    AvroError::Schema(format!("{at}: {message}"))
}

impl ToAvro {
    /// The Avro form of `s`, a union with null when optional.
    fn schema(&mut self, s: &Value, path: &str) -> Result<Value, AvroError> {
        let inner = self.required(s, path)?;
        if !s["optional"].as_bool().unwrap_or(false) {
            return Ok(inner);
        }
        // Avro's default is the first branch's: null first unless the
        // default is a value.
        Ok(match s.get("default") {
            Some(d) if !d.is_null() => json!([inner, "null"]),
            _ => json!(["null", inner]),
        })
    }

    fn required(&mut self, s: &Value, path: &str) -> Result<Value, AvroError> {
        let ty = s["type"]
            .as_str()
            .ok_or_else(|| schema_err(path, "no `type`"))?;
        let name = s["name"].as_str();
        let mut out = match ty {
            "struct" => return self.record(s, path),
            "array" => {
                let items = self.schema(&s["items"], &format!("{path}[]"))?;
                json!({"type": "array", "items": items})
            }
            "map" => {
                if s["keys"]["type"] != "string" || s["keys"]["optional"] == true {
                    return Err(schema_err(path, "a map whose keys are not strings"));
                }
                let values = self.schema(&s["values"], &format!("{path}{{}}"))?;
                json!({"type": "map", "values": values})
            }
            _ => primitive(ty, name, s, path)?,
        };
        let props = out.as_object_mut().expect("built as an object");
        connect_props(s, props, true);
        // A primitive without properties in its short form, as AvroData writes it.
        if props.len() == 1 && !matches!(ty, "array" | "map") {
            return Ok(props["type"].clone());
        }
        Ok(out)
    }

    fn record(&mut self, s: &Value, path: &str) -> Result<Value, AvroError> {
        let connect_name = s["name"].as_str();
        let full = match connect_name {
            Some(n) => adjust_fullname(n, self.names.schema),
            None => {
                self.anonymous += 1;
                let suffix = if self.anonymous == 1 {
                    String::new()
                } else {
                    self.anonymous.to_string()
                };
                format!("{DEFAULT_NAMESPACE}.{DEFAULT_RECORD}{suffix}")
            }
        };
        let mut fields = Vec::new();
        let mut taken = HashMap::new();
        for f in s["fields"].as_array().into_iter().flatten() {
            let name = f["field"]
                .as_str()
                .ok_or_else(|| schema_err(path, "a field without a name"))?;
            let avro_name = self.field_name(name, &full, path)?;
            if let Some(other) = taken.insert(avro_name.clone(), name) {
                return Err(schema_err(
                    path,
                    format!(
                        "fields `{other}` and `{name}` of `{full}` are both `{avro_name}` in Avro"
                    ),
                ));
            }
            let sub = if path.is_empty() {
                name.to_owned()
            } else {
                format!("{path}.{name}")
            };
            let mut field = Map::new();
            field.insert("name".into(), avro_name.clone().into());
            if avro_name != name {
                field.insert(FIELD_NAME_PROP.into(), name.into());
            }
            field.insert("type".into(), self.schema(f, &sub)?);
            if f["optional"] == true {
                field.insert(
                    "default".into(),
                    f.get("default").cloned().unwrap_or(Value::Null),
                );
            } else if let Some(d) = f.get("default") {
                field.insert("default".into(), d.clone());
            }
            fields.push(Value::Object(field));
        }
        let mut out = Map::new();
        out.insert("type".into(), "record".into());
        out.insert("name".into(), full.clone().into());
        out.insert("fields".into(), fields.into());
        // The Connect name when Avro's rules changed it; AvroData's own
        // record name is the Connect name.
        let keep_name = connect_name.is_some_and(|n| n != full);
        connect_props(s, &mut out, keep_name);
        let out = Value::Object(out);
        match self.defined.get(&full) {
            Some(first) if *first == out => Ok(Value::String(full)),
            Some(_) => Err(schema_err(
                path,
                format!("two different structs are named `{full}`"),
            )),
            None => {
                self.defined.insert(full, out.clone());
                Ok(out)
            }
        }
    }
}

impl ToAvro {
    /// The Avro name of field `name` of record `record`: adjusted, or
    /// refused naming the setting that would adjust it.
    fn field_name(&self, name: &str, record: &str, path: &str) -> Result<String, AvroError> {
        if is_avro_name(name) {
            return Ok(name.to_owned());
        }
        match self.names.field {
            NameMode::None => Err(schema_err(
                path,
                format!("field `{name}` of `{record}` is not a valid Avro name (letters, digits and `_`, not starting with a digit): set field.name.adjustment.mode = \"avro\" (or \"avro_unicode\") to adjust it"),
            )),
            mode => Ok(adjust(name, mode)),
        }
    }
}

fn primitive(ty: &str, name: Option<&str>, s: &Value, path: &str) -> Result<Value, AvroError> {
    let base = match ty {
        "int8" | "int16" => return Ok(json!({"type": "int", "connect.type": ty})),
        "int32" => "int",
        "int64" => "long",
        "float" | "float32" => "float",
        "double" | "float64" => "double",
        "boolean" => "boolean",
        "string" => "string",
        "bytes" => "bytes",
        other => return Err(schema_err(path, format!("unknown Connect type `{other}`"))),
    };
    Ok(match (base, name) {
        ("bytes", Some(DECIMAL)) => {
            let params = &s["parameters"];
            let scale = param_u64(params, "scale").unwrap_or(0);
            let precision = param_u64(params, PRECISION_PARAM).unwrap_or(DEFAULT_DECIMAL_PRECISION);
            json!({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale})
        }
        ("int", Some(DATE)) => json!({"type": "int", "logicalType": "date"}),
        ("int", Some(TIME)) => json!({"type": "int", "logicalType": "time-millis"}),
        ("long", Some(TIMESTAMP)) => json!({"type": "long", "logicalType": "timestamp-millis"}),
        _ => json!({ "type": base }),
    })
}

fn param_u64(params: &Value, key: &str) -> Option<u64> {
    params[key].as_str().and_then(|v| v.parse().ok())
}

/// `connect.*` properties of a Connect schema's name, version, doc and
/// parameters (the name only when `with_name`).
fn connect_props(s: &Value, out: &mut Map<String, Value>, with_name: bool) {
    if let Some(v) = s.get("version").filter(|v| !v.is_null()) {
        out.insert("connect.version".into(), v.clone());
    }
    if let Some(v) = s.get("doc").filter(|v| !v.is_null()) {
        out.insert("connect.doc".into(), v.clone());
    }
    if let Some(v) = s.get("parameters").filter(|v| !v.is_null()) {
        out.insert("connect.parameters".into(), v.clone());
    }
    if with_name {
        if let Some(n) = s.get("name").filter(|v| !v.is_null()) {
            out.insert("connect.name".into(), n.clone());
        }
    }
}

/// `avro` with every record, enum and fixed name (and each reference to
/// one) made a name apache_avro accepts, as [`adjust_fullname`] makes them.
/// Java's Avro lets a namespace such as Debezium's `my-server.public.t`
/// through (its converters take the topic prefix as it is); the names do
/// not change how a body decodes, and the Connect names come from the schema
/// as written.
pub(super) fn with_valid_names(avro: &Value) -> Value {
    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];
    let valid = |v: &Value| match v.as_str() {
        Some(n) if !n.is_empty() => Value::String(adjust_fullname(n, NameMode::Avro)),
        _ => v.clone(),
    };
    match avro {
        Value::String(s) if PRIMITIVES.contains(&s.as_str()) => avro.clone(),
        Value::String(_) => valid(avro),
        Value::Array(branches) => branches.iter().map(with_valid_names).collect(),
        Value::Object(o) => {
            let named = matches!(
                o.get("type").and_then(Value::as_str),
                Some("record" | "enum" | "fixed")
            );
            let mut out = o.clone();
            for (key, v) in out.iter_mut() {
                match key.as_str() {
                    "name" | "namespace" if named => *v = valid(v),
                    "type" | "items" | "values" => *v = with_valid_names(v),
                    "fields" => {
                        for field in v.as_array_mut().into_iter().flatten() {
                            if let Some(t) = field.get_mut("type") {
                                *t = with_valid_names(t);
                            }
                        }
                    }
                    _ => {}
                }
            }
            Value::Object(out)
        }
        _ => avro.clone(),
    }
}

/// The Connect schema of an Avro schema (as JSON): `AvroData`'s reverse,
/// for schemas oncely registered and those Debezium's Avro converter did.
pub fn avro_to_connect(avro: &Value) -> Result<Value, AvroError> {
    let mut names = HashMap::new();
    to_connect(avro, "", &mut names, "")
}

/// Walks `avro` in namespace `ns`; `names` holds the records defined so far.
fn to_connect(
    avro: &Value,
    ns: &str,
    names: &mut HashMap<String, Value>,
    path: &str,
) -> Result<Value, AvroError> {
    match avro {
        Value::String(s) => match primitive_to_connect(s, &Map::new()) {
            Some(c) => Ok(c),
            None => {
                lookup(s, ns, names).ok_or_else(|| schema_err(path, format!("unknown type `{s}`")))
            }
        },
        Value::Array(branches) => union_to_connect(branches, ns, names, path),
        Value::Object(o) => object_to_connect(o, ns, names, path),
        _ => Err(schema_err(path, "not an Avro schema")),
    }
}

fn lookup(name: &str, ns: &str, names: &HashMap<String, Value>) -> Option<Value> {
    if !name.contains('.') && !ns.is_empty() {
        if let Some(v) = names.get(&format!("{ns}.{name}")) {
            return Some(v.clone());
        }
    }
    names.get(name).cloned()
}

/// `[null, T]` or `[T, null]`: an optional `T`.
fn union_to_connect(
    branches: &[Value],
    ns: &str,
    names: &mut HashMap<String, Value>,
    path: &str,
) -> Result<Value, AvroError> {
    let others: Vec<&Value> = branches.iter().filter(|b| *b != "null").collect();
    match (others.as_slice(), branches.len()) {
        ([one], 2) => {
            let mut c = to_connect(one, ns, names, path)?;
            c["optional"] = true.into();
            Ok(c)
        }
        _ => Err(schema_err(
            path,
            "a union other than of null and one type (not supported yet)",
        )),
    }
}

fn primitive_to_connect(ty: &str, o: &Map<String, Value>) -> Option<Value> {
    let logical = o.get("logicalType").and_then(Value::as_str);
    let (cty, name) = match (ty, logical) {
        ("int", Some("date")) => ("int32", Some(DATE)),
        ("int", Some("time-millis")) => ("int32", Some(TIME)),
        ("long", Some("timestamp-millis")) => ("int64", Some(TIMESTAMP)),
        ("bytes", Some("decimal")) => ("bytes", Some(DECIMAL)),
        ("int", _) => match o.get("connect.type").and_then(Value::as_str) {
            Some("int8") => ("int8", None),
            Some("int16") => ("int16", None),
            _ => ("int32", None),
        },
        ("long", _) => ("int64", None),
        ("float", _) => ("float", None),
        ("double", _) => ("double", None),
        ("boolean", _) => ("boolean", None),
        ("string", _) => ("string", None),
        ("bytes", _) => ("bytes", None),
        _ => return None,
    };
    let mut c = Map::new();
    c.insert("type".into(), cty.into());
    c.insert("optional".into(), false.into());
    if let Some(n) = name {
        c.insert("name".into(), n.into());
        c.insert("version".into(), 1.into());
    }
    if name == Some(DECIMAL) {
        let scale = o.get("scale").and_then(Value::as_u64).unwrap_or(0);
        let mut params = Map::new();
        params.insert("scale".into(), scale.to_string().into());
        if let Some(p) = o.get("precision").and_then(Value::as_u64) {
            params.insert(PRECISION_PARAM.into(), p.to_string().into());
        }
        c.insert("parameters".into(), params.into());
    }
    from_connect_props(o, &mut c);
    Some(Value::Object(c))
}

/// Name, version, doc and parameters from `connect.*` properties (they win
/// over what the logical type implies).
fn from_connect_props(o: &Map<String, Value>, c: &mut Map<String, Value>) {
    for (prop, key) in [
        ("connect.name", "name"),
        ("connect.version", "version"),
        ("connect.doc", "doc"),
        ("connect.parameters", "parameters"),
        ("connect.default", "default"),
    ] {
        if let Some(v) = o.get(prop) {
            c.insert(key.into(), v.clone());
        }
    }
}

fn object_to_connect(
    o: &Map<String, Value>,
    ns: &str,
    names: &mut HashMap<String, Value>,
    path: &str,
) -> Result<Value, AvroError> {
    let ty = o.get("type").unwrap_or(&Value::Null);
    let Some(ty_str) = ty.as_str() else {
        // `{"type": {...}}` or `{"type": [...]}`: the inner schema.
        return to_connect(ty, ns, names, path);
    };
    if let Some(c) = primitive_to_connect(ty_str, o) {
        return Ok(c);
    }
    match ty_str {
        "record" => record_to_connect(o, ns, names, path),
        "array" => {
            let items = to_connect(&o["items"], ns, names, &format!("{path}[]"))?;
            let mut c = json!({"type": "array", "items": items, "optional": false});
            from_connect_props(o, c.as_object_mut().expect("object"));
            Ok(c)
        }
        "map" => {
            let values = to_connect(&o["values"], ns, names, &format!("{path}{{}}"))?;
            let mut c = json!({"type": "map", "keys": {"type": "string", "optional": false}, "values": values, "optional": false});
            from_connect_props(o, c.as_object_mut().expect("object"));
            Ok(c)
        }
        "enum" => Ok(json!({"type": "string", "optional": false})),
        "fixed" => Ok(json!({"type": "bytes", "optional": false})),
        other => lookup(other, ns, names)
            .ok_or_else(|| schema_err(path, format!("unknown type `{other}`"))),
    }
}

fn record_to_connect(
    o: &Map<String, Value>,
    ns: &str,
    names: &mut HashMap<String, Value>,
    path: &str,
) -> Result<Value, AvroError> {
    let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
    let full = match (
        name.contains('.'),
        o.get("namespace").and_then(Value::as_str),
    ) {
        (true, _) => name.to_owned(),
        (false, Some(n)) if !n.is_empty() => format!("{n}.{name}"),
        (false, _) if !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_owned(),
    };
    let inner_ns = full.rsplit_once('.').map_or("", |(n, _)| n).to_owned();
    let mut fields = Vec::new();
    for f in o
        .get("fields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let fname = f["name"].as_str().unwrap_or_default();
        let sub = if path.is_empty() {
            fname.to_owned()
        } else {
            format!("{path}.{fname}")
        };
        let mut c = to_connect(&f["type"], &inner_ns, names, &sub)?;
        if let Some(d) = f.get("default").filter(|d| !d.is_null()) {
            c["default"] = d.clone();
        }
        // The Connect name when capture adjusted it for Avro.
        let connect_name = f
            .get(FIELD_NAME_PROP)
            .and_then(Value::as_str)
            .unwrap_or(fname);
        c["field"] = connect_name.into();
        fields.push(c);
    }
    let mut c = Map::new();
    c.insert("type".into(), "struct".into());
    c.insert("fields".into(), fields.into());
    c.insert("optional".into(), false.into());
    if !full.starts_with(&format!("{DEFAULT_NAMESPACE}.{DEFAULT_RECORD}")) {
        c.insert("name".into(), full.clone().into());
    }
    from_connect_props(o, &mut c);
    let c = Value::Object(c);
    names.insert(full, c.clone());
    Ok(c)
}

/// Connect field name -> Avro field name, for the fields of `avro` whose
/// name capture adjusted (see [`FIELD_NAME_PROP`]).
pub(super) fn adjusted_fields(avro: &Value, out: &mut HashMap<String, String>) {
    match avro {
        Value::Array(items) => items.iter().for_each(|v| adjusted_fields(v, out)),
        Value::Object(o) => {
            if let (Some(Value::String(connect)), Some(Value::String(name))) =
                (o.get(FIELD_NAME_PROP), o.get("name"))
            {
                out.insert(connect.clone(), name.clone());
            }
            o.values().for_each(|v| adjusted_fields(v, out));
        }
        _ => {}
    }
}
