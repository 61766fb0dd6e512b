//! Builds policy crates into WebAssembly components, for the build scripts that embed them (the
//! host's default policy) or test them (the test policies and the shipped ones).
//!
//! A nested cargo builds into its own target directory (`<target>/policy-build`), so it never
//! waits on the lock of the build that runs the script, with the flags of a shipped component:
//! release, stripped, LTO, one codegen unit, none of the outer build's `RUSTFLAGS`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root, from a build script's `CARGO_MANIFEST_DIR` and the number of levels the
/// crate sits below it.
pub fn workspace(levels_up: usize) -> PathBuf {
    let mut dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    for _ in 0..levels_up {
        dir = dir
            .parent()
            .expect("a workspace above the crate")
            .to_path_buf();
    }
    dir
}

/// The target directory of the nested builds: `policy-build` inside the outer one.
pub fn target_dir(workspace: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("policy-build")
}

/// Asks cargo to run the build script again when any of `paths` (relative to the workspace)
/// changes.
pub fn rerun_if_changed(workspace: &Path, paths: &[&str]) {
    for path in paths {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }
}

/// Runs `cargo build --release --target wasm32-wasip2 ARGS` in `workspace` into `target_dir`
/// and returns the directory holding the artifacts. Panics (failing the build) when it fails.
pub fn build(workspace: &Path, target_dir: &Path, args: &[&str]) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .args(args)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        // The same bytes whoever asks: under `cargo clippy` the build script's environment
        // names clippy's driver as the compiler's wrapper, which would build the components
        // (and embed them) otherwise than `cargo build` does.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .status()
        .expect("running cargo for the policy components");
    assert!(
        status.success(),
        "building {args:?} for wasm32-wasip2 failed"
    );
    target_dir.join("wasm32-wasip2").join("release")
}

/// The contract's version, from the package line of `wit/policy.wit` (`package
/// handoff:policy@X.Y.Z;`), the one place it is written; asks cargo to run the build script again
/// when the file changes.
pub fn contract(workspace: &Path) -> String {
    let wit = workspace.join("wit/policy.wit");
    println!("cargo:rerun-if-changed={}", wit.display());
    let text = std::fs::read_to_string(&wit).expect("wit/policy.wit");
    text.lines()
        .find_map(|line| line.trim().strip_prefix("package handoff:policy@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("the WIT package line")
        .to_string()
}
