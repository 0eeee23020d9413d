//! Decodes the capture's golden envelope fixtures (`tests/fixtures/envelope/*.json` at the
//! workspace root, each `{"description", "topic", "key", "value"}`): the wire contract.
use std::path::PathBuf;

use oncely_sinks::event::{decode_key, decode_value};
use oncely_sinks::{Op, Payload, Version, VersionOrigin};
use serde_json::Value;

fn fixtures() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/envelope");
    // Missing fixtures fail: a contract test that passes by checking nothing
    // would hide a moved or deleted directory.
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "no golden fixtures at {} ({e}): UPDATE_GOLDEN=1 cargo test -p oncely-capture --lib golden writes them",
            dir.display()
        )
    });
    let mut out: Vec<(String, Value)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read fixture");
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, serde_json::from_str(&text).expect("fixture is JSON"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !out.is_empty(),
        "the fixture directory exists but holds no fixture"
    );
    out
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    (!v.is_null()).then(|| serde_json::to_vec(v).expect("serialize"))
}

/// The envelope's payload (inside the schema wrapper when there is one).
fn payload(value: &Value) -> &Value {
    value
        .get("payload")
        .filter(|_| value.get("schema").is_some())
        .unwrap_or(value)
}

#[test]
fn every_golden_fixture_decodes_with_its_version() {
    for (name, fixture) in fixtures() {
        let (key, value) = (&fixture["key"], &fixture["value"]);
        let decoded_key =
            decode_key(bytes(key).as_deref()).unwrap_or_else(|e| panic!("{name}: key: {e}"));
        assert_eq!(
            decoded_key.is_none(),
            payload(key).is_null(),
            "{name}: key presence"
        );
        let decoded =
            decode_value(bytes(value).as_deref()).unwrap_or_else(|e| panic!("{name}: value: {e}"));
        let expected = payload(value);
        match decoded {
            Payload::Tombstone => assert!(expected.is_null(), "{name}: decoded as a tombstone"),
            Payload::Bookkeeping(kind) => panic!("{name}: decoded as Debezium's {kind:?}"),
            Payload::Change(event) => {
                let source = &expected["source"];
                let op = expected["op"].as_str().and_then(Op::from_code);
                assert_eq!(Some(event.op), op, "{name}: op");
                let version = Version::new(
                    source["commit_lsn"].as_u64().expect("commit_lsn"),
                    source["event_seq"].as_u64().expect("event_seq"),
                );
                assert_eq!(event.version, version, "{name}: version");
                assert_eq!(event.version_origin, VersionOrigin::CommitLsn, "{name}");
                assert_eq!(
                    event.schema.is_some(),
                    value.get("schema").is_some(),
                    "{name}: schema kept"
                );
                assert_eq!(
                    event.is_snapshot(),
                    event.op == Op::Read,
                    "{name}: snapshot flag"
                );
                let after = expected.get("after").filter(|a| !a.is_null());
                assert_eq!(
                    event.after.clone().map(Value::Object).as_ref(),
                    after,
                    "{name}: after"
                );
            }
        }
    }
}

#[test]
fn unchanged_toast_values_stay_marked() {
    let mut marked = 0;
    for (name, fixture) in fixtures() {
        let text = fixture["value"].to_string();
        if !text.contains("__debezium_unavailable_value") {
            continue;
        }
        marked += 1;
        let decoded = decode_value(bytes(&fixture["value"]).as_deref()).expect("decodes");
        let Payload::Change(event) = decoded else {
            panic!("{name}: not a change")
        };
        let after = event.after.expect("after");
        assert!(
            after.values().any(|v| v == "__debezium_unavailable_value"),
            "{name}: the unavailable marker must reach the sink untouched"
        );
    }
    // Without a fixture carrying the marker this test would check nothing.
    assert!(
        marked > 0,
        "no golden fixture holds an unchanged TOAST value"
    );
}
