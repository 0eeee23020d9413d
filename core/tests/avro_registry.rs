//! The registry client against the real Apicurio Registry of
//! `scripts/services` (its Confluent-compatible API): `ONCELY_REGISTRY_URL`.

use oncely_core::avro::registry::{topic_subject, RegistryClient};
use oncely_core::avro::AvroError;
use serde_json::Value;

fn registry_url() -> String {
    std::env::var("ONCELY_REGISTRY_URL").unwrap_or_else(|_| {
        panic!("ONCELY_REGISTRY_URL is not set: run `scripts/services up registry` and `eval \"$(scripts/services env)\"`")
    })
}

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/envelope/insert_all_types.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

#[tokio::test]
async fn apicurio_registers_idempotently_and_serves_the_schema_by_id() {
    let url = registry_url();
    let doc = fixture();
    let topic = format!("oncely-it-{}.public.all_types", std::process::id());
    let writer = RegistryClient::new(&url).unwrap();
    let (key_id, _) = writer
        .register(&topic_subject(&topic, true), &doc["key"]["schema"])
        .await
        .unwrap();
    let (value_id, codec) = writer
        .register(&topic_subject(&topic, false), &doc["value"]["schema"])
        .await
        .unwrap();
    assert_ne!(key_id, value_id);
    // A second writer (a restarted capture) gets the same id.
    let again = RegistryClient::new(&url).unwrap();
    let (same, _) = again
        .register(&topic_subject(&topic, false), &doc["value"]["schema"])
        .await
        .unwrap();
    assert_eq!(same, value_id);

    // A reader knows only the id.
    let body = codec.encode(&doc["value"]["payload"]).unwrap();
    let reader = RegistryClient::new(&url).unwrap();
    let read = reader.schema(value_id).await.unwrap();
    let payload = read.decode(&body).unwrap();
    assert_eq!(
        payload["after"]["c_timestamp_inf"],
        doc["value"]["payload"]["after"]["c_timestamp_inf"]
    );
    assert_eq!(
        payload["after"]["c_bytea"],
        doc["value"]["payload"]["after"]["c_bytea"]
    );
    assert_eq!(payload["source"], doc["value"]["payload"]["source"]);
    assert_eq!(
        read.connect_schema()["name"],
        "shop.public.all_types.Envelope"
    );

    let e = reader.schema(2_000_000_000).await.unwrap_err();
    assert!(
        matches!(
            e,
            AvroError::UnknownId {
                id: 2_000_000_000,
                ..
            }
        ),
        "{e:?}"
    );
}

/// Reads a framed record with fastavro (Python, from PyPI): the schema by
/// id from the registry's Confluent API, the body with `schemaless_reader`;
/// prints the record as JSON (bytes as base64, non-finite floats as the
/// JSON converter's strings).
const FASTAVRO_READER: &str = r#"
import base64, json, math, struct, sys, urllib.request
import fastavro
url, path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
magic, schema_id = struct.unpack(">bI", data[:5])
assert magic == 0, magic
with urllib.request.urlopen(f"{url}/schemas/ids/{schema_id}") as r:
    schema = fastavro.parse_schema(json.loads(json.loads(r.read())["schema"]))
import io
record = fastavro.schemaless_reader(io.BytesIO(data[5:]), schema, None)
def plain(v):
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v
print(json.dumps(plain(record)))
"#;

#[tokio::test]
async fn fastavro_reads_oncelys_records_with_the_same_values() {
    let python = std::env::var("ONCELY_FASTAVRO_PYTHON").unwrap_or_else(|_| {
        panic!("ONCELY_FASTAVRO_PYTHON is not set: run `scripts/services fastavro` and `eval \"$(scripts/services env)\"`")
    });
    let url = registry_url();
    let doc = fixture();
    let topic = format!("oncely-fastavro-{}.public.all_types", std::process::id());
    let client = RegistryClient::new(&url).unwrap();
    let mut checked = 0;
    for (part, is_key) in [("key", true), ("value", false)] {
        let (id, codec) = client
            .register(&topic_subject(&topic, is_key), &doc[part]["schema"])
            .await
            .unwrap();
        let payload = &doc[part]["payload"];
        let framed = oncely_core::avro::wire::frame(id, &codec.encode(payload).unwrap());
        let path =
            std::env::temp_dir().join(format!("oncely-fastavro-{}-{part}", std::process::id()));
        std::fs::write(&path, &framed).unwrap();
        let out = std::process::Command::new(&python)
            .args(["-c", FASTAVRO_READER, &url, path.to_str().unwrap()])
            .output()
            .expect("run python");
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "fastavro failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read: Value = serde_json::from_slice(&out.stdout).expect("fastavro's JSON");
        assert!(
            same(&read, payload),
            "{part}: fastavro read\n{read}\nwant\n{payload}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// Numbers compared as numbers (a float field's `1` is fastavro's `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Confluent's other subject name strategies against Apicurio: the record
/// strategy's subject is the record's full name, shared by two topics
/// (one id), and the topic-record one is per topic.
#[tokio::test]
async fn apicurio_takes_the_record_name_strategies() {
    use oncely_core::avro::registry::{Naming, SubjectStrategy};
    let url = registry_url();
    let run = std::process::id();
    // A record name of this run only, so the subject is new.
    let value = serde_json::json!({"type": "struct", "name": format!("oncely_it_{run}.public.t.Value"),
        "optional": false, "fields": [{"type": "int64", "optional": false, "field": "id"}]});
    let record = RegistryClient::new(&url).unwrap().with_naming(Naming {
        value_strategy: SubjectStrategy::RecordName,
        ..Naming::default()
    });
    let (a, _) = record.register_for("topic-a", false, &value).await.unwrap();
    let (b, _) = record.register_for("topic-b", false, &value).await.unwrap();
    assert_eq!(a, b, "one subject, one schema");
    let topic_record = RegistryClient::new(&url).unwrap().with_naming(Naming {
        value_strategy: SubjectStrategy::TopicRecordName,
        ..Naming::default()
    });
    topic_record
        .register_for("topic-a", false, &value)
        .await
        .unwrap();
    let subjects: Vec<String> = reqwest::get(format!("{url}/subjects"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let full = format!("oncely_it_{run}.public.t.Value");
    assert!(subjects.contains(&full), "{subjects:?}");
    assert!(
        subjects.contains(&format!("topic-a-{full}")),
        "{subjects:?}"
    );
}
