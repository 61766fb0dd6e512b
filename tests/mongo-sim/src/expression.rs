//! Aggregation expressions: a small subset of MongoDB's, parsed once (so an unknown operator is
//! refused when the pipeline is given) and evaluated per document.
//!
//! Supported: field paths (`"$a.b"`), `$$ROOT`, `$$CURRENT`, `$$REMOVE` (and `$$KEEP`,
//! `$$PRUNE`, `$$DESCEND` inside `$redact`), literals, object and array literals, `$literal`,
//! `$eq` / `$ne` / `$gt` / `$gte` / `$lt` / `$lte`, `$and` / `$or` / `$not`, `$cond`,
//! `$ifNull`, `$concat`, `$toString`, `$mod`, `$abs`, `$add`, `$subtract`, `$multiply`,
//! `$toHashedIndexKey`, `$type` and `$getField`. Anything else is refused with MongoDB's
//! `InvalidPipelineOperator` (168). Decimal128 values take part in comparisons and hashing but
//! not in arithmetic.

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document};
use md5::{Digest, Md5};

use crate::error::{CmdResult, CommandError};
use crate::values::cmp_values;

/// The values `$$KEEP`, `$$PRUNE` and `$$DESCEND` stand for inside `$redact`.
pub const KEEP: &str = "keep";
pub const PRUNE: &str = "prune";
pub const DESCEND: &str = "descend";

/// Where an expression is parsed: `$redact` defines three more variables.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParseContext {
    pub redact: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    Root,
    Current,
    Remove,
    Keep,
    Prune,
    Descend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    And,
    Or,
    Not,
    IfNull,
    Concat,
    ToString,
    Mod,
    Abs,
    Add,
    Subtract,
    Multiply,
    ToHashedIndexKey,
    Type,
}

impl Op {
    fn from_name(name: &str) -> Option<Op> {
        Some(match name {
            "$eq" => Op::Eq,
            "$ne" => Op::Ne,
            "$gt" => Op::Gt,
            "$gte" => Op::Gte,
            "$lt" => Op::Lt,
            "$lte" => Op::Lte,
            "$and" => Op::And,
            "$or" => Op::Or,
            "$not" => Op::Not,
            "$ifNull" => Op::IfNull,
            "$concat" => Op::Concat,
            "$toString" => Op::ToString,
            "$mod" => Op::Mod,
            "$abs" => Op::Abs,
            "$add" => Op::Add,
            "$subtract" => Op::Subtract,
            "$multiply" => Op::Multiply,
            "$toHashedIndexKey" => Op::ToHashedIndexKey,
            "$type" => Op::Type,
            _ => return None,
        })
    }

    /// The exact number of arguments, when fixed.
    fn arity(self) -> Option<usize> {
        match self {
            Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte | Op::Mod | Op::Subtract => {
                Some(2)
            }
            Op::Not | Op::ToString | Op::Abs | Op::ToHashedIndexKey | Op::Type => Some(1),
            Op::And | Op::Or | Op::IfNull | Op::Concat | Op::Add | Op::Multiply => None,
        }
    }
}

/// A parsed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    Literal(Bson),
    /// A path below `$$CURRENT` (`"$a.b"`).
    Field(Vec<String>),
    Variable(Var, Vec<String>),
    Object(Vec<(String, Expr)>),
    Array(Vec<Expr>),
    Op(Op, String, Vec<Expr>),
    Cond(Box<[Expr; 3]>),
    GetField(String, Box<Expr>),
}

/// The documents an expression reads: `$$ROOT` and `$$CURRENT` (different inside `$redact`).
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub root: &'a Document,
    pub current: &'a Document,
}

impl<'a> Scope<'a> {
    pub fn of(doc: &'a Document) -> Self {
        Scope {
            root: doc,
            current: doc,
        }
    }
}

/// Values produced by evaluation; `None` is a missing value.
pub type Value = Option<Bson>;

fn field_path_parts(path: &str) -> CmdResult<Vec<String>> {
    if path.is_empty() {
        return Err(CommandError::new(
            16872,
            "'$' by itself is not a valid FieldPath",
        ));
    }
    path.split('.')
        .map(|p| {
            if p.is_empty() {
                Err(CommandError::new(
                    15998,
                    "FieldPath field names may not be empty strings.",
                ))
            } else if p.starts_with('$') {
                Err(CommandError::new(
                    16410,
                    format!(
                        "FieldPath field names may not start with '$'. Consider using $getField or $setField. ({path})"
                    ),
                ))
            } else {
                Ok(p.to_string())
            }
        })
        .collect()
}

fn parse_variable(text: &str, ctx: ParseContext) -> CmdResult<Expr> {
    let (name, rest) = match text.split_once('.') {
        Some((n, r)) => (n, Some(r)),
        None => (text, None),
    };
    let var = match name {
        "ROOT" => Var::Root,
        "CURRENT" => Var::Current,
        "REMOVE" => Var::Remove,
        "KEEP" if ctx.redact => Var::Keep,
        "PRUNE" if ctx.redact => Var::Prune,
        "DESCEND" if ctx.redact => Var::Descend,
        "" => {
            return Err(CommandError::new(
                16869,
                "empty variable names are not allowed",
            ));
        }
        other => {
            return Err(CommandError::new(
                17276,
                format!("Use of undefined variable: {other}"),
            ));
        }
    };
    let path = match rest {
        Some(r) => field_path_parts(r)?,
        None => Vec::new(),
    };
    Ok(Expr::Variable(var, path))
}

fn args_of(value: &Bson) -> Vec<&Bson> {
    match value {
        Bson::Array(items) => items.iter().collect(),
        other => vec![other],
    }
}

fn wrong_arity(name: &str, expected: usize, got: usize) -> CommandError {
    CommandError::new(
        16020,
        format!("Expression {name} takes exactly {expected} arguments. {got} were passed in."),
    )
}

impl Expr {
    /// Parses an expression as MongoDB's aggregation does.
    pub fn parse(value: &Bson, ctx: ParseContext) -> CmdResult<Expr> {
        match value {
            Bson::String(s) if s.starts_with("$$") => parse_variable(&s[2..], ctx),
            Bson::String(s) if s.starts_with('$') => Ok(Expr::Field(field_path_parts(&s[1..])?)),
            Bson::Document(d) => Self::parse_document(d, ctx),
            Bson::Array(items) => Ok(Expr::Array(
                items
                    .iter()
                    .map(|i| Expr::parse(i, ctx))
                    .collect::<CmdResult<_>>()?,
            )),
            other => Ok(Expr::Literal(other.clone())),
        }
    }

    fn parse_document(d: &Document, ctx: ParseContext) -> CmdResult<Expr> {
        let Some(first) = d.keys().next() else {
            return Ok(Expr::Object(Vec::new()));
        };
        if !first.starts_with('$') {
            let mut fields = Vec::with_capacity(d.len());
            for (k, v) in d {
                if k.starts_with('$') {
                    return Err(CommandError::new(
                        16410,
                        format!(
                            "FieldPath field names may not start with '$'. Consider using $getField or $setField. ({k})"
                        ),
                    ));
                }
                if k.contains('.') {
                    return Err(CommandError::new(
                        16412,
                        format!(
                            "FieldPath field names may not contain '.'. Consider using $getField or $setField. ({k})"
                        ),
                    ));
                }
                fields.push((k.clone(), Expr::parse(v, ctx)?));
            }
            return Ok(Expr::Object(fields));
        }
        if d.len() != 1 {
            return Err(CommandError::new(
                15983,
                format!(
                    "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}",
                    d.len(),
                    display(&Bson::Document(d.clone()))
                ),
            ));
        }
        let (name, arg) = d.iter().next().ok_or_else(|| CommandError::bad_value(""))?;
        match name.as_str() {
            "$literal" => Ok(Expr::Literal(arg.clone())),
            "$cond" => Self::parse_cond(arg, ctx),
            "$getField" => Self::parse_get_field(arg, ctx),
            other => {
                let Some(op) = Op::from_name(other) else {
                    return Err(CommandError::new(
                        168,
                        format!("Unrecognized expression '{other}'"),
                    ));
                };
                let args = args_of(arg);
                if let Some(n) = op.arity()
                    && args.len() != n
                {
                    return Err(wrong_arity(other, n, args.len()));
                }
                if op == Op::IfNull && args.len() < 2 {
                    return Err(CommandError::new(
                        1257300,
                        format!("$ifNull needs at least two arguments, had: {}", args.len()),
                    ));
                }
                Ok(Expr::Op(
                    op,
                    other.to_string(),
                    args.into_iter()
                        .map(|a| Expr::parse(a, ctx))
                        .collect::<CmdResult<_>>()?,
                ))
            }
        }
    }

    fn parse_cond(arg: &Bson, ctx: ParseContext) -> CmdResult<Expr> {
        match arg {
            Bson::Document(d) => {
                let mut parts: [Option<Expr>; 3] = [None, None, None];
                for (k, v) in d {
                    let slot = match k.as_str() {
                        "if" => 0,
                        "then" => 1,
                        "else" => 2,
                        other => {
                            return Err(CommandError::new(
                                17083,
                                format!("Unrecognized parameter to $cond: {other}"),
                            ));
                        }
                    };
                    parts[slot] = Some(Expr::parse(v, ctx)?);
                }
                let [i, t, e] = parts;
                let i =
                    i.ok_or_else(|| CommandError::new(17080, "Missing 'if' parameter to $cond"))?;
                let t =
                    t.ok_or_else(|| CommandError::new(17081, "Missing 'then' parameter to $cond"))?;
                let e =
                    e.ok_or_else(|| CommandError::new(17082, "Missing 'else' parameter to $cond"))?;
                Ok(Expr::Cond(Box::new([i, t, e])))
            }
            other => {
                let args = args_of(other);
                if args.len() != 3 {
                    return Err(wrong_arity("$cond", 3, args.len()));
                }
                let mut parsed = args.into_iter().map(|a| Expr::parse(a, ctx));
                let mut next = || parsed.next().unwrap_or(Ok(Expr::Literal(Bson::Null)));
                Ok(Expr::Cond(Box::new([next()?, next()?, next()?])))
            }
        }
    }

    fn parse_get_field(arg: &Bson, ctx: ParseContext) -> CmdResult<Expr> {
        let (field, input) = match arg {
            Bson::Document(d) if d.keys().next().is_some_and(|k| !k.starts_with('$')) => {
                let mut field = None;
                let mut input = None;
                for (k, v) in d {
                    match k.as_str() {
                        "field" => field = Some(v),
                        "input" => input = Some(Expr::parse(v, ctx)?),
                        other => {
                            return Err(CommandError::new(
                                3041701,
                                format!("$getField found an unknown argument: {other}"),
                            ));
                        }
                    }
                }
                let field = field.ok_or_else(|| {
                    CommandError::new(3041702, "$getField requires 'field' to be specified")
                })?;
                (
                    field,
                    input.unwrap_or(Expr::Variable(Var::Current, Vec::new())),
                )
            }
            other => (other, Expr::Variable(Var::Current, Vec::new())),
        };
        let name = match field {
            Bson::String(s) if !s.starts_with('$') => s.clone(),
            Bson::Document(d) if d.len() == 1 && d.contains_key("$literal") => {
                match d.get("$literal") {
                    Some(Bson::String(s)) => s.clone(),
                    Some(other) => {
                        return Err(CommandError::new(
                            5654601,
                            format!(
                                "$getField requires 'field' to evaluate to type String, but got {}",
                                type_name(Some(other))
                            ),
                        ));
                    }
                    None => String::new(),
                }
            }
            Bson::String(_) | Bson::Document(_) | Bson::Array(_) => {
                return Err(CommandError::new(
                    5654602,
                    "$getField requires 'field' to evaluate to a constant, but got a non-constant argument",
                ));
            }
            other => {
                return Err(CommandError::new(
                    5654601,
                    format!(
                        "$getField requires 'field' to evaluate to type String, but got {}",
                        type_name(Some(other))
                    ),
                ));
            }
        };
        Ok(Expr::GetField(name, Box::new(input)))
    }

    /// Evaluates the expression; `None` is a missing value.
    pub fn evaluate(&self, scope: Scope<'_>) -> CmdResult<Value> {
        match self {
            Expr::Literal(v) => Ok(Some(v.clone())),
            Expr::Field(path) => Ok(path_value(scope.current, path)),
            Expr::Variable(var, path) => {
                let base = match var {
                    Var::Root => scope.root,
                    Var::Current => scope.current,
                    Var::Remove => return Ok(None),
                    Var::Keep => return Ok(Some(Bson::String(KEEP.into()))),
                    Var::Prune => return Ok(Some(Bson::String(PRUNE.into()))),
                    Var::Descend => return Ok(Some(Bson::String(DESCEND.into()))),
                };
                if path.is_empty() {
                    Ok(Some(Bson::Document(base.clone())))
                } else {
                    Ok(path_value(base, path))
                }
            }
            Expr::Object(fields) => {
                let mut out = Document::new();
                for (k, e) in fields {
                    if let Some(v) = e.evaluate(scope)? {
                        out.insert(k.clone(), v);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
            Expr::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for e in items {
                    out.push(e.evaluate(scope)?.unwrap_or(Bson::Null));
                }
                Ok(Some(Bson::Array(out)))
            }
            Expr::Cond(parts) => {
                let [i, t, e] = &**parts;
                if truthy(&i.evaluate(scope)?) {
                    t.evaluate(scope)
                } else {
                    e.evaluate(scope)
                }
            }
            Expr::GetField(name, input) => match input.evaluate(scope)? {
                None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
                Some(Bson::Document(d)) => Ok(d.get(name).cloned()),
                Some(other) => Err(CommandError::new(
                    3041704,
                    format!(
                        "$getField requires 'input' to evaluate to type Object, but got {}",
                        type_name(Some(&other))
                    ),
                )),
            },
            Expr::Op(op, name, args) => evaluate_op(*op, name, args, scope),
        }
    }
}

/// Values a field path reaches, descending through arrays as aggregation does.
fn path_value(doc: &Document, path: &[String]) -> Value {
    let (first, rest) = path.split_first()?;
    let v = doc.get(first)?;
    value_path(v, rest)
}

fn value_path(v: &Bson, rest: &[String]) -> Value {
    if rest.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(d) => path_value(d, rest),
        Bson::Array(items) => Some(Bson::Array(
            items.iter().filter_map(|i| value_path(i, rest)).collect(),
        )),
        _ => None,
    }
}

/// Aggregation truthiness: false, null, undefined, missing and numeric zero are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::Boolean(false)) => false,
        Some(Bson::Int32(0)) | Some(Bson::Int64(0)) => false,
        Some(Bson::Double(d)) => *d != 0.0,
        Some(Bson::Decimal128(d)) => decimal_to_f64(d) != 0.0,
        _ => true,
    }
}

fn nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

/// MongoDB's name for a value's type, as `$type` reports it.
pub fn type_name(v: Option<&Bson>) -> &'static str {
    match v {
        None => "missing",
        Some(b) => match b {
            Bson::Double(_) => "double",
            Bson::String(_) => "string",
            Bson::Document(_) => "object",
            Bson::Array(_) => "array",
            Bson::Binary(_) => "binData",
            Bson::Undefined => "undefined",
            Bson::ObjectId(_) => "objectId",
            Bson::Boolean(_) => "bool",
            Bson::DateTime(_) => "date",
            Bson::Null => "null",
            Bson::RegularExpression(_) => "regex",
            Bson::DbPointer(_) => "dbPointer",
            Bson::JavaScriptCode(_) => "javascript",
            Bson::Symbol(_) => "symbol",
            Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
            Bson::Int32(_) => "int",
            Bson::Timestamp(_) => "timestamp",
            Bson::Int64(_) => "long",
            Bson::Decimal128(_) => "decimal",
            Bson::MinKey => "minKey",
            Bson::MaxKey => "maxKey",
        },
    }
}

/// Compares two values with missing ordered just above MinKey, as aggregation does.
fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(Bson::MinKey)) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (Some(Bson::MinKey), None) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => cmp_values(x, y),
    }
}

#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i32),
    Long(i64),
    Double(f64),
}

impl Num {
    fn of(v: &Bson) -> Option<Num> {
        match v {
            Bson::Int32(i) => Some(Num::Int(*i)),
            Bson::Int64(i) => Some(Num::Long(*i)),
            Bson::Double(d) => Some(Num::Double(*d)),
            _ => None,
        }
    }

    fn f(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Long(i) => i as f64,
            Num::Double(d) => d,
        }
    }

    fn to_bson(self) -> Bson {
        match self {
            Num::Int(i) => Bson::Int32(i),
            Num::Long(i) => Bson::Int64(i),
            Num::Double(d) => Bson::Double(d),
        }
    }

    /// Integer arithmetic widening int → long → double on overflow, as MongoDB does.
    fn combine(
        self,
        other: Num,
        int: fn(i64, i64) -> Option<i64>,
        float: fn(f64, f64) -> f64,
    ) -> Num {
        let as_long = |n: Num| match n {
            Num::Int(i) => Some(i as i64),
            Num::Long(i) => Some(i),
            Num::Double(_) => None,
        };
        match (as_long(self), as_long(other)) {
            (Some(a), Some(b)) => match int(a, b) {
                Some(r) => {
                    if matches!((self, other), (Num::Int(_), Num::Int(_)))
                        && let Ok(small) = i32::try_from(r)
                    {
                        Num::Int(small)
                    } else {
                        Num::Long(r)
                    }
                }
                None => Num::Double(float(a as f64, b as f64)),
            },
            _ => Num::Double(float(self.f(), other.f())),
        }
    }
}

fn decimal_unsupported(name: &str) -> CommandError {
    CommandError::bad_value(format!(
        "{name} on decimal values is not supported by this server"
    ))
}

fn evaluate_op(op: Op, name: &str, args: &[Expr], scope: Scope<'_>) -> CmdResult<Value> {
    let mut values = Vec::with_capacity(args.len());
    // $and, $or, $ifNull and $cond short-circuit; the others read all their arguments.
    match op {
        Op::And => {
            for a in args {
                if !truthy(&a.evaluate(scope)?) {
                    return Ok(Some(Bson::Boolean(false)));
                }
            }
            return Ok(Some(Bson::Boolean(true)));
        }
        Op::Or => {
            for a in args {
                if truthy(&a.evaluate(scope)?) {
                    return Ok(Some(Bson::Boolean(true)));
                }
            }
            return Ok(Some(Bson::Boolean(false)));
        }
        Op::IfNull => {
            let (last, rest) = args.split_last().ok_or_else(|| wrong_arity(name, 2, 0))?;
            for a in rest {
                let v = a.evaluate(scope)?;
                if !nullish(&v) {
                    return Ok(v);
                }
            }
            return last.evaluate(scope);
        }
        _ => {
            for a in args {
                values.push(a.evaluate(scope)?);
            }
        }
    }
    let first = values.first().cloned().flatten();
    let second = values.get(1).cloned().flatten();
    let cmp = || compare(&values[0], &values[1]);
    Ok(match op {
        Op::Eq => Some(Bson::Boolean(cmp() == Ordering::Equal)),
        Op::Ne => Some(Bson::Boolean(cmp() != Ordering::Equal)),
        Op::Gt => Some(Bson::Boolean(cmp() == Ordering::Greater)),
        Op::Gte => Some(Bson::Boolean(cmp() != Ordering::Less)),
        Op::Lt => Some(Bson::Boolean(cmp() == Ordering::Less)),
        Op::Lte => Some(Bson::Boolean(cmp() != Ordering::Greater)),
        Op::Not => Some(Bson::Boolean(!truthy(&values[0]))),
        Op::Type => Some(Bson::String(type_name(first.as_ref()).to_string())),
        Op::ToHashedIndexKey => Some(Bson::Int64(hashed_index_key(
            first.as_ref().unwrap_or(&Bson::Null),
            0,
        ))),
        Op::ToString => to_string(first)?,
        Op::Concat => {
            let mut out = String::new();
            for v in &values {
                match v {
                    Some(Bson::String(s)) => out.push_str(s),
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(other) => {
                        return Err(CommandError::new(
                            16702,
                            format!(
                                "$concat only supports strings, not {}",
                                type_name(Some(other))
                            ),
                        ));
                    }
                }
            }
            Some(Bson::String(out))
        }
        Op::Abs => {
            match first {
                None | Some(Bson::Null) | Some(Bson::Undefined) => Some(Bson::Null),
                Some(Bson::Int32(i)) => Some(match i.checked_abs() {
                    Some(a) => Bson::Int32(a),
                    None => Bson::Int64((i as i64).abs()),
                }),
                Some(Bson::Int64(i)) => Some(Bson::Int64(i.checked_abs().ok_or_else(|| {
                    CommandError::new(28680, "can't take $abs of long long min")
                })?)),
                Some(Bson::Double(d)) => Some(Bson::Double(d.abs())),
                Some(Bson::Decimal128(_)) => return Err(decimal_unsupported("$abs")),
                Some(other) => {
                    return Err(CommandError::new(
                        28765,
                        format!(
                            "$abs only supports numeric types, not {}",
                            type_name(Some(&other))
                        ),
                    ));
                }
            }
        }
        Op::Mod => {
            if nullish(&values[0]) || nullish(&values[1]) {
                return Ok(Some(Bson::Null));
            }
            let (Some(a), Some(b)) = (
                first.as_ref().and_then(Num::of),
                second.as_ref().and_then(Num::of),
            ) else {
                if matches!(first, Some(Bson::Decimal128(_)))
                    || matches!(second, Some(Bson::Decimal128(_)))
                {
                    return Err(decimal_unsupported("$mod"));
                }
                return Err(CommandError::new(
                    16611,
                    format!(
                        "$mod only supports numeric types, not {} and {}",
                        type_name(first.as_ref()),
                        type_name(second.as_ref())
                    ),
                ));
            };
            if b.f() == 0.0 {
                return Err(CommandError::new(16610, "can't $mod by zero"));
            }
            Some(
                a.combine(b, |x, y| Some(x.wrapping_rem(y)), |x, y| x % y)
                    .to_bson(),
            )
        }
        Op::Add => add(&values)?,
        Op::Multiply => {
            let mut acc = Num::Int(1);
            for v in &values {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(b) => match Num::of(b) {
                        Some(n) => acc = acc.combine(n, i64::checked_mul, |x, y| x * y),
                        None if matches!(b, Bson::Decimal128(_)) => {
                            return Err(decimal_unsupported("$multiply"));
                        }
                        None => {
                            return Err(CommandError::new(
                                16555,
                                format!(
                                    "$multiply only supports numeric types, not {}",
                                    type_name(Some(b))
                                ),
                            ));
                        }
                    },
                }
            }
            Some(acc.to_bson())
        }
        Op::Subtract => subtract(&values[0], &values[1])?,
        Op::And | Op::Or | Op::IfNull => None,
    })
}

fn add(values: &[Value]) -> CmdResult<Value> {
    let mut acc = Num::Int(0);
    let mut date: Option<i64> = None;
    for v in values {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(Bson::DateTime(d)) => {
                if date.is_some() {
                    return Err(CommandError::new(
                        16612,
                        "only one date allowed in an $add expression",
                    ));
                }
                date = Some(d.timestamp_millis());
            }
            Some(b) => match Num::of(b) {
                Some(n) => acc = acc.combine(n, i64::checked_add, |x, y| x + y),
                None if matches!(b, Bson::Decimal128(_)) => {
                    return Err(decimal_unsupported("$add"));
                }
                None => {
                    return Err(CommandError::new(
                        16554,
                        format!(
                            "$add only supports numeric or date types, not {}",
                            type_name(Some(b))
                        ),
                    ));
                }
            },
        }
    }
    Ok(Some(match date {
        Some(ms) => {
            let delta = match acc {
                Num::Double(d) => d.round() as i64,
                Num::Int(i) => i as i64,
                Num::Long(i) => i,
            };
            Bson::DateTime(DateTime::from_millis(ms.wrapping_add(delta)))
        }
        None => acc.to_bson(),
    }))
}

fn subtract(a: &Value, b: &Value) -> CmdResult<Value> {
    if nullish(a) || nullish(b) {
        return Ok(Some(Bson::Null));
    }
    let (Some(x), Some(y)) = (a, b) else {
        return Ok(Some(Bson::Null));
    };
    let out = match (x, y) {
        (Bson::DateTime(p), Bson::DateTime(q)) => {
            Bson::Int64(p.timestamp_millis().wrapping_sub(q.timestamp_millis()))
        }
        (Bson::DateTime(p), n) if Num::of(n).is_some() => {
            let delta = match Num::of(n) {
                Some(Num::Double(d)) => d.round() as i64,
                Some(Num::Int(i)) => i as i64,
                Some(Num::Long(i)) => i,
                None => 0,
            };
            Bson::DateTime(DateTime::from_millis(
                p.timestamp_millis().wrapping_sub(delta),
            ))
        }
        _ => match (Num::of(x), Num::of(y)) {
            (Some(p), Some(q)) => p.combine(q, i64::checked_sub, |m, n| m - n).to_bson(),
            _ if matches!(x, Bson::Decimal128(_)) || matches!(y, Bson::Decimal128(_)) => {
                return Err(decimal_unsupported("$subtract"));
            }
            _ => {
                return Err(CommandError::new(
                    16556,
                    format!(
                        "can't $subtract {} from {}",
                        type_name(Some(y)),
                        type_name(Some(x))
                    ),
                ));
            }
        },
    };
    Ok(Some(out))
}

fn to_string(v: Option<Bson>) -> CmdResult<Value> {
    Ok(Some(Bson::String(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
        Some(Bson::String(s)) => s,
        Some(Bson::Boolean(b)) => b.to_string(),
        Some(Bson::Int32(i)) => i.to_string(),
        Some(Bson::Int64(i)) => i.to_string(),
        Some(Bson::Double(d)) => format_double(d),
        Some(Bson::Decimal128(d)) => d.to_string(),
        Some(Bson::ObjectId(o)) => o.to_hex(),
        Some(Bson::DateTime(d)) => iso_date(d.timestamp_millis()),
        Some(other) => {
            return Err(CommandError::new(
                241,
                format!(
                    "Unsupported conversion from {} to string in $convert with no onError value",
                    type_name(Some(&other))
                ),
            ));
        }
    })))
}

/// A double as `$toString` writes it: the shortest text that reads back to the same value,
/// in exponent form outside 1e-4 ≤ |x| < 1e16.
fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{d:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        format!("{d}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for milliseconds since the epoch.
fn iso_date(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

fn decimal_to_f64(d: &bson::Decimal128) -> f64 {
    let text = d.to_string();
    match text.as_str() {
        "NaN" | "-NaN" => f64::NAN,
        "Infinity" | "Inf" => f64::INFINITY,
        "-Infinity" | "-Inf" => f64::NEG_INFINITY,
        t => t.parse().unwrap_or(f64::NAN),
    }
}

/// A value as MongoDB prints it in messages (`{a: 1, b: "x"}`).
pub fn display(v: &Bson) -> String {
    match v {
        Bson::String(s) => format!("\"{s}\""),
        Bson::Document(d) => {
            let inner: Vec<String> = d
                .iter()
                .map(|(k, v)| format!("{k}: {}", display(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Bson::Array(items) => {
            let inner: Vec<String> = items.iter().map(display).collect();
            format!("[{}]", inner.join(", "))
        }
        Bson::Timestamp(t) => format!("Timestamp({}, {})", t.time, t.increment),
        Bson::Null => "null".into(),
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) => format_double(*d),
        Bson::Boolean(b) => b.to_string(),
        other => other.to_string(),
    }
}

// ---- $toHashedIndexKey -------------------------------------------------------------------

/// MongoDB's hashed-index key of a value with the given seed (0 for hashed indexes and
/// `$toHashedIndexKey`): MD5 over the little-endian seed and the value's canonical encoding
/// (canonical type number, numbers as 64-bit integers, embedded documents element by element
/// with their field names), the first 8 digest bytes read as a little-endian `i64`.
pub fn hashed_index_key(value: &Bson, seed: i32) -> i64 {
    let mut md5 = Md5::new();
    md5.update(seed.to_le_bytes());
    hash_value(&mut md5, value);
    let digest = md5.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

/// The canonical type number MongoDB sorts and hashes by.
fn canonical_type(v: &Bson) -> i32 {
    match v {
        Bson::MinKey => -1,
        Bson::Undefined => 0,
        Bson::Null => 5,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => 15,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

/// A number as a 64-bit integer the way hashing squashes it: truncated toward zero, NaN as 0,
/// out-of-range values clamped, and a double of exactly 2^63 as `i64::MIN` (kept from older
/// servers).
fn hash_long(v: &Bson) -> i64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    let from_f64 = |d: f64| {
        if d.is_nan() {
            0
        } else if d >= TWO_63 {
            i64::MAX
        } else if d < -TWO_63 {
            i64::MIN
        } else {
            d as i64
        }
    };
    match v {
        Bson::Int32(i) => *i as i64,
        Bson::Int64(i) => *i,
        Bson::Double(d) if *d == TWO_63 => i64::MIN,
        Bson::Double(d) => from_f64(*d),
        Bson::Decimal128(d) => {
            let f = decimal_to_f64(d);
            // Decimal128 converts to an integer rounding half to even.
            let r = f.round();
            let r = if (f - f.trunc()).abs() == 0.5 {
                2.0 * (f / 2.0).round()
            } else {
                r
            };
            from_f64(r)
        }
        _ => 0,
    }
}

/// The bytes of a value as it sits in a BSON element (after the type byte and field name).
fn raw_value_bytes(v: &Bson) -> Vec<u8> {
    let mut d = Document::new();
    d.insert("", v.clone());
    let bytes = d.to_vec().unwrap_or_default();
    // Layout: int32 length, type byte, "" (one NUL), value, trailing NUL.
    if bytes.len() < 7 {
        return Vec::new();
    }
    bytes[6..bytes.len() - 1].to_vec()
}

fn hash_value(md5: &mut Md5, v: &Bson) {
    md5.update(canonical_type(v).to_le_bytes());
    match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            md5.update(hash_long(v).to_le_bytes());
        }
        Bson::Document(_) | Bson::Array(_) | Bson::JavaScriptCodeWithScope(_) => {
            hash_nested_body(md5, v);
        }
        other => md5.update(raw_value_bytes(other)),
    }
}

fn hash_elements<'a>(md5: &mut Md5, elements: impl Iterator<Item = (&'a str, &'a Bson)>) {
    for (name, value) in elements {
        md5.update(canonical_type(value).to_le_bytes());
        md5.update(name.as_bytes());
        md5.update([0u8]);
        match value {
            Bson::Document(_) | Bson::Array(_) | Bson::JavaScriptCodeWithScope(_) => {
                hash_nested_body(md5, value);
            }
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                md5.update(hash_long(value).to_le_bytes());
            }
            other => md5.update(raw_value_bytes(other)),
        }
    }
    // The terminating EOO element: canonical type 0, no name, no value.
    md5.update(0i32.to_le_bytes());
}

fn hash_nested_body(md5: &mut Md5, v: &Bson) {
    match v {
        Bson::Document(d) => hash_elements(md5, d.iter().map(|(k, v)| (k.as_str(), v))),
        Bson::Array(items) => {
            let names: Vec<String> = (0..items.len()).map(|i| i.to_string()).collect();
            hash_elements(md5, names.iter().map(String::as_str).zip(items.iter()));
        }
        Bson::JavaScriptCodeWithScope(c) => {
            // The code string as stored (length, bytes, NUL), then the scope's elements.
            let len = (c.code.len() + 1) as i32;
            md5.update(len.to_le_bytes());
            md5.update(c.code.as_bytes());
            md5.update([0u8]);
            hash_elements(md5, c.scope.iter().map(|(k, v)| (k.as_str(), v)));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn eval(expr: Bson, doc: &Document) -> CmdResult<Value> {
        Expr::parse(&expr, ParseContext::default())?.evaluate(Scope::of(doc))
    }

    #[test]
    fn hashes_match_mongodb_with_seed_zero() {
        // The server's own start-up self check: {check: 42} hashes to this with seed 0.
        assert_eq!(hashed_index_key(&Bson::Int32(42), 0), -944302157085130861);
        // 4, NumberLong(4) and 4.9 share a hash (numbers are squashed to 64-bit integers).
        let four = hashed_index_key(&Bson::Int32(4), 0);
        assert_eq!(hashed_index_key(&Bson::Int64(4), 0), four);
        assert_eq!(hashed_index_key(&Bson::Double(4.9), 0), four);
    }

    #[test]
    fn hashes_match_mongodb_hash_bson_element_with_seed_one() {
        let max = 1136124329541638701i64;
        let lowest = 5744114172487291558i64;
        let zero = 5574369198691456941i64;
        let cases: Vec<(Bson, i64)> = vec![
            (Bson::String("hashthis".into()), 6271151123721111923),
            (Bson::Double(2f64.powi(63)), lowest),
            (Bson::Double(2f64.powi(63) + 2f64.powi(11)), max),
            (Bson::Double(2f64.powi(500)), max),
            (Bson::Double(f64::INFINITY), max),
            (
                Bson::Double(2f64.powi(63) - 2f64.powi(10)),
                -3954856262017896439,
            ),
            (Bson::Double(-(2f64.powi(63))), lowest),
            (
                Bson::Double(-(2f64.powi(63) - 2f64.powi(10))),
                -1762411739488908479,
            ),
            (Bson::Double(-(2f64.powi(63) + 2f64.powi(11))), lowest),
            (Bson::Double(f64::NEG_INFINITY), lowest),
            (Bson::Double(0.0), zero),
            (Bson::Int64(0), zero),
            (Bson::Double(f64::NAN), zero),
            (
                Bson::Document(doc! {"a": 1.0, "b": 2.0}),
                -7076810813311352857,
            ),
            (
                Bson::Document(doc! {"a": 2f64.powi(63), "b": f64::NAN}),
                1223292051903137684,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(hashed_index_key(&value, 1), expected, "{value}");
        }
    }

    #[test]
    fn operators_evaluate() {
        let d = doc! {"a": 5, "s": "x", "o": {"k": [1, 2]}, "arr": [{"b": 1}, {"b": 2}, {}]};
        let t = |e: Bson| eval(e, &d).unwrap();
        assert_eq!(
            t(Bson::String("$arr.b".into())),
            Some(Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)]))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$add": [1, "$a", 2.5]})),
            Some(Bson::Double(8.5))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$subtract": ["$a", 7]})),
            Some(Bson::Int32(-2))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$multiply": [i32::MAX, 2]})),
            Some(Bson::Int64(i32::MAX as i64 * 2))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$mod": ["$a", 3]})),
            Some(Bson::Int32(2))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$abs": -3.5})),
            Some(Bson::Double(3.5))
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$concat": ["$s", "-", {"$toString": "$a"}]}
            )),
            Some(Bson::String("x-5".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$concat": ["$s", "$nope"]})),
            Some(Bson::Null)
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$cond": [{"$gt": ["$a", 4]}, "big", "small"]}
            )),
            Some(Bson::String("big".into()))
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$cond": {"if": {"$eq": ["$a", 4]}, "then": 1, "else": 0}}
            )),
            Some(Bson::Int32(0))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$ifNull": ["$nope", null, "d"]})),
            Some(Bson::String("d".into()))
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$and": [true, {"$not": [false]}, {"$or": [0, "$a"]}]}
            )),
            Some(Bson::Boolean(true))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$type": "$nope"})),
            Some(Bson::String("missing".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$type": "$o"})),
            Some(Bson::String("object".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$getField": "s"})),
            Some(Bson::String("x".into()))
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$getField": {"field": "k", "input": "$o"}}
            )),
            Some(Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)]))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$literal": "$a"})),
            Some(Bson::String("$a".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$eq": ["$nope", null]})),
            Some(Bson::Boolean(false))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$lt": ["$nope", null]})),
            Some(Bson::Boolean(true))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$toString": 2.5})),
            Some(Bson::String("2.5".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$toString": 1e20})),
            Some(Bson::String("1e+20".into()))
        );
        assert_eq!(
            t(Bson::Document(
                doc! {"$toString": DateTime::from_millis(86_400_123)}
            )),
            Some(Bson::String("1970-01-02T00:00:00.123Z".into()))
        );
        assert_eq!(
            t(Bson::Document(doc! {"$toHashedIndexKey": "$nope"})),
            Some(Bson::Int64(hashed_index_key(&Bson::Null, 0)))
        );
    }

    #[test]
    fn bad_expressions_are_refused_with_mongodb_codes() {
        let d = doc! {"s": "x"};
        let code = |e: Bson| eval(e, &d).unwrap_err().code;
        assert_eq!(code(Bson::Document(doc! {"$frobnicate": 1})), 168);
        assert_eq!(code(Bson::Document(doc! {"$eq": [1]})), 16020);
        assert_eq!(code(Bson::Document(doc! {"$eq": [1, 2], "x": 1})), 15983);
        assert_eq!(code(Bson::String("$$nope".into())), 17276);
        assert_eq!(code(Bson::String("$$KEEP".into())), 17276);
        assert_eq!(code(Bson::Document(doc! {"$concat": ["$s", 1]})), 16702);
        assert_eq!(code(Bson::Document(doc! {"$mod": [1, 0]})), 16610);
        assert_eq!(code(Bson::Document(doc! {"$add": ["$s", 1]})), 16554);
        assert_eq!(code(Bson::Document(doc! {"$toString": [[1]]})), 241);
        assert_eq!(code(Bson::Document(doc! {"$getField": "$s"})), 5654602);
        assert_eq!(code(Bson::Document(doc! {"$cond": {"if": true}})), 17081);
        assert_eq!(code(Bson::Document(doc! {"$ifNull": [1]})), 1257300);
        assert_eq!(code(Bson::String("$".into())), 16872);
    }
}
