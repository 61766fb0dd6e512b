//! The languages a policy can be written in, and which one a project directory holds.

use std::path::Path;

use handoff_domain::error::{HandoffError, Result};

/// A policy project's language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// A Rust crate on wit-bindgen, built for wasm32-wasip2 with cargo.
    Rust,
    /// A Python module built with componentize-py.
    Python,
    /// A JavaScript module built with componentize-js (jco).
    Javascript,
}

impl Lang {
    pub const ALL: [Lang; 3] = [Lang::Rust, Lang::Python, Lang::Javascript];

    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Javascript => "javascript",
        }
    }

    /// The file whose presence marks a project of this language.
    pub fn marker(self) -> &'static str {
        match self {
            Lang::Rust => "Cargo.toml",
            Lang::Python => "pyproject.toml",
            Lang::Javascript => "package.json",
        }
    }

    /// The language of the policy project in `dir`, from its marker file.
    pub fn detect(dir: &Path) -> Result<Lang> {
        let found: Vec<Lang> = Lang::ALL
            .into_iter()
            .filter(|lang| dir.join(lang.marker()).is_file())
            .collect();
        match found.as_slice() {
            [lang] => Ok(*lang),
            [] => Err(HandoffError::BadInput(format!(
                "{} is not a policy project: it has none of {} (create one with `handoff policy new`)",
                dir.display(),
                Lang::ALL.map(Lang::marker).join(", ")
            ))),
            several => Err(HandoffError::BadInput(format!(
                "{} holds projects of several languages ({}); build from a directory with one",
                dir.display(),
                several
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

impl std::str::FromStr for Lang {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Lang, String> {
        match text {
            "rust" => Ok(Lang::Rust),
            "python" => Ok(Lang::Python),
            "javascript" | "js" => Ok(Lang::Javascript),
            other => Err(format!(
                "unknown language {other:?}: rust, python or javascript"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_is_recognised_by_its_one_marker() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Lang::detect(dir.path()).is_err());
        std::fs::write(dir.path().join("pyproject.toml"), "").unwrap();
        assert_eq!(Lang::detect(dir.path()).unwrap(), Lang::Python);
        std::fs::write(dir.path().join("package.json"), "{}").unwrap();
        let error = Lang::detect(dir.path()).unwrap_err().to_string();
        assert!(error.contains("several languages"), "{error}");
    }
}
