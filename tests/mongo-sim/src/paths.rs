//! Dotted paths into documents: setting a value (creating embedded documents and padding arrays
//! on the way) and removing one.

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};

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
