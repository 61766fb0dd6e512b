//! The rooms' dependencies, as their manifests declare them. The compiler refuses a room that
//! names a crate it does not depend on, and cargo refuses a cycle; what neither sees is a
//! dependency that runs across or up a floor without a cycle (the session on a backend, a room
//! on the driver). Each crate's `[dependencies]` are checked here against the architecture.

use std::collections::BTreeSet;
use std::path::Path;

/// Each room's crate and the handoff crates it may depend on.
const ROOMS: &[(&str, &[&str])] = &[
    ("domain", &[]),
    ("session", &["handoff-domain"]),
    ("backend", &["handoff-domain"]),
    ("mongo", &["handoff-domain"]),
    ("runtime", &["handoff-domain", "handoff-session"]),
    (
        "run",
        &[
            "handoff-domain",
            "handoff-session",
            "handoff-backend",
            "handoff-mongo",
            "handoff-runtime",
        ],
    ),
    (
        "output",
        &[
            "handoff-domain",
            "handoff-session",
            "handoff-run",
            "handoff-deliver",
        ],
    ),
    (
        "kit",
        &[
            "handoff-domain",
            "handoff-session",
            "handoff-backend",
            "handoff-runtime",
            "handoff-run",
        ],
    ),
    (
        "operate",
        &[
            "handoff-domain",
            "handoff-backend",
            "handoff-mongo",
            "handoff-run",
        ],
    ),
    ("deliver", &["handoff-domain", "handoff-mongo"]),
];

/// Outside crates and the only crates that may depend on them (`.` is the binary's, `host/`).
const CONFINED: &[(&str, &[&str])] = &[
    ("mongodb", &["mongo"]),
    ("wasmtime", &["runtime", "kit"]),
    ("wasmtime-wasi", &["runtime"]),
    ("clap", &["."]),
];

fn dependencies(room: &str) -> BTreeSet<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(room)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let manifest: toml::Table = text.parse().expect("a manifest");
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn each_room_depends_only_on_the_rooms_below_it() {
    for (room, allowed) in ROOMS {
        for dependency in dependencies(room) {
            assert!(
                !dependency.starts_with("handoff-") || allowed.contains(&dependency.as_str()),
                "host/{room} depends on {dependency}; it may depend on {allowed:?}"
            );
        }
    }
}

#[test]
fn outside_crates_stay_in_their_rooms() {
    let rooms = ROOMS.iter().map(|(room, _)| *room).chain(["."]);
    for room in rooms {
        let dependencies = dependencies(room);
        for (outside, only) in CONFINED {
            assert!(
                !dependencies.contains(*outside) || only.contains(&room),
                "host/{room} depends on {outside}, which only {only:?} may"
            );
        }
    }
}

/// Every crate under `host/` is a room above (a new one is placed in the architecture).
#[test]
fn every_crate_of_the_host_is_a_room() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(host).expect("host/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().join("Cargo.toml").exists() && name != "fuzz" {
            assert!(
                ROOMS.iter().any(|(room, _)| *room == name),
                "host/{name} is a crate that is not a room of tests/layering.rs"
            );
        }
    }
}
