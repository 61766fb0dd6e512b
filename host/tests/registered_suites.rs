//! Every end-to-end suite in the workspace's top-level `tests/` folder is registered as a
//! `[[test]]` of this crate: cargo only discovers suites in the crate's own `tests/`, so an
//! unregistered `integration_*.rs` would silently never run.

use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn every_top_level_suite_is_registered() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suites: BTreeSet<String> = std::fs::read_dir(host.join("../tests"))
        .expect("the top-level tests folder")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.ends_with(".rs").then_some(name)
        })
        .collect();
    assert!(
        suites.iter().any(|s| s.starts_with("integration_")),
        "no suite found in tests/: {suites:?}"
    );
    let manifest = std::fs::read_to_string(host.join("Cargo.toml")).expect("host/Cargo.toml");
    let registered: BTreeSet<String> = manifest
        .lines()
        .filter_map(|line| {
            let path = line.trim().strip_prefix("path")?.trim_start();
            let path = path.strip_prefix('=')?.trim().trim_matches('"');
            path.strip_prefix("../tests/").map(str::to_string)
        })
        .collect();
    let missing: Vec<&String> = suites.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "suites in tests/ without a [[test]] entry in host/Cargo.toml: {missing:?}"
    );
    let dangling: Vec<&String> = registered.difference(&suites).collect();
    assert!(
        dangling.is_empty(),
        "[[test]] entries in host/Cargo.toml whose file is gone: {dangling:?}"
    );
}
