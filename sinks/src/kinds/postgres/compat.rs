//! Whether an existing warehouse column takes the values an event
//! describes, and the type it must widen to when it is narrower.

use super::types::{base_type, is_text, ColumnSpec, Conv, Exact};

/// Canonical `format_type` spelling of the DDL names this module produces.
pub fn canonical(ddl: &str) -> String {
    let base = base_type(ddl);
    if let Some(element) = base.strip_suffix("[]") {
        return format!("{}[]", canonical(element));
    }
    let mapped = match base.as_str() {
        "timestamptz" => "timestamp with time zone",
        "timestamp" => "timestamp without time zone",
        "timetz" => "time with time zone",
        "time" => "time without time zone",
        other => other,
    };
    mapped.to_owned()
}

/// Whether an existing column of type `actual` accepts values described by `spec`;
/// `Err` explains the conflict.
pub fn compatible(spec: &ColumnSpec, actual: &str) -> Result<(), String> {
    if spec.ddl == actual {
        return Ok(());
    }
    let want = canonical(&spec.ddl);
    let have = base_type(actual);
    let numeric = |t: &str| {
        matches!(
            t,
            "smallint" | "integer" | "bigint" | "real" | "double precision" | "numeric"
        )
    };
    let ok = want == have
        || is_text(actual)
        || (spec.inferred && want == "text")
        || (spec.inferred && want == "jsonb" && (have == "json" || have.ends_with("[]")))
        // Temporal arrays went to `jsonb` before they were typed: such a
        // column keeps taking them, as JSON text.
        || (matches!(spec.conv, Conv::Each(_)) && have == "jsonb")
        // Geometry structs went to `jsonb` before they were mapped to
        // `bytea`: such a column keeps taking them, as JSON text.
        || (spec.conv == Conv::Geometry && matches!(have.as_str(), "jsonb" | "json"))
        // Network addresses travel as plain strings (as Debezium's do): a
        // column the user typed `inet`, `cidr` or `macaddr` takes them by
        // cast (text that is no address is a data error: a dead letter).
        || (want == "text" && is_network(&have))
        || (want == "text[]" && have.strip_suffix("[]").is_some_and(is_network))
        // A date is midnight of a timestamp: a column changed from `date`
        // to a timestamp (see [`retyped`]) takes events written before the
        // change, read late or replayed.
        || (want == "date" && matches!(have.as_str(), "timestamp with time zone" | "timestamp without time zone"))
        // A JSON integer says nothing of its width: inferred, it fits any
        // integer column (a value out of range is an error, never rounded).
        || (spec.inferred && want == "bigint" && matches!(have.as_str(), "smallint" | "integer"))
        || match have.as_str() {
            "bigint" => matches!(want.as_str(), "smallint" | "integer"),
            "integer" => want == "smallint",
            "real" | "double precision" | "numeric" => numeric(&want),
            _ => false,
        };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "type conflict: the target column is {actual} but the event carries {}",
            spec.ddl
        ))
    }
}

fn is_network(t: &str) -> bool {
    matches!(t, "inet" | "cidr" | "macaddr" | "macaddr8")
}

/// PostgreSQL's largest `numeric` precision.
const NUMERIC_MAX_PRECISION: u32 = 1000;

/// The type an existing column of type `actual` must be altered to so that it
/// holds every value `spec` describes exactly, when `actual` is narrower in
/// the same family: integer widths, `numeric` precision and scale (an integer
/// column becomes a `numeric` wide enough for both), `varchar` length and
/// `varchar` to `text`, `bit varying` length. `None` when `actual` already
/// holds them, or when the types are of different families (then
/// [`compatible`] decides). Inferred
/// specs (schemas off) never widen: a JSON value says nothing of its type.
pub fn widened(spec: &ColumnSpec, actual: &str) -> Option<String> {
    if spec.inferred || spec.ddl == actual {
        return None;
    }
    if let (Some(have), Some(want)) = (Exact::parse(actual), Exact::parse(&spec.ddl)) {
        return match (have, want) {
            (Exact::Unbounded, _) => None,
            (Exact::Int(a), Exact::Int(b)) => (b > a).then(|| spec.ddl.to_string()),
            (_, Exact::Unbounded) => Some("numeric".to_owned()),
            _ => {
                let (have_int, have_scale) = have.digits()?;
                let (want_int, want_scale) = want.digits()?;
                let (int, scale) = (have_int.max(want_int), have_scale.max(want_scale));
                if int == have_int && scale == have_scale {
                    None
                } else if int + scale > NUMERIC_MAX_PRECISION {
                    Some("numeric".to_owned())
                } else {
                    Some(format!("numeric({},{scale})", int + scale))
                }
            }
        };
    }
    let length = |t: &str, family: &str| -> Option<u32> {
        t.strip_prefix(family)?
            .strip_prefix('(')?
            .strip_suffix(')')?
            .parse()
            .ok()
    };
    // `bit varying(n)` widens as `character varying(n)` does.
    if let Some(have) = length(actual, "bit varying") {
        return match length(&spec.ddl, "bit varying") {
            Some(want) => (want > have).then(|| spec.ddl.to_string()),
            None if spec.ddl == "bit varying" => Some("bit varying".to_owned()),
            None => None,
        };
    }
    // `character(n)` is left alone: its cast to text drops trailing blanks.
    let have = length(actual, "character varying")?;
    match length(&spec.ddl, "character varying") {
        Some(want) => (want > have).then(|| spec.ddl.to_string()),
        None if matches!(spec.ddl.as_ref(), "text" | "character varying") => {
            Some("text".to_owned())
        }
        None => None,
    }
}

/// The type an existing column of type `actual` must change to when it
/// cannot take the values `spec` describes and is of another family (a
/// source `ALTER ... TYPE` that is no widening: `integer` → `text`, `date`
/// → `timestamptz`): `spec`'s type, but only when a column of that type also
/// takes every value of `actual`. That one-way rule keeps the change final:
/// events written before it (read late from another partition, or
/// replayed) still fit the new column and never change it back, and two
/// workers deciding from the catalog agree. `None` when `actual` takes the
/// values already or [`widened`] widens it, for inferred specs (schemas
/// off), and for a change neither way (`integer` → `boolean`): its rows stay
/// a type conflict.
pub fn retyped(spec: &ColumnSpec, actual: &str) -> Option<String> {
    if spec.inferred || compatible(spec, actual).is_ok() || widened(spec, actual).is_some() {
        return None;
    }
    let before = ColumnSpec {
        ddl: actual.to_owned().into(),
        conv: Conv::Cast,
        inferred: false,
        attnum: None,
    };
    compatible(&before, &canonical(&spec.ddl))
        .is_ok()
        .then(|| spec.ddl.to_string())
}

/// The spec holding the values of both `a` and `b` (rows of one batch may
/// come from before and after a type change): the wider one, `b` when its
/// type takes `a`'s values and not the other way round ([`retyped`]), or
/// `a`.
pub fn wider(a: &ColumnSpec, b: &ColumnSpec) -> ColumnSpec {
    match widened(b, &a.ddl).or_else(|| retyped(b, &canonical(&a.ddl))) {
        Some(ddl) => ColumnSpec {
            ddl: ddl.into(),
            conv: b.conv,
            inferred: false,
            attnum: b.attnum.or(a.attnum),
        },
        None => a.clone(),
    }
}
