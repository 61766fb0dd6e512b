//! The JavaScript template: a standalone npm project (its `package.json` pins componentize-js) on
//! the JavaScript SDK, the npm package `handoff-policy` named by version, which owns the run loop
//! and carries the contract and the component's entry; the author writes `decide` (and `init`).
//! With an SDK directory, the dependency is the package's tarball there (`file:`), so the project
//! installs offline; moving to a newer SDK is naming its tarball (or version).

use std::path::{Path, PathBuf};

use handoff_domain::error::{HandoffError, Result};

use super::SAMPLE_STREAM;

const POLICY_JS: &str = include_str!("../templates/javascript/policy.js.txt");
const POLICY_TEST_JS: &str = include_str!("../templates/javascript/policy.test.js.txt");
const PACKAGE_JSON: &str = include_str!("../templates/javascript/package.json.txt");
const README_MD: &str = include_str!("../templates/javascript/README.md.txt");
/// The SDK package's manifest: its name and version are the ones projects install.
const SDK_PACKAGE_JSON: &str = include_str!("../../../../guest/javascript/sdk/package.json");

/// The SDK package's name.
pub(crate) const SDK_PACKAGE: &str = "handoff-policy";

/// The version of the JavaScript SDK this binary was built with.
pub(crate) fn sdk_version() -> Result<String> {
    let manifest: serde_json::Value = serde_json::from_str(SDK_PACKAGE_JSON).map_err(|e| {
        HandoffError::Internal(anyhow::anyhow!("the JavaScript SDK's package.json: {e}"))
    })?;
    manifest["version"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            HandoffError::Internal(anyhow::anyhow!(
                "the JavaScript SDK's package.json has no version"
            ))
        })
}

/// The project's files for a policy called `name`, installing the SDK from `sdk` when given.
pub(super) fn files(name: &str, sdk: Option<&Path>) -> Result<Vec<(PathBuf, String)>> {
    let version = sdk_version()?;
    let dependency = match sdk {
        Some(dir) => {
            let tarball = super::sdk_package(dir, &format!("{SDK_PACKAGE}-{version}.tgz"))?;
            format!("file:{}", tarball.display())
        }
        None => version.clone(),
    };
    // The dependency as a JSON string (a path may hold any character).
    let dependency = serde_json::to_string(&dependency)
        .map_err(|e| HandoffError::Internal(anyhow::anyhow!("the SDK's dependency: {e}")))?;
    Ok(vec![
        (
            "package.json".into(),
            PACKAGE_JSON
                .replace("{name}", name)
                .replace("\"{sdk}\"", &dependency),
        ),
        (".gitignore".into(), "/node_modules\n/build\n".to_string()),
        ("policy.js".into(), POLICY_JS.replace("{name}", name)),
        ("policy.test.js".into(), POLICY_TEST_JS.to_string()),
        (
            "README.md".into(),
            README_MD
                .replace("{name}", name)
                .replace("{sdk_version}", &version),
        ),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(files: &'a [(PathBuf, String)], path: &str) -> &'a str {
        &files
            .iter()
            .find(|(p, _)| p == &PathBuf::from(path))
            .unwrap_or_else(|| panic!("no {path}"))
            .1
    }

    #[test]
    fn the_project_is_an_npm_package_pinning_its_toolchain_and_the_sdk() {
        let files = files("shop-policy", None).unwrap();
        let package: serde_json::Value =
            serde_json::from_str(get(&files, "package.json")).expect("valid JSON");
        assert_eq!(package["name"], "shop-policy");
        let version = package["devDependencies"]["@bytecodealliance/componentize-js"]
            .as_str()
            .expect("componentize-js pinned");
        assert!(
            version.chars().all(|c| c.is_ascii_digit() || c == '.'),
            "an exact version, not {version}"
        );
        // The SDK by version, and none of it in the project: no SDK module, entry or contract.
        assert_eq!(
            package["dependencies"][SDK_PACKAGE].as_str(),
            Some(sdk_version().unwrap().as_str())
        );
        let paths: Vec<_> = files.iter().map(|(p, _)| p.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "package.json",
                ".gitignore",
                "policy.js",
                "policy.test.js",
                "README.md",
                "cases/sample/stream.jsonl"
            ]
        );
        // `npm run build` writes where `handoff policy build` does, from the package's entry
        // and contract.
        let build = package["scripts"]["build"].as_str().unwrap_or("");
        assert!(
            build.contains(
                "--wit node_modules/handoff-policy/wit/policy.wit --world-name effects-policy"
            ) && build.contains("--out build/policy.wasm node_modules/handoff-policy/component.js"),
            "{build}"
        );
    }

    /// The smallest policy is the generated one: at most 5 lines of code besides comments.
    #[test]
    fn the_generated_decisions_are_a_few_lines() {
        let files = files("shop-policy", None).unwrap();
        let code = get(&files, "policy.js")
            .lines()
            .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with("//"))
            .count();
        assert!(code <= 5, "{code} lines");
    }

    #[test]
    fn an_sdk_directory_makes_the_dependency_its_tarball() {
        let dir = tempfile::tempdir().unwrap();
        let error = files("p", Some(dir.path())).unwrap_err().to_string();
        let tarball = format!("{SDK_PACKAGE}-{}.tgz", sdk_version().unwrap());
        assert!(error.contains(&tarball), "{error}");
        std::fs::write(dir.path().join(&tarball), "").unwrap();
        let files = files("p", Some(dir.path())).unwrap();
        let package: serde_json::Value = serde_json::from_str(get(&files, "package.json")).unwrap();
        assert_eq!(
            package["dependencies"][SDK_PACKAGE].as_str(),
            Some(format!("file:{}", dir.path().join(&tarball).display()).as_str())
        );
    }

    /// The package carries the contract: its copy is the repository's `wit/policy.wit`, and its
    /// entry imports that copy's version; the package ships both.
    #[test]
    fn the_sdk_package_carries_the_contract_and_the_entry_imports_its_version() {
        let copy = include_str!("../../../../guest/javascript/sdk/wit/policy.wit");
        assert!(
            copy == super::super::CONTRACT_WIT,
            "guest/javascript/sdk/wit/policy.wit differs from wit/policy.wit: copy it"
        );
        let version = copy
            .lines()
            .find_map(|line| line.strip_prefix("package handoff:policy@"))
            .and_then(|rest| rest.strip_suffix(';'))
            .expect("the contract's package line");
        let entry = include_str!("../../../../guest/javascript/sdk/component.js");
        let import = format!("'handoff:policy/host@{version}'");
        assert!(entry.contains(&import), "{entry}");
        let manifest: serde_json::Value = serde_json::from_str(SDK_PACKAGE_JSON).unwrap();
        let shipped: Vec<_> = manifest["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f.as_str())
            .collect();
        for file in [
            "handoff.js",
            "fake-host.js",
            "component.js",
            "wit/policy.wit",
        ] {
            assert!(shipped.contains(&file), "{file} not in {shipped:?}");
        }
    }

    /// The JavaScript default's entry (`guest/javascript/default/component.js`, built by the
    /// JavaScript suite and the benchmarks) imports the same contract: a new minor version of
    /// `wit/policy.wit` fails here until it does.
    #[test]
    fn the_javascript_default_imports_the_contract_this_host_implements() {
        let component = include_str!("../../../../guest/javascript/default/component.js");
        let import = format!(
            "'handoff:policy/host@{}'",
            handoff_runtime::policy::CONTRACT
        );
        assert!(component.contains(&import), "{component}");
    }
}
