//! Update operators, replacement documents, upsert seeds and update descriptions.

use bson::{Bson, Document, oid::ObjectId};

use crate::error::{CmdResult, CommandError};
use crate::values::{cmp_values, values_equal};

/// A parsed `u` argument of an update statement.
#[derive(Debug, Clone)]
pub enum UpdateSpec {
    Replacement(Document),
    Operators(Document),
}

const OPERATORS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$setOnInsert",
    "$min",
    "$max",
    "$mul",
    "$push",
    "$addToSet",
    "$pull",
    "$rename",
    "$currentDate",
];

pub fn parse_update(u: &Bson) -> CmdResult<UpdateSpec> {
    let Bson::Document(d) = u else {
        if matches!(u, Bson::Array(_)) {
            return Err(CommandError::new(
                72,
                "aggregation pipeline updates are not supported",
            ));
        }
        return Err(CommandError::failed_to_parse("update must be an object"));
    };
    let dollar = d.keys().filter(|k| k.starts_with('$')).count();
    if dollar == 0 {
        return Ok(UpdateSpec::Replacement(d.clone()));
    }
    if dollar != d.len() {
        return Err(CommandError::failed_to_parse(
            "update document mixes operators and plain fields",
        ));
    }
    let mut paths: Vec<String> = Vec::new();
    for (op, arg) in d {
        if !OPERATORS.contains(&op.as_str()) {
            return Err(CommandError::failed_to_parse(format!(
                "Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update"
            )));
        }
        let Bson::Document(fields) = arg else {
            return Err(CommandError::failed_to_parse(format!(
                "Modifiers operate on fields but we found type {} instead",
                type_name(arg)
            )));
        };
        for (path, _) in fields {
            if path.is_empty() || path.split('.').any(|p| p.is_empty()) {
                return Err(CommandError::new(
                    56,
                    format!("empty field name in path '{path}'"),
                ));
            }
            for p in &paths {
                if conflicts(p, path) {
                    return Err(CommandError::new(
                        40,
                        format!("Updating the path '{path}' would create a conflict at '{p}'"),
                    ));
                }
            }
            paths.push(path.clone());
            if op == "$rename"
                && let Bson::String(to) = &fields.get(path).cloned().unwrap_or(Bson::Null)
            {
                paths.push(to.clone());
            }
        }
    }
    Ok(UpdateSpec::Operators(d.clone()))
}

fn conflicts(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
}

fn type_name(b: &Bson) -> &'static str {
    match b {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Array(_) => "array",
        Bson::Document(_) => "object",
        Bson::Boolean(_) => "bool",
        Bson::Null => "null",
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        _ => "other",
    }
}

/// Applies `spec` to `doc`. `is_insert` enables `$setOnInsert`.
pub fn apply_update(doc: &mut Document, spec: &UpdateSpec, is_insert: bool) -> CmdResult<()> {
    let old_id = doc.get("_id").cloned();
    match spec {
        UpdateSpec::Replacement(r) => {
            let mut next = Document::new();
            if let Some(id) = &old_id {
                next.insert("_id", id.clone());
            }
            for (k, v) in r {
                if k == "_id"
                    && let Some(id) = &old_id
                {
                    if !values_equal(id, v) {
                        return Err(immutable_id());
                    }
                    continue;
                }
                next.insert(k.clone(), v.clone());
            }
            *doc = next;
        }
        UpdateSpec::Operators(ops) => {
            for (op, arg) in ops {
                let Bson::Document(fields) = arg else {
                    continue;
                };
                for (path, value) in fields {
                    apply_operator(doc, op, path, value, is_insert)?;
                }
            }
            if let Some(id) = &old_id
                && !doc
                    .get("_id")
                    .is_some_and(|n| values_equal(n, id) && n == id)
            {
                return Err(immutable_id());
            }
        }
    }
    Ok(())
}

fn immutable_id() -> CommandError {
    CommandError::new(
        66,
        "Performing an update on the path '_id' would modify the immutable field '_id'",
    )
}

fn apply_operator(
    doc: &mut Document,
    op: &str,
    path: &str,
    value: &Bson,
    is_insert: bool,
) -> CmdResult<()> {
    match op {
        "$set" => set_path(doc, path, value.clone()),
        "$setOnInsert" => {
            if is_insert {
                set_path(doc, path, value.clone())
            } else {
                Ok(())
            }
        }
        "$unset" => {
            unset_path(doc, path);
            Ok(())
        }
        "$inc" | "$mul" => {
            if crate::values::as_f64(value).is_none() {
                return Err(CommandError::type_mismatch(format!(
                    "Cannot {} with non-numeric argument: {{{path}: {value}}}",
                    if op == "$inc" {
                        "increment"
                    } else {
                        "multiply"
                    }
                )));
            }
            let current = crate::values::get_path(doc, path).cloned();
            let next = match current {
                None => {
                    if op == "$inc" {
                        value.clone()
                    } else {
                        arith(
                            &Bson::Int32(0),
                            value,
                            |a, b| a.checked_mul(b),
                            |a, b| a * b,
                        )
                    }
                }
                Some(c) if crate::values::as_f64(&c).is_some() => {
                    if op == "$inc" {
                        arith(&c, value, |a, b| a.checked_add(b), |a, b| a + b)
                    } else {
                        arith(&c, value, |a, b| a.checked_mul(b), |a, b| a * b)
                    }
                }
                Some(_) => {
                    return Err(CommandError::type_mismatch(format!(
                        "Cannot apply {op} to a value of non-numeric type. {{_id: ...}} has the field '{path}' of non-numeric type"
                    )));
                }
            };
            set_path(doc, path, next)
        }
        "$min" | "$max" => {
            let current = crate::values::get_path(doc, path).cloned();
            let replace = match current {
                None => true,
                Some(c) => {
                    let o = cmp_values(value, &c);
                    if op == "$min" { o.is_lt() } else { o.is_gt() }
                }
            };
            if replace {
                set_path(doc, path, value.clone())
            } else {
                Ok(())
            }
        }
        "$currentDate" => set_path(doc, path, Bson::DateTime(bson::DateTime::now())),
        "$push" | "$addToSet" => {
            let items: Vec<Bson> = match value {
                Bson::Document(d) if d.contains_key("$each") => match d.get("$each") {
                    Some(Bson::Array(a)) => a.clone(),
                    _ => return Err(CommandError::bad_value("$each needs an array")),
                },
                other => vec![other.clone()],
            };
            let mut arr = match crate::values::get_path(doc, path) {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(_) => {
                    return Err(CommandError::bad_value(format!(
                        "The field '{path}' must be an array but is of another type"
                    )));
                }
            };
            for item in items {
                if op == "$push" || !arr.iter().any(|x| values_equal(x, &item)) {
                    arr.push(item);
                }
            }
            if op == "$push"
                && let Bson::Document(d) = value
                && let Some(slice) = d.get("$slice")
            {
                slice_array(&mut arr, slice)?;
            }
            set_path(doc, path, Bson::Array(arr))
        }
        "$pull" => {
            if let Some(Bson::Array(a)) = crate::values::get_path(doc, path) {
                let kept: Vec<Bson> = a
                    .iter()
                    .filter(|x| match value {
                        Bson::Document(cond) => match x {
                            Bson::Document(d) => !crate::matcher::matches(d, cond).unwrap_or(false),
                            other => !crate::matcher::matches(
                                &bson::doc! {"v": (*other).clone()},
                                &bson::doc! {"v": Bson::Document(cond.clone())},
                            )
                            .unwrap_or(false),
                        },
                        v => !values_equal(x, v),
                    })
                    .cloned()
                    .collect();
                set_path(doc, path, Bson::Array(kept))?;
            }
            Ok(())
        }
        "$rename" => {
            let Bson::String(to) = value else {
                return Err(CommandError::bad_value("$rename target must be a string"));
            };
            if let Some(v) = crate::values::get_path(doc, path).cloned() {
                unset_path(doc, path);
                set_path(doc, to, v)?;
            }
            Ok(())
        }
        other => Err(CommandError::failed_to_parse(format!(
            "Unknown modifier: {other}"
        ))),
    }
}

fn arith(
    a: &Bson,
    b: &Bson,
    int_op: fn(i64, i64) -> Option<i64>,
    float_op: fn(f64, f64) -> f64,
) -> Bson {
    let int = |x: &Bson| match x {
        Bson::Int32(i) => Some((*i as i64, false)),
        Bson::Int64(i) => Some((*i, true)),
        _ => None,
    };
    match (int(a), int(b)) {
        (Some((x, xl)), Some((y, yl))) => match int_op(x, y) {
            Some(r) if !xl && !yl && i32::try_from(r).is_ok() => Bson::Int32(r as i32),
            Some(r) => Bson::Int64(r),
            None => Bson::Double(float_op(x as f64, y as f64)),
        },
        _ => Bson::Double(float_op(
            crate::values::as_f64(a).unwrap_or(0.0),
            crate::values::as_f64(b).unwrap_or(0.0),
        )),
    }
}

/// Sets a dotted path, creating embedded documents (or padding arrays) on the way.
pub fn set_path(doc: &mut Document, path: &str, value: Bson) -> CmdResult<()> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.len() > crate::wire::MAX_NESTING {
        return Err(CommandError::bad_value(format!(
            "path has more than {} parts",
            crate::wire::MAX_NESTING
        )));
    }
    set_in_doc(doc, &parts, value, path)
}

fn not_viable(path: &str) -> CommandError {
    CommandError::new(
        28,
        format!("Cannot create field in element along path '{path}'"),
    )
}

fn set_in_doc(doc: &mut Document, parts: &[&str], value: Bson, full: &str) -> CmdResult<()> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(());
    };
    if rest.is_empty() {
        doc.insert(first.to_string(), value);
        return Ok(());
    }
    if !doc.contains_key(*first) {
        doc.insert(first.to_string(), Bson::Document(Document::new()));
    }
    match doc.get_mut(*first) {
        Some(child) => set_in_value(child, rest, value, full),
        None => Err(not_viable(full)),
    }
}

fn set_in_value(target: &mut Bson, parts: &[&str], value: Bson, full: &str) -> CmdResult<()> {
    match target {
        Bson::Document(d) => set_in_doc(d, parts, value, full),
        Bson::Array(a) => {
            let idx: usize = parts[0].parse().map_err(|_| not_viable(full))?;
            if idx > 1_000_000 {
                return Err(not_viable(full));
            }
            while a.len() <= idx {
                a.push(Bson::Null);
            }
            if parts.len() == 1 {
                a[idx] = value;
                Ok(())
            } else {
                if matches!(a[idx], Bson::Null) {
                    a[idx] = Bson::Document(Document::new());
                }
                set_in_value(&mut a[idx], &parts[1..], value, full)
            }
        }
        _ => Err(not_viable(full)),
    }
}

/// Removes a dotted path if present.
pub fn unset_path(doc: &mut Document, path: &str) {
    let parts: Vec<&str> = path.split('.').collect();
    unset_in_doc(doc, &parts);
}

fn unset_in_doc(doc: &mut Document, parts: &[&str]) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    if rest.is_empty() {
        doc.remove(*first);
        return;
    }
    match doc.get_mut(*first) {
        Some(Bson::Document(d)) => unset_in_doc(d, rest),
        Some(Bson::Array(a)) => {
            if let Ok(i) = rest[0].parse::<usize>() {
                if rest.len() == 1 {
                    if i < a.len() {
                        a[i] = Bson::Null;
                    }
                } else if let Some(Bson::Document(d)) = a.get_mut(i) {
                    unset_in_doc(d, &rest[1..]);
                }
            }
        }
        _ => {}
    }
}

/// The document an upsert starts from: the filter's equality conditions.
pub fn upsert_seed(filter: &Document) -> Document {
    let mut out = Document::new();
    seed_from(filter, &mut out);
    out
}

fn seed_from(filter: &Document, out: &mut Document) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        seed_from(d, out);
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let value = match v {
            Bson::Document(d) if d.keys().next().is_some_and(|x| x.starts_with('$')) => {
                match d.get("$eq") {
                    Some(eq) => eq.clone(),
                    None => continue,
                }
            }
            other => other.clone(),
        };
        let _ = set_path(out, k, value);
    }
}

/// Builds the document an upsert inserts, with `_id` first.
pub fn build_upsert(filter: &Document, spec: &UpdateSpec) -> CmdResult<Document> {
    let seed = upsert_seed(filter);
    let mut doc = match spec {
        UpdateSpec::Replacement(r) => {
            let mut d = Document::new();
            if let Some(id) = seed.get("_id") {
                d.insert("_id", id.clone());
            }
            for (k, v) in r {
                d.insert(k.clone(), v.clone());
            }
            d
        }
        UpdateSpec::Operators(_) => {
            let mut d = seed;
            apply_update(&mut d, spec, true)?;
            d
        }
    };
    let id = doc
        .remove("_id")
        .unwrap_or_else(|| Bson::ObjectId(ObjectId::new()));
    let mut out = Document::new();
    out.insert("_id", id);
    for (k, v) in doc {
        out.insert(k, v);
    }
    Ok(out)
}

/// The `updateDescription` of a change from `old` to `new`: updated paths and removed paths.
pub fn describe_update(old: &Document, new: &Document) -> (Document, Vec<String>) {
    let (updated, removed, _) = describe_update_with_paths(old, new);
    (updated, removed)
}

/// Like [`describe_update`], plus `disambiguatedPaths`: for each reported path with a
/// component that contains a dot or is all digits, the path's components.
pub fn describe_update_with_paths(
    old: &Document,
    new: &Document,
) -> (Document, Vec<String>, Document) {
    let mut out = Diff::default();
    diff_docs(old, new, &mut Vec::new(), &mut out);
    (out.updated, out.removed, out.disambiguated)
}

#[derive(Default)]
struct Diff {
    updated: Document,
    removed: Vec<String>,
    disambiguated: Document,
}

impl Diff {
    fn note(&mut self, parts: &[&str]) -> String {
        let path = parts.join(".");
        let ambiguous = parts
            .iter()
            .any(|p| p.contains('.') || (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())));
        if ambiguous {
            self.disambiguated.insert(
                path.clone(),
                parts
                    .iter()
                    .map(|p| Bson::String(p.to_string()))
                    .collect::<Vec<_>>(),
            );
        }
        path
    }
}

fn diff_docs<'a>(old: &'a Document, new: &'a Document, prefix: &mut Vec<&'a str>, out: &mut Diff) {
    for (k, nv) in new {
        prefix.push(k);
        match old.get(k) {
            Some(ov) if ov == nv => {}
            Some(Bson::Document(od)) => {
                if let Bson::Document(nd) = nv {
                    diff_docs(od, nd, prefix, out);
                } else {
                    let path = out.note(prefix);
                    out.updated.insert(path, nv.clone());
                }
            }
            _ => {
                let path = out.note(prefix);
                out.updated.insert(path, nv.clone());
            }
        }
        prefix.pop();
    }
    for (k, _) in old {
        if !new.contains_key(k) {
            prefix.push(k);
            let path = out.note(prefix);
            out.removed.push(path);
            prefix.pop();
        }
    }
}

/// `$push`'s `$slice`: keep the first `n` items (`n >= 0`) or the last `-n`.
fn slice_array(items: &mut Vec<Bson>, slice: &Bson) -> CmdResult<()> {
    let n = match slice {
        Bson::Int32(n) => i64::from(*n),
        Bson::Int64(n) => *n,
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 1e15 => *f as i64,
        _ => {
            return Err(CommandError::bad_value(
                "The value for $slice must be an integer value",
            ));
        }
    };
    let len = items.len();
    let keep = usize::try_from(n.unsigned_abs())
        .unwrap_or(usize::MAX)
        .min(len);
    if n >= 0 {
        items.truncate(keep);
    } else {
        items.drain(..len - keep);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn upd(d: Document, u: Document) -> Document {
        let mut d = d;
        apply_update(&mut d, &parse_update(&Bson::Document(u)).unwrap(), false).unwrap();
        d
    }

    #[test]
    fn operators_apply() {
        assert_eq!(
            upd(doc! {"_id": 1}, doc! {"$set": {"a.b": 2}}),
            doc! {"_id": 1, "a": {"b": 2}}
        );
        assert_eq!(
            upd(doc! {"_id": 1, "n": 1}, doc! {"$inc": {"n": 2}}),
            doc! {"_id": 1, "n": 3}
        );
        assert_eq!(
            upd(doc! {"_id": 1, "n": 1}, doc! {"$unset": {"n": ""}}),
            doc! {"_id": 1}
        );
        assert_eq!(
            upd(doc! {"_id": 1, "n": 1}, doc! {"x": 5}),
            doc! {"_id": 1, "x": 5}
        );
        assert_eq!(
            upd(doc! {"_id": 1}, doc! {"$setOnInsert": {"x": 5}}),
            doc! {"_id": 1}
        );
    }

    #[test]
    fn push_slices_to_the_first_or_last_items() {
        let push = |slice: Bson| {
            upd(
                doc! {"_id": 1, "a": [1, 2, 3]},
                doc! {"$push": {"a": {"$each": [4, 5], "$slice": slice}}},
            )
        };
        assert_eq!(push(Bson::Int32(-2)), doc! {"_id": 1, "a": [4, 5]});
        assert_eq!(push(Bson::Int64(2)), doc! {"_id": 1, "a": [1, 2]});
        assert_eq!(
            push(Bson::Int32(-10)),
            doc! {"_id": 1, "a": [1, 2, 3, 4, 5]}
        );
        assert_eq!(push(Bson::Int32(0)), doc! {"_id": 1, "a": []});
        let spec = parse_update(&Bson::Document(
            doc! {"$push": {"a": {"$each": [1], "$slice": "x"}}},
        ))
        .unwrap();
        assert!(apply_update(&mut doc! {"_id": 1}, &spec, false).is_err());
    }

    #[test]
    fn conflicts_and_immutable_id() {
        assert!(parse_update(&Bson::Document(doc! {"$set": {"a": 1}, "$inc": {"a": 1}})).is_err());
        let mut d = doc! {"_id": 1};
        let spec = parse_update(&Bson::Document(doc! {"$set": {"_id": 2}})).unwrap();
        assert_eq!(apply_update(&mut d, &spec, false).unwrap_err().code, 66);
    }

    #[test]
    fn upsert_and_diff() {
        let spec = parse_update(&Bson::Document(doc! {"$setOnInsert": {"t": null}})).unwrap();
        let d = build_upsert(&doc! {"_id": "c", "s": "x"}, &spec).unwrap();
        assert_eq!(d, doc! {"_id": "c", "s": "x", "t": null});
        let (u, r) = describe_update(
            &doc! {"_id": 1, "a": {"b": 1}, "c": 1},
            &doc! {"_id": 1, "a": {"b": 2}},
        );
        assert_eq!(u, doc! {"a.b": 2});
        assert_eq!(r, vec!["c".to_string()]);
    }
}
