//! The postgres sink over TLS against the real PostgreSQL of `scripts/services`
//! (which turns `ssl = on` with a certificate of its own CA, exported as
//! `ONCELY_PG_SSLROOTCERT`): each `sslmode` connects as documented, the sink's
//! connections really are TLS (`pg_stat_ssl`), and a wrong CA or host name is
//! refused by the modes that check them.

use std::sync::Arc;

use oncely_core::postgres::SslMode;
use oncely_sinks::event::{decode_key, decode_value};
use oncely_sinks::kinds::postgres::{PostgresConfig, PostgresSink};
use oncely_sinks::{Batch, Record, Sink, SinkError};
use oncely_testkit::kafka::unique;
use oncely_testkit::tls;
use serde_json::json;
use tokio_postgres::{Client, NoTls};

fn env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{name} is not set: run `scripts/services up pg` (it enables TLS) and \
             `eval \"$(scripts/services env)\"`, or scripts/test"
        ),
    }
}

/// Host, port and user of the test server.
fn server() -> (String, u16, String) {
    let config: tokio_postgres::Config = env("ONCELY_PG_URL").parse().expect("ONCELY_PG_URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    (host, port, user)
}

async fn connect(conninfo: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A database of its own: (name, admin client).
async fn database() -> (String, Client) {
    let (host, port, user) = server();
    let admin = connect(&format!(
        "host={host} port={port} user={user} dbname=postgres"
    ))
    .await;
    let name = unique("tls");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    (name, admin)
}

fn config(conninfo: String, mode: SslMode, ca: Option<String>) -> PostgresConfig {
    let mut c = PostgresConfig::new(conninfo);
    c.sslmode = mode;
    c.sslrootcert = ca;
    c.connect_timeout_ms = 5_000;
    c
}

/// Applies one change and checks that every connection of the sink to `db`
/// uses TLS; returns the client certificate DNs they presented ("" for none).
async fn applies_over_tls(cfg: &PostgresConfig, db: &str, admin: &Client) -> Vec<String> {
    cfg.validate().expect("valid config");
    let sink = PostgresSink::connect(cfg).await.expect("connect over TLS");
    let value = json!({"before": null, "op": "c",
        "after": {"id": 1, "note": "over tls"},
        "source": {"schema": "public", "table": "items", "commit_lsn": 10, "event_seq": 0}});
    let record = Record::new(
        0,
        decode_key(Some(json!({"id": 1}).to_string().as_bytes())).expect("key"),
        decode_value(Some(value.to_string().as_bytes())).expect("value"),
    );
    let batch = Batch::new(Arc::from("g"), (Arc::from("t"), 0), vec![record], 1);
    sink.apply(&batch).await.expect("apply over TLS");
    let rows = admin
        .query(
            "SELECT s.ssl, coalesce(s.client_dn, '') FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = $1 AND a.application_name = 'oncely-sink-postgres'",
            &[&db],
        )
        .await
        .expect("pg_stat_ssl");
    assert!(!rows.is_empty(), "no connection of the sink seen");
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(0)),
        "a connection of the sink is not TLS"
    );
    sink.shutdown().await.expect("shutdown");
    rows.iter().map(|r| r.get(1)).collect()
}

async fn drop_database(admin: &Client, db: &str) {
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .expect("drop database");
}

/// A refused connection: fatal (retrying cannot fix a certificate), and its
/// causes name the certificate.
fn assert_refused(result: Result<PostgresSink, SinkError>, what: &str) {
    let e = match result {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => e,
    };
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    assert!(e.is_fatal(), "{what}: not fatal: {text}");
    assert!(
        text.to_lowercase().contains("certificate"),
        "{what}: {text}"
    );
}

#[tokio::test]
async fn require_and_verify_full_connect_over_tls() {
    let ca = env("ONCELY_PG_SSLROOTCERT");
    let (host, port, user) = server();
    let (db, admin) = database().await;
    let conninfo = format!("host={host} port={port} user={user} dbname={db}");
    // Encryption without checking the certificate.
    applies_over_tls(
        &config(conninfo.clone(), SslMode::Require, None),
        &db,
        &admin,
    )
    .await;
    // The chain and the name (the certificate names 127.0.0.1 and localhost).
    applies_over_tls(
        &config(conninfo.clone(), SslMode::VerifyFull, Some(ca.clone())),
        &db,
        &admin,
    )
    .await;
    let by_name = format!("host=localhost port={port} user={user} dbname={db}");
    applies_over_tls(&config(by_name, SslMode::VerifyFull, Some(ca)), &db, &admin).await;
    drop_database(&admin, &db).await;
}

#[tokio::test]
async fn verification_refuses_a_wrong_ca_and_verify_full_a_wrong_name() {
    let ca = env("ONCELY_PG_SSLROOTCERT");
    let (_, port, user) = server();
    let (db, admin) = database().await;
    // The right address under a name the certificate does not carry.
    let wrong_name = format!(
        "host=oncely-not-in-the-certificate hostaddr=127.0.0.1 port={port} user={user} dbname={db}"
    );
    let right_name = format!("host=127.0.0.1 port={port} user={user} dbname={db}");
    assert_refused(
        PostgresSink::connect(&config(
            wrong_name.clone(),
            SslMode::VerifyFull,
            Some(ca.clone()),
        ))
        .await,
        "verify-full with a certificate for another name",
    );
    // verify-ca checks the chain only: the same connection is accepted.
    applies_over_tls(
        &config(wrong_name, SslMode::VerifyCa, Some(ca)),
        &db,
        &admin,
    )
    .await;
    let dir = std::env::temp_dir().join(unique("oncely_other_ca"));
    std::fs::create_dir_all(&dir).expect("dir");
    let other = tls::unrelated_ca(&dir).expect("another CA");
    let other_ca = other.display().to_string();
    for mode in [SslMode::VerifyCa, SslMode::VerifyFull, SslMode::Require] {
        assert_refused(
            PostgresSink::connect(&config(right_name.clone(), mode, Some(other_ca.clone()))).await,
            &format!("{mode:?} with a certificate of an unknown CA"),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop_database(&admin, &db).await;
}

#[tokio::test]
async fn a_client_certificate_is_presented() {
    let ca = env("ONCELY_PG_SSLROOTCERT");
    // A role `pg_hba.conf` accepts only over TLS with a client certificate
    // (`clientcert=verify-full`), provisioned by `scripts/services up`.
    let role = env("ONCELY_PG_CERT_USER");
    let cert = env("ONCELY_PG_SSLCERT");
    let (host, port, _) = server();
    let (db, admin) = database().await;
    admin
        .batch_execute(&format!("ALTER DATABASE {db} OWNER TO {role}"))
        .await
        .expect("hand the database over");
    let conninfo = format!("host={host} port={port} user={role} dbname={db}");
    let without = config(conninfo.clone(), SslMode::VerifyFull, Some(ca.clone()));
    let refused = PostgresSink::connect(&without).await;
    assert!(refused.is_err(), "connected without a client certificate");
    let mut with = without;
    with.sslcert = Some(cert);
    // The key file's path through a reference, as a secret may be given
    // (to a variable `scripts/services env` sets: setting one here would
    // change the environment every test in this process shares).
    // (resolved here by hand, as reading a configuration file resolves it).
    let key = oncely_core::Secret::new("${env:ONCELY_PG_SSLKEY}");
    with.sslkey = Some(key.resolve().expect("ONCELY_PG_SSLKEY is set"));
    let dns = applies_over_tls(&with, &db, &admin).await;
    let expected = format!("/CN={role}");
    assert!(dns.iter().all(|dn| *dn == expected), "{dns:?}");
    drop_database(&admin, &db).await;
}

#[tokio::test]
async fn a_server_that_requires_ssl_is_named_with_the_key_to_set() {
    // A role `pg_hba.conf` accepts only over `hostssl` (scripts/services up).
    let role = env("ONCELY_PG_TLS_USER");
    let password = env("ONCELY_PG_TLS_PASSWORD");
    let (host, port, _) = server();
    let (db, admin) = database().await;
    let mut plain = config(
        format!("host={host} port={port} user={role} dbname={db}"),
        SslMode::Disable,
        None,
    );
    plain.password = Some(oncely_core::Secret::new(password));
    let e = match PostgresSink::connect(&plain).await {
        Ok(_) => panic!("connected without TLS"),
        Err(e) => e,
    };
    assert!(e.is_fatal(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("requires SSL") && text.contains("sink.sslmode"),
        "{text}"
    );
    drop_database(&admin, &db).await;
}

#[test]
fn tls_settings_are_checked() {
    let with = |mode, ca: Option<&str>| config("postgres://h/db".into(), mode, ca.map(Into::into));
    assert_eq!(
        with(SslMode::VerifyFull, None)
            .validate()
            .expect_err("no CA")
            .key,
        "sink.sslrootcert"
    );
    assert_eq!(
        with(SslMode::Disable, Some("/ca.pem"))
            .validate()
            .expect_err("CA without TLS")
            .key,
        "sink.sslrootcert"
    );
    let in_url = config(
        "postgres://h/db?sslmode=require".into(),
        SslMode::Disable,
        None,
    );
    assert_eq!(
        in_url.validate().expect_err("sslmode in URL").key,
        "sink.url"
    );
    with(SslMode::Require, None)
        .validate()
        .expect("require alone");
    with(SslMode::Prefer, None).validate().expect("prefer");
    let mut cert_only = with(SslMode::Require, None);
    cert_only.sslcert = Some("/client.crt".into());
    assert_eq!(cert_only.validate().expect_err("no key").key, "sink.sslkey");
}
