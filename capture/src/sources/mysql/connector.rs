//! MySQL/MariaDB as the pipeline's source ([`Source`]): start-up's checks
//! and table selection, the binlog stream from the stored offset's MySQL
//! part (or the server's binlog end on a fresh start), the heartbeat, and
//! the control connection's answers (`control.rs`).
//!
//! ```text
//!  check:       settings, grants, replica id ─▶ tables selected (keyless set aside)
//!               binlog end now ─▶ where a fresh start streams from
//!  open_stream: stored part? ── yes ─▶ same server, binlog still there ─▶ its position + facts
//!                           │         another holding its GTIDs ─▶ by GTIDs, one epoch up
//!                           └─ no ──▶ the fresh start's position
//! ```
//!
//! The stored position is checked when the stream opens, which is handed
//! the committed record: a purged binlog or another server's position
//! without GTIDs it holds stops the start with the fix, never skipped.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::catalog::opts;
use super::checks::{current_position, mariadb_gtids_at, Flavor, ServerFacts, ServerIdentity};
use super::chunks::MySqlChunks;
use super::control::{self, MySqlControl, StreamTables};
use super::error::MySqlSourceError;
use super::history::ShapeFacts;
use super::offset::{key_coordinates, order_key, MySqlOffset, Resume};
use super::position::Position;
use super::reader::ResumeBy;
use super::source::{MySqlStream, StreamStart};
use crate::config::{CaptureConfig, ConfigError};
use crate::error::CaptureError;
use crate::offset::SourceOffset;
use crate::schema_change::SchemaHistory;
use crate::seam::{CheckedSource, Retained, Source, SourceEvent};

/// MySQL or MariaDB as the pipeline's source: the binlog read as replica
/// `database.server.id`.
pub(crate) struct MySql;

impl Source for MySql {
    type Table = super::stream::MySqlTable;
    type Stream = MySqlStream;
    type Control = MySqlControl;
    type Chunks = MySqlChunks;
    type Tables<'a> = StreamTables<'a>;

    async fn check(cfg: &CaptureConfig) -> Result<CheckedSource<Self>, CaptureError> {
        let replica_id = cfg.mysql_server_id()?;
        let mut conn = connect(cfg).await?;
        let facts = ServerFacts::read(&mut conn).await.map_err(capture)?;
        facts.check(None).map_err(capture)?;
        refuse_own_server_id(replica_id, &facts)?;
        if cfg.include_query {
            check_query_events(&mut conn, facts.flavor).await?;
        }
        let now = current_position(&mut conn, facts.flavor, &facts.version)
            .await
            .map_err(capture)?;
        let start_at = order_key(&now).map_err(capture)?;
        let selected = control::selected_tables(&mut conn, cfg).await?;
        let set_aside = selected
            .keyless
            .iter()
            .map(|t| (t.clone(), control::keyless_reason(t)))
            .collect();
        let epoch = stream_epoch(cfg, &facts.server).await;
        Ok(CheckedSource {
            control: MySqlControl::new(conn, facts.flavor, facts.version).in_epoch(epoch),
            tables: selected.tables,
            set_aside,
            start_at,
            // The binlog's retention is checked against the stored
            // position itself when the stream opens (`open_stream`), with
            // MySQL's own fix: the core sees no gap.
            earliest: 0,
            types: (),
        })
    }

    async fn open_stream(
        cfg: &CaptureConfig,
        from: &SourceOffset,
    ) -> Result<MySqlStream, CaptureError> {
        let replica_id = cfg.mysql_server_id()?;
        let mut conn = connect(cfg).await?;
        let facts = ServerFacts::read(&mut conn).await.map_err(capture)?;
        let Start {
            position,
            facts: shape_facts,
            resume,
            takeover,
        } = if fresh(from) {
            Start {
                position: fresh_position(&mut conn, &facts, from.flush_lsn).await?,
                facts: ShapeFacts::default(),
                resume: ResumeBy::FilePosition,
                takeover: None,
            }
        } else {
            stored_start(&mut conn, &facts, from).await?
        };
        let _ = conn.disconnect().await;
        tracing::info!(file = %position.file, pos = position.pos, gtids = ?position.gtids.as_ref().map(|g| g.to_string()), replica_id, ?resume, "binlog stream opening");
        MySqlStream::open(StreamStart {
            opts: opts(cfg),
            replica_id,
            flavor: facts.flavor,
            server: facts.server,
            from: position,
            resume,
            mapping: cfg.mysql_mapping(),
            include_query: cfg.include_query,
            facts: shape_facts,
            takeover,
            captured: cfg
                .captured_tables_filter()
                .map_err(|e| CaptureError::Prerequisite(e.to_string()))?,
        })
        .await
    }

    fn warning(_cfg: &CaptureConfig) -> Option<String> {
        None
    }

    fn chunks(cfg: &CaptureConfig, stream: &MySqlStream) -> MySqlChunks {
        MySqlChunks::new(
            opts(cfg),
            cfg.snapshot_locking_mode,
            cfg.mysql_mapping(),
            stream.watermarks(),
        )
    }

    async fn next_event(stream: &mut MySqlStream) -> Result<SourceEvent<Self>, CaptureError> {
        stream.next_event().await
    }

    fn stop(stream: &mut MySqlStream) {
        stream.stop();
    }

    fn tables<'a>(
        control: &'a MySqlControl,
        _history: &'a SchemaHistory,
        _xid: Option<u32>,
    ) -> StreamTables<'a> {
        StreamTables::new(control)
    }

    /// Runs `heartbeat.action.query`, and counts the binlog bytes from
    /// where a restart would resume to the server's end: what capture
    /// needs the server's retention to keep (the server keeps it by
    /// `binlog_expire_logs_seconds`, not for capture).
    async fn heartbeat(
        control: &mut MySqlControl,
        stream: &MySqlStream,
        cfg: &CaptureConfig,
    ) -> Option<Retained> {
        if let Some(query) = &cfg.heartbeat_action_query {
            if let Err(e) = control.conn().query_drop(query).await {
                tracing::warn!(error = %e, "heartbeat.action.query failed");
            }
        }
        let from = stream.resume_from()?;
        match control.bytes_behind(from).await {
            Ok(bytes) => bytes.map(|b| Retained::Binlog(i64::try_from(b).unwrap_or(i64::MAX))),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the binlog's end");
                None
            }
        }
    }
}

fn capture(e: MySqlSourceError) -> CaptureError {
    e.into_capture()
}

async fn connect(cfg: &CaptureConfig) -> Result<Conn, CaptureError> {
    Conn::new(opts(cfg))
        .await
        .map_err(|e| MySqlSourceError::server("connect", e).into_capture())
}

/// Where and how the stream opens.
struct Start {
    position: Position,
    facts: ShapeFacts,
    resume: ResumeBy,
    /// A failover: the server of the stored position.
    takeover: Option<ServerIdentity>,
}

/// The start from a stored offset, checked against the server: on the
/// same server by file and offset, on another holding its GTIDs by GTIDs
/// (a failover, `offset.rs`), else refused naming the fix.
async fn stored_start(
    conn: &mut Conn,
    facts: &ServerFacts,
    from: &SourceOffset,
) -> Result<Start, CaptureError> {
    let stored = MySqlOffset::read(from).map_err(capture)?;
    // Another server's GTID state decides whether it can take over.
    let server_gtids = if stored.server == facts.server {
        None
    } else {
        current_position(conn, facts.flavor, &facts.version)
            .await
            .map_err(capture)?
            .gtids
    };
    let resume = match stored
        .check(facts, server_gtids.as_ref())
        .map_err(capture)?
    {
        Resume::Same => ResumeBy::FilePosition,
        Resume::Failover => {
            tracing::warn!(stored = %stored.server, found = %facts.server, gtids = ?stored.position.gtids.as_ref().map(|g| g.to_string()), epoch = stored.position.epoch + 1, "another server: following the stored GTIDs onto it (a failover)");
            match facts.flavor {
                Flavor::MariaDb => ResumeBy::MariaDbGtid,
                Flavor::MySql => ResumeBy::MySqlGtid,
            }
        }
    };
    Ok(Start {
        position: stored.resume_from(),
        takeover: (resume != ResumeBy::FilePosition).then(|| stored.server.clone()),
        facts: stored.facts,
        resume,
    })
}

/// The failover epoch the stream will read this server in: the stored
/// offset's when it is this server's, one up when another's (a takeover),
/// 0 without one. A stored offset that does not read is refused when the
/// stream opens, not here.
async fn stream_epoch(cfg: &CaptureConfig, server: &ServerIdentity) -> u32 {
    let stored = crate::offset::read_stored_offset(cfg).await.ok().flatten();
    match stored.as_ref().map(MySqlOffset::read) {
        Some(Ok(part)) if &part.server == server => part.position.epoch,
        Some(Ok(part)) => part.position.epoch.saturating_add(1),
        _ => 0,
    }
}

/// A replica with the server's own id is refused by the server only once
/// it streams, and silently confuses some versions: refuse it first.
fn refuse_own_server_id(replica_id: u32, facts: &ServerFacts) -> Result<(), CaptureError> {
    if replica_id == facts.server.id {
        return Err(CaptureError::Config(ConfigError::new(
            "database.server.id",
            format!(
                "{replica_id} is the server's own server_id: give capture an id no server or replica of this server uses"
            ),
        )));
    }
    Ok(())
}

/// `include.query`: the server must write each statement into the binlog.
async fn check_query_events(conn: &mut Conn, flavor: Flavor) -> Result<(), CaptureError> {
    let sql = match flavor {
        Flavor::MySql => "SELECT CAST(@@GLOBAL.binlog_rows_query_log_events AS CHAR)",
        Flavor::MariaDb => "SELECT CAST(@@GLOBAL.binlog_annotate_row_events AS CHAR)",
    };
    let on = conn
        .query_first::<String, _>(sql)
        .await
        .map_err(|e| {
            capture(MySqlSourceError::server(
                "read the statement events setting",
                e,
            ))
        })?
        .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("ON"));
    match query_events_refusal(flavor, on) {
        Some(reason) => Err(CaptureError::Config(ConfigError::new(
            "include.query",
            reason,
        ))),
        None => Ok(()),
    }
}

/// Why `include.query` cannot work on this server, if it cannot. The
/// setting is the global default of new sessions: a session that turns it
/// off writes changes whose `source.query` is null.
fn query_events_refusal(flavor: Flavor, on: bool) -> Option<String> {
    let variable = match flavor {
        Flavor::MySql => "binlog_rows_query_log_events",
        Flavor::MariaDb => "binlog_annotate_row_events",
    };
    (!on).then(|| {
        format!(
            "needs the statement of each change in the binlog: SET GLOBAL {variable} = ON and {variable} = ON in the server's config file (changes written before carry null)"
        )
    })
}

/// A record start-up made for a fresh start ([`SourceOffset::start`] at
/// the binlog end `check` read), not one a MySQL capture committed.
fn fresh(from: &SourceOffset) -> bool {
    from.source.is_none() && from.commit_lsn == 0 && from.events == 0
}

/// Where a fresh start streams from: the binlog end `check` read (order
/// key `key`). Read again, it is the same unless transactions committed
/// meanwhile; then the file and offset come from the key (the file named
/// as the server names it), with the GTIDs before exactly that place
/// (MariaDB's `BINLOG_GTID_POS`; MySQL has no such function, so its
/// position then has none, and a failover from it is refused).
async fn fresh_position(
    conn: &mut Conn,
    facts: &ServerFacts,
    key: u64,
) -> Result<Position, CaptureError> {
    let now = current_position(conn, facts.flavor, &facts.version)
        .await
        .map_err(capture)?;
    if order_key(&now).map_err(capture)? == key {
        return Ok(now);
    }
    let (sequence, pos) = key_coordinates(key);
    let file = facts
        .binlogs
        .iter()
        .map(|(name, _)| name)
        .find(|name| {
            Position::at(name.as_str(), 0)
                .coordinates()
                .file_sequence()
                .0
                == sequence
        })
        .ok_or_else(|| {
            capture(MySqlSourceError::PositionPurged {
                stored: format!("binlog number {sequence}, offset {pos}"),
                oldest: facts
                    .binlogs
                    .first()
                    .map(|(n, _)| n.clone())
                    .unwrap_or_else(|| "none".into()),
            })
        })?;
    let mut position = Position::at(file.as_str(), pos);
    if facts.flavor == Flavor::MariaDb {
        position.gtids = mariadb_gtids_at(conn, file, pos).await.map_err(capture)?;
    }
    Ok(position)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offset::SourcePart;
    use crate::sources::mysql::checks::Flavor;

    fn facts(id: u32) -> ServerFacts {
        ServerFacts {
            flavor: Flavor::MariaDb,
            version: "10.11.6-MariaDB".into(),
            log_bin: true,
            binlog_format: "ROW".into(),
            binlog_row_image: "FULL".into(),
            binlog_row_metadata: Some("FULL".into()),
            user: "oncely@%".into(),
            privileges: Vec::new(),
            binlogs: Vec::new(),
            server: ServerIdentity { id, uuid: None },
        }
    }

    #[test]
    fn include_query_names_the_servers_statement_events_setting() {
        let off = query_events_refusal(Flavor::MySql, false).unwrap();
        assert!(
            off.contains("SET GLOBAL binlog_rows_query_log_events = ON"),
            "{off}"
        );
        let off = query_events_refusal(Flavor::MariaDb, false).unwrap();
        assert!(
            off.contains("SET GLOBAL binlog_annotate_row_events = ON"),
            "{off}"
        );
        assert_eq!(query_events_refusal(Flavor::MySql, true), None);
        assert_eq!(query_events_refusal(Flavor::MariaDb, true), None);
    }

    #[test]
    fn only_the_record_start_up_made_is_a_fresh_start() {
        assert!(fresh(&SourceOffset::start(8_589_934_977)));
        let mut committed = SourceOffset::start(8_589_934_977);
        committed.source = Some(SourcePart::new(serde_json::json!({"mysql": {}})));
        assert!(!fresh(&committed), "a MySQL capture's record");
        let mut other = SourceOffset::start(0);
        other.commit_lsn = 42;
        assert!(
            !fresh(&other),
            "another source's record is read, and refused, as stored"
        );
    }

    #[test]
    fn the_servers_own_id_is_refused_as_the_replica_id() {
        let err = refuse_own_server_id(1, &facts(1)).unwrap_err().to_string();
        assert!(
            err.contains("database.server.id") && err.contains("own server_id"),
            "{err}"
        );
        assert!(refuse_own_server_id(5400, &facts(1)).is_ok());
    }
}
