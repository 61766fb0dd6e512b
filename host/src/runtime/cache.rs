//! Compiled policy artifacts, cached on disk so that a warm start does not run Cranelift.
//!
//! An artifact is keyed by the policy's SHA-256 and the engine's compatibility hash (wasmtime
//! version and compilation settings), so a new policy or a new host never loads a stale artifact.
//! Writes go to a temporary file renamed into place; an unreadable artifact is recompiled.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    pub fn new(engine: &Engine, dir: PathBuf) -> Self {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ArtifactCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    /// The default location: `$HANDOFF_CACHE_DIR`, else `$XDG_CACHE_HOME/handoff`, else
    /// `$HOME/.cache/handoff`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("HANDOFF_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(Path::new(&dir).join("handoff"));
        }
        std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache").join("handoff"))
    }

    fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// Loads the artifact of a policy if one is cached and usable.
    pub fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let path = self.path(sha256);
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by `store` below from `Component::serialize` of this very
        // engine configuration (the key includes its compatibility hash), in a directory owned by
        // the operator; wasmtime still checks the header and version before using it.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => Some(component),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "ignoring an unusable cached artifact");
                None
            }
        }
    }

    /// Stores a compiled policy; failures only cost the next start a compilation.
    pub fn store(&self, sha256: &str, component: &Component) {
        let result = (|| -> anyhow::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let bytes = component.serialize()?;
            let path = self.path(sha256);
            let temp = self
                .dir
                .join(format!(".{sha256}.{}.tmp", std::process::id()));
            std::fs::write(&temp, bytes)?;
            std::fs::rename(&temp, &path)?;
            Ok(())
        })();
        if let Err(error) = result {
            tracing::warn!(dir = %self.dir.display(), %error, "could not cache the compiled policy");
        }
    }
}
