//! Policy components: the embedded default or a `.wasm` file, identified by SHA-256 and checked
//! against the contract before anything runs.

use std::path::Path;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use handoff_domain::error::{HandoffError, Result};

/// The contract version this host implements (`wit/policy.wit`).
pub const CONTRACT: Version = Version {
    major: 1,
    minor: 6,
    patch: 0,
};
/// The package and interface a policy exports.
pub const EXPORT_PREFIX: &str = "handoff:policy/policy@";
/// Interfaces a policy may import, by name prefix, and what each lets the policy do: the contract
/// and the WASI interfaces whose capabilities are all withheld (no preopens, environment,
/// arguments or network are granted). The runtimes of interpreted languages import most of these
/// whether or not a policy uses them. The longest matching prefix describes an import.
pub const GRANTED_IMPORTS: &[(&str, &str)] = &[
    (
        "handoff:policy/host@",
        "the contract: the stream, commits and the checkpoint, each call checked by the host",
    ),
    ("handoff:policy/types@", "the contract's types"),
    (
        "wasi:cli/environment",
        "empty: no variable, no argument, no working directory",
    ),
    ("wasi:cli/stdin", "a closed stream: nothing to read"),
    ("wasi:cli/stdout", "a sink: what is written is discarded"),
    ("wasi:cli/stderr", "a sink: what is written is discarded"),
    ("wasi:cli/exit", "ends the run as a policy failure"),
    ("wasi:cli/terminal-", "no terminal"),
    ("wasi:cli/", "no arguments, environment, terminal or input"),
    (
        "wasi:io/",
        "streams and waits on what is granted; every wait bounded by the compute slice and the run deadline",
    ),
    (
        "wasi:clocks/",
        "the time (virtual under a replay); waits bounded like wasi:io",
    ),
    (
        "wasi:random/",
        "random bytes (seeded from the run under a replay)",
    ),
    (
        "wasi:filesystem/",
        "no preopened directory: no file can be opened",
    ),
    (
        "wasi:sockets/",
        "every use denied: no TCP, no UDP, no name lookup, no address",
    ),
    (
        STUBBED_IMPORTS,
        "no implementation: any call ends the run as a policy failure; no request can be made",
    ),
];

/// Imports linked to functions that end the run when called (JavaScript runtimes import
/// `wasi:http` for `fetch` whether or not a policy uses it).
pub const STUBBED_IMPORTS: &str = "wasi:http/";

/// What a granted import lets a policy do, or `None` when the host does not grant it.
pub fn granted(import: &str) -> Option<&'static str> {
    GRANTED_IMPORTS
        .iter()
        .filter(|(prefix, _)| import.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, what)| *what)
}

/// A policy shipped inside the binary.
pub struct Shipped {
    pub name: &'static str,
    /// What it does, in one line.
    pub summary: &'static str,
    bytes: &'static [u8],
    sha256: &'static str,
}

/// The shipped policies; the first is the default. Listed, built and digested by the build
/// script (`host/runtime/build.rs`).
pub const SHIPPED: &[Shipped] = include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    pub fn parse(text: &str) -> Option<Version> {
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let version = Version {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Raw policy bytes and their identity, before compilation.
#[derive(Clone)]
pub struct PolicySource {
    pub bytes: std::borrow::Cow<'static, [u8]>,
    pub sha256: String,
    /// Where it came from, for messages: "embedded default" or the file path.
    pub origin: String,
}

impl PolicySource {
    pub fn embedded_default() -> PolicySource {
        let default = &SHIPPED[0];
        PolicySource {
            bytes: std::borrow::Cow::Borrowed(default.bytes),
            sha256: default.sha256.trim().to_string(),
            origin: "embedded default".into(),
        }
    }

    /// A shipped policy by name; the error lists the names.
    pub fn shipped(name: &str) -> Result<PolicySource> {
        let Some(policy) = SHIPPED.iter().find(|p| p.name == name) else {
            return Err(HandoffError::BadInput(format!(
                "no shipped policy is called {name:?}: {}",
                SHIPPED
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        Ok(PolicySource {
            bytes: std::borrow::Cow::Borrowed(policy.bytes),
            sha256: policy.sha256.trim().to_string(),
            origin: format!("shipped {}", policy.name),
        })
    }

    pub fn from_file(path: &Path) -> Result<PolicySource> {
        let bytes = std::fs::read(path).map_err(|e| {
            HandoffError::BadInput(format!("cannot read the policy {}: {e}", path.display()))
        })?;
        Ok(PolicySource {
            sha256: hex::encode(Sha256::digest(&bytes)),
            bytes: std::borrow::Cow::Owned(bytes),
            origin: path.display().to_string(),
        })
    }

    /// Refuses what cannot be a policy before compiling it.
    pub fn check_format(&self) -> Result<()> {
        if wasmparser::Parser::is_component(&self.bytes) {
            return Ok(());
        }
        let what = if wasmparser::Parser::is_core_wasm(&self.bytes) {
            "a core WebAssembly module, not a component; build it for wasm32-wasip2 (or wrap it with a component adapter)"
        } else {
            "not a WebAssembly component"
        };
        Err(HandoffError::Policy(format!(
            "the policy {} is {what}",
            self.origin
        )))
    }
}

/// A compiled policy that passed the contract checks.
#[derive(Clone)]
pub struct Policy {
    pub component: Component,
    pub sha256: String,
    pub origin: String,
    /// The contract version the policy was built against.
    pub contract: Version,
}

/// Checks a compiled component against the contract: it exports the policy interface in a
/// version this host implements, and imports nothing beyond what the host grants.
pub fn check_contract(
    engine: &wasmtime::Engine,
    component: &Component,
    origin: &str,
) -> Result<Version> {
    let ty = component.component_type();
    let mut found = None;
    for (name, item) in ty.exports(engine) {
        if let Some(version) = name.strip_prefix(EXPORT_PREFIX)
            && matches!(item.ty, ComponentItem::ComponentInstance(_))
        {
            found = Some(Version::parse(version).ok_or_else(|| {
                HandoffError::Policy(format!(
                    "the policy {origin} exports {name}, whose version is not semver"
                ))
            })?);
        }
    }
    let Some(version) = found else {
        let exports: Vec<String> = ty
            .exports(engine)
            .map(|(name, _)| name.to_string())
            .collect();
        return Err(HandoffError::Policy(format!(
            "the policy {origin} is a component but not a handoff policy: it exports no {EXPORT_PREFIX}{} (its exports: {})",
            CONTRACT,
            if exports.is_empty() {
                "none".to_string()
            } else {
                exports.join(", ")
            }
        )));
    };
    if version.major != CONTRACT.major {
        return Err(HandoffError::Policy(format!(
            "the policy {origin} was built against contract {version}; this host implements {CONTRACT}: a different major version is incompatible"
        )));
    }
    if version > CONTRACT {
        return Err(HandoffError::Policy(format!(
            "the policy {origin} was built against contract {version}, newer than this host's {CONTRACT}; upgrade handoff"
        )));
    }
    let refused: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|name| granted(name).is_none())
        .collect();
    if !refused.is_empty() {
        return Err(HandoffError::Policy(format!(
            "the policy {origin} imports what the host does not grant: {}",
            refused.join(", ")
        )));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_contract_constant_is_the_wit_packages_version() {
        assert_eq!(super::CONTRACT.to_string(), env!("HANDOFF_CONTRACT"));
    }

    use super::*;

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(Version::parse(env!("HANDOFF_CONTRACT")), Some(CONTRACT));
        assert_eq!(
            Version::parse("1.2.3-rc.1"),
            Some(Version {
                major: 1,
                minor: 2,
                patch: 3
            })
        );
        for bad in ["1", "1.0", "1.0.0.0", "a.b.c", ""] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_shipped_policies_are_components_with_their_digests() {
        let default = PolicySource::embedded_default();
        assert_eq!(
            default.sha256,
            PolicySource::shipped("default").unwrap().sha256
        );
        let mut digests = Vec::new();
        for shipped in SHIPPED {
            let source = PolicySource::shipped(shipped.name).unwrap();
            source.check_format().unwrap();
            assert_eq!(source.sha256, hex::encode(Sha256::digest(&source.bytes)));
            digests.push(source.sha256);
        }
        digests.dedup();
        assert_eq!(
            digests.len(),
            SHIPPED.len(),
            "each shipped policy is its own"
        );
        let error = PolicySource::shipped("nope").err().unwrap().to_string();
        assert!(
            error.contains("default, batching, quarantine, domain-events"),
            "{error}"
        );
    }

    #[test]
    fn core_modules_and_garbage_are_refused() {
        let core = PolicySource {
            bytes: std::borrow::Cow::Owned(b"\0asm\x01\0\0\0".to_vec()),
            sha256: String::new(),
            origin: "core.wasm".into(),
        };
        let error = core.check_format().unwrap_err().to_string();
        assert!(error.contains("core WebAssembly module"), "{error}");
        let junk = PolicySource {
            bytes: std::borrow::Cow::Owned(b"hello".to_vec()),
            sha256: String::new(),
            origin: "junk".into(),
        };
        assert!(
            junk.check_format()
                .unwrap_err()
                .to_string()
                .contains("not a WebAssembly component")
        );
    }
}
