//! The JavaScript template: a standalone npm project (its `package.json` pins componentize-js) on
//! the JavaScript SDK, which owns the run loop; the author writes `decide` (and `init`).

use std::path::{Path, PathBuf};

use handoff_domain::error::Result;

use super::{CONTRACT_WIT, SAMPLE_STREAM};

const POLICY_JS: &str = include_str!("../templates/javascript/policy.js.txt");
const POLICY_TEST_JS: &str = include_str!("../templates/javascript/policy.test.js.txt");
const COMPONENT_JS: &str = include_str!("../templates/javascript/component.js.txt");
const PACKAGE_JSON: &str = include_str!("../templates/javascript/package.json.txt");
const README_MD: &str = include_str!("../templates/javascript/README.md.txt");
/// The SDK and its fake host, as `guest/javascript/sdk` holds them.
const SDK_JS: &str = include_str!("../../../../guest/javascript/sdk/handoff.js");
const FAKE_HOST_JS: &str = include_str!("../../../../guest/javascript/sdk/fake-host.js");

/// The project's files for a policy called `name` (the JavaScript SDK is still copied into the
/// project: an SDK directory is not used).
pub(super) fn files(name: &str, _sdk: Option<&Path>) -> Result<Vec<(PathBuf, String)>> {
    Ok(vec![
        ("package.json".into(), PACKAGE_JSON.replace("{name}", name)),
        (".gitignore".into(), "/node_modules\n/build\n".to_string()),
        ("wit/policy.wit".into(), CONTRACT_WIT.to_string()),
        ("policy.js".into(), POLICY_JS.to_string()),
        ("policy.test.js".into(), POLICY_TEST_JS.to_string()),
        // The contract's version, from `wit/policy.wit` (the runtime's build script reads it).
        (
            "component.js".into(),
            COMPONENT_JS.replace("{contract}", &handoff_runtime::policy::CONTRACT.to_string()),
        ),
        ("handoff.js".into(), SDK_JS.to_string()),
        ("fake-host.js".into(), FAKE_HOST_JS.to_string()),
        ("README.md".into(), README_MD.replace("{name}", name)),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_is_an_npm_package_pinning_its_toolchain() {
        let files = files("shop-policy", None).unwrap();
        let package = &files
            .iter()
            .find(|(path, _)| path == &PathBuf::from("package.json"))
            .expect("package.json")
            .1;
        let package: serde_json::Value = serde_json::from_str(package).expect("valid JSON");
        assert_eq!(package["name"], "shop-policy");
        let version = package["devDependencies"]["@bytecodealliance/componentize-js"]
            .as_str()
            .expect("componentize-js pinned");
        assert!(
            version.chars().all(|c| c.is_ascii_digit() || c == '.'),
            "an exact version, not {version}"
        );
        // `npm run build` writes where `handoff policy build` does.
        let build = package["scripts"]["build"].as_str().unwrap_or("");
        assert!(
            build.contains("--out build/policy.wasm component.js"),
            "{build}"
        );
    }

    #[test]
    fn the_component_imports_the_contract_this_host_implements() {
        let files = files("shop-policy", None).unwrap();
        let component = &files
            .iter()
            .find(|(path, _)| path == &PathBuf::from("component.js"))
            .expect("component.js")
            .1;
        let import = format!(
            "'handoff:policy/host@{}'",
            handoff_runtime::policy::CONTRACT
        );
        assert!(component.contains(&import), "{component}");
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
