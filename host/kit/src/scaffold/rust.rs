//! The Rust template: a standalone crate (its own workspace and toolchain file) holding only its
//! decisions, on the policy SDK. The SDK is not on a registry, so the project carries a copy of it
//! (`handoff-policy-sdk/`, a path dependency): the same sources as this repository's `guest/sdk`,
//! embedded here, so a generated project builds offline with the loop the shipped policies run.

use std::path::PathBuf;

use super::{CONTRACT_WIT, SAMPLE_STREAM};

const LIB_RS: &str = include_str!("../templates/rust/lib.rs.txt");
const README_MD: &str = include_str!("../templates/rust/README.md.txt");

/// The SDK's files, copied as they are (its manifest has no workspace inheritance; its build
/// script only compares its contract with the repository's, so it is left out).
const SDK: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../../guest/sdk/Cargo.toml"),
    ),
    ("README.md", include_str!("../../../../guest/sdk/README.md")),
    (
        "src/lib.rs",
        include_str!("../../../../guest/sdk/src/lib.rs"),
    ),
    (
        "src/types.rs",
        include_str!("../../../../guest/sdk/src/types.rs"),
    ),
    (
        "src/component.rs",
        include_str!("../../../../guest/sdk/src/component.rs"),
    ),
    (
        "src/fake.rs",
        include_str!("../../../../guest/sdk/src/fake.rs"),
    ),
    (
        "src/tests.rs",
        include_str!("../../../../guest/sdk/src/tests.rs"),
    ),
];

/// Where the project keeps its copy of the SDK.
const SDK_DIR: &str = "handoff-policy-sdk";

/// The project's files for a crate called `name`.
pub(super) fn files(name: &str) -> Vec<(PathBuf, String)> {
    let crate_name = name.replace('-', "_");
    let cargo_toml = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
# The policy SDK (a copy carried by the project): the run loop, the contract's bindings and a
# fake host for tests.
handoff-policy-sdk = {{ path = "{SDK_DIR}" }}

[profile.release]
lto = true
codegen-units = 1
strip = true

# A policy is its own workspace (the SDK copy is a member).
[workspace]
"#
    );
    let toolchain = "[toolchain]\nchannel = \"1.99.1\"\ntargets = [\"wasm32-wasip2\"]\n";
    let mut files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), cargo_toml),
        ("rust-toolchain.toml".into(), toolchain.to_string()),
        (".gitignore".into(), "/target\n".to_string()),
        ("src/lib.rs".into(), LIB_RS.to_string()),
        (
            "README.md".into(),
            README_MD
                .replace("{name}", name)
                .replace("{crate_name}", &crate_name),
        ),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
        (
            PathBuf::from(SDK_DIR).join("wit/policy.wit"),
            CONTRACT_WIT.to_string(),
        ),
    ];
    files.extend(
        SDK.iter()
            .map(|(path, text)| (PathBuf::from(SDK_DIR).join(path), text.to_string())),
    );
    files
}

#[cfg(test)]
mod tests {
    use super::SDK;

    /// A new source file of the SDK reaches generated projects: the copied list holds every
    /// file of `guest/sdk/src`, and nothing else.
    #[test]
    fn every_sdk_source_file_is_copied() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("guest/sdk/src")
            .map(|entry| {
                let name = entry.expect("an entry").file_name();
                format!("src/{}", name.to_string_lossy())
            })
            .collect();
        let mut copied: Vec<String> = SDK
            .iter()
            .map(|(path, _)| path.to_string())
            .filter(|path| path.starts_with("src/"))
            .collect();
        on_disk.sort();
        copied.sort();
        assert_eq!(on_disk, copied);
    }
}
