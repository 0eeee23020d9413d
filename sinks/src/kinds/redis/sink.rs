//! The `redis` sink: connection, positions, and one script call per chunk.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, TlsCertificates};

use super::calls::{Calls, Part};
use super::config::{Layout, RedisConfig};
use super::error::{classify, is_noscript};
use super::keys::KeyPattern;
use super::plan::{keys_to_merge, merge_json, plan, Change, Naming};
use super::script::{position_field, Reply, HASH_SCRIPT, JSON_SCRIPT, TRUNCATE_SCRIPT};
use super::transaction::{
    fence_key, truncates_key, Keys, Outcome, TransactionPath, SCRIPT_WRITER, WRITER,
};
use crate::error::{RecordFailure, SinkError};
use crate::naming::TargetClaims;
use crate::native::ValueFormat;
use crate::sink::{Batch, Positions, Sink, TopicPartition};

/// First delay of the reconnect backoff.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// The `redis` sink (see the module docs of [`super`]). Owns its positions.
pub struct RedisSink {
    pub(super) conn: ConnectionManager,
    /// The transaction path (hash layout without `ttl.seconds`; see [`super::transaction`]).
    pub(super) tx_path: Option<TransactionPath>,
    pub(super) fence_prefix: String,
    /// The scripts' SHAs and the settings each call passes.
    pub(super) calls: Calls,
    pub(super) value_format: ValueFormat,
    pub(super) keys: KeyPattern,
    pub(super) positions_prefix: String,
    pub(super) keyset_prefix: String,
    /// Which table each key prefix belongs to (`{table}:{key}` merges
    /// tables of one name in two schemas).
    pub(super) claims: TargetClaims,
}

/// Why a client could not be made from the configuration.
pub(super) enum OpenError {
    /// A setting that cannot be used (which, and why): fixing it is the way out.
    Setting(String, crate::error::BoxError),
    /// The client refused the connection info.
    Redis(redis::RedisError),
}

/// A client for `sink.url` with the configured credentials and TLS settings
/// (`rediss://`, `tls.ca.file`), and the address it goes to, for errors
/// (the URL may hold a password). The sink and its verify reader both use it.
pub(super) fn open_client(config: &RedisConfig) -> Result<(Client, String), OpenError> {
    let mut info = config
        .url
        .as_str()
        .into_connection_info()
        .map_err(|e| OpenError::Setting("invalid `sink.url`".into(), e.into()))?;
    if let Some(password) = &config.password {
        let mut settings = info
            .redis_settings()
            .clone()
            .set_password(password.expose());
        if let Some(user) = &config.username {
            settings = settings.set_username(user);
        }
        info = info.set_redis_settings(settings);
    }
    let place = info.addr().to_string();
    let tls = config.url.trim().starts_with("rediss://");
    if tls {
        oncely_core::tls::provider();
    }
    let client = match (&config.tls_ca_file, tls) {
        (Some(path), true) => {
            let pem = std::fs::read(path)
                .map_err(|e| OpenError::Setting(format!("`sink.tls.ca.file` {path}"), e.into()))?;
            let certs = TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            Client::build_with_tls(info, certs)
        }
        _ => Client::open(info),
    }
    .map_err(OpenError::Redis)?;
    Ok((client, place))
}

impl RedisSink {
    /// Connects (with AUTH/TLS as configured), loads the script, and warns when
    /// Redis does not persist what the sink writes.
    pub async fn connect(config: &RedisConfig) -> Result<Self, SinkError> {
        let (client, place) = open_client(config).map_err(|e| match e {
            OpenError::Setting(what, e) => SinkError::fatal_from(format!("redis: {what}"), e),
            OpenError::Redis(e) => classify("open client", e),
        })?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.response_timeout()))
            .set_min_delay(RECONNECT_BACKOFF_MIN)
            .set_max_delay(Duration::from_millis(config.reconnect_backoff_max_ms))
            .set_number_of_retries(config.reconnect_retries);
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config)
            .await
            .map_err(|e| classify(&format!("connect to {place}"), e))?;
        let tx_path = (config.layout == Layout::Hash && config.ttl_ms() == 0).then(|| {
            let conn_config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout()))
                .set_response_timeout(Some(config.response_timeout()));
            TransactionPath::new(client, conn_config, config.fence_prefix.clone())
        });
        let mut sink = Self {
            conn,
            tx_path,
            fence_prefix: config.fence_prefix.clone(),
            calls: Calls {
                sha: String::new(),
                truncate_sha: String::new(),
                layout: config.layout,
                version_prefix: config.version_prefix.clone(),
                version_field: config.version_field.clone(),
                ttl_ms: config.ttl_ms(),
                tombstone_ttl_ms: config.tombstone_ttl_ms(),
                max_changes: config.script_max_changes,
                max_bytes: config.script_max_bytes,
            },
            value_format: config.value_format,
            keys: KeyPattern::new(&config.key_pattern, &config.key_separator),
            positions_prefix: config.positions_prefix.clone(),
            keyset_prefix: config.keyset_prefix.clone(),
            claims: TargetClaims::new("key prefix", "sink.key.pattern"),
        };
        sink.calls.sha = sink.load_script(sink.script()).await?;
        sink.calls.truncate_sha = sink.load_script(TRUNCATE_SCRIPT).await?;
        sink.warn_without_persistence().await;
        Ok(sink)
    }

    /// The hash holding `group`'s positions.
    pub fn positions_key(&self, group: &str) -> String {
        format!("{}{group}", self.positions_prefix)
    }

    /// The key holding a row's tombstone after a delete (and, in the JSON
    /// layout, the version of a live row too).
    pub fn version_key(&self, row_key: &str) -> String {
        self.calls.version_key(row_key)
    }

    /// The batch's changes, or the records that can never be applied.
    fn plan(&self, batch: &Batch) -> PlanResult {
        let naming = Naming {
            keys: &self.keys,
            version_field: &self.calls.version_field,
            keyset_prefix: &self.keyset_prefix,
        };
        plan(batch, self.calls.layout, self.value_format, naming)
    }

    fn script(&self) -> &'static str {
        match self.calls.layout {
            Layout::Hash => HASH_SCRIPT,
            Layout::Json => JSON_SCRIPT,
        }
    }

    async fn load_script(&self, script: &str) -> Result<String, SinkError> {
        let mut conn = self.conn.clone();
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut conn)
            .await
            .map_err(|e| classify("SCRIPT LOAD", e))
    }

    /// Positions live in Redis: without persistence a Redis restart loses them
    /// (and the rows), and the partitions start over from `auto.offset.reset`.
    async fn warn_without_persistence(&self) {
        let mut conn = self.conn.clone();
        let aof: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut conn)
            .await;
        if let Ok(v) = aof {
            if v.get(1).map(String::as_str) == Some("no") {
                tracing::warn!(
                    "redis runs without an append-only file: a Redis restart may lose rows and \
                     positions (the sink then re-reads from `auto.offset.reset`); \
                     run it with `appendonly yes`"
                );
            }
        }
    }

    /// Reads the stored JSON rows and versions that partial JSON updates merge with.
    async fn prefetch(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, (Option<String>, Option<String>)>, SinkError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("MGET");
        for k in &keys {
            cmd.arg(self.version_key(k)).arg(k);
        }
        let values: Vec<Option<String>> = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| classify("MGET rows to merge", e))?;
        let mut values = values.into_iter();
        Ok(keys
            .into_iter()
            .map(|k| {
                let version = values.next().flatten();
                let json = values.next().flatten();
                (k, (version, json))
            })
            .collect())
    }

    /// Runs `evalsha` of `script` (whose SHA is `sha`) in one transaction
    /// after `mark` (which tells the transaction path that keys changed, see
    /// [`super::transaction`]), and on `NOSCRIPT` (Redis restarted or flushed its
    /// scripts) `SCRIPT LOAD` then both once more.
    async fn eval<T: redis::FromRedisValue + Send>(
        &self,
        mark: &redis::Cmd,
        evalsha: &redis::Cmd,
        (script, sha): (&str, &str),
    ) -> Result<T, SinkError> {
        let conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(mark.clone())
            .ignore()
            .add_command(evalsha.clone());
        let query = |mut conn: ConnectionManager| {
            let pipe = pipe.clone();
            async move { pipe.query_async::<(T,)>(&mut conn).await.map(|(t,)| t) }
        };
        match query(conn.clone()).await {
            Ok(r) => Ok(r),
            Err(e) if is_noscript(&e) => {
                tracing::info!("redis does not know the script (restarted?): loading it again");
                let loaded = self.load_script(script).await?;
                if loaded != sha {
                    return Err(SinkError::fatal(format!(
                        "redis: SCRIPT LOAD returned SHA {loaded}, expected {sha}"
                    )));
                }
                query(conn)
                    .await
                    .map_err(|e| classify("EVALSHA after SCRIPT LOAD", e))
            }
            Err(e) => Err(classify("EVALSHA", e)),
        }
    }

    /// Runs one call of the changes script for `tp`, marking its fence.
    async fn call(&self, tp: &TopicPartition, evalsha: &redis::Cmd) -> Result<Reply, SinkError> {
        let mut mark = redis::cmd("HSET");
        mark.arg(fence_key(&self.fence_prefix, tp))
            .arg(WRITER)
            .arg(SCRIPT_WRITER);
        let reply: Vec<i64> = self
            .eval(&mark, evalsha, (self.script(), &self.calls.sha))
            .await?;
        Reply::parse(&reply).ok_or_else(|| {
            SinkError::retriable(format!("redis: unexpected script reply {reply:?}"))
        })
    }

    /// Refuses a batch whose table's keys another table writes to.
    fn claim_keys(&self, batch: &Batch) -> Result<(), SinkError> {
        for (event, schema, table) in batch.table_runs() {
            let db = event
                .source
                .get("db")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            let part = self.keys.table_part(batch.topic(), [db, schema, table]);
            self.claims.claim(&part, schema, table)?;
        }
        Ok(())
    }

    /// Applies one truncate in calls of at most `script.max.changes` members;
    /// `position` is stored by the call that finishes it. Returns the rows removed.
    async fn truncate(
        &self,
        positions_key: &str,
        truncate: &Change,
        position: Option<(&str, i64)>,
    ) -> Result<u64, SinkError> {
        let mut cursor = String::from("0");
        let mut removed = 0;
        // Rows of other partitions' keys go too: their caches must be dropped.
        let mut mark = redis::cmd("INCR");
        mark.arg(truncates_key(&self.fence_prefix));
        loop {
            let cmd = self
                .calls
                .truncate_cmd(positions_key, truncate, &cursor, position);
            let (next, n): (String, u64) = self
                .eval(&mark, &cmd, (TRUNCATE_SCRIPT, &self.calls.truncate_sha))
                .await?;
            removed += n;
            if next == "0" {
                return Ok(removed);
            }
            cursor = next;
        }
    }
}

/// A batch's changes (or the records that can never be applied), planned by
/// [`Sink::prepare`] for the first `apply` of the batch.
struct Planned(Mutex<Option<PlanResult>>);

type PlanResult = Result<Vec<Change>, Vec<RecordFailure>>;

#[async_trait]
impl Sink for RedisSink {
    fn name(&self) -> &str {
        "redis"
    }

    fn owns_positions(&self) -> bool {
        true
    }

    async fn load_positions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        if partitions.is_empty() {
            return Ok(Positions::new());
        }
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.positions_key(group));
        for tp in partitions {
            cmd.arg(position_field(&tp.topic, tp.partition));
        }
        let values: Vec<Option<i64>> = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| classify("HMGET positions", e))?;
        if let Some(tx_path) = &self.tx_path {
            // An assignment: take each partition's fence, so that a runner
            // that had it before writes nothing more.
            for tp in partitions {
                let state = tx_path.partition(tp);
                let mut p = state.lock().await;
                tx_path.claim(&mut conn, group, tp, &mut p).await?;
            }
        }
        Ok(partitions
            .iter()
            .zip(values)
            .filter_map(|(tp, v)| v.map(|offset| (tp.clone(), offset)))
            .collect())
    }

    /// Plans the batch ahead (row keys, versions, each row's `HSET`), off
    /// the path that waits for Redis; `apply` takes the plan.
    fn prepare(&self, batch: &mut Batch) {
        let planned = self.plan(batch);
        batch.set_prepared(Planned(Mutex::new(Some(planned))));
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        self.claim_keys(batch)?;
        // Taken: a retried batch plans again (the same changes).
        let prepared = batch
            .prepared::<Planned>()
            .and_then(|p| p.0.lock().unwrap_or_else(|e| e.into_inner()).take());
        let mut changes = prepared
            .unwrap_or_else(|| self.plan(batch))
            .map_err(SinkError::Rejected)?;
        if self.calls.layout == Layout::Json {
            let keys = keys_to_merge(&changes);
            if !keys.is_empty() {
                let stored = self.prefetch(keys).await?;
                merge_json(&mut changes, stored);
            }
        }
        let positions_key = self.positions_key(batch.group());
        let field = position_field(batch.topic(), batch.partition());
        let tp = batch.topic_partition();
        let mut tx_path = match &self.tx_path {
            Some(tx_path) => {
                let mut p = tx_path.partition(&tp).lock_owned().await;
                if !TransactionPath::claimed(&p, batch.group()) {
                    // Applied without an assignment first (tests, tools): claim now.
                    tx_path
                        .claim(&mut self.conn.clone(), batch.group(), &tp, &mut p)
                        .await?;
                }
                Some((tx_path, p))
            }
            None => None,
        };
        let keys = Keys {
            positions: &positions_key,
            version_field: &self.calls.version_field,
            version_prefix: &self.calls.version_prefix,
            tombstone_ttl_ms: self.calls.tombstone_ttl_ms,
        };
        let parts = self.calls.parts(&changes);
        let last = parts.len() - 1;
        let (mut applied, mut skipped) = (0, 0);
        for (i, part) in parts.into_iter().enumerate() {
            let position = (i == last).then_some((field.as_str(), batch.next_offset()));
            let chunk = match part {
                Part::Truncate(t) => {
                    if let Some((_, p)) = tx_path.as_mut() {
                        p.forget();
                    }
                    let removed = self.truncate(&positions_key, t, position).await?;
                    tracing::info!(
                        partition = %batch.topic_partition(),
                        offset = t.offset,
                        key_set = %t.key_set,
                        removed,
                        "redis truncate applied"
                    );
                    applied += 1;
                    continue;
                }
                Part::Changes(chunk) => chunk,
            };
            if let Some((path, p)) = tx_path.as_mut() {
                match path.apply(p, &tp, &keys, chunk, position).await? {
                    Outcome::Done {
                        applied: a,
                        skipped: s,
                    } => {
                        applied += a;
                        skipped += s;
                        continue;
                    }
                    Outcome::Foreign => p.forget(),
                }
            }
            let cmd = self.calls.script_cmd(&positions_key, chunk, position);
            match self.call(&tp, &cmd).await? {
                Reply::Done {
                    applied: a,
                    skipped: s,
                } => {
                    applied += a;
                    skipped += s;
                }
                Reply::WrongType(indices) => {
                    let failures = indices
                        .into_iter()
                        .filter_map(|i| chunk.get(i))
                        .map(|c| {
                            RecordFailure::new(
                                c.offset,
                                format!(
                                    "redis key {} holds a value of another type (WRONGTYPE)",
                                    c.row_key
                                ),
                            )
                        })
                        .collect::<Vec<_>>();
                    if failures.is_empty() {
                        return Err(SinkError::retriable("redis: WRONGTYPE without a change"));
                    }
                    return Err(SinkError::Rejected(failures));
                }
            }
        }
        tracing::debug!(
            partition = %batch.topic_partition(),
            applied,
            skipped,
            next = batch.next_offset(),
            "redis batch applied"
        );
        Ok(())
    }
}
