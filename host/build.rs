//! Builds the default policy component (`guest/default`) for wasm32-wasip2 and embeds it with its
//! digest.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

fn main() {
    let workspace = handoff_guest_build::workspace(1);
    handoff_guest_build::rerun_if_changed(
        &workspace,
        &["guest/default", "guest/sdk", "wit", "Cargo.lock"],
    );
    let target_dir = handoff_guest_build::target_dir(&workspace);
    let release = handoff_guest_build::build(
        &workspace,
        &target_dir,
        &["-p", "handoff-default-policy", "--lib"],
    );
    let wasm = release.join("handoff_default_policy.wasm");
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("reading {}: {e}", wasm.display()));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("default-policy.wasm"), &bytes).expect("write policy");
    std::fs::write(
        out_dir.join("default-policy.sha256"),
        hex::encode(Sha256::digest(&bytes)),
    )
    .expect("write digest");
}
