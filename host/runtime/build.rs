//! Builds the shipped policy components (one crate each under `guest/`, listed in [`SHIPPED`],
//! the one place they are named) for wasm32-wasip2 and embeds them with their digests: the
//! default runs when no policy is given, and `handoff policy export NAME` writes any of them.
//! Writes the table the runtime serves them from (`shipped.rs`) and states the contract's
//! version (`HANDOFF_CONTRACT`), read from `wit/policy.wit`.

use std::fmt::Write as _;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// The shipped policies, the default first: each one's name (its crate is
/// `guest/<name>`, package `handoff-<name>-policy`) and what it does, in one line.
const SHIPPED: &[(&str, &str)] = &[
    (
        "default",
        "the baseline task: one transaction per event, the baseline's event IDs",
    ),
    (
        "batching",
        "up to batch_size events per transaction (policy parameter, default 10)",
    ),
    (
        "quarantine",
        "events whose fullDocument.schemaVersion is not supported go to the quarantine",
    ),
    (
        "domain-events",
        "records shaped as domain events (OrderCreated, OrderUpdated, OrderDeleted), the default's IDs",
    ),
];

fn main() {
    let workspace = handoff_guest_build::workspace(2);
    println!(
        "cargo:rustc-env=HANDOFF_CONTRACT={}",
        handoff_guest_build::contract(&workspace)
    );
    let crates: Vec<String> = SHIPPED
        .iter()
        .map(|(name, _)| format!("guest/{name}"))
        .collect();
    let mut watched: Vec<&str> = crates.iter().map(String::as_str).collect();
    watched.extend(["guest/sdk", "wit", "Cargo.lock"]);
    handoff_guest_build::rerun_if_changed(&workspace, &watched);
    let target_dir = handoff_guest_build::target_dir(&workspace);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let mut table = String::from("&[\n");
    // One build each: the policies share the SDK, and separate builds keep their exports apart.
    for (name, summary) in SHIPPED {
        let release = handoff_guest_build::build(
            &workspace,
            &target_dir,
            &["-p", &format!("handoff-{name}-policy"), "--lib"],
        );
        let artifact = name.replace('-', "_");
        let wasm = release.join(format!("handoff_{artifact}_policy.wasm"));
        let bytes =
            std::fs::read(&wasm).unwrap_or_else(|e| panic!("reading {}: {e}", wasm.display()));
        let embedded = out_dir.join(format!("{name}-policy.wasm"));
        std::fs::write(&embedded, &bytes).expect("write policy");
        writeln!(
            table,
            "    Shipped {{ name: {name:?}, summary: {summary:?}, bytes: include_bytes!({:?}), \
             sha256: {:?} }},",
            embedded.display().to_string(),
            hex::encode(Sha256::digest(&bytes)),
        )
        .expect("a string");
    }
    table.push_str("]\n");
    std::fs::write(out_dir.join("shipped.rs"), table).expect("write shipped.rs");
}
