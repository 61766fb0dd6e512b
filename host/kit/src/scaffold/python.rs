//! The Python template: the decisions module on the SDK package `handoff-policy` (the wheel built
//! from guest/python), named by version in the project's `requirements.txt`, built with
//! componentize-py at the pinned version. The package carries the run loop and the contract
//! (`componentize-py.toml` points componentize-py at its `wit/`), so the project holds neither.

use std::path::{Path, PathBuf};

use handoff_domain::error::{HandoffError, Result};

use super::SAMPLE_STREAM;

/// The componentize-py version projects are created with: `[tool.handoff] componentize-py` in
/// their pyproject.toml, which `policy build` holds the installed componentize-py to.
pub(crate) const COMPONENTIZE_PY: &str = "0.25.1";

/// The SDK package's project file: its name and version are the ones projects install.
const SDK_PYPROJECT: &str = include_str!("../../../../guest/python/pyproject.toml");
const POLICY_PY: &str = include_str!("../templates/python/policy.py.txt");
const TEST_POLICY_PY: &str = include_str!("../templates/python/test_policy.py.txt");
const README_MD: &str = include_str!("../templates/python/README.md.txt");

/// The SDK package's distribution name.
pub(crate) const SDK_PACKAGE: &str = "handoff-policy";

/// The version of the Python SDK this binary was built with.
pub(crate) fn sdk_version() -> Result<String> {
    let project: toml::Table = SDK_PYPROJECT
        .parse()
        .map_err(|e| HandoffError::Internal(anyhow::anyhow!("the Python SDK's pyproject: {e}")))?;
    project
        .get("project")
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            HandoffError::Internal(anyhow::anyhow!("the Python SDK's pyproject has no version"))
        })
}

/// The project's files for a policy called `name`, installing the SDK from `sdk` when given.
pub(super) fn files(name: &str, sdk: Option<&Path>) -> Result<Vec<(PathBuf, String)>> {
    let version = sdk_version()?;
    let pyproject = format!(
        r#"[project]
name = "{name}"
version = "0.1.0"
description = "A handoff policy component"
requires-python = ">=3.9"

# `handoff policy build` runs componentize-py at this version (and refuses another), so that a
# project builds the same component wherever it is built.
[tool.handoff]
componentize-py = "{COMPONENTIZE_PY}"
"#
    );
    let mut requirements = String::from(
        "# The policy SDK, by version: `pip install -r requirements.txt` in the project's virtual\n\
         # environment. A fix to the SDK reaches this policy by moving to its new version.\n",
    );
    if let Some(dir) = sdk {
        let wheel = format!("handoff_policy-{version}-py3-none-any.whl");
        super::sdk_package(dir, &wheel)?;
        requirements.push_str(&format!(
            "# The SDK packages this policy installs from (offline: add --no-index).\n--find-links {}\n",
            dir.display()
        ));
    }
    requirements.push_str(&format!("{SDK_PACKAGE}=={version}\n"));
    Ok(vec![
        ("pyproject.toml".into(), pyproject),
        ("requirements.txt".into(), requirements),
        (
            ".gitignore".into(),
            "/build\n__pycache__/\n.venv/\n".to_string(),
        ),
        ("policy.py".into(), POLICY_PY.replace("{name}", name)),
        ("test_policy.py".into(), TEST_POLICY_PY.to_string()),
        (
            "README.md".into(),
            README_MD
                .replace("{name}", name)
                .replace("{componentize_py}", COMPONENTIZE_PY)
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

    #[test]
    fn the_pin_is_the_one_the_test_run_installs() {
        let requirements =
            include_str!("../../../../tests/python/requirements-componentize-py.txt");
        let pin = format!("componentize-py=={COMPONENTIZE_PY}");
        assert!(
            requirements.lines().any(|line| line.trim() == pin),
            "tests/python/requirements-componentize-py.txt does not pin {pin}"
        );
        let default = include_str!("../../../../guest/python/default/pyproject.toml");
        assert!(default.contains(&format!("componentize-py = \"{COMPONENTIZE_PY}\"")));
    }

    /// The SDK package builds components against this host's contract: its copy is the
    /// repository's `wit/policy.wit`.
    #[test]
    fn the_sdk_package_carries_the_contract() {
        let copy = include_str!("../../../../guest/python/handoff_policy/wit/policy.wit");
        assert!(
            copy == super::super::CONTRACT_WIT,
            "guest/python/handoff_policy/wit/policy.wit differs from wit/policy.wit: copy it"
        );
    }

    #[test]
    fn the_project_names_its_pin_and_the_sdk_by_version() {
        let version = sdk_version().unwrap();
        let files = files("shop-policy", None).unwrap();
        let get = |path: &str| {
            files
                .iter()
                .find(|(p, _)| p == &PathBuf::from(path))
                .map(|(_, c)| c.as_str())
                .unwrap_or_else(|| panic!("no {path}"))
        };
        assert!(get("pyproject.toml").contains("componentize-py = \"0.25.1\""));
        assert!(
            get("requirements.txt")
                .lines()
                .any(|line| line == format!("handoff-policy=={version}"))
        );
        assert!(!get("requirements.txt").contains("--find-links"));
        assert!(get("policy.py").contains("def decide(event)"));
        let readme = get("README.md");
        assert!(readme.starts_with("# shop-policy\n"));
        assert!(readme.contains("pip install componentize-py==0.25.1"));
        assert!(!readme.contains("{name}") && !readme.contains("{componentize_py}"));
        // No SDK source and no contract copy: both come with the package.
        assert!(
            !files
                .iter()
                .any(|(p, _)| p.starts_with("wit") || p.ends_with("handoff_policy.py"))
        );
    }

    #[test]
    fn an_sdk_directory_is_where_the_project_installs_from() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            files("p", Some(dir.path())).is_err(),
            "the wheel is missing"
        );
        let version = sdk_version().unwrap();
        std::fs::write(
            dir.path()
                .join(format!("handoff_policy-{version}-py3-none-any.whl")),
            "",
        )
        .unwrap();
        let files = files("p", Some(dir.path())).unwrap();
        let requirements = &files[1].1;
        assert!(
            requirements.contains(&format!("--find-links {}\n", dir.path().display())),
            "{requirements}"
        );
    }
}
