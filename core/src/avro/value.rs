//! Connect JSON payloads to Avro values and back, walked along the Connect
//! schema (compiled once into a [`Node`] tree).

use apache_avro::types::Value as Avro;
use base64::Engine as _;
use serde_json::{Map, Number, Value};

mod text;

pub(super) use text::write_text;

use super::schema::DECIMAL;
use super::AvroError;
use crate::wire::UNAVAILABLE_VALUE;

/// One Connect schema, compiled.
#[derive(Debug)]
pub(super) struct Node {
    kind: Kind,
    /// The union branch of null when optional: 0 (`[null, T]`) or 1 (`[T, null]`).
    null_branch: Option<u32>,
    /// The schema's default, used for a missing or null required value.
    default: Option<Value>,
}

#[derive(Debug)]
enum Kind {
    /// int8, int16, int32 (and Date, Time): an Avro `int`, with its bounds.
    Int {
        min: i64,
        max: i64,
    },
    Long,
    Float,
    Double,
    Boolean,
    String,
    Bytes,
    /// Connect's `Decimal`: `bytes` with the `decimal` logical type.
    Decimal,
    Array(Box<Node>),
    Map(Box<Node>),
    /// Each field's Connect name (the payload's key), Avro name and node.
    Struct(Vec<(String, String, Node)>),
}

fn value_err(path: &str, message: impl std::fmt::Display) -> AvroError {
    let at = if path.is_empty() { "the root" } else { path };
    AvroError::Value(format!("{at}: {message}"))
}

fn sub(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

impl Node {
    /// Compiles a Connect schema; `avro_name` gives a field's Avro name.
    pub(super) fn of(s: &Value, avro_name: &dyn Fn(&str) -> String) -> Result<Self, AvroError> {
        let ty = s["type"].as_str().unwrap_or_default();
        let kind = match ty {
            "int8" => Kind::Int {
                min: i8::MIN.into(),
                max: i8::MAX.into(),
            },
            "int16" => Kind::Int {
                min: i16::MIN.into(),
                max: i16::MAX.into(),
            },
            "int32" => Kind::Int {
                min: i32::MIN.into(),
                max: i32::MAX.into(),
            },
            "int64" => Kind::Long,
            "float" | "float32" => Kind::Float,
            "double" | "float64" => Kind::Double,
            "boolean" => Kind::Boolean,
            "string" => Kind::String,
            "bytes" if s["name"] == DECIMAL => Kind::Decimal,
            "bytes" => Kind::Bytes,
            "array" => Kind::Array(Box::new(Node::of(&s["items"], avro_name)?)),
            "map" => Kind::Map(Box::new(Node::of(&s["values"], avro_name)?)),
            "struct" => {
                let mut fields = Vec::new();
                for f in s["fields"].as_array().into_iter().flatten() {
                    let name = f["field"].as_str().unwrap_or_default().to_owned();
                    let avro = avro_name(&name);
                    fields.push((name, avro, Node::of(f, avro_name)?));
                }
                Kind::Struct(fields)
            }
            other => return Err(AvroError::Schema(format!("unknown Connect type `{other}`"))),
        };
        let default = s.get("default").filter(|d| !d.is_null()).cloned();
        let null_branch = (s["optional"] == true).then(|| u32::from(default.is_some()));
        Ok(Node {
            kind,
            null_branch,
            default,
        })
    }

    /// The Avro value of a Connect JSON payload: the reference the direct
    /// writer ([`Node::write`]) is checked against.
    #[cfg(test)]
    pub(super) fn encode(&self, v: &Value, path: &str) -> Result<Avro, AvroError> {
        let v = match (v, &self.default) {
            (Value::Null, Some(d)) if self.null_branch.is_none() => d,
            _ => v,
        };
        match (v, self.null_branch) {
            (Value::Null, Some(n)) => Ok(Avro::Union(n, Box::new(Avro::Null))),
            (Value::Null, None) => Err(value_err(path, "null in a required field")),
            (v, Some(n)) => Ok(Avro::Union(1 - n, Box::new(self.encode_kind(v, path)?))),
            (v, None) => self.encode_kind(v, path),
        }
    }

    #[cfg(test)]
    fn encode_kind(&self, v: &Value, path: &str) -> Result<Avro, AvroError> {
        let mismatch = || value_err(path, format!("{v} does not fit {:?}", self.kind_name()));
        Ok(match (&self.kind, v) {
            (Kind::Int { min, max }, Value::Number(n)) => {
                let i = n
                    .as_i64()
                    .filter(|i| (min..=max).contains(&i))
                    .ok_or_else(mismatch)?;
                Avro::Int(i as i32)
            }
            (Kind::Long, Value::Number(n)) => Avro::Long(n.as_i64().ok_or_else(mismatch)?),
            (Kind::Float, v) => Avro::Float(float(v).ok_or_else(mismatch)? as f32),
            (Kind::Double, v) => Avro::Double(float(v).ok_or_else(mismatch)?),
            (Kind::Boolean, Value::Bool(b)) => Avro::Boolean(*b),
            (Kind::String, Value::String(s)) => Avro::String(s.clone()),
            (Kind::Bytes, Value::String(s)) if s == UNAVAILABLE_VALUE => {
                Avro::Bytes(UNAVAILABLE_VALUE.as_bytes().to_vec())
            }
            (Kind::Bytes, Value::String(s)) => Avro::Bytes(base64(s).ok_or_else(mismatch)?),
            (Kind::Decimal, Value::String(s)) => {
                Avro::Decimal(base64(s).ok_or_else(mismatch)?.into())
            }
            (Kind::Array(items), Value::String(s))
                if s == UNAVAILABLE_VALUE && matches!(items.kind, Kind::String | Kind::Bytes) =>
            {
                Avro::Array(vec![items.encode(v, path)?])
            }
            (Kind::Array(items), Value::Array(a)) => Avro::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, e)| items.encode(e, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            (Kind::Map(values), Value::Object(o)) => Avro::Map(
                o.iter()
                    .map(|(k, e)| Ok((k.clone(), values.encode(e, &sub(path, k))?)))
                    .collect::<Result<_, AvroError>>()?,
            ),
            (Kind::Struct(fields), Value::Object(o)) => Avro::Record(
                fields
                    .iter()
                    .map(|(name, avro, node)| {
                        let e = o.get(name).unwrap_or(&Value::Null);
                        Ok((avro.clone(), node.encode(e, &sub(path, name))?))
                    })
                    .collect::<Result<_, AvroError>>()?,
            ),
            _ => return Err(mismatch()),
        })
    }

    /// Appends the Avro binary of a Connect JSON payload to `out`, as
    /// apache_avro writes the value [`Node::encode`] gives (the same bytes,
    /// a map's entries in the payload's order), without building that
    /// value: no allocation but a `bytes` field's decoded base64, and the
    /// path named only when a value does not fit.
    pub(super) fn write(&self, v: &Value, at: At<'_>, out: &mut Vec<u8>) -> Result<(), AvroError> {
        let v = match (v, &self.default) {
            (Value::Null, Some(d)) if self.null_branch.is_none() => d,
            _ => v,
        };
        match (v, self.null_branch) {
            (Value::Null, Some(n)) => {
                write_long(out, n.into());
                Ok(())
            }
            (Value::Null, None) => Err(value_err(&at.path(), "null in a required field")),
            (v, Some(n)) => {
                write_long(out, (1 - n).into());
                self.write_kind(v, at, out)
            }
            (v, None) => self.write_kind(v, at, out),
        }
    }

    fn write_kind(&self, v: &Value, at: At<'_>, out: &mut Vec<u8>) -> Result<(), AvroError> {
        let mismatch = || {
            value_err(
                &at.path(),
                format!("{v} does not fit {:?}", self.kind_name()),
            )
        };
        match (&self.kind, v) {
            (Kind::Int { min, max }, Value::Number(n)) => {
                let i = n
                    .as_i64()
                    .filter(|i| (min..=max).contains(&i))
                    .ok_or_else(mismatch)?;
                write_long(out, i);
            }
            (Kind::Long, Value::Number(n)) => write_long(out, n.as_i64().ok_or_else(mismatch)?),
            (Kind::Float, v) => {
                let f = float(v).ok_or_else(mismatch)? as f32;
                out.extend_from_slice(&f.to_le_bytes());
            }
            (Kind::Double, v) => {
                out.extend_from_slice(&float(v).ok_or_else(mismatch)?.to_le_bytes())
            }
            (Kind::Boolean, Value::Bool(b)) => out.push(u8::from(*b)),
            (Kind::String, Value::String(s)) => write_bytes(out, s.as_bytes()),
            (Kind::Bytes, Value::String(s)) if s == UNAVAILABLE_VALUE => {
                write_bytes(out, UNAVAILABLE_VALUE.as_bytes());
            }
            (Kind::Bytes, Value::String(s)) => write_bytes(out, &base64(s).ok_or_else(mismatch)?),
            // apache_avro refuses a decimal of no bytes (it cannot sign-extend
            // zero to no bytes): so does this.
            (Kind::Decimal, Value::String(s)) => {
                let b = base64(s).filter(|b| !b.is_empty()).ok_or_else(mismatch)?;
                write_bytes(out, &b);
            }
            (Kind::Array(items), Value::String(s))
                if s == UNAVAILABLE_VALUE && matches!(items.kind, Kind::String | Kind::Bytes) =>
            {
                write_long(out, 1);
                items.write(v, at, out)?;
                out.push(0);
            }
            (Kind::Array(items), Value::Array(a)) => {
                if !a.is_empty() {
                    write_long(out, a.len() as i64);
                    for (i, e) in a.iter().enumerate() {
                        items.write(e, At::Index(&at, i), out)?;
                    }
                }
                out.push(0);
            }
            (Kind::Map(values), Value::Object(o)) => {
                if !o.is_empty() {
                    write_long(out, o.len() as i64);
                    for (k, e) in o {
                        write_bytes(out, k.as_bytes());
                        values.write(e, At::Field(&at, k), out)?;
                    }
                }
                out.push(0);
            }
            (Kind::Struct(fields), Value::Object(o)) => {
                for (name, _, node) in fields {
                    let e = o.get(name).unwrap_or(&Value::Null);
                    node.write(e, At::Field(&at, name), out)?;
                }
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Int { .. } => "int",
            Kind::Long => "long",
            Kind::Float => "float",
            Kind::Double => "double",
            Kind::Boolean => "boolean",
            Kind::String => "string",
            Kind::Bytes => "bytes",
            Kind::Decimal => "decimal",
            Kind::Array(_) => "array",
            Kind::Map(_) => "map",
            Kind::Struct(_) => "struct",
        }
    }

    /// The Connect JSON payload of an Avro value.
    pub(super) fn decode(&self, v: Avro, path: &str) -> Result<Value, AvroError> {
        let v = match v {
            Avro::Union(_, inner) => *inner,
            v => v,
        };
        Ok(match (&self.kind, v) {
            (_, Avro::Null) => Value::Null,
            (Kind::Int { .. }, Avro::Int(i) | Avro::Date(i) | Avro::TimeMillis(i)) => i.into(),
            (
                Kind::Long,
                Avro::Long(i)
                | Avro::TimestampMillis(i)
                | Avro::TimestampMicros(i)
                | Avro::TimeMicros(i),
            ) => i.into(),
            (Kind::Long, Avro::Int(i)) => i.into(),
            // The shortest text of the f32 read as f64: the number capture wrote.
            (Kind::Float, Avro::Float(f)) if f.is_finite() => {
                number(f.to_string().parse().unwrap_or(f64::from(f)))
            }
            (Kind::Float, Avro::Float(f)) => non_finite(f64::from(f)),
            (Kind::Double, Avro::Double(f)) if f.is_finite() => number(f),
            (Kind::Double, Avro::Double(f)) => non_finite(f),
            (Kind::Boolean, Avro::Boolean(b)) => b.into(),
            (Kind::String, Avro::String(s) | Avro::Enum(_, s)) => s.into(),
            (Kind::Bytes, Avro::Bytes(b) | Avro::Fixed(_, b)) => bytes_json(&b),
            (Kind::Decimal, Avro::Decimal(d)) => {
                let b: Vec<u8> = (&d).try_into().map_err(AvroError::avro)?;
                base64::engine::general_purpose::STANDARD.encode(b).into()
            }
            (Kind::Decimal, Avro::Bytes(b)) => bytes_json(&b),
            (Kind::Array(items), Avro::Array(a)) => {
                let out: Vec<Value> = a
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| items.decode(e, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?;
                match out.as_slice() {
                    [Value::String(s)] if s == UNAVAILABLE_VALUE => out[0].clone(),
                    _ => Value::Array(out),
                }
            }
            (Kind::Map(values), Avro::Map(m)) => {
                let mut keys: Vec<_> = m.into_iter().collect();
                keys.sort_by(|a, b| a.0.cmp(&b.0));
                let mut out = Map::new();
                for (k, e) in keys {
                    let d = values.decode(e, &sub(path, &k))?;
                    out.insert(k, d);
                }
                Value::Object(out)
            }
            (Kind::Struct(fields), Avro::Record(values)) => {
                let mut out = Map::with_capacity(fields.len());
                for ((name, _, node), (_, e)) in fields.iter().zip(values) {
                    out.insert(name.clone(), node.decode(e, &sub(path, name))?);
                }
                Value::Object(out)
            }
            (_, other) => {
                return Err(value_err(
                    path,
                    format!("Avro {other:?} where the schema says {}", self.kind_name()),
                ))
            }
        })
    }
}

/// Where in a payload a value is, spelled out ([`At::path`]) only for an
/// error: `a.b[2].c`, as [`sub`] builds it.
#[derive(Clone, Copy)]
pub(super) enum At<'a> {
    Root,
    Field(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    fn path(&self) -> String {
        match self {
            At::Root => String::new(),
            At::Field(up, name) => sub(&up.path(), name),
            At::Index(up, i) => format!("{}[{i}]", up.path()),
        }
    }
}

/// Avro's `long`: zig-zag, then 7 bits a byte, low first (an `int` in
/// range is written the same).
fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Avro's `bytes` and `string`: the length, then the bytes.
fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// A float field's value: a number, or the JSON converter's strings of the
/// non-finite ones.
fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn number(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn non_finite(f: f64) -> Value {
    if f.is_nan() {
        "NaN".into()
    } else if f > 0.0 {
        "Infinity".into()
    } else {
        "-Infinity".into()
    }
}

fn base64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

fn bytes_json(b: &[u8]) -> Value {
    if b == UNAVAILABLE_VALUE.as_bytes() {
        return UNAVAILABLE_VALUE.into();
    }
    base64::engine::general_purpose::STANDARD.encode(b).into()
}
