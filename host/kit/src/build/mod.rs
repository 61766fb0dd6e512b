//! `handoff policy build`: runs the toolchain of the project's language, then the caller checks
//! the component it produced. `--watch` builds again whenever a source file changes.
//!
//! A toolchain runs with a cleared environment and only the variables of
//! [`TOOLCHAIN_VARIABLES`] passed on: what finds the programs, their homes and caches, the
//! temporary directory, a proxy and the locale. `MONGODB_URI` and every other secret the shell
//! holds stay out of a build (a build script or package install runs code of its own).

mod javascript;
mod python;
mod rust;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::lang::Lang;
use handoff_domain::error::{HandoffError, Result};

/// Builds the policy project in `dir` and returns the component's path.
pub fn build(dir: &Path) -> Result<PathBuf> {
    match Lang::detect(dir)? {
        Lang::Rust => rust::build(dir),
        Lang::Python => python::build(dir),
        Lang::Javascript => javascript::build(dir),
    }
}

/// The variables a toolchain sees (names compared without case, as Windows does), besides
/// those starting with one of [`TOOLCHAIN_PREFIXES`].
pub const TOOLCHAIN_VARIABLES: &[&str] = &[
    // Programs, the user, the terminal, the temporary directory.
    "PATH",
    "PATHEXT",
    "HOME",
    "USER",
    "LOGNAME",
    "TERM",
    "NO_COLOR",
    "TZ",
    "TMPDIR",
    "TMP",
    "TEMP",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    // Windows' own.
    "SYSTEMROOT",
    "WINDIR",
    "COMSPEC",
    "USERPROFILE",
    "APPDATA",
    "LOCALAPPDATA",
    "PROGRAMDATA",
    // The locale.
    "LANG",
    "LANGUAGE",
    // Proxies and certificate authorities.
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    // Rust.
    "CARGO_HOME",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_JOBS",
    "CARGO_NET_OFFLINE",
    "CARGO_HTTP_CAINFO",
    "CARGO_TERM_COLOR",
    "RUSTFLAGS",
    // Python.
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "CONDA_PREFIX",
    // Node.js and npm.
    "NPM_CONFIG_CACHE",
    "NPM_CONFIG_REGISTRY",
    "NPM_CONFIG_USERCONFIG",
    "NPM_CONFIG_OFFLINE",
    "NPM_CONFIG_PREFER_OFFLINE",
];

/// Prefixes of the variables a toolchain sees besides [`TOOLCHAIN_VARIABLES`]: the locale's and
/// rustup's (its home, toolchain, mirrors; none holds a credential).
pub const TOOLCHAIN_PREFIXES: &[&str] = &["LC_", "RUSTUP_"];

/// The variables of `environment` a toolchain sees. A proxy whose address carries a user
/// (`http://user:password@proxy:3128`) is left out, with a warning: a credential is never
/// handed to a toolchain.
pub fn toolchain_environment(
    environment: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    environment
        .into_iter()
        .filter(|(name, value)| {
            let Some(name) = name.to_str() else {
                return false;
            };
            let upper = name.to_ascii_uppercase();
            if upper.ends_with("_PROXY")
                && upper != "NO_PROXY"
                && value.to_string_lossy().contains('@')
            {
                tracing::warn!(
                    variable = %upper,
                    "a proxy address with a user in it is not passed to the toolchain"
                );
                return false;
            }
            TOOLCHAIN_VARIABLES.contains(&upper.as_str())
                || TOOLCHAIN_PREFIXES
                    .iter()
                    .any(|prefix| upper.starts_with(prefix))
        })
        .collect()
}

/// `program` as a toolchain runs: its environment cleared but for [`toolchain_environment`].
pub fn toolchain(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .envs(toolchain_environment(std::env::vars_os()));
    command
}

/// Runs a toolchain command in `dir`, its output passed through; a failure or a missing program
/// is bad input naming the command.
pub fn run_tool(dir: &Path, command: &mut Command, what: &str) -> Result<()> {
    let shown = format!("{command:?}");
    tracing::info!(command = %shown, "building");
    let status = command.current_dir(dir).status().map_err(|e| {
        HandoffError::BadInput(format!(
            "cannot run {what} ({shown}): {e}; is it installed?"
        ))
    })?;
    if !status.success() {
        return Err(HandoffError::BadInput(format!(
            "{what} failed ({status}): see its output above"
        )));
    }
    Ok(())
}

/// Directories a build writes or tools keep, never watched.
const NOT_SOURCES: &[&str] = &[
    "target",
    "node_modules",
    ".git",
    "__pycache__",
    "build",
    ".venv",
];

/// Every source file's path, modification time and length: what `--watch` compares.
pub fn sources(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name();
            if meta.is_dir() {
                if !NOT_SOURCES.iter().any(|skip| name == *skip) {
                    pending.push(path);
                }
            } else if path.extension().is_none_or(|ext| ext != "wasm") {
                found.push((path, meta.modified().ok(), meta.len()));
            }
        }
    }
    found.sort();
    found
}

/// How often `--watch` looks for changes.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// The world of the contract at `contract` a build targets: `effects-policy` (the component
/// also exports `delivery`, contract 1.6) when the contract has it, else `handoff-policy`.
pub fn world_of(contract: &Path) -> &'static str {
    let text = std::fs::read_to_string(contract).unwrap_or_default();
    if text.lines().any(|l| l.trim() == "world effects-policy {") {
        "effects-policy"
    } else {
        "handoff-policy"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_targets_effects_policy_only_where_the_contract_has_it() {
        let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit");
        assert_eq!(world_of(&wit.join("policy.wit")), "effects-policy");
        assert_eq!(
            world_of(&wit.join("since_v1.5.0/policy.wit")),
            "handoff-policy"
        );
        assert_eq!(world_of(&wit.join("no-such.wit")), "handoff-policy");
    }

    fn names(environment: &[(&str, &str)]) -> Vec<String> {
        let given = environment
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        toolchain_environment(given)
            .into_iter()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_toolchain_sees_what_it_needs_and_no_secret() {
        let kept = names(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/ci"),
            ("CARGO_HOME", "/home/ci/.cargo"),
            ("RUSTUP_HOME", "/home/ci/.rustup"),
            ("TMPDIR", "/tmp"),
            ("npm_config_cache", "/cache/npm"),
            ("https_proxy", "http://proxy:3128"),
            ("HTTP_PROXY", "http://user:secret@proxy:3128"),
            ("ALL_PROXY", "socks5://token@proxy:1080"),
            ("LC_ALL", "C.UTF-8"),
            ("LANG", "C.UTF-8"),
            ("MONGODB_URI", "mongodb://user:secret@db/"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("GITHUB_TOKEN", "secret"),
            ("CARGO_REGISTRIES_PRIVATE_TOKEN", "secret"),
            ("NPM_TOKEN", "secret"),
            ("HANDOFF_OPERATOR", "ci"),
        ]);
        assert_eq!(
            kept,
            [
                "PATH",
                "HOME",
                "CARGO_HOME",
                "RUSTUP_HOME",
                "TMPDIR",
                "npm_config_cache",
                "https_proxy",
                "LC_ALL",
                "LANG"
            ]
        );
    }
}
