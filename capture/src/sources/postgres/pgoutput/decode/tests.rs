//! Hand-written byte fixtures, laid out field by field as the PostgreSQL
//! 15 documentation describes each message.

use super::*;

fn d(bytes: &[u8]) -> Result<LogicalMessage, DecodeError> {
    decode_slice(bytes)
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

#[test]
fn begin() {
    let bytes = [
        b'B', //
        0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x30, // final LSN 0/16B5A30
        0, 0x02, 0xC8, 0x4E, 0x9E, 0x23, 0x3A, 0x10, // commit ts
        0, 0, 0x02, 0xF2, // xid 754
    ];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Begin(Begin {
            final_lsn: 0x016B_5A30,
            commit_ts_us: 0x0002_C84E_9E23_3A10,
            xid: 754,
        })
    );
}

#[test]
fn commit() {
    let bytes = [
        b'C', 0, // flags
        0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x30, // commit LSN
        0, 0, 0, 0, 0x01, 0x6B, 0x5A, 0x60, // end LSN
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE, // ts -2 (before 2000)
    ];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: 0x016B_5A30,
            end_lsn: 0x016B_5A60,
            commit_ts_us: -2,
        })
    );
}

#[test]
fn origin() {
    let mut bytes = vec![b'O', 0, 0, 0, 1, 0, 0, 0, 0x10];
    bytes.extend_from_slice(b"node_a\0");
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Origin {
            commit_lsn: 0x1_0000_0010,
            name: "node_a".into(),
        }
    );
}

#[test]
fn message_transactional_and_not() {
    let mut bytes = vec![b'M', 1, 0, 0, 0, 0, 0, 0, 0, 0x20];
    bytes.extend_from_slice(b"heartbeat\0");
    bytes.extend_from_slice(&[0, 0, 0, 3, b'a', 0, b'z']);
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Message {
            transactional: true,
            lsn: 0x20,
            prefix: "heartbeat".into(),
            content: Bytes::from_static(b"a\0z"),
        }
    );
    bytes[1] = 0;
    assert!(matches!(
        d(&bytes).unwrap(),
        LogicalMessage::Message {
            transactional: false,
            ..
        }
    ));
}

#[test]
fn relation() {
    let mut bytes = vec![b'R', 0, 0, 0x40, 0x00]; // oid 16384
    bytes.extend_from_slice(b"public\0orders\0");
    bytes.push(b'd');
    bytes.extend_from_slice(&[0, 2]); // 2 columns
    bytes.push(1); // key
    bytes.extend_from_slice(b"id\0");
    bytes.extend_from_slice(&[0, 0, 0, 20]); // int8
    bytes.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]); // typmod -1
    bytes.push(0);
    bytes.extend_from_slice(b"total\0");
    bytes.extend_from_slice(&[0, 0, 0x06, 0xA4]); // numeric 1700
    bytes.extend_from_slice(&[0, 0x0C, 0, 0x06]); // numeric(12,2): (12<<16|2)+4
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Relation(Relation {
            id: 16384,
            namespace: "public".into(),
            name: "orders".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                Column {
                    is_key: true,
                    name: "id".into(),
                    type_oid: 20,
                    type_modifier: -1,
                },
                Column {
                    is_key: false,
                    name: "total".into(),
                    type_oid: 1700,
                    type_modifier: (12 << 16 | 2) + 4,
                },
            ],
        })
    );
}

#[test]
fn relation_replica_identities() {
    for (byte, want) in [
        (b'd', ReplicaIdentity::Default),
        (b'n', ReplicaIdentity::Nothing),
        (b'f', ReplicaIdentity::Full),
        (b'i', ReplicaIdentity::Index),
    ] {
        let mut bytes = vec![b'R', 0, 0, 0, 7];
        bytes.extend_from_slice(b"\0t\0");
        bytes.extend_from_slice(&[byte, 0, 0]);
        match d(&bytes).unwrap() {
            LogicalMessage::Relation(r) => {
                assert_eq!(r.replica_identity, want);
                assert_eq!(r.namespace, "", "pg_catalog is sent as empty");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn type_message() {
    let mut bytes = vec![b'Y', 0, 0, 0x40, 0x10];
    bytes.extend_from_slice(b"public\0mood\0");
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Type(TypeMessage {
            oid: 16400,
            namespace: "public".into(),
            name: "mood".into(),
        })
    );
}

#[test]
fn insert_with_every_column_kind() {
    let mut bytes = vec![b'I', 0, 0, 0x40, 0, b'N', 0, 4];
    bytes.extend_from_slice(&[b't', 0, 0, 0, 2, b'4', b'2']);
    bytes.push(b'n');
    bytes.push(b'u');
    bytes.extend_from_slice(&[b'b', 0, 0, 0, 1, 0xFF]);
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Insert {
            relation_id: 16384,
            new: TupleData(vec![
                text("42"),
                TupleValue::Null,
                TupleValue::Unchanged,
                TupleValue::Binary(Bytes::from_static(&[0xFF])),
            ]),
        }
    );
}

#[test]
fn insert_values_are_slices_of_the_input() {
    let bytes = Bytes::from_static(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0, 0, 0, 1, b'x']);
    let LogicalMessage::Insert { new, .. } = decode(bytes.clone()).unwrap() else {
        panic!("not an insert");
    };
    let TupleValue::Text(v) = &new.0[0] else {
        panic!("not text");
    };
    assert_eq!(v.as_ptr(), bytes[13..].as_ptr());
}

#[test]
fn update_without_old_tuple() {
    let bytes = [b'U', 0, 0, 0, 9, b'N', 0, 1, b't', 0, 0, 0, 1, b'a'];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Update {
            relation_id: 9,
            old: None,
            new: TupleData(vec![text("a")]),
        }
    );
}

#[test]
fn update_with_key_and_with_full_old_tuple() {
    for (marker, wrap) in [
        (b'K', OldTuple::Key as fn(TupleData) -> OldTuple),
        (b'O', OldTuple::Full),
    ] {
        let bytes = [
            b'U', 0, 0, 0, 9, marker, 0, 2, b't', 0, 0, 0, 1, b'1', b'n', b'N', 0, 2, b't', 0, 0,
            0, 1, b'2', b'u',
        ];
        assert_eq!(
            d(&bytes).unwrap(),
            LogicalMessage::Update {
                relation_id: 9,
                old: Some(wrap(TupleData(vec![text("1"), TupleValue::Null]))),
                new: TupleData(vec![text("2"), TupleValue::Unchanged]),
            }
        );
    }
}

#[test]
fn delete_key_and_full() {
    let bytes = [b'D', 0, 0, 0, 9, b'K', 0, 1, b't', 0, 0, 0, 1, b'7'];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Delete {
            relation_id: 9,
            old: OldTuple::Key(TupleData(vec![text("7")])),
        }
    );
    let bytes = [b'D', 0, 0, 0, 9, b'O', 0, 1, b'n'];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Delete {
            relation_id: 9,
            old: OldTuple::Full(TupleData(vec![TupleValue::Null])),
        }
    );
}

#[test]
fn truncate() {
    let bytes = [
        b'T', 0, 0, 0, 2, 3, // 2 relations, cascade | restart identity
        0, 0, 0x40, 0, 0, 0, 0x40, 1,
    ];
    assert_eq!(
        d(&bytes).unwrap(),
        LogicalMessage::Truncate {
            options: 3,
            relation_ids: vec![16384, 16385],
        }
    );
}

#[test]
fn empty_and_unknown_tag() {
    assert_eq!(d(&[]), Err(DecodeError::Empty));
    assert_eq!(d(&[b'Z', 0]), Err(DecodeError::UnknownTag { tag: b'Z' }));
    // Streaming (protocol 2) messages are not part of protocol 1.
    assert_eq!(d(b"S"), Err(DecodeError::UnknownTag { tag: b'S' }));
}

#[test]
fn every_truncation_of_a_valid_message_is_an_error() {
    let mut full = vec![b'U', 0, 0, 0, 9, b'O', 0, 2, b't', 0, 0, 0, 3];
    full.extend_from_slice(b"abc");
    full.extend_from_slice(&[b'n', b'N', 0, 1, b'u']);
    assert!(d(&full).is_ok());
    for cut in 1..full.len() {
        let err = d(&full[..cut]).unwrap_err();
        assert!(
            matches!(err, DecodeError::Truncated { .. }),
            "cut at {cut}: {err:?}"
        );
    }
}

#[test]
fn truncated_error_names_the_field() {
    let err = d(&[b'B', 0, 0, 0]).unwrap_err();
    assert_eq!(
        err,
        DecodeError::Truncated {
            message: "Begin",
            field: "final_lsn",
            offset: 1,
            needed: 8,
            available: 3,
        }
    );
    assert!(err.to_string().contains("Begin"));
}

#[test]
fn bad_column_kind() {
    let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 2, b'n', b'x'];
    assert_eq!(
        d(&bytes),
        Err(DecodeError::BadColumnKind {
            message: "Insert",
            column: 1,
            byte: b'x',
        })
    );
}

#[test]
fn bad_tuple_markers() {
    assert!(matches!(
        d(&[b'I', 0, 0, 0, 1, b'K', 0, 0]),
        Err(DecodeError::BadTupleMarker { byte: b'K', .. })
    ));
    assert!(matches!(
        d(&[b'U', 0, 0, 0, 1, b'X', 0, 0]),
        Err(DecodeError::BadTupleMarker { byte: b'X', .. })
    ));
    // Old tuple must be followed by 'N'.
    assert!(matches!(
        d(&[b'U', 0, 0, 0, 1, b'K', 0, 0, b'K', 0, 0]),
        Err(DecodeError::BadTupleMarker { byte: b'K', .. })
    ));
    assert!(matches!(
        d(&[b'D', 0, 0, 0, 1, b'N', 0, 0]),
        Err(DecodeError::BadTupleMarker { byte: b'N', .. })
    ));
}

#[test]
fn invalid_utf8_and_unterminated_names() {
    let mut bytes = vec![b'Y', 0, 0, 0, 1];
    bytes.extend_from_slice(&[b'p', 0xC3, 0x28, 0]);
    bytes.extend_from_slice(b"t\0");
    assert_eq!(
        d(&bytes),
        Err(DecodeError::InvalidUtf8 {
            message: "Type",
            field: "namespace",
        })
    );
    let bytes = [b'Y', 0, 0, 0, 1, b'p', 0, b't'];
    assert!(matches!(
        d(&bytes),
        Err(DecodeError::UnterminatedString { field: "name", .. })
    ));
}

#[test]
fn unknown_replica_identity() {
    let mut bytes = vec![b'R', 0, 0, 0, 7];
    bytes.extend_from_slice(b"s\0t\0x\0\0");
    assert_eq!(
        d(&bytes),
        Err(DecodeError::UnknownReplicaIdentity {
            relation_id: 7,
            byte: b'x',
        })
    );
}

#[test]
fn negative_lengths_and_counts() {
    let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xFF, 0xFF, 0xFF, 0xFF];
    assert!(matches!(
        d(&bytes),
        Err(DecodeError::NegativeLength { value: -1, .. })
    ));
    let bytes = [b'I', 0, 0, 0, 1, b'N', 0x80, 0];
    assert!(matches!(d(&bytes), Err(DecodeError::NegativeLength { .. })));
    let bytes = [b'T', 0xFF, 0xFF, 0xFF, 0xFE, 0];
    assert!(matches!(
        d(&bytes),
        Err(DecodeError::NegativeLength { value: -2, .. })
    ));
}

#[test]
fn huge_counts_fail_without_allocating() {
    // Claims i32::MAX relations with none present.
    let bytes = [b'T', 0x7F, 0xFF, 0xFF, 0xFF, 0];
    assert!(matches!(d(&bytes), Err(DecodeError::Truncated { .. })));
    let bytes = [b'I', 0, 0, 0, 1, b'N', 0x7F, 0xFF];
    assert!(matches!(d(&bytes), Err(DecodeError::Truncated { .. })));
}

#[test]
fn trailing_bytes_are_rejected() {
    let bytes = [b'I', 0, 0, 0, 1, b'N', 0, 1, b'n', 0];
    assert_eq!(
        d(&bytes),
        Err(DecodeError::TrailingBytes {
            message: "Insert",
            extra: 1,
        })
    );
}
