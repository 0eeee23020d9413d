//! `decode(encode(m)) == m` for arbitrary messages, and decoding arbitrary
//! bytes never panics.

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

/// Names as PostgreSQL can send them: any UTF-8 without NUL.
fn name() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,12}"
}

fn bytes() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn tuple_value() -> impl Strategy<Value = TupleValue> {
    prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::Unchanged),
        bytes().prop_map(TupleValue::Text),
        bytes().prop_map(TupleValue::Binary),
    ]
}

fn tuple() -> impl Strategy<Value = TupleData> {
    proptest::collection::vec(tuple_value(), 0..8).prop_map(TupleData)
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn replica_identity() -> impl Strategy<Value = ReplicaIdentity> {
    prop_oneof![
        Just(ReplicaIdentity::Default),
        Just(ReplicaIdentity::Nothing),
        Just(ReplicaIdentity::Full),
        Just(ReplicaIdentity::Index),
    ]
}

fn column() -> impl Strategy<Value = Column> {
    (any::<bool>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(is_key, name, type_oid, type_modifier)| Column {
            is_key,
            name,
            type_oid,
            type_modifier,
        },
    )
}

fn message() -> impl Strategy<Value = LogicalMessage> {
    prop_oneof![
        (any::<u64>(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_ts_us, xid)| {
            LogicalMessage::Begin(Begin {
                final_lsn,
                commit_ts_us,
                xid,
            })
        }),
        (any::<u8>(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_ts_us)| LogicalMessage::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_ts_us,
            })
        ),
        (any::<u64>(), name())
            .prop_map(|(commit_lsn, name)| LogicalMessage::Origin { commit_lsn, name }),
        (
            any::<u32>(),
            name(),
            name(),
            replica_identity(),
            proptest::collection::vec(column(), 0..6)
        )
            .prop_map(|(id, namespace, name, replica_identity, columns)| {
                LogicalMessage::Relation(Relation {
                    id,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (any::<u32>(), name(), name()).prop_map(|(oid, namespace, name)| {
            LogicalMessage::Type(TypeMessage {
                oid,
                namespace,
                name,
            })
        }),
        (any::<u32>(), tuple())
            .prop_map(|(relation_id, new)| LogicalMessage::Insert { relation_id, new }),
        (any::<u32>(), proptest::option::of(old_tuple()), tuple()).prop_map(
            |(relation_id, old, new)| LogicalMessage::Update {
                relation_id,
                old,
                new,
            }
        ),
        (any::<u32>(), old_tuple())
            .prop_map(|(relation_id, old)| LogicalMessage::Delete { relation_id, old }),
        (any::<u8>(), proptest::collection::vec(any::<u32>(), 0..6)).prop_map(
            |(options, relation_ids)| LogicalMessage::Truncate {
                options,
                relation_ids,
            }
        ),
        (any::<bool>(), any::<u64>(), name(), bytes()).prop_map(
            |(transactional, lsn, prefix, content)| LogicalMessage::Message {
                transactional,
                lsn,
                prefix,
                content,
            }
        ),
    ]
}

proptest! {
    #[test]
    fn round_trip(m in message()) {
        let bytes = encode(&m);
        prop_assert_eq!(decode(Bytes::from(bytes)), Ok(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode(Bytes::from(raw));
    }

    #[test]
    fn truncated_encodings_are_errors(m in message(), cut in any::<prop::sample::Index>()) {
        let bytes = encode(&m);
        let cut = cut.index(bytes.len());
        prop_assert!(decode(Bytes::copy_from_slice(&bytes[..cut])).is_err());
    }
}
