//! `oncely status` on a MySQL/MariaDB source (`source = "mysql"`): the
//! binlog position capture's offset record stores, held against the
//! server's binlogs.
//!
//! ```text
//!  offsets topic ──▶ stored position (file, pos, GTIDs) of server_id N
//!                        │ same server? file still listed?
//!  SHOW BINARY LOGS ─────┤ (name, size), oldest first
//!                        ▼
//!  binlog status ──▶ the end (file, pos, GTIDs): lag in bytes = rest of
//!  (SHOW MASTER STATUS /  the stored file + every file between + the
//!   SHOW BINARY LOG STATUS)  end's offset in its file
//! ```
//!
//! The rule it keeps: a stored position capture could not resume from (a
//! purged binlog, another server's, a server not set up for capture) is a
//! problem that stops the pipeline (down), told with capture's own start-up
//! message, so status and a restart of capture say the same thing.

use oncely_capture::catalog::mysql::{
    binlog_bytes_between, Flavor, MySqlCatalog, MySqlOffset, Position, Resume, ServerFacts,
    ServerIdentity,
};
use oncely_capture::catalog::SourceOffset;
use oncely_capture::config::CaptureConfig;
use oncely_core::clock::now_ms;
use serde_json::{json, Value};

use super::{age, Health};
use crate::verify::VerifyError;

/// The source's side of a MySQL/MariaDB pipeline.
#[derive(Debug, Clone)]
pub struct BinlogStatus {
    pub flavor: Flavor,
    pub version: String,
    /// This server's identity.
    pub server: ServerIdentity,
    /// The server's binlog end and GTID state; `None` when the user may
    /// not read it (no `REPLICATION CLIENT`).
    pub end: Option<Position>,
    /// `SHOW BINARY LOGS`: name and size, oldest first.
    pub binlogs: Vec<(String, u64)>,
    /// The stored offset's position and the server it is of; `None` when
    /// capture stored none (or its record holds no MySQL part).
    pub stored: Option<(Position, ServerIdentity)>,
    /// Binlog bytes from the stored position to the end (see
    /// [`binlog_bytes_between`]); `None` when they cannot be counted (no
    /// stored position, another server's, or its file purged).
    pub lag_bytes: Option<u64>,
    /// 0 when caught up (no bytes behind), else the seconds since the
    /// stored transaction committed at the source: an upper bound, since
    /// the binlog does not say when the first transaction after it came.
    pub lag_seconds: Option<f64>,
}

/// Reads the server's binlog state and holds capture's stored offset
/// against it; what stops capture goes to `problems`.
pub async fn read(
    cfg: &CaptureConfig,
    offset: Option<&SourceOffset>,
    problems: &mut Vec<(Health, String)>,
) -> Result<BinlogStatus, VerifyError> {
    let source = |e| VerifyError::Source(format!("read the binlog status: {e}"));
    let mut catalog = MySqlCatalog::connect(cfg).await.map_err(source)?;
    // Without REPLICATION CLIENT the binlog's end cannot be read: the
    // server's facts still can, and their check names the missing grant.
    let (end, facts, unread) = match catalog.binlog_status().await {
        Ok((end, facts)) => (Some(end), facts, None),
        Err(e) if e.is_access_denied() => {
            (None, catalog.server_facts().await.map_err(source)?, Some(e))
        }
        Err(e) => return Err(source(e)),
    };
    let part = match offset.map(MySqlOffset::read) {
        Some(Ok(part)) => Some(part),
        Some(Err(e)) => {
            problems.push((Health::Down, format!("capture's stored offset: {e}")));
            None
        }
        None => None,
    };
    let checked = match &part {
        Some(part) => part.check(&facts, end.as_ref().and_then(|e| e.gtids.as_ref())),
        None => facts.check(None).map(|()| Resume::Same),
    };
    match (checked, unread) {
        (Err(e), _) => problems.push((
            Health::Down,
            format!("capture cannot resume on this server: {e}"),
        )),
        // The grants look complete (a role's are not seen), yet refused.
        (Ok(_), Some(e)) => {
            problems.push((Health::Down, format!("cannot read the binlog's end: {e}")))
        }
        // Resumable, but nothing of the lag can be measured until capture
        // has moved onto this server's binlog.
        (Ok(Resume::Failover), None) => problems.push((
            Health::Degraded,
            format!(
                "capture's stored offset is of {}, not this server ({}): capture follows its GTIDs onto this one at its next start (a failover)",
                part.as_ref().map(|p| p.server.to_string()).unwrap_or_default(),
                facts.server
            ),
        )),
        (Ok(Resume::Same), None) => {}
    }
    Ok(status(end, facts, part, offset.map_or(0, |o| o.ts_ms)))
}

/// The status of `part` (stored, committed at `ts_ms`) against the server
/// and its binlog's end (`None`: not readable).
fn status(
    end: Option<Position>,
    facts: ServerFacts,
    part: Option<MySqlOffset>,
    ts_ms: i64,
) -> BinlogStatus {
    let lag_bytes = part
        .as_ref()
        .filter(|p| p.server == facts.server)
        .zip(end.as_ref())
        .and_then(|(p, end)| {
            binlog_bytes_between(
                &facts.binlogs,
                &p.position.coordinates(),
                &end.coordinates(),
            )
        });
    let lag_seconds = match lag_bytes {
        Some(0) => Some(0.0),
        Some(_) if ts_ms > 0 => Some(age(now_ms(), ts_ms)),
        _ => None,
    };
    BinlogStatus {
        flavor: facts.flavor,
        version: facts.version,
        server: facts.server,
        end,
        binlogs: facts.binlogs,
        stored: part.map(|p| (p.position, p.server)),
        lag_bytes,
        lag_seconds,
    }
}

fn flavor_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::MySql => "mysql",
        Flavor::MariaDb => "mariadb",
    }
}

fn identity_json(server: &ServerIdentity) -> Value {
    json!({"server_id": server.id, "server_uuid": server.uuid})
}

/// A position as the offset record stores it (`file`, `pos`, `gtids`,
/// `event`, `row`).
fn position_json(position: &Position) -> Value {
    serde_json::to_value(position).unwrap_or(Value::Null)
}

impl BinlogStatus {
    /// Whether the stored position's file is still on the server (`None`
    /// also when the binlogs could not be listed: the grant that reads the
    /// end lists them).
    pub fn stored_file_on_server(&self) -> Option<bool> {
        self.end.as_ref()?;
        let (position, _) = self.stored.as_ref()?;
        Some(self.binlogs.iter().any(|(name, _)| name == &position.file))
    }

    pub(super) fn server_json(&self) -> Value {
        let mut server = identity_json(&self.server);
        server["flavor"] = json!(flavor_name(self.flavor));
        server["version"] = json!(self.version);
        server["position"] = self.end.as_ref().map_or(Value::Null, position_json);
        server["oldest_binlog"] = json!(self.binlogs.first().map(|(name, _)| name));
        server["binlogs"] = json!(self.binlogs.len());
        server
    }

    pub(super) fn capture_json(&self) -> Value {
        json!({
            "stored_position": self.stored.as_ref().map(|(p, _)| position_json(p)),
            "stored_server": self.stored.as_ref().map(|(_, s)| identity_json(s)),
            "stored_file_on_server": self.stored_file_on_server(),
            "lag_bytes": self.lag_bytes,
            "lag_seconds": self.lag_seconds,
        })
    }

    pub(super) fn fmt_lines(
        &self,
        connector: &str,
        f: &mut std::fmt::Formatter<'_>,
    ) -> std::fmt::Result {
        let end = match &self.end {
            Some(end) => format!("binlog at {}:{}, GTIDs {}", end.file, end.pos, gtids(end)),
            None => "binlog end unreadable".to_owned(),
        };
        writeln!(
            f,
            "capture {connector} ({} {}, {}; {end})",
            flavor_name(self.flavor),
            self.version,
            self.server,
        )?;
        if self.end.is_none() {
            writeln!(f, "  binlogs on the server: not readable")?;
        } else {
            writeln!(
                f,
                "  binlogs on the server: {} files, oldest {}",
                self.binlogs.len(),
                self.binlogs.first().map_or("-", |(name, _)| name.as_str()),
            )?;
        }
        let Some((stored, server)) = &self.stored else {
            return writeln!(f, "  stored position: none");
        };
        writeln!(
            f,
            "  stored position {}:{} (event {}, row {}), GTIDs {}, of {server}{}",
            stored.file,
            stored.pos,
            stored.event,
            stored.row,
            gtids(stored),
            match self.stored_file_on_server() {
                Some(false) => ": its binlog is NOT ON THE SERVER",
                _ => "",
            },
        )?;
        writeln!(
            f,
            "  {} bytes of binlog behind the server, {}",
            self.lag_bytes.map_or("?".to_owned(), |b| b.to_string()),
            self.lag_seconds
                .map_or("? s".to_owned(), |s| format!("{s:.1} s")),
        )
    }
}

fn gtids(position: &Position) -> String {
    position
        .gtids
        .as_ref()
        .map_or("none".to_owned(), |g| g.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs() -> Vec<(String, u64)> {
        vec![
            ("binlog.000007".into(), 1000),
            ("binlog.000008".into(), 500),
            ("binlog.000009".into(), 300),
            ("binlog.000010".into(), 120),
        ]
    }

    fn facts() -> ServerFacts {
        ServerFacts {
            flavor: Flavor::MariaDb,
            version: "10.11.19-MariaDB-log".into(),
            log_bin: true,
            binlog_format: "ROW".into(),
            binlog_row_image: "FULL".into(),
            binlog_row_metadata: Some("FULL".into()),
            user: "oncely@%".into(),
            privileges: vec![
                "SELECT".into(),
                "REPLICATION SLAVE".into(),
                "BINLOG MONITOR".into(),
            ],
            binlogs: logs(),
            server: ServerIdentity { id: 1, uuid: None },
        }
    }

    fn part(file: &str, pos: u64, server: u32) -> MySqlOffset {
        MySqlOffset::new(
            Position::at(file, pos),
            ServerIdentity {
                id: server,
                uuid: None,
            },
            &Default::default(),
            |_, _| true,
        )
    }

    #[test]
    fn without_the_binlog_end_the_stored_position_is_shown_and_no_lag() {
        let mut unlisted = facts();
        unlisted.binlogs.clear();
        let s = status(None, unlisted, Some(part("binlog.000009", 200, 1)), 1);
        assert_eq!((s.lag_bytes, s.lag_seconds), (None, None));
        assert_eq!(s.stored_file_on_server(), None, "not known, not purged");
        assert_eq!(s.server_json()["position"], Value::Null);
        assert_eq!(s.capture_json()["stored_position"]["file"], "binlog.000009");
    }

    #[test]
    fn lag_is_counted_only_on_the_stored_server_and_zero_when_caught_up() {
        let end = Some(Position::at("binlog.000010", 100));
        let ten_s_ago = now_ms() - 10_000;
        let caught_up = status(
            end.clone(),
            facts(),
            Some(part("binlog.000010", 100, 1)),
            ten_s_ago,
        );
        assert_eq!(
            (caught_up.lag_bytes, caught_up.lag_seconds),
            (Some(0), Some(0.0))
        );
        let behind = status(
            end.clone(),
            facts(),
            Some(part("binlog.000009", 200, 1)),
            ten_s_ago,
        );
        assert_eq!(behind.lag_bytes, Some(200));
        assert!(behind
            .lag_seconds
            .is_some_and(|s| (10.0..60.0).contains(&s)));
        assert_eq!(behind.stored_file_on_server(), Some(true));
        let other = status(
            end.clone(),
            facts(),
            Some(part("binlog.000009", 200, 2)),
            ten_s_ago,
        );
        assert_eq!((other.lag_bytes, other.lag_seconds), (None, None));
        let purged = status(
            end.clone(),
            facts(),
            Some(part("binlog.000003", 4, 1)),
            ten_s_ago,
        );
        assert_eq!(purged.stored_file_on_server(), Some(false));
        assert_eq!(purged.lag_bytes, None);
        assert_eq!(
            purged.capture_json()["stored_position"],
            serde_json::json!({"file": "binlog.000003", "pos": 4, "event": 0, "row": 0})
        );
        let none = status(end, facts(), None, 0);
        assert_eq!((none.stored_file_on_server(), none.lag_bytes), (None, None));
        assert_eq!(none.server_json()["oldest_binlog"], "binlog.000007");
    }
}
