//! The JSON-lines form of a record shared by the file and journal sinks.

use serde_json::{json, Value};

use crate::sink::{Batch, Record};

/// One record as a JSON object: origin, key, op, version and row images.
pub(crate) fn record_json(batch: &Batch, r: &Record, with_rows: bool) -> Value {
    let mut v = json!({
        "topic": batch.topic(),
        "partition": batch.partition(),
        "offset": r.offset,
        "key": r.key,
    });
    if let Some(obj) = v.as_object_mut() {
        match r.event() {
            Some(e) => {
                obj.insert("op".into(), e.op.code().into());
                obj.insert("lsn".into(), e.version.lsn.into());
                obj.insert("seq".into(), e.version.seq.into());
                if with_rows {
                    obj.insert(
                        "before".into(),
                        e.before.clone().map_or(Value::Null, Value::Object),
                    );
                    obj.insert(
                        "after".into(),
                        e.after.clone().map_or(Value::Null, Value::Object),
                    );
                }
            }
            None => {
                obj.insert("tombstone".into(), true.into());
            }
        }
    }
    v
}
