//! The cache read back for `oncely verify`, with the sink's own key
//! pattern, layout and value form: one key per row (`key.pattern`; `{key}` =
//! the key's values joined by `key.separator`), a hash of the non-null
//! columns (`layout = "hash"`) or the row as a JSON string (`layout =
//! "json"`); a deleted row's key is gone. Positions live in the hash
//! `<positions.key.prefix><group.id>`, one field `<topic>:<partition>` each.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use serde_json::{Map, Value};

use super::config::{Layout, RedisConfig};
use super::keys::KeyPattern;
use super::plan::stored_form;
use super::sink::{open_client, OpenError};
use crate::native::ValueFormat;
use crate::sink::TopicPartition;
use crate::verify_reader::{
    Fetched, KeyPage, RowKey, StoredForm, StoredRow, VerifiedTable, VerifyContext, VerifyReadError,
    VerifyReader, PAGE,
};

/// A Redis sink's cache, read the way the sink writes it.
pub struct RedisVerifyReader {
    conn: MultiplexedConnection,
    config: RedisConfig,
    keys: KeyPattern,
    group: String,
    db: String,
    form: StoredForm,
}

fn redis_error(what: &str) -> impl Fn(redis::RedisError) -> VerifyReadError + '_ {
    move |e| VerifyReadError::Target(format!("redis: {what}: {e}"))
}

impl RedisVerifyReader {
    /// Connects with the sink's URL, credentials, TLS settings and timeouts.
    pub async fn connect(
        config: &RedisConfig,
        ctx: &VerifyContext<'_>,
    ) -> Result<Self, VerifyReadError> {
        let (client, place) = open_client(config).map_err(|e| match e {
            OpenError::Setting(what, e) => VerifyReadError::Config(format!("redis {what}: {e}")),
            OpenError::Redis(e) => redis_error("open")(e),
        })?;
        let conn = client
            // The sink's own timeouts: the client's default (a fraction of a
            // second) is too short for a page of reads on a busy machine.
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout()))
                    .set_response_timeout(Some(config.response_timeout())),
            )
            .await
            .map_err(redis_error(&format!("connect to {place}")))?;
        // Without schemas the sink cannot tell a date from a number: wire form.
        let format = if ctx.schemas {
            config.value_format
        } else {
            ValueFormat::Wire
        };
        Ok(Self {
            conn,
            keys: KeyPattern::new(&config.key_pattern, &config.key_separator),
            form: stored_form(config.layout, format),
            config: config.clone(),
            group: ctx.runner.group_id.clone(),
            db: ctx.db.to_owned(),
        })
    }

    /// `key.pattern` with everything but `{key}` filled in, by the sink's own function.
    fn pattern(&self, table: &VerifiedTable) -> String {
        self.keys
            .table_part(&table.topic, [&self.db, &table.schema, &table.name])
    }

    /// The SCAN pattern matching the table's row keys.
    fn glob(&self, table: &VerifiedTable) -> String {
        glob_of(&self.pattern(table))
    }

    async fn scan_page(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), VerifyReadError> {
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
}

#[async_trait]
impl VerifyReader for RedisVerifyReader {
    fn location(&self, table: &VerifiedTable) -> String {
        format!("keys {}", self.glob(table))
    }

    async fn fetch(
        &self,
        table: &VerifiedTable,
        keys: &[RowKey<'_>],
    ) -> Result<Fetched, VerifyReadError> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for key in keys {
            // The row's key, by the sink's own function (escaping included).
            let key = self.keys.render_row(
                &table.topic,
                [&self.db, &table.schema, &table.name],
                key.wire,
            );
            match self.config.layout {
                Layout::Hash => pipe.cmd("HGETALL").arg(key),
                Layout::Json => pipe.cmd("GET").arg(key),
            };
        }
        let rows = match self.config.layout {
            Layout::Hash => {
                let hashes: Vec<BTreeMap<String, String>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error("read rows (HGETALL)"))?;
                hashes
                    .into_iter()
                    .map(|mut h| {
                        // A live row carries its version beside its columns.
                        h.remove(&self.config.version_field);
                        (!h.is_empty()).then_some(StoredRow::Hash(h))
                    })
                    .collect()
            }
            Layout::Json => {
                let texts: Vec<Option<String>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error("read rows (GET)"))?;
                texts
                    .into_iter()
                    .map(|t| {
                        t.map(|t| match serde_json::from_str::<Map<String, Value>>(&t) {
                            Ok(map) => StoredRow::Json(map),
                            // Not a JSON object: report it as the row's only "column".
                            Err(_) => StoredRow::Json(
                                [("<not a JSON object>".to_owned(), Value::String(t))]
                                    .into_iter()
                                    .collect(),
                            ),
                        })
                    })
                    .collect()
            }
        };
        Ok(Fetched {
            rows,
            form: self.form,
        })
    }

    async fn count(&self, table: &VerifiedTable) -> Result<u64, VerifyReadError> {
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

    async fn scan_keys(
        &self,
        table: &VerifiedTable,
        cursor: Option<String>,
    ) -> Result<KeyPage, VerifyReadError> {
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

    async fn positions(
        &self,
        _partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, VerifyReadError> {
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
                Some((TopicPartition::new(topic, partition.parse().ok()?), offset))
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
