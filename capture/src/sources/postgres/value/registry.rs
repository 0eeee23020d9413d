//! Type knowledge: which OID is which PostgreSQL type.
//!
//! Built-in types have fixed OIDs, so [`TypeRegistry::builtin`] knows them
//! without asking the server. User types (enums, domains, arrays of them)
//! get OIDs at `CREATE TYPE` time and are loaded from `pg_type`. pgoutput's
//! Type message names a user type but does not say what kind it is, so
//! [`TypeRegistry::observe`] can only record the name and report that the
//! caller should reload.

use std::collections::HashMap;

use crate::sources::postgres::pgoutput::TypeMessage;

use super::kind::{builtin_kind, ValueKind, BOX_OID};
use super::IntervalHandlingMode;

/// One entry of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgType {
    /// `pg_type.typname`, schema-qualified for user types (`public.mood`).
    pub name: String,
    pub kind: PgTypeKind,
}

/// What we need to know about a type to map its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgTypeKind {
    /// A built-in type, mapped by its well-known OID.
    Builtin,
    /// An enum; its labels in sort order feed the schema's `allowed` list.
    Enum {
        labels: Vec<String>,
    },
    Array {
        element_oid: u32,
    },
    /// Values are mapped as the base type's.
    Domain {
        base_oid: u32,
    },
    /// Anything else (composite, range, extension types): kept as text.
    Other,
}

/// OID -> [`PgType`].
#[derive(Debug, Clone, Default)]
pub struct TypeRegistry {
    types: HashMap<u32, PgType>,
    /// `interval.handling.mode`: how `interval` values (and domains and
    /// arrays over it) are written.
    interval_mode: IntervalHandlingMode,
}

/// Domains over domains are legal; cycles are not, but a corrupt catalog
/// read must not hang us.
const MAX_DOMAIN_DEPTH: usize = 16;

/// Built-in scalar types with their array types: (oid, name, array oid).
const BUILTINS: &[(u32, &str, u32)] = &[
    (16, "bool", 1000),
    (17, "bytea", 1001),
    (18, "char", 1002),
    (19, "name", 1003),
    (20, "int8", 1016),
    (21, "int2", 1005),
    (23, "int4", 1007),
    (24, "regproc", 1008),
    (25, "text", 1009),
    (26, "oid", 1028),
    (27, "tid", 1010),
    (28, "xid", 1011),
    (29, "cid", 1012),
    (114, "json", 199),
    (142, "xml", 143),
    (600, "point", 1017),
    (601, "lseg", 1018),
    (602, "path", 1019),
    (603, "box", 1020),
    (604, "polygon", 1027),
    (628, "line", 629),
    (650, "cidr", 651),
    (700, "float4", 1021),
    (701, "float8", 1022),
    (718, "circle", 719),
    (774, "macaddr8", 775),
    (790, "money", 791),
    (829, "macaddr", 1040),
    (869, "inet", 1041),
    (1042, "bpchar", 1014),
    (1043, "varchar", 1015),
    (1082, "date", 1182),
    (1083, "time", 1183),
    (1114, "timestamp", 1115),
    (1184, "timestamptz", 1185),
    (1186, "interval", 1187),
    (1266, "timetz", 1270),
    (1560, "bit", 1561),
    (1562, "varbit", 1563),
    (1700, "numeric", 1231),
    (2205, "regclass", 2210),
    (2206, "regtype", 2211),
    (2950, "uuid", 2951),
    (3220, "pg_lsn", 3221),
    (3614, "tsvector", 3643),
    (3615, "tsquery", 3645),
    (3802, "jsonb", 3807),
    (4072, "jsonpath", 4073),
    (3904, "int4range", 3905),
    (3906, "numrange", 3907),
    (3908, "tsrange", 3909),
    (3910, "tstzrange", 3911),
    (3912, "daterange", 3913),
    (3926, "int8range", 3927),
];

impl TypeRegistry {
    /// The built-in types and their arrays.
    pub fn builtin() -> Self {
        let mut types = HashMap::with_capacity(BUILTINS.len() * 2);
        for &(oid, name, array_oid) in BUILTINS {
            types.insert(
                oid,
                PgType {
                    name: name.to_owned(),
                    kind: PgTypeKind::Builtin,
                },
            );
            types.insert(
                array_oid,
                PgType {
                    name: format!("_{name}"),
                    kind: PgTypeKind::Array { element_oid: oid },
                },
            );
        }
        Self {
            types,
            interval_mode: IntervalHandlingMode::default(),
        }
    }

    /// The same registry writing intervals per `mode`.
    pub fn with_interval_mode(mut self, mode: IntervalHandlingMode) -> Self {
        self.interval_mode = mode;
        self
    }

    /// Adds or replaces a type.
    pub fn insert(&mut self, oid: u32, ty: PgType) {
        self.types.insert(oid, ty);
    }

    pub fn get(&self, oid: u32) -> Option<&PgType> {
        self.types.get(&oid)
    }

    /// Records a Type message. Returns true when the OID was unknown: the
    /// message does not say whether it is an enum, a domain or an array, so
    /// until [`TypeRegistry::load_user_types`] runs again its values are
    /// kept as text (the same JSON for an enum, but not for an array or a
    /// domain over a number).
    pub fn observe(&mut self, msg: &TypeMessage) -> bool {
        let name = if msg.namespace.is_empty() {
            msg.name.clone()
        } else {
            format!("{}.{}", msg.namespace, msg.name)
        };
        match self.types.get_mut(&msg.oid) {
            Some(ty) => {
                ty.name = name;
                false
            }
            None => {
                self.types.insert(
                    msg.oid,
                    PgType {
                        name,
                        kind: PgTypeKind::Other,
                    },
                );
                true
            }
        }
    }

    /// [`Self::load_user_types`] for a Type message of the stream's
    /// transaction `xid`: once that transaction is visible
    /// ([`crate::sources::postgres::control::wait_visible`]). A type it created, read before,
    /// would stay [`PgTypeKind::Other`] (a domain over a number published as
    /// text) until a restart: [`Self::observe`] knows its OID from then on.
    pub async fn load_user_types_of(
        &mut self,
        client: &tokio_postgres::Client,
        xid: Option<u32>,
    ) -> Result<(), crate::error::CaptureError> {
        crate::sources::postgres::control::wait_visible(client, xid).await?;
        self.load_user_types(client)
            .await
            .map_err(crate::error::CaptureError::pg("load user types"))
    }

    /// Reads user-defined enums, domains and array types from `pg_type`
    /// (everything with an OID at or above `FirstNormalObjectId`, 16384),
    /// adding them to the built-ins. Safe to call again after a Type
    /// message announced a new type.
    pub async fn load_user_types(
        &mut self,
        client: &tokio_postgres::Client,
    ) -> Result<(), tokio_postgres::Error> {
        const QUERY: &str = "\
            SELECT t.oid, n.nspname::text, t.typname::text, t.typtype::text, \
                   t.typelem, t.typbasetype, t.typcategory::text, \
                   CASE WHEN t.typtype = 'e' THEN \
                     ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e \
                           WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) \
                   END \
            FROM pg_catalog.pg_type t \
            JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace \
            WHERE t.oid >= 16384";
        for row in client.query(QUERY, &[]).await? {
            let oid: u32 = row.try_get(0)?;
            let namespace: String = row.try_get(1)?;
            let name: String = row.try_get(2)?;
            let typtype: String = row.try_get(3)?;
            let elem: u32 = row.try_get(4)?;
            let base: u32 = row.try_get(5)?;
            let category: String = row.try_get(6)?;
            let labels: Option<Vec<String>> = row.try_get(7)?;
            let kind = match (typtype.as_str(), category.as_str()) {
                ("e", _) => PgTypeKind::Enum {
                    labels: labels.unwrap_or_default(),
                },
                ("d", _) => PgTypeKind::Domain { base_oid: base },
                (_, "A") if elem != 0 => PgTypeKind::Array { element_oid: elem },
                _ => PgTypeKind::Other,
            };
            self.insert(
                oid,
                PgType {
                    name: format!("{namespace}.{name}"),
                    kind,
                },
            );
        }
        Ok(())
    }

    /// How values of `oid` map to JSON, with domains resolved to their base
    /// and arrays to their element. Unknown OIDs map as text.
    pub fn value_kind(&self, oid: u32) -> ValueKind {
        self.resolve(oid, 0)
    }

    fn resolve(&self, oid: u32, depth: usize) -> ValueKind {
        if depth > MAX_DOMAIN_DEPTH {
            return ValueKind::Text;
        }
        match self.types.get(&oid).map(|t| &t.kind) {
            Some(PgTypeKind::Builtin) | None => match builtin_kind(oid) {
                Some(ValueKind::MicroDuration)
                    if self.interval_mode == IntervalHandlingMode::String =>
                {
                    ValueKind::Interval
                }
                kind => kind.unwrap_or(ValueKind::Text),
            },
            Some(PgTypeKind::Enum { labels }) => ValueKind::Enum {
                labels: labels.clone(),
            },
            Some(PgTypeKind::Domain { base_oid }) => self.resolve(*base_oid, depth + 1),
            Some(PgTypeKind::Array { element_oid }) => {
                let element = self.resolve(*element_oid, depth + 1);
                let delimiter = if self.base_of(*element_oid, depth + 1) == BOX_OID {
                    b';'
                } else {
                    b','
                };
                ValueKind::Array {
                    element: Box::new(element),
                    delimiter,
                }
            }
            Some(PgTypeKind::Other) => ValueKind::Text,
        }
    }

    /// The OID under any domains (`oid` itself when it is no domain).
    pub fn base_oid(&self, oid: u32) -> u32 {
        self.base_of(oid, 0)
    }

    /// The OID under any domains, for the array delimiter choice.
    fn base_of(&self, oid: u32, depth: usize) -> u32 {
        match self.types.get(&oid).map(|t| &t.kind) {
            Some(PgTypeKind::Domain { base_oid }) if depth <= MAX_DOMAIN_DEPTH => {
                self.base_of(*base_oid, depth + 1)
            }
            _ => oid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_and_their_arrays() {
        let reg = TypeRegistry::builtin();
        assert_eq!(reg.value_kind(23), ValueKind::Int32);
        assert_eq!(reg.get(1007).unwrap().name, "_int4");
        assert_eq!(
            reg.value_kind(1007),
            ValueKind::Array {
                element: Box::new(ValueKind::Int32),
                delimiter: b',',
            }
        );
        assert_eq!(
            reg.value_kind(1020),
            ValueKind::Array {
                element: Box::new(ValueKind::Text),
                delimiter: b';',
            }
        );
        assert_eq!(reg.value_kind(999_999), ValueKind::Text);
    }

    #[test]
    fn user_types() {
        let mut reg = TypeRegistry::builtin();
        reg.insert(
            16_400,
            PgType {
                name: "public.mood".into(),
                kind: PgTypeKind::Enum {
                    labels: vec!["sad".into(), "ok".into()],
                },
            },
        );
        reg.insert(
            16_401,
            PgType {
                name: "public._mood".into(),
                kind: PgTypeKind::Array {
                    element_oid: 16_400,
                },
            },
        );
        reg.insert(
            16_402,
            PgType {
                name: "public.price".into(),
                kind: PgTypeKind::Domain { base_oid: 1700 },
            },
        );
        reg.insert(
            16_403,
            PgType {
                name: "public.positive_price".into(),
                kind: PgTypeKind::Domain { base_oid: 16_402 },
            },
        );
        let mood = ValueKind::Enum {
            labels: vec!["sad".into(), "ok".into()],
        };
        assert_eq!(reg.value_kind(16_400), mood);
        assert_eq!(
            reg.value_kind(16_401),
            ValueKind::Array {
                element: Box::new(mood),
                delimiter: b',',
            }
        );
        assert_eq!(reg.value_kind(16_403), ValueKind::Decimal);
    }

    #[test]
    fn domain_cycles_terminate() {
        let mut reg = TypeRegistry::builtin();
        for (oid, base) in [(20_000, 20_001), (20_001, 20_000)] {
            reg.insert(
                oid,
                PgType {
                    name: "loop".into(),
                    kind: PgTypeKind::Domain { base_oid: base },
                },
            );
        }
        assert_eq!(reg.value_kind(20_000), ValueKind::Text);
    }

    #[test]
    fn observe_records_unknown_types_only() {
        let mut reg = TypeRegistry::builtin();
        let msg = TypeMessage {
            oid: 16_500,
            namespace: "public".into(),
            name: "mood".into(),
        };
        assert!(reg.observe(&msg));
        assert!(!reg.observe(&msg));
        assert_eq!(reg.get(16_500).unwrap().name, "public.mood");
        assert_eq!(reg.value_kind(16_500), ValueKind::Text);
        // A known kind is kept, only the name is refreshed.
        reg.insert(
            16_500,
            PgType {
                name: "x".into(),
                kind: PgTypeKind::Enum { labels: vec![] },
            },
        );
        assert!(!reg.observe(&msg));
        assert_eq!(
            reg.get(16_500).unwrap().kind,
            PgTypeKind::Enum { labels: vec![] }
        );
    }
}
