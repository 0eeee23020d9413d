//! The client against a tiny in-process fake of the two endpoints.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// Registered schemas (id = index + 1), the requests seen, and whether to
/// answer 503.
#[derive(Default)]
struct Fake {
    schemas: Vec<(String, String)>,
    requests: Vec<String>,
    down: bool,
    /// The `Authorization` header every request must carry, if any.
    authorization: Option<String>,
}

async fn fake() -> (String, Arc<Mutex<Fake>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let state = Arc::new(Mutex::new(Fake::default()));
    let shared = Arc::clone(&state);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let state = Arc::clone(&shared);
            tokio::spawn(async move {
                let Some((line, head, body)) = read_request(&mut conn).await else {
                    return;
                };
                let (status, answer) = answer(&state, &line, &head, &body);
                let text = answer.to_string();
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, state)
}

/// The request line, the header lines and the body (by Content-Length).
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<(String, String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let line = text.lines().next().unwrap_or_default().to_owned();
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
                return Some((line, text[..end].to_owned(), body));
            }
        }
    }
}

fn answer(state: &Mutex<Fake>, line: &str, head: &str, body: &str) -> (&'static str, Value) {
    let mut s = state.lock().expect("lock");
    s.requests.push(line.to_owned());
    if s.down {
        return ("503 Service Unavailable", json!({"message": "starting"}));
    }
    if let Some(expected) = &s.authorization {
        let given = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization")
                .then(|| v.trim().to_owned())
        });
        if given.as_deref() != Some(expected.as_str()) {
            return (
                "401 Unauthorized",
                json!({"error_code": 401, "message": "Unauthorized"}),
            );
        }
    }
    let path = line.split(' ').nth(1).unwrap_or_default();
    if let Some(rest) = path.strip_prefix("/subjects/") {
        let subject = rest.trim_end_matches("/versions").to_owned();
        let schema: Value = serde_json::from_str(body).expect("body is JSON");
        let schema = schema["schema"].as_str().expect("schema text").to_owned();
        let id = match s.schemas.iter().position(|(_, t)| *t == schema) {
            Some(i) => i + 1,
            None => {
                s.schemas.push((subject, schema));
                s.schemas.len()
            }
        };
        return ("200 OK", json!({ "id": id }));
    }
    if let Some(id) = path.strip_prefix("/schemas/ids/") {
        let id: usize = id.parse().unwrap_or(0);
        return match s.schemas.get(id.wrapping_sub(1)) {
            Some((_, text)) => ("200 OK", json!({ "schema": text })),
            None => (
                "404 Not Found",
                json!({"error_code": 40403, "message": format!("Schema {id} not found.")}),
            ),
        };
    }
    (
        "404 Not Found",
        json!({"error_code": 404, "message": "no such path"}),
    )
}

fn key_schema() -> Value {
    json!({"type": "struct", "name": "shop.public.t.Key", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "id"}]})
}

#[tokio::test]
async fn registers_once_and_reads_back_by_id() {
    let (url, state) = fake().await;
    let client = RegistryClient::new(&url).unwrap();
    let subject = topic_subject("shop.public.t", true);
    assert_eq!(subject, "shop.public.t-key");
    let (id, codec) = client.register(&subject, &key_schema()).await.unwrap();
    let (again, _) = client.register(&subject, &key_schema()).await.unwrap();
    assert_eq!((id, again), (1, 1));
    // The second registration and the id the client registered itself: cached.
    client.schema(id).await.unwrap();
    assert_eq!(state.lock().unwrap().requests.len(), 1);

    // Another client (a sink) reads the id once, then from its cache.
    let reader = RegistryClient::new(&url).unwrap();
    let body = codec.encode(&json!({"id": 7})).unwrap();
    let decoded = reader.schema(id).await.unwrap().decode(&body).unwrap();
    assert_eq!(decoded, json!({"id": 7}));
    reader.schema(id).await.unwrap();
    let requests = state.lock().unwrap().requests.clone();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[1], "GET /schemas/ids/1 HTTP/1.1");
}

#[tokio::test]
async fn an_unknown_id_is_the_records_failure_naming_the_id() {
    let (url, _) = fake().await;
    let e = RegistryClient::new(&url)
        .unwrap()
        .schema(42)
        .await
        .unwrap_err();
    assert!(matches!(e, AvroError::UnknownId { id: 42, .. }), "{e:?}");
    assert!(e.is_per_record() && !e.is_retriable());
    assert!(e.to_string().contains("schema id 42"), "{e}");
}

#[tokio::test]
async fn an_unreachable_or_failing_registry_is_retriable() {
    let (url, state) = fake().await;
    state.lock().unwrap().down = true;
    let client = RegistryClient::new(&url).unwrap();
    let e = client.register("t-value", &key_schema()).await.unwrap_err();
    assert!(e.is_retriable(), "{e:?}");
    let e = client.schema(1).await.unwrap_err();
    assert!(e.is_retriable(), "{e:?}");
    // Back up: the same client goes on.
    state.lock().unwrap().down = false;
    client.register("t-value", &key_schema()).await.unwrap();

    // Nothing listens on the port any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let e = RegistryClient::new(&closed)
        .unwrap()
        .schema(1)
        .await
        .unwrap_err();
    assert!(e.is_retriable(), "{e:?}");
}

#[tokio::test]
async fn basic_auth_from_user_info_is_sent_and_a_refusal_names_the_key() {
    let (url, state) = fake().await;
    // "registry:s3cret" in base64.
    state.lock().unwrap().authorization = Some("Basic cmVnaXN0cnk6czNjcmV0".into());
    let access = |info: Option<&str>| RegistryAccess {
        url: url.clone(),
        user_info: info.map(Secret::new),
        ca_file: None,
    };
    let e = RegistryClient::connect(&access(None))
        .unwrap()
        .register("t-key", &key_schema())
        .await
        .unwrap_err();
    assert!(matches!(e, AvroError::Refused { status: 401, .. }), "{e:?}");
    assert!(!e.is_retriable() && !e.is_per_record(), "{e:?}");
    assert!(
        e.to_string()
            .contains("schema.registry.basic.auth.user.info"),
        "{e}"
    );
    let e = RegistryClient::connect(&access(Some("registry:wrong")))
        .unwrap()
        .schema(1)
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("wrong"), "never the password: {e}");
    let client = RegistryClient::connect(&access(Some("registry:s3cret"))).unwrap();
    let (id, _) = client.register("t-key", &key_schema()).await.unwrap();
    assert!(format!("{client:?}").find("s3cret").is_none());
    RegistryClient::connect(&access(Some("registry:s3cret")))
        .unwrap()
        .schema(id)
        .await
        .unwrap();
    // A password in the URL is never shown either.
    let (scheme, rest) = url.split_once("://").unwrap();
    let in_url = RegistryClient::new(&format!("{scheme}://u:urlpass@{rest}")).unwrap();
    let e = in_url.schema(99).await.unwrap_err().to_string();
    assert!(!e.contains("urlpass") && e.contains("u:***@"), "{e}");
    // Not `user:password`: refused at start.
    assert!(RegistryClient::connect(&access(Some("registry"))).is_err());
}

#[tokio::test]
async fn subjects_follow_the_configured_strategy() {
    let (url, state) = fake().await;
    let value = json!({"type": "struct", "name": "shop.public.t.Value", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "id"}]});
    for (strategy, subject) in [
        ("TopicNameStrategy", "shop.public.t-value"),
        (
            "io.confluent.kafka.serializers.subject.RecordNameStrategy",
            "shop.public.t.Value",
        ),
        (
            "TopicRecordNameStrategy",
            "shop.public.t-shop.public.t.Value",
        ),
    ] {
        let naming = Naming {
            value_strategy: strategy.parse().unwrap(),
            ..Naming::default()
        };
        let client = RegistryClient::new(&url).unwrap().with_naming(naming);
        client
            .register_for("shop.public.t", false, &value)
            .await
            .unwrap();
        let last = state.lock().unwrap().requests.last().cloned().unwrap();
        assert_eq!(last, format!("POST /subjects/{subject}/versions HTTP/1.1"));
    }
    // A key that is not a record has no record name to go by.
    let naming = Naming {
        key_strategy: SubjectStrategy::RecordName,
        ..Naming::default()
    };
    let e = RegistryClient::new(&url)
        .unwrap()
        .with_naming(naming)
        .register_for("t", true, &json!({"type": "int32", "optional": false}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("RecordNameStrategy"), "{e}");
    assert!("Topic".parse::<SubjectStrategy>().is_err());
}

#[tokio::test]
async fn field_names_avro_refuses_are_adjusted_and_read_back_as_they_were() {
    use crate::avro::{NameAdjustment, NameMode};
    let (url, state) = fake().await;
    let value = json!({"type": "struct", "name": "shop.public.t.Value", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "id"},
                   {"type": "string", "optional": true, "field": "my-col"},
                   {"type": "int32", "optional": true, "field": "1st"},
                   {"type": "string", "optional": true, "field": "é"}]});
    // `none`: refused, naming the column and the setting.
    let e = RegistryClient::new(&url)
        .unwrap()
        .register_for("shop.public.t", false, &value)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`my-col`") && e.contains("field.name.adjustment.mode"),
        "{e}"
    );
    assert!(state.lock().unwrap().schemas.is_empty());
    for (mode, names) in [
        (NameMode::Avro, ["my_col", "_st", "_"]),
        (NameMode::AvroUnicode, ["my_u002dcol", "_u0031st", "_u00e9"]),
    ] {
        let naming = Naming {
            names: NameAdjustment {
                field: mode,
                ..NameAdjustment::default()
            },
            ..Naming::default()
        };
        let client = RegistryClient::new(&url).unwrap().with_naming(naming);
        let (id, codec) = client
            .register_for("shop.public.t", false, &value)
            .await
            .unwrap();
        let avro: Value = serde_json::from_str(codec.avro_schema()).unwrap();
        let fields: Vec<&str> = avro["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(fields[1..], names, "{mode:?}");
        let payload = json!({"id": 1, "my-col": "a", "1st": 2, "é": "b"});
        let body = codec.encode(&payload).unwrap();
        // A reader (another client) gets the Connect names back.
        let reader = RegistryClient::new(&url).unwrap().schema(id).await.unwrap();
        assert_eq!(reader.decode(&body).unwrap(), payload);
        assert_eq!(reader.connect_schema()["fields"][1]["field"], "my-col");
        // And encodes them again (the Avro names it read).
        assert_eq!(reader.encode(&payload).unwrap(), body);
    }
}

#[test]
fn subjects_are_one_path_segment() {
    assert_eq!(encode_path("a.b_c-d"), "a.b_c-d");
    assert_eq!(encode_path("a/b c"), "a%2Fb%20c");
}
