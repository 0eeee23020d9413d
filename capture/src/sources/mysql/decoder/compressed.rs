//! MariaDB's compressed events (`log_bin_compress = ON`): a query or rows
//! event whose statement text or row data is zlib-compressed, written
//! instead of the plain event when that part is at least
//! `log_bin_compress_min_len` bytes. mysql_common does not know these
//! types, and a decoder that passed over them would lose every large row
//! with a healthy status, so each one is turned back into the plain event
//! it stands for (as MariaDB's own replica does) before it is decoded.
//!
//! The compressed part starts with one byte `1aaa0lll` (`aaa` the
//! algorithm, 0 = zlib; `lll` how many bytes of big-endian uncompressed
//! length follow, 1 to 4), then the zlib stream. Everything before it —
//! the query's post-header, status variables and schema; the rows event's
//! post-header, column count and column bitmaps — is kept as it is.

use std::io::Read;

use mysql_async::binlog::events::Event;
use mysql_async::binlog::BinlogChecksumAlg;
use mysql_async::binlog::BinlogVersion;

/// MariaDB's `QUERY_COMPRESSED_EVENT`.
pub const QUERY_COMPRESSED: u8 = 165;
/// `WRITE_ROWS_COMPRESSED_EVENT_V1`; update and delete follow it.
pub const WRITE_ROWS_COMPRESSED_V1: u8 = 166;
/// `WRITE_ROWS_COMPRESSED_EVENT` (v2 rows events); update and delete follow.
pub const WRITE_ROWS_COMPRESSED: u8 = 169;
const DELETE_ROWS_COMPRESSED: u8 = 171;

/// The plain types: `QUERY_EVENT`, `WRITE_ROWS_EVENT_V1`, `WRITE_ROWS_EVENT`.
const QUERY: u8 = 0x02;
const WRITE_ROWS_V1: u8 = 0x17;
const WRITE_ROWS_V2: u8 = 0x1e;

/// Common header of a v4 event; its type byte and size field.
const HEADER_LEN: usize = 19;
const TYPE_OFFSET: usize = 4;
const SIZE_OFFSET: usize = 9;
/// Post-header lengths when the format description does not list them:
/// a query's, a v1 rows event's (table id, flags), a v2 rows event's
/// (plus the length of its extra data).
const QUERY_POST_HEADER: usize = 13;
const ROWS_POST_HEADER_V1: usize = 8;
const ROWS_POST_HEADER_V2: usize = 10;

/// Whether `raw` is one of MariaDB's compressed event types.
pub fn is_compressed(raw: u8) -> bool {
    (QUERY_COMPRESSED..=DELETE_ROWS_COMPRESSED).contains(&raw)
}

/// The plain event a compressed one stands for (same header but for its
/// type and size), or why it does not decompress.
pub fn decompress(event: &Event) -> Result<Event, String> {
    let raw = event.header().event_type_raw();
    let data = event.data();
    let post_header = |fallback: usize| {
        event
            .fde()
            .event_type_header_lengths()
            .get(usize::from(raw) - 1)
            .map_or(fallback, |&l| usize::from(l))
    };
    let (plain, at) = match raw {
        QUERY_COMPRESSED => (QUERY, query_text_at(data, post_header(QUERY_POST_HEADER))?),
        WRITE_ROWS_COMPRESSED_V1..WRITE_ROWS_COMPRESSED => {
            let plain = raw - WRITE_ROWS_COMPRESSED_V1 + WRITE_ROWS_V1;
            let at = row_data_at(data, post_header(ROWS_POST_HEADER_V1), plain)?;
            (plain, at)
        }
        WRITE_ROWS_COMPRESSED..=DELETE_ROWS_COMPRESSED => {
            let plain = raw - WRITE_ROWS_COMPRESSED + WRITE_ROWS_V2;
            let at = row_data_at(data, post_header(ROWS_POST_HEADER_V2), plain)?;
            (plain, at)
        }
        other => return Err(format!("event type {other} is not a compressed one")),
    };
    let mut body = data[..at].to_vec();
    body.extend(inflate(&data[at..])?);
    rebuild(event, plain, &body)
}

/// Where a query event's statement text starts: after the post-header,
/// the status variables, the schema name and its NUL.
fn query_text_at(data: &[u8], post_header: usize) -> Result<usize, String> {
    let short = || {
        format!(
            "a compressed query event of {} bytes is cut short",
            data.len()
        )
    };
    let schema_len = usize::from(*data.get(8).ok_or_else(short)?);
    let status_len = data.get(11..13).ok_or_else(short)?;
    let status_len = usize::from(u16::from_le_bytes([status_len[0], status_len[1]]));
    let at = post_header + status_len + schema_len + 1;
    if at >= data.len() {
        return Err(short());
    }
    Ok(at)
}

/// Where a rows event's row data starts: after the post-header (and a v2
/// event's extra data), the column count and the column bitmaps (two for
/// an update).
fn row_data_at(data: &[u8], post_header: usize, plain: u8) -> Result<usize, String> {
    let short = || {
        format!(
            "a compressed rows event of {} bytes is cut short",
            data.len()
        )
    };
    let mut at = ROWS_POST_HEADER_V1;
    if post_header == ROWS_POST_HEADER_V2 {
        let extra = data.get(at..at + 2).ok_or_else(short)?;
        at += usize::from(u16::from_le_bytes([extra[0], extra[1]]));
    }
    let (width, len) = packed_int(data.get(at..).ok_or_else(short)?).ok_or_else(short)?;
    let bitmap = usize::try_from(width.div_ceil(8)).map_err(|_| short())?;
    let updates = plain == WRITE_ROWS_V1 + 1 || plain == WRITE_ROWS_V2 + 1;
    at += len + bitmap * if updates { 2 } else { 1 };
    if at >= data.len() {
        return Err(short());
    }
    Ok(at)
}

/// A length-encoded integer: its value and how many bytes it took.
fn packed_int(b: &[u8]) -> Option<(u64, usize)> {
    let wide = |n: usize| {
        let bytes = b.get(1..=n)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(bytes);
        Some((u64::from_le_bytes(v), n + 1))
    };
    match *b.first()? {
        x @ 0..=250 => Some((u64::from(x), 1)),
        252 => wide(2),
        253 => wide(3),
        254 => wide(8),
        _ => None,
    }
}

/// The compressed part: its header byte, the uncompressed length, zlib.
fn inflate(part: &[u8]) -> Result<Vec<u8>, String> {
    let head = *part.first().ok_or("an empty compressed part")?;
    if head & 0x80 == 0 {
        return Err(format!(
            "compressed part header {head:#04x} lacks its flag bit"
        ));
    }
    let algorithm = (head & 0x70) >> 4;
    if algorithm != 0 {
        return Err(format!(
            "compression algorithm {algorithm} (only 0, zlib, is defined)"
        ));
    }
    let len_len = usize::from(head & 0x07);
    if !(1..=4).contains(&len_len) || part.len() <= len_len {
        return Err(format!(
            "compressed part header {head:#04x}: bad length size"
        ));
    }
    let len = part[1..=len_len]
        .iter()
        .fold(0u64, |acc, &b| acc << 8 | u64::from(b));
    let mut out = Vec::with_capacity(usize::try_from(len.min(1 << 24)).unwrap_or(0));
    // One byte more than announced is read, so a stream longer than its
    // length is caught, not cut.
    flate2::read::ZlibDecoder::new(&part[1 + len_len..])
        .take(len + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zlib: {e}"))?;
    if out.len() as u64 != len {
        return Err(format!(
            "{} bytes decompressed where the event announces {len}",
            out.len()
        ));
    }
    Ok(out)
}

/// `event`'s header with type `plain` and the size of `body`, then `body`
/// (and its checksum where the stream's events carry one), read back as
/// an event in the same format.
fn rebuild(event: &Event, plain: u8, body: &[u8]) -> Result<Event, String> {
    let footer = event.footer();
    let checksummed = footer.get_checksum_enabled()
        && !matches!(
            footer.get_checksum_alg(),
            Ok(None | Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_OFF))
        );
    let mut bytes = Vec::new();
    event
        .write(BinlogVersion::Version4, &mut bytes)
        .map_err(|e| format!("re-encode the header: {e}"))?;
    bytes.truncate(HEADER_LEN);
    if bytes.len() != HEADER_LEN {
        return Err("an event shorter than its header".into());
    }
    bytes.extend_from_slice(body);
    let size = bytes.len() + if checksummed { 4 } else { 0 };
    let size = u32::try_from(size).map_err(|_| format!("{size} bytes decompressed"))?;
    bytes[TYPE_OFFSET] = plain;
    bytes[SIZE_OFFSET..SIZE_OFFSET + 4].copy_from_slice(&size.to_le_bytes());
    if checksummed {
        let sum = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
    }
    Event::read(event.fde(), &bytes[..]).map_err(|e| format!("read the decompressed event: {e}"))
}
