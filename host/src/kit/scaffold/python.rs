//! The Python template.

use std::path::PathBuf;

/// The project's files for a policy called `name`.
pub(super) fn files(_name: &str) -> Vec<(PathBuf, String)> {
    Vec::new()
}
