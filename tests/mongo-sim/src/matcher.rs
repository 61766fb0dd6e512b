//! Query filter semantics: equality on top-level and dotted paths with MongoDB's array,
//! embedded-document and `null` rules, plus the common comparison and logical operators.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};
use crate::values::{cmp_values, type_rank, values_equal};

/// Does `doc` match `filter`?
pub fn matches(doc: &Document, filter: &Document) -> CmdResult<bool> {
    for (key, cond) in filter {
        if !match_clause(doc, key, cond)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks the filter's operators without evaluating it.
pub fn validate(filter: &Document) -> CmdResult<()> {
    matches(&Document::new(), filter).map(|_| ())
}

fn logical_list<'a>(op: &str, v: &'a Bson) -> CmdResult<&'a Vec<Bson>> {
    match v {
        Bson::Array(a) if !a.is_empty() => Ok(a),
        _ => Err(CommandError::bad_value(format!(
            "{op} must be a nonempty array"
        ))),
    }
}

fn sub_filters(op: &str, v: &Bson) -> CmdResult<Vec<Document>> {
    logical_list(op, v)?
        .iter()
        .map(|b| match b {
            Bson::Document(d) => Ok(d.clone()),
            _ => Err(CommandError::bad_value(format!(
                "{op} argument's entries must be objects"
            ))),
        })
        .collect()
}

fn match_clause(doc: &Document, key: &str, cond: &Bson) -> CmdResult<bool> {
    if let Some(op) = key.strip_prefix('$') {
        return match op {
            "and" => {
                let mut all = true;
                for f in sub_filters(key, cond)? {
                    all &= matches(doc, &f)?;
                }
                Ok(all)
            }
            "or" => {
                let mut any = false;
                for f in sub_filters(key, cond)? {
                    any |= matches(doc, &f)?;
                }
                Ok(any)
            }
            "nor" => {
                let mut any = false;
                for f in sub_filters(key, cond)? {
                    any |= matches(doc, &f)?;
                }
                Ok(!any)
            }
            "comment" => Ok(true),
            // An aggregation expression over the document, true when its value is truthy.
            "expr" => {
                let expr = crate::expression::Expr::parse(cond, Default::default())?;
                let value = expr.evaluate(crate::expression::Scope::of(doc))?;
                Ok(crate::expression::truthy(&value))
            }
            _ => Err(CommandError::bad_value(format!(
                "unknown top level operator: {key}"
            ))),
        };
    }
    let candidates = resolve(doc, key);
    match cond {
        Bson::Document(ops) if is_operator_doc(ops) => match_operators(&candidates, ops),
        value => Ok(eq_any(&candidates, value)),
    }
}

fn is_operator_doc(d: &Document) -> bool {
    d.keys().next().is_some_and(|k| k.starts_with('$'))
}

/// Every value a dotted path reaches, descending through arrays; `None` marks a missing path.
pub fn resolve<'a>(doc: &'a Document, path: &str) -> Vec<Option<&'a Bson>> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    resolve_in_doc(doc, &parts, &mut out);
    out
}

fn resolve_in_doc<'a>(doc: &'a Document, parts: &[&str], out: &mut Vec<Option<&'a Bson>>) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    match doc.get(*first) {
        None => out.push(None),
        Some(v) => resolve_in_value(v, rest, out),
    }
}

fn resolve_in_value<'a>(v: &'a Bson, rest: &[&str], out: &mut Vec<Option<&'a Bson>>) {
    if rest.is_empty() {
        out.push(Some(v));
        return;
    }
    match v {
        Bson::Document(d) => resolve_in_doc(d, rest, out),
        Bson::Array(items) => {
            let before = out.len();
            if let Ok(i) = rest[0].parse::<usize>()
                && let Some(item) = items.get(i)
            {
                resolve_in_value(item, &rest[1..], out);
            }
            for item in items {
                if let Bson::Document(d) = item {
                    resolve_in_doc(d, rest, out);
                }
            }
            if out.len() == before {
                out.push(None);
            }
        }
        _ => out.push(None),
    }
}

/// Equality as `{path: value}` applies it: whole value, array element, or null-for-missing.
fn eq_one(candidate: Option<&Bson>, value: &Bson) -> bool {
    match candidate {
        None => matches!(value, Bson::Null),
        Some(c) => {
            if values_equal(c, value)
                || (matches!(value, Bson::Null) && matches!(c, Bson::Undefined))
            {
                return true;
            }
            if let Bson::Array(items) = c {
                return items.iter().any(|i| values_equal(i, value));
            }
            false
        }
    }
}

fn eq_any(candidates: &[Option<&Bson>], value: &Bson) -> bool {
    candidates.iter().any(|c| eq_one(*c, value))
}

fn cmp_one(candidate: Option<&Bson>, value: &Bson, want: &dyn Fn(Ordering) -> bool) -> bool {
    let check = |c: &Bson| {
        // Comparisons only hold within one type class (null compares with missing).
        type_rank(c) == type_rank(value) && want(cmp_values(c, value))
    };
    match candidate {
        None => matches!(value, Bson::Null) && want(Ordering::Equal),
        Some(c) => {
            if check(c) {
                return true;
            }
            if let Bson::Array(items) = c {
                return items.iter().any(check);
            }
            false
        }
    }
}

fn in_list<'a>(op: &str, v: &'a Bson) -> CmdResult<&'a Vec<Bson>> {
    match v {
        Bson::Array(a) => Ok(a),
        _ => Err(CommandError::bad_value(format!("{op} needs an array"))),
    }
}

fn match_operators(candidates: &[Option<&Bson>], ops: &Document) -> CmdResult<bool> {
    for (op, arg) in ops {
        let ok = match op.as_str() {
            "$eq" => eq_any(candidates, arg),
            "$ne" => !eq_any(candidates, arg),
            "$in" => {
                let list = in_list(op, arg)?;
                list.iter().any(|v| eq_any(candidates, v))
            }
            "$nin" => {
                let list = in_list(op, arg)?;
                !list.iter().any(|v| eq_any(candidates, v))
            }
            "$exists" => {
                let want = match arg {
                    Bson::Boolean(b) => *b,
                    other => crate::values::as_f64(other).is_none_or(|n| n != 0.0),
                };
                let present = candidates.iter().any(|c| c.is_some());
                present == want
            }
            "$gt" => candidates
                .iter()
                .any(|c| cmp_one(*c, arg, &|o| o == Ordering::Greater)),
            "$gte" => candidates
                .iter()
                .any(|c| cmp_one(*c, arg, &|o| o != Ordering::Less)),
            "$lt" => candidates
                .iter()
                .any(|c| cmp_one(*c, arg, &|o| o == Ordering::Less)),
            "$lte" => candidates
                .iter()
                .any(|c| cmp_one(*c, arg, &|o| o != Ordering::Greater)),
            "$not" => match arg {
                Bson::Document(inner) if is_operator_doc(inner) => {
                    !match_operators(candidates, inner)?
                }
                _ => {
                    return Err(CommandError::bad_value(
                        "$not needs a document of operators",
                    ));
                }
            },
            "$size" => {
                let n = crate::values::as_f64(arg)
                    .ok_or_else(|| CommandError::bad_value("$size needs a number"))?;
                candidates
                    .iter()
                    .any(|c| matches!(c, Some(Bson::Array(a)) if a.len() as f64 == n))
            }
            "$all" => {
                let list = in_list(op, arg)?;
                !list.is_empty() && list.iter().all(|v| eq_any(candidates, v))
            }
            "$elemMatch" => {
                let Bson::Document(sub) = arg else {
                    return Err(CommandError::bad_value("$elemMatch needs an Object"));
                };
                candidates.iter().any(|c| match c {
                    Some(Bson::Array(items)) => items.iter().any(|item| {
                        if is_operator_doc(sub) {
                            match_operators(&[Some(item)], sub).unwrap_or(false)
                        } else if let Bson::Document(d) = item {
                            matches(d, sub).unwrap_or(false)
                        } else {
                            false
                        }
                    }),
                    _ => false,
                })
            }
            "$type" => {
                let names: Vec<&Bson> = match arg {
                    Bson::Array(a) => a.iter().collect(),
                    other => vec![other],
                };
                candidates
                    .iter()
                    .flatten()
                    .any(|c| names.iter().any(|n| type_matches(c, n)))
            }
            "$comment" | "$options" => true,
            other => {
                return Err(CommandError::bad_value(format!(
                    "unknown operator: {other}"
                )));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `v` is of the type `name` names: MongoDB's alias (`"minKey"`, `"number"`, …) or its
/// type number (`-1` for MinKey, `127` for MaxKey).
fn type_matches(v: &Bson, name: &Bson) -> bool {
    let number = match v {
        Bson::Double(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        Bson::Binary(_) => 5,
        Bson::Undefined => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Null => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::Symbol(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::Int32(_) => 16,
        Bson::Timestamp(_) => 17,
        Bson::Int64(_) => 18,
        Bson::Decimal128(_) => 19,
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
    };
    match name {
        Bson::String(s) => {
            s == crate::expression::type_name(Some(v)) || (s == "number" && type_rank(v) == 3)
        }
        other => crate::values::as_f64(other).is_some_and(|n| n == f64::from(number)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn m(d: Document, f: Document) -> bool {
        matches(&d, &f).unwrap()
    }

    #[test]
    fn type_matches_min_key_and_max_key_by_alias_and_number() {
        let min = doc! {"_id": Bson::MinKey};
        let max = doc! {"_id": Bson::MaxKey};
        let one = doc! {"_id": 1};
        for (filter, expected) in [
            (doc! {"_id": {"$type": "minKey"}}, [true, false, false]),
            (doc! {"_id": {"$type": "maxKey"}}, [false, true, false]),
            (doc! {"_id": {"$type": -1}}, [true, false, false]),
            (doc! {"_id": {"$type": 127}}, [false, true, false]),
            (doc! {"_id": {"$type": -1.0}}, [true, false, false]),
            (
                doc! {"_id": {"$type": ["minKey", "maxKey"]}},
                [true, true, false],
            ),
            (doc! {"_id": {"$type": "number"}}, [false, false, true]),
            (doc! {"_id": {"$type": 16}}, [false, false, true]),
        ] {
            let got = [
                m(min.clone(), filter.clone()),
                m(max.clone(), filter.clone()),
                m(one.clone(), filter.clone()),
            ];
            assert_eq!(got, expected, "{filter}");
        }
        // The other aliases of MongoDB's table.
        for (value, alias) in [
            (Bson::Symbol("s".into()), "symbol"),
            (Bson::Undefined, "undefined"),
            (Bson::JavaScriptCode("1".into()), "javascript"),
        ] {
            assert!(
                m(doc! {"a": value}, doc! {"a": {"$type": alias}}),
                "{alias}"
            );
        }
    }

    #[test]
    fn equality_and_null() {
        assert!(m(doc! {"a": 1}, doc! {"a": 1.0}));
        assert!(m(doc! {"a": null}, doc! {"a": null}));
        assert!(m(doc! {}, doc! {"a": null}));
        assert!(!m(doc! {"a": 0}, doc! {"a": null}));
        assert!(m(doc! {"a": {"b": 2}}, doc! {"a.b": 2}));
        assert!(m(doc! {"a": [{"b": 1}, {"b": 2}]}, doc! {"a.b": 2}));
        assert!(m(doc! {"a": [1, 2, 3]}, doc! {"a": 2}));
        assert!(m(
            doc! {"a": {"b": 1, "c": 2}},
            doc! {"a": {"b": 1, "c": 2}}
        ));
        assert!(!m(
            doc! {"a": {"b": 1, "c": 2}},
            doc! {"a": {"c": 2, "b": 1}}
        ));
        assert!(m(
            doc! {"tok": null, "s": "x"},
            doc! {"tok": null, "s": "x"}
        ));
    }

    #[test]
    fn operators() {
        assert!(m(doc! {"a": 3}, doc! {"a": {"$in": [1, 3]}}));
        assert!(m(doc! {}, doc! {"a": {"$exists": false}}));
        assert!(!m(doc! {"a": null}, doc! {"a": {"$exists": false}}));
        assert!(m(doc! {"a": 5}, doc! {"a": {"$gt": 4, "$lt": 6}}));
        assert!(m(doc! {"a": 5}, doc! {"$or": [{"a": 1}, {"a": 5}]}));
        assert!(matches(&doc! {}, &doc! {"a": {"$bogus": 1}}).is_err());
        // `$expr`: an aggregation expression, truthy or not.
        assert!(m(
            doc! {"a": 5, "b": 3},
            doc! {"$expr": {"$gt": ["$a", "$b"]}}
        ));
        assert!(!m(
            doc! {"a": 1, "b": 3},
            doc! {"$expr": {"$gt": ["$a", "$b"]}}
        ));
        assert!(m(
            doc! {"k": {"_id": "string to hash"}},
            doc! {"$expr": {"$eq": [{"$toHashedIndexKey": "$k._id"}, 763_543_691_661_428_748_i64]}}
        ));
        assert!(matches(&doc! {}, &doc! {"$expr": {"$bogus": 1}}).is_err());
    }
}
