//! Update operators, replacement documents, pipeline-style updates, upsert seeds and update
//! descriptions.

use bson::{Bson, Document, oid::ObjectId};

use crate::error::{CmdResult, CommandError};
use crate::paths::{set_path, unset_path};
use crate::stages::{self, Stage};
use crate::values::{cmp_values, values_equal};

/// A parsed `u` argument of an update statement.
#[derive(Debug, Clone)]
pub enum UpdateSpec {
    Replacement(Document),
    Operators(Document),
    /// An aggregation pipeline of `$set` / `$addFields`, `$project`, `$unset`, `$replaceRoot` /
    /// `$replaceWith` stages, over the change-stream stages' expression evaluator.
    Pipeline(Vec<Stage>),
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
        if let Bson::Array(pipeline) = u {
            return Ok(UpdateSpec::Pipeline(stages::parse_update_pipeline(
                pipeline,
            )?));
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
        UpdateSpec::Pipeline(pipeline) => {
            for stage in pipeline {
                *doc = stages::apply(stage, std::mem::take(doc))?.unwrap_or_default();
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

/// The `updateDescription` of an update, with what `showExpandedEvents` adds.
#[derive(Debug, Default, PartialEq)]
pub struct UpdateDescription {
    /// Changed or added paths with their new values.
    pub updated: Document,
    /// Removed paths.
    pub removed: Vec<String>,
    /// Arrays that became shorter: `{field, newSize}`.
    pub truncated: Vec<Document>,
    /// `disambiguatedPaths`: for each path above whose components cannot be read back from the
    /// dotted path (a field name holding a dot, or a numeric field name below the top level),
    /// its components, array indexes as integers.
    pub disambiguated: Document,
}

/// One component of a path: a field name or an array index.
#[derive(Clone, Copy)]
enum Part<'a> {
    Field(&'a str),
    Index(usize),
}

/// Which arrays a description reports element by element rather than whole.
enum Arrays {
    /// Every array (a pipeline-style update, logged as the difference of the documents).
    All,
    /// Arrays that some operator path reaches into (`$set: {"a.0.b": 1}` reports `a.0.b`).
    Below(Vec<String>),
}

/// The `updateDescription` of `spec` taking `old` to `new`, as a server logs it. An update with
/// operators reports what its paths changed: an array whole, unless a path reaches into it; a
/// pipeline-style update is logged as the difference of the documents, so it reports array
/// elements by index and arrays that became shorter. A replacement has none.
pub fn describe_update(old: &Document, new: &Document, spec: &UpdateSpec) -> UpdateDescription {
    let arrays = match spec {
        UpdateSpec::Pipeline(_) => Arrays::All,
        UpdateSpec::Replacement(_) => Arrays::Below(Vec::new()),
        UpdateSpec::Operators(ops) => Arrays::Below(
            ops.iter()
                .filter_map(|(_, fields)| fields.as_document())
                .flat_map(|fields| {
                    fields.iter().flat_map(|(path, arg)| {
                        // `$rename` touches its target too.
                        std::iter::once(path.clone()).chain(arg.as_str().map(str::to_string))
                    })
                })
                .collect(),
        ),
    };
    describe(old, new, arrays)
}

fn describe(old: &Document, new: &Document, arrays: Arrays) -> UpdateDescription {
    let mut diff = Diff {
        out: UpdateDescription::default(),
        arrays,
        path: Vec::new(),
    };
    diff.documents(old, new);
    diff.out
}

struct Diff<'a> {
    out: UpdateDescription,
    arrays: Arrays,
    path: Vec<Part<'a>>,
}

impl<'a> Diff<'a> {
    fn dotted(&self) -> String {
        self.path
            .iter()
            .map(|p| match p {
                Part::Field(f) => (*f).to_string(),
                Part::Index(i) => i.to_string(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Whether the array at the current path is described element by element.
    fn descends_into_array(&self) -> bool {
        match &self.arrays {
            Arrays::All => true,
            Arrays::Below(paths) => {
                let prefix = format!("{}.", self.dotted());
                paths.iter().any(|p| p.starts_with(&prefix))
            }
        }
    }

    /// The current path, dotted, noted in `disambiguated` if it is ambiguous.
    fn note(&mut self) -> String {
        let dotted = self.dotted();
        let ambiguous = self.path.iter().enumerate().any(|(depth, p)| match p {
            Part::Field(f) => {
                f.contains('.')
                    || (depth > 0 && !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
            }
            Part::Index(_) => false,
        });
        if ambiguous {
            let parts: Vec<Bson> = self
                .path
                .iter()
                .map(|p| match p {
                    Part::Field(f) => Bson::String((*f).to_string()),
                    Part::Index(i) => Bson::Int32(*i as i32),
                })
                .collect();
            self.out.disambiguated.insert(dotted.clone(), parts);
        }
        dotted
    }

    fn updated(&mut self, value: &Bson) {
        let path = self.note();
        self.out.updated.insert(path, value.clone());
    }

    fn documents(&mut self, old: &'a Document, new: &'a Document) {
        for (k, nv) in new {
            self.path.push(Part::Field(k));
            match old.get(k) {
                Some(ov) => self.value(ov, nv),
                None => self.updated(nv),
            }
            self.path.pop();
        }
        for (k, _) in old {
            if !new.contains_key(k) {
                self.path.push(Part::Field(k));
                let path = self.note();
                self.out.removed.push(path);
                self.path.pop();
            }
        }
    }

    fn value(&mut self, old: &'a Bson, new: &'a Bson) {
        match (old, new) {
            (o, n) if o == n => {}
            (Bson::Document(o), Bson::Document(n)) => self.documents(o, n),
            (Bson::Array(o), Bson::Array(n)) if self.descends_into_array() => {
                if n.len() < o.len() {
                    let field = self.note();
                    self.out
                        .truncated
                        .push(bson::doc! {"field": field, "newSize": n.len() as i32});
                }
                for (i, nv) in n.iter().enumerate() {
                    self.path.push(Part::Index(i));
                    match o.get(i) {
                        Some(ov) => self.value(ov, nv),
                        None => self.updated(nv),
                    }
                    self.path.pop();
                }
            }
            _ => self.updated(new),
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
        let d = describe_update(&old, &new, &spec);
        assert_eq!(d.updated, doc! {"s.t": 2, "c": 5});
        assert_eq!(d.removed, vec!["gone".to_string()]);
        assert_eq!(d.truncated, vec![doc! {"field": "array", "newSize": 2}]);
        assert_eq!(d.disambiguated, doc! {});

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
        let d = describe(
            &doc! {"_id": 1, "a": {"b": 1}, "c": 1},
            &doc! {"_id": 1, "a": {"b": 2}},
            Arrays::Below(Vec::new()),
        );
        assert_eq!(d.updated, doc! {"a.b": 2});
        assert_eq!(d.removed, vec!["c".to_string()]);
    }

    #[test]
    fn disambiguated_paths_name_dotted_and_numeric_fields_and_array_indexes() {
        // Array indexes alone and a numeric field at the top level are not ambiguous.
        let d = describe(
            &doc! {"_id": 1, "arr": [[1, 2]], "7": 1},
            &doc! {"_id": 1, "arr": [[1, 3]], "7": 2},
            Arrays::All,
        );
        assert_eq!(d.updated, doc! {"arr.0.1": 3, "7": 2});
        assert_eq!(d.disambiguated, doc! {});
        // A numeric field below the top level is a string, an array index an integer, and a
        // shortened array is described too.
        let d = describe(
            &doc! {"_id": 1, "a": [{"0": 1, "b.c": [1, 2]}]},
            &doc! {"_id": 1, "a": [{"0": 2, "b.c": [1]}]},
            Arrays::All,
        );
        assert_eq!(d.updated, doc! {"a.0.0": 2});
        assert_eq!(d.truncated, vec![doc! {"field": "a.0.b.c", "newSize": 1}]);
        assert_eq!(
            d.disambiguated,
            doc! {"a.0.0": ["a", 0, "0"], "a.0.b.c": ["a", 0, "b.c"]}
        );
        // An operator update reports a changed array whole, unless a path reaches into it.
        let old = doc! {"_id": 1, "a": [1, 2], "b": [{"1": 1}]};
        let spec = parse_update(&Bson::Document(doc! {"$set": {"a": [1], "b.0.1": 2}})).unwrap();
        let mut new = old.clone();
        apply_update(&mut new, &spec, false).unwrap();
        let d = describe_update(&old, &new, &spec);
        assert_eq!(d.updated, doc! {"a": [1], "b.0.1": 2});
        assert!(d.truncated.is_empty());
        assert_eq!(d.disambiguated, doc! {"b.0.1": ["b", 0, "1"]});
    }
}
