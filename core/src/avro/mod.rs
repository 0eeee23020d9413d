//! The Avro converter: Kafka Connect schemas and payloads (the JSON
//! converter's `{"schema", "payload"}`, what capture writes and the sinks
//! read) to Avro and back, in Confluent's wire format, with a schema
//! registry speaking Confluent's API.
//!
//! ```text
//!  capture: Connect JSON --schema::connect_to_avro--> Avro schema --registry--> id
//!           payload (its text) --value::write(_text)--> Avro binary, after wire::header: 0|id|body
//!  sinks:   0|id|body --wire::unframe--> id --registry--> Avro schema --schema::avro_to_connect-->
//!           Connect schema; body --value::decode--> payload: the same JSON the JSON path decodes
//! ```
//!
//! The mapping is Confluent's `AvroData` (what Debezium users' Avro
//! consumers expect): a struct is a record named after the Connect schema,
//! an optional schema a union with `null` (first, default `null`; last when
//! the default is not null), `int8`/`int16` an `int` with `connect.type`,
//! Connect's `Decimal` `bytes` with the `decimal` logical type and
//! `connect.decimal.precision`, `Date`/`Time`/`Timestamp` the `date`,
//! `time-millis` and `timestamp-millis` logical types, and every schema's
//! name, version, doc and parameters kept as `connect.name`,
//! `connect.version`, `connect.doc` and `connect.parameters` (so
//! `io.debezium.time.Date` stays `io.debezium.time.Date`).
//!
//! Two values of the JSON wire have no Avro type of their own, and are
//! carried as Debezium carries them: the non-finite floats (`"NaN"`,
//! `"Infinity"`, `"-Infinity"` strings in JSON) are Avro's own non-finite
//! floats, and the unchanged-TOAST placeholder
//! ([`crate::wire::UNAVAILABLE_VALUE`]) in a `bytes` field is its UTF-8
//! bytes and in an array of strings a one-element array; read back, both are
//! the placeholder string again.

mod error;
pub mod names;
pub mod registry;
mod schema;
mod value;
pub mod wire;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use error::AvroError;
pub use names::{NameAdjustment, NameMode};
pub use schema::{avro_to_connect, connect_to_avro, connect_to_avro_adjusted};

use serde_json::Value;

/// One schema in both forms, ready to encode and decode payloads.
#[derive(Debug)]
pub struct AvroCodec {
    connect: Value,
    avro_json: String,
    avro: apache_avro::Schema,
    shape: value::Node,
}

impl AvroCodec {
    /// The codec of a Connect schema (capture's side), names not adjusted.
    pub fn from_connect(connect: &Value) -> Result<Self, AvroError> {
        Self::from_connect_adjusted(connect, NameAdjustment::default())
    }

    /// The codec of a Connect schema, names adjusted as `names` says.
    pub fn from_connect_adjusted(
        connect: &Value,
        names: NameAdjustment,
    ) -> Result<Self, AvroError> {
        let avro = connect_to_avro_adjusted(connect, names)?;
        let avro_json = avro.to_string();
        let shape = value::Node::of(connect, &|n| names::adjust(n, names.field))?;
        Self::build(connect.clone(), avro_json, &avro, shape)
    }

    /// The codec of an Avro schema's JSON text (a reader's side: a schema
    /// read from the registry, written by oncely or by Debezium).
    pub fn from_avro(avro_json: &str) -> Result<Self, AvroError> {
        let avro: Value = serde_json::from_str(avro_json)
            .map_err(|e| AvroError::Schema(format!("the Avro schema is not JSON: {e}")))?;
        let connect = avro_to_connect(&avro)?;
        let mut adjusted = std::collections::HashMap::new();
        schema::adjusted_fields(&avro, &mut adjusted);
        let shape = value::Node::of(&connect, &|n| {
            adjusted.get(n).cloned().unwrap_or_else(|| n.to_owned())
        })?;
        Self::build(
            connect,
            avro_json.to_owned(),
            &schema::with_valid_names(&avro),
            shape,
        )
    }

    /// `avro_json` is kept as registered; `parse` is what apache_avro reads.
    fn build(
        connect: Value,
        avro_json: String,
        parse: &Value,
        shape: value::Node,
    ) -> Result<Self, AvroError> {
        let avro = apache_avro::Schema::parse(parse).map_err(AvroError::avro)?;
        Ok(Self {
            connect,
            avro_json,
            avro,
            shape,
        })
    }

    /// The Connect schema (the JSON converter's `schema`).
    pub fn connect_schema(&self) -> &Value {
        &self.connect
    }

    /// The Avro full name of the schema's record (`None`: not a record).
    pub fn record_name(&self) -> Option<String> {
        match &self.avro {
            apache_avro::Schema::Record(r) => Some(r.name.fullname(None)),
            _ => None,
        }
    }

    /// The Avro schema's JSON text, as registered.
    pub fn avro_schema(&self) -> &str {
        &self.avro_json
    }

    /// The Avro binary body of a Connect JSON payload.
    pub fn encode(&self, payload: &Value) -> Result<Vec<u8>, AvroError> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(payload, &mut out)?;
        Ok(out)
    }

    /// [`AvroCodec::encode`] appending to `out` (left as it was on an
    /// error), e.g. after a wire header ([`wire::header`]).
    pub fn encode_into(&self, payload: &Value, out: &mut Vec<u8>) -> Result<(), AvroError> {
        let start = out.len();
        let written = self.shape.write(payload, value::At::Root, out);
        if written.is_err() {
            out.truncate(start);
        }
        written
    }

    /// [`AvroCodec::encode_into`] of a payload's JSON text, read once
    /// without building its value where it can be (`None`: the text is not
    /// one JSON value, and nothing is appended).
    pub fn encode_text_into(
        &self,
        text: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<Result<(), AvroError>> {
        let start = out.len();
        if value::write_text(&self.shape, text, out).is_ok() {
            return Some(Ok(()));
        }
        out.truncate(start);
        let payload: Value = serde_json::from_slice(text).ok()?;
        Some(self.encode_into(&payload, out))
    }

    /// The body apache_avro writes for the value the payload maps to: what
    /// [`AvroCodec::encode`] must match byte for byte.
    #[cfg(test)]
    fn encode_generic(&self, payload: &Value) -> Result<Vec<u8>, AvroError> {
        let datum = self.shape.encode(payload, "")?;
        apache_avro::writer::datum::GenericDatumWriter::builder(&self.avro)
            .build()
            .and_then(|w| w.write_value_to_vec(datum))
            .map_err(AvroError::avro)
    }

    /// The Connect JSON payload of an Avro binary body.
    pub fn decode(&self, body: &[u8]) -> Result<Value, AvroError> {
        let mut reader = body;
        let datum = apache_avro::reader::datum::GenericDatumReader::builder(&self.avro)
            .build()
            .and_then(|r| r.read_value(&mut reader))
            .map_err(AvroError::avro)?;
        if !reader.is_empty() {
            return Err(AvroError::Value(format!(
                "{} bytes left after the Avro record",
                reader.len()
            )));
        }
        self.shape.decode(datum, "")
    }

    /// `{"schema": .., "payload": ..}` of an Avro binary body: the record as
    /// the JSON converter writes it.
    pub fn decode_wrapped(&self, body: &[u8]) -> Result<Vec<u8>, AvroError> {
        let payload = self.decode(body)?;
        let mut out = Vec::with_capacity(body.len() * 2 + 256);
        out.extend_from_slice(b"{\"schema\":");
        serde_json::to_writer(&mut out, &self.connect)
            .map_err(|e| AvroError::Value(e.to_string()))?;
        out.extend_from_slice(b",\"payload\":");
        serde_json::to_writer(&mut out, &payload).map_err(|e| AvroError::Value(e.to_string()))?;
        out.push(b'}');
        Ok(out)
    }
}

/// A codec shared by the caches of the registry client.
pub type SharedCodec = Arc<AvroCodec>;
