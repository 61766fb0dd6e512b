//! `handoff policy new NAME --lang …`: a policy project that builds, tests and passes its own cases
//! as generated.
//!
//! A project is standalone (a copy of the contract, its own build files): the decisions, their
//! native tests, and a sample case whose expectations are recorded with the embedded default
//! policy, which every template starts as. One file per language gives the project's files.

use std::path::{Path, PathBuf};

use handoff_domain::error::{HandoffError, Result};

mod javascript;
mod python;
mod rust;

use super::lang::Lang;

/// The contract every project carries a copy of.
pub(crate) const CONTRACT_WIT: &str = include_str!("../../../../wit/policy.wit");
/// The sample case's stream (its expectations are recorded with the embedded default policy).
pub(crate) const SAMPLE_STREAM: &str = include_str!("../templates/stream.jsonl");

/// Creates `dir/name`, a policy project in `lang`, and returns its path. Refuses an existing
/// directory.
pub fn scaffold(dir: &Path, name: &str, lang: Lang) -> Result<PathBuf> {
    let valid = name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(HandoffError::BadInput(format!(
            "a policy name is 1-64 lowercase letters, digits, '-' or '_', starting with a letter, not {name:?}"
        )));
    }
    let root = dir.join(name);
    if root.exists() {
        return Err(HandoffError::BadInput(format!(
            "{} already exists",
            root.display()
        )));
    }
    let files = match lang {
        Lang::Rust => rust::files(name),
        Lang::Python => python::files(name),
        Lang::Javascript => javascript::files(name),
    };
    for (path, content) in files {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                HandoffError::BadInput(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        std::fs::write(&path, content)
            .map_err(|e| HandoffError::BadInput(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(root)
}
