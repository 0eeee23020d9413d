//! Every key and value of capture's golden fixtures (and the MySQL source's
//! types) goes JSON -> Avro -> JSON unchanged, schema and payload.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;

fn fixtures() -> Vec<(String, Value)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut out = Vec::new();
    for dir in ["envelope"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .expect("fixture dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for path in files {
            let doc: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
            out.push((path.display().to_string(), doc));
        }
    }
    out
}

/// `{"schema", "payload"}` records with a schema, found anywhere in `doc`.
fn wrapped(doc: &Value, out: &mut Vec<Value>) {
    match doc {
        Value::Object(o) if o.contains_key("schema") && o.contains_key("payload") => {
            out.extend((!o["schema"].is_null()).then(|| doc.clone()))
        }
        Value::Object(o) => o.values().for_each(|v| wrapped(v, out)),
        Value::Array(a) => a.iter().for_each(|v| wrapped(v, out)),
        _ => {}
    }
}

/// Numbers compared as numbers: a float field's `1` reads back as `1.0`.
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

/// The Connect schema as `avro_to_connect` gives it back: every schema says
/// `optional`, and `float32`/`float64` (which the JSON converter also
/// reads) are its `float`/`double`.
fn normalized(s: &Value) -> Value {
    match s {
        Value::Object(o) => {
            let mut o: serde_json::Map<String, Value> =
                o.iter().map(|(k, v)| (k.clone(), normalized(v))).collect();
            match o.get("type").and_then(Value::as_str) {
                Some("float32") => drop(o.insert("type".into(), "float".into())),
                Some("float64") => drop(o.insert("type".into(), "double".into())),
                _ => {}
            }
            if o.contains_key("type") && !o.contains_key("optional") {
                o.insert("optional".into(), false.into());
            }
            Value::Object(o)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

#[test]
fn every_fixture_round_trips_through_avro() {
    let mut checked = 0;
    for (file, doc) in fixtures() {
        let mut records = Vec::new();
        wrapped(&doc, &mut records);
        for r in records {
            let codec =
                AvroCodec::from_connect(&r["schema"]).unwrap_or_else(|e| panic!("{file}: {e}"));
            let body = codec
                .encode(&r["payload"])
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            // The reader's side: only the registered Avro text.
            let reader =
                AvroCodec::from_avro(codec.avro_schema()).unwrap_or_else(|e| panic!("{file}: {e}"));
            let back = reader
                .decode(&body)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(
                same(&back, &r["payload"]),
                "{file}: payload differs\n got {back}\nwant {}",
                r["payload"]
            );
            assert_eq!(
                reader.connect_schema(),
                &normalized(&r["schema"]),
                "{file}: schema differs"
            );
            checked += 1;
        }
    }
    // Keys and values of the envelope fixtures: a fixture dropped from the
    // walk shows here.
    assert!(checked >= 14, "only {checked} records checked");
}

/// The MySQL source's type fixtures (`{"schema": field, "value"}` per
/// column type: Connect `Decimal`, `Date`, `Timestamp`, `Time`, geometry...),
/// each as the one field of a row.
#[test]
fn every_mysql_type_round_trips_through_avro() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mysql/types.json");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    let cases = doc.as_object().expect("an object of cases");
    for (name, case) in cases {
        let schema = json!({"type": "struct", "name": "db.t.Value", "optional": false,
            "fields": [case["schema"]]});
        let payload = json!({"c": case["value"]});
        let codec = AvroCodec::from_connect(&schema).unwrap_or_else(|e| panic!("{name}: {e}"));
        let body = codec
            .encode(&payload)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let reader =
            AvroCodec::from_avro(codec.avro_schema()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = reader
            .decode(&body)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(same(&back, &payload), "{name}: got {back}, want {payload}");
        assert_eq!(
            reader.connect_schema(),
            &normalized(&schema),
            "{name}: schema differs"
        );
    }
    assert!(cases.len() >= 40, "{} cases", cases.len());
}

#[test]
fn follows_avrodata_conventions() {
    let connect = json!({
        "type": "struct", "name": "shop.public.t.Value", "optional": false, "version": 1,
        "fields": [
            {"type": "int16", "optional": false, "field": "s"},
            {"type": "bytes", "optional": true, "name": DECIMAL_NAME, "version": 1,
             "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "d"},
            {"type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
            {"type": "int32", "optional": false, "name": "org.apache.kafka.connect.data.Date", "version": 1, "field": "cday"},
            {"type": "string", "optional": true, "default": "false", "field": "snap"},
        ]
    });
    let avro = connect_to_avro(&connect).unwrap();
    assert_eq!(avro["name"], "shop.public.t.Value");
    assert_eq!(avro["connect.version"], 1);
    let f = &avro["fields"];
    assert_eq!(
        f[0]["type"],
        json!({"type": "int", "connect.type": "int16"})
    );
    assert_eq!(f[1]["type"][0], "null");
    assert_eq!(f[1]["default"], Value::Null);
    let d = &f[1]["type"][1];
    assert_eq!(
        (&d["type"], &d["logicalType"], &d["precision"], &d["scale"]),
        (&json!("bytes"), &json!("decimal"), &json!(10), &json!(2))
    );
    assert_eq!(d["connect.name"], DECIMAL_NAME);
    assert_eq!(d["connect.parameters"]["connect.decimal.precision"], "10");
    assert_eq!(
        f[2]["type"][1],
        json!({"type": "int", "connect.name": "io.debezium.time.Date", "connect.version": 1})
    );
    assert_eq!(f[3]["type"]["logicalType"], "date");
    // A non-null default goes first in the union, as Avro's default must.
    assert_eq!(f[4]["type"], json!(["string", "null"]));
    assert_eq!(f[4]["default"], "false");
    apache_avro::Schema::parse(&avro).expect("a valid Avro schema");
}

const DECIMAL_NAME: &str = "org.apache.kafka.connect.data.Decimal";

#[test]
fn names_avro_refuses_are_adjusted_or_refused() {
    let connect = json!({"type": "struct", "name": "my-shop.public.2t.Value", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "id"}]});
    let avro = connect_to_avro(&connect).unwrap();
    assert_eq!(avro["name"], "my_shop.public._2t.Value");
    // The Connect name survives the trip.
    assert_eq!(
        avro_to_connect(&avro).unwrap()["name"],
        "my-shop.public.2t.Value"
    );
    let bad = json!({"type": "struct", "name": "t", "optional": false,
        "fields": [{"type": "int32", "optional": false, "field": "a b"}]});
    let e = connect_to_avro(&bad).unwrap_err().to_string();
    assert!(e.contains("`a b`"), "{e}");
}

#[test]
fn special_values_round_trip() {
    let connect = json!({"type": "struct", "name": "t", "optional": false, "fields": [
        {"type": "double", "optional": true, "field": "nan"},
        {"type": "float", "optional": true, "field": "inf"},
        {"type": "float", "optional": true, "field": "f"},
        {"type": "bytes", "optional": true, "field": "toast"},
        {"type": "array", "items": {"type": "string", "optional": true}, "optional": true, "field": "arr"},
        {"type": "map", "keys": {"type": "string", "optional": false},
         "values": {"type": "int64", "optional": true}, "optional": true, "field": "m"},
    ]});
    let payload = json!({"nan": "NaN", "inf": "-Infinity", "f": 0.1,
        "toast": "__debezium_unavailable_value", "arr": "__debezium_unavailable_value",
        "m": {"a": 1, "b": null}});
    let codec = AvroCodec::from_connect(&connect).unwrap();
    let back = AvroCodec::from_avro(codec.avro_schema())
        .unwrap()
        .decode(&codec.encode(&payload).unwrap())
        .unwrap();
    assert_eq!(back, payload);
}

#[test]
fn values_that_do_not_fit_are_named() {
    let connect = json!({"type": "struct", "name": "t", "optional": false, "fields": [
        {"type": "int16", "optional": false, "field": "small"}]});
    let codec = AvroCodec::from_connect(&connect).unwrap();
    let e = codec.encode(&json!({"small": 70000})).unwrap_err();
    assert!(e.is_per_record());
    assert!(e.to_string().contains("small"), "{e}");
    let e = codec.encode(&json!({})).unwrap_err().to_string();
    assert!(e.contains("null in a required field"), "{e}");
    assert!(codec.decode(b"\xff\xff\xff").is_err());
}

/// Debezium's converters take the topic prefix as the records' namespace
/// unchanged (without `schema.name.adjustment.mode = avro`): Java's Avro
/// accepts `my-server.public.t`, apache_avro refuses it. A reader decodes
/// such a schema all the same, its Connect names kept as written.
#[test]
fn a_namespace_avro_refuses_is_still_read() {
    let avro = json!({
        "type": "record", "name": "Envelope", "namespace": "my-server.public.t",
        "fields": [
            {"name": "before", "type": ["null", {"type": "record", "name": "Value",
                "fields": [{"name": "id", "type": "long"}],
                "connect.name": "my-server.public.t.Value"}], "default": null},
            {"name": "after", "type": ["null", "Value"], "default": null},
            {"name": "again", "type": ["null", "my-server.public.t.Value"], "default": null},
            {"name": "op", "type": "string"}
        ],
        "connect.name": "my-server.public.t.Envelope"
    })
    .to_string();
    let codec = AvroCodec::from_avro(&avro).expect("a schema Java's Avro accepts");
    assert_eq!(codec.avro_schema(), avro, "kept as registered");
    assert_eq!(
        codec.connect_schema()["name"],
        "my-server.public.t.Envelope"
    );
    assert_eq!(
        codec.connect_schema()["fields"][1]["name"],
        "my-server.public.t.Value"
    );
    let payload = json!({"before": null, "after": {"id": 7}, "again": {"id": 8}, "op": "c"});
    let body = codec.encode(&payload).expect("encode");
    assert_eq!(codec.decode(&body).expect("decode"), payload);
}

/// The direct writer's bytes are apache_avro's for the value the old path
/// built (or both refuse), for a payload and its Connect schema.
fn assert_same_body(what: &str, codec: &AvroCodec, payload: &Value) {
    // The payload's text, read straight to Avro, gives the same bytes as
    // the parsed payload: its fields in order, and in reverse (which the
    // text reader leaves to the parsed path).
    for text in [payload.to_string(), reversed(payload).to_string()] {
        let mut direct = Vec::new();
        let got = codec.encode_text_into(text.as_bytes(), &mut direct);
        match (got.expect("JSON text"), codec.encode(payload)) {
            (Ok(()), Ok(parsed)) => assert_eq!(direct, parsed, "{what}: text {text}"),
            (Err(direct), Err(parsed)) => assert_eq!(direct.to_string(), parsed.to_string()),
            (direct, parsed) => panic!("{what}: {text}: text {direct:?}, parsed {parsed:?}"),
        }
    }
    match (codec.encode(payload), codec.encode_generic(payload)) {
        (Ok(new), Ok(old)) => assert_eq!(new, old, "{what}: bytes differ for {payload}"),
        (Err(new), Err(old)) => assert_eq!(
            new.is_per_record(),
            old.is_per_record(),
            "{what}: {new} / {old}"
        ),
        (new, old) => panic!("{what}: {payload}: direct {new:?}, apache_avro {old:?}"),
    }
}

/// `v` with every object's keys in reverse order.
fn reversed(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(reversed).collect()),
        other => other.clone(),
    }
}

#[test]
fn the_direct_writer_writes_apache_avros_bytes_for_every_fixture() {
    let mut checked = 0;
    let mut read_directly = 0;
    for (file, doc) in fixtures() {
        let mut records = Vec::new();
        wrapped(&doc, &mut records);
        for r in records {
            let codec = AvroCodec::from_connect(&r["schema"]).expect("codec");
            assert_same_body(&file, &codec, &r["payload"]);
            let text = r["payload"].to_string();
            let direct = value::write_text(&codec.shape, text.as_bytes(), &mut Vec::new());
            read_directly += usize::from(direct.is_ok());
            checked += 1;
        }
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mysql/types.json");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    for (name, case) in doc.as_object().expect("cases") {
        let schema = json!({"type": "struct", "name": "db.t.Value", "optional": false,
            "fields": [case["schema"]]});
        let codec = AvroCodec::from_connect(&schema).expect("codec");
        assert_same_body(name, &codec, &json!({"c": case["value"]}));
        // Null, missing, and a value of another type, too.
        assert_same_body(name, &codec, &json!({"c": null}));
        assert_same_body(name, &codec, &json!({}));
        assert_same_body(name, &codec, &json!({"c": "not base64!"}));
        checked += 1;
    }
    assert!(checked >= 54, "only {checked} checked");
    // The envelope's records are read straight from their text (a map
    // column's, or an array's unchanged-TOAST placeholder, are parsed).
    assert!(read_directly >= 12, "only {read_directly} read directly");
}

mod direct_writer {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::{assert_same_body, AvroCodec, DECIMAL_NAME};
    use crate::wire::UNAVAILABLE_VALUE;

    /// A Connect schema: every leaf type, optional or not, with or
    /// without a default, in arrays, maps and structs.
    fn schema() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({"type": "int8"})),
            Just(json!({"type": "int16"})),
            Just(json!({"type": "int32"})),
            Just(json!({"type": "int32", "name": "io.debezium.time.Date", "version": 1})),
            Just(json!({"type": "int64"})),
            Just(
                json!({"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp", "version": 1})
            ),
            Just(json!({"type": "float"})),
            Just(json!({"type": "double"})),
            Just(json!({"type": "boolean"})),
            Just(json!({"type": "string"})),
            Just(json!({"type": "bytes"})),
            Just(json!({"type": "bytes", "name": DECIMAL_NAME, "version": 1,
                "parameters": {"scale": "2"}})),
        ];
        let leaf = (leaf, any::<bool>(), any::<bool>()).prop_map(|(mut s, optional, default)| {
            s["optional"] = optional.into();
            if default {
                s["default"] = match s["type"].as_str() {
                    Some("boolean") => json!(true),
                    Some("string") => json!("d"),
                    Some("bytes") => json!("AQI="),
                    Some("float" | "double") => json!(1.5),
                    _ => json!(3),
                };
            }
            s
        });
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                (inner.clone(), any::<bool>()).prop_map(|(items, optional)| json!(
                    {"type": "array", "items": items, "optional": optional})),
                (inner.clone(), any::<bool>()).prop_map(|(values, optional)| json!(
                    {"type": "map", "keys": {"type": "string", "optional": false},
                     "values": values, "optional": optional})),
                (prop::collection::vec(inner, 1..4), any::<bool>()).prop_map(
                    |(fields, optional)| {
                        let fields: Vec<Value> = fields
                            .into_iter()
                            .enumerate()
                            .map(|(i, mut f)| {
                                f["field"] = format!("f{i}").into();
                                f
                            })
                            .collect();
                        // Avro wants each record's name once.
                        static NAMES: std::sync::atomic::AtomicUsize =
                            std::sync::atomic::AtomicUsize::new(0);
                        let n = NAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        json!({"type": "struct", "name": format!("s{n}"), "optional": optional,
                            "fields": fields})
                    }
                ),
            ]
        })
    }

    /// A value for `s`: mostly one that fits, sometimes null, a missing
    /// field or a value of another kind (both writers must refuse it).
    fn value(s: &Value) -> BoxedStrategy<Value> {
        let odd = prop_oneof![
            Just(Value::Null),
            Just(json!("NaN")),
            Just(json!("-Infinity")),
            Just(json!(UNAVAILABLE_VALUE)),
            Just(json!("not base64!")),
            Just(json!("")),
            Just(json!(70000)),
            Just(json!(u64::MAX)),
            Just(json!(-1.25)),
            Just(json!(false)),
            Just(json!([])),
            Just(json!({})),
        ];
        let fits: BoxedStrategy<Value> = match s["type"].as_str().unwrap_or_default() {
            "int8" => any::<i8>().prop_map(Value::from).boxed(),
            "int16" => any::<i16>().prop_map(Value::from).boxed(),
            "int32" => any::<i32>().prop_map(Value::from).boxed(),
            "int64" => any::<i64>().prop_map(Value::from).boxed(),
            "float" => any::<f32>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| Value::from(f64::from(f)))
                .boxed(),
            "double" => any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from)
                .boxed(),
            "boolean" => any::<bool>().prop_map(Value::from).boxed(),
            "string" => any::<String>().prop_map(Value::from).boxed(),
            "bytes" => prop::collection::vec(any::<u8>(), 0..40)
                .prop_map(|b| {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.encode(b).into()
                })
                .boxed(),
            "array" => prop::collection::vec(value(&s["items"]), 0..4)
                .prop_map(Value::Array)
                .boxed(),
            // One entry at most: apache_avro writes a map's entries in
            // its hash order, the direct writer in the payload's.
            "map" => prop::option::of(("[a-z]{0,3}", value(&s["values"])))
                .prop_map(|e| Value::Object(e.into_iter().collect()))
                .boxed(),
            "struct" => {
                let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = s["fields"]
                    .as_array()
                    .expect("fields")
                    .iter()
                    .map(|f| {
                        let name = f["field"].as_str().expect("name").to_owned();
                        prop::option::weighted(0.9, value(f))
                            .prop_map(move |v| v.map(|v| (name.clone(), v)))
                            .boxed()
                    })
                    .collect();
                fields
                    .prop_map(|f| Value::Object(f.into_iter().flatten().collect()))
                    .boxed()
            }
            other => panic!("no values for {other}"),
        };
        prop_oneof![9 => fits, 1 => odd].boxed()
    }

    fn case() -> impl Strategy<Value = (Value, Value)> {
        schema().prop_flat_map(|mut field| {
            field["field"] = "c".into();
            let s = json!({"type": "struct", "name": "t.Value", "optional": false,
                "fields": [field]});
            let v = value(&s);
            (Just(s), v)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn writes_apache_avros_bytes((schema, payload) in case()) {
            let codec = AvroCodec::from_connect(&schema).expect("codec");
            assert_same_body("generated", &codec, &payload);
        }
    }

    /// A map of several entries: the same entries, in the payload's order.
    #[test]
    fn a_map_reads_back_whole() {
        let schema = json!({"type": "struct", "name": "t", "optional": false, "fields": [
            {"type": "map", "keys": {"type": "string", "optional": false},
             "values": {"type": "int32", "optional": true}, "optional": false, "field": "m"}]});
        let codec = AvroCodec::from_connect(&schema).expect("codec");
        let payload = json!({"m": {"b": 1, "a": null, "c": -7}});
        let body = codec.encode(&payload).expect("encode");
        let generic = codec.encode_generic(&payload).expect("encode");
        assert_eq!(body.len(), generic.len());
        let reader = AvroCodec::from_avro(codec.avro_schema()).expect("reader");
        assert_eq!(
            reader.decode(&body).expect("decode"),
            reader.decode(&generic).expect("decode")
        );
    }
}
