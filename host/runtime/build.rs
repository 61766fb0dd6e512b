//! Builds the shipped policy components (`guest/default`, `guest/batching`, `guest/quarantine`,
//! `guest/domain-events`) for wasm32-wasip2 and embeds them with their digests: the default runs
//! when no policy is given, and `handoff policy export NAME` writes any of them. States the
//! contract's version (`HANDOFF_CONTRACT`), read from `wit/policy.wit`.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

fn main() {
    let workspace = handoff_guest_build::workspace(2);
    println!(
        "cargo:rustc-env=HANDOFF_CONTRACT={}",
        handoff_guest_build::contract(&workspace)
    );
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
