//! The root package's integration tests, one binary (linking rdkafka and the
//! rest once, not once per file). Modules group them for filters:
//! `cargo test --test it -- capture::` runs every capture test (what
//! `scripts/test` runs again on PostgreSQL 17 and 18), `e2e::`, `sink::`, or
//! one file such as `names_keys::`. Shared set-up lives in [`harness`].
mod harness;

mod capture;
mod e2e;
mod sink;

mod capture_quarantine;
mod config_keys;
mod ddl_under_sigkills;
mod debezium_compat;
mod debezium_mariadb;
mod dedup_window;
mod doc_links;
mod every_shape;
mod health_endpoints;
mod kafka_sasl;
mod metrics_catalog;
mod mysql_binlog;
mod mysql_capture;
mod mysql_chunks;
mod mysql_ddl;
mod mysql_ddl_under_sigkills;
mod mysql_envelope;
mod mysql_failover;
mod mysql_filters;
mod mysql_gap;
mod mysql_query;
mod mysql_server_settings;
mod mysql_snapshot;
mod mysql_stream;
mod names_keys;
mod secrets_never_shown;
mod smoke_services;
mod status_cli;
mod status_mysql;
mod verify_targets;
mod warehouse_rename;
