//! The compiled-policy cache holds native code the host executes: it is used only from a private
//! folder of the effective user, never through a symlink, only after its contents are verified
//! against the policy and the engine, only for components that passed the contract check, and
//! within a size bound. Whatever is refused is logged and the run goes on, compiling in memory.
//! And the binary that loads it keeps address-space randomisation.

use crate::support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use support::*;

const LOADED: &str = "loaded the compiled policy from the cache";
const STORED: &str = "stored the compiled policy in the cache";
const FOLDER_REFUSED: &str = "not using the artifact cache folder; compiling the policy in memory";
const ARTIFACT_REFUSED: &str = "refusing a cached artifact; compiling the policy in memory";

/// The second policy and its parameter.
const SHOP: &[&str] = &[
    "--policy",
    handoff_test_policies::PREFIXED_IDS,
    "--policy-param",
    "prefix=shop",
];

/// A replay of three events into a new state with the cache in `cache`, logging what the cache
/// does.
fn run(s: &Scratch, cache: &Path, state: &str, extra: &[&str]) -> Output {
    handoff()
        .env("HANDOFF_CACHE_DIR", cache)
        .env("HANDOFF_LOG", "warn,handoff_runtime::cache=debug")
        .arg("replay")
        .arg(s.three_events())
        .arg("--state")
        .arg(s.path(state))
        .args(extra)
        .output()
        .expect("run handoff")
}

/// The outbox IDs the default policy gives the three events.
fn default_ids() -> Vec<String> {
    (1..=3).map(|seq| baseline_event_id(&token(seq))).collect()
}

/// The outbox IDs the second policy gives them.
fn shop_ids() -> Vec<String> {
    [(1, "insert"), (2, "update"), (3, "delete")]
        .iter()
        .map(|(seq, op)| format!("shop-{op}-{}", &baseline_event_id(&token(*seq))[..16]))
        .collect()
}

/// A successful run whose outbox holds `expected`; returns its stderr.
fn handed_off(s: &Scratch, output: &Output, state: &str, expected: &[String]) -> String {
    let out = ok(output);
    assert_eq!(out["events_handed_off"], 3);
    let (_, outbox) = inspect(&s.path(state));
    assert_eq!(outbox_ids(&outbox), expected);
    stderr(output)
}

/// The names, sizes, modes and modification times of a folder's entries.
fn listing(dir: &Path) -> BTreeMap<String, (u64, u32, SystemTime)> {
    std::fs::read_dir(dir)
        .expect("read cache folder")
        .map(|e| {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            (
                e.file_name().into_string().unwrap(),
                (meta.len(), meta.mode(), meta.modified().unwrap()),
            )
        })
        .collect()
}

fn artifacts(dir: &Path) -> Vec<String> {
    listing(dir)
        .into_keys()
        .filter(|n| n.ends_with(".cwasm"))
        .collect()
}

/// Artifacts of the default policy and of the second policy, compiled once for the whole suite
/// (a compilation takes seconds in a debug build): (folder, default's name, second's name).
fn primed() -> &'static (PathBuf, String, String) {
    static PRIMED: OnceLock<(Scratch, (PathBuf, String, String))> = OnceLock::new();
    &PRIMED
        .get_or_init(|| {
            let s = Scratch::new();
            let dir = s.path("primed");
            let default = ok(&run(&s, &dir, "a.redb", &[]));
            let shop = ok(&run(&s, &dir, "b.redb", SHOP));
            let find = |sha: &serde_json::Value| {
                let sha = sha.as_str().unwrap();
                artifacts(&dir)
                    .into_iter()
                    .find(|n| n.starts_with(sha))
                    .unwrap_or_else(|| panic!("no artifact for {sha}"))
            };
            let names = (
                find(&default["policy_sha256"]),
                find(&shop["policy_sha256"]),
            );
            (s, (dir, names.0, names.1))
        })
        .1
}

/// A private cache folder in `s` holding copies of the suite's artifacts.
fn cache_with_artifacts(s: &Scratch, name: &str) -> PathBuf {
    let (primed, a, b) = primed();
    let dir = s.path(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for artifact in [a, b] {
        std::fs::copy(primed.join(artifact), dir.join(artifact)).unwrap();
    }
    dir
}

#[test]
fn the_folder_is_private_and_an_artifact_is_loaded_on_the_next_start() {
    let s = Scratch::new();
    let cache = s.path("deep/er/cache");
    let err = handed_off(
        &s,
        &run(&s, &cache, "a.redb", &[]),
        "a.redb",
        &default_ids(),
    );
    assert!(err.contains(STORED), "{err}");
    assert!(!err.contains(LOADED), "{err}");
    for dir in [&cache, &s.path("deep/er"), &s.path("deep")] {
        let meta = std::fs::symlink_metadata(dir).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700, "{}", dir.display());
    }
    let files = listing(&cache);
    assert_eq!(files.len(), 1, "{files:?}");
    let (_, (_, mode, _)) = files.iter().next().unwrap();
    assert_eq!(mode & 0o777, 0o600);

    let err = handed_off(
        &s,
        &run(&s, &cache, "b.redb", &[]),
        "b.redb",
        &default_ids(),
    );
    assert!(err.contains(LOADED), "{err}");
    assert!(!err.contains("WARN"), "{err}");
    assert_eq!(artifacts(&cache), files.into_keys().collect::<Vec<_>>());
}

#[test]
fn a_folder_writable_by_others_is_neither_read_nor_written() {
    let s = Scratch::new();
    // A folder holding valid artifacts: not loaded.
    let full = cache_with_artifacts(&s, "full");
    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = listing(&full);
    let err = handed_off(&s, &run(&s, &full, "a.redb", &[]), "a.redb", &default_ids());
    assert!(err.contains(FOLDER_REFUSED), "{err}");
    assert!(
        err.contains("writable by group or others (mode 0777)"),
        "{err}"
    );
    assert!(!err.contains(LOADED), "{err}");
    assert_eq!(listing(&full), before);

    // An empty one: nothing is written to it.
    let empty = s.path("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = handed_off(&s, &run(&s, &empty, "b.redb", SHOP), "b.redb", &shop_ids());
    assert!(err.contains(FOLDER_REFUSED), "{err}");
    assert!(listing(&empty).is_empty(), "{:?}", listing(&empty));

    // Writable by the group only: refused too.
    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o770)).unwrap();
    let err = handed_off(&s, &run(&s, &full, "c.redb", &[]), "c.redb", &default_ids());
    assert!(err.contains("(mode 0770)"), "{err}");
    assert!(!err.contains(LOADED), "{err}");
}

/// The user `nobody`, to give files to as root.
const NOBODY: u32 = 65534;

#[test]
fn a_folder_or_artifact_of_another_user_is_refused() {
    let s = Scratch::new();
    let euid = rustix::process::geteuid().as_raw();
    if euid == 0 {
        // A folder given to another user: neither read nor written.
        let dir = cache_with_artifacts(&s, "theirs");
        std::os::unix::fs::chown(&dir, Some(NOBODY), None).unwrap();
        let before = listing(&dir);
        let err = handed_off(&s, &run(&s, &dir, "a.redb", &[]), "a.redb", &default_ids());
        assert!(err.contains(FOLDER_REFUSED), "{err}");
        assert!(
            err.contains(&format!(
                "owned by user {NOBODY}, not by the effective user 0"
            )),
            "{err}"
        );
        assert!(!err.contains(LOADED), "{err}");
        assert_eq!(listing(&dir), before);

        // An artifact given to another user in a private folder: refused, then replaced by one
        // of this user.
        let dir = cache_with_artifacts(&s, "mine");
        let (_, default, _) = primed();
        std::os::unix::fs::chown(dir.join(default), Some(NOBODY), None).unwrap();
        let err = handed_off(&s, &run(&s, &dir, "b.redb", &[]), "b.redb", &default_ids());
        assert!(err.contains(ARTIFACT_REFUSED), "{err}");
        assert!(err.contains(&format!("owned by user {NOBODY}")), "{err}");
        assert!(!err.contains(LOADED), "{err}");
        assert_eq!(std::fs::metadata(dir.join(default)).unwrap().uid(), 0);
    } else {
        // Without root, another user's folder is one that exists already: the root folder.
        assert_ne!(std::fs::metadata("/").unwrap().uid(), euid);
        let err = handed_off(
            &s,
            &run(&s, Path::new("/"), "a.redb", &[]),
            "a.redb",
            &default_ids(),
        );
        assert!(err.contains(FOLDER_REFUSED), "{err}");
        assert!(err.contains("owned by user 0"), "{err}");
    }
}

#[test]
fn a_symlinked_folder_is_not_followed() {
    let s = Scratch::new();
    let real = cache_with_artifacts(&s, "real");
    let link = s.path("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let before = listing(&real);
    let err = handed_off(&s, &run(&s, &link, "a.redb", &[]), "a.redb", &default_ids());
    assert!(err.contains(FOLDER_REFUSED), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!err.contains(LOADED), "{err}");
    assert_eq!(listing(&real), before);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}

#[test]
fn a_symlinked_artifact_is_not_followed() {
    let s = Scratch::new();
    let dir = cache_with_artifacts(&s, "cache");
    let (_, default, _) = primed();
    // The artifact moved elsewhere, a symlink in its place.
    let elsewhere = s.path("elsewhere.cwasm");
    std::fs::rename(dir.join(default), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join(default)).unwrap();
    let target = std::fs::read(&elsewhere).unwrap();
    let err = handed_off(&s, &run(&s, &dir, "a.redb", &[]), "a.redb", &default_ids());
    assert!(err.contains(ARTIFACT_REFUSED), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!err.contains(LOADED), "{err}");
    // The link's target is untouched; the link itself was replaced by a real artifact.
    assert_eq!(std::fs::read(&elsewhere).unwrap(), target);
    assert!(
        std::fs::symlink_metadata(dir.join(default))
            .unwrap()
            .is_file()
    );
    let err = stderr(&run(&s, &dir, "b.redb", &[]));
    assert!(err.contains(LOADED), "{err}");
}

#[test]
fn another_policys_artifact_under_this_policys_name_is_refused() {
    let s = Scratch::new();
    let dir = cache_with_artifacts(&s, "cache");
    let (_, default, shop) = primed();
    // The default policy's artifact copied over the second policy's.
    std::fs::copy(dir.join(default), dir.join(shop)).unwrap();
    let err = handed_off(&s, &run(&s, &dir, "a.redb", SHOP), "a.redb", &shop_ids());
    assert!(err.contains(ARTIFACT_REFUSED), "{err}");
    assert!(err.contains("belongs to another policy"), "{err}");
    assert!(!err.contains(LOADED), "{err}");
    // The second policy's own artifact took its place again.
    let err = handed_off(&s, &run(&s, &dir, "b.redb", SHOP), "b.redb", &shop_ids());
    assert!(err.contains(LOADED), "{err}");
    assert_ne!(
        std::fs::read(dir.join(default)).unwrap(),
        std::fs::read(dir.join(shop)).unwrap()
    );
}

#[test]
fn a_truncated_artifact_is_refused() {
    let s = Scratch::new();
    let dir = cache_with_artifacts(&s, "cache");
    let (_, default, _) = primed();
    let path = dir.join(default);
    for len in [std::fs::metadata(&path).unwrap().len() / 2, 100, 0] {
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len)
            .unwrap();
        let state = format!("{len}.redb");
        let err = handed_off(&s, &run(&s, &dir, &state, &[]), &state, &default_ids());
        assert!(err.contains(ARTIFACT_REFUSED), "{len}: {err}");
        assert!(err.contains("truncated"), "{len}: {err}");
        assert!(!err.contains(LOADED), "{len}: {err}");
    }
}

#[test]
fn a_corrupted_byte_is_refused() {
    let s = Scratch::new();
    let dir = cache_with_artifacts(&s, "cache");
    let (_, default, _) = primed();
    let path = dir.join(default);
    let mut bytes = std::fs::read(&path).unwrap();
    // A byte in the middle of the native code.
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = handed_off(&s, &run(&s, &dir, "a.redb", &[]), "a.redb", &default_ids());
    assert!(err.contains(ARTIFACT_REFUSED), "{err}");
    assert!(err.contains("corrupted"), "{err}");
    assert!(!err.contains(LOADED), "{err}");
    // Recompiled and stored intact.
    assert_ne!(std::fs::read(&path).unwrap(), bytes);
    let err = stderr(&run(&s, &dir, "b.redb", &[]));
    assert!(err.contains(LOADED), "{err}");
}

#[test]
fn a_component_refused_by_the_contract_check_is_not_cached() {
    let s = Scratch::new();
    let dir = s.path("cache");
    for (policy, needle) in [
        (
            handoff_test_policies::FOREIGN_IMPORT,
            "imports what the host does not grant",
        ),
        (
            handoff_test_policies::FUTURE_MAJOR,
            "a different major version is incompatible",
        ),
    ] {
        let output = run(&s, &dir, "a.redb", &["--policy", policy]);
        fails(&output, 9, needle);
        let err = stderr(&output);
        assert!(!err.contains(STORED), "{err}");
    }
    let stored = if dir.exists() {
        artifacts(&dir)
    } else {
        Vec::new()
    };
    assert!(stored.is_empty(), "{stored:?}");
}

#[test]
fn the_size_bound_evicts_the_least_recently_used_of_its_own_artifacts() {
    let s = Scratch::new();
    let dir = s.path("cache");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Sparse files: 200 MiB used two hours ago, 100 MiB an hour ago, and 300 MiB the cache does
    // not own (not named as it names its artifacts).
    let sparse = |name: &str, mib: u64, age_secs: u64| {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(mib << 20).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(age_secs))
            .unwrap();
        path
    };
    let oldest = sparse(
        &format!("{}-0123456789abcdef.cwasm", "a".repeat(64)),
        200,
        7200,
    );
    let older = sparse(
        &format!("{}-0123456789abcdef.cwasm", "b".repeat(64)),
        100,
        3600,
    );
    let foreign = sparse("kept.bin", 300, 9000);
    let foreign_artifact = sparse("kept.cwasm", 300, 9000);
    // The default policy's artifact pushes the total of the cache's own artifacts over 256 MiB.
    let output = handoff()
        .env("HANDOFF_CACHE_DIR", &dir)
        .env("HANDOFF_LOG", "warn,handoff_runtime::cache=info")
        .arg("replay")
        .arg(s.three_events())
        .arg("--state")
        .arg(s.path("a.redb"))
        .output()
        .unwrap();
    let err = handed_off(&s, &output, "a.redb", &default_ids());
    assert!(err.contains("evicted a cached artifact"), "{err}");
    assert!(!oldest.exists());
    assert!(older.exists());
    assert!(foreign.exists());
    assert!(foreign_artifact.exists());
    let own: u64 = artifacts(&dir)
        .iter()
        .filter(|n| n.len() > 70)
        .map(|n| std::fs::metadata(dir.join(n)).unwrap().len())
        .sum();
    assert!(own <= 256 << 20, "{own}");
    assert_eq!(artifacts(&dir).len(), 3, "{:?}", artifacts(&dir));
}

#[test]
fn no_cache_leaves_no_folder() {
    let s = Scratch::new();
    let dir = s.path("cache");
    let err = handed_off(
        &s,
        &run(&s, &dir, "a.redb", &["--no-cache"]),
        "a.redb",
        &default_ids(),
    );
    assert!(!dir.exists());
    assert!(!err.contains("WARN"), "{err}");
}

/// The process that compiles untrusted code and holds database credentials keeps address-space
/// randomisation: the binary is a position-independent executable (ELF type `ET_DYN`, where a
/// position-dependent one is `ET_EXEC`), so the kernel loads it at a random address.
#[test]
fn the_binary_is_position_independent() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_handoff")).expect("read the binary");
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    let e_type = match elf[5] {
        1 => u16::from_le_bytes([elf[16], elf[17]]),
        2 => u16::from_be_bytes([elf[16], elf[17]]),
        other => panic!("unknown ELF data encoding {other}"),
    };
    const ET_EXEC: u16 = 2;
    const ET_DYN: u16 = 3;
    assert_ne!(e_type, ET_EXEC, "the binary is linked position-dependent");
    assert_eq!(e_type, ET_DYN);
}

#[test]
fn precompile_fills_the_cache_so_that_no_run_compiles() {
    let s = Scratch::new();
    let cache = s.path("image/cache");
    let output = handoff()
        .env("HANDOFF_CACHE_DIR", &cache)
        .args(["policy", "precompile"])
        .output()
        .expect("run handoff");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    let (sha256, path) = printed.trim().split_once("  ").expect("digest and path");
    assert_eq!(sha256.len(), 64, "{printed}");
    assert!(Path::new(path).is_file(), "{printed}");
    assert_eq!(artifacts(&cache).len(), 1);
    // The next run loads it: nothing is compiled or stored.
    let err = handed_off(
        &s,
        &run(&s, &cache, "a.redb", &[]),
        "a.redb",
        &default_ids(),
    );
    assert!(err.contains(LOADED), "{err}");
    assert!(!err.contains(STORED), "{err}");

    // A folder that cannot hold it is an error, not a silent compile at every run.
    let open = s.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let output = handoff()
        .env("HANDOFF_CACHE_DIR", &open)
        .args(["policy", "precompile", handoff_test_policies::PREFIXED_IDS])
        .output()
        .expect("run handoff");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("cannot hold the compiled policy"));
    assert!(listing(&open).is_empty());
}
