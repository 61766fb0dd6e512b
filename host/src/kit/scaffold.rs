//! `handoff policy new NAME`: a policy crate that builds, tests and passes its own cases as
//! generated.
//!
//! The crate is standalone (its own workspace, toolchain file and a copy of the contract): plain
//! Rust decisions unit-tested natively, a thin component shell for wasm32-wasip2, and a sample case
//! whose expectations are recorded with the embedded default policy, which the template starts as.

use std::path::{Path, PathBuf};

use crate::error::{HandoffError, Result};

const CONTRACT_WIT: &str = include_str!("../../../wit/policy.wit");
const LIB_RS: &str = include_str!("templates/lib.rs.txt");
const README_MD: &str = include_str!("templates/README.md.txt");
const SAMPLE_STREAM: &str = include_str!("templates/stream.jsonl");

/// Creates `dir/name` and returns its path. Refuses an existing directory.
pub fn scaffold(dir: &Path, name: &str) -> Result<PathBuf> {
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
    let crate_name = name.replace('-', "_");
    let cargo_toml = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
sha2 = "0.10"
hex = "0.4"

[target.'cfg(target_arch = "wasm32")'.dependencies]
wit-bindgen = "0.61"

[profile.release]
lto = true
codegen-units = 1
strip = true

# A policy is its own workspace.
[workspace]
"#
    );
    let toolchain = "[toolchain]\nchannel = \"1.99.1\"\ntargets = [\"wasm32-wasip2\"]\n";
    let files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), cargo_toml),
        ("rust-toolchain.toml".into(), toolchain.to_string()),
        (".gitignore".into(), "/target\n".to_string()),
        ("wit/policy.wit".into(), CONTRACT_WIT.to_string()),
        ("src/lib.rs".into(), LIB_RS.to_string()),
        (
            "README.md".into(),
            README_MD
                .replace("{name}", name)
                .replace("{crate_name}", &crate_name),
        ),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
    ];
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
