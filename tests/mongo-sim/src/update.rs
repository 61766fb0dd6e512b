//! Update operators, replacement documents, pipeline-style updates, upsert seeds and update
//! descriptions.

use bson::{Bson, Document, oid::ObjectId};

use crate::error::{CmdResult, CommandError};
use crate::values::{cmp_values, values_equal};

/// A parsed `u` argument of an update statement.
#[derive(Debug, Clone)]
pub enum UpdateSpec {
    Replacement(Document),
    Operators(Document),
    /// An aggregation pipeline of `$set` / `$addFields`, `$unset`, `$replaceRoot` /
    /// `$replaceWith` stages.
    Pipeline(Vec<Document>),
}

/// The stages a pipeline-style update may use here.
const PIPELINE_STAGES: &[&str] = &[
    "$set",
    "$addFields",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

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
        if let Bson::Array(stages) = u {
            return parse_pipeline(stages);
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

fn parse_pipeline(stages: &[Bson]) -> CmdResult<UpdateSpec> {
    let mut out = Vec::with_capacity(stages.len());
    for stage in stages {
        let Bson::Document(stage) = stage else {
            return Err(CommandError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        let mut keys = stage.keys();
        let (Some(name), None) = (keys.next(), keys.next()) else {
            return Err(CommandError::new(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        if !PIPELINE_STAGES.contains(&name.as_str()) {
            return Err(CommandError::new(
                72,
                format!("{name} is not allowed to be used within an update"),
            ));
        }
        out.push(stage.clone());
    }
    Ok(UpdateSpec::Pipeline(out))
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
        UpdateSpec::Pipeline(stages) => {
            for stage in stages {
                apply_stage(doc, stage)?;
            }
            if let Some(id) = &old_id
                && !doc
                    .get("_id")
                    .is_some_and(|n| values_equal(n, id) && n == id)
            {
                return Err(immutable_id());
            }
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

/// Applies one stage of a pipeline-style update.
fn apply_stage(doc: &mut Document, stage: &Document) -> CmdResult<()> {
    let Some((name, arg)) = stage.iter().next() else {
        return Ok(());
    };
    match name.as_str() {
        "$set" | "$addFields" => {
            let Bson::Document(fields) = arg else {
                return Err(CommandError::failed_to_parse(format!(
                    "{name} specification stage must be an object"
                )));
            };
            let root = doc.clone();
            for (path, expr) in fields {
                add_field(doc, &root, path, expr)?;
            }
        }
        "$unset" => {
            let paths: Vec<&Bson> = match arg {
                Bson::Array(a) => a.iter().collect(),
                other => vec![other],
            };
            for p in paths {
                let Bson::String(p) = p else {
                    return Err(CommandError::failed_to_parse(
                        "$unset specification must be a string or an array of strings",
                    ));
                };
                unset_path(doc, p);
            }
        }
        "$replaceRoot" | "$replaceWith" => {
            let expr = if name == "$replaceRoot" {
                match arg {
                    Bson::Document(d) => d.get("newRoot").ok_or_else(|| {
                        CommandError::new(40231, "no newRoot specified for the $replaceRoot stage")
                    })?,
                    _ => {
                        return Err(CommandError::failed_to_parse(
                            "$replaceRoot expects an object",
                        ));
                    }
                }
            } else {
                arg
            };
            match evaluate(doc, expr)? {
                Some(Bson::Document(d)) => *doc = d,
                _ => {
                    return Err(CommandError::new(
                        40228,
                        "'replacement document' must evaluate to an object",
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `$set` / `$addFields` of one field: an object of plain fields merges into an embedded
/// document already there; a value that evaluates to nothing (a missing path, `$$REMOVE`)
/// removes the field.
fn add_field(doc: &mut Document, root: &Document, path: &str, expr: &Bson) -> CmdResult<()> {
    if let Bson::Document(spec) = expr
        && !is_operator(spec)
        && let Some(Bson::Document(existing)) = crate::values::get_path(doc, path)
    {
        let mut merged = existing.clone();
        for (k, e) in spec {
            add_field(&mut merged, root, k, e)?;
        }
        return set_path(doc, path, Bson::Document(merged));
    }
    match evaluate(root, expr)? {
        Some(v) => set_path(doc, path, v),
        None => {
            unset_path(doc, path);
            Ok(())
        }
    }
}

fn is_operator(d: &Document) -> bool {
    d.keys().next().is_some_and(|k| k.starts_with('$'))
}

/// Evaluates an aggregation expression against `root`: field paths (`"$a.b"`), `$$ROOT`,
/// `$$CURRENT`, `$$REMOVE`, `$literal`, objects and arrays of expressions, and constants.
/// `None` is a missing value.
fn evaluate(root: &Document, expr: &Bson) -> CmdResult<Option<Bson>> {
    match expr {
        Bson::String(s) if s.starts_with("$$") => {
            let (var, path) = match s[2..].split_once('.') {
                Some((v, p)) => (v, Some(p)),
                None => (&s[2..], None),
            };
            match (var, path) {
                ("ROOT" | "CURRENT", None) => Ok(Some(Bson::Document(root.clone()))),
                ("ROOT" | "CURRENT", Some(p)) => Ok(crate::values::get_path(root, p).cloned()),
                ("REMOVE", _) => Ok(None),
                _ => Err(CommandError::new(
                    17276,
                    format!("Use of undefined variable: {var}"),
                )),
            }
        }
        Bson::String(s) if s.starts_with('$') => {
            Ok(crate::values::get_path(root, &s[1..]).cloned())
        }
        Bson::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(evaluate(root, item)?.unwrap_or(Bson::Null));
            }
            Ok(Some(Bson::Array(out)))
        }
        Bson::Document(d) if is_operator(d) => {
            if d.len() != 1 {
                return Err(CommandError::new(
                    15983,
                    "An object representing an expression must have exactly one field",
                ));
            }
            match d.iter().next() {
                Some((op, arg)) if op == "$literal" => Ok(Some(arg.clone())),
                Some((op, _)) => Err(CommandError::new(
                    168,
                    format!("Unrecognized expression '{op}'"),
                )),
                None => Ok(None),
            }
        }
        Bson::Document(d) => {
            let mut out = Document::new();
            for (k, e) in d {
                if let Some(v) = evaluate(root, e)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        other => Ok(Some(other.clone())),
    }
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
        UpdateSpec::Operators(_) | UpdateSpec::Pipeline(_) => {
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
    let mut updated = Document::new();
    let mut removed = Vec::new();
    diff_docs(old, new, "", &mut updated, &mut removed);
    (updated, removed)
}

fn diff_docs(
    old: &Document,
    new: &Document,
    prefix: &str,
    updated: &mut Document,
    removed: &mut Vec<String>,
) {
    for (k, nv) in new {
        let path = format!("{prefix}{k}");
        match old.get(k) {
            Some(ov) if ov == nv => {}
            Some(Bson::Document(od)) => {
                if let Bson::Document(nd) = nv {
                    diff_docs(od, nd, &format!("{path}."), updated, removed);
                } else {
                    updated.insert(path, nv.clone());
                }
            }
            _ => {
                updated.insert(path, nv.clone());
            }
        }
    }
    for (k, _) in old {
        if !new.contains_key(k) {
            removed.push(format!("{prefix}{k}"));
        }
    }
}

/// The `updateDescription` of a pipeline-style update, from the difference of the documents as
/// a server logs it: changed or added paths (array elements by index), removed fields, and the
/// arrays that became shorter with their new sizes (`{field, newSize}`).
pub fn describe_pipeline_update(
    old: &Document,
    new: &Document,
) -> (Document, Vec<String>, Vec<Document>) {
    let mut diff = Diff::default();
    diff.documents(old, new, "");
    (diff.updated, diff.removed, diff.truncated)
}

#[derive(Default)]
struct Diff {
    updated: Document,
    removed: Vec<String>,
    truncated: Vec<Document>,
}

impl Diff {
    fn documents(&mut self, old: &Document, new: &Document, prefix: &str) {
        for (k, nv) in new {
            let path = format!("{prefix}{k}");
            match old.get(k) {
                Some(ov) => self.value(ov, nv, path),
                None => {
                    self.updated.insert(path, nv.clone());
                }
            }
        }
        for (k, _) in old {
            if !new.contains_key(k) {
                self.removed.push(format!("{prefix}{k}"));
            }
        }
    }

    fn value(&mut self, old: &Bson, new: &Bson, path: String) {
        match (old, new) {
            (o, n) if o == n => {}
            (Bson::Document(o), Bson::Document(n)) => self.documents(o, n, &format!("{path}.")),
            (Bson::Array(o), Bson::Array(n)) => {
                if n.len() < o.len() {
                    self.truncated
                        .push(bson::doc! {"field": path.clone(), "newSize": n.len() as i32});
                }
                for (i, nv) in n.iter().enumerate() {
                    let element = format!("{path}.{i}");
                    match o.get(i) {
                        Some(ov) => self.value(ov, nv, element),
                        None => {
                            self.updated.insert(element, nv.clone());
                        }
                    }
                }
            }
            _ => {
                self.updated.insert(path, new.clone());
            }
        }
    }
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
    fn pipeline_updates_apply_and_describe() {
        let spec = parse_update(&Bson::Array(vec![
            Bson::Document(
                doc! {"$set": {"array": ["foo", {"a": "bar"}], "s": {"t": 2}, "c": "$n"}},
            ),
            Bson::Document(doc! {"$unset": "gone"}),
        ]))
        .unwrap();
        let old =
            doc! {"_id": 1, "array": ["foo", {"a": "bar"}, 1, 2], "s": {"u": 1}, "n": 5, "gone": 1};
        let mut new = old.clone();
        apply_update(&mut new, &spec, false).unwrap();
        assert_eq!(
            new,
            doc! {"_id": 1, "array": ["foo", {"a": "bar"}], "s": {"u": 1, "t": 2}, "n": 5, "c": 5}
        );
        let (updated, removed, truncated) = describe_pipeline_update(&old, &new);
        assert_eq!(updated, doc! {"s.t": 2, "c": 5});
        assert_eq!(removed, vec!["gone".to_string()]);
        assert_eq!(truncated, vec![doc! {"field": "array", "newSize": 2}]);

        let replace = parse_update(&Bson::Array(vec![Bson::Document(
            doc! {"$replaceWith": {"_id": 2}},
        )]))
        .unwrap();
        let mut d = doc! {"_id": 1};
        assert_eq!(apply_update(&mut d, &replace, false).unwrap_err().code, 66);
        for bad in [
            doc! {"$group": {"_id": null}},
            doc! {"$set": {"a": {"$concatArrays": []}}},
        ] {
            let spec = parse_update(&Bson::Array(vec![Bson::Document(bad)]));
            let err = match spec {
                Ok(spec) => apply_update(&mut doc! {"_id": 1}, &spec, false).unwrap_err(),
                Err(e) => e,
            };
            assert!(matches!(err.code, 72 | 168), "{err:?}");
        }
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
