//! Builds a Python policy project with componentize-py: `policy.py` (the decisions) on the SDK
//! package `handoff_policy` (the component's entry module, installed in the project's virtual
//! environment, which componentize-py searches through `VIRTUAL_ENV`), into `build/policy.wasm`.
//! The contract comes with the SDK (its `componentize-py.toml` names its `wit/`); a project that
//! carries its own `wit/` (one generated before the SDK was a package) is built against that.
//!
//! componentize-py is `HANDOFF_COMPONENTIZE_PY` when set, else `componentize-py` on `PATH`. Its
//! version must be the one the project pins (`[tool.handoff] componentize-py` in pyproject.toml):
//! each version embeds its own CPython and binding generator, so another version builds another
//! component (other bytes, possibly other WASI imports) than the one the project was tested with.
//! A mismatch is an error naming both versions and the pip command; changing the pin is the
//! deliberate way to move to another version.

use handoff_domain::error::{HandoffError, Result};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where the component is written, relative to the project.
pub const OUTPUT: &str = "build/policy.wasm";

/// The environment variable naming the componentize-py program.
pub const TOOL_VARIABLE: &str = "HANDOFF_COMPONENTIZE_PY";

pub(super) fn build(dir: &Path) -> Result<PathBuf> {
    if !dir.join("policy.py").is_file() {
        return Err(HandoffError::BadInput(format!(
            "{} has no policy.py (the decisions module); `handoff policy new NAME --lang python` creates a project with it",
            dir.display()
        )));
    }
    let pyproject = dir.join("pyproject.toml");
    let text = std::fs::read_to_string(&pyproject)
        .map_err(|e| HandoffError::BadInput(format!("cannot read {}: {e}", pyproject.display())))?;
    let pin = pinned_version(&text).map_err(|e| {
        HandoffError::BadInput(format!("{} is not valid TOML: {e}", pyproject.display()))
    })?;
    let tool = std::env::var_os(TOOL_VARIABLE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("componentize-py"));
    let install = format!(
        "pip install componentize-py=={}",
        pin.as_deref().unwrap_or("<version>")
    );
    let output = super::toolchain(&tool)
        .arg("--version")
        .current_dir(dir)
        .output()
        .map_err(|e| {
            HandoffError::BadInput(format!(
                "cannot run {} ({e}): componentize-py builds Python policies; install it with `{install}` \
                 (or set {TOOL_VARIABLE} to its path)",
                tool.display()
            ))
        })?;
    let reported = String::from_utf8_lossy(&output.stdout);
    let Some(installed) = tool_version(&reported).filter(|_| output.status.success()) else {
        return Err(HandoffError::BadInput(format!(
            "{} --version did not report a componentize-py version ({}): is it componentize-py? \
             Install it with `{install}`",
            tool.display(),
            reported.trim()
        )));
    };
    match &pin {
        Some(pin) if *pin != installed => {
            return Err(HandoffError::BadInput(format!(
                "{} is componentize-py {installed}, but {} pins {pin}: install the pinned one with `{install}` \
                 (or set {TOOL_VARIABLE} to it), or change the pin to build with {installed}",
                tool.display(),
                pyproject.display()
            )));
        }
        Some(_) => {}
        None => {
            let _ = writeln!(
                std::io::stderr(),
                "warning: {} pins no componentize-py version ([tool.handoff] componentize-py = \"X.Y.Z\"); \
                 building with {installed}",
                pyproject.display()
            );
        }
    }
    let out = dir.join(OUTPUT);
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            HandoffError::BadInput(format!("cannot create {}: {e}", parent.display()))
        })?;
    }
    let mut command = super::toolchain(&tool);
    // The SDK package carries the contract, with `effects-policy`; a project's own `wit/` may
    // be older.
    let world = if dir.join("wit").is_dir() {
        command.args(["-d", "wit"]);
        super::world_of(&dir.join("wit/policy.wit"))
    } else {
        "effects-policy"
    };
    command.args([
        "-w",
        world,
        "componentize",
        "handoff_policy",
        "-p",
        ".",
        "-o",
        OUTPUT,
    ]);
    super::run_tool(dir, &mut command, "componentize-py")?;
    Ok(out)
}

/// `[tool.handoff] componentize-py = "X.Y.Z"` from pyproject.toml text; an error when the text
/// is not TOML.
fn pinned_version(pyproject: &str) -> std::result::Result<Option<String>, String> {
    let document: toml::Table = pyproject
        .parse()
        .map_err(|e: toml::de::Error| e.to_string())?;
    Ok(document
        .get("tool")
        .and_then(|tool| tool.get("handoff"))
        .and_then(|handoff| handoff.get("componentize-py"))
        .and_then(|pin| pin.as_str())
        .map(str::to_string))
}

/// The version in `componentize-py X.Y.Z`.
fn tool_version(reported: &str) -> Option<String> {
    let mut words = reported.split_whitespace();
    if words.next()? != "componentize-py" {
        return None;
    }
    words.next().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_read_from_the_handoff_table_only() {
        let text = "[project]\nname = \"x\"\ncomponentize-py = \"9.9.9\"\n\n[tool.handoff]\n# built with\ncomponentize-py = \"0.25.1\"  # pinned\n";
        assert_eq!(pinned_version(text).unwrap().as_deref(), Some("0.25.1"));
        assert_eq!(pinned_version("[project]\nname = \"x\"\n").unwrap(), None);
        assert_eq!(
            pinned_version("[tool.handoff]\n\"componentize-py\" = '0.1.0'\n")
                .unwrap()
                .as_deref(),
            Some("0.1.0")
        );
        assert!(pinned_version("[tool.handoff\ncomponentize-py = 1").is_err());
    }

    #[test]
    fn the_version_is_read_from_the_tools_banner() {
        assert_eq!(
            tool_version("componentize-py 0.25.1\n").as_deref(),
            Some("0.25.1")
        );
        assert_eq!(tool_version("python 3.11\n"), None);
        assert_eq!(tool_version(""), None);
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pyproject.toml"), "").unwrap();
        let error = build(dir.path()).unwrap_err().to_string();
        assert!(error.contains("policy.py"), "{error}");
    }
}
