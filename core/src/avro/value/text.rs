//! A payload's JSON text written straight to Avro binary, walked along the
//! compiled schema as the text is read: no `serde_json::Value` is built.
//!
//! Only the common case is taken: struct fields in the schema's order
//! (some may be missing), keys without escapes, no maps. Anything else — and any
//! value that does not fit — is refused here ([`Skip`]) and written from
//! the parsed payload instead ([`Node::write`]), which also words the
//! error; so both ways give the same bytes or the same error.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{base64, write_bytes, write_long, At, Kind, Node};
use crate::wire::UNAVAILABLE_VALUE;

/// Why the text was not written directly (the parsed payload is, then).
#[derive(Debug)]
pub(in crate::avro) struct Skip;

/// Appends the Avro binary of payload text `json` to `out`; on [`Skip`]
/// `out` may hold part of it (the caller truncates).
pub(in crate::avro) fn write_text(node: &Node, json: &[u8], out: &mut Vec<u8>) -> Result<(), Skip> {
    let mut de = serde_json::Deserializer::from_slice(json);
    Seed { node, out }.deserialize(&mut de).map_err(|_| Skip)?;
    de.end().map_err(|_| Skip)
}

struct Seed<'n, 'o> {
    node: &'n Node,
    out: &'o mut Vec<u8>,
}

fn skip<E: de::Error>() -> E {
    E::custom("not written directly")
}

impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Seed<'_, '_> {
    /// The union branch of a value that is not null, when optional.
    fn present(&mut self) {
        if let Some(n) = self.node.null_branch {
            write_long(self.out, (1 - n).into());
        }
    }

    fn int<E: de::Error>(mut self, i: Option<i64>, f: f64) -> Result<(), E> {
        match (&self.node.kind, i) {
            (Kind::Int { min, max }, Some(i)) if (*min..=*max).contains(&i) => {
                self.present();
                write_long(self.out, i);
            }
            (Kind::Long, Some(i)) => {
                self.present();
                write_long(self.out, i);
            }
            _ => return self.float(f),
        }
        Ok(())
    }

    fn float<E: de::Error>(mut self, f: f64) -> Result<(), E> {
        match self.node.kind {
            Kind::Float => {
                self.present();
                self.out.extend_from_slice(&(f as f32).to_le_bytes());
            }
            Kind::Double => {
                self.present();
                self.out.extend_from_slice(&f.to_le_bytes());
            }
            _ => return Err(skip()),
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Seed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a payload value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        // The schema's default, or null's branch: as the parsed path writes it.
        self.node
            .write(&Value::Null, At::Root, self.out)
            .map_err(|_| skip())
    }

    fn visit_bool<E: de::Error>(mut self, b: bool) -> Result<(), E> {
        match self.node.kind {
            Kind::Boolean => {
                self.present();
                self.out.push(u8::from(b));
                Ok(())
            }
            _ => Err(skip()),
        }
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<(), E> {
        self.int(Some(i), i as f64)
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<(), E> {
        self.int(i64::try_from(u).ok(), u as f64)
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<(), E> {
        match self.node.kind {
            Kind::Float | Kind::Double => self.float(f),
            _ => Err(skip()),
        }
    }

    fn visit_str<E: de::Error>(mut self, s: &str) -> Result<(), E> {
        match &self.node.kind {
            Kind::String => {
                self.present();
                write_bytes(self.out, s.as_bytes());
            }
            Kind::Bytes if s == UNAVAILABLE_VALUE => {
                self.present();
                write_bytes(self.out, s.as_bytes());
            }
            Kind::Bytes => {
                let b = base64(s).ok_or_else(skip)?;
                self.present();
                write_bytes(self.out, &b);
            }
            Kind::Decimal => {
                let b = base64(s).filter(|b| !b.is_empty()).ok_or_else(skip)?;
                self.present();
                write_bytes(self.out, &b);
            }
            Kind::Float | Kind::Double => {
                let f = match s {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    _ => return Err(skip()),
                };
                return self.float(f);
            }
            // Arrays and the unchanged-TOAST placeholder: the parsed path.
            _ => return Err(skip()),
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let Kind::Array(items) = &self.node.kind else {
            return Err(skip());
        };
        // The count comes first: the items are written aside.
        let mut body = Vec::new();
        let mut count = 0i64;
        while seq
            .next_element_seed(Seed {
                node: items,
                out: &mut body,
            })?
            .is_some()
        {
            count += 1;
        }
        self.present();
        if count > 0 {
            write_long(self.out, count);
            self.out.extend_from_slice(&body);
        }
        self.out.push(0);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        match &self.node.kind {
            Kind::Struct(fields) => {
                self.present();
                let mut next = 0;
                while let Some(key) = map.next_key::<&str>()? {
                    // A field the text leaves out is null, as when parsed.
                    let at = fields[next..]
                        .iter()
                        .position(|(name, _, _)| name == key)
                        .ok_or_else(skip)?;
                    for (_, _, node) in &fields[next..next + at] {
                        node.write(&Value::Null, At::Root, self.out)
                            .map_err(|_| skip())?;
                    }
                    let node = &fields[next + at].2;
                    map.next_value_seed(Seed {
                        node,
                        out: self.out,
                    })?;
                    next += at + 1;
                }
                for (_, _, node) in &fields[next..] {
                    node.write(&Value::Null, At::Root, self.out)
                        .map_err(|_| skip())?;
                }
                Ok(())
            }
            // A map's duplicate keys are one entry when parsed: the parsed path.
            _ => Err(skip()),
        }
    }
}
