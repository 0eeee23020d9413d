//! Byte fixtures for what this machine's MariaDB cannot produce: MySQL's
//! GTID events and GTID sets, its HEARTBEAT_LOG_EVENT_V2. Events are built
//! byte by byte as the MySQL 8 binlog format defines them (v4 header, no
//! checksum unless said) and parsed by mysql_common's EventStreamReader,
//! as the replica stream parses them. The MariaDB paths run against a real
//! server in tests/it/mysql_binlog.rs.

use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::binlog::EventStreamReader;

use super::*;

const UUID: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
const SID: [u8; 16] = [
    0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42, 0x95, 0x62,
];

/// A v4 event: header (timestamp, type, server id, size, end position,
/// flags), then `body`.
fn event(ty: u8, start: u32, body: &[u8]) -> Vec<u8> {
    let size = 19 + body.len() as u32;
    let mut out = Vec::new();
    out.extend_from_slice(&1_796_432_523u32.to_le_bytes());
    out.push(ty);
    out.extend_from_slice(&7u32.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(start + size).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// MySQL's GTID_EVENT (0x21) body in its 5.6 form: flags, SID, GNO.
fn gtid(gno: u64) -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend_from_slice(&SID);
    b.extend_from_slice(&gno.to_le_bytes());
    b
}

/// QUERY_EVENT (0x02) body: thread, time, schema length, error code, no
/// status variables, schema, NUL, query.
fn query(schema: &str, q: &str) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&11u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(schema.len() as u8);
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(schema.as_bytes());
    b.push(0);
    b.extend_from_slice(q.as_bytes());
    b
}

/// Feeds events laid out back to back from `start`; returns the changes.
/// After a TRANSACTION_PAYLOAD event, the events it unpacks to, as the
/// replica stream (mysql_async's `BinlogStream`) hands them over: none when
/// the payload does not parse or unpack.
fn run(
    decoder: &mut Decoder,
    start: u32,
    events: &[(u8, Vec<u8>)],
) -> Result<Vec<BinlogChange>, MySqlSourceError> {
    use mysql_common::binlog::events::TransactionPayloadEvent;

    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let mut out = VecDeque::new();
    let mut at = start;
    for (ty, body) in events {
        let bytes = event(*ty, at, body);
        at += bytes.len() as u32;
        let ev = reader
            .read(&bytes[..])
            .expect("fixture parses")
            .expect("an event");
        decoder.handle(&ev, &mut out)?;
        if *ty == TRANSACTION_PAYLOAD {
            let Ok(payload) = ev.read_event::<TransactionPayloadEvent<'_>>() else {
                continue;
            };
            let mut unpacked = std::io::Cursor::new(payload.danger_decompress());
            while let Some(inner) = reader
                .read_decompressed(&mut unpacked)
                .expect("the unpacked events parse")
            {
                decoder.handle(&inner, &mut out)?;
            }
        }
    }
    Ok(out.into_iter().collect())
}

fn start_at(pos: u64) -> Position {
    let mut p = Position::at("binlog.000007", pos);
    p.gtids = Some(format!("{UUID}:1-41").parse().unwrap());
    p
}

#[test]
fn mysql_gtid_transactions_carry_and_advance_the_gtid_set() {
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    let ddl = "ALTER TABLE t ADD c int";
    let changes = run(
        &mut d,
        4,
        &[
            (0x21, gtid(42)),
            (0x02, query("shop", ddl)),
            (0x21, gtid(43)),
            (0x02, query("shop", "BEGIN")),
            // An idle heartbeat inside the transaction: never counted.
            (0x29, vec![0u8; 8]),
            (0x10, 9u64.to_le_bytes().to_vec()),
        ],
    )
    .unwrap();
    let gtid_len = 19 + 25;
    let ddl_end = 4 + gtid_len + 19 + 13 + 5 + ddl.len() as u64;
    let mut ddl_pos = Position::at("binlog.000007", 4);
    ddl_pos.gtids = start_at(4).gtids;
    ddl_pos.event = 1;
    ddl_pos.row = 1;
    let mut after_ddl = Position::at("binlog.000007", ddl_end);
    after_ddl.gtids = Some(format!("{UUID}:1-42").parse().unwrap());
    let xid_end = ddl_end + gtid_len + 19 + 13 + 5 + 5 + 19 + 8 + 19 + 8;
    let mut after_xid = Position::at("binlog.000007", xid_end);
    after_xid.gtids = Some(format!("{UUID}:1-43").parse().unwrap());
    assert_eq!(
        changes,
        vec![
            BinlogChange::Ddl {
                database: "shop".into(),
                query: ddl.into(),
                position: ddl_pos,
                gtid: Some(format!("{UUID}:42")),
            },
            BinlogChange::Commit {
                position: after_ddl,
                xid: None
            },
            BinlogChange::Commit {
                position: after_xid,
                xid: Some(9)
            },
        ]
    );
}

#[test]
fn a_resume_skips_what_was_published_and_must_start_at_a_transaction() {
    // The DDL (event 1, row 1) was published: only the commit remains.
    let mut from = start_at(4);
    from.event = 1;
    from.row = 1;
    let mut d = Decoder::new(Flavor::MySql, &from);
    let changes = run(
        &mut d,
        4,
        &[(0x21, gtid(42)), (0x02, query("shop", "DROP TABLE t"))],
    )
    .unwrap();
    assert!(
        matches!(changes.as_slice(), [BinlogChange::Commit { .. }]),
        "{changes:?}"
    );

    // A stored position that is not a transaction start is refused.
    let mut d = Decoder::new(Flavor::MySql, &from);
    let err = run(&mut d, 100, &[(0x21, gtid(42))]).unwrap_err();
    assert!(
        err.to_string().contains("not where a transaction starts"),
        "{err}"
    );
    // Found by GTID (on another primary after a failover): any offset.
    let mut d = Decoder::new(Flavor::MySql, &from).found_by_gtid();
    let changes = run(
        &mut d,
        100,
        &[(0x21, gtid(42)), (0x02, query("shop", "DROP TABLE t"))],
    )
    .unwrap();
    assert!(
        matches!(changes.as_slice(), [BinlogChange::Commit { .. }]),
        "{changes:?}"
    );
}

#[test]
fn a_transaction_inside_a_transaction_is_a_protocol_error() {
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    let err = run(
        &mut d,
        4,
        &[
            (0x21, gtid(42)),
            (0x02, query("shop", "BEGIN")),
            (0x21, gtid(43)),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(err, MySqlSourceError::Protocol(_)) && !err.is_retriable(),
        "{err}"
    );
}

/// The rotate that opens every dump precedes the format description, so
/// its CRC32 is still on the name (MariaDB and MySQL both send it so once
/// `@master_binlog_checksum` is set).
#[test]
fn the_opening_rotate_loses_its_checksum() {
    let mut body = 4u64.to_le_bytes().to_vec();
    body.extend_from_slice(b"binlog.000012");
    let mut bytes = event(0x04, 0, &body);
    // The fake rotate has end position 0.
    bytes[13..17].copy_from_slice(&0u32.to_le_bytes());
    let size = (bytes.len() + 4) as u32;
    bytes[9..13].copy_from_slice(&size.to_le_bytes());
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let ev = reader.read(&bytes[..]).unwrap().unwrap();
    let mut d = Decoder::new(Flavor::MariaDb, &Position::at("", 4));
    let mut out = VecDeque::new();
    d.handle(&ev, &mut out).unwrap();
    // The next transaction starts in the named file.
    let changes = run(
        &mut d,
        4,
        &[(0x02, query("shop", "CREATE TABLE t (id int)"))],
    )
    .unwrap();
    assert_eq!(position_of(&changes[0]).file, "binlog.000012");
}

fn position_of(c: &BinlogChange) -> &Position {
    match c {
        BinlogChange::Row(r) => &r.position,
        BinlogChange::Ddl { position, .. } | BinlogChange::Commit { position, .. } => position,
    }
}

/// MariaDB's compressed form of `text` (`log_bin_compress`): the header
/// byte (zlib, `len_len` length bytes), the length big-endian, zlib.
fn compress(text: &[u8], len_len: usize) -> Vec<u8> {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(text).unwrap();
    let mut out = vec![0x80 | len_len as u8];
    out.extend_from_slice(&(text.len() as u32).to_be_bytes()[4 - len_len..]);
    out.extend(z.finish().unwrap());
    out
}

/// QUERY_COMPRESSED_EVENT (165): a query event whose text is compressed.
fn compressed_query(schema: &str, q: &str, len_len: usize) -> Vec<u8> {
    let mut b = query(schema, "");
    b.extend(compress(q.as_bytes(), len_len));
    b
}

/// A DDL above `log_bin_compress_min_len` comes as a compressed query event:
/// it decodes as the plain one would, at the compressed event's place, and
/// the next transaction starts where the compressed event ends.
#[test]
fn a_compressed_query_decodes_as_the_plain_one() {
    let ddl = format!("CREATE TABLE t ({})", "c int, ".repeat(60) + "id int");
    let plain = run(
        &mut Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)),
        4,
        &[(0x02, query("shop", &ddl))],
    )
    .unwrap();
    for len_len in [2, 4] {
        let body = compressed_query("shop", &ddl, len_len);
        let end = 4 + 19 + body.len() as u64;
        let changes = run(
            &mut Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)),
            4,
            &[(165, body)],
        )
        .unwrap();
        assert_eq!(changes[0], plain[0], "the DDL, at the same place");
        assert_eq!(
            changes[1],
            BinlogChange::Commit {
                position: Position::at("binlog.000007", end),
                xid: None
            }
        );
    }
}

/// A compressed event that does not decompress stops the stream naming
/// `log_bin_compress`; it is never passed over.
#[test]
fn a_compressed_event_that_does_not_decompress_stops_the_stream() {
    let ddl = "CREATE TABLE t (id int)";
    let mut corrupt = compressed_query("shop", ddl, 1);
    let n = corrupt.len();
    corrupt[n - 6] ^= 0xff;
    let mut long = query("shop", "");
    long.extend(compress(ddl.as_bytes(), 1));
    // It announces one byte less than its zlib stream holds.
    let at = long.len() - compress(ddl.as_bytes(), 1).len() + 1;
    long[at] -= 1;
    let mut other_algorithm = compressed_query("shop", ddl, 1);
    let at = other_algorithm.len() - compress(ddl.as_bytes(), 1).len();
    other_algorithm[at] |= 0x10;
    for body in [corrupt, long, other_algorithm] {
        let err = run(
            &mut Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)),
            4,
            &[(165, body)],
        )
        .unwrap_err();
        assert!(
            matches!(err, MySqlSourceError::Protocol(_))
                && err.to_string().contains("log_bin_compress"),
            "{err}"
        );
    }
}

/// An event type nobody knows stops the stream unless the server marks it
/// ignorable (then it only counts, as before).
#[test]
fn an_unknown_event_type_stops_the_stream_unless_marked_ignorable() {
    let mut d = Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4));
    let err = run(
        &mut d,
        4,
        &[(0x02, query("shop", "BEGIN")), (200, vec![1; 30])],
    )
    .unwrap_err();
    assert!(
        matches!(err, MySqlSourceError::Protocol(_))
            && err.to_string().contains("event type 200")
            && err.to_string().contains("not mark it ignorable"),
        "{err}"
    );

    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let mut d = Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4));
    let mut out = VecDeque::new();
    let mut at = 4;
    for (ty, body, flags) in [
        (0x02, query("shop", "BEGIN"), 0u16),
        (200, vec![1; 30], 0x80),
        (0x02, query("shop", "COMMIT"), 0),
    ] {
        let mut bytes = event(ty, at, &body);
        bytes[17..19].copy_from_slice(&flags.to_le_bytes());
        at += bytes.len() as u32;
        let ev = reader.read(&bytes[..]).unwrap().unwrap();
        d.handle(&ev, &mut out).unwrap();
    }
    assert!(
        matches!(out.back(), Some(BinlogChange::Commit { position, .. }) if position.pos == u64::from(at)),
        "{out:?}"
    );
}

/// A row change logged as a statement (a session with `binlog_format =
/// STATEMENT`) stops the stream naming the setting: its rows are not in
/// the binlog, and passing over it as DDL lost them. DDL and the words
/// inside other statements are not taken for one.
#[test]
fn a_row_change_logged_as_a_statement_stops_the_stream() {
    for dml in [
        "INSERT INTO t VALUES (1)",
        "  /* app */ update t SET v = 2",
        "DELETE FROM t",
        "REPLACE INTO t VALUES (1)",
    ] {
        let err = run(
            &mut Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)),
            4,
            &[(0x02, query("shop", "BEGIN")), (0x02, query("shop", dml))],
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                MySqlSourceError::Prerequisite {
                    setting: "binlog_format",
                    ..
                }
            ) && err.to_string().contains("new snapshot"),
            "{dml}: {err}"
        );
    }
    for ddl in [
        "CREATE TABLE inserts (id int)",
        "ALTER TABLE t ADD COLUMN deleted int",
        "TRUNCATE TABLE t",
    ] {
        let changes = run(
            &mut Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)),
            4,
            &[(0x02, query("shop", ddl))],
        )
        .unwrap();
        assert!(
            matches!(&changes[0], BinlogChange::Ddl { query, .. } if query == ddl),
            "{changes:?}"
        );
    }
}

/// Only a statement that may write a captured table stops the stream: one
/// that names only other databases' tables is passed over (another
/// application's session on the same server must not stop capture), and
/// one whose tables cannot be told stops it.
#[test]
fn a_row_change_logged_as_a_statement_stops_the_stream_only_when_it_may_write_a_captured_table() {
    let shop = || {
        let filter = TableFilter::new(&[], &[])
            .and_then(|f| f.with_databases(&["shop".to_owned()], &[]))
            .unwrap();
        Decoder::new(Flavor::MariaDb, &Position::at("binlog.000007", 4)).capturing(filter)
    };
    for (schema, dml) in [
        ("other", "INSERT INTO t VALUES (1)"),
        ("shop", "UPDATE other.t SET v = 2"),
        ("other", "DELETE LOW_PRIORITY FROM `t` WHERE id = 1"),
        ("shop", "LOAD DATA INFILE '/tmp/x' INTO TABLE other.t"),
    ] {
        let changes = run(
            &mut shop(),
            4,
            &[(0x02, query(schema, "BEGIN")), (0x02, query(schema, dml))],
        )
        .unwrap_or_else(|e| panic!("{dml} in {schema}: {e}"));
        assert!(
            matches!(changes.last(), Some(BinlogChange::Ddl { query, .. }) if query == dml),
            "{changes:?}"
        );
    }
    for (schema, dml) in [
        ("shop", "INSERT INTO t VALUES (1)"),
        ("other", "REPLACE INTO shop.t VALUES (1)"),
        ("other", "UPDATE `shop`.`t` AS x SET v = 2"),
        // Multi-table forms: their tables are not read here.
        (
            "other",
            "UPDATE t JOIN shop.t2 ON t.id = t2.id SET t2.v = 1",
        ),
        ("other", "DELETE t1 FROM t1 JOIN shop.t2"),
    ] {
        let err = run(
            &mut shop(),
            4,
            &[(0x02, query(schema, "BEGIN")), (0x02, query(schema, dml))],
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                MySqlSourceError::Prerequisite {
                    setting: "binlog_format",
                    ..
                }
            ),
            "{dml} in {schema}: {err}"
        );
    }
}

/// TABLE_MAP_EVENT (0x13) body of `shop.t (id INT NOT NULL)`, table id 5,
/// with the column name (`binlog_row_metadata = FULL`).
fn table_map() -> Vec<u8> {
    let mut b = 5u64.to_le_bytes()[..6].to_vec();
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&[4, b's', b'h', b'o', b'p', 0, 1, b't', 0]);
    // One column, type LONG, no metadata, not nullable.
    b.extend_from_slice(&[1, 3, 0, 0]);
    // Optional metadata: COLUMN_NAME (4), 3 bytes, "id".
    b.extend_from_slice(&[4, 3, 2, b'i', b'd']);
    b
}

/// WRITE_ROWS_EVENT v2 (0x1e) body of table 5: one row per value.
fn write_rows(ids: &[i32]) -> Vec<u8> {
    let mut b = 5u64.to_le_bytes()[..6].to_vec();
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&[1, 0x01]);
    for id in ids {
        b.push(0);
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// MySQL's ROWS_QUERY_LOG_EVENT (0x1d) body: a length byte (ignored, the
/// text runs to the event's end), the statement.
fn rows_query(q: &str) -> Vec<u8> {
    let mut b = vec![q.len().min(255) as u8];
    b.extend_from_slice(q.as_bytes());
    b
}

const INSERT_1: &str = "INSERT INTO t VALUES (1), (2)";
const INSERT_3: &str = "insert into t values (3) /* MariaDB's annotate */";

/// A transaction of two statements: MySQL's ROWS_QUERY before the first
/// (two rows), MariaDB's ANNOTATE_ROWS (0xa0, the bare text) before the
/// second.
fn two_statements() -> Vec<(u8, Vec<u8>)> {
    vec![
        (0x21, gtid(42)),
        (0x02, query("shop", "BEGIN")),
        (0x1d, rows_query(INSERT_1)),
        (0x13, table_map()),
        (0x1e, write_rows(&[1, 2])),
        (mariadb_events::ANNOTATE_ROWS, INSERT_3.as_bytes().to_vec()),
        (0x13, table_map()),
        (0x1e, write_rows(&[3])),
        (0x10, 9u64.to_le_bytes().to_vec()),
    ]
}

/// Each row change's (event, row) and statement.
fn row_queries(changes: &[BinlogChange]) -> Vec<(u64, u64, Option<String>)> {
    changes
        .iter()
        .filter_map(|c| match c {
            BinlogChange::Row(r) => Some((
                r.position.event,
                r.position.row,
                r.query.as_deref().map(str::to_owned),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn rows_carry_the_statement_of_the_rows_query_or_annotate_event_before_them() {
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    d.keep_queries(true);
    let changes = run(&mut d, 4, &two_statements()).unwrap();
    let q1 = Some(INSERT_1.to_owned());
    let q3 = Some(INSERT_3.to_owned());
    assert_eq!(
        row_queries(&changes),
        vec![(4, 1, q1.clone()), (4, 2, q1), (7, 1, q3)],
        "the statement events count as events, as before"
    );
    // Without include.query nothing is kept (and the counts are the same).
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    let changes = run(&mut d, 4, &two_statements()).unwrap();
    assert_eq!(
        row_queries(&changes),
        vec![(4, 1, None), (4, 2, None), (7, 1, None)]
    );
}

#[test]
fn a_resume_inside_a_transaction_gives_the_replayed_rows_their_statement() {
    // The first row was published: the dump starts again at the
    // transaction's GTID event, so the statement event is read again.
    for (event, row, expected) in [
        (4, 1, vec![(4, 2, Some(INSERT_1)), (7, 1, Some(INSERT_3))]),
        (4, 2, vec![(7, 1, Some(INSERT_3))]),
    ] {
        let mut from = start_at(4);
        from.event = event;
        from.row = row;
        let mut d = Decoder::new(Flavor::MySql, &from);
        d.keep_queries(true);
        let changes = run(&mut d, 4, &two_statements()).unwrap();
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(e, r, q)| (e, r, q.map(str::to_owned)))
            .collect();
        assert_eq!(row_queries(&changes), expected, "resumed at {event}/{row}");
    }
}

#[test]
fn a_statement_does_not_outlive_its_transaction() {
    let mut events = two_statements();
    // The next transaction's rows come without a statement event
    // (binlog_rows_query_log_events turned off in a session).
    events.extend([
        (0x21, gtid(43)),
        (0x02, query("shop", "BEGIN")),
        (0x13, table_map()),
        (0x1e, write_rows(&[4])),
        (0x10, 10u64.to_le_bytes().to_vec()),
    ]);
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    d.keep_queries(true);
    let changes = run(&mut d, 4, &events).unwrap();
    assert_eq!(row_queries(&changes).last(), Some(&(3, 1, None)));
}

#[test]
fn a_statement_read_aside_is_kept_but_not_counted() {
    // MariaDB's dump omits ANNOTATE_ROWS; the reader reads it aside and
    // hands it over before the TABLE_MAP. The counts stay the dump's.
    let mut reader = EventStreamReader::new(BinlogVersion::Version4);
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    d.keep_queries(true);
    let mut out = VecDeque::new();
    let mut at = 4;
    for (ty, body) in [
        (0x21, gtid(42)),
        (0x02, query("shop", "BEGIN")),
        (0x13, table_map()),
        (0x1e, write_rows(&[1])),
        // A statement whose gap held no annotation: none, not the last one.
        (0x13, table_map()),
        (0x1e, write_rows(&[2])),
        (0x10, 9u64.to_le_bytes().to_vec()),
    ] {
        if ty == 0x13 {
            let first = at == 4 + 44 + 19 + 13 + 5 + 5;
            d.set_statement(first.then_some(INSERT_3));
        }
        let bytes = event(ty, at, &body);
        at += bytes.len() as u32;
        let ev = reader.read(&bytes[..]).unwrap().unwrap();
        d.handle(&ev, &mut out).unwrap();
    }
    let changes: Vec<_> = out.into_iter().collect();
    assert_eq!(
        row_queries(&changes),
        vec![(3, 1, Some(INSERT_3.to_owned())), (5, 1, None)]
    );
}

/// MySQL's TRANSACTION_PAYLOAD_EVENT (`binlog_transaction_compression`).
const TRANSACTION_PAYLOAD: u8 = 0x28;

/// A length-encoded integer.
fn lenenc(v: u64) -> Vec<u8> {
    match v {
        0..=250 => vec![v as u8],
        251..=0xffff => [&[0xfc][..], &v.to_le_bytes()[..2]].concat(),
        0x1_0000..=0xff_ffff => [&[0xfd][..], &v.to_le_bytes()[..3]].concat(),
        _ => [&[0xfe][..], &v.to_le_bytes()[..]].concat(),
    }
}

/// A TRANSACTION_PAYLOAD_EVENT body holding `events` (type, body), each
/// written as MySQL writes the events of a compressed transaction (end
/// position 0, no checksum), compressed with zstd: its header fields as
/// (field, length, value) of length-encoded integers (payload size,
/// compression type 0 = zstd, uncompressed size), the end mark (0), then
/// `compressed(plain)` as the payload.
fn transaction_payload(events: &[(u8, Vec<u8>)], compressed: impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let mut plain = Vec::new();
    for (ty, body) in events {
        let mut bytes = event(*ty, 0, body);
        bytes[13..17].copy_from_slice(&0u32.to_le_bytes());
        plain.extend(bytes);
    }
    let payload = compressed(&plain);
    let mut b = Vec::new();
    for (field, value) in [(1u8, payload.len() as u64), (2, 0), (3, plain.len() as u64)] {
        let v = lenenc(value);
        b.push(field);
        b.push(v.len() as u8);
        b.extend(v);
    }
    b.push(0);
    b.extend(payload);
    b
}

fn zstd(plain: &[u8]) -> Vec<u8> {
    zstd::encode_all(plain, 3).expect("zstd compresses")
}

/// A compressed transaction of one statement (rows 1 and 2), then a plain
/// one (row 3), with their GTIDs.
fn compressed_then_plain(compressed: impl Fn(&[u8]) -> Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    vec![
        (0x21, gtid(42)),
        (
            TRANSACTION_PAYLOAD,
            transaction_payload(
                &[
                    (0x02, query("shop", "BEGIN")),
                    (0x13, table_map()),
                    (0x1e, write_rows(&[1, 2])),
                    (0x10, 9u64.to_le_bytes().to_vec()),
                ],
                compressed,
            ),
        ),
        (0x21, gtid(43)),
        (0x02, query("shop", "BEGIN")),
        (0x13, table_map()),
        (0x1e, write_rows(&[3])),
        (0x10, 10u64.to_le_bytes().to_vec()),
    ]
}

/// (event, row) of each row change and the file offset of each commit.
fn rows_and_commits(changes: &[BinlogChange]) -> Vec<(u64, u64, u64)> {
    changes
        .iter()
        .map(|c| match c {
            BinlogChange::Row(r) => (r.position.event, r.position.row, r.position.pos),
            BinlogChange::Commit { position, .. } => (0, 0, position.pos),
            BinlogChange::Ddl { position, .. } => (position.event, position.row, position.pos),
        })
        .collect()
}

/// MySQL's compressed transactions (`binlog_transaction_compression = ON`;
/// only as byte fixtures, no MySQL server here): their events, unpacked by
/// the replica stream, carry no place in the file (end position 0), so
/// they are counted inside the transaction as any others and its commit
/// ends where the payload event ends: the next start is a real offset.
#[test]
fn a_compressed_transaction_commits_where_its_payload_ends() {
    let events = compressed_then_plain(zstd);
    let size = |events: &[(u8, Vec<u8>)]| -> u64 {
        events.iter().map(|(_, body)| 19 + body.len() as u64).sum()
    };
    let payload_end = 4 + size(&events[..2]);
    let plain_end = payload_end + size(&events[2..]);
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    let changes = run(&mut d, 4, &events).unwrap();
    // Events: GTID 0, payload 1, BEGIN 2, TABLE_MAP 3, rows 4.
    assert_eq!(
        rows_and_commits(&changes),
        vec![
            (4, 1, 4),
            (4, 2, 4),
            (0, 0, payload_end),
            (3, 1, payload_end),
            (0, 0, plain_end),
        ]
    );
    let after = position_of(&changes[2]);
    assert_eq!(after.gtids, Some(format!("{UUID}:1-42").parse().unwrap()));
    assert_eq!((after.event, after.row), (0, 0));

    // Resumed after its first row: the dump starts again at its GTID and
    // the stream unpacks it again; only the second row is new.
    let mut from = start_at(4);
    from.event = 4;
    from.row = 1;
    let mut d = Decoder::new(Flavor::MySql, &from);
    let changes = run(&mut d, 4, &events).unwrap();
    assert_eq!(
        rows_and_commits(&changes),
        vec![
            (4, 2, 4),
            (0, 0, payload_end),
            (3, 1, payload_end),
            (0, 0, plain_end)
        ]
    );
}

/// The replica stream passes over a payload it cannot unpack (a zstd
/// frame that does not decode) or parse, handing over no events: the
/// transaction's rows would be lost with a healthy status, so the stream
/// stops at the next event, naming the setting.
#[test]
fn a_compressed_transaction_that_does_not_unpack_stops_the_stream() {
    let damaged = |plain: &[u8]| {
        let mut z = zstd(plain);
        let half = z.len() / 2;
        z.truncate(half);
        z
    };
    let not_parsed = vec![
        (0x21, gtid(42)),
        // A header whose payload size runs past the event.
        (TRANSACTION_PAYLOAD, vec![1, 1, 200, 2, 1, 0, 0, 1, 2, 3]),
    ];
    for (what, events) in [
        ("damaged", compressed_then_plain(damaged)),
        ("not parsed", not_parsed),
    ] {
        let mut d = Decoder::new(Flavor::MySql, &start_at(4));
        let err = run(&mut d, 4, &events).unwrap_err();
        assert!(
            matches!(
                err,
                MySqlSourceError::Prerequisite {
                    setting: "binlog_transaction_compression",
                    ..
                }
            ) && !err.is_retriable()
                && err.to_string().contains("binlog.000007:48"),
            "{what}: {err}"
        );
    }
}

/// A tagged GTID (MySQL 8.3+; the event as mysql_common writes it) stops
/// the stream naming the setting: the GTID set capture stores has no
/// place for the tag.
#[test]
fn a_tagged_gtid_stops_the_stream_naming_it() {
    use mysql_common::binlog::events::GtidEvent;
    use mysql_common::packets::Tag;
    use mysql_common::proto::MySerialize;

    let tagged = GtidEvent::new_tagged(SID, Tag::new("blue").expect("a tag"), 42);
    let mut body = Vec::new();
    tagged.serialize(&mut body);
    let mut d = Decoder::new(Flavor::MySql, &start_at(4));
    let err = run(&mut d, 4, &[(0x2a, body), (0x02, query("shop", "BEGIN"))]).unwrap_err();
    assert!(
        matches!(
            err,
            MySqlSourceError::Prerequisite {
                setting: "gtid_next",
                ..
            }
        ) && err
            .to_string()
            .contains(&format!("({UUID}:blue:42) at binlog.000007:4")),
        "{err}"
    );
}
