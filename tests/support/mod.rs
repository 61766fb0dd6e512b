//! Helpers shared by the end-to-end suites: recorded streams built in code, the `handoff` binary
//! run as the engine runs it, and its outputs and state read back.
#![allow(dead_code)]

pub mod browser;
pub mod engines;
pub mod http;
pub mod kestra;
pub mod live;
pub mod partitions;
pub mod receiver;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

pub const SET_NAME: &str = "rs0";
pub const REPLICA_SET_ID: &str = "6740a1b2c3d4e5f601234567";
pub const SOURCE: &str = "change_demo.orders";

/// A resume token shaped like MongoDB's: `82` + 8-byte timestamp + event suffix.
pub fn token(seq: u32) -> Value {
    json!({ "_data": format!("82{:08X}{:08X}2B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F4604000004", 1_793_527_200u32 + seq / 4, seq) })
}

/// A post-batch (high-water-mark) token after event `seq`.
pub fn batch_end(seq: u32) -> Value {
    json!({ "$postBatchResumeToken": { "_data": format!("82{:08X}{:08X}2B0429296E1404", 1_793_527_200u32 + seq / 4, seq) } })
}

/// A change event of `op` with token `seq` on the demo collection.
pub fn event(seq: u32, op: &str) -> Value {
    let mut e = json!({
        "_id": token(seq),
        "operationType": op,
        "clusterTime": { "$timestamp": { "t": 1_793_527_200u32 + seq / 4, "i": seq } },
        "wallTime": { "$date": "2026-11-01T10:00:00Z" },
        "ns": { "db": "change_demo", "coll": "orders" },
    });
    let key = json!({ "_id": { "$oid": format!("6740a1b2c3d4e5f6{seq:08x}") } });
    match op {
        "insert" | "replace" => {
            e["documentKey"] = key.clone();
            e["fullDocument"] = json!({ "_id": key["_id"], "sku": format!("SKU-{seq}"), "qty": { "$numberLong": seq.to_string() } });
        }
        "update" => {
            e["documentKey"] = key.clone();
            e["updateDescription"] = json!({ "updatedFields": { "qty": seq }, "removedFields": [], "truncatedArrays": [] });
            e["fullDocument"] =
                json!({ "_id": key["_id"], "sku": format!("SKU-{seq}"), "qty": seq });
        }
        "delete" => e["documentKey"] = key,
        "invalidate" => {
            e.as_object_mut().map(|o| o.remove("ns"));
        }
        _ => {}
    }
    e
}

pub fn deployment(replica_set_id: &str) -> Value {
    json!({ "$deployment": { "setName": SET_NAME, "replicaSetId": replica_set_id, "source": SOURCE } })
}

/// A temporary workspace for one test: fixtures, the state store, the artifact cache.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn state(&self) -> PathBuf {
        self.path("state.redb")
    }

    /// A recorded stream of an insert, an update and a delete, ending its batch.
    pub fn three_events(&self) -> PathBuf {
        self.fixture(
            "three.jsonl",
            &[
                deployment(REPLICA_SET_ID),
                event(1, "insert"),
                event(2, "update"),
                event(3, "delete"),
                batch_end(3),
            ],
        )
    }

    /// Writes a fixture (one JSON value per line) and returns its path.
    pub fn fixture(&self, name: &str, lines: &[Value]) -> PathBuf {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let path = self.path(name);
        std::fs::write(&path, text).expect("write fixture");
        path
    }
}

/// The shared artifact cache of the suites (so only the first run of a policy compiles it).
pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("handoff-cache")
}

/// The environment variables `handoff` reads, from the file the binary names them in.
#[path = "../../host/src/cli/env.rs"]
pub mod env_names;

/// `handoff` with a clean environment: none of the variables it reads leak in, under their
/// current or former names (not even the `MONGODB_URI` a run of the suites against a real replica
/// set is given).
pub fn handoff() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_handoff"));
    let former = env_names::FORMER.iter().map(|(former, _)| former);
    for key in env_names::ALL.iter().chain(former) {
        command.env_remove(key);
    }
    command.env(env_names::CACHE_DIR, cache_dir());
    command
}

/// The environment variables `handoff run` reads, from its own help (`[env: NAME=…]`), as a
/// flow's author sees them.
pub fn variables_handoff_reads() -> std::collections::BTreeSet<String> {
    let mut vars = std::collections::BTreeSet::new();
    for args in [&["run", "--help"][..], &["--help"][..]] {
        let help = handoff().args(args).output().unwrap();
        for part in String::from_utf8_lossy(&help.stdout).split("env: ").skip(1) {
            vars.insert(
                part.chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect(),
            );
        }
    }
    for expected in [
        env_names::MONGODB_URI,
        env_names::MAX_EVENTS,
        env_names::LOG,
    ] {
        assert!(vars.contains(expected), "{expected} is not in {vars:?}");
    }
    vars
}

/// Runs `handoff replay FIXTURE --state STATE EXTRA…`.
pub fn replay(fixture: &Path, state: &Path, extra: &[&str]) -> Output {
    handoff()
        .arg("replay")
        .arg(fixture)
        .arg("--state")
        .arg(state)
        .args(extra)
        .output()
        .expect("run handoff")
}

/// The value under `key` of the first `::{…}::` task-protocol line that has it, as Kestra
/// parses it.
pub fn protocol_line(output: &Output, key: &str) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        if let Some(inner) = line.strip_prefix("::").and_then(|l| l.strip_suffix("::")) {
            let value: Value = serde_json::from_str(inner).expect("a protocol line is JSON");
            if let Some(found) = value.get(key) {
                return found.clone();
            }
        }
    }
    panic!(
        "no {key} line; exit {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The value of the `::{"outputs": …}::` line, as Kestra parses it.
pub fn outputs(output: &Output) -> Value {
    protocol_line(output, "outputs")
}

/// The value of the metric `name` in the `::{"metrics": […]}::` line.
pub fn metric(output: &Output, name: &str) -> Value {
    let metrics = protocol_line(output, "metrics");
    metrics
        .as_array()
        .expect("a list of metrics")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no metric {name}: {metrics}"))["value"]
        .clone()
}

/// Sends SIGTERM to `child` (a graceful stop).
pub fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success());
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a successful run and returns its outputs.
pub fn ok(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(output));
    outputs(output)
}

/// Asserts a failed run with `code` and a message containing `needle`, and returns its failure
/// outputs: status `FAILED`, its class and exit code as stderr states them.
pub fn fails(output: &Output, code: i32, needle: &str) -> Value {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    failure_outputs(output, code)
}

/// Asserts a command that is not a run (or a process the watchdog ended) failed with `code` and a
/// message containing `needle`, printing no outputs.
pub fn refused(output: &Output, code: i32, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("\"outputs\""));
}

/// The outputs of a failed run, checked against its exit code and its `error[class]` line.
pub fn failure_outputs(output: &Output, code: i32) -> Value {
    let out = outputs(output);
    let err = stderr(output);
    assert_eq!(out["status"], "FAILED", "{out}");
    assert_eq!(out["exit_code"], code, "{out}");
    let class = out["error_class"].as_str().expect("error_class");
    assert!(
        err.contains(&format!("error[{class}]")),
        "outputs say {class}, stderr: {err}"
    );
    assert!(
        !out["guidance"].as_str().expect("guidance").is_empty(),
        "{out}"
    );
    out
}

/// The checkpoint (less its revision and lease) and outbox of a state store (`handoff inspect`).
pub fn inspect(state: &Path) -> (Value, Vec<Value>) {
    let output = handoff()
        .arg("inspect")
        .arg("--state")
        .arg(state)
        .output()
        .expect("inspect");
    assert_eq!(
        output.status.code(),
        Some(0),
        "inspect: {}",
        stderr(&output)
    );
    let mut lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("inspect line is JSON"))
        .collect::<Vec<_>>()
        .into_iter();
    let mut checkpoint = lines.next().expect("a checkpoint");
    // What every run writes without moving the checkpoint: its revision, its lease and its
    // count of runs.
    if let Some(fields) = checkpoint.as_object_mut() {
        for key in ["revision", "owner", "leaseUntil", "runs"] {
            fields.remove(key);
        }
    }
    (checkpoint, lines.collect())
}

/// The event-ID part of each outbox `_id`, in commit order.
pub fn outbox_ids(outbox: &[Value]) -> Vec<String> {
    outbox
        .iter()
        .map(|r| {
            let id = r["_id"].as_str().expect("string _id");
            id.split_once('/').expect("consumer/id").1.to_string()
        })
        .collect()
}

/// The baseline's event ID of a token: SHA-256 of PyMongo's `dumps(token, sort_keys=True)`.
pub fn baseline_event_id(token: &Value) -> String {
    use sha2::Digest;
    // Tokens built here have only `_data`, so the canonical text is simple to state.
    let text = format!(
        "{{\"_data\": \"{}\"}}",
        token["_data"].as_str().expect("_data")
    );
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// xorshift64*: a small seeded generator, so that a randomized test can be replayed exactly from
/// the seed it prints.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The seed in the environment variable `var` (to replay a run), else one from the clock.
pub fn seed(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} is an integer")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64,
    }
}

/// The one JSON document a successful `--json` command printed on stdout.
pub fn json_stdout(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("--json prints one JSON document")
}

/// Checks that `text` gives the recovery order after lost history as `handoff` gives it
/// (`RECOVERY_STEPS`): every step, each after the one before (whitespace and line breaks aside).
pub fn assert_recovery_order(text: &str, what: &str) {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut at = 0;
    for step in handoff::output::RECOVERY_STEPS {
        match text[at..].find(step) {
            Some(found) => at += found + step.len(),
            None => panic!("{what} does not give `{step}` after the steps before it: {text}"),
        }
    }
}
