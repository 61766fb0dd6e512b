//! The Rust template: a standalone crate (its own workspace and toolchain file) holding only its
//! decisions, depending on the policy SDK by version (`handoff-policy-sdk = "X.Y.Z"`), which owns
//! the run loop and the contract's bindings. With an SDK directory, the project's
//! `.cargo/config.toml` patches crates.io's `handoff-policy-sdk` with the crate unpacked there, so
//! it builds offline; moving to a newer SDK is changing the version (and the patch's path).

use std::path::{Path, PathBuf};

use handoff_domain::error::{HandoffError, Result};

use super::SAMPLE_STREAM;

const LIB_RS: &str = include_str!("../templates/rust/lib.rs.txt");
const README_MD: &str = include_str!("../templates/rust/README.md.txt");
/// The SDK's manifest: its version is the one projects depend on.
const SDK_MANIFEST: &str = include_str!("../../../../guest/sdk/Cargo.toml");

/// The SDK crate's name.
pub(crate) const SDK_CRATE: &str = "handoff-policy-sdk";

/// The version of `guest/sdk` this binary was built with.
pub(crate) fn sdk_version() -> Result<String> {
    let manifest: toml::Table = SDK_MANIFEST
        .parse()
        .map_err(|e| HandoffError::Internal(anyhow::anyhow!("the SDK's manifest: {e}")))?;
    manifest
        .get("package")
        .and_then(|package| package.get("version"))
        .and_then(|version| version.as_str())
        .map(str::to_string)
        .ok_or_else(|| HandoffError::Internal(anyhow::anyhow!("the SDK's manifest has no version")))
}

/// The project's files for a crate called `name`, on the SDK from `sdk` when given.
pub(super) fn files(name: &str, sdk: Option<&Path>) -> Result<Vec<(PathBuf, String)>> {
    let crate_name = name.replace('-', "_");
    let version = sdk_version()?;
    let cargo_toml = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
# The policy SDK: the run loop, the contract's bindings and a fake host for tests.
{SDK_CRATE} = "{version}"

[profile.release]
lto = true
codegen-units = 1
strip = true

# A policy is its own workspace.
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
                .replace("{crate_name}", &crate_name)
                .replace("{sdk_version}", &version),
        ),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
    ];
    if let Some(dir) = sdk {
        let package = super::sdk_package(dir, &format!("{SDK_CRATE}-{version}/Cargo.toml"))?;
        let package = package.parent().unwrap_or(dir);
        let path = toml::Value::String(package.display().to_string());
        files.push((
            ".cargo/config.toml".into(),
            format!(
                "# Where the SDK comes from: the package unpacked in {dir} (the crate \
                 `cargo package` built), instead of crates.io.\n\
                 # To move to another SDK version, change it in Cargo.toml and here.\n\
                 [patch.crates-io]\n{SDK_CRATE} = {{ path = {path} }}\n",
                dir = dir.display()
            ),
        ));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_names_the_sdk_by_version_and_carries_none_of_it() {
        let version = sdk_version().unwrap();
        assert!(
            version.split('.').count() == 3 && version.split('.').all(|n| n.parse::<u32>().is_ok())
        );
        let files = files("shop-policy", None).unwrap();
        let manifest: toml::Table = files[0].1.parse().unwrap();
        assert_eq!(
            manifest["dependencies"][SDK_CRATE].as_str(),
            Some(version.as_str())
        );
        assert!(
            files.iter().all(|(path, _)| path.starts_with("src")
                || path.starts_with("cases")
                || path.components().count() == 1),
            "{:?}",
            files.iter().map(|(p, _)| p).collect::<Vec<_>>()
        );
        assert!(!files.iter().any(|(path, _)| path.starts_with(".cargo")));
    }

    #[test]
    fn an_sdk_directory_patches_crates_io_with_its_crate() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            files("p", Some(dir.path())).is_err(),
            "the crate is missing"
        );
        let version = sdk_version().unwrap();
        let package = dir.path().join(format!("{SDK_CRATE}-{version}"));
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join("Cargo.toml"), "").unwrap();
        let files = files("p", Some(dir.path())).unwrap();
        let config = &files
            .iter()
            .find(|(path, _)| path == &PathBuf::from(".cargo/config.toml"))
            .expect("a cargo configuration")
            .1;
        let config: toml::Table = config.parse().unwrap();
        assert_eq!(
            config["patch"]["crates-io"][SDK_CRATE]["path"].as_str(),
            Some(package.to_str().unwrap())
        );
    }
}
