//! Builds the default policy component (`guest/`) for wasm32-wasip2 and embeds it with its digest.
//!
//! The guest is built by a nested cargo into its own target directory, so it never waits on the
//! lock of the build that runs this script.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.parent().expect("workspace root").to_path_buf();
    for watched in [
        "guest/src",
        "guest/Cargo.toml",
        "guest/sdk",
        "wit",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("policy-build");
    let wasm = build_component(
        &workspace,
        &target_dir,
        "handoff-default-policy",
        &["--lib"],
    )
    .join("handoff_default_policy.wasm");
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("reading {}: {e}", wasm.display()));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("default-policy.wasm"), &bytes).expect("write policy");
    std::fs::write(
        out_dir.join("default-policy.sha256"),
        hex::encode(Sha256::digest(&bytes)),
    )
    .expect("write digest");
}

/// Runs `cargo build --release --target wasm32-wasip2 -p PACKAGE ARGS` and returns the directory
/// holding the artifacts.
fn build_component(workspace: &Path, target_dir: &Path, package: &str, args: &[&str]) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ])
        .args(args)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .status()
        .expect("running cargo for the policy component");
    assert!(
        status.success(),
        "building {package} for wasm32-wasip2 failed"
    );
    target_dir.join("wasm32-wasip2").join("release")
}
