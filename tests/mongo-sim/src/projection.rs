//! `$project` / find projections: inclusion, exclusion, field paths (`"$a.b"`), literals and
//! nested specifications.

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};
use crate::paths::{set_path, unset_path};
use crate::values::get_path;

enum Flag {
    Include,
    Exclude,
}

fn flag(v: &Bson) -> Option<Flag> {
    match v {
        Bson::Boolean(true) => Some(Flag::Include),
        Bson::Boolean(false) => Some(Flag::Exclude),
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
            if crate::values::as_f64(v) == Some(0.0) {
                Some(Flag::Exclude)
            } else {
                Some(Flag::Include)
            }
        }
        _ => None,
    }
}

/// Applies a projection specification to `doc`.
pub fn project(doc: &Document, spec: &Document) -> CmdResult<Document> {
    if spec.is_empty() {
        return Ok(doc.clone());
    }
    let exclusion = spec
        .iter()
        .filter(|(k, _)| *k != "_id")
        .all(|(_, v)| matches!(flag(v), Some(Flag::Exclude)))
        && spec
            .iter()
            .any(|(_, v)| matches!(flag(v), Some(Flag::Exclude)));
    if exclusion {
        let mut out = doc.clone();
        for (k, _) in spec {
            unset_path(&mut out, k);
        }
        return Ok(out);
    }
    let mut out = Document::new();
    let id_spec = spec.get("_id");
    match id_spec {
        None => {
            if let Some(id) = doc.get("_id") {
                out.insert("_id", id.clone());
            }
        }
        Some(v) if matches!(flag(v), Some(Flag::Include)) => {
            if let Some(id) = doc.get("_id") {
                out.insert("_id", id.clone());
            }
        }
        _ => {}
    }
    for (k, v) in spec {
        if k == "_id" && flag(v).is_some() {
            continue;
        }
        match flag(v) {
            Some(Flag::Include) => {
                if let Some(val) = get_path(doc, k) {
                    set_path(&mut out, k, val.clone())?;
                }
            }
            Some(Flag::Exclude) => {
                return Err(CommandError::new(
                    31254,
                    format!("Cannot do exclusion on field {k} in inclusion projection"),
                ));
            }
            None => {
                if let Some(val) = evaluate(doc, doc.get(k), v)? {
                    set_path(&mut out, k, val)?;
                }
            }
        }
    }
    Ok(out)
}

/// Evaluates a computed projection value against the root document. `current` is the value
/// of the same field in the input (for nested inclusion flags).
fn evaluate(root: &Document, current: Option<&Bson>, v: &Bson) -> CmdResult<Option<Bson>> {
    match v {
        Bson::String(s) if s.starts_with("$$") => {
            crate::expression::Expr::parse(v, Default::default())?
                .evaluate(crate::expression::Scope::of(root))
        }
        Bson::String(s) if s.starts_with('$') => Ok(get_path(root, &s[1..]).cloned()),
        Bson::Document(d) => {
            if d.keys().next().is_some_and(|k| k.starts_with('$')) {
                // An aggregation expression (`$literal`, `$concat`, ...).
                let expr = crate::expression::Expr::parse(v, Default::default())?;
                return expr.evaluate(crate::expression::Scope::of(root));
            }
            let sub = match current {
                Some(Bson::Document(c)) => Some(c),
                _ => None,
            };
            let mut out = Document::new();
            for (k, inner) in d {
                match flag(inner) {
                    Some(Flag::Include) => {
                        if let Some(val) = sub.and_then(|c| c.get(k)) {
                            out.insert(k.clone(), val.clone());
                        }
                    }
                    Some(Flag::Exclude) => {}
                    None => {
                        if let Some(val) = evaluate(root, sub.and_then(|c| c.get(k)), inner)? {
                            out.insert(k.clone(), val);
                        }
                    }
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        other => Ok(Some(other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn inclusion_exclusion_and_expressions() {
        let d = doc! {"_id": 1, "a": {"b": 2, "c": 3}, "x": "y"};
        assert_eq!(
            project(&d, &doc! {"x": 1}).unwrap(),
            doc! {"_id": 1, "x": "y"}
        );
        assert_eq!(
            project(&d, &doc! {"a.b": 1, "_id": 0}).unwrap(),
            doc! {"a": {"b": 2}}
        );
        assert_eq!(
            project(&d, &doc! {"a": 0}).unwrap(),
            doc! {"_id": 1, "x": "y"}
        );
        assert_eq!(
            project(&d, &doc! {"_id": 0}).unwrap(),
            doc! {"a": {"b": 2, "c": 3}, "x": "y"}
        );
        assert_eq!(
            project(
                &d,
                &doc! {"v": "$a.c", "lit": "text", "n": {"db": "$x", "k": "k"}}
            )
            .unwrap(),
            doc! {"_id": 1, "v": 3, "lit": "text", "n": {"db": "y", "k": "k"}}
        );
        assert!(project(&d, &doc! {"x": 1, "a": 0}).is_err());
    }
}
