use super::*;

const POLICY: [u8; 32] = [7; 32];
const ENGINE: [u8; 32] = [9; 32];

fn artifact(code: &[u8]) -> Vec<u8> {
    let mut bytes = header(&POLICY, &ENGINE, code);
    bytes.extend_from_slice(code);
    bytes
}

#[test]
fn an_intact_artifact_verifies() {
    assert_eq!(verify(&artifact(b"native code"), &POLICY, &ENGINE), Ok(()));
    assert_eq!(verify(&artifact(b""), &POLICY, &ENGINE), Ok(()));
}

#[test]
fn every_flipped_byte_is_refused() {
    let good = artifact(b"some native code of a policy");
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        assert!(verify(&bad, &POLICY, &ENGINE).is_err(), "byte {i}");
    }
}

#[test]
fn every_truncation_and_extension_is_refused() {
    let good = artifact(b"some native code of a policy");
    for len in 0..good.len() {
        let error = verify(&good[..len], &POLICY, &ENGINE).unwrap_err();
        assert!(error.contains("truncated"), "{len}: {error}");
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(verify(&longer, &POLICY, &ENGINE).is_err());
}

#[test]
fn another_policy_or_engine_is_refused() {
    let good = artifact(b"code");
    let error = verify(&good, &[8; 32], &ENGINE).unwrap_err();
    assert!(error.contains("another policy"), "{error}");
    let error = verify(&good, &POLICY, &[8; 32]).unwrap_err();
    assert!(error.contains("another engine"), "{error}");
}

#[test]
fn only_its_own_names_are_artifacts() {
    let sha = "a".repeat(64);
    assert!(is_artifact_name(OsStr::new(&format!(
        "{sha}-0123456789abcdef.cwasm"
    ))));
    for other in [
        format!("{sha}-0123456789abcdef.cwasm.bak"),
        format!("{sha}-0123456789ABCDEF.cwasm"),
        format!("{sha}-0123456789abcde.cwasm"),
        format!("{}-0123456789abcdef.cwasm", "a".repeat(63)),
        format!("{sha}.cwasm"),
        "notes.txt".to_string(),
        "x.cwasm".to_string(),
    ] {
        assert!(!is_artifact_name(OsStr::new(&other)), "{other}");
    }
    assert!(is_temp_name(OsStr::new(".handoff-Ab12Cd.tmp")));
    assert!(!is_temp_name(OsStr::new("handoff-Ab12Cd.tmp")));
}

#[test]
fn policy_digest_is_strict_hex() {
    assert_eq!(policy_digest(&"0f".repeat(32)), Some([0x0f; 32]));
    assert_eq!(policy_digest(&"0F".repeat(32)), None);
    assert_eq!(policy_digest(&"0f".repeat(31)), None);
    assert_eq!(policy_digest("../../etc/passwd"), None);
}

fn engine() -> Engine {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    Engine::new(&config).expect("engine")
}

/// The smallest component there is.
fn component(engine: &Engine) -> Component {
    Component::new(engine, "(component)").expect("component")
}

fn cache(engine: &Engine, dir: &Path) -> ArtifactCache {
    ArtifactCache::new(engine, dir.to_path_buf())
}

fn sha(n: u8) -> String {
    hex::encode([n; 32])
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn stores_then_loads_through_a_private_folder() {
    let engine = engine();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a/b/cache");
    let cache = cache(&engine, &dir);
    assert!(matches!(cache.load(&engine, &sha(1)), Lookup::Miss));
    cache.store(&sha(1), &component(&engine));
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&root.path().join("a")), 0o700);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [OsStr::new(&cache.file_name(&sha(1)))]);
    assert_eq!(mode(&dir.join(&names[0])), 0o600);
    assert!(matches!(cache.load(&engine, &sha(1)), Lookup::Hit(_)));
    assert!(matches!(cache.load(&engine, &sha(2)), Lookup::Miss));
}

#[test]
fn a_folder_or_artifact_of_another_user_is_refused() {
    let engine = engine();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    cache(&engine, &dir).store(&sha(1), &component(&engine));
    let mut other = cache(&engine, &dir);
    other.owner = other.owner.wrapping_add(1);
    // The folder is checked first.
    assert!(matches!(other.load(&engine, &sha(1)), Lookup::Refused));
    assert!(other.open_dir().unwrap_err().contains("owned by user"));
    // The artifact on its own: the folder's owner check passes for the real owner, and the
    // file's check is the same function with the same expectation.
    let meta = std::fs::metadata(dir.join(other.file_name(&sha(1)))).unwrap();
    assert!(other.check_owner_and_mode(&meta).is_err());
    assert!(cache(&engine, &dir).check_owner_and_mode(&meta).is_ok());
}

#[test]
fn a_component_larger_than_the_bound_is_not_stored() {
    let engine = engine();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    let cache = cache(&engine, &dir).with_max_bytes(HEADER_LEN as u64);
    cache.store(&sha(1), &component(&engine));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn trimming_evicts_the_least_recently_used_of_its_own_files() {
    let engine = engine();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    let probe = cache(&engine, &dir);
    probe.store(&sha(1), &component(&engine));
    let size = std::fs::metadata(dir.join(probe.file_name(&sha(1))))
        .unwrap()
        .len();
    // Room for two artifacts.
    let cache = cache(&engine, &dir).with_max_bytes(2 * size + size / 2);
    let age = |n: u8, secs: u64| {
        let file = File::options()
            .write(true)
            .open(dir.join(cache.file_name(&sha(n))))
            .unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    };
    cache.store(&sha(2), &component(&engine));
    age(1, 300);
    age(2, 200);
    // A load marks 1 as recently used, so 2 is now the least recently used.
    assert!(matches!(cache.load(&engine, &sha(1)), Lookup::Hit(_)));
    // Files not named as the cache names them are never touched, whatever their size.
    let foreign = dir.join("notes.cwasm");
    File::create(&foreign).unwrap().set_len(10 * size).unwrap();
    let stale = dir.join(".handoff-Xy12Zw.tmp");
    File::create(&stale)
        .unwrap()
        .set_modified(SystemTime::now() - 2 * STALE_TEMP)
        .unwrap();
    let fresh = dir.join(".handoff-Ab34Cd.tmp");
    File::create(&fresh).unwrap();
    cache.store(&sha(3), &component(&engine));
    assert!(dir.join(cache.file_name(&sha(1))).exists());
    assert!(!dir.join(cache.file_name(&sha(2))).exists());
    assert!(dir.join(cache.file_name(&sha(3))).exists());
    assert!(foreign.exists());
    assert!(!stale.exists());
    assert!(fresh.exists());
}
