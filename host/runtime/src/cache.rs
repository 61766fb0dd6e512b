//! Compiled policy artifacts, cached on disk so that a warm start does not run Cranelift.
//!
//! A cached artifact is native code the host executes, so nothing is taken on trust:
//! - the folder is created 0700 and used only when it is a real folder (never a symlink), owned by
//!   the effective user and writable by no one else; an artifact likewise must be a regular file
//!   owned by the effective user, writable by no one else. Both are opened with `O_NOFOLLOW` and
//!   checked on the opened descriptor (`fstat`), and the artifact is opened relative to the
//!   folder's descriptor, so neither path can be swapped between the check and the use;
//! - an artifact carries a header binding it to the policy's SHA-256 and to the engine (its
//!   precompile compatibility hash: wasmtime version and compilation settings), and a SHA-256 over
//!   the header and the code. The whole file is read and verified before wasmtime deserializes it
//!   from memory: a truncated or corrupted artifact, or another policy's artifact renamed to this
//!   name, is refused;
//! - writes go through an exclusive, randomly named temporary file in the folder, synced to disk,
//!   then renamed into place;
//! - only components that passed the contract check are stored (the caller's duty, see
//!   `Runtime::load`);
//! - the folder's own artifacts are bounded in total size; the least recently used go first.
//!
//! Every refusal is logged as a warning saying why, and the policy is compiled in memory instead.

use std::ffi::OsStr;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The default bound on the total size of the folder's artifacts.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Identifies an artifact file of this host, and its layout version.
const MAGIC: &[u8; 16] = b"HANDOFF\0CWASM\0v1";
/// magic, policy SHA-256, engine key, code length (u64 LE), digest.
const HEADER_LEN: usize = 16 + 32 + 32 + 8 + 32;
/// Suffix of artifact files; their names are `<policy sha256>-<engine key prefix>.cwasm`.
const SUFFIX: &str = ".cwasm";
/// Temporary files: `.handoff-<random>.tmp`, left behind only by a crash mid-write.
const TEMP_PREFIX: &str = ".handoff-";
const TEMP_SUFFIX: &str = ".tmp";
/// A temporary file older than this is a crash's leftover, removed when the cache is trimmed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// What a lookup found.
pub enum Lookup {
    /// A verified artifact of this policy and engine.
    Hit(Component),
    /// Nothing usable; a compiled policy may be stored.
    Miss,
    /// The folder cannot be trusted (logged): compile in memory and store nothing.
    Refused,
}

/// The environment variable that names the cache folder.
pub const CACHE_DIR_VARIABLE: &str = "HANDOFF_CACHE_DIR";

pub struct ArtifactCache {
    dir: PathBuf,
    /// SHA-256 of the engine's precompile compatibility hash.
    engine_key: [u8; 32],
    /// The user the folder and its artifacts must belong to: the effective user.
    owner: u32,
    max_bytes: u64,
}

/// Feeds what a `Hash` implementation writes into SHA-256: a stable engine key, where
/// `DefaultHasher` promises no stability across Rust releases.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

/// Why the folder or an artifact is not used.
type Refusal = String;

impl ArtifactCache {
    pub fn new(engine: &Engine, dir: PathBuf) -> Self {
        let mut hasher = Sha256Hasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ArtifactCache {
            dir,
            engine_key: hasher.0.finalize().into(),
            owner: rustix::process::geteuid().as_raw(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The bound on the total size of the folder's artifacts (default 256 MiB).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The default location: `$HANDOFF_CACHE_DIR` ([`CACHE_DIR_VARIABLE`]), else `$XDG_CACHE_HOME/handoff`, else
    /// `$HOME/.cache/handoff`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os(CACHE_DIR_VARIABLE) {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(Path::new(&dir).join("handoff"));
        }
        std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache").join("handoff"))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the artifact of a policy is (or would be) kept.
    pub fn artifact_path(&self, sha256: &str) -> PathBuf {
        self.dir.join(self.file_name(sha256))
    }

    fn file_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}{SUFFIX}", hex::encode(&self.engine_key[..8]))
    }

    /// Loads the artifact of a policy if one is cached and passes every check.
    pub fn load(&self, engine: &Engine, sha256: &str) -> Lookup {
        let Some(policy) = policy_digest(sha256) else {
            tracing::warn!(%sha256, "not caching a policy whose digest is not SHA-256 hex");
            return Lookup::Refused;
        };
        let dir = match self.open_dir() {
            Ok(Some(dir)) => dir,
            Ok(None) => return Lookup::Miss,
            Err(reason) => {
                tracing::warn!(dir = %self.dir.display(), %reason, "not using the artifact cache folder; compiling the policy in memory");
                return Lookup::Refused;
            }
        };
        let name = self.file_name(sha256);
        let code = match self.read_artifact(&dir, &name, &policy) {
            Ok(Some(code)) => code,
            Ok(None) => return Lookup::Miss,
            Err(reason) => {
                tracing::warn!(path = %self.dir.join(&name).display(), %reason, "refusing a cached artifact; compiling the policy in memory");
                return Lookup::Miss;
            }
        };
        // SAFETY: `code` is what `store` serialized from a component of this engine configuration
        // (the header binds it to the engine's compatibility hash and to this policy, and its
        // digest was verified just now), read from a file owned by this user that no one else can
        // write, in a folder no one else can write. wasmtime checks its own header and version too.
        match unsafe { Component::deserialize(engine, &code[HEADER_LEN..]) } {
            Ok(component) => {
                tracing::debug!(path = %self.dir.join(&name).display(), "loaded the compiled policy from the cache");
                Lookup::Hit(component)
            }
            Err(error) => {
                tracing::warn!(path = %self.dir.join(&name).display(), %error, "refusing a cached artifact wasmtime cannot load; compiling the policy in memory");
                Lookup::Miss
            }
        }
    }

    /// Stores a compiled policy that passed the contract check; failures only cost the next start
    /// a compilation.
    pub fn store(&self, sha256: &str, component: &Component) {
        let Some(policy) = policy_digest(sha256) else {
            return;
        };
        let dir = match self.create_dir() {
            Ok(dir) => dir,
            Err(reason) => {
                tracing::warn!(dir = %self.dir.display(), %reason, "not storing the compiled policy in the artifact cache folder");
                return;
            }
        };
        let name = self.file_name(sha256);
        match self.write_artifact(&dir, &name, &policy, component) {
            Ok(()) => {
                tracing::debug!(path = %self.dir.join(&name).display(), "stored the compiled policy in the cache")
            }
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "could not cache the compiled policy");
                return;
            }
        }
        if let Err(error) = self.trim(&name) {
            tracing::warn!(dir = %self.dir.display(), %error, "could not trim the artifact cache");
        }
    }

    /// Opens the folder without following a symlink and checks it; `None` if it does not exist.
    fn open_dir(&self) -> Result<Option<File>, Refusal> {
        let fd = match rustix::fs::open(
            &self.dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            // A symlink to a folder fails with ENOTDIR under O_DIRECTORY | O_NOFOLLOW.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(match std::fs::symlink_metadata(&self.dir) {
                    Ok(meta) if meta.is_symlink() => {
                        "it is a symbolic link, which is not followed".into()
                    }
                    _ => "it is not a folder".into(),
                });
            }
            Err(errno) => return Err(format!("it cannot be opened: {errno}")),
        };
        let dir = File::from(fd);
        let meta = dir
            .metadata()
            .map_err(|e| format!("it cannot be examined: {e}"))?;
        if !meta.is_dir() {
            return Err("it is not a folder".into());
        }
        self.check_owner_and_mode(&meta)?;
        Ok(Some(dir))
    }

    /// Creates the folder (0700) if it is missing, then opens and checks it.
    fn create_dir(&self) -> Result<File, Refusal> {
        if let Some(dir) = self.open_dir()? {
            return Ok(dir);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| format!("it cannot be created: {e}"))?;
        self.open_dir()?
            .ok_or_else(|| "it vanished after it was created".into())
    }

    fn check_owner_and_mode(&self, meta: &std::fs::Metadata) -> Result<(), Refusal> {
        if meta.uid() != self.owner {
            return Err(format!(
                "it is owned by user {}, not by the effective user {}",
                meta.uid(),
                self.owner
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "it is writable by group or others (mode {:04o})",
                meta.mode() & 0o7777
            ));
        }
        Ok(())
    }

    /// Reads and verifies an artifact; returns the whole file (its code follows the header's
    /// `HEADER_LEN` bytes), `None` if there is none.
    fn read_artifact(
        &self,
        dir: &File,
        name: &str,
        policy: &[u8; 32],
    ) -> Result<Option<Vec<u8>>, Refusal> {
        let fd = match rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => return Err("it is a symbolic link, which is not followed".into()),
            Err(errno) => return Err(format!("it cannot be opened: {errno}")),
        };
        let mut file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| format!("it cannot be examined: {e}"))?;
        if !meta.is_file() {
            return Err("it is not a regular file".into());
        }
        self.check_owner_and_mode(&meta)?;
        if meta.len() > self.max_bytes {
            return Err(format!(
                "it is larger ({} bytes) than the cache's bound",
                meta.len()
            ));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes)
            .map_err(|e| format!("it cannot be read: {e}"))?;
        verify(&bytes, policy, &self.engine_key)?;
        // Recently used: trimming evicts the artifacts used least recently.
        let _ = file.set_modified(SystemTime::now());
        Ok(Some(bytes))
    }

    fn write_artifact(
        &self,
        dir: &File,
        name: &str,
        policy: &[u8; 32],
        component: &Component,
    ) -> anyhow::Result<()> {
        let code = component.serialize()?;
        let header = header(policy, &self.engine_key, &code);
        let size = (header.len() + code.len()) as u64;
        if size > self.max_bytes {
            anyhow::bail!(
                "the artifact ({size} bytes) is larger than the cache's bound ({} bytes)",
                self.max_bytes
            );
        }
        // Created with O_EXCL and mode 0600 under a random name.
        let mut temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(TEMP_SUFFIX)
            .tempfile_in(&self.dir)?;
        temp.write_all(&header)?;
        temp.write_all(&code)?;
        temp.as_file().sync_all()?;
        temp.persist(self.dir.join(name))?;
        // The rename itself is durable once the folder is synced.
        dir.sync_all()?;
        Ok(())
    }

    /// Keeps the total size of the folder's artifacts within the bound, evicting the least
    /// recently used first (never `keep`), and removes temporary files a crash left behind. Only
    /// files named as this cache names them are touched.
    fn trim(&self, keep: &str) -> std::io::Result<()> {
        let now = SystemTime::now();
        let mut artifacts = Vec::new();
        let mut total = 0u64;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            // Does not follow symlinks.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if is_temp_name(&name) {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TEMP)
                {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            if !is_artifact_name(&name) {
                continue;
            }
            total += meta.len();
            if name != OsStr::new(keep) {
                artifacts.push((modified, meta.len(), entry.path()));
            }
        }
        artifacts.sort_by_key(|(modified, _, _)| *modified);
        for (_, len, path) in artifacts {
            if total <= self.max_bytes {
                break;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total -= len;
                    tracing::info!(path = %path.display(), "evicted a cached artifact to keep the cache within its bound");
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "could not evict a cached artifact")
                }
            }
        }
        Ok(())
    }
}

/// The raw digest of a policy's SHA-256 hex text.
fn policy_digest(sha256: &str) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    (sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    .then(|| hex::decode_to_slice(sha256, &mut digest).ok())
    .flatten()
    .map(|()| digest)
}

/// `<64 hex>-<16 hex>.cwasm`: the names this cache gives its artifacts.
fn is_artifact_name(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let Some(stem) = name.strip_suffix(SUFFIX) else {
        return false;
    };
    let hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match stem.split_once('-') {
        Some((policy, engine)) => {
            policy.len() == 64 && engine.len() == 16 && hex(policy) && hex(engine)
        }
        None => false,
    }
}

fn is_temp_name(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.starts_with(TEMP_PREFIX) && n.ends_with(TEMP_SUFFIX))
}

fn digest(prefix: &[u8], code: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    hasher.update(code);
    hasher.finalize().into()
}

/// The header stored before the code: magic, policy, engine key, code length, and the SHA-256
/// over those and the code.
fn header(policy: &[u8; 32], engine_key: &[u8; 32], code: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(policy);
    header.extend_from_slice(engine_key);
    header.extend_from_slice(&(code.len() as u64).to_le_bytes());
    let digest = digest(&header, code);
    header.extend_from_slice(&digest);
    header
}

/// Checks an artifact file's bytes against the policy and engine it must belong to.
fn verify(bytes: &[u8], policy: &[u8; 32], engine_key: &[u8; 32]) -> Result<(), Refusal> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "it is truncated ({} bytes, shorter than its header)",
            bytes.len()
        ));
    }
    let (header, code) = bytes.split_at(HEADER_LEN);
    if &header[..16] != MAGIC {
        return Err("it is not an artifact of this host (unknown header)".into());
    }
    if &header[16..48] != policy {
        return Err("it belongs to another policy (its policy SHA-256 differs)".into());
    }
    if &header[48..80] != engine_key {
        return Err("it was compiled by another engine configuration".into());
    }
    let len = u64::from_le_bytes(header[80..88].try_into().expect("8 bytes"));
    if len != code.len() as u64 {
        return Err(format!(
            "it is truncated or extended ({} code bytes, header says {len})",
            code.len()
        ));
    }
    if header[88..] != digest(&header[..88], code) {
        return Err("its digest does not match its contents (corrupted)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
