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
