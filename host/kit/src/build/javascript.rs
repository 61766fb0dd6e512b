//! Builds a JavaScript policy project with componentize-js, the version its `package.json` pins,
//! from the project's `node_modules` (installed with `npm ci` or `npm install` when missing).
//! The component's entry and the contract are the SDK package's
//! (`node_modules/handoff-policy/component.js`, which exports the project's `policy.js`, and its
//! `wit/policy.wit`); a project that carries its own `component.js` and `wit/` (one generated
//! before the SDK was a package) is built from those.
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
/// The SDK package's entry and contract, relative to the project.
const SDK_ENTRY: &str = "node_modules/handoff-policy/component.js";
const SDK_CONTRACT: &str = "node_modules/handoff-policy/wit/policy.wit";

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
    let (entry, contract) = entry_and_contract(dir)?;
    // An entry of its own from before contract 1.6 exports no `delivery`.
    let exports_delivery = std::fs::read_to_string(dir.join(entry))
        .is_ok_and(|text| text.contains("export const delivery"));
    let world = if exports_delivery {
        super::world_of(&dir.join(contract))
    } else {
        "handoff-policy"
    };
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
            contract,
            "--world-name",
            world,
            "--disable",
            "http",
            "fetch-event",
            "--out",
            OUTPUT,
            entry,
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

/// The component's entry and the contract it is built against, relative to `dir`: the project's
/// own when it carries them, else the SDK package's.
fn entry_and_contract(dir: &Path) -> Result<(&'static str, &'static str)> {
    if dir.join("component.js").is_file() && dir.join("wit/policy.wit").is_file() {
        return Ok(("component.js", "wit/policy.wit"));
    }
    for file in [SDK_ENTRY, SDK_CONTRACT] {
        if !dir.join(file).is_file() {
            return Err(HandoffError::BadInput(format!(
                "{} has no {file}: the project depends on the SDK package handoff-policy (package.json's dependencies), which `npm install` installs",
                dir.display()
            )));
        }
    }
    Ok((SDK_ENTRY, SDK_CONTRACT))
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
    fn the_entry_and_the_contract_are_the_sdk_packages_unless_the_project_has_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let error = entry_and_contract(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains(SDK_ENTRY) && error.contains("npm install"),
            "{error}"
        );
        let package = dir.path().join("node_modules/handoff-policy");
        std::fs::create_dir_all(package.join("wit")).unwrap();
        std::fs::write(package.join("component.js"), "").unwrap();
        let error = entry_and_contract(dir.path()).unwrap_err().to_string();
        assert!(error.contains(SDK_CONTRACT), "{error}");
        std::fs::write(package.join("wit/policy.wit"), "").unwrap();
        assert_eq!(
            entry_and_contract(dir.path()).unwrap(),
            (SDK_ENTRY, SDK_CONTRACT)
        );
        std::fs::create_dir_all(dir.path().join("wit")).unwrap();
        std::fs::write(dir.path().join("component.js"), "").unwrap();
        std::fs::write(dir.path().join("wit/policy.wit"), "").unwrap();
        assert_eq!(
            entry_and_contract(dir.path()).unwrap(),
            ("component.js", "wit/policy.wit")
        );
    }

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
