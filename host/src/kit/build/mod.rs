//! `handoff policy build`: runs the toolchain of the project's language, then the caller checks
//! the component it produced. `--watch` builds again whenever a source file changes.

mod javascript;
mod python;
mod rust;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::lang::Lang;
use crate::error::{HandoffError, Result};

/// Builds the policy project in `dir` and returns the component's path.
pub fn build(dir: &Path) -> Result<PathBuf> {
    match Lang::detect(dir)? {
        Lang::Rust => rust::build(dir),
        Lang::Python => python::build(dir),
        Lang::Javascript => javascript::build(dir),
    }
}

/// Runs a toolchain command in `dir`, its output passed through; a failure or a missing program
/// is bad input naming the command.
pub fn run_tool(dir: &Path, command: &mut Command, what: &str) -> Result<()> {
    let shown = format!("{command:?}");
    tracing::info!(command = %shown, "building");
    let status = command.current_dir(dir).status().map_err(|e| {
        HandoffError::BadInput(format!(
            "cannot run {what} ({shown}): {e}; is it installed?"
        ))
    })?;
    if !status.success() {
        return Err(HandoffError::BadInput(format!(
            "{what} failed ({status}): see its output above"
        )));
    }
    Ok(())
}

/// Directories a build writes or tools keep, never watched.
const NOT_SOURCES: &[&str] = &[
    "target",
    "node_modules",
    ".git",
    "__pycache__",
    "build",
    ".venv",
];

/// Every source file's path, modification time and length: what `--watch` compares.
pub fn sources(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name();
            if meta.is_dir() {
                if !NOT_SOURCES.iter().any(|skip| name == *skip) {
                    pending.push(path);
                }
            } else if path.extension().is_none_or(|ext| ext != "wasm") {
                found.push((path, meta.modified().ok(), meta.len()));
            }
        }
    }
    found.sort();
    found
}

/// How often `--watch` looks for changes.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);
