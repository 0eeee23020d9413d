//! Whether a captured table's replica identity carries its event key.
//!
//! An update or delete carries of the old row only what the table's
//! `REPLICA IDENTITY` names: the primary key (`DEFAULT`), a chosen unique
//! index (`USING INDEX`), every column (`FULL`) or nothing. Events are keyed
//! by the primary key or `message.key.columns`; when the identity does not
//! hold every key column, a delete reaches Kafka without its key and a key
//! change leaves the old row behind in every target. Start-up checks every
//! captured table (for a partitioned table: the root and each leaf, whose
//! identity is what the WAL holds), and the stream checks each Relation
//! message again, since DDL can change the identity while capture runs.

use std::collections::HashMap;

use tokio_postgres::Client;

use crate::error::CaptureError;
use crate::sources::postgres::control::CapturedTable;
use crate::sources::postgres::pgoutput::{Relation, ReplicaIdentity};

/// What a relation's identity lacks, in words (`None`: it carries the key).
///
/// `identity_columns` are the columns the identity holds: the primary key
/// under `DEFAULT`, the index's columns under `USING INDEX` (ignored for
/// `FULL` and `NOTHING`). A table without key columns has nothing to carry.
pub fn lacks(
    identity: ReplicaIdentity,
    identity_columns: &[String],
    key_columns: &[String],
) -> Option<String> {
    if key_columns.is_empty() {
        return None;
    }
    let list = |cols: &[String]| cols.join(", ");
    match identity {
        ReplicaIdentity::Full => None,
        ReplicaIdentity::Nothing => Some("REPLICA IDENTITY NOTHING".into()),
        ReplicaIdentity::Default if identity_columns.is_empty() => {
            Some("REPLICA IDENTITY DEFAULT without a primary key".into())
        }
        ReplicaIdentity::Default | ReplicaIdentity::Index
            if key_columns.iter().all(|k| identity_columns.contains(k)) =>
        {
            None
        }
        ReplicaIdentity::Default => Some(format!(
            "REPLICA IDENTITY DEFAULT on primary key ({}) while its events are keyed by ({})",
            list(identity_columns),
            list(key_columns)
        )),
        ReplicaIdentity::Index => Some(format!(
            "REPLICA IDENTITY USING INDEX on ({}) while its events are keyed by ({})",
            list(identity_columns),
            list(key_columns)
        )),
    }
}

/// The columns a Relation message flags as its replica identity.
pub fn flagged_columns(rel: &Relation) -> Vec<String> {
    rel.columns
        .iter()
        .filter(|c| c.is_key)
        .map(|c| c.name.clone())
        .collect()
}

/// The key of a table the catalog no longer has (dropped, or renamed with
/// its key columns), from the Relation message alone: under the default
/// identity its flagged columns are the primary key, under `USING INDEX` a
/// unique index's columns. Under `FULL` every column is flagged and under
/// `NOTHING` none, which says nothing of a key: empty (events without a key).
pub fn key_from_relation(rel: &Relation) -> Vec<String> {
    match rel.replica_identity {
        ReplicaIdentity::Default | ReplicaIdentity::Index => flagged_columns(rel),
        ReplicaIdentity::Full | ReplicaIdentity::Nothing => Vec::new(),
    }
}

/// The message for a table whose identity `lacks` its key: what goes wrong
/// and the fix. `relation` is the table itself or, for a partitioned table,
/// the partition whose identity is wrong (the one to alter).
pub fn explain(table: &str, relation: &str, lacks: &str, key_columns: &[String]) -> String {
    let what = if relation == table {
        format!("table {table} has {lacks}")
    } else {
        format!("partition {relation} of captured table {table} has {lacks}")
    };
    format!(
        "{what}, so its updates and deletes do not carry the event key ({key}): deletes would reach Kafka without their key and key changes would leave the old row in every target. Fix: ALTER TABLE {alter} REPLICA IDENTITY FULL; or give it a primary key on ({key}) with REPLICA IDENTITY DEFAULT (or REPLICA IDENTITY USING INDEX on a unique index of those columns)",
        key = key_columns.join(", "),
        alter = quote_qualified(relation),
    )
}

/// Why a table whose identity lacks its key is quarantined: [`explain`]'s
/// message and the setting that captures it all the same.
pub fn quarantine_reason(explained: &str) -> String {
    format!("{explained}. Or set replica.identity.check = \"warn\" to capture it as the identity allows")
}

/// Each table (`schema.table`) whose identity, or a partition's, lacks its
/// key, with [`explain`]'s message; a table may appear once per partition.
pub async fn problems(
    client: &Client,
    tables: &[&CapturedTable],
) -> Result<Vec<(String, String)>, CaptureError> {
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    let schemas: Vec<&str> = tables.iter().map(|t| t.schema.as_str()).collect();
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    let keys: HashMap<String, &[String]> = tables
        .iter()
        .map(|t| (t.qualified(), t.key_columns.as_slice()))
        .collect();
    // The table and, when partitioned, every leaf: a leaf's identity decides
    // what its WAL records hold; the root's is what pgoutput describes.
    let rows = client
        .query(
            "SELECT t.s || '.' || t.n, rn.nspname::text || '.' || r.relname::text,
                    r.relreplident::text,
                    COALESCE((SELECT array_agg(a.attname::text ORDER BY a.attnum)
                      FROM pg_index i
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[])
                      WHERE i.indrelid = r.oid
                        AND CASE r.relreplident WHEN 'd' THEN i.indisprimary
                                                WHEN 'i' THEN i.indisreplident
                                                ELSE false END), '{}')
             FROM unnest($1::text[], $2::text[]) AS t(s, n)
             JOIN pg_namespace tn ON tn.nspname = t.s
             JOIN pg_class tc ON tc.relnamespace = tn.oid AND tc.relname = t.n
             CROSS JOIN LATERAL (SELECT tc.oid AS relid
                                 UNION SELECT relid FROM pg_partition_tree(tc.oid) WHERE isleaf) x
             JOIN pg_class r ON r.oid = x.relid
             JOIN pg_namespace rn ON rn.oid = r.relnamespace
             ORDER BY 1, 2",
            &[&schemas, &names],
        )
        .await
        .map_err(CaptureError::pg("read replica identities"))?;
    let mut problems = Vec::new();
    for row in rows {
        let table: String = row.get(0);
        let relation: String = row.get(1);
        let identity: String = row.get(2);
        let identity_columns: Vec<String> = row.get(3);
        let Some(identity) = identity.bytes().next().and_then(ReplicaIdentity::from_byte) else {
            continue;
        };
        let key = keys.get(&table).copied().unwrap_or_default();
        if let Some(lacks) = lacks(identity, &identity_columns, key) {
            let why = explain(&table, &relation, &lacks, key);
            problems.push((table, why));
        }
    }
    Ok(problems)
}

/// `schema.table` as SQL, each part quoted only when it must be.
fn quote_qualified(qualified: &str) -> String {
    let quote = |s: &str| {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
        {
            s.to_string()
        } else {
            format!("\"{}\"", s.replace('"', "\"\""))
        }
    };
    match qualified.split_once('.') {
        Some((schema, name)) => format!("{}.{}", quote(schema), quote(name)),
        None => quote(qualified),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    /// A dropped table's key comes from its Relation's flags only where
    /// they name a key: the primary key (default) or a unique index.
    #[test]
    fn a_gone_table_is_keyed_by_its_flagged_columns_where_they_are_a_key() {
        let rel = |identity, flags: &[bool]| Relation {
            id: 1,
            namespace: "public".into(),
            name: "staging".into(),
            replica_identity: identity,
            columns: ["tenant", "id", "v"]
                .iter()
                .zip(flags)
                .map(
                    |(name, &is_key)| crate::sources::postgres::pgoutput::Column {
                        is_key,
                        name: (*name).into(),
                        type_oid: 23,
                        type_modifier: -1,
                    },
                )
                .collect(),
        };
        use ReplicaIdentity::*;
        let two = [true, true, false];
        assert_eq!(
            key_from_relation(&rel(Default, &two)),
            cols(&["tenant", "id"])
        );
        assert_eq!(
            key_from_relation(&rel(Index, &[false, true, false])),
            cols(&["id"])
        );
        assert!(key_from_relation(&rel(Full, &[true; 3])).is_empty());
        assert!(key_from_relation(&rel(Nothing, &[false; 3])).is_empty());
        assert!(
            key_from_relation(&rel(Default, &[false; 3])).is_empty(),
            "no primary key"
        );
    }

    #[test]
    fn identity_must_hold_every_key_column() {
        let id = cols(&["id"]);
        use ReplicaIdentity::*;
        assert_eq!(lacks(Full, &[], &id), None);
        assert_eq!(lacks(Default, &id, &id), None);
        assert_eq!(lacks(Index, &id, &id), None);
        // A composite identity holding the key (and more) carries it.
        assert_eq!(lacks(Index, &cols(&["id", "region"]), &id), None);
        assert_eq!(
            lacks(Nothing, &[], &id).as_deref(),
            Some("REPLICA IDENTITY NOTHING")
        );
        assert!(lacks(Default, &[], &id)
            .unwrap()
            .contains("without a primary key"));
        let other = lacks(Index, &cols(&["email"]), &id).unwrap();
        assert!(
            other.contains("USING INDEX on (email)") && other.contains("(id)"),
            "{other}"
        );
        // message.key.columns other than the primary key.
        let overridden = lacks(Default, &id, &cols(&["tenant", "id"])).unwrap();
        assert!(overridden.contains("primary key (id)"), "{overridden}");
        // Nothing to carry for a table without key columns.
        assert_eq!(lacks(Nothing, &[], &[]), None);
    }

    #[test]
    fn explanation_names_table_and_fix() {
        let m = explain(
            "public.orders",
            "public.orders",
            "REPLICA IDENTITY NOTHING",
            &cols(&["id"]),
        );
        assert!(
            m.starts_with("table public.orders has REPLICA IDENTITY NOTHING"),
            "{m}"
        );
        assert!(
            m.contains("ALTER TABLE public.orders REPLICA IDENTITY FULL"),
            "{m}"
        );
        let m = explain(
            "public.orders",
            "public.Orders_EU",
            "REPLICA IDENTITY NOTHING",
            &cols(&["id"]),
        );
        assert!(
            m.contains("partition public.Orders_EU of captured table public.orders"),
            "{m}"
        );
        assert!(
            m.contains("ALTER TABLE public.\"Orders_EU\" REPLICA IDENTITY FULL"),
            "{m}"
        );
    }
}
