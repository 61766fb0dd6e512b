//! The Rust template: a standalone crate (its own workspace and toolchain file) on wit-bindgen.

use std::path::PathBuf;

use super::{CONTRACT_WIT, SAMPLE_STREAM};

const LIB_RS: &str = include_str!("../templates/rust/lib.rs.txt");
const README_MD: &str = include_str!("../templates/rust/README.md.txt");

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
sha2 = "0.10"
hex = "0.4"

[target.'cfg(target_arch = "wasm32")'.dependencies]
wit-bindgen = "0.61"

[profile.release]
lto = true
codegen-units = 1
strip = true

# A policy is its own workspace.
[workspace]
"#
    );
    let toolchain = "[toolchain]\nchannel = \"1.99.1\"\ntargets = [\"wasm32-wasip2\"]\n";
    vec![
        ("Cargo.toml".into(), cargo_toml),
        ("rust-toolchain.toml".into(), toolchain.to_string()),
        (".gitignore".into(), "/target\n".to_string()),
        ("wit/policy.wit".into(), CONTRACT_WIT.to_string()),
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
    ]
}
