//! The Python template: the decisions module on the SDK (a copy of guest/python/handoff_policy.py,
//! which owns the run loop), built with componentize-py at the pinned version.

use std::path::PathBuf;

use super::{CONTRACT_WIT, SAMPLE_STREAM};

/// The componentize-py version projects are created with: `[tool.handoff] componentize-py` in
/// their pyproject.toml, which `policy build` holds the installed componentize-py to.
pub(crate) const COMPONENTIZE_PY: &str = "0.25.1";

/// The SDK: one module, the same as the repository's Python policies build on.
const SDK: &str = include_str!("../../../../guest/python/handoff_policy.py");
const POLICY_PY: &str = include_str!("../templates/python/policy.py.txt");
const TEST_POLICY_PY: &str = include_str!("../templates/python/test_policy.py.txt");
const README_MD: &str = include_str!("../templates/python/README.md.txt");

/// The project's files for a policy called `name`.
pub(super) fn files(name: &str) -> Vec<(PathBuf, String)> {
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
    vec![
        ("pyproject.toml".into(), pyproject),
        (
            ".gitignore".into(),
            "/build\n__pycache__/\n.venv/\n".to_string(),
        ),
        ("wit/policy.wit".into(), CONTRACT_WIT.to_string()),
        ("handoff_policy.py".into(), SDK.to_string()),
        ("policy.py".into(), POLICY_PY.replace("{name}", name)),
        ("test_policy.py".into(), TEST_POLICY_PY.to_string()),
        (
            "README.md".into(),
            README_MD
                .replace("{name}", name)
                .replace("{componentize_py}", COMPONENTIZE_PY),
        ),
        (
            "cases/sample/stream.jsonl".into(),
            SAMPLE_STREAM.to_string(),
        ),
    ]
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

    #[test]
    fn the_project_names_its_pin_and_carries_the_sdk_and_the_contract() {
        let files = files("shop-policy");
        let get = |path: &str| {
            files
                .iter()
                .find(|(p, _)| p == &PathBuf::from(path))
                .map(|(_, c)| c.as_str())
                .unwrap_or_else(|| panic!("no {path}"))
        };
        assert!(get("pyproject.toml").contains("componentize-py = \"0.25.1\""));
        assert!(get("handoff_policy.py").contains("def run(decisions, settings, host)"));
        assert_eq!(get("wit/policy.wit"), CONTRACT_WIT);
        assert!(get("policy.py").contains("def decide(event)"));
        let readme = get("README.md");
        assert!(readme.starts_with("# shop-policy\n"));
        assert!(readme.contains("pip install componentize-py==0.25.1"));
        assert!(!readme.contains("{name}") && !readme.contains("{componentize_py}"));
    }
}
