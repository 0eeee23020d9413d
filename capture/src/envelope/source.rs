//! The `source` block, written straight into the record buffer.
//!
//! Everything that does not change per event (connector name, database,
//! schema, table) is escaped once into byte fragments; per event only the
//! numbers are formatted.

use crate::json::{write_i64, write_str, write_u64};

use super::{EnvelopeConfig, SourcePosition, SOURCE_VERSION};

/// Pre-escaped fragments of one table's `source` block.
#[derive(Debug, Clone)]
pub(super) struct SourceWriter {
    /// `{"version":...,"connector":"postgresql","name":"<prefix>","ts_ms":`
    head: Vec<u8>,
    /// `,"db":"<database>","sequence":"[\"`
    db: Vec<u8>,
    /// `\"]","schema":"<schema>","table":"<table>","txId":`
    table: Vec<u8>,
}

impl SourceWriter {
    pub(super) fn new(cfg: &EnvelopeConfig, schema: &str, table: &str) -> Self {
        let mut head = Vec::with_capacity(96);
        head.extend_from_slice(b"{\"version\":");
        write_str(&mut head, SOURCE_VERSION);
        head.extend_from_slice(b",\"connector\":\"postgresql\",\"name\":");
        write_str(&mut head, &cfg.topic_prefix);
        head.extend_from_slice(b",\"ts_ms\":");

        let mut db = Vec::with_capacity(48);
        db.extend_from_slice(b",\"db\":");
        write_str(&mut db, &cfg.database);
        db.extend_from_slice(b",\"sequence\":\"[\\\"");

        let mut tbl = Vec::with_capacity(64);
        tbl.extend_from_slice(b"\\\"]\",\"schema\":");
        write_str(&mut tbl, schema);
        tbl.extend_from_slice(b",\"table\":");
        write_str(&mut tbl, table);
        tbl.extend_from_slice(b",\"txId\":");
        Self {
            head,
            db,
            table: tbl,
        }
    }

    /// Writes the block. `sequence` is Debezium's `["<commit>","<lsn>"]`
    /// string; its first element is this transaction's commit LSN (known up
    /// front from Begin) where Debezium puts the previous commit's, so the
    /// pair orders events by commit, then WAL position. `tx_id` is `None`
    /// for a non-transactional logical message.
    pub(super) fn write(&self, out: &mut Vec<u8>, src: &SourcePosition, tx_id: Option<u32>) {
        out.extend_from_slice(&self.head);
        write_i64(out, src.commit_ts_ms);
        out.extend_from_slice(b",\"snapshot\":\"");
        out.extend_from_slice(src.snapshot.as_str().as_bytes());
        out.push(b'"');
        out.extend_from_slice(&self.db);
        write_u64(out, src.commit_lsn);
        out.extend_from_slice(b"\\\",\\\"");
        write_u64(out, src.lsn);
        out.extend_from_slice(&self.table);
        match tx_id {
            Some(id) => write_u64(out, u64::from(id)),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"lsn\":");
        write_u64(out, src.lsn);
        out.extend_from_slice(b",\"xmin\":null,\"commit_lsn\":");
        write_u64(out, src.commit_lsn);
        out.extend_from_slice(b",\"event_seq\":");
        write_u64(out, src.event_seq);
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::envelope::SnapshotMarker;

    #[test]
    fn writes_valid_json_with_escaped_names() {
        let cfg = EnvelopeConfig {
            topic_prefix: "p\"x".into(),
            topic_mapping: Default::default(),
            database: "d\\b".into(),
            schemas_enable: false,
            columns: Default::default(),
        };
        let w = SourceWriter::new(&cfg, "s", "t\n");
        let src = SourcePosition {
            tx_id: 7,
            lsn: 200,
            commit_lsn: 300,
            event_seq: 2,
            commit_ts_ms: -5,
            snapshot: SnapshotMarker::Incremental,
        };
        let mut out = Vec::new();
        w.write(&mut out, &src, Some(src.tx_id));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({
                "version": SOURCE_VERSION, "connector": "postgresql", "name": "p\"x",
                "ts_ms": -5, "snapshot": "incremental", "db": "d\\b",
                "sequence": "[\"300\",\"200\"]", "schema": "s", "table": "t\n",
                "txId": 7, "lsn": 200, "xmin": null, "commit_lsn": 300, "event_seq": 2
            })
        );
        out.clear();
        w.write(&mut out, &src, None);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["txId"], Value::Null);
    }
}
