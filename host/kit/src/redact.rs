//! `record --redact`: a field of the watched documents hidden wherever a change event carries it.
//!
//! A path names a field of the document (`email`, `profile.email`, `items.email`), written alone
//! or after the event field that holds a document (`fullDocument.email`). It is replaced with
//! [`REDACTED`] in the full document, the pre-image (`fullDocumentBeforeChange`), the document
//! key and the values of an update's `updatedFields`, whose keys are dotted paths themselves
//! (`profile.email`, `items.0.email`, or `profile` holding the field). Arrays are followed as
//! MongoDB follows them: `items.email` is the field of every element, `items.0.email` of the first
//! one. The other parts of an event (`removedFields`, `truncatedArrays`, `disambiguatedPaths`)
//! hold field names only, never values; the resume token is never touched.

use bson::{Bson, Document};

use handoff_domain::error::{HandoffError, Result};

/// The value that replaces a redacted field.
pub const REDACTED: &str = "<redacted>";

/// The event fields that hold a document (or a part of one), and the prefix of `updatedFields`.
const CONTAINERS: [&str; 3] = ["fullDocument", "fullDocumentBeforeChange", "documentKey"];
const UPDATED: &str = "updateDescription.updatedFields";

/// A checked `--redact` path: the document field it names, as its parts.
#[derive(Clone, Debug, PartialEq)]
pub struct Redaction {
    parts: Vec<String>,
}

impl Redaction {
    /// Reads a `--redact` path: dotted, not empty, and naming a field of the document (the
    /// resume token `_id` cannot be hidden).
    pub fn parse(path: &str) -> Result<Redaction> {
        let bad = |why: &str| HandoffError::BadInput(format!("--redact {path:?}: {why}"));
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(bad("not a dotted field path"));
        }
        if path == "_id" || path.starts_with("_id.") {
            return Err(HandoffError::BadInput(format!(
                "--redact {path:?} cannot hide the resume token (_id); the document's own _id is \
                 fullDocument._id"
            )));
        }
        let field = CONTAINERS
            .iter()
            .chain(std::iter::once(&UPDATED))
            .find_map(|prefix| {
                if path == *prefix {
                    Some(None)
                } else {
                    path.strip_prefix(prefix)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .map(Some)
                }
            })
            .unwrap_or(Some(path));
        let field = field.ok_or_else(|| {
            bad("names a whole document; name a field of it, e.g. fullDocument.email")
        })?;
        Ok(Redaction {
            parts: field.split('.').map(str::to_string).collect(),
        })
    }

    /// Replaces the field in every place of `event` that carries it.
    pub fn apply(&self, event: &mut Document) {
        let parts: Vec<&str> = self.parts.iter().map(String::as_str).collect();
        for container in CONTAINERS {
            if let Some(value) = event.get_mut(container) {
                hide(value, &parts);
            }
        }
        let updated = event
            .get_document_mut("updateDescription")
            .ok()
            .and_then(|d| d.get_document_mut("updatedFields").ok());
        if let Some(updated) = updated {
            for (key, value) in updated.iter_mut() {
                let key: Vec<&str> = key.split('.').collect();
                if let Some(rest) = below(&key, &parts) {
                    hide(value, rest);
                }
            }
        }
    }
}

/// Reads every `--redact` path.
pub fn parse_all(paths: &[String]) -> Result<Vec<Redaction>> {
    paths.iter().map(|p| Redaction::parse(p)).collect()
}

/// What of the field path `field` lies inside the value set at the dotted `key` of an update:
/// the rest of the path when the key leads to the field (`profile` for `profile.email`), nothing
/// left when the key is the field or inside it. Numeric parts of the key are array positions,
/// which a path without them goes through.
fn below<'a>(key: &[&str], field: &'a [&str]) -> Option<&'a [&'a str]> {
    match (key.split_first(), field.split_first()) {
        (None, _) => Some(field),
        (Some(_), None) => Some(field),
        (Some((k, key_rest)), Some((f, field_rest))) => {
            if k == f {
                below(key_rest, field_rest)
            } else if k.parse::<usize>().is_ok() {
                below(key_rest, field)
            } else {
                None
            }
        }
    }
}

/// Replaces the field at `parts` under `value` with [`REDACTED`] where it exists, following
/// arrays (every element, nested arrays too, or the one a numeric part names) and fields whose
/// own names hold dots (`{"profile.email": …}` for `profile.email`): hiding too much is the safe
/// side.
fn hide(value: &mut Bson, parts: &[&str]) {
    let Some((first, rest)) = parts.split_first() else {
        *value = Bson::String(REDACTED.into());
        return;
    };
    match value {
        Bson::Document(doc) => {
            for taken in 1..=parts.len() {
                if let Some(inner) = doc.get_mut(parts[..taken].join(".")) {
                    hide(inner, &parts[taken..]);
                }
            }
        }
        Bson::Array(items) => {
            if let Some(item) = first.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                hide(item, rest);
            }
            for item in items
                .iter_mut()
                .filter(|i| matches!(i, Bson::Document(_) | Bson::Array(_)))
            {
                hide(item, parts);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
