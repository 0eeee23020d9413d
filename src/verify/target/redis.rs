//! Redis: one key per row (`key.pattern`; `{key}` = the key's values joined by
//! `key.separator`), a hash of the non-null columns (`layout = "hash"`) or the
//! row as a JSON string (`layout = "json"`); a deleted row's key is gone.
//! Positions live in the hash `<positions.key.prefix><group.id>`, one field
//! `<topic>:<partition>` per partition. Values are compared in the form the
//! sink stores them (`value.format`; [`RedisTarget::as_stored`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use oncely_sinks::kinds::redis::{native_row, KeyPattern, Layout, RedisConfig};
use oncely_sinks::native::{Kind, ValueFormat};
use redis::aio::MultiplexedConnection;
use redis::IntoConnectionInfo;
use serde_json::{Map, Value};

use super::{KeyPage, Partition, PAGE};
use crate::verify::compare::TargetRow;
use crate::verify::source::{SourceRow, SourceTable};
use crate::verify::VerifyError;

pub struct RedisTarget {
    conn: MultiplexedConnection,
    config: RedisConfig,
    keys: KeyPattern,
    group: String,
    db: String,
    /// Whether the topics carry schemas: without them the sink cannot tell
    /// a date from a number and stores the wire form.
    schemas: bool,
}

fn redis_error(what: &str) -> impl Fn(redis::RedisError) -> VerifyError + '_ {
    move |e| VerifyError::Target(format!("redis: {what}: {e}"))
}

impl RedisTarget {
    pub async fn connect(
        config: &RedisConfig,
        group: &str,
        db: &str,
        schemas: bool,
    ) -> Result<Self, VerifyError> {
        let mut info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| VerifyError::Config(format!("redis sink.url: {e}")))?;
        if let Some(password) = &config.password {
            let password = password
                .resolve()
                .map_err(|e| VerifyError::Config(format!("redis sink.password: {e}")))?;
            let mut settings = info
                .redis_settings()
                .clone()
                .set_password(password.expose());
            if let Some(user) = &config.username {
                settings = settings.set_username(user);
            }
            info = info.set_redis_settings(settings);
        }
        // Where, for errors: the address only (the URL may hold a password).
        let place = info.addr().to_string();
        // The sink's TLS settings: `rediss://` URLs, and `tls.ca.file` to trust.
        let tls = config.url.trim().starts_with("rediss://");
        if tls {
            oncely_sinks::tls::provider();
        }
        let client = match (&config.tls_ca_file, tls) {
            (Some(path), true) => {
                let pem = std::fs::read(path).map_err(|e| {
                    VerifyError::Config(format!("redis sink.tls.ca.file {path}: {e}"))
                })?;
                redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem),
                    },
                )
            }
            _ => redis::Client::open(info),
        };
        let conn = client
            .map_err(redis_error("open"))?
            // The sink's own timeouts: the client's default (a fraction of a
            // second) is too short for a page of reads on a busy machine.
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout()))
                    .set_response_timeout(Some(config.response_timeout())),
            )
            .await
            .map_err(redis_error(&format!("connect to {place}")))?;
        Ok(Self {
            conn,
            keys: KeyPattern::new(&config.key_pattern, &config.key_separator),
            config: config.clone(),
            group: group.to_owned(),
            db: db.to_owned(),
            schemas,
        })
    }

    /// `rows` as the sink stores them: under `value.format = "native"` each
    /// column converted by the sink's own function, chosen by the Connect
    /// schema capture gives the column's type ([`Kind::of_schema`]).
    pub fn as_stored<'r>(
        &self,
        table: &SourceTable,
        rows: &'r [SourceRow],
    ) -> Cow<'r, [SourceRow]> {
        if self.config.value_format == ValueFormat::Wire || !self.schemas {
            return Cow::Borrowed(rows);
        }
        let kinds: Vec<(String, Kind)> = table
            .columns
            .iter()
            .filter_map(|c| {
                let schema = c.kind.field_schema(-1, &c.name, true);
                Some((c.name.clone(), Kind::of_schema(&schema)?))
            })
            .collect();
        if kinds.is_empty() {
            return Cow::Borrowed(rows);
        }
        let nest_json = self.config.layout == Layout::Json;
        Cow::Owned(
            rows.iter()
                .map(|r| SourceRow {
                    row: native_row(&r.row, &kinds, nest_json).into_owned(),
                    key_text: r.key_text.clone(),
                    key_wire: r.key_wire.clone(),
                })
                .collect(),
        )
    }

    /// `key.pattern` with everything but `{key}` filled in, by the sink's own function.
    fn pattern(&self, table: &SourceTable) -> String {
        self.keys
            .table_part(&table.topic, [&self.db, &table.schema, &table.name])
    }

    /// The row's key, by the sink's own function (escaping included).
    fn row_key(&self, table: &SourceTable, row: &SourceRow) -> String {
        self.keys.render_row(
            &table.topic,
            [&self.db, &table.schema, &table.name],
            &row.key_wire,
        )
    }

    /// The SCAN pattern matching the table's row keys.
    pub fn glob(&self, table: &SourceTable) -> String {
        glob_of(&self.pattern(table))
    }

    pub async fn fetch(
        &self,
        table: &SourceTable,
        rows: &[SourceRow],
    ) -> Result<Vec<Option<TargetRow>>, VerifyError> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for row in rows {
            let key = self.row_key(table, row);
            match self.config.layout {
                Layout::Hash => pipe.cmd("HGETALL").arg(key),
                Layout::Json => pipe.cmd("GET").arg(key),
            };
        }
        match self.config.layout {
            Layout::Hash => {
                let hashes: Vec<BTreeMap<String, String>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error("read rows (HGETALL)"))?;
                Ok(hashes
                    .into_iter()
                    .map(|mut h| {
                        // A live row carries its version beside its columns.
                        h.remove(&self.config.version_field);
                        (!h.is_empty()).then_some(TargetRow::Hash(h))
                    })
                    .collect())
            }
            Layout::Json => {
                let texts: Vec<Option<String>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error("read rows (GET)"))?;
                Ok(texts
                    .into_iter()
                    .map(|t| {
                        t.map(|t| match serde_json::from_str::<Map<String, Value>>(&t) {
                            Ok(map) => TargetRow::Json(map),
                            // Not a JSON object: report it as the row's only "column".
                            Err(_) => TargetRow::Json(
                                [("<not a JSON object>".to_owned(), Value::String(t))]
                                    .into_iter()
                                    .collect(),
                            ),
                        })
                    })
                    .collect())
            }
        }
    }

    pub async fn count(&self, table: &SourceTable) -> Result<u64, VerifyError> {
        let mut cursor = None;
        let mut count = 0u64;
        loop {
            let (keys, next) = self.scan_page(table, cursor).await?;
            count += keys.len() as u64;
            match next {
                Some(n) => cursor = Some(n),
                None => return Ok(count),
            }
        }
    }

    async fn scan_page(
        &self,
        table: &SourceTable,
        cursor: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), VerifyError> {
        let mut conn = self.conn.clone();
        let (next, keys): (String, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor.as_deref().unwrap_or("0"))
            .arg("MATCH")
            .arg(self.glob(table))
            .arg("COUNT")
            .arg(PAGE)
            .query_async(&mut conn)
            .await
            .map_err(redis_error("SCAN"))?;
        Ok((keys, (next != "0").then_some(next)))
    }

    pub async fn scan_keys(
        &self,
        table: &SourceTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyError> {
        let (keys, next) = self.scan_page(table, cursor).await?;
        let pattern = self.pattern(table);
        let (prefix, suffix) = pattern.split_once("{key}").unwrap_or((&pattern, ""));
        let keys = keys
            .iter()
            .map(|k| {
                let inner = k
                    .strip_prefix(prefix)
                    .and_then(|k| k.strip_suffix(suffix))
                    .unwrap_or(k);
                self.keys.split_key(inner)
            })
            .collect();
        Ok((keys, next))
    }

    pub async fn positions(&self) -> Result<HashMap<Partition, i64>, VerifyError> {
        let mut conn = self.conn.clone();
        let stored: HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(format!("{}{}", self.config.positions_prefix, self.group))
            .query_async(&mut conn)
            .await
            .map_err(redis_error("read positions"))?;
        Ok(stored
            .into_iter()
            .filter_map(|(field, offset)| {
                let (topic, partition) = field.rsplit_once(':')?;
                Some(((topic.to_owned(), partition.parse().ok()?), offset))
            })
            .collect())
    }
}

/// A SCAN MATCH pattern for keys of `pattern` (`{key}` -> `*`, glob characters escaped).
fn glob_of(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 4);
    let (prefix, suffix) = pattern.split_once("{key}").unwrap_or((pattern, ""));
    let escape = |s: &str, out: &mut String| {
        for ch in s.chars() {
            if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(ch);
        }
    };
    escape(prefix, &mut out);
    out.push('*');
    escape(suffix, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_escape_and_wildcard_the_key() {
        assert_eq!(glob_of("orders:{key}"), "orders:*");
        assert_eq!(glob_of("c[1]:{key}:row"), "c\\[1\\]:*:row");
    }
}
