//! Keeps the crate's copy of the contract (`wit/policy.wit`, what the bindings are generated from
//! and what a published crate carries) equal to the workspace's `wit/policy.wit`: inside the
//! workspace, a copy that differs fails the build. Outside it (a published crate, a copy in a
//! policy project) there is nothing to compare with.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let copy = manifest.join("wit/policy.wit");
    println!("cargo:rerun-if-changed={}", copy.display());
    let Some(workspace) = manifest.parent().and_then(Path::parent) else {
        return;
    };
    // Only where this crate is the workspace's `guest/sdk`.
    let is_workspace_sdk = std::fs::canonicalize(workspace.join("guest/sdk"))
        .ok()
        .zip(std::fs::canonicalize(&manifest).ok())
        .is_some_and(|(a, b)| a == b);
    let contract = workspace.join("wit/policy.wit");
    if !is_workspace_sdk || !contract.is_file() {
        return;
    }
    println!("cargo:rerun-if-changed={}", contract.display());
    let read = |path: &Path| {
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    };
    if read(&copy) != read(&contract) {
        panic!(
            "{} differs from the contract {}: copy it (cp wit/policy.wit guest/sdk/wit/policy.wit)",
            copy.display(),
            contract.display()
        );
    }
}
