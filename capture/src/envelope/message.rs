//! Records for logical decoding messages (`pg_logical_emit_message`), op `m`.
//!
//! These are rare (heartbeat actions, application markers), so the schemas
//! are built per call rather than cached.

use base64::Engine as _;

use crate::json::{write_i64, write_str};

use super::schema::{message_key_schema, message_value_schema};
use super::source::SourceWriter;
use super::{wrapper_head, EnvelopeConfig, SourcePosition};

/// Builds `(topic, key, value)` for a logical decoding message: topic
/// `<prefix>.message`, key `{"prefix": ...}`, value
/// `{"op":"m","ts_ms","source","message":{"prefix","content"}}` with the
/// content base64-encoded. `source.schema` and `source.table` are empty;
/// `source.txId` is null for a non-transactional message, which belongs to
/// no transaction.
pub fn message_record(
    cfg: &EnvelopeConfig,
    transactional: bool,
    prefix: &str,
    content: &[u8],
    src: &SourcePosition,
    now_ms: i64,
) -> (String, Vec<u8>, Vec<u8>) {
    let topic = crate::naming::sanitize_topic(&format!("{}.message", cfg.topic_prefix));
    let (key_head, value_head, tail): (Vec<u8>, Vec<u8>, &[u8]) = if cfg.schemas_enable {
        (
            wrapper_head(&message_key_schema()),
            wrapper_head(&message_value_schema()),
            b"}",
        )
    } else {
        (Vec::new(), Vec::new(), b"")
    };

    let mut key = key_head;
    key.extend_from_slice(b"{\"prefix\":");
    write_str(&mut key, prefix);
    key.push(b'}');
    key.extend_from_slice(tail);

    let mut value = value_head;
    value.extend_from_slice(b"{\"op\":\"m\",\"ts_ms\":");
    write_i64(&mut value, now_ms);
    value.extend_from_slice(b",\"source\":");
    SourceWriter::new(cfg, "", "").write(&mut value, src, transactional.then_some(src.tx_id));
    value.extend_from_slice(b",\"message\":{\"prefix\":");
    write_str(&mut value, prefix);
    value.extend_from_slice(b",\"content\":");
    write_str(
        &mut value,
        &base64::engine::general_purpose::STANDARD.encode(content),
    );
    value.extend_from_slice(b"}}");
    value.extend_from_slice(tail);
    (topic, key, value)
}
