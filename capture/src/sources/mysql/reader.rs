//! The binlog read as a replica: a dump connection registered with
//! `server.id` (unique among the server's replicas), its events through
//! the [`Decoder`], the shape facts TABLE_MAP lacks kept as of the events
//! ([`ShapeFacts`], from DDL text), and a second connection for the
//! catalog of tables the facts do not know.

use std::collections::VecDeque;

use futures::StreamExt;
use mysql_async::binlog::EventType;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, GnoInterval, Opts, Sid};

use super::checks::Flavor;
use super::decoder::{BinlogChange, Decoder};
use super::error::MySqlSourceError;
use super::history::{ShapeFacts, TransactionFacts};
use super::position::{Gtids, MySqlGtidSet, Position};
use super::shape::{load_catalog, TableShape};
use crate::filter::TableFilter;

/// How to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResumeBy {
    /// The stored file and position (every server).
    #[default]
    FilePosition,
    /// MariaDB only: the stored GTID list (`@slave_connect_state`), which
    /// still finds the transaction after a failover to another primary.
    MariaDbGtid,
    /// MySQL only: the stored GTID set (`COM_BINLOG_DUMP_GTID`: the server
    /// sends every transaction not in it). Built, but tested only on the
    /// request it sends (no MySQL server here).
    MySqlGtid,
}

/// A MySQL GTID set as `COM_BINLOG_DUMP_GTID` carries it: per source UUID,
/// intervals with an exclusive end.
pub fn dump_sids(set: &MySqlGtidSet) -> Vec<Sid<'static>> {
    set.iter()
        .map(|(uuid, intervals)| {
            Sid::new(*uuid).with_intervals(
                intervals
                    .iter()
                    .map(|&(s, e)| GnoInterval::new(s, e.saturating_add(1)))
                    .collect(),
            )
        })
        .collect()
}

/// A running binlog dump.
pub struct BinlogReader {
    stream: BinlogStream,
    decoder: Decoder,
    catalog: Conn,
    flavor: Flavor,
    pending: VecDeque<BinlogChange>,
    facts: TransactionFacts,
    /// `include.query` on MariaDB: statements are read aside
    /// ([`Self::annotation`]).
    annotations: bool,
    /// The end of the last event read in the current file (0: none yet).
    last_end: u64,
}

impl BinlogReader {
    /// Registers as replica `server_id` and asks for the binlog from
    /// `from` (see [`Position`]: a transaction start plus what of it was
    /// already published).
    pub async fn open(
        opts: Opts,
        server_id: u32,
        flavor: Flavor,
        from: &Position,
        resume: ResumeBy,
        captured: TableFilter,
    ) -> Result<Self, MySqlSourceError> {
        let q = |c| move |e| MySqlSourceError::server(c, e);
        let catalog = Conn::new(opts.clone()).await.map_err(q("connect"))?;
        let mut conn = Conn::new(opts).await.map_err(q("connect"))?;
        let mut request = BinlogStreamRequest::new(server_id);
        if flavor == Flavor::MariaDb {
            // 4 = MARIA_SLAVE_CAPABILITY_GTID: the server sends its GTID
            // events (without it, they are rewritten as BEGIN queries).
            conn.query_drop("SET @mariadb_slave_capability = 4")
                .await
                .map_err(q("set @mariadb_slave_capability"))?;
        }
        match (resume, &from.gtids) {
            (ResumeBy::MariaDbGtid, Some(Gtids::MariaDb(list))) => {
                conn.exec_drop("SET @slave_connect_state = ?", (list.to_string(),))
                    .await
                    .map_err(q("set @slave_connect_state"))?;
                // Not strict: a replica with replication filters never
                // logged the transactions it filtered, and the stored GTIDs
                // (its old primary's) may name one; the server then sends
                // from the next transaction it has. That it has every one
                // stored is checked first (`MySqlOffset::check`).
                conn.query_drop("SET @slave_gtid_strict_mode = 0")
                    .await
                    .map_err(q("set @slave_gtid_strict_mode"))?;
            }
            (ResumeBy::MySqlGtid, Some(Gtids::MySql(set))) => {
                request = request.with_gtid().with_gtid_set(dump_sids(set));
            }
            (ResumeBy::MariaDbGtid | ResumeBy::MySqlGtid, _) => {
                return Err(MySqlSourceError::Protocol(format!(
                    "resume by {resume:?} needs a stored GTID state of that server's kind (found {:?})",
                    from.gtids
                )))
            }
            (ResumeBy::FilePosition, _) => {
                request = request
                    .with_filename(from.file.as_bytes())
                    .with_pos(from.pos);
            }
        }
        let stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(q("start the binlog dump"))?;
        Ok(Self {
            stream,
            decoder: match resume {
                ResumeBy::FilePosition => Decoder::new(flavor, from),
                ResumeBy::MariaDbGtid | ResumeBy::MySqlGtid => {
                    Decoder::new(flavor, from).found_by_gtid()
                }
            }
            .capturing(captured),
            catalog,
            flavor,
            pending: VecDeque::new(),
            facts: TransactionFacts::default(),
            annotations: false,
            last_end: 0,
        })
    }

    /// The shape facts as of `from` (stored with it, or a snapshot's), so
    /// events before later DDL decode with the shape they were written
    /// with. Without them a table's facts are read from the catalog at
    /// its first TABLE_MAP: today's, which may be after later DDL.
    pub fn set_facts(&mut self, facts: ShapeFacts) {
        self.facts = TransactionFacts::new(facts);
    }

    /// Row changes carry their statement (`include.query`), from the
    /// next event on.
    pub fn keep_queries(&mut self, keep: bool) {
        self.decoder.keep_queries(keep);
        self.annotations = keep && self.flavor == Flavor::MariaDb;
    }

    /// The shape facts as of the last change [`Self::next`] handed out.
    pub fn facts(&self) -> &ShapeFacts {
        self.facts.now()
    }

    /// The shape facts as of the start of the last change's transaction
    /// (after a commit: the next one's), where a restart from that
    /// change's position reads again from: what to store with it
    /// ([`super::offset::MySqlOffset::facts`]).
    pub fn facts_at_transaction_start(&self) -> &ShapeFacts {
        self.facts.at_start()
    }

    /// The next change; `None` when the server ended the dump.
    pub async fn next(&mut self) -> Result<Option<BinlogChange>, MySqlSourceError> {
        loop {
            if let Some(c) = self.pending.pop_front() {
                if matches!(c, BinlogChange::Commit { .. }) {
                    self.facts.commit();
                }
                return Ok(Some(c));
            }
            let Some(event) = self.stream.next().await else {
                return Ok(None);
            };
            let event = event.map_err(|e| MySqlSourceError::server("read the binlog", e))?;
            if self.annotations {
                self.annotation(&event).await?;
            }
            if event.header().event_type_raw() == EventType::TABLE_MAP_EVENT as u8 {
                self.prepare_catalog(&event).await?;
            }
            self.decoder.handle(&event, &mut self.pending)?;
            // DDL changes the facts of the tables it names, from its text
            // (pending holds this event's changes only).
            for c in &self.pending {
                if let BinlogChange::Ddl {
                    database, query, ..
                } = c
                {
                    for (db, table) in self.facts.change().apply_ddl(database, query) {
                        self.decoder.forget_catalog(&db, &table);
                    }
                }
            }
        }
    }

    /// MariaDB sends its ANNOTATE_ROWS events only to a replica that asks
    /// with a dump flag (`BINLOG_SEND_ANNOTATE_ROWS_EVENT`) mysql_async
    /// cannot send, and omits them otherwise, leaving a gap in the offsets
    /// before the statement's first TABLE_MAP: the event in that gap is
    /// read with SHOW BINLOG EVENTS (one round trip per statement) and,
    /// when it is the annotation, given to the decoder.
    async fn annotation(
        &mut self,
        event: &mysql_async::binlog::events::Event,
    ) -> Result<(), MySqlSourceError> {
        let header = event.header();
        let end = u64::from(header.log_pos());
        if end == 0 || header.event_type_raw() == EventType::HEARTBEAT_EVENT as u8 {
            // Sent out of place (the dump's opening rotate and format
            // description) or not in the file (a heartbeat).
            return Ok(());
        }
        let start = end.saturating_sub(u64::from(header.event_size()));
        let gap_from = std::mem::replace(&mut self.last_end, end);
        if header.event_type_raw() != EventType::TABLE_MAP_EVENT as u8
            || gap_from == 0
            || start <= gap_from
        {
            return Ok(());
        }
        let sql = format!(
            "SHOW BINLOG EVENTS IN {} FROM {gap_from} LIMIT 1",
            oncely_core::sql::quote_literal(self.decoder.file())
        );
        let row: Option<mysql_async::Row> = self
            .catalog
            .query_first(sql)
            .await
            .map_err(|e| MySqlSourceError::server("read an ANNOTATE_ROWS event", e))?;
        // Another event in the gap: this statement has none (the last
        // one's is not carried over).
        let statement = row.and_then(|row| {
            let kind: Option<String> = row.get(2);
            let info: Option<Vec<u8>> = row.get(5);
            (kind.as_deref() == Some("Annotate_rows"))
                .then(|| info.map(|i| String::from_utf8_lossy(&i).into_owned()))
                .flatten()
        });
        self.decoder.set_statement(statement.as_deref());
        Ok(())
    }

    /// Gives the decoder a table's facts before its TABLE_MAP is decoded:
    /// the known ones, else the catalog's (recorded in the facts from then).
    async fn prepare_catalog(
        &mut self,
        event: &mysql_async::binlog::events::Event,
    ) -> Result<(), MySqlSourceError> {
        let tme: mysql_async::binlog::events::TableMapEvent<'_> = event
            .read_event()
            .map_err(|e| MySqlSourceError::Protocol(format!("TABLE_MAP: {e}")))?;
        let (db, table) = (
            tme.database_name().into_owned(),
            tme.table_name().into_owned(),
        );
        if self.decoder.has_catalog(&db, &table) {
            return Ok(());
        }
        let cols = match self.facts.now().catalog(&db, &table) {
            Some(cols) => cols,
            None => {
                let cols = load_catalog(&mut self.catalog, self.flavor, &db, &table).await?;
                self.facts
                    .change()
                    .set_from_table_map(&db, &table, &cols, tme.table_id());
                cols
            }
        };
        // Columns the facts have no number for (stored before numbers
        // existed, or DDL the parser passed over) are numbered now.
        let names: Vec<String> = TableShape::from_table_map(&tme)?
            .columns
            .into_iter()
            .map(|c| c.name)
            .collect();
        let covered = self
            .facts
            .now()
            .ids(&db, &table)
            .is_some_and(|ids| ids.covers(names.iter().map(String::as_str)));
        if !covered {
            self.facts.change().number_columns(&db, &table, &names);
        }
        let ids = self.facts.now().ids(&db, &table).cloned();
        self.decoder.set_catalog(&db, &table, cols, ids);
        Ok(())
    }

    /// Ends the dump and closes both connections.
    pub async fn close(self) -> Result<(), MySqlSourceError> {
        self.stream
            .close()
            .await
            .map_err(|e| MySqlSourceError::server("close the binlog dump", e))?;
        self.catalog
            .disconnect()
            .await
            .map_err(|e| MySqlSourceError::server("close the catalog connection", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MySQL-only: the SID block of the dump request, from a GTID set as
    /// `@@gtid_executed` prints it (ends made exclusive).
    #[test]
    fn mysql_gtid_sets_become_the_dump_requests_sid_block() {
        let set: MySqlGtidSet =
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7,3e11fa47-71ca-11e1-9e33-c80aa9429563:3"
                .parse()
                .unwrap();
        let sids = dump_sids(&set);
        let shown: Vec<(String, Vec<(u64, u64)>)> = sids
            .iter()
            .map(|s| {
                let iv = s.intervals().iter().map(|i| (i.start(), i.end())).collect();
                (
                    s.to_string().split(':').next().unwrap_or("").to_string(),
                    iv,
                )
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "3e11fa47-71ca-11e1-9e33-c80aa9429562".into(),
                    vec![(1, 6), (7, 8)]
                ),
                ("3e11fa47-71ca-11e1-9e33-c80aa9429563".into(), vec![(3, 4)]),
            ]
        );
    }
}
