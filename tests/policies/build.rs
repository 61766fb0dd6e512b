//! Builds every example of this crate as a wasm32-wasip2 policy component and exposes their paths
//! as constants (`src/lib.rs`). A nested cargo builds them into its own target directory.

use std::path::PathBuf;
use std::process::Command;

const POLICIES: &[&str] = &[
    "prefixed_ids",
    "spin_forever",
    "memory_hog",
    "deep_recursion",
    "forged_token",
    "skip_ahead",
    "trap",
    "false_report",
    "net_client",
];

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.join("../..");
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("examples").display()
    );
    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    if std::env::var("TARGET").is_ok_and(|t| t.starts_with("wasm32")) {
        // The nested build itself: nothing to embed.
        std::fs::write(out_dir.join("paths.rs"), "").expect("write paths");
        return;
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("policy-build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&workspace)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            "handoff-test-policies",
            "--examples",
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .status()
        .expect("running cargo for the test policies");
    assert!(
        status.success(),
        "building the test policies for wasm32-wasip2 failed"
    );
    let dir = target_dir.join("wasm32-wasip2/release/examples");
    let mut paths = String::new();
    for name in POLICIES {
        let path = dir.join(format!("{name}.wasm"));
        assert!(path.exists(), "missing {}", path.display());
        paths.push_str(&format!(
            "/// The `{name}` policy component.\npub const {}: &str = {:?};\n",
            name.to_uppercase(),
            path.canonicalize().expect("canonical path")
        ));
    }
    std::fs::write(out_dir.join("paths.rs"), paths).expect("write paths");
}
