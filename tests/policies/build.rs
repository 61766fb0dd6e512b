//! Builds every example of this crate, and the policies shipped in `guest/`, as wasm32-wasip2
//! policy components and exposes their paths as constants (`src/lib.rs`), one per file in
//! `examples/`. A nested cargo builds them, one package per invocation (the shipped policies
//! share the SDK, and one build each keeps their exports apart).

use std::path::PathBuf;

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
    (
        "handoff-domain-events-policy",
        "handoff_domain_events_policy",
        "DOMAIN_EVENTS",
    ),
];

fn main() {
    let workspace = handoff_guest_build::workspace(2);
    handoff_guest_build::rerun_if_changed(
        &workspace,
        &[
            "tests/policies/examples",
            "tests/policies/Cargo.toml",
            "wit",
            "guest",
        ],
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    if std::env::var("TARGET").is_ok_and(|t| t.starts_with("wasm32")) {
        // The nested build itself: nothing to embed.
        std::fs::write(out_dir.join("paths.rs"), "").expect("write paths");
        return;
    }
    let target_dir = handoff_guest_build::target_dir(&workspace);
    let release = handoff_guest_build::build(
        &workspace,
        &target_dir,
        &["-p", "handoff-test-policies", "--examples"],
    );
    for (package, _, _) in SHIPPED {
        handoff_guest_build::build(&workspace, &target_dir, &["-p", package, "--lib"]);
    }
    let mut paths = String::new();
    let mut constant = |name: &str, path: PathBuf| {
        // An example without its `[[example]]` entry (crate-type cdylib) is not a component.
        assert!(
            path.exists(),
            "missing {}: is the example registered in tests/policies/Cargo.toml?",
            path.display()
        );
        paths.push_str(&format!(
            "/// The `{name}` policy component.\npub const {}: &str = {:?};\n",
            name.to_uppercase(),
            path.canonicalize().expect("canonical path")
        ));
    };
    let examples = workspace.join("tests/policies/examples");
    let mut names: Vec<String> = std::fs::read_dir(&examples)
        .expect("the examples folder")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    names.sort();
    for name in &names {
        constant(name, release.join("examples").join(format!("{name}.wasm")));
    }
    for (_, artifact, name) in SHIPPED {
        constant(name, release.join(format!("{artifact}.wasm")));
    }
    std::fs::write(out_dir.join("paths.rs"), paths).expect("write paths");
}
