//! Builds a javascript policy project.

use std::path::{Path, PathBuf};

use crate::error::{HandoffError, Result};

pub(super) fn build(dir: &Path) -> Result<PathBuf> {
    Err(HandoffError::BadInput(format!(
        "{}: building javascript policies is not available yet",
        dir.display()
    )))
}
