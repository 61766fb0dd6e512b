//! A change-stream pipeline: read from its Extended JSON text and checked against what MongoDB
//! allows in a change stream and what the host relies on (the resume token, the operation type,
//! and for wide scopes the namespace).

use bson::{Bson, Document};

/// The stages a change-stream pipeline may hold (MongoDB's list, less `$changeStreamSplitLargeEvent`,
/// which the host adds itself).
pub const ALLOWED_STAGES: [&str; 8] = [
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];

/// The most stages a pipeline may have, and its longest text.
pub const MAX_STAGES: usize = 64;
pub const MAX_PIPELINE_BYTES: usize = 1 << 20;

/// The fields a pipeline must leave as the server wrote them: the resume token, and the
/// operation type the host recognises an invalidation by.
const PROTECTED: [&str; 2] = ["_id", "operationType"];

/// The fields a database or deployment stream's pipeline must also leave: the namespace, by
/// which the host leaves out handoff's own collections.
const PROTECTED_WIDE: [&str; 3] = ["_id", "operationType", "ns"];

/// Reads a pipeline from its Extended JSON text (an array of stages) and refuses what MongoDB
/// does not allow in a change stream or what would change the fields the host relies on.
pub fn parse_pipeline(text: &str) -> Result<Vec<Document>, String> {
    if text.len() > MAX_PIPELINE_BYTES {
        return Err(format!(
            "the pipeline is over {} KiB",
            MAX_PIPELINE_BYTES >> 10
        ));
    }
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the pipeline is not JSON: {e}"))?;
    let Bson::Array(stages) = Bson::try_from(json)
        .map_err(|e| format!("the pipeline is not valid Extended JSON: {e}"))?
    else {
        return Err("the pipeline must be a JSON array of stages".into());
    };
    if stages.len() > MAX_STAGES {
        return Err(format!("the pipeline has more than {MAX_STAGES} stages"));
    }
    stages
        .into_iter()
        .enumerate()
        .map(|(index, stage)| {
            let Bson::Document(stage) = stage else {
                return Err(format!("stage {index} is not a document"));
            };
            check_stage(&stage, &PROTECTED).map_err(|why| format!("stage {index}: {why}"))?;
            // A key MongoDB cannot store (one holding NUL) would make the stage unsendable.
            stage
                .to_vec()
                .map_err(|_| format!("stage {index} cannot be encoded as BSON"))?;
            Ok(stage)
        })
        .collect()
}

/// Refuses a pipeline that would change or remove an event's namespace (`ns`): a database or
/// deployment stream needs it in every event to leave out handoff's own collections.
pub fn check_keeps_namespace(pipeline: &[Document]) -> Result<(), String> {
    for (index, stage) in pipeline.iter().enumerate() {
        check_stage(stage, &PROTECTED_WIDE).map_err(|why| format!("stage {index}: {why}"))?;
    }
    Ok(())
}

fn check_stage(stage: &Document, protected: &[&str]) -> Result<(), String> {
    let mut entries = stage.iter();
    let (Some((name, spec)), None) = (entries.next(), entries.next()) else {
        return Err("a stage must have exactly one field, its name".into());
    };
    let shown = crate::text::escape_untrusted(name, 40);
    if !ALLOWED_STAGES.contains(&name.as_str()) {
        return Err(format!(
            "{shown} is not allowed in a change stream (allowed: {})",
            ALLOWED_STAGES.join(", ")
        ));
    }
    match name.as_str() {
        "$match" | "$redact" => Ok(()),
        "$project" => check_projection(spec, protected),
        "$addFields" | "$set" => {
            let Bson::Document(fields) = spec else {
                return Err(format!("{name} takes a document"));
            };
            match fields.keys().find(|key| touches_protected(key, protected)) {
                Some(key) => Err(format!("{name} would change {}", field_name(key))),
                None => Ok(()),
            }
        }
        "$unset" => {
            let paths: Vec<&Bson> = match spec {
                Bson::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for path in paths {
                let Bson::String(path) = path else {
                    return Err("$unset takes a field path or an array of them".into());
                };
                if touches_protected(path, protected) {
                    return Err(format!("$unset would remove {}", field_name(path)));
                }
            }
            Ok(())
        }
        "$replaceRoot" => {
            let root = match spec {
                Bson::Document(spec) => spec.get("newRoot"),
                _ => None,
            };
            match root {
                Some(root) => check_new_root(root, protected),
                None => Err("$replaceRoot takes {newRoot: <expression>}".into()),
            }
        }
        _ => check_new_root(spec, protected),
    }
}

/// Whether `path` is, or is inside, a protected field.
fn touches_protected(path: &str, protected: &[&str]) -> bool {
    protected.iter().any(|field| {
        path == *field
            || path
                .strip_prefix(field)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

fn field_name(path: &str) -> &'static str {
    if path == "operationType" || path.starts_with("operationType.") {
        "operationType (how the host recognises an invalidation)"
    } else if path == "ns" || path.starts_with("ns.") {
        "ns (the event's namespace, by which a database or deployment stream leaves out \
         handoff's own collections)"
    } else {
        "_id (the event's resume token)"
    }
}

/// A `$project` keeps the protected fields as they are: an inclusion projection must include
/// each of them but `_id` (and must not exclude `_id`); an exclusion one must not name them.
fn check_projection(spec: &Bson, protected: &[&str]) -> Result<(), String> {
    let Bson::Document(fields) = spec else {
        return Err("$project takes a document".into());
    };
    let included = |value: &Bson| match value {
        Bson::Boolean(b) => Some(*b),
        Bson::Int32(n) => Some(*n != 0),
        Bson::Int64(n) => Some(*n != 0),
        Bson::Double(n) => Some(*n != 0.0),
        _ => None,
    };
    for (key, value) in fields {
        if touches_protected(key, protected) && (key.contains('.') || included(value) != Some(true))
        {
            return Err(format!("$project would change {}", field_name(key)));
        }
    }
    // Only an exclusion of other fields keeps every field it does not name; anything else (an
    // included or computed field, or `_id: 1` alone) keeps only the fields it lists.
    let mut others = fields
        .iter()
        .filter(|(key, _)| !touches_protected(key, protected))
        .peekable();
    let exclusion =
        others.peek().is_some() && others.all(|(_, value)| included(value) == Some(false));
    if !exclusion
        && let Some(missing) = protected
            .iter()
            .find(|field| **field != "_id" && !fields.contains_key(**field))
    {
        return Err(format!(
            "$project would remove {}; include {missing}: 1",
            field_name(missing)
        ));
    }
    Ok(())
}

/// A new root must be a document (or a `$mergeObjects` ending in one) that sets each protected
/// field from the event's own.
fn check_new_root(root: &Bson, protected: &[&str]) -> Result<(), String> {
    let keeps = |fields: &Document| {
        protected.iter().all(|field| {
            matches!(fields.get(*field), Some(Bson::String(path)) if *path == format!("${field}"))
        })
    };
    let last = match root {
        Bson::Document(fields) => match fields.get("$mergeObjects") {
            Some(Bson::Array(parts)) if fields.len() == 1 => {
                parts.last().and_then(Bson::as_document)
            }
            _ => Some(fields),
        },
        _ => None,
    };
    if last.is_some_and(keeps) {
        Ok(())
    } else {
        let kept: Vec<String> = protected
            .iter()
            .map(|field| format!("\"{field}\": \"${field}\""))
            .collect();
        Err(format!(
            "a new root must keep the event's {}, e.g. \
             {{\"$replaceWith\": {{\"$mergeObjects\": [\"$fullDocument\", {{{}}}]}}}}",
            match protected.split_last() {
                Some((last, [])) => last.to_string(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            },
            kept.join(", ")
        ))
    }
}
