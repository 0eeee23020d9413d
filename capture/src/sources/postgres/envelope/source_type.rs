//! A PostgreSQL column's length and scale as Debezium's PostgreSQL connector
//! gives them to `column.propagate.source.type`: its pgoutput `ColumnMetaData`
//! asks the JDBC driver's `TypeInfo` for the type's precision and scale under
//! the column's `atttypmod` (`-1`: the type's defaults, a precision of 0
//! replaced by the display size). The numbers below are pgjdbc 42.7's, read
//! from the driver itself (`TypeInfo.getPrecision`/`getDisplaySize`/`getScale`
//! against PostgreSQL 15, one call per built-in type, with and without
//! modifiers).

/// pgjdbc's length of a type it cannot bound (`text`, `varchar` without n,
/// `json`, an enum...).
const UNBOUNDED: i32 = i32::MAX;

/// `(length, scale)`: `length` is `None` where Debezium writes none (pgjdbc's
/// -1: `bit` without a length); the scale is always written.
pub(super) fn debezium_size(type_oid: u32, type_modifier: i32) -> (Option<u32>, u32) {
    let oid = array_element(type_oid).unwrap_or(type_oid);
    let length = match precision(oid, type_modifier) {
        0 if type_modifier == -1 => display_size_unmodified(oid),
        p => p,
    };
    (u32::try_from(length).ok(), scale(oid, type_modifier))
}

/// pgjdbc sizes these arrays as their elements; any other array is unbounded.
fn array_element(type_oid: u32) -> Option<u32> {
    Some(match type_oid {
        1000 => 16,
        1002 => 18,
        1005 => 21,
        1007 => 23,
        1016 => 20,
        1021 => 700,
        1022 => 701,
        1028 => 26,
        1014 => 1042,
        1015 => 1043,
        1115 => 1114,
        1182 => 1082,
        1183 => 1083,
        1185 => 1184,
        1231 => 1700,
        1270 => 1266,
        1561 => 1560,
        1563 => 1562,
        _ => return None,
    })
}

/// Digits of the fraction of seconds a time type's modifier declares (-1: 6).
fn fraction(type_modifier: i32) -> i32 {
    match type_modifier {
        -1 => 6,
        p => p,
    }
}

fn precision(oid: u32, type_modifier: i32) -> i32 {
    let m = type_modifier;
    // The fraction's digits and its point, when it has any.
    let fractional = |base: i32| base + if fraction(m) > 0 { fraction(m) + 1 } else { 0 };
    match oid {
        16 | 18 => 1,
        21 => 5,
        23 | 26 => 10,
        20 => 19,
        700 => 8,
        701 => 17,
        1082 => 13,
        1083 => fractional(8),
        1266 => fractional(14),
        1114 => fractional(22),
        1184 => fractional(28),
        1186 => 49,
        1700 if m == -1 => 0,
        1700 => ((m - 4) >> 16) & 0xFFFF,
        1042 | 1043 if m == -1 => UNBOUNDED,
        1042 | 1043 => m - 4,
        1560 => m,
        1562 if m == -1 => UNBOUNDED,
        1562 => m,
        _ => UNBOUNDED,
    }
}

/// pgjdbc's display size where its precision is 0 (`numeric` without p).
fn display_size_unmodified(oid: u32) -> i32 {
    match oid {
        1700 => 131_089,
        _ => UNBOUNDED,
    }
}

fn scale(oid: u32, type_modifier: i32) -> u32 {
    let m = type_modifier;
    let s = match oid {
        700 => 8,
        701 => 17,
        1700 if m == -1 => 0,
        1700 => (m - 4) & 0xFFFF,
        1083 | 1266 | 1114 | 1184 => fraction(m),
        1186 if m == -1 => 6,
        1186 => m & 0xFFFF,
        _ => 0,
    };
    u32::try_from(s).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What pgjdbc 42.7.11 answered (see the module doc), as
    /// `(oid, typmod, length, scale)`.
    #[test]
    fn sizes_are_the_jdbc_driver_s() {
        let max = Some(2_147_483_647);
        let cases: &[(u32, i32, Option<u32>, u32)] = &[
            (16, -1, Some(1), 0),
            (17, -1, max, 0),
            (20, -1, Some(19), 0),
            (21, -1, Some(5), 0),
            (23, -1, Some(10), 0),
            (25, -1, max, 0),
            (700, -1, Some(8), 8),
            (701, -1, Some(17), 17),
            (790, -1, max, 0),
            (1042, -1, max, 0),
            (1042, 8, Some(4), 0),
            (1043, -1, max, 0),
            (1043, 36, Some(32), 0),
            (1082, -1, Some(13), 0),
            (1083, -1, Some(15), 6),
            (1083, 0, Some(8), 0),
            (1083, 3, Some(12), 3),
            (1114, -1, Some(29), 6),
            (1114, 0, Some(22), 0),
            (1114, 3, Some(26), 3),
            (1184, -1, Some(35), 6),
            (1184, 0, Some(28), 0),
            (1184, 3, Some(32), 3),
            (1266, -1, Some(21), 6),
            (1266, 0, Some(14), 0),
            (1266, 3, Some(18), 3),
            (1186, -1, Some(49), 6),
            (1186, 2_147_418_115, Some(49), 3),
            (1560, -1, None, 0),
            (1560, 5, Some(5), 0),
            (1562, -1, max, 0),
            (1562, 5, Some(5), 0),
            (1700, -1, Some(131_089), 0),
            (1700, (12 << 16 | 2) + 4, Some(12), 2),
            (1700, (5 << 16) + 4, Some(5), 0),
            (2950, -1, max, 0),
            (3802, -1, max, 0),
            (1007, -1, Some(10), 0),
            (1009, -1, max, 0),
            (1015, 36, Some(32), 0),
            (1021, -1, Some(8), 8),
            (1231, -1, Some(131_089), 0),
            (1231, (12 << 16 | 2) + 4, Some(12), 2),
            (1187, -1, max, 0),
            (1561, -1, None, 0),
            (16_400, -1, max, 0),
        ];
        for &(oid, typmod, length, scale) in cases {
            assert_eq!(
                debezium_size(oid, typmod),
                (length, scale),
                "oid {oid} typmod {typmod}"
            );
        }
    }
}
