//! `handoff policy new NAME --lang …`: a policy project that builds, tests and passes its own cases
//! as generated.
//!
//! A project holds the decisions, their native tests, its build files and a sample case whose
//! expectations are recorded with the embedded default policy, which every template starts as. It
//! carries no SDK source: it depends on the language's SDK package by version (the crate
//! `handoff-policy-sdk`, the wheel and the npm package `handoff-policy`), which brings the run
//! loop and the contract. Where the packages come from: the language's registry, or the directory
//! [`SDK_DIR_VARIABLE`] names (the packages this repository builds offline, see README's "Writing
//! a policy"), which the project is then set up to install from. One file per language gives the
//! project's files.

use std::path::{Path, PathBuf};

use handoff_domain::error::{HandoffError, Result};

mod javascript;
mod python;
mod rust;

use super::lang::Lang;

/// The contract the SDK packages carry.
#[cfg(test)]
pub(crate) const CONTRACT_WIT: &str = include_str!("../../../../wit/policy.wit");

/// The environment variable naming the directory that holds the SDK packages a new project
/// installs from: `handoff-policy-sdk-VERSION/` (the crate, unpacked), the wheel
/// `handoff_policy-VERSION-py3-none-any.whl` and the tarball `handoff-policy-VERSION.tgz`.
pub const SDK_DIR_VARIABLE: &str = "HANDOFF_SDK_DIR";

/// The directory [`SDK_DIR_VARIABLE`] names, made absolute (a project refers to it from
/// anywhere), or none when it is not set.
fn sdk_dir() -> Result<Option<PathBuf>> {
    let Some(dir) = std::env::var_os(SDK_DIR_VARIABLE).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let dir = PathBuf::from(dir);
    std::fs::canonicalize(&dir).map(Some).map_err(|e| {
        HandoffError::BadInput(format!(
            "{SDK_DIR_VARIABLE} is {}, which cannot be read ({e}): it names the directory holding the SDK packages",
            dir.display()
        ))
    })
}

/// `file` in the SDK directory `dir`, which must hold it.
pub(crate) fn sdk_package(dir: &Path, file: &str) -> Result<PathBuf> {
    let path = dir.join(file);
    if path.exists() {
        Ok(path)
    } else {
        Err(HandoffError::BadInput(format!(
            "{SDK_DIR_VARIABLE} ({}) has no {file}: it holds the SDK packages of this version of handoff (README, \"Writing a policy\", says how they are built)",
            dir.display()
        )))
    }
}
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
    let sdk = sdk_dir()?;
    let sdk = sdk.as_deref();
    let files = match lang {
        Lang::Rust => rust::files(name, sdk)?,
        Lang::Python => python::files(name, sdk)?,
        Lang::Javascript => javascript::files(name, sdk)?,
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
