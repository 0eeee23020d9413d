use super::*;

const MINIMAL: &str = r#"
topic.prefix = "shop"
database.hostname = "127.0.0.1"
database.user = "postgres"
database.dbname = "shop"
kafka.bootstrap.servers = "127.0.0.1:9092"
"#;

#[test]
fn minimal_config_gets_defaults() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(cfg.connector_name(), "shop");
    assert_eq!(cfg.transactional_id(), "oncely-capture-shop");
    assert_eq!(cfg.slot_name, DEFAULT_SLOT);
    assert_eq!(cfg.publication_name, DEFAULT_PUBLICATION);
    assert_eq!(cfg.publication_autocreate_mode, AutocreateMode::AllTables);
    assert!(cfg.tombstones_on_delete);
    assert!(cfg.schemas_enable);
    assert_eq!(cfg.port(), 5432);
    assert_eq!(cfg.batch_max_events, DEFAULT_BATCH_MAX_EVENTS);
    assert_eq!(cfg.offsets_topic(), "oncely-offsets-shop");
    assert_eq!(cfg.max_message_bytes(), DEFAULT_MAX_MESSAGE_BYTES);
    assert_eq!(cfg.snapshot_mode, SnapshotMode::Initial);
    assert!(!cfg.snapshot_new_tables);
    assert_eq!(cfg.chunk_size(), DEFAULT_SNAPSHOT_CHUNK_SIZE);
    assert_eq!(cfg.signal_table(), None);
    assert_eq!(cfg.replica_identity_check, ReplicaIdentityCheck::Fail);
    assert_eq!(
        cfg.heartbeat_interval(),
        Duration::from_millis(DEFAULT_HEARTBEAT_MS)
    );
}

#[test]
fn debezium_names_parse() {
    let text = format!(
        "{MINIMAL}\nslot.name = \"s1\"\npublication.autocreate.mode = \"filtered\"\n\
         table.include.list = \"public.orders, public.customers\"\n\
         message.key.columns = \"public.orders:id\"\nheartbeat.interval.ms = 500\n\
         tombstones.on.delete = false\nbatch.max.events = 10\n"
    );
    let cfg = CaptureConfig::parse(&text, "test").unwrap();
    assert_eq!(cfg.slot_name, "s1");
    assert_eq!(cfg.publication_autocreate_mode, AutocreateMode::Filtered);
    assert_eq!(
        cfg.table_include_list.0,
        vec!["public.orders".to_string(), "public.customers".to_string()]
    );
    assert!(!cfg.tombstones_on_delete);
    assert_eq!(cfg.heartbeat_interval(), Duration::from_millis(500));
}

#[test]
fn unknown_key_is_rejected_with_its_name() {
    let err = CaptureConfig::parse(&format!("{MINIMAL}\nslot.nmae = \"x\"\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("nmae"), "{err}");
}

#[test]
fn bad_values_name_their_key() {
    let cases = [
        ("slot.name = \"Bad-Name\"", "slot.name"),
        ("batch.max.events = 0", "batch.max.events"),
        ("table.include.list = \"public.(\"", "table.include.list"),
        (
            "kafka.producer.\"transactional.id\" = \"x\"",
            "kafka.producer",
        ),
        ("metrics.listen = \"nope\"", "metrics.listen"),
        ("health.ready.max.lag.ms = 5", "health.ready.max.lag.ms"),
        ("slot.max.retained.bytes = 0", "slot.max.retained.bytes"),
        ("message.key.columns = \"orders\"", "message.key.columns"),
        ("snapshot.mode = \"sometimes\"", "snapshot.mode"),
        (
            "incremental.snapshot.chunk.size = 0",
            "incremental.snapshot.chunk.size",
        ),
        (
            "signal.data.collection = \"signals\"",
            "signal.data.collection",
        ),
    ];
    for (line, key) in cases {
        let err = CaptureConfig::parse(&format!("{MINIMAL}\n{line}\n"), "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{line}: {err}");
    }
}

#[test]
fn offsets_topic_is_per_connector_unless_configured() {
    let named = CaptureConfig::parse(&format!("name = \"orders-cdc\"\n{MINIMAL}"), "test").unwrap();
    assert_eq!(named.offsets_topic(), "oncely-offsets-orders-cdc");
    let set = CaptureConfig::parse(
        &format!("{MINIMAL}\noffset.storage.topic = \"shared\"\n"),
        "test",
    )
    .unwrap();
    assert_eq!(set.offsets_topic(), "shared");
    let err = CaptureConfig::parse(&format!("name = \"a b\"\n{MINIMAL}"), "test")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`name`") && err.contains("offset.storage.topic"),
        "{err}"
    );
    // A name that cannot make a topic is fine with an explicit topic.
    CaptureConfig::parse(
        &format!("name = \"a b\"\n{MINIMAL}\noffset.storage.topic = \"t\"\n"),
        "test",
    )
    .unwrap();
}

#[test]
fn tls_keys_parse_with_libpq_defaults_and_are_checked_together() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(cfg.database_sslmode, SslMode::Prefer);
    assert_eq!(cfg.tls().sslrootcert, None);
    std::env::set_var("ONCELY_TEST_PG_SSLKEY", "/keys/client.key");
    let full = CaptureConfig::parse(
        &format!(
            "{MINIMAL}database.sslmode = \"verify-full\"\ndatabase.sslrootcert = \"/ca.crt\"\n\
             database.sslcert = \"/client.crt\"\ndatabase.sslkey = \"${{env:ONCELY_TEST_PG_SSLKEY}}\"\n"
        ),
        "test",
    )
    .unwrap();
    let tls = full.tls();
    assert_eq!(tls.sslmode, SslMode::VerifyFull);
    assert_eq!(tls.sslrootcert, Some(PathBuf::from("/ca.crt")));
    assert_eq!(tls.sslcert, Some(PathBuf::from("/client.crt")));
    assert_eq!(tls.sslkey, Some(PathBuf::from("/keys/client.key")));
    for (mode, expected) in [
        ("disable", SslMode::Disable),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
    ] {
        let text =
            format!("{MINIMAL}database.sslmode = \"{mode}\"\ndatabase.sslrootcert = \"/ca.crt\"\n");
        match CaptureConfig::parse(&text, "test") {
            Ok(cfg) => assert_eq!(cfg.database_sslmode, expected),
            // A CA under `disable` would be ignored: refused, naming the key.
            Err(e) => {
                assert_eq!(expected, SslMode::Disable);
                assert!(e.to_string().contains("database.sslrootcert"), "{e}");
            }
        }
    }
    let cases = [
        ("database.sslmode = \"verify-full\"", "database.sslrootcert"),
        ("database.sslmode = \"verify-ca\"", "database.sslrootcert"),
        ("database.sslcert = \"/c.crt\"", "database.sslkey"),
        ("database.sslkey = \"/c.key\"", "database.sslcert"),
        ("database.sslmode = \"allow\"", "database.sslmode"),
        (
            "database.sslmode = \"disable\"\ndatabase.sslcert = \"/c\"\ndatabase.sslkey = \"/k\"",
            "database.sslcert",
        ),
        (
            "database.sslkey = \"${env:ONCELY_TEST_UNSET_SSLKEY}\"\ndatabase.sslcert = \"/c\"",
            "database.sslkey",
        ),
        ("database.sslpassword = \"x\"", "sslpassword"),
    ];
    for (line, key) in cases {
        let err = CaptureConfig::parse(&format!("{MINIMAL}{line}\n"), "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{line}: {err}");
    }
}

#[test]
fn message_size_limit_comes_from_the_topic_setting_or_the_producer() {
    let topic = CaptureConfig::parse(
        &format!("{MINIMAL}\ntopic.creation.default.max.message.bytes = 1048576\n"),
        "test",
    )
    .unwrap();
    assert_eq!(topic.max_message_bytes(), 1_048_576);
    let producer = CaptureConfig::parse(
        &format!("{MINIMAL}\n[kafka.producer]\n\"message.max.bytes\" = \"2000000\"\n"),
        "test",
    )
    .unwrap();
    assert_eq!(producer.max_message_bytes(), 2_000_000);
    let cases = [
        ("topic.creation.default.max.message.bytes = 10", "topic.creation.default.max.message.bytes"),
        ("[kafka.producer]\n\"message.max.bytes\" = \"big\"", "kafka.producer"),
        (
            "topic.creation.default.max.message.bytes = 1048576\n[kafka.producer]\n\"message.max.bytes\" = \"2000000\"",
            "kafka.producer",
        ),
    ];
    for (line, key) in cases {
        let err = CaptureConfig::parse(&format!("{MINIMAL}\n{line}\n"), "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{line}: {err}");
    }
}

#[test]
fn missing_required_key_is_named() {
    let err = CaptureConfig::parse("topic.prefix = \"x\"", "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("database"), "{err}");
}

#[test]
fn password_from_env_reference() {
    std::env::set_var("ONCELY_TEST_PG_PASSWORD", "pw");
    let text = format!("{MINIMAL}\ndatabase.password = \"${{env:ONCELY_TEST_PG_PASSWORD}}\"\n");
    let cfg = CaptureConfig::parse(&text, "test").unwrap();
    assert_eq!(cfg.database_password.expose(), "pw");
    assert!(!format!("{cfg:?}").contains("\"pw\""));
}

#[test]
fn interval_handling_mode_defaults_to_string_and_parses() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(cfg.interval_handling_mode, IntervalHandlingMode::String);
    let numeric = format!("{MINIMAL}\ninterval.handling.mode = \"numeric\"\n");
    let cfg = CaptureConfig::parse(&numeric, "test").unwrap();
    assert_eq!(cfg.interval_handling_mode, IntervalHandlingMode::Numeric);
    let bad = format!("{MINIMAL}\ninterval.handling.mode = \"iso\"\n");
    let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(
        err.contains("interval.handling.mode") && err.contains("numeric"),
        "{err}"
    );
}

#[test]
fn replica_identity_check_parses() {
    let warn = format!("{MINIMAL}\nreplica.identity.check = \"warn\"\n");
    let cfg = CaptureConfig::parse(&warn, "test").unwrap();
    assert_eq!(cfg.replica_identity_check, ReplicaIdentityCheck::Warn);
    let bad = format!("{MINIMAL}\nreplica.identity.check = \"ignore\"\n");
    let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(
        err.contains("replica.identity.check") && err.contains("warn"),
        "{err}"
    );
}

#[test]
fn schema_change_backfill_parses() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(cfg.schema_change_backfill, SchemaChangeBackfill::Auto);
    let off = format!("{MINIMAL}\nschema.change.backfill = \"off\"\n");
    let cfg = CaptureConfig::parse(&off, "test").unwrap();
    assert_eq!(cfg.schema_change_backfill, SchemaChangeBackfill::Off);
    let bad = format!("{MINIMAL}\nschema.change.backfill = \"always\"\n");
    let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(
        err.contains("schema.change.backfill") || err.contains("auto"),
        "{err}"
    );
}

#[test]
fn the_annotated_example_config_is_valid() {
    std::env::set_var("PGPASSWORD", "example");
    let text = include_str!("../../../examples/capture.toml");
    let cfg = CaptureConfig::parse(text, "examples/capture.toml").unwrap();
    assert_eq!(cfg.connector_name(), "shop");
    assert_eq!(cfg.metrics_listen.as_deref(), Some("127.0.0.1:9464"));
    assert_eq!(cfg.offsets_topic(), "oncely-offsets-shop");
    assert_eq!(cfg.kafka_producer["compression.type"], "lz4");
    let demo = include_str!("../../../examples/demo/capture.toml");
    let cfg = CaptureConfig::parse(demo, "examples/demo/capture.toml").unwrap();
    assert_eq!(cfg.offsets_topic(), "oncely-demo-offsets");
    assert_eq!(cfg.metrics_listen.as_deref(), Some("127.0.0.1:19464"));
}

#[test]
fn bare_and_quoted_dotted_keys_mean_the_same() {
    let bare = format!(
        "{MINIMAL}slot.name = \"s1\"\nbatch.max.events = 7\n\
         [kafka.producer]\n\"linger.ms\" = 5\n[outbox]\nroute.by.field = \"kind\"\ntable = \"public.outbox\"\n"
    );
    let quoted = "\"topic.prefix\" = \"shop\"\n\"database.hostname\" = \"127.0.0.1\"\n\
                  \"database.user\" = \"postgres\"\n\"database.dbname\" = \"shop\"\n\
                  \"kafka.bootstrap.servers\" = \"127.0.0.1:9092\"\n\"slot.name\" = \"s1\"\n\
                  \"batch.max.events\" = 7\n\"kafka.producer.linger.ms\" = \"5\"\n\
                  \"outbox.route.by.field\" = \"kind\"\n\"outbox.table\" = \"public.outbox\"\n";
    let tables = "[topic]\nprefix = \"shop\"\n[database]\nhostname = \"127.0.0.1\"\n\
                  user = \"postgres\"\ndbname = \"shop\"\n[kafka]\nbootstrap.servers = \"127.0.0.1:9092\"\n\
                  producer = { \"linger.ms\" = \"5\" }\n[slot]\nname = \"s1\"\n[batch.max]\nevents = 7\n\
                  [outbox]\ntable = \"public.outbox\"\n\"route.by.field\" = \"kind\"\n";
    for text in [bare.as_str(), quoted, tables] {
        let cfg = CaptureConfig::parse(text, "test").expect(text);
        assert_eq!(cfg.topic_prefix, "shop", "{text}");
        assert_eq!(cfg.slot_name, "s1", "{text}");
        assert_eq!(cfg.batch_max_events, 7, "{text}");
        assert_eq!(cfg.kafka_bootstrap_servers, "127.0.0.1:9092", "{text}");
        assert_eq!(
            cfg.kafka_producer.get("linger.ms").map(String::as_str),
            Some("5"),
            "{text}"
        );
        let outbox = cfg.outbox.as_ref().expect("outbox");
        assert_eq!(outbox.table, "public.outbox", "{text}");
        assert_eq!(outbox.route_by_field, "kind", "{text}");
        assert_eq!(outbox.event_key, crate::outbox::DEFAULT_KEY, "{text}");
    }
    // Written both ways: refused, naming the key.
    let twice = format!("{MINIMAL}slot.name = \"a\"\n\"slot.name\" = \"b\"\n");
    let err = CaptureConfig::parse(&twice, "test").unwrap_err();
    assert_eq!(err.key, "slot.name", "{err}");
    // No `outbox.*` key: no outbox.
    assert!(CaptureConfig::parse(MINIMAL, "test")
        .unwrap()
        .outbox
        .is_none());
}

#[test]
fn unknown_keys_are_named_wherever_they_sit() {
    for (line, name, near) in [
        ("slot.nmae = \"x\"", "slot.nmae", "slot.name"),
        ("[slot]\nnmae = \"x\"", "slot.nmae", "slot.name"),
        (
            "kafka.bootstrap.srevers = \"x\"",
            "kafka.bootstrap.srevers",
            "kafka.bootstrap.servers",
        ),
        (
            "[outbox]\ntable = \"a.b\"\nfield.event.kye = \"x\"",
            "outbox.field.event.kye",
            "outbox.field.event.key",
        ),
    ] {
        let err = CaptureConfig::parse(&format!("{MINIMAL}{line}\n"), "test").unwrap_err();
        assert_eq!(
            err.message,
            format!("unknown key `{name}`; did you mean `{near}`?"),
            "{line}"
        );
    }
    // A key that was removed is refused like any other unknown key.
    let err =
        CaptureConfig::parse(&format!("{MINIMAL}snapshot.max.threads = 4\n"), "test").unwrap_err();
    assert!(
        err.message
            .starts_with("unknown key `snapshot.max.threads`"),
        "{err}"
    );
}

#[test]
fn topic_name_mapping_reads_inline_and_as_a_table() {
    let inline = format!(
        "{MINIMAL}topic.name.mapping = {{ \"public.orders\" = \"orders_v2\", \"Sales.Order Items\" = \"items\" }}\n"
    );
    let table = format!(
        "{MINIMAL}[topic.name.mapping]\n\"public.orders\" = \"orders_v2\"\n\"Sales.Order Items\" = \"items\"\n"
    );
    for text in [inline, table] {
        let cfg = CaptureConfig::parse(&text, "test").expect(&text);
        let want: BTreeMap<String, String> = [
            ("public.orders".to_owned(), "orders_v2".to_owned()),
            ("Sales.Order Items".to_owned(), "items".to_owned()),
        ]
        .into();
        assert_eq!(cfg.topic_name_mapping, want, "{text}");
        assert_eq!(cfg.table_topic("public", "orders"), "orders_v2");
        assert_eq!(cfg.table_topic("public", "lines"), "shop.public.lines");
    }
    let bad = format!("{MINIMAL}[topic.name.mapping]\n\"orders\" = \"o\"\n");
    let err = CaptureConfig::parse(&bad, "test").unwrap_err();
    assert_eq!(err.key, "topic.name.mapping", "{err}");
}

#[test]
fn unresolvable_secrets_fail_at_load_naming_the_key() {
    let cases = [
        (
            "database.password = \"${env:ONCELY_TEST_SURELY_UNSET_PW}\"",
            "database.password",
            "ONCELY_TEST_SURELY_UNSET_PW",
        ),
        (
            "\"database.password\" = \"${env:ONCELY_TEST_SURELY_UNSET_PW}\"",
            "database.password",
            "ONCELY_TEST_SURELY_UNSET_PW",
        ),
        (
            "database.password = \"${file:/nonexistent/oncely-secret}\"",
            "database.password",
            "/nonexistent/oncely-secret",
        ),
        (
            "[kafka.producer]\n\"sasl.password\" = \"${env:ONCELY_TEST_SURELY_UNSET_PW}\"",
            "kafka.producer.sasl.password",
            "ONCELY_TEST_SURELY_UNSET_PW",
        ),
    ];
    for (line, key, reference) in cases {
        let err = CaptureConfig::parse(&format!("{MINIMAL}{line}\n"), "test")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(key) && err.contains(reference),
            "{line}: {err}"
        );
    }
    // A resolved secret never shows in an error about its own line.
    std::env::set_var("ONCELY_TEST_PG_PASSWORD_SHOWN", "hunter2");
    let text = format!(
        "{MINIMAL}database.password = \"${{env:ONCELY_TEST_PG_PASSWORD_SHOWN}}\"\ndatabase.port = \"x\"\n"
    );
    let err = CaptureConfig::parse(&text, "test").unwrap_err().to_string();
    assert!(
        err.contains("database.port") && !err.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn the_transaction_timeout_is_a_checked_producer_setting() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(
        cfg.transaction_timeout_ms(),
        Some(DEFAULT_TRANSACTION_TIMEOUT_MS)
    );
    let set = |v: &str| {
        CaptureConfig::parse(
            &format!("{MINIMAL}\n[kafka.producer]\n\"transaction.timeout.ms\" = \"{v}\"\n"),
            "test",
        )
    };
    assert_eq!(set("15000").unwrap().transaction_timeout_ms(), Some(15_000));
    for bad in ["soon", "500"] {
        let err = set(bad).unwrap_err();
        assert_eq!(err.key, "kafka.producer", "{err}");
        assert!(err.message.contains("transaction.timeout.ms"), "{err}");
    }
}

#[test]
fn avro_converters_need_a_registry_and_schemas() {
    let avro = format!("{MINIMAL}\nvalue.converter = \"avro\"\n");
    let e = CaptureConfig::parse(&avro, "test").unwrap_err().to_string();
    assert!(e.contains("schema.registry.url"), "{e}");

    let with_url =
        format!("{avro}schema.registry.url = \"http://127.0.0.1:18081/apis/ccompat/v7\"\n");
    let cfg = CaptureConfig::parse(&with_url, "test").unwrap();
    assert_eq!(cfg.key_converter, Converter::Json);
    assert_eq!(cfg.value_converter, Converter::Avro);
    let e = CaptureConfig::parse(&format!("{with_url}schemas.enable = false\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(e.contains("schemas.enable"), "{e}");
    let e = CaptureConfig::parse(
        &format!("{MINIMAL}\nkey.converter = \"protobuf\"\n"),
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("key.converter"), "{e}");
}

#[test]
fn skipped_operations_take_debeziums_letters_and_name_a_wrong_one() {
    let cfg = CaptureConfig::parse(MINIMAL, "test").unwrap();
    assert_eq!(cfg.skipped_operations, SkippedOperations::default());
    let cfg = CaptureConfig::parse(
        &format!("{MINIMAL}\nskipped.operations = \"t,d\"\n"),
        "test",
    )
    .unwrap();
    assert!(cfg.skipped_operations.truncate && cfg.skipped_operations.delete);
    assert!(!cfg.skipped_operations.create && !cfg.skipped_operations.update);
    let err = CaptureConfig::parse(&format!("{MINIMAL}\nskipped.operations = \"r\"\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("skipped.operations") && err.contains("\"r\""),
        "{err}"
    );
}

#[test]
fn table_filters_read_inline_and_as_a_table_and_are_held_to_the_filter_rules() {
    let mode = "publication.autocreate.mode = \"filtered\"\n";
    let inline = format!(
        "{MINIMAL}{mode}table.filter = {{ \"public.orders\" = \"region = 'eu'\", \"Sales.Order Items\" = \"qty > 0\" }}\n"
    );
    let table = format!(
        "{MINIMAL}{mode}[table.filter]\n\"public.orders\" = \"region = 'eu'\"\n\"Sales.Order Items\" = \"qty > 0\"\n"
    );
    for text in [inline, table] {
        let cfg = CaptureConfig::parse(&text, "test").expect(&text);
        assert_eq!(cfg.row_filter("public", "orders"), Some("region = 'eu'"));
        assert_eq!(cfg.row_filter("Sales", "Order Items"), Some("qty > 0"));
        assert_eq!(cfg.row_filter("public", "lines"), None);
    }
    let refused = |filter: &str| {
        let text = format!("{MINIMAL}{mode}[table.filter]\n\"public.orders\" = {filter:?}\n");
        CaptureConfig::parse(&text, "test").unwrap_err()
    };
    for filter in [
        "true) OR (pg_sleep(10) IS NULL",
        "id > 0; DROP TABLE orders",
        "pg_read_file('/etc/passwd') IS NOT NULL",
        "id IN (SELECT id FROM secrets)",
        "other.t.id > 0",
        "id > 0 -- comment",
    ] {
        let err = refused(filter);
        assert_eq!(err.key, "table.filter.public.orders", "{filter}: {err}");
        assert!(!err.to_string().contains("passwd"), "{err}");
    }
    let unqualified = format!("{MINIMAL}{mode}[table.filter]\n\"orders\" = \"id > 0\"\n");
    let err = CaptureConfig::parse(&unqualified, "test").unwrap_err();
    assert_eq!(err.key, "table.filter", "{err}");
    // FOR ALL TABLES (the default mode) cannot carry a row filter.
    let all = format!("{MINIMAL}[table.filter]\n\"public.orders\" = \"id > 0\"\n");
    let err = CaptureConfig::parse(&all, "test").unwrap_err();
    assert_eq!(err.key, "publication.autocreate.mode", "{err}");
}

#[test]
fn column_settings_parse_in_every_key_form_and_name_a_wrong_one() {
    std::env::set_var("ONCELY_CONFIG_TEST_SALT", "pepper");
    let text = format!(
        "{MINIMAL}\ncolumn.exclude.list = \"public.users.ssn\"\n\
         column.mask.with.4.chars = \"public.users.name\"\n\
         \"column.mask.hash.SHA-256.with.salt.${{file:/nonexistent/x.salt}}\" = \"public.x.y\"\n\
         [column.truncate]\n\"to.3.chars\" = \"public.users.city\"\n"
    );
    // The salt file is unreadable: the error names the key without the salt.
    let err = CaptureConfig::parse(&text, "test").unwrap_err().to_string();
    assert!(
        err.contains("column.mask.hash") && err.contains("/nonexistent/x.salt"),
        "{err}"
    );
    let text = text.replace(
        "${file:/nonexistent/x.salt}",
        "${env:ONCELY_CONFIG_TEST_SALT}",
    );
    let cfg = CaptureConfig::parse(&text, "test").unwrap();
    let policy = cfg.column_policy().unwrap();
    use crate::envelope::{ColumnAction, Mask};
    assert_eq!(
        policy.action("public", "users", "ssn"),
        ColumnAction::Exclude
    );
    assert_eq!(
        policy.action("public", "users", "name"),
        ColumnAction::Mask(&Mask::Chars(4))
    );
    assert_eq!(
        policy.action("public", "users", "city"),
        ColumnAction::Mask(&Mask::Truncate(3))
    );
    assert!(matches!(
        policy.action("public", "x", "y"),
        ColumnAction::Mask(Mask::Hash { .. })
    ));
    assert!(!format!("{cfg:?}{policy:?}").contains("pepper"));

    let both =
        format!("{MINIMAL}\ncolumn.include.list = \"a.b.c\"\ncolumn.exclude.list = \"a.b.d\"\n");
    let err = CaptureConfig::parse(&both, "test").unwrap_err().to_string();
    assert!(
        err.contains("column.include.list") && err.contains("both"),
        "{err}"
    );
    let bad = format!("{MINIMAL}\ncolumn.mask.with.many.chars = \"a.b.c\"\n");
    let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(err.contains("column.mask.with.many.chars"), "{err}");
    let typo = format!("{MINIMAL}\ncolumn.exclude.lst = \"a.b.c\"\n");
    let err = CaptureConfig::parse(&typo, "test").unwrap_err().to_string();
    assert!(err.contains("column.exclude.list"), "{err}");
}

#[test]
fn a_mysql_source_takes_debezium_s_mysql_keys() {
    use crate::sources::mysql::mapping::{DecimalHandlingMode, TimePrecisionMode};
    let text = "source = \"mysql\"\ntopic.prefix = \"shop\"\ndatabase.hostname = \"db\"\n\
                database.user = \"oncely\"\ndatabase.include.list = \"inventory, sales\"\n\
                table.include.list = \"inventory\\\\.orders\"\ndecimal.handling.mode = \"string\"\n\
                time.precision.mode = \"connect\"\ntinyint.one.as.boolean = true\n\
                kafka.bootstrap.servers = \"k:9092\"\n";
    let cfg = CaptureConfig::parse(text, "test").unwrap();
    assert_eq!(cfg.source, SourceKind::Mysql);
    assert_eq!(cfg.port(), DEFAULT_MYSQL_PORT);
    assert_eq!(cfg.database_include_list.0, vec!["inventory", "sales"]);
    let mapping = cfg.mysql_mapping();
    assert_eq!(mapping.decimal, DecimalHandlingMode::String);
    assert_eq!(mapping.time, TimePrecisionMode::Connect);
    assert!(mapping.tinyint_one_as_boolean);
    assert_eq!(
        cfg.table_topic("inventory", "orders"),
        "shop.inventory.orders"
    );
    // A MySQL source names databases in the list, not in database.dbname.
    let err = CaptureConfig::parse(&format!("{text}database.dbname = \"x\"\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("database.dbname"), "{err}");
    let err = CaptureConfig::parse(
        &format!(
            "{}database.include.list = \"(\"\n",
            text.replace("database.include.list = \"inventory, sales\"\n", "")
        ),
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("database.include.list"), "{err}");
}

#[test]
fn a_mysql_capture_needs_its_replica_id_and_takes_the_locking_mode() {
    use crate::sources::mysql::snapshot::SnapshotLockingMode;
    let text = "source = \"mysql\"\ntopic.prefix = \"shop\"\ndatabase.hostname = \"db\"\n\
                database.user = \"oncely\"\nkafka.bootstrap.servers = \"k:9092\"\n";
    // Verify reads without one: parsing accepts its absence, capture does not.
    let cfg = CaptureConfig::parse(text, "test").unwrap();
    let err = cfg.mysql_server_id().unwrap_err().to_string();
    assert!(
        err.contains("database.server.id") && err.contains("required"),
        "{err}"
    );
    assert_eq!(cfg.snapshot_locking_mode, SnapshotLockingMode::Minimal);
    let cfg = CaptureConfig::parse(
        &format!("{text}database.server.id = 5400\nsnapshot.locking.mode = \"none\"\n"),
        "test",
    )
    .unwrap();
    assert_eq!(cfg.mysql_server_id().unwrap(), 5400);
    assert_eq!(cfg.snapshot_locking_mode, SnapshotLockingMode::None);
    let err = CaptureConfig::parse(&format!("{text}database.server.id = 0\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("database.server.id"), "{err}");
    // A PostgreSQL source has no replica id.
    let err = CaptureConfig::parse(&format!("{MINIMAL}database.server.id = 5400\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("database.server.id"), "{err}");
}

#[test]
fn include_query_is_a_mysql_setting() {
    let mysql = "source = \"mysql\"\ntopic.prefix = \"shop\"\ndatabase.hostname = \"db\"\n\
                 database.user = \"oncely\"\nkafka.bootstrap.servers = \"k:9092\"\n";
    assert!(!CaptureConfig::parse(mysql, "test").unwrap().include_query);
    let cfg = CaptureConfig::parse(&format!("{mysql}include.query = true\n"), "test").unwrap();
    assert!(cfg.include_query);
    // PostgreSQL's stream has no statement: refused, not ignored.
    let err = CaptureConfig::parse(&format!("{MINIMAL}include.query = true\n"), "test")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("include.query") && err.contains("MySQL"),
        "{err}"
    );
}

#[test]
fn postgres_needs_its_database_and_keeps_its_port() {
    let text = MINIMAL.replace("database.dbname = \"shop\"\n", "");
    let err = CaptureConfig::parse(&text, "test").unwrap_err().to_string();
    assert!(err.contains("database.dbname"), "{err}");
    let cfg = CaptureConfig::parse(&format!("{MINIMAL}database.port = 6432\n"), "test").unwrap();
    assert_eq!((cfg.source, cfg.port()), (SourceKind::Postgres, 6432));
}

#[test]
fn registry_auth_strategies_and_name_modes_parse_as_debezium_users_write_them() {
    use oncely_core::avro::registry::SubjectStrategy;
    use oncely_core::avro::NameMode;
    let base = format!(
        "{MINIMAL}\nvalue.converter = \"avro\"\nschema.registry.url = \"https://registry:8081\"\n"
    );
    std::env::set_var("ONCELY_TEST_REGISTRY_INFO", "svc:pa55");
    let cfg = CaptureConfig::parse(
        &format!(
            "{base}schema.registry.basic.auth.user.info = \"${{env:ONCELY_TEST_REGISTRY_INFO}}\"
basic.auth.credentials.source = \"USER_INFO\"
schema.registry.ssl.ca.location = \"/etc/ca.pem\"
value.subject.name.strategy = \"io.confluent.kafka.serializers.subject.RecordNameStrategy\"
key.subject.name.strategy = \"TopicRecordNameStrategy\"
field.name.adjustment.mode = \"avro\"
schema.name.adjustment.mode = \"avro_unicode\"
"
        ),
        "test",
    )
    .unwrap();
    let access = cfg.registry_access().unwrap().unwrap();
    assert_eq!(access.user_info.unwrap().expose(), "svc:pa55");
    assert_eq!(access.ca_file.unwrap().to_str(), Some("/etc/ca.pem"));
    assert_eq!(cfg.value_subject_name_strategy, SubjectStrategy::RecordName);
    assert_eq!(
        cfg.key_subject_name_strategy,
        SubjectStrategy::TopicRecordName
    );
    assert_eq!(cfg.field_name_adjustment_mode, NameMode::Avro);
    assert_eq!(cfg.schema_name_adjustment_mode, NameMode::AvroUnicode);
    assert!(!format!("{cfg:?}").contains("pa55"), "never shown");

    for (extra, key) in [
        (
            "schema.registry.basic.auth.user.info = \"svc:pa55\"\n",
            "basic.auth.credentials.source",
        ),
        (
            "basic.auth.credentials.source = \"URL\"\n",
            "basic.auth.credentials.source",
        ),
        (
            "field.name.adjustment.mode = \"AVRO\"\n",
            "field.name.adjustment.mode",
        ),
        (
            "value.subject.name.strategy = \"Topic\"\n",
            "value.subject.name.strategy",
        ),
    ] {
        let e = CaptureConfig::parse(&format!("{base}{extra}"), "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && !e.contains("pa55"), "{extra}: {e}");
    }
}

#[test]
fn propagate_source_type_settings_parse_in_both_key_forms() {
    let text = format!(
        "{MINIMAL}\ncolumn.propagate.source.type = \"public\\\\.orders\\\\..*, public.users.name\"\n\
         [datatype.propagate]\nsource.type = [\"varchar\", \"NUMERIC\"]\n"
    );
    let policy = CaptureConfig::parse(&text, "test")
        .unwrap()
        .column_policy()
        .unwrap();
    assert!(policy.propagates("public", "orders", "total", "int4"));
    assert!(policy.propagates("public", "users", "name", "text"));
    assert!(policy.propagates("public", "users", "email", "VARCHAR"));
    assert!(policy.propagates("public", "users", "balance", "numeric"));
    assert!(!policy.propagates("public", "users", "email", "text"));
    let bad = format!("{MINIMAL}\ndatatype.propagate.source.type = \"(\"\n");
    // Refused at start, naming the key.
    let err = CaptureConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(err.contains("datatype.propagate.source.type"), "{err}");
}

/// The binlog stream of a MySQL source filters no rows: `table.filter`
/// would let every streamed row through while only snapshots obeyed it,
/// so it is refused, naming what works instead.
#[test]
fn a_mysql_source_refuses_table_filter_and_names_the_signals_filter_instead() {
    let text = "source = \"mysql\"\ntopic.prefix = \"shop\"\ndatabase.hostname = \"db\"\n\
                database.user = \"oncely\"\ndatabase.server.id = 5400\n\
                kafka.bootstrap.servers = \"k:9092\"\n";
    for mode in ["", "publication.autocreate.mode = \"filtered\"\n"] {
        let err = CaptureConfig::parse(
            &format!("{text}{mode}[table.filter]\n\"shop.orders\" = \"region = 'eu'\"\n"),
            "test",
        )
        .unwrap_err();
        assert_eq!(err.key, "table.filter", "{mode}: {err}");
        let err = err.to_string();
        assert!(
            err.contains("MySQL") && err.contains("additional-conditions"),
            "{mode}: {err}"
        );
        assert!(!err.contains("publication"), "{mode}: {err}");
    }
    assert!(CaptureConfig::parse(text, "test").is_ok());
}
