//! `cargo bench -p handoff --bench languages`
//!
//! The default policy written in Rust (the embedded one), Python (componentize-py) and JavaScript
//! (componentize-js), side by side on the same host binary, measured in one run:
//! - the component's size and its compilation (Cranelift, no artifact cache);
//! - warm start: process start to the policy's first host call, cached artifact, existing
//!   consumer (median of 7);
//! - a whole `handoff replay` of 500 events (median of 3) and the per-event cost in process over
//!   2,000 events with the in-memory store (median of 3);
//! - the memory the policy grew to (what `--policy-memory-mib` must allow).
//!
//! The Python and JavaScript components are built as the suites build them, with the toolchains
//! the test command installs (the suites' virtual environment for componentize-py, `npm ci` in
//! `guest/javascript`); the benchmark installs them the same way when they are missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use handoff::backend::memory::MemoryStore;
use handoff::backend::replay::Fixture;
use handoff::runtime::{Limits, PolicySource, Runtime, Settings};

mod support;
use support::{fixture_text, median, session, startup_us};

const IN_PROCESS_EVENTS: u32 = 2_000;
const REPLAY_EVENTS: u32 = 500;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// The toolchains, installed as the test command installs them; returns a PATH with them first.
fn toolchains() -> String {
    let root = workspace();
    let venv = root.join("tests/mongo-sim/python/.venv");
    if !venv.join("bin/python").exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
    }
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(root.join("tests/python/requirements-componentize-py.txt")),
        "pip install componentize-py",
    );
    if !root.join("guest/javascript/node_modules").exists() {
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(root.join("guest/javascript")),
            "npm ci in guest/javascript",
        );
    }
    format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Builds the Python default as the suite does (guest/python/README.md): the contract is the SDK
/// package's (`guest/python/handoff_policy/componentize-py.toml` names its `wit/`).
fn build_python(dir: &Path, path: &str) -> PathBuf {
    let root = workspace();
    let out = dir.join("python-default.wasm");
    run(
        Command::new("componentize-py")
            .env("PATH", path)
            .current_dir(&root)
            .args(["-w", "effects-policy", "componentize", "handoff_policy"])
            .args(["-p", "guest/python/default", "-p", "guest/python", "-o"])
            .arg(&out),
        "componentize-py",
    );
    out
}

/// Builds the JavaScript default as the suite does (`npm run build` in guest/javascript).
fn build_javascript() -> PathBuf {
    let dir = workspace().join("guest/javascript");
    run(
        Command::new("npm").args(["run", "build"]).current_dir(&dir),
        "npm run build",
    );
    dir.join("build/default.wasm")
}

struct Figures {
    size: usize,
    compile_ms: f64,
    warm_us: f64,
    replay_ms: f64,
    per_event_us: f64,
    memory_mib: f64,
}

/// The memory the policy grew to, from the run's `handoff::policy` log line.
fn logged_memory(stderr: &str) -> f64 {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["fields"]["memory_bytes"].as_f64())
        .expect("the policy memory line")
        / f64::from(1 << 20)
}

fn measure(bin: &str, dir: &Path, source: &PolicySource, file: &Path) -> Figures {
    let small = dir.join("small.jsonl");
    let big = dir.join("big.jsonl");
    let cache = dir.join(format!("cache-{}", &source.sha256[..12]));
    let file = file.to_str().unwrap();

    // Compilation: `policy precompile` into an empty cache, whole process.
    let started = Instant::now();
    let output = Command::new(bin)
        .args(["policy", "precompile", file])
        .env("HANDOFF_CACHE_DIR", &cache)
        .output()
        .expect("precompile");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;

    let state = dir.join(format!("warm-{}.redb", &source.sha256[..12]));
    let warm_us = median(
        (0..7)
            .map(|_| {
                startup_us(
                    bin,
                    &[
                        "replay",
                        small.to_str().unwrap(),
                        "--state",
                        state.to_str().unwrap(),
                        "--max-wait-seconds",
                        "1",
                        "--policy",
                        file,
                    ],
                    &[],
                    &cache,
                    true,
                )
                .0
            })
            .collect(),
    );

    let mut memory_mib = 0.0;
    let replay_ms = median(
        (0..3)
            .map(|i| {
                let state = dir.join(format!("replay-{}-{i}.redb", &source.sha256[..12]));
                let started = Instant::now();
                let output = Command::new(bin)
                    .args(["replay", big.to_str().unwrap(), "--state"])
                    .arg(&state)
                    .args(["--max-events", &REPLAY_EVENTS.to_string(), "--policy", file])
                    .env("HANDOFF_CACHE_DIR", &cache)
                    .env("HANDOFF_LOG", "handoff::policy=info")
                    .env("HANDOFF_LOG_FORMAT", "json")
                    .output()
                    .expect("replay");
                let elapsed = started.elapsed().as_secs_f64() * 1e3;
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(output.status.success(), "{stderr}");
                memory_mib = logged_memory(&stderr);
                elapsed
            })
            .collect(),
    );

    let runtime = Runtime::new(Some(cache)).expect("runtime");
    let policy = runtime.load(source).expect("policy");
    let fixture = Arc::new(Fixture::parse(&fixture_text(IN_PROCESS_EVENTS)).expect("fixture"));
    let per_event_us = median(
        (0..3)
            .map(|_| {
                let store = Arc::new(MemoryStore::new());
                let started = Instant::now();
                let summary = runtime
                    .run(
                        &policy,
                        session(&fixture, store.clone()),
                        &Settings {
                            max_events: IN_PROCESS_EVENTS,
                            max_wait_ms: 1000,
                            params: vec![],
                        },
                        &Limits::default(),
                    )
                    .expect("run");
                let us = started.elapsed().as_secs_f64() * 1e6 / f64::from(IN_PROCESS_EVENTS);
                assert_eq!(summary.committed.handed_off, IN_PROCESS_EVENTS);
                us
            })
            .collect(),
    );
    Figures {
        size: source.bytes.len(),
        compile_ms,
        warm_us,
        replay_ms,
        per_event_us,
        memory_mib,
    }
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_handoff");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("small.jsonl"), fixture_text(1)).expect("fixture");
    std::fs::write(dir.path().join("big.jsonl"), fixture_text(REPLAY_EVENTS)).expect("fixture");
    let path = toolchains();
    let rust = dir.path().join("rust.wasm");
    std::fs::write(&rust, &PolicySource::embedded_default().bytes).expect("export");
    let policies = [
        ("Rust", rust),
        ("Python", build_python(dir.path(), &path)),
        ("JavaScript", build_javascript()),
    ];
    let mut rows = Vec::new();
    for (lang, file) in &policies {
        let source = PolicySource::from_file(file).expect("component");
        eprintln!("measuring the {lang} default policy ({})", file.display());
        rows.push((lang, measure(bin, dir.path(), &source, file)));
    }
    let base = &rows[0].1;
    println!("the default policy in three languages, same host binary:");
    println!(
        "  {:<11} {:>9} {:>11} {:>11} {:>13} {:>13} {:>9}",
        "", "size", "compile", "warm start", "500 events", "per event", "memory"
    );
    for (lang, f) in &rows {
        println!(
            "  {:<11} {:>7.1}MB {:>9.0}ms {:>9.1}ms {:>11.0}ms {:>9.2}us {:>3.0}x {:>6.1}MiB",
            lang,
            f.size as f64 / 1e6,
            f.compile_ms,
            f.warm_us / 1e3,
            f.replay_ms,
            f.per_event_us,
            f.per_event_us / base.per_event_us,
            f.memory_mib
        );
    }
    println!(
        "  (compile: `policy precompile`, whole process; warm start: process start to first policy call, median of 7; \
500 events: whole `handoff replay`, median of 3; per event: in process, {IN_PROCESS_EVENTS} events, in-memory store, median of 3, and its ratio to Rust)"
    );
}
