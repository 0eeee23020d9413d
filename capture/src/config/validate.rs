//! [`CaptureConfig::validate`]: values that parse but cannot work, each
//! error naming its key and the fix.

use super::{
    CaptureConfig, ConfigError, DEFAULT_OFFSETS_TOPIC_PREFIX, DEFAULT_READY_MAX_LAG_MS,
    DEFAULT_SNAPSHOT_CHUNK_SIZE, MAX_MESSAGE_BYTES_LIMIT, MAX_SNAPSHOT_CHUNK_SIZE,
};

/// Librdkafka properties a user may not override: they carry the exactly-once guarantee.
/// What a transaction's commit is given beyond `batch.max.ms` at least.
const MIN_COMMIT_MS: u64 = 1_000;

const RESERVED_PRODUCER_KEYS: &[&str] = &[
    "transactional.id",
    "enable.idempotence",
    "isolation.level",
    "bootstrap.servers",
];

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::new(key, message)
}

impl CaptureConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_names()?;
        self.tls().check()?;
        self.validate_batching()?;
        self.validate_kafka()?;
        self.validate_topics()?;
        self.validate_message_size()?;
        self.validate_tables()?;
        self.validate_snapshot()?;
        self.validate_monitoring()?;
        self.validate_converters()?;
        Ok(())
    }

    /// `avro` needs a registry, and the schemas it converts.
    fn validate_converters(&self) -> Result<(), ConfigError> {
        let avro = [
            ("key.converter", self.key_converter),
            ("value.converter", self.value_converter),
        ]
        .into_iter()
        .find(|(_, c)| *c == super::Converter::Avro);
        let Some((key, _)) = avro else {
            return Ok(());
        };
        self.registry_access()?;
        match self.schema_registry_url.as_deref() {
            None | Some("") => Err(invalid(
                "schema.registry.url",
                format!("{key} = \"avro\" needs the schema registry's URL"),
            )),
            _ if !self.schemas_enable => Err(invalid(
                "schemas.enable",
                format!("{key} = \"avro\" writes the schema of every record (in the registry): schemas.enable must stay true"),
            )),
            _ => Ok(()),
        }
    }

    /// `topic.prefix`, `slot.name` and `publication.name`.
    fn validate_names(&self) -> Result<(), ConfigError> {
        let prefix = &self.topic_prefix;
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(invalid(
                "topic.prefix",
                format!("{prefix:?} must be non-empty and use only letters, digits, '.', '_' and '-' (Kafka topic characters)"),
            ));
        }
        if !is_identifier(&self.slot_name) {
            return Err(invalid(
                "slot.name",
                format!(
                    "{:?} must be lower-case letters, digits and '_' (PostgreSQL slot name rules)",
                    self.slot_name
                ),
            ));
        }
        if self.publication_name.is_empty() {
            return Err(invalid("publication.name", "must not be empty"));
        }
        match self.source {
            super::SourceKind::Postgres if self.database_dbname.is_empty() => Err(invalid(
                "database.dbname",
                "required: the captured PostgreSQL database",
            )),
            super::SourceKind::Mysql if !self.database_dbname.is_empty() => Err(invalid(
                "database.dbname",
                "a MySQL source names its databases in database.include.list",
            )),
            super::SourceKind::Mysql if self.database_server_id == Some(0) => Err(invalid(
                "database.server.id",
                "must be from 1 to 4294967295: 0 is no replica id",
            )),
            super::SourceKind::Postgres if self.database_server_id.is_some() => Err(invalid(
                "database.server.id",
                "is a MySQL source's replica id; a PostgreSQL source has none",
            )),
            // pgoutput does not carry the statement (nor has Debezium's
            // PostgreSQL connector the key): refused, not ignored.
            super::SourceKind::Postgres if self.include_query => Err(invalid(
                "include.query",
                "is a MySQL source's setting: PostgreSQL's logical decoding does not carry the statement of a change; remove it",
            )),
            _ => Ok(()),
        }
    }

    /// `database.server.id`, which capture of a MySQL source needs (verify
    /// reads without registering as a replica, so parsing does not ask
    /// for it).
    pub fn mysql_server_id(&self) -> Result<u32, ConfigError> {
        self.database_server_id.ok_or_else(|| {
            invalid(
                "database.server.id",
                "required for capture of a MySQL source: a replica server id unique among the \
                 server and its replicas (and other captures of it), e.g. 5400",
            )
        })
    }

    /// `batch.*` and `heartbeat.interval.ms`.
    fn validate_batching(&self) -> Result<(), ConfigError> {
        if self.batch_max_events == 0 {
            return Err(invalid("batch.max.events", "must be at least 1"));
        }
        if self.batch_max_bytes < 1024 {
            return Err(invalid("batch.max.bytes", "must be at least 1024"));
        }
        if self.batch_max_ms == 0 {
            return Err(invalid("batch.max.ms", "must be at least 1"));
        }
        if self.heartbeat_interval_ms == Some(0) {
            return Err(invalid(
                "heartbeat.interval.ms",
                "must be positive (omit it for the default of 10000)",
            ));
        }
        Ok(())
    }

    /// `kafka.bootstrap.servers`, `kafka.producer`, the transaction timeout and
    /// `topic.creation.default.partitions`.
    fn validate_kafka(&self) -> Result<(), ConfigError> {
        if self.kafka_bootstrap_servers.trim().is_empty() {
            return Err(invalid(
                "kafka.bootstrap.servers",
                "must name at least one broker",
            ));
        }
        if let Some(key) = self
            .kafka_producer
            .keys()
            .find(|k| RESERVED_PRODUCER_KEYS.contains(&k.as_str()))
        {
            return Err(invalid(
                "kafka.producer",
                format!("`{key}` is set by oncely itself (it carries the exactly-once guarantee); remove it"),
            ));
        }
        self.validate_transaction_timeout()?;
        if self.topic_partitions < 1 {
            return Err(invalid(
                "topic.creation.default.partitions",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The table filter, `message.key.columns` and the outbox.
    fn validate_tables(&self) -> Result<(), ConfigError> {
        crate::filter::TableFilter::new(&self.table_include_list.0, &self.table_exclude_list.0)
            .map_err(|e| invalid("table.include.list", e.to_string()))?;
        crate::filter::TableFilter::new(&self.database_include_list.0, &[])
            .map_err(|e| invalid("database.include.list", e.to_string()))?;
        crate::filter::parse_key_columns(self.message_key_columns.as_deref())
            .map_err(|e| invalid("message.key.columns", e))?;
        self.column_policy()?;
        if let Some(outbox) = &self.outbox {
            outbox
                .validate()
                .map_err(|(key, message)| invalid(key, message))?;
        }
        self.validate_row_filters()
    }

    /// `table.filter`: each key a `schema.table`, each filter one boolean
    /// expression of the snapshot filter's rules (it runs in the chunk
    /// SELECT and in `oncely verify` as well as in the publication). A
    /// publication FOR ALL TABLES cannot carry row filters. A MySQL source's
    /// binlog stream filters no rows: there `table.filter` would hold for
    /// snapshots only and let every streamed row through, so it is refused.
    fn validate_row_filters(&self) -> Result<(), ConfigError> {
        if self.source == super::SourceKind::Mysql && !self.table_filter.is_empty() {
            return Err(invalid(
                "table.filter",
                "a MySQL source does not filter the rows of its binlog stream, so table.filter would let every streamed row through: remove it (to snapshot a subset of a table's rows, send an execute-snapshot signal with additional-conditions; see docs/mysql.md)",
            ));
        }
        for (table, filter) in &self.table_filter {
            let key = format!("table.filter.{table}");
            let Some((schema, name)) = crate::snapshot::split_table(table) else {
                return Err(invalid(
                    "table.filter",
                    format!("key {table:?} must be <schema>.<table>, spelled as the catalog spells them"),
                ));
            };
            crate::snapshot::signal::check_filter_on(filter, schema, name)
                .map_err(|why| invalid(&key, why))?;
        }
        if !self.table_filter.is_empty()
            && self.publication_autocreate_mode == super::AutocreateMode::AllTables
        {
            return Err(invalid(
                "publication.autocreate.mode",
                "a publication FOR ALL TABLES cannot filter rows, and table.filter is set: use publication.autocreate.mode = \"filtered\" (or \"disabled\" with a publication that carries the filters)",
            ));
        }
        Ok(())
    }

    /// `slot.max.retained.bytes`, `health.ready.max.lag.ms` and `metrics.listen`.
    fn validate_monitoring(&self) -> Result<(), ConfigError> {
        if self.slot_max_retained_bytes == Some(0) {
            return Err(invalid(
                "slot.max.retained.bytes",
                "0 would report every slot; leave it unset for no limit".to_owned(),
            ));
        }
        if let Some(ms) = self.health_ready_max_lag_ms {
            if !(100..=86_400_000).contains(&ms) {
                return Err(invalid(
                    "health.ready.max.lag.ms",
                    format!("{ms} must be between 100 and 86400000 (default {DEFAULT_READY_MAX_LAG_MS})"),
                ));
            }
        }
        if let Some(listen) = &self.metrics_listen {
            listen.parse::<std::net::SocketAddr>().map_err(|e| {
                invalid(
                    "metrics.listen",
                    format!("{listen:?} is not host:port ({e})"),
                )
            })?;
        }
        Ok(())
    }

    /// `offset.storage.topic` (or the name that makes the default one) and
    /// `topic.name.mapping`.
    fn validate_topics(&self) -> Result<(), ConfigError> {
        match &self.offset_storage_topic {
            Some(topic) if !is_topic_name(topic) => {
                return Err(invalid(
                    "offset.storage.topic",
                    format!("{topic:?} must be 1 to 249 letters, digits, '.', '_' and '-' (Kafka topic characters)"),
                ));
            }
            Some(_) => {}
            None if !is_topic_name(&self.offsets_topic()) => {
                return Err(invalid(
                    "name",
                    format!(
                        "{:?} cannot name the default offsets topic {DEFAULT_OFFSETS_TOPIC_PREFIX}<name>: use letters, digits, '.', '_' and '-', or set offset.storage.topic",
                        self.connector_name()
                    ),
                ));
            }
            None => {}
        }
        for (table, topic) in &self.topic_name_mapping {
            if crate::snapshot::split_table(table).is_none() {
                return Err(invalid(
                    "topic.name.mapping",
                    format!("key {table:?} must be <schema>.<table>, spelled as the catalog spells them"),
                ));
            }
            if !is_topic_name(topic) {
                return Err(invalid(
                    "topic.name.mapping",
                    format!("topic {topic:?} of {table} must be 1 to 249 letters, digits, '.', '_' and '-' (Kafka topic characters)"),
                ));
            }
        }
        Ok(())
    }

    /// `incremental.snapshot.chunk.size` and `signal.data.collection`.
    fn validate_snapshot(&self) -> Result<(), ConfigError> {
        let chunk = self.incremental_snapshot_chunk_size;
        if chunk == 0 || chunk > MAX_SNAPSHOT_CHUNK_SIZE {
            return Err(invalid(
                "incremental.snapshot.chunk.size",
                format!("{chunk} must be between 1 and {MAX_SNAPSHOT_CHUNK_SIZE} (default {DEFAULT_SNAPSHOT_CHUNK_SIZE})"),
            ));
        }
        if let Some(signal) = &self.signal_data_collection {
            if signal.split('.').count() != 2 || signal.split('.').any(str::is_empty) {
                return Err(invalid(
                    "signal.data.collection",
                    format!("{signal:?} must be a schema-qualified table, e.g. \"public.oncely_signal\""),
                ));
            }
            if self.outbox.as_ref().is_some_and(|o| &o.table == signal) {
                return Err(invalid(
                    "signal.data.collection",
                    format!("{signal} is also outbox.table; give signals a table of their own"),
                ));
            }
        }
        Ok(())
    }

    /// A transaction must outlive its batch (`batch.max.ms`) and its
    /// commit; the broker's `transaction.max.timeout.ms` bounds it from above
    /// and is checked by the broker at start (`TxProducer::connect`).
    fn validate_transaction_timeout(&self) -> Result<(), ConfigError> {
        let raw = self.kafka_producer.get("transaction.timeout.ms");
        let Some(ms) = self.transaction_timeout_ms() else {
            return Err(invalid(
                "kafka.producer",
                format!("`transaction.timeout.ms` = {raw:?} is not a number of milliseconds"),
            ));
        };
        let floor = self.batch_max_ms.saturating_add(MIN_COMMIT_MS);
        if ms < floor {
            return Err(invalid(
                "kafka.producer",
                format!("`transaction.timeout.ms` = {ms} leaves a transaction too little time: it must be at least batch.max.ms + {MIN_COMMIT_MS} = {floor} (default {})", super::DEFAULT_TRANSACTION_TIMEOUT_MS),
            ));
        }
        Ok(())
    }

    fn validate_message_size(&self) -> Result<(), ConfigError> {
        if let Some(raw) = self.kafka_producer.get("message.max.bytes") {
            if self.producer_message_max_bytes().is_none() {
                return Err(invalid(
                    "kafka.producer",
                    format!("`message.max.bytes` = {raw:?} is not a number of bytes"),
                ));
            }
        }
        let (key, bytes) = match self.topic_max_message_bytes {
            Some(b) => ("topic.creation.default.max.message.bytes", b),
            None => ("kafka.producer", self.max_message_bytes()),
        };
        if !(1024..=MAX_MESSAGE_BYTES_LIMIT).contains(&bytes) {
            return Err(invalid(
                key,
                format!("{bytes} bytes: the record size limit must be between 1024 and {MAX_MESSAGE_BYTES_LIMIT}"),
            ));
        }
        if let Some(producer) = self.producer_message_max_bytes() {
            if producer > bytes {
                return Err(invalid(
                    "kafka.producer",
                    format!("`message.max.bytes` = {producer} is larger than topic.creation.default.max.message.bytes = {bytes}: the topics would refuse what the producer sends; set both to the same value"),
                ));
            }
        }
        Ok(())
    }
}

fn is_topic_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 249
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
