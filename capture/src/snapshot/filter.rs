//! Which snapshot filters capture runs: a filter (`additional-conditions`
//! of an `execute-snapshot` signal, `oncely capture snapshot --filter`) is
//! pasted into the chunk SELECT and runs as the capture role, so anyone who
//! can insert a signal row could otherwise call any function the role may
//! call (`pg_read_file`, `pg_sleep`, `dblink`) or leak data through an
//! error's text. A filter is therefore parsed (`sqlparser`, PostgreSQL
//! dialect) and must be built only of
//!
//! - column references, unqualified or qualified by the table's name;
//! - literals: numbers, standard strings, booleans, NULL, typed literals
//!   (`date '2024-01-01'`) and casts, both to the plain types of
//!   [`PLAIN_TYPES`];
//! - comparison, boolean, arithmetic and `||` operators, `IN (list)`,
//!   `BETWEEN`, `IS [NOT] NULL/TRUE/FALSE/DISTINCT FROM`, `[I]LIKE`, `CASE`,
//!   `EXTRACT`, `SUBSTRING`, `TRIM`, `AT TIME ZONE`;
//! - calls of the functions of [`FUNCTIONS`], unqualified, with plain
//!   positional arguments: immutable or stable ones that read no table, no
//!   file and no setting, and return one value.
//!
//! Anything else is refused with an error naming the construct, never a
//! value of the filter. The lexical guard before the parse stays: it refuses
//! what a parser of another dialect might read differently from the server
//! (comments, `;`, dollar quotes, escape strings). The names an allowed
//! filter holds are resolved with built-in objects only
//! (`FILTER_SEARCH_PATH` in `sources/postgres/chunk.rs`).

use std::cell::Cell;

use sqlparser::ast::{
    BinaryOperator, CastFormat, CastKind, CeilFloorKind, DataType, DateTimeField, Expr, Function,
    FunctionArg, FunctionArgExpr, FunctionArguments, Ident, InTarget, UnaryOperator, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Tokenizer;

/// Functions a filter may call: immutable or stable, reading nothing but
/// their arguments, one value per call.
pub const FUNCTIONS: &[&str] = &[
    "abs",
    "btrim",
    "ceil",
    "ceiling",
    "char_length",
    "character_length",
    "coalesce",
    "date_part",
    "date_trunc",
    "floor",
    "greatest",
    "least",
    "left",
    "length",
    "lower",
    "ltrim",
    "mod",
    "nullif",
    "octet_length",
    "right",
    "round",
    "rtrim",
    "sign",
    "substr",
    "trunc",
    "upper",
];

/// Types a literal or a value may be cast to (as `sqlparser` renders them,
/// lower case, without a length or precision). Casts to these run the
/// types' own input functions only.
pub const PLAIN_TYPES: &[&str] = &[
    "bigint",
    "bool",
    "boolean",
    "char",
    "character",
    "character varying",
    "date",
    "decimal",
    "double precision",
    "float",
    "float4",
    "float8",
    "int",
    "int2",
    "int4",
    "int8",
    "integer",
    "interval",
    "numeric",
    "real",
    "smallint",
    "text",
    "time",
    "time with time zone",
    "time without time zone",
    "timestamp",
    "timestamp with time zone",
    "timestamp without time zone",
    "timestamptz",
    "timetz",
    "uuid",
    "varchar",
];

/// How deep a filter's expression may nest: the parser's guard against a
/// stack overflow, and this walk's (a chain of `AND`s nests without
/// recursing in the parser).
const MAX_DEPTH: usize = 50;

/// The longest filter accepted, in bytes.
pub const MAX_FILTER_BYTES: usize = 8192;

/// Checks `filter` against the rules above; `table` (`schema.table`, as the
/// catalog spells it), when given, is the only qualifier a column reference
/// may carry. Without it any one- or two-part qualifier passes here, and the
/// server refuses one naming another table (the chunk SELECT has one FROM
/// entry).
pub fn check(filter: &str, table: Option<(&str, &str)>) -> Result<(), String> {
    Walk {
        table,
        depth: Cell::new(0),
    }
    .expr(&parse(filter)?)
}

/// Whether `filter`'s outermost operation yields a truth value (a
/// comparison, AND, OR, NOT, IS, IN, BETWEEN, LIKE, or a boolean literal),
/// parentheses aside: what a server without a boolean type cannot tell
/// from its result (MySQL's `id > 1` and `id` are both integers).
pub fn is_predicate(filter: &str) -> Result<bool, String> {
    let mut expr = parse(filter)?;
    while let Expr::Nested(inner) = expr {
        expr = *inner;
    }
    use BinaryOperator as B;
    Ok(match expr {
        Expr::BinaryOp { op, .. } => matches!(
            op,
            B::Gt | B::Lt | B::GtEq | B::LtEq | B::Eq | B::NotEq | B::And | B::Or
        ),
        Expr::UnaryOp { op, .. } => op == UnaryOperator::Not,
        Expr::Value(v) => matches!(v.value, Value::Boolean(_)),
        Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsTrue(_)
        | Expr::IsNotTrue(_)
        | Expr::IsFalse(_)
        | Expr::IsNotFalse(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotUnknown(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..)
        | Expr::In { .. }
        | Expr::Between { .. }
        | Expr::Like { .. }
        | Expr::ILike { .. } => true,
        _ => false,
    })
}

/// `filter` as one expression, or why not (never quoting it).
fn parse(filter: &str) -> Result<Expr, String> {
    if filter.len() > MAX_FILTER_BYTES {
        return Err(format!(
            "the filter is longer than {MAX_FILTER_BYTES} bytes"
        ));
    }
    let dialect = PostgreSqlDialect {};
    // Tokenized here, not by `Parser::try_with_sql`, which logs the SQL text.
    let tokens = Tokenizer::new(&dialect, filter)
        .tokenize_with_location()
        .map_err(|_| "the filter cannot be read as SQL tokens".to_string())?;
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(MAX_DEPTH)
        .with_tokens_with_locations(tokens);
    // The parser's messages quote the tokens they stopped at: not repeated.
    let expr = parser
        .parse_expr()
        .map_err(|_| "the filter is not one SQL expression".to_string())?;
    if parser.peek_token().token != sqlparser::tokenizer::Token::EOF {
        return Err("the filter is not one SQL expression: text follows it".into());
    }
    Ok(expr)
}

struct Walk<'t> {
    table: Option<(&'t str, &'t str)>,
    depth: Cell<usize>,
}

fn refuse<T>(construct: impl std::fmt::Display) -> Result<T, String> {
    Err(format!(
        "the filter uses {construct}, which is not allowed (allowed: the table's columns, literals, operators, IN lists, BETWEEN, IS [NOT] NULL, [I]LIKE, casts to plain types, and the functions {})",
        FUNCTIONS.join(", ")
    ))
}

/// An identifier as the server resolves it: unquoted names fold to lower case.
fn ident_is(ident: &Ident, name: &str) -> bool {
    match ident.quote_style {
        Some(_) => ident.value == name,
        None => ident.value.to_lowercase() == name,
    }
}

fn names(parts: &[Ident]) -> String {
    parts
        .iter()
        .map(|p| p.value.as_str())
        .collect::<Vec<_>>()
        .join(".")
}

impl Walk<'_> {
    fn exprs<'e>(&self, exprs: impl IntoIterator<Item = &'e Expr>) -> Result<(), String> {
        exprs.into_iter().try_for_each(|e| self.expr(e))
    }

    fn expr(&self, expr: &Expr) -> Result<(), String> {
        let depth = self.depth.get() + 1;
        if depth > MAX_DEPTH * 4 {
            return Err(format!(
                "the filter nests deeper than {} levels",
                MAX_DEPTH * 4
            ));
        }
        self.depth.set(depth);
        let checked = self.kind(expr);
        self.depth.set(depth - 1);
        checked
    }

    fn kind(&self, expr: &Expr) -> Result<(), String> {
        match expr {
            Expr::Identifier(_) => Ok(()),
            Expr::CompoundIdentifier(parts) => self.qualified(parts),
            Expr::Value(v) => literal(&v.value),
            Expr::TypedString(t) => {
                plain_type(&t.data_type)?;
                literal(&t.value.value)
            }
            Expr::Nested(e)
            | Expr::IsNull(e)
            | Expr::IsNotNull(e)
            | Expr::IsTrue(e)
            | Expr::IsNotTrue(e)
            | Expr::IsFalse(e)
            | Expr::IsNotFalse(e)
            | Expr::IsUnknown(e)
            | Expr::IsNotUnknown(e) => self.expr(e),
            Expr::IsDistinctFrom(a, b) | Expr::IsNotDistinctFrom(a, b) => self.exprs([&**a, b]),
            Expr::UnaryOp { op, expr } => match op {
                UnaryOperator::Not | UnaryOperator::Plus | UnaryOperator::Minus => self.expr(expr),
                other => refuse(format_args!("the operator {other}")),
            },
            Expr::BinaryOp { left, op, right } => {
                operator(op)?;
                self.exprs([&**left, right])
            }
            Expr::Function(f) => self.function(f),
            Expr::Tuple(items) => self.exprs(items),
            Expr::Subquery(_) | Expr::Exists { .. } => refuse("a subquery"),
            Expr::AnyOp { .. } | Expr::AllOp { .. } => refuse("ANY/ALL"),
            _ => self.predicate(expr),
        }
    }

    /// The SQL predicates with their own syntax: IN lists, BETWEEN, [I]LIKE
    /// and casts; anything else goes on to [`Walk::special_form`].
    fn predicate(&self, expr: &Expr) -> Result<(), String> {
        match expr {
            Expr::In {
                expr,
                target,
                global: false,
                ..
            } => match target {
                InTarget::List(list) => {
                    self.expr(expr)?;
                    self.exprs(list)
                }
                InTarget::Subquery(_) => refuse("a subquery"),
                _ => refuse("an IN whose list is not a list of values"),
            },
            Expr::Between {
                expr, low, high, ..
            } => self.exprs([&**expr, low, high]),
            Expr::Like {
                any: false,
                expr,
                pattern,
                escape_char,
                ..
            }
            | Expr::ILike {
                any: false,
                expr,
                pattern,
                escape_char,
                ..
            } => {
                self.exprs([&**expr, pattern])?;
                self.exprs(escape_char.iter().map(|e| &**e))
            }
            Expr::Cast {
                kind: CastKind::Cast | CastKind::DoubleColon,
                expr,
                data_type,
                format: None::<CastFormat>,
            } => {
                plain_type(data_type)?;
                self.expr(expr)
            }
            _ => self.special_form(expr),
        }
    }

    /// The expressions SQL spells with keywords rather than a function call
    /// (CASE, EXTRACT, CEIL/FLOOR, SUBSTRING, TRIM, AT TIME ZONE); anything
    /// else is refused.
    fn special_form(&self, expr: &Expr) -> Result<(), String> {
        match expr {
            Expr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => {
                self.exprs(operand.iter().map(|e| &**e))?;
                for when in conditions {
                    self.exprs([&when.condition, &when.result])?;
                }
                self.exprs(else_result.iter().map(|e| &**e))
            }
            Expr::Extract { expr, .. } => self.expr(expr),
            Expr::Ceil {
                expr,
                field: CeilFloorKind::DateTimeField(DateTimeField::NoDateTime),
            }
            | Expr::Floor {
                expr,
                field: CeilFloorKind::DateTimeField(DateTimeField::NoDateTime),
            } => self.expr(expr),
            Expr::Substring {
                expr,
                substring_from,
                substring_for,
                ..
            } => {
                self.expr(expr)?;
                self.exprs(substring_from.iter().chain(substring_for).map(|e| &**e))
            }
            Expr::Trim {
                expr,
                trim_what,
                trim_characters,
                ..
            } => {
                self.expr(expr)?;
                self.exprs(trim_what.iter().map(|e| &**e))?;
                self.exprs(trim_characters.iter().flatten())
            }
            Expr::AtTimeZone {
                timestamp,
                time_zone,
            } => self.exprs([&**timestamp, time_zone]),
            _ => refuse(construct(expr)),
        }
    }

    /// `table.column` or `schema.table.column` naming the filtered table.
    fn qualified(&self, parts: &[Ident]) -> Result<(), String> {
        let Some((_column, qualifier)) = parts.split_last() else {
            return refuse("an empty name");
        };
        let fits = match (qualifier, self.table) {
            ([_], None) | ([_, _], None) => true,
            ([t], Some((_, table))) => ident_is(t, table),
            ([s, t], Some((schema, table))) => ident_is(s, schema) && ident_is(t, table),
            _ => false,
        };
        if fits {
            Ok(())
        } else {
            refuse(format_args!(
                "the name {}, which is not a column of the snapshotted table",
                names(parts)
            ))
        }
    }

    fn function(&self, f: &Function) -> Result<(), String> {
        let name = f.name.to_string();
        let known = match f.name.0.as_slice() {
            [part] => part
                .as_ident()
                .is_some_and(|i| FUNCTIONS.iter().any(|n| ident_is(i, n))),
            _ => false,
        };
        if !known {
            return refuse(format_args!("the function {name}"));
        }
        if f.filter.is_some()
            || f.over.is_some()
            || f.null_treatment.is_some()
            || !f.within_group.is_empty()
            || f.uses_odbc_syntax
            || !matches!(f.parameters, FunctionArguments::None)
        {
            return refuse(format_args!("the function {name} with a clause"));
        }
        match &f.args {
            FunctionArguments::List(list)
                if list.duplicate_treatment.is_none() && list.clauses.is_empty() =>
            {
                for arg in &list.args {
                    match arg {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => self.expr(e)?,
                        _ => {
                            return refuse(format_args!("the function {name} with such arguments"))
                        }
                    }
                }
                Ok(())
            }
            FunctionArguments::Subquery(_) => refuse("a subquery"),
            _ => refuse(format_args!("the function {name} with such arguments")),
        }
    }
}

fn literal(v: &Value) -> Result<(), String> {
    match v {
        Value::Number(..) | Value::SingleQuotedString(_) | Value::Boolean(_) | Value::Null => {
            Ok(())
        }
        Value::Placeholder(_) => refuse("a parameter"),
        Value::DollarQuotedString(_) => refuse("a dollar-quoted string"),
        Value::EscapedStringLiteral(_) => refuse("an escape string (E'...')"),
        _ => refuse("a literal of a kind other than number, standard string, boolean or NULL"),
    }
}

fn plain_type(t: &DataType) -> Result<(), String> {
    let rendered = t.to_string().to_lowercase();
    // Lengths and precisions, `varchar(10)`, `timestamp(3) with time zone`.
    let mut name = String::with_capacity(rendered.len());
    let mut in_modifier = false;
    for c in rendered.chars() {
        match c {
            '(' => in_modifier = true,
            ')' if in_modifier => in_modifier = false,
            c if in_modifier && (c.is_ascii_digit() || c == ',' || c == ' ') => {}
            _ if in_modifier => return refuse(format_args!("a cast to {rendered}")),
            c => name.push(c),
        }
    }
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
    if PLAIN_TYPES.contains(&name.as_str()) {
        Ok(())
    } else {
        refuse(format_args!("a cast to {name}"))
    }
}

fn operator(op: &BinaryOperator) -> Result<(), String> {
    use BinaryOperator as B;
    match op {
        B::Plus
        | B::Minus
        | B::Multiply
        | B::Divide
        | B::Modulo
        | B::StringConcat
        | B::Gt
        | B::Lt
        | B::GtEq
        | B::LtEq
        | B::Eq
        | B::NotEq
        | B::And
        | B::Or => Ok(()),
        other => refuse(format_args!("the operator {other}")),
    }
}

/// A name for an expression kind, without its contents.
fn construct(expr: &Expr) -> String {
    let debug = format!("{expr:?}");
    let kind: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    format!("the construct {kind}")
}
