//! Builds the shipped policy components (`guest/default`, `guest/batching`, `guest/quarantine`,
//! `guest/domain-events`) for wasm32-wasip2 and embeds them with their digests: the default runs
//! when no policy is given, and `handoff policy export NAME` writes any of them.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn main() {
    let workspace = handoff_guest_build::workspace(1);
    version_facts(&workspace);
    handoff_guest_build::rerun_if_changed(
        &workspace,
        &[
            "guest/default",
            "guest/batching",
            "guest/quarantine",
            "guest/domain-events",
            "guest/sdk",
            "wit",
            "Cargo.lock",
        ],
    );
    let target_dir = handoff_guest_build::target_dir(&workspace);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // One build each: the policies share the SDK, and separate builds keep their exports apart.
    for name in ["default", "batching", "quarantine", "domain-events"] {
        let release = handoff_guest_build::build(
            &workspace,
            &target_dir,
            &["-p", &format!("handoff-{name}-policy"), "--lib"],
        );
        let artifact = name.replace('-', "_");
        let wasm = release.join(format!("handoff_{artifact}_policy.wasm"));
        let bytes =
            std::fs::read(&wasm).unwrap_or_else(|e| panic!("reading {}: {e}", wasm.display()));
        std::fs::write(out_dir.join(format!("{name}-policy.wasm")), &bytes).expect("write policy");
        std::fs::write(
            out_dir.join(format!("{name}-policy.sha256")),
            hex::encode(Sha256::digest(&bytes)),
        )
        .expect("write digest");
    }
}

/// What `handoff --version` states besides the package version: the contract (from the WIT
/// package line), the wasmtime release (from Cargo.lock) and the build's commit
/// (`HANDOFF_BUILD_COMMIT`, else `git rev-parse HEAD`, else `unknown`).
fn version_facts(workspace: &Path) {
    let wit = workspace.join("wit/policy.wit");
    println!("cargo:rerun-if-changed={}", wit.display());
    let wit = std::fs::read_to_string(&wit).expect("wit/policy.wit");
    let contract = wit
        .lines()
        .find_map(|line| line.trim().strip_prefix("package handoff:policy@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("the WIT package line");
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
