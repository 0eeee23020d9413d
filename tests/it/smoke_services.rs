//! Smoke tests of the real services started by `scripts/services up`: each one
//! proves the feature oncely relies on (logical decoding, Kafka transactions,
//! external versioning in Elasticsearch, atomic Lua in Redis).
//!
//! Run with `scripts/test` or `eval "$(scripts/services env)"; cargo test --test it -- smoke_services::`.
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::harness::common;

// ---------------------------------------------------------------------------
// PostgreSQL: pgoutput through pgwire-replication

#[tokio::test]
async fn postgres_logical_slot_streams_an_insert() -> Result<()> {
    use pgwire_replication::{
        Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
    };

    let url = common::pg_url();
    let cfg = tokio_postgres::Config::from_str(&url).context("parse ONCELY_PG_URL")?;
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("postgres connection: {e}");
        }
    });

    let table = common::unique("smoke_t");
    let publication = common::unique("smoke_pub");
    let slot = common::unique("smoke_slot");
    let marker = common::unique("row");

    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v text NOT NULL);
             CREATE PUBLICATION {publication} FOR TABLE {table};"
        ))
        .await?;
    let row = client
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await?;
    let start: String = row.get(0);
    let start = Lsn::parse(&start).map_err(|e| anyhow::anyhow!("bad lsn {start}: {e}"))?;

    client
        .execute(
            &format!("INSERT INTO {table} (id, v) VALUES (1, $1)"),
            &[&marker],
        )
        .await?;

    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        other => bail!("ONCELY_PG_URL needs a TCP host, got {other:?}"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let password = cfg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let repl_cfg = ReplicationConfig::new(
        host,
        cfg.get_user().unwrap_or("postgres"),
        password,
        cfg.get_dbname().unwrap_or("postgres"),
        slot.clone(),
        publication.clone(),
    )
    .with_port(port)
    .with_tls(TlsConfig::disabled())
    .with_start_lsn(start)
    .with_status_interval(Duration::from_secs(1));

    let outcome = async {
        let mut repl = ReplicationClient::connect(repl_cfg).await?;
        let (mut begin, mut insert, mut commit) = (false, false, false);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !commit {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = tokio::time::timeout(left, repl.recv())
                .await
                .context("no Begin/Insert/Commit within 30s")??
                .context("replication stream ended early")?;
            match ev {
                ReplicationEvent::Begin { .. } => begin = true,
                ReplicationEvent::XLogData { data, .. } if data.first() == Some(&b'I') => {
                    let needle = marker.as_bytes();
                    ensure!(
                        data.windows(needle.len()).any(|w| w == needle),
                        "insert message does not carry the inserted value"
                    );
                    insert = true;
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    if insert {
                        commit = true;
                    }
                    repl.update_applied_lsn(end_lsn);
                }
                _ => {}
            }
        }
        ensure!(begin && insert && commit, "begin={begin} insert={insert}");
        repl.shutdown().await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;

    // Clean up whatever happened; the slot may stay active for a moment.
    let mut dropped = Err(anyhow::anyhow!("slot not dropped"));
    for _ in 0..50 {
        match client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
        {
            Ok(_) => {
                dropped = Ok(());
                break;
            }
            Err(e) => {
                dropped = Err(e.into());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    client
        .batch_execute(&format!(
            "DROP PUBLICATION IF EXISTS {publication}; DROP TABLE IF EXISTS {table};"
        ))
        .await?;
    outcome?;
    dropped.context("drop replication slot")
}

// ---------------------------------------------------------------------------
// Kafka: transactions are real (aborted records hidden from read_committed)

#[tokio::test]
async fn kafka_transactions_hide_aborted_records() -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let brokers = common::kafka_brokers();
    let topic = common::unique("smoke_topic");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &opts,
        )
        .await?;
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }

    let txn_id = common::unique("smoke_txn");
    let (b, t) = (brokers.clone(), topic.clone());
    tokio::task::spawn_blocking(move || -> Result<()> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("transactional.id", &txn_id)
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "30000")
            .create()?;
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout)?;

        producer.begin_transaction()?;
        producer
            .send(BaseRecord::to(&t).key("k").payload("aborted").partition(0))
            .map_err(|(e, _)| e)?;
        producer.flush(timeout)?;
        producer.abort_transaction(timeout)?;

        producer.begin_transaction()?;
        producer
            .send(
                BaseRecord::to(&t)
                    .key("k")
                    .payload("committed")
                    .partition(0),
            )
            .map_err(|(e, _)| e)?;
        producer.commit_transaction(timeout)?;
        Ok(())
    })
    .await??;

    let committed = read_all(&brokers, &topic, "read_committed").await?;
    let uncommitted = read_all(&brokers, &topic, "read_uncommitted").await?;

    let _ = admin.delete_topics(&[&topic], &opts).await;

    assert_eq!(committed, vec!["committed".to_string()]);
    assert_eq!(
        uncommitted,
        vec!["aborted".to_string(), "committed".to_string()]
    );
    Ok(())
}

/// Payloads of partition 0 from the beginning up to its end, at one isolation level.
async fn read_all(brokers: &str, topic: &str, isolation: &str) -> Result<Vec<String>> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::Message;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", common::unique("smoke_group"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;

    let isolation = isolation.to_string();
    tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(500)) {
                None => {}
                Some(Ok(m)) => {
                    let payload = m.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                    out.push(payload.unwrap_or_default());
                }
                Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
                Some(Err(e)) => return Err(e.into()),
            }
        }
        bail!("no end of partition within 30s ({isolation}); got {out:?}")
    })
    .await?
}

// ---------------------------------------------------------------------------
// Elasticsearch: external versions reject stale writes with 409

#[tokio::test]
async fn elasticsearch_external_version_rejects_stale_writes() -> Result<()> {
    use elasticsearch::http::transport::Transport;
    use elasticsearch::indices::IndicesDeleteParts;
    use elasticsearch::params::VersionType;
    use elasticsearch::{Elasticsearch, GetParts, IndexParts};
    use serde_json::{json, Value};

    let client = Elasticsearch::new(Transport::single_node(&common::es_url())?);
    let index = common::unique("smoke_idx");

    let index_at = |version: i64| {
        client
            .index(IndexParts::IndexId(&index, "1"))
            .version(version)
            .version_type(VersionType::External)
            .body(json!({ "v": version }))
            .send()
    };

    let outcome = async {
        let r = index_at(5).await?;
        ensure!(
            r.status_code().is_success(),
            "version 5: {}",
            r.status_code()
        );
        let r = index_at(3).await?;
        ensure!(
            r.status_code().as_u16() == 409,
            "version 3: {}",
            r.status_code()
        );
        let r = index_at(6).await?;
        ensure!(
            r.status_code().is_success(),
            "version 6: {}",
            r.status_code()
        );

        let doc: Value = client
            .get(GetParts::IndexId(&index, "1"))
            .send()
            .await?
            .json()
            .await?;
        ensure!(
            doc["_version"] == 6 && doc["_source"]["v"] == 6,
            "stored {doc}"
        );
        Ok(())
    }
    .await;

    client
        .indices()
        .delete(IndicesDeleteParts::Index(&[&index]))
        .send()
        .await?;
    outcome
}

// ---------------------------------------------------------------------------
// Redis: an atomic compare-and-set in Lua

#[tokio::test]
async fn redis_lua_compare_and_set_by_version() -> Result<()> {
    let client = redis::Client::open(common::redis_url())?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let key = common::unique("smoke_key");

    // Store (version, value) only when the version is newer than the stored one.
    let cas = redis::Script::new(
        r#"
        local cur = redis.call('HGET', KEYS[1], 'version')
        if cur and tonumber(cur) >= tonumber(ARGV[1]) then
            return 0
        end
        redis.call('HSET', KEYS[1], 'version', ARGV[1], 'value', ARGV[2])
        return 1
        "#,
    );

    let outcome = async {
        let applied: i64 = cas
            .key(&key)
            .arg(5)
            .arg("five")
            .invoke_async(&mut con)
            .await?;
        ensure!(applied == 1, "first write not applied");
        let applied: i64 = cas
            .key(&key)
            .arg(3)
            .arg("three")
            .invoke_async(&mut con)
            .await?;
        ensure!(applied == 0, "older version applied");
        let applied: i64 = cas
            .key(&key)
            .arg(5)
            .arg("again")
            .invoke_async(&mut con)
            .await?;
        ensure!(applied == 0, "same version applied twice");
        let stored: (String, String) = redis::cmd("HMGET")
            .arg(&key)
            .arg("version")
            .arg("value")
            .query_async(&mut con)
            .await?;
        ensure!(stored == ("5".into(), "five".into()), "stored {stored:?}");
        let applied: i64 = cas
            .key(&key)
            .arg(6)
            .arg("six")
            .invoke_async(&mut con)
            .await?;
        ensure!(applied == 1, "newer version not applied");
        let value: String = redis::cmd("HGET")
            .arg(&key)
            .arg("value")
            .query_async(&mut con)
            .await?;
        ensure!(value == "six", "stored {value}");
        Ok(())
    }
    .await;

    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut con).await?;
    outcome
}
