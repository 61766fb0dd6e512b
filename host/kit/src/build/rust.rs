//! Builds a Rust policy crate with cargo for wasm32-wasip2.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use handoff_domain::error::{HandoffError, Result};

pub(super) fn build(dir: &Path) -> Result<PathBuf> {
    let output = super::toolchain("cargo")
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            HandoffError::BadInput(format!("cannot run cargo: {e}; is Rust installed?"))
        })?;
    if !output.status.success() {
        return Err(HandoffError::BadInput(format!(
            "cargo build failed ({}): see its output above",
            output.status
        )));
    }
    // The component is the artifact cargo reports with a `.wasm` file.
    let mut wasm = None;
    for line in output.stdout.split(|b| *b == b'\n') {
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        if let Some(files) = message["filenames"].as_array() {
            for file in files.iter().filter_map(|f| f.as_str()) {
                if file.ends_with(".wasm") {
                    wasm = Some(PathBuf::from(file));
                }
            }
        }
    }
    wasm.ok_or_else(|| {
        HandoffError::BadInput(
            "cargo built no .wasm file: is the crate a cdylib (`crate-type = [\"cdylib\", \"rlib\"]`)?"
                .into(),
        )
    })
}
