//! Start-up checks: is the server set up for capture, may the user read
//! the binlog, and is the stored position still on the server. Each
//! failure names the fix. [`ServerFacts::read`] asks the server; the rules
//! ([`ServerFacts::check`]) are pure, so each is a unit test.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::error::{codes, MySqlSourceError};
use super::position::{BinlogCoordinates, Gtids, Position};

/// Which server: their GTIDs, status statements and JSON differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    MySql,
    MariaDb,
}

impl Flavor {
    /// From `SELECT VERSION()` (MariaDB says so in it).
    pub fn from_version(version: &str) -> Self {
        if version.to_ascii_lowercase().contains("mariadb") {
            Self::MariaDb
        } else {
            Self::MySql
        }
    }
}

/// `major.minor.patch` of a version text such as `8.4.3` or
/// `10.11.19-MariaDB-0+deb12u1-log`.
pub fn version_triple(version: &str) -> (u32, u32, u32) {
    let mut it = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// The statement that shows the current binlog file and position: MySQL
/// 8.2 renamed `SHOW MASTER STATUS` to `SHOW BINARY LOG STATUS` (8.4
/// removed the old name); MariaDB keeps `SHOW MASTER STATUS`.
pub fn status_statement(flavor: Flavor, version: &str) -> &'static str {
    match flavor {
        Flavor::MySql if version_triple(version) >= (8, 2, 0) => "SHOW BINARY LOG STATUS",
        _ => "SHOW MASTER STATUS",
    }
}

/// What the checks need to know about the server and the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFacts {
    pub flavor: Flavor,
    pub version: String,
    pub log_bin: bool,
    pub binlog_format: String,
    pub binlog_row_image: String,
    /// None on servers without the setting (MySQL < 8.0.1, MariaDB < 10.5).
    pub binlog_row_metadata: Option<String>,
    pub user: String,
    /// Global privileges of the user, upper case.
    pub privileges: Vec<String>,
    /// `SHOW BINARY LOGS`: name and size, oldest first.
    pub binlogs: Vec<(String, u64)>,
    /// Which server this is, to tell its binlog from another's.
    pub server: ServerIdentity,
}

/// Which server a binlog position is of: files and offsets of two servers
/// cannot be compared (a promoted replica's files start over).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerIdentity {
    /// `@@server_id`, unique among a primary and its replicas.
    pub id: u32,
    /// MySQL's `@@server_uuid` (MariaDB has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

impl std::fmt::Display for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server_id {}", self.id)?;
        match &self.uuid {
            Some(u) => write!(f, " (server_uuid {u})"),
            None => Ok(()),
        }
    }
}

impl ServerFacts {
    /// Reads the facts with one connection of the capture user.
    pub async fn read(conn: &mut Conn) -> Result<Self, MySqlSourceError> {
        let q = |c| move |e| MySqlSourceError::server(c, e);
        let row: Option<(String, String, String, String, String, u32)> = conn
            .query_first(
                "SELECT VERSION(), CAST(@@log_bin AS CHAR), @@binlog_format, @@binlog_row_image, CURRENT_USER(), @@server_id",
            )
            .await
            .map_err(q("read server settings"))?;
        let (version, log_bin, binlog_format, binlog_row_image, user, server_id) =
            row.ok_or_else(|| MySqlSourceError::Protocol("no row from SELECT VERSION()".into()))?;
        let flavor = Flavor::from_version(&version);
        let server_uuid: Option<String> = match flavor {
            Flavor::MySql => conn
                .query_first("SELECT @@server_uuid")
                .await
                .map_err(q("read server_uuid"))?,
            Flavor::MariaDb => None,
        };
        let metadata: Vec<(String, String)> = conn
            .query("SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")
            .await
            .map_err(q("read binlog_row_metadata"))?;
        // information_schema names the grantee 'user'@'host'.
        let privileges: Vec<String> = conn
            .query(
                "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES \
                 WHERE GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
                 SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')",
            )
            .await
            .map_err(q("read the user's privileges"))?;
        let binlogs = if log_bin == "1" || log_bin.eq_ignore_ascii_case("on") {
            match binary_logs(conn).await {
                Ok(logs) => logs,
                // Without REPLICATION CLIENT: `check` names the missing
                // grant before it looks at the binlogs.
                Err(mysql_async::Error::Server(e)) if e.code == codes::SPECIFIC_ACCESS_DENIED => {
                    Vec::new()
                }
                Err(e) => return Err(q("SHOW BINARY LOGS")(e)),
            }
        } else {
            Vec::new()
        };
        Ok(Self {
            flavor,
            version,
            log_bin: log_bin == "1" || log_bin.eq_ignore_ascii_case("on"),
            binlog_format,
            binlog_row_image,
            binlog_row_metadata: metadata.into_iter().next().map(|(_, v)| v),
            user,
            privileges: privileges
                .into_iter()
                .map(|p| p.to_ascii_uppercase())
                .collect(),
            binlogs,
            server: ServerIdentity {
                id: server_id,
                uuid: server_uuid,
            },
        })
    }

    /// Every rule, in the order a fix is easiest to apply; `stored` is the
    /// position capture would resume from.
    pub fn check(&self, stored: Option<&Position>) -> Result<(), MySqlSourceError> {
        if !self.log_bin {
            return Err(MySqlSourceError::Prerequisite {
                setting: "log_bin",
                found: "OFF".into(),
                needed: "ON",
                fix: "start the server with log_bin (and a unique server_id); it cannot be changed at runtime",
            });
        }
        if !self.binlog_format.eq_ignore_ascii_case("ROW") {
            return Err(MySqlSourceError::Prerequisite {
                setting: "binlog_format",
                found: self.binlog_format.clone(),
                needed: "ROW",
                fix: "SET GLOBAL binlog_format = 'ROW' and binlog_format = ROW in the server's config file",
            });
        }
        if !self.binlog_row_image.eq_ignore_ascii_case("FULL") {
            return Err(MySqlSourceError::Prerequisite {
                setting: "binlog_row_image",
                found: self.binlog_row_image.clone(),
                needed: "FULL",
                fix: "SET GLOBAL binlog_row_image = 'FULL' and binlog_row_image = FULL in the server's config file",
            });
        }
        match self.binlog_row_metadata.as_deref() {
            Some(m) if m.eq_ignore_ascii_case("FULL") => {}
            Some(m) => {
                return Err(MySqlSourceError::Prerequisite {
                    setting: "binlog_row_metadata",
                    found: m.into(),
                    needed: "FULL",
                    fix: "SET GLOBAL binlog_row_metadata = 'FULL' and binlog_row_metadata = FULL in the server's config file (column names, signedness, ENUM/SET labels and primary keys come from it)",
                })
            }
            None => {
                return Err(MySqlSourceError::Prerequisite {
                    setting: "binlog_row_metadata",
                    found: format!("absent (server {})", self.version),
                    needed: "FULL",
                    fix: "upgrade to MySQL 8.0.1 or later, or MariaDB 10.5 or later",
                })
            }
        }
        let has = |p: &str| self.privileges.iter().any(|x| x == p);
        let mut missing = Vec::new();
        if !has("REPLICATION SLAVE") {
            missing.push("REPLICATION SLAVE");
        }
        // MariaDB 10.5 renamed REPLICATION CLIENT to BINLOG MONITOR (the
        // old name still grants it).
        if !has("REPLICATION CLIENT") && !has("BINLOG MONITOR") {
            missing.push("REPLICATION CLIENT");
        }
        if !has("SELECT") {
            missing.push("SELECT");
        }
        if !missing.is_empty() {
            return Err(MySqlSourceError::Privileges {
                user: self.user.clone(),
                missing: missing.join(", "),
            });
        }
        if let Some(stored) = stored {
            self.check_retained(stored)?;
        }
        Ok(())
    }

    /// The stored position's file must still be on the server, and hold
    /// the position.
    fn check_retained(&self, stored: &Position) -> Result<(), MySqlSourceError> {
        let here = |(name, _): &(String, u64)| name == &stored.file;
        if let Some((_, size)) = self.binlogs.iter().find(|b| here(b)) {
            if stored.pos > *size {
                return Err(MySqlSourceError::Protocol(format!(
                    "the stored position {}:{} is past the end of that binlog ({size} bytes): the offset belongs to another server",
                    stored.file, stored.pos
                )));
            }
            return Ok(());
        }
        let oldest = self
            .binlogs
            .first()
            .map(|(n, _)| n.clone())
            .unwrap_or_default();
        let stored_c = stored.coordinates();
        let oldest_c = BinlogCoordinates {
            file: oldest.clone(),
            pos: 0,
        };
        if self.binlogs.is_empty() || stored_c < oldest_c {
            return Err(MySqlSourceError::PositionPurged {
                stored: format!("{}:{}", stored.file, stored.pos),
                oldest: if oldest.is_empty() {
                    "none".into()
                } else {
                    oldest
                },
            });
        }
        Err(MySqlSourceError::Protocol(format!(
            "the stored binlog {} is not on the server, which has {} to {}: the offset belongs to another server",
            stored.file,
            oldest,
            self.binlogs.last().map(|(n, _)| n.as_str()).unwrap_or("")
        )))
    }
}

/// `SHOW BINARY LOGS`: each binlog's name and size, oldest first.
pub async fn binary_logs(conn: &mut Conn) -> Result<Vec<(String, u64)>, mysql_async::Error> {
    let rows: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect())
}

/// The server's current binlog end and GTID state, where a capture with no
/// stored position starts streaming.
///
/// The GTIDs are those before exactly this file and offset, not the
/// server's state a moment later (a commit in between would be counted as
/// streamed, and a resume by GTID would skip it): MySQL's status row
/// carries them (`Executed_Gtid_Set`); on MariaDB `@@gtid_binlog_pos` is
/// read between two reads of the position that agree (a commit moves
/// the position, and both change together under the binlog's lock), else
/// computed from the binlog (`BINLOG_GTID_POS`, which reads the file up
/// to the offset, so only when writes keep racing the reads).
pub async fn current_position(
    conn: &mut Conn,
    flavor: Flavor,
    version: &str,
) -> Result<Position, MySqlSourceError> {
    if flavor == Flavor::MySql {
        let values = status_row(conn, flavor, version).await?;
        return position_from_status(&values, status_gtids(&values).as_deref());
    }
    let mut position = position_from_status(&status_row(conn, flavor, version).await?, None)?;
    for _ in 0..3 {
        let gtids: Option<String> = conn
            .query_first("SELECT @@gtid_binlog_pos")
            .await
            .map_err(|e| MySqlSourceError::server("read the GTID state", e))?;
        let after = position_from_status(&status_row(conn, flavor, version).await?, None)?;
        if after.coordinates() == position.coordinates() {
            position.gtids = gtid_state(gtids.as_deref())?;
            return Ok(position);
        }
        position = after;
    }
    position.gtids = mariadb_gtids_at(conn, &position.file, position.pos).await?;
    Ok(position)
}

/// The binlog status row (`File`, `Position`, ...).
async fn status_row(
    conn: &mut Conn,
    flavor: Flavor,
    version: &str,
) -> Result<Vec<mysql_async::Value>, MySqlSourceError> {
    let row: Option<mysql_async::Row> =
        conn.query_first(status_statement(flavor, version))
            .await
            .map_err(|e| MySqlSourceError::server("read the binlog status", e))?;
    let row = row.ok_or_else(|| MySqlSourceError::Prerequisite {
        setting: "log_bin",
        found: "OFF".into(),
        needed: "ON",
        fix: "start the server with log_bin",
    })?;
    Ok(row.unwrap())
}

/// A server's GTID state text (MySQL wraps it after commas); `None` when
/// empty (GTIDs off, nothing committed).
fn gtid_state(text: Option<&str>) -> Result<Option<Gtids>, MySqlSourceError> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => t
            .parse::<Gtids>()
            .map(Some)
            .map_err(|e| MySqlSourceError::Protocol(e.to_string())),
    }
}

/// The `Executed_Gtid_Set` column of MySQL's binlog status row, read with
/// the same file and position.
fn status_gtids(row: &[mysql_async::Value]) -> Option<String> {
    row.get(4)
        .cloned()
        .and_then(|v| mysql_async::from_value_opt::<String>(v).ok())
}

/// MariaDB's GTID list before binlog position `file`:`pos` (a transaction
/// boundary), from the binlog itself; `None` on a server without GTIDs.
pub async fn mariadb_gtids_at(
    conn: &mut Conn,
    file: &str,
    pos: u64,
) -> Result<Option<Gtids>, MySqlSourceError> {
    let text: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (file, pos))
        .await
        .map_err(|e| MySqlSourceError::server("read the GTIDs before the binlog position", e))?;
    gtid_state(text.flatten().as_deref())
}

/// The position of a binlog status row (`File`, `Position`, ...: the same
/// first columns under `SHOW MASTER STATUS` and MySQL's `SHOW BINARY LOG
/// STATUS`) and the server's GTID state text (MySQL wraps it after commas).
pub fn position_from_status(
    row: &[mysql_async::Value],
    gtids: Option<&str>,
) -> Result<Position, MySqlSourceError> {
    use mysql_async::from_value_opt;
    let cell = |i: usize, what: &str| {
        row.get(i)
            .cloned()
            .ok_or_else(|| MySqlSourceError::Protocol(format!("binlog status without {what}")))
    };
    let file: String = from_value_opt(cell(0, "a file")?)
        .map_err(|e| MySqlSourceError::Protocol(format!("binlog status file: {e}")))?;
    let pos: u64 = from_value_opt(cell(1, "a position")?)
        .map_err(|e| MySqlSourceError::Protocol(format!("binlog status position: {e}")))?;
    let mut p = Position::at(file, pos);
    p.gtids = gtid_state(gtids)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> ServerFacts {
        ServerFacts {
            flavor: Flavor::MariaDb,
            version: "10.11.19-MariaDB".into(),
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
            binlogs: vec![("binlog.000003".into(), 900), ("binlog.000004".into(), 120)],
            server: ServerIdentity { id: 1, uuid: None },
        }
    }

    fn err(f: ServerFacts, stored: Option<&Position>) -> String {
        f.check(stored).unwrap_err().to_string()
    }

    #[test]
    fn each_setting_is_named_with_its_fix() {
        assert!(good().check(None).is_ok());
        let e = err(
            ServerFacts {
                log_bin: false,
                ..good()
            },
            None,
        );
        assert!(e.contains("log_bin") && e.contains("server_id"), "{e}");
        let e = err(
            ServerFacts {
                binlog_format: "MIXED".into(),
                ..good()
            },
            None,
        );
        assert!(
            e.contains("binlog_format is \"MIXED\"")
                && e.contains("SET GLOBAL binlog_format = 'ROW'"),
            "{e}"
        );
        let e = err(
            ServerFacts {
                binlog_row_image: "MINIMAL".into(),
                ..good()
            },
            None,
        );
        assert!(e.contains("binlog_row_image") && e.contains("FULL"), "{e}");
        let e = err(
            ServerFacts {
                binlog_row_metadata: Some("MINIMAL".into()),
                ..good()
            },
            None,
        );
        assert!(e.contains("SET GLOBAL binlog_row_metadata = 'FULL'"), "{e}");
        let e = err(
            ServerFacts {
                binlog_row_metadata: None,
                ..good()
            },
            None,
        );
        assert!(e.contains("MariaDB 10.5"), "{e}");
    }

    #[test]
    fn privileges_name_the_grant() {
        let e = err(
            ServerFacts {
                privileges: vec!["SELECT".into()],
                ..good()
            },
            None,
        );
        assert_eq!(e, "user oncely@% lacks REPLICATION SLAVE, REPLICATION CLIENT: run GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO oncely@%");
        // MySQL's name for the same privilege.
        let mysql = ServerFacts {
            privileges: vec![
                "SELECT".into(),
                "REPLICATION SLAVE".into(),
                "REPLICATION CLIENT".into(),
            ],
            ..good()
        };
        assert!(mysql.check(None).is_ok());
    }

    #[test]
    fn a_purged_position_is_refused_never_skipped() {
        let old = Position::at("binlog.000002", 4000);
        let e = good().check(Some(&old)).unwrap_err();
        assert!(matches!(e, MySqlSourceError::PositionPurged { .. }));
        assert!(
            e.to_string().contains("binlog.000002:4000")
                && e.to_string().contains("oldest binlog: binlog.000003")
        );
        assert!(good()
            .check(Some(&Position::at("binlog.000004", 120)))
            .is_ok());
        let past = good()
            .check(Some(&Position::at("binlog.000004", 121)))
            .unwrap_err();
        assert!(past.to_string().contains("past the end"));
        let ahead = good()
            .check(Some(&Position::at("binlog.000009", 4)))
            .unwrap_err();
        assert!(ahead.to_string().contains("another server"));
    }

    /// MySQL 8.4's `SHOW BINARY LOG STATUS` row (text protocol bytes) and
    /// its `@@gtid_executed`, wrapped after the comma as MySQL prints it;
    /// and MariaDB's `SHOW MASTER STATUS` with `@@gtid_binlog_pos`.
    #[test]
    fn binlog_status_rows_give_the_position() {
        use mysql_async::Value::Bytes;
        let mysql_row = [
            Bytes(b"binlog.000003".to_vec()),
            Bytes(b"157".to_vec()),
            Bytes(Vec::new()),
            Bytes(Vec::new()),
            Bytes(b"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,\n3e11fa47-71ca-11e1-9e33-c80aa9429563:1-3".to_vec()),
        ];
        let p = position_from_status(
            &mysql_row,
            Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,\n3e11fa47-71ca-11e1-9e33-c80aa9429563:1-3"),
        )
        .unwrap();
        assert_eq!(
            (p.file.as_str(), p.pos, p.event, p.row),
            ("binlog.000003", 157, 0, 0)
        );
        assert_eq!(
            p.gtids.map(|g| g.to_string()).as_deref(),
            Some(
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,3e11fa47-71ca-11e1-9e33-c80aa9429563:1-3"
            )
        );
        let maria = [Bytes(b"binlog.000012".to_vec()), Bytes(b"4711".to_vec())];
        let p = position_from_status(&maria, Some("0-1-42,1-2-7")).unwrap();
        assert_eq!(
            p.gtids.map(|g| g.to_string()).as_deref(),
            Some("0-1-42,1-2-7")
        );
        let p = position_from_status(&maria, Some("")).unwrap();
        assert_eq!(p.gtids, None, "a server without GTIDs yet");
        assert!(position_from_status(&maria[..1], None).is_err());
    }

    /// MySQL-only statements (no MySQL server here): chosen by version.
    #[test]
    fn status_statement_follows_the_server() {
        assert_eq!(
            status_statement(Flavor::MySql, "8.4.3"),
            "SHOW BINARY LOG STATUS"
        );
        assert_eq!(
            status_statement(Flavor::MySql, "8.0.40"),
            "SHOW MASTER STATUS"
        );
        assert_eq!(
            status_statement(Flavor::MariaDb, "10.11.19-MariaDB-0+deb12u1-log"),
            "SHOW MASTER STATUS"
        );
        assert_eq!(
            Flavor::from_version("10.11.19-MariaDB-log"),
            Flavor::MariaDb
        );
        assert_eq!(Flavor::from_version("8.4.3"), Flavor::MySql);
        assert_eq!(
            version_triple("10.11.19-MariaDB-0+deb12u1-log"),
            (10, 11, 19)
        );
    }

    /// MySQL-only (no MySQL server here): the GTID set comes from the
    /// status row itself (`Executed_Gtid_Set`, wrapped after commas as
    /// MySQL prints it), read with its file and position in one statement.
    #[test]
    fn mysql_status_rows_carry_their_own_gtid_set() {
        use mysql_async::Value;
        let set =
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,\n3e11fa47-71ca-11e1-9e33-c80aa9429563:1-3";
        let row = vec![
            Value::Bytes(b"binlog.000007".to_vec()),
            Value::UInt(1234),
            Value::Bytes(Vec::new()),
            Value::Bytes(Vec::new()),
            Value::Bytes(set.as_bytes().to_vec()),
        ];
        let text = status_gtids(&row);
        let p = position_from_status(&row, text.as_deref()).unwrap();
        assert_eq!((p.file.as_str(), p.pos), ("binlog.000007", 1234));
        assert_eq!(
            p.gtids.map(|g| g.to_string()).as_deref(),
            Some(
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5,3e11fa47-71ca-11e1-9e33-c80aa9429563:1-3"
            )
        );
        // MariaDB's row has four columns: its GTIDs are read apart.
        assert_eq!(status_gtids(&row[..4]), None);
        // A server with gtid_mode off prints an empty set.
        let mut off = row.clone();
        off[4] = Value::Bytes(Vec::new());
        let p = position_from_status(&off, status_gtids(&off).as_deref()).unwrap();
        assert_eq!(p.gtids, None);
    }
}
