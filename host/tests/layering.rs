//! The host's rooms depend on each other in one direction only, and each outside crate stays in
//! the room made for it: the guarantees (`session`) know nothing of WebAssembly or of a driver,
//! the driver lives in the MongoDB backend alone, and command-line parsing lives in the binary.
//! The vocabulary (`domain`, with `error`) is a crate of its own, `handoff-domain`, which cannot
//! name any of these rooms nor depend on wasmtime, the driver or clap: the compiler keeps it
//! apart; this checks the rooms still inside the `handoff` crate.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each room and the rooms it may use (besides itself).
const ALLOWED: &[(&str, &[&str])] = &[
    ("session", &["domain", "error"]),
    ("backend", &["domain", "error"]),
    ("runtime", &["domain", "session", "error"]),
    ("run", &["domain", "session", "backend", "runtime", "error"]),
    ("output", &["domain", "session", "run", "error"]),
    (
        "kit",
        &["domain", "session", "backend", "runtime", "run", "error"],
    ),
    ("operate", &["domain", "backend", "run", "error"]),
];

/// Outside crates and the rooms that may name them.
const CONFINED: &[(&str, &[&str])] = &[
    ("wasmtime", &["runtime", "kit"]),
    // The operator's commands reach a replica set through typed functions of the MongoDB
    // backend: the driver is the backend's alone.
    ("mongodb", &["backend/mongo"]),
    ("clap", &["cli"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every Rust file under `dir`, with its text up to its first `#[cfg(test)]` (unit tests may
/// build fixtures from any room); `tests.rs` files are test modules through and through.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    if dir.extension().is_some_and(|e| e == "rs") {
        pending.clear();
        found.push(dir.to_path_buf());
    }
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                found.push(path);
            }
        }
    }
    found
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            // Doc and line comments may name any room.
            let code: String = code
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            (path, code)
        })
        .collect()
}

fn room_dir(room: &str) -> PathBuf {
    let dir = src().join(room);
    if dir.is_dir() {
        dir
    } else {
        src().join(format!("{room}.rs"))
    }
}

/// The rooms a text names through `crate::<room>`.
fn rooms_used(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .map(|(at, _)| {
            code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|room| !room.is_empty())
        .collect()
}

#[test]
fn rooms_depend_in_one_direction() {
    let mut broken = Vec::new();
    for (room, allowed) in ALLOWED {
        let files = sources(&room_dir(room));
        assert!(!files.is_empty(), "no source found for the room {room}");
        for (path, code) in files {
            for used in rooms_used(&code) {
                if used != *room && !allowed.contains(&used.as_str()) {
                    broken.push(format!("{} uses crate::{used}", path.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "rooms used against the layering:\n{}",
        broken.join("\n")
    );
}

#[test]
fn outside_crates_stay_in_their_rooms() {
    let mut broken = Vec::new();
    for (path, code) in sources(&src()) {
        let relative = path
            .strip_prefix(src())
            .expect("under src")
            .to_string_lossy()
            .to_string();
        for (krate, rooms) in CONFINED {
            let named =
                code.contains(&format!("{krate}::")) || code.contains(&format!("use {krate}"));
            if named && !rooms.iter().any(|room| relative.starts_with(room)) {
                broken.push(format!("{relative} names {krate}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "outside crates outside their rooms:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // The scanner finds the links it must refuse, so the checks cannot pass by finding nothing.
    let runtime: BTreeSet<String> = sources(&room_dir("runtime"))
        .iter()
        .flat_map(|(_, code)| rooms_used(code))
        .collect();
    assert!(runtime.contains("session"), "{runtime:?}");
    assert_eq!(
        rooms_used("use crate::backend::mongo; let x = crate::run::Plan;"),
        BTreeSet::from(["backend".to_string(), "run".to_string()])
    );
    let bindings = sources(&src().join("runtime/bindings.rs"));
    assert!(bindings[0].1.contains("wasmtime::"));
}
