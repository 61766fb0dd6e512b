//! The facts `handoff --version` states besides the package version.

use std::path::Path;
use std::process::Command;

fn main() {
    let workspace = handoff_guest_build::workspace(1);
    version_facts(&workspace);
}

/// What `handoff --version` states besides the package version: the contract (from the WIT
/// package line), the wasmtime release (from Cargo.lock) and the build's commit
/// (`HANDOFF_BUILD_COMMIT`, else `git rev-parse HEAD`, else `unknown`).
fn version_facts(workspace: &Path) {
    let contract = handoff_guest_build::contract(workspace);
    let major = contract.split('.').next().expect("a major version");
    println!("cargo:rustc-env=HANDOFF_CONTRACT={contract}");
    println!("cargo:rustc-env=HANDOFF_CONTRACT_OLDEST={major}.0.0");

    let lock = std::fs::read_to_string(workspace.join("Cargo.lock")).expect("Cargo.lock");
    let mut lines = lock.lines();
    let wasmtime = loop {
        match lines.next() {
            Some("name = \"wasmtime\"") => {
                break lines
                    .next()
                    .and_then(|l| l.strip_prefix("version = \""))
                    .and_then(|l| l.strip_suffix('"'))
                    .expect("wasmtime's version in Cargo.lock");
            }
            Some(_) => {}
            None => panic!("wasmtime is not in Cargo.lock"),
        }
    };
    println!("cargo:rustc-env=HANDOFF_WASMTIME_VERSION={wasmtime}");

    println!("cargo:rerun-if-env-changed=HANDOFF_BUILD_COMMIT");
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(workspace)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // The commit changes with HEAD and with the branch it names.
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }
    let commit = std::env::var("HANDOFF_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HANDOFF_BUILD_COMMIT={commit}");
}
