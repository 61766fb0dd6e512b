//! Builds every example of this crate, and the policies shipped in `guest/`, as wasm32-wasip2
//! policy components and exposes their paths as constants (`src/lib.rs`). A nested cargo builds
//! them into its own target directory, one package per invocation (the shipped policies share the
//! SDK, and one build each keeps their exports apart).

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
    "huge_id",
    "move_backwards",
    "read_file",
    "read_env",
    "hoard",
    "legacy_v1_0",
    "future_minor",
    "future_major",
    "forge_output",
    "sleep_forever",
    "poll_forever",
    "clocks_and_random",
    "log_amplifier",
];

/// Policies shipped with the project: (package, artifact, constant).
const SHIPPED: &[(&str, &str, &str)] = &[
    (
        "handoff-batching-policy",
        "handoff_batching_policy",
        "BATCHING",
    ),
    (
        "handoff-quarantine-policy",
        "handoff_quarantine_policy",
        "QUARANTINE",
    ),
    (
        "handoff-default-policy",
        "handoff_default_policy",
        "DEFAULT",
    ),
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
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("guest").display()
    );
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
    build(
        &workspace,
        &target_dir,
        &["-p", "handoff-test-policies", "--examples"],
    );
    for (package, _, _) in SHIPPED {
        build(&workspace, &target_dir, &["-p", package, "--lib"]);
    }
    let release = target_dir.join("wasm32-wasip2/release");
    let mut paths = String::new();
    let mut constant = |name: &str, path: PathBuf| {
        assert!(path.exists(), "missing {}", path.display());
        paths.push_str(&format!(
            "/// The `{name}` policy component.\npub const {}: &str = {:?};\n",
            name.to_uppercase(),
            path.canonicalize().expect("canonical path")
        ));
    };
    for name in POLICIES {
        constant(name, release.join("examples").join(format!("{name}.wasm")));
    }
    for (_, artifact, name) in SHIPPED {
        constant(name, release.join(format!("{artifact}.wasm")));
    }
    std::fs::write(out_dir.join("paths.rs"), paths).expect("write paths");
}

/// Runs `cargo build --release --target wasm32-wasip2 ARGS` into `target_dir`.
fn build(workspace: &std::path::Path, target_dir: &std::path::Path, args: &[&str]) {
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
        .status()
        .expect("running cargo for the policy components");
    assert!(
        status.success(),
        "building {args:?} for wasm32-wasip2 failed"
    );
}
