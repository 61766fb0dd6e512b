//! The stages a change stream's pipeline may hold after `$changeStream`: parsing (with
//! MongoDB's errors for unknown, disallowed and misplaced stages) and applying them to an event.

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};
use crate::expression::{DESCEND, Expr, KEEP, PRUNE, ParseContext, Scope, display, type_name};
use crate::matcher;

/// The stage that splits oversized events; it must come last.
pub const SPLIT_STAGE: &str = "$changeStreamSplitLargeEvent";

/// Stage names MongoDB knows but does not allow in a change stream.
const OTHER_KNOWN_STAGES: &[&str] = &[
    "$bucket",
    "$bucketAuto",
    "$collStats",
    "$count",
    "$currentOp",
    "$densify",
    "$documents",
    "$facet",
    "$fill",
    "$geoNear",
    "$graphLookup",
    "$group",
    "$indexStats",
    "$limit",
    "$listLocalSessions",
    "$listSampledQueries",
    "$listSearchIndexes",
    "$listSessions",
    "$lookup",
    "$merge",
    "$out",
    "$planCacheStats",
    "$querySettings",
    "$sample",
    "$search",
    "$searchMeta",
    "$setWindowFields",
    "$shardedDataDistribution",
    "$skip",
    "$sort",
    "$sortByCount",
    "$unionWith",
    "$unwind",
    "$vectorSearch",
];

/// What `$addFields` / `$set` assigns to one field.
#[derive(Debug, Clone)]
pub enum FieldSpec {
    Value(Expr),
    /// A nested specification, merged into an embedded document (or each of an array's).
    Nested(Vec<(String, FieldSpec)>),
}

/// A pipeline stage after `$changeStream`.
#[derive(Debug, Clone)]
pub enum Stage {
    Match(Document),
    Project(Document),
    AddFields(Vec<(String, FieldSpec)>),
    Unset(Vec<String>),
    /// `$replaceRoot` / `$replaceWith`: the new root expression.
    ReplaceRoot(Expr),
    Redact(Expr),
}

/// A change stream's stages, and whether it ends with `$changeStreamSplitLargeEvent`.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
    pub split: bool,
}

fn add_fields_error(stage: &str, why: impl std::fmt::Display, code: i32) -> CommandError {
    CommandError::new(code, format!("Invalid {stage} :: caused by :: {why}"))
}

fn check_path_part(stage: &str, part: &str, path: &str) -> CmdResult<()> {
    if part.is_empty() {
        return Err(add_fields_error(
            stage,
            format!("FieldPath field names may not be empty strings. ({path})"),
            40352,
        ));
    }
    if part.starts_with('$') {
        return Err(add_fields_error(
            stage,
            format!(
                "FieldPath field names may not start with '$'. Consider using $getField or $setField. ({path})"
            ),
            16410,
        ));
    }
    Ok(())
}

fn insert_spec(
    stage: &str,
    into: &mut Vec<(String, FieldSpec)>,
    parts: &[&str],
    spec: FieldSpec,
    path: &str,
) -> CmdResult<()> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(());
    };
    check_path_part(stage, first, path)?;
    let existing = into.iter_mut().find(|(k, _)| k == first);
    if rest.is_empty() {
        if existing.is_some() {
            return Err(add_fields_error(
                stage,
                format!(
                    "specification contains two conflicting paths. Cannot specify both '{path}' and '{path}'"
                ),
                40176,
            ));
        }
        into.push((first.to_string(), spec));
        return Ok(());
    }
    match existing {
        Some((_, FieldSpec::Nested(children))) => insert_spec(stage, children, rest, spec, path),
        Some(_) => Err(add_fields_error(
            stage,
            format!(
                "specification contains two conflicting paths. Cannot specify both '{first}' and '{path}'"
            ),
            40176,
        )),
        None => {
            let mut children = Vec::new();
            insert_spec(stage, &mut children, rest, spec, path)?;
            into.push((first.to_string(), FieldSpec::Nested(children)));
            Ok(())
        }
    }
}

fn parse_add_fields_spec(stage: &str, d: &Document) -> CmdResult<Vec<(String, FieldSpec)>> {
    let mut out = Vec::new();
    for (key, value) in d {
        let spec = match value {
            Bson::Document(sub)
                if !sub.is_empty() && sub.keys().next().is_some_and(|k| !k.starts_with('$')) =>
            {
                FieldSpec::Nested(parse_add_fields_spec(stage, sub)?)
            }
            other => FieldSpec::Value(
                Expr::parse(other, ParseContext::default())
                    .map_err(|e| add_fields_error(stage, e.message, e.code))?,
            ),
        };
        let parts: Vec<&str> = key.split('.').collect();
        insert_spec(stage, &mut out, &parts, spec, key)?;
    }
    Ok(out)
}

fn parse_unset(arg: &Bson) -> CmdResult<Vec<String>> {
    let paths: Vec<String> = match arg {
        Bson::String(s) => vec![s.clone()],
        Bson::Array(items) => {
            if items.is_empty() {
                return Err(CommandError::new(
                    31119,
                    "$unset specification must be a string or an array with at least one field",
                ));
            }
            items
                .iter()
                .map(|i| match i {
                    Bson::String(s) => Ok(s.clone()),
                    _ => Err(CommandError::new(
                        31120,
                        "$unset specification must be a string or an array containing only string values",
                    )),
                })
                .collect::<CmdResult<_>>()?
        }
        _ => {
            return Err(CommandError::new(
                31002,
                "$unset specification must be a string or an array",
            ));
        }
    };
    for p in &paths {
        for part in p.split('.') {
            if part.is_empty() {
                return Err(CommandError::new(
                    40352,
                    "FieldPath cannot be constructed with empty string",
                ));
            }
            if part.starts_with('$') {
                return Err(CommandError::new(
                    16410,
                    format!(
                        "FieldPath field names may not start with '$'. Consider using $getField or $setField. ({p})"
                    ),
                ));
            }
        }
    }
    Ok(paths)
}

fn parse_replace_root(arg: &Bson) -> CmdResult<Expr> {
    let Bson::Document(d) = arg else {
        return Err(CommandError::new(
            40229,
            format!(
                "expected an object as specification for $replaceRoot stage, got {}",
                type_name(Some(arg))
            ),
        ));
    };
    let mut new_root = None;
    for (k, v) in d {
        if k == "newRoot" {
            new_root = Some(Expr::parse(v, ParseContext::default())?);
        } else {
            return Err(CommandError::new(
                40415,
                format!("BSON field '$replaceRoot.{k}' is an unknown field."),
            ));
        }
    }
    new_root.ok_or_else(|| {
        CommandError::new(
            40414,
            "BSON field '$replaceRoot.newRoot' is missing but a required field",
        )
    })
}

/// Parses a stage that reshapes a document, as a change stream or a pipeline-style update
/// uses it: `$project`, `$addFields` / `$set`, `$unset`, `$replaceRoot`, `$replaceWith`.
fn parse_shaping_stage(name: &str, arg: &Bson) -> CmdResult<Stage> {
    Ok(match name {
        "$project" => match arg {
            Bson::Document(p) if !p.is_empty() => {
                crate::projection::project(&Document::new(), p)
                    .map_err(|e| add_fields_error(name, e.message, e.code))?;
                Stage::Project(p.clone())
            }
            Bson::Document(_) => {
                return Err(CommandError::new(
                    51272,
                    "Invalid $project :: caused by :: projection specification must have at least one field",
                ));
            }
            _ => {
                return Err(CommandError::new(
                    15969,
                    "$project specification must be an object",
                ));
            }
        },
        "$addFields" | "$set" => match arg {
            Bson::Document(d) if !d.is_empty() => Stage::AddFields(parse_add_fields_spec(name, d)?),
            Bson::Document(_) => {
                return Err(add_fields_error(
                    name,
                    "specification must have at least one field",
                    40177,
                ));
            }
            other => {
                return Err(CommandError::new(
                    40272,
                    format!(
                        "{name} specification stage must be an object, got {}",
                        type_name(Some(other))
                    ),
                ));
            }
        },
        "$unset" => Stage::Unset(parse_unset(arg)?),
        "$replaceRoot" => Stage::ReplaceRoot(parse_replace_root(arg)?),
        "$replaceWith" => Stage::ReplaceRoot(Expr::parse(arg, ParseContext::default())?),
        other => {
            return Err(CommandError::new(
                40324,
                format!("Unrecognized pipeline stage name: '{other}'"),
            ));
        }
    })
}

/// The stages a pipeline-style update may hold.
const UPDATE_STAGES: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

/// Parses the pipeline of a pipeline-style update: `$addFields` / `$set`, `$project`,
/// `$unset`, `$replaceRoot` / `$replaceWith`; other stages are refused with 72, as MongoDB
/// refuses them within an update.
pub fn parse_update_pipeline(stages: &[Bson]) -> CmdResult<Vec<Stage>> {
    let mut out = Vec::with_capacity(stages.len());
    for stage in stages {
        let Bson::Document(s) = stage else {
            return Err(CommandError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        let mut fields = s.iter();
        let (Some((name, arg)), None) = (fields.next(), fields.next()) else {
            return Err(CommandError::new(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        if !UPDATE_STAGES.contains(&name.as_str()) {
            return Err(CommandError::new(
                72,
                format!("{name} is not allowed to be used within an update"),
            ));
        }
        out.push(parse_shaping_stage(name, arg)?);
    }
    Ok(out)
}

/// Parses the stages after `$changeStream` as MongoDB validates a change stream's pipeline:
/// every stage is parsed first (unknown names fail with 40324), then stages a change stream
/// does not allow fail with `IllegalOperation` (20), then positions are checked.
pub fn parse_change_stream(stages: &[Bson]) -> CmdResult<Pipeline> {
    let mut pipeline = Pipeline::default();
    let mut names = Vec::with_capacity(stages.len());
    for stage in stages {
        let Bson::Document(s) = stage else {
            return Err(CommandError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        if s.len() != 1 {
            return Err(CommandError::new(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        let Some((name, arg)) = s.iter().next() else {
            continue;
        };
        names.push(name.clone());
        let parsed = match name.as_str() {
            "$match" => match arg {
                Bson::Document(f) => {
                    matcher::validate(f)?;
                    Stage::Match(f.clone())
                }
                _ => {
                    return Err(CommandError::new(
                        15959,
                        "the match filter must be an expression in an object",
                    ));
                }
            },
            "$project" | "$addFields" | "$set" | "$unset" | "$replaceRoot" | "$replaceWith" => {
                parse_shaping_stage(name, arg)?
            }
            "$redact" => Stage::Redact(Expr::parse(arg, ParseContext { redact: true })?),
            SPLIT_STAGE => {
                if !matches!(arg, Bson::Document(d) if d.is_empty()) {
                    return Err(CommandError::new(
                        7182800,
                        "$changeStreamSplitLargeEvent spec should be an empty object",
                    ));
                }
                pipeline.split = true;
                continue;
            }
            "$changeStream" => continue,
            other if OTHER_KNOWN_STAGES.contains(&other) => continue,
            other => {
                return Err(CommandError::new(
                    40324,
                    format!("Unrecognized pipeline stage name: '{other}'"),
                ));
            }
        };
        pipeline.stages.push(parsed);
    }
    if let Some(other) = names
        .iter()
        .find(|n| OTHER_KNOWN_STAGES.contains(&n.as_str()))
    {
        return Err(CommandError::new(
            20,
            format!("{other} is not permitted in a $changeStream pipeline"),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if name == "$changeStream" {
            return Err(CommandError::new(
                40602,
                "$changeStream is only valid as the first stage in a pipeline",
            ));
        }
        if name == SPLIT_STAGE && i + 1 != names.len() {
            return Err(CommandError::new(
                7182802,
                "$changeStreamSplitLargeEvent must be the last stage in the pipeline",
            ));
        }
    }
    Ok(pipeline)
}

fn apply_fields(
    target: &mut Document,
    spec: &[(String, FieldSpec)],
    scope: Scope<'_>,
) -> CmdResult<()> {
    for (name, field) in spec {
        match field {
            FieldSpec::Value(e) => match e.evaluate(scope)? {
                Some(v) => {
                    target.insert(name.clone(), v);
                }
                None => {
                    target.remove(name);
                }
            },
            FieldSpec::Nested(children) => match target.get_mut(name) {
                Some(Bson::Document(d)) => apply_fields(d, children, scope)?,
                Some(Bson::Array(items)) => {
                    for item in items.iter_mut() {
                        if let Bson::Document(d) = item {
                            apply_fields(d, children, scope)?;
                        } else {
                            let mut d = Document::new();
                            apply_fields(&mut d, children, scope)?;
                            *item = Bson::Document(d);
                        }
                    }
                }
                _ => {
                    let mut d = Document::new();
                    apply_fields(&mut d, children, scope)?;
                    target.insert(name.clone(), d);
                }
            },
        }
    }
    Ok(())
}

fn redact_document(doc: &Document, root: &Document, e: &Expr) -> CmdResult<Option<Document>> {
    let verdict = e.evaluate(Scope { root, current: doc })?;
    match verdict.as_ref() {
        Some(Bson::String(s)) if s == KEEP => Ok(Some(doc.clone())),
        Some(Bson::String(s)) if s == PRUNE => Ok(None),
        Some(Bson::String(s)) if s == DESCEND => {
            let mut out = Document::new();
            for (k, v) in doc {
                match v {
                    Bson::Document(sub) => {
                        if let Some(kept) = redact_document(sub, root, e)? {
                            out.insert(k.clone(), kept);
                        }
                    }
                    Bson::Array(items) => {
                        out.insert(k.clone(), redact_array(items, root, e)?);
                    }
                    other => {
                        out.insert(k.clone(), other.clone());
                    }
                }
            }
            Ok(Some(out))
        }
        other => Err(CommandError::new(
            17053,
            format!(
                "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {}",
                other.map_or_else(|| "MISSING".to_string(), display)
            ),
        )),
    }
}

fn redact_array(items: &[Bson], root: &Document, e: &Expr) -> CmdResult<Vec<Bson>> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Bson::Document(d) => {
                if let Some(kept) = redact_document(d, root, e)? {
                    out.push(Bson::Document(kept));
                }
            }
            Bson::Array(inner) => out.push(Bson::Array(redact_array(inner, root, e)?)),
            other => out.push(other.clone()),
        }
    }
    Ok(out)
}

/// Applies one stage to a document; `None` when the stage drops it.
pub fn apply(stage: &Stage, doc: Document) -> CmdResult<Option<Document>> {
    match stage {
        Stage::Match(f) => Ok(matcher::matches(&doc, f)?.then_some(doc)),
        Stage::Project(p) => crate::projection::project(&doc, p).map(Some),
        Stage::AddFields(spec) => {
            let mut out = doc.clone();
            apply_fields(&mut out, spec, Scope::of(&doc))?;
            Ok(Some(out))
        }
        Stage::Unset(paths) => {
            let mut out = doc;
            for p in paths {
                crate::paths::unset_path(&mut out, p);
            }
            Ok(Some(out))
        }
        Stage::ReplaceRoot(e) => match e.evaluate(Scope::of(&doc))? {
            Some(Bson::Document(d)) => Ok(Some(d)),
            other => {
                let mut shown = display(&Bson::Document(doc));
                if shown.len() > 1024 {
                    let mut cut = 1024;
                    while !shown.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    shown.truncate(cut);
                    shown.push_str("...");
                }
                Err(CommandError::new(
                    40228,
                    format!(
                        "'newRoot' expression must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'. Input document: {shown}",
                        other
                            .as_ref()
                            .map_or_else(|| "MISSING".to_string(), display),
                        type_name(other.as_ref())
                    ),
                ))
            }
        },
        Stage::Redact(e) => redact_document(&doc, &doc, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn stages(p: Vec<Document>) -> CmdResult<Pipeline> {
        parse_change_stream(&p.into_iter().map(Bson::Document).collect::<Vec<_>>())
    }

    #[test]
    fn stage_errors_follow_mongodb_order() {
        let code = |p: Vec<Document>| stages(p).unwrap_err().code;
        assert_eq!(code(vec![doc! {"$frob": {}}]), 40324);
        // A bad stage spec is reported before a disallowed stage.
        assert_eq!(code(vec![doc! {"$group": {}}, doc! {"$frob": {}}]), 40324);
        assert_eq!(code(vec![doc! {"$group": {"_id": null}}]), 20);
        assert_eq!(
            code(vec![
                doc! {"$changeStreamSplitLargeEvent": {}},
                doc! {"$match": {}}
            ]),
            7182802
        );
        assert_eq!(
            code(vec![doc! {"$changeStreamSplitLargeEvent": {"a": 1}}]),
            7182800
        );
        assert_eq!(code(vec![doc! {"$changeStream": {}}]), 40602);
        assert_eq!(code(vec![doc! {"$set": 1}]), 40272);
        assert_eq!(code(vec![doc! {"$unset": []}]), 31119);
        assert_eq!(code(vec![doc! {"$unset": [1]}]), 31120);
        assert_eq!(code(vec![doc! {"$replaceRoot": {}}]), 40414);
        assert_eq!(
            code(vec![doc! {"$replaceRoot": {"newRoot": "$a", "x": 1}}]),
            40415
        );
        assert_eq!(code(vec![doc! {"$addFields": {"a": {"$nope": 1}}}]), 168);
        assert_eq!(code(vec![doc! {"$match": {}, "$set": {}}]), 40323);
        assert!(
            stages(vec![doc! {"$changeStreamSplitLargeEvent": {}}])
                .unwrap()
                .split
        );
    }

    #[test]
    fn add_fields_merges_into_embedded_documents() {
        let p = stages(vec![
            doc! {"$set": {"a.b": {"$add": ["$n", 1]}, "c": {"d": "$n"}, "gone": "$$REMOVE"}},
        ])
        .unwrap();
        let out = apply(
            &p.stages[0],
            doc! {"n": 1, "a": {"x": 0}, "c": [{"y": 1}, 2], "gone": 1},
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            out,
            doc! {"n": 1, "a": {"x": 0, "b": 2}, "c": [{"y": 1, "d": 1}, {"d": 1}]}
        );
    }

    #[test]
    fn redact_descends_and_prunes() {
        let p = stages(vec![
            doc! {"$redact": {"$cond": [{"$eq": ["$secret", true]}, "$$PRUNE", "$$DESCEND"]}},
        ])
        .unwrap();
        let out = apply(
            &p.stages[0],
            doc! {"a": {"secret": true}, "b": [{"secret": true}, {"k": 1}, 3], "c": 1},
        )
        .unwrap()
        .unwrap();
        assert_eq!(out, doc! {"b": [{"k": 1}, 3], "c": 1});
        assert!(
            apply(&p.stages[0], doc! {"secret": true})
                .unwrap()
                .is_none()
        );
        let bad = stages(vec![doc! {"$redact": "$x"}]).unwrap();
        assert_eq!(
            apply(&bad.stages[0], doc! {"x": 1}).unwrap_err().code,
            17053
        );
    }
}
