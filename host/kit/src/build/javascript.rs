//! Builds a JavaScript policy project with componentize-js, the version its `package.json` pins,
//! from the project's `node_modules` (installed with `npm ci` or `npm install` when missing).
//!
//! The component is `build/policy.wasm`. componentize-js runs with its default features except
//! `http` and `fetch-event`, which import `wasi:http`: the host does not grant it.

use super::{run_tool, toolchain};
use handoff_domain::error::{HandoffError, Result};
use std::path::{Path, PathBuf};

/// Where the component is written, relative to the project.
const OUTPUT: &str = "build/policy.wasm";
/// The toolchain package, pinned by the project's `package.json`.
const COMPONENTIZE_JS: &str = "@bytecodealliance/componentize-js";

pub(super) fn build(dir: &Path) -> Result<PathBuf> {
    require_node()?;
    if !dir.join("node_modules").is_dir() {
        // A lockfile installs exactly what it records.
        let install = if dir.join("package-lock.json").is_file() {
            "ci"
        } else {
            "install"
        };
        run_tool(
            dir,
            toolchain(npm()).args([install, "--no-audit", "--no-fund"]),
            &format!("npm {install}"),
        )?;
    }
    let cli = toolchain_cli(dir)?;
    let output = dir.join(OUTPUT);
    if let Some(parent) = output.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            HandoffError::BadInput(format!("cannot create {}: {e}", parent.display()))
        })?;
    }
    // A component from an earlier build must not pass for this one.
    match std::fs::remove_file(&output) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(HandoffError::BadInput(format!(
                "cannot replace {}: {e}",
                output.display()
            )));
        }
    }
    run_tool(
        dir,
        toolchain("node").arg(&cli).args([
            "--wit",
            "wit/policy.wit",
            "--world-name",
            "handoff-policy",
            "--disable",
            "http",
            "fetch-event",
            "--out",
            OUTPUT,
            "component.js",
        ]),
        "componentize-js",
    )?;
    if !output.is_file() {
        return Err(HandoffError::BadInput(format!(
            "componentize-js wrote no {}",
            output.display()
        )));
    }
    Ok(output)
}

/// npm's program name (a batch file on Windows).
fn npm() -> &'static str {
    if cfg!(windows) { "npm.cmd" } else { "npm" }
}

/// Node.js and npm must be on the PATH.
fn require_node() -> Result<()> {
    for program in ["node", npm()] {
        let found = toolchain(program)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            return Err(HandoffError::BadInput(format!(
                "building a JavaScript policy needs Node.js 20 or newer and npm, and `{program} --version` did not run: install Node.js (https://nodejs.org) and make sure `node` and `npm` are on the PATH"
            )));
        }
    }
    Ok(())
}

/// The componentize-js command line script in the project's `node_modules`, from its package's
/// `bin` entry.
fn toolchain_cli(dir: &Path) -> Result<PathBuf> {
    let package_dir = dir.join("node_modules").join(COMPONENTIZE_JS);
    let manifest = package_dir.join("package.json");
    let missing = || {
        HandoffError::BadInput(format!(
            "{} has no {COMPONENTIZE_JS} in node_modules: add it to package.json's devDependencies (an exact version) and run `npm install`",
            dir.display()
        ))
    };
    let text = std::fs::read_to_string(&manifest).map_err(|_| missing())?;
    let manifest: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        HandoffError::BadInput(format!("{} is not valid JSON: {e}", manifest.display()))
    })?;
    let bin = match &manifest["bin"] {
        serde_json::Value::String(path) => Some(path.as_str()),
        serde_json::Value::Object(bins) => bins.get("componentize-js").and_then(|v| v.as_str()),
        _ => None,
    }
    .ok_or_else(missing)?;
    let cli = package_dir.join(bin);
    if !cli.is_file() {
        return Err(missing());
    }
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolchain_is_the_projects_own_componentize_js() {
        let dir = tempfile::tempdir().unwrap();
        let error = toolchain_cli(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("no @bytecodealliance/componentize-js in node_modules"),
            "{error}"
        );
        let package = dir.path().join("node_modules").join(COMPONENTIZE_JS);
        std::fs::create_dir_all(package.join("src")).unwrap();
        std::fs::write(
            package.join("package.json"),
            r#"{"bin": {"componentize-js": "src/cli.js"}}"#,
        )
        .unwrap();
        assert!(toolchain_cli(dir.path()).is_err(), "its script is missing");
        std::fs::write(package.join("src/cli.js"), "").unwrap();
        assert_eq!(
            toolchain_cli(dir.path()).unwrap(),
            package.join("src/cli.js")
        );
    }
}
