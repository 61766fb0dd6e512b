//! What the engine examples' suites share (`integration_engine_*`): the exit codes the examples
//! retry, the inputs they expose, the README's exit code table and the variables `handoff` reads,
//! the stand-in `handoff` and the PATH and outputs helpers.
//!
//! None of the three engines runs here, so each check does what its engine would do with the
//! example: the Argo template and the GitHub workflow are parsed as YAML, the Airflow DAG is loaded
//! by Python with stand-ins for exactly the Airflow names it imports (parsed first with `ast`); the
//! command the engine would run is run against a replica set (a test server's, or `MONGODB_URI`'s
//! with a database of the test's own) with `handoff` on the PATH, its inputs set through the
//! engine's own parameters; the outputs are read back as the engine reads them (Argo: the
//! parameter file, then the template's `jsonpath` expressions; GitHub: `$GITHUB_OUTPUT`, parsed as
//! the runner parses it, then the step that reads `steps.handoff.outputs`; Airflow: the dict the
//! task returns and pushes to XCom); and the retry rule is evaluated for every exit code the README
//! documents, as the engine evaluates it (Argo: `retryStrategy`'s policy and expression; GitHub:
//! the step's own loop, run with a stand-in `handoff`, counting attempts; Airflow: the exception
//! the task raises, with a stand-in `handoff`). Where more of the engine's behaviour matters, it
//! is reproduced too: Airflow 3's task log (stdout at INFO, stderr at ERROR), its retried tries
//! (a try's XComs cleared when the next one starts) and its execution_timeout; Argo's retry scope
//! for the failures of the pod, and its backoff; the GitHub runner's cancellation (SIGINT, then
//! SIGTERM, to the step's shell only) and the actions' Node runtime; the waits of Kestra's retry
//! and the signals its runners send a killed task.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::live::Live;
use bson::doc;
use serde_json::{Value, json};

/// The exit codes every example retries: conflict (3), unavailable (10) and a stop by a signal
/// after the last commit (12). Every other failure is permanent.
pub const RETRYABLE: [i32; 3] = [3, 10, 12];

/// The inputs every example exposes, with the Kestra flow's defaults.
pub const INPUT_DEFAULTS: [(&str, &str); 5] = [
    ("database", "change_demo"),
    ("collection", "orders"),
    ("consumer_id", "orders-to-outbox"),
    ("max_events", "50"),
    ("max_wait_seconds", "10"),
];

pub fn retryable(code: i32) -> bool {
    RETRYABLE.contains(&code)
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn load_yaml(relative: &str) -> (String, Value) {
    let path = root().join("flows").join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{relative}: {e}"));
    (
        text,
        serde_json::to_value(yaml).expect("YAML with string keys"),
    )
}

/// The exit codes of the README's table, each checked against the class the examples retry.
pub fn documented_exit_codes() -> Vec<i32> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = readme
        .split("### Exit codes")
        .nth(1)
        .expect("the README's exit code table");
    let mut codes = Vec::new();
    let mut classes = BTreeMap::new();
    for line in section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        for part in cells[0].split('/') {
            if let Ok(code) = part.trim().parse::<i32>() {
                codes.push(code);
                classes.insert(code, cells[1].to_string());
            }
        }
    }
    assert!(
        [0, 2, 3, 6, 10, 12, 130, 143]
            .iter()
            .all(|c| codes.contains(c)),
        "{codes:?}"
    );
    // The retried codes are the classes the README says to retry (or that continue by themselves).
    assert_eq!(classes[&3], "conflict");
    assert_eq!(classes[&10], "unavailable");
    assert!(classes[&12].starts_with("stopped by"), "{}", classes[&12]);
    retry_table_covers(&codes);
    codes
}

/// The retry table of `flows/README.md` names every exit code a run can end with (every
/// documented code but 0 and 16, which only `status` and `reconcile` return) exactly once, and
/// says "yes" for exactly the codes the examples retry.
fn retry_table_covers(documented: &[i32]) {
    let flows = std::fs::read_to_string(root().join("flows/README.md")).expect("flows/README.md");
    let section = flows
        .split("\n### Retries\n")
        .nth(1)
        .expect("flows/README.md has a Retries section");
    let mut listed: BTreeMap<i32, bool> = BTreeMap::new();
    for line in section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let retried = cells[2].starts_with("yes");
        for part in cells[0].split(',') {
            let bounds: Vec<i32> = part
                .split('–')
                .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{line}")))
                .collect();
            for code in bounds[0]..=bounds[bounds.len() - 1] {
                assert!(
                    listed.insert(code, retried).is_none(),
                    "exit {code} is listed twice in the retry table"
                );
            }
        }
    }
    for code in documented.iter().filter(|c| ![0, 16].contains(*c)) {
        assert!(
            listed.contains_key(code),
            "exit {code} is missing from flows/README.md's retry table: {listed:?}"
        );
    }
    let retried: Vec<i32> = listed
        .iter()
        .filter(|(_, r)| **r)
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(retried, RETRYABLE, "the codes the retry table retries");
}

/// `dir` first on the PATH, then the test's own PATH (sh, bash, jq, python3…).
pub fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The folder of the `handoff` binary under test.
pub fn handoff_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_handoff"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A stand-in `handoff` in `dir`: it counts its runs in `dir/calls`, writes outputs shaped like the
/// real ones for `code` to its `--outputs-file` (none after a second signal, as the real one) and
/// exits with `code`.
pub fn fake_handoff(dir: &Path, code: i32) -> PathBuf {
    scripted_handoff(dir, &[(code, 0)])
}

/// A stand-in `handoff` in `dir` whose `n`-th run behaves as `runs[n - 1]` (the last entry for any
/// later run): `(exit code, events handed off)`, reported in its outputs as the real one does,
/// exit 12 with `stopped`, a failure with its class and guidance. It counts its runs in
/// `dir/calls`, which it returns.
pub fn scripted_handoff(dir: &Path, runs: &[(i32, u64)]) -> PathBuf {
    assert!(!runs.is_empty());
    std::fs::create_dir_all(dir).unwrap();
    let calls = dir.join("calls");
    let mut cases = String::new();
    for (index, &(code, events)) in runs.iter().enumerate() {
        let mut outputs = json!({
            "events_handed_off": events,
            "last_event_id": if events == 0 { String::new() } else { format!("event-{index}") },
            "consumer_id": "orders-to-outbox",
            "events_skipped": 0, "events_quarantined": 0, "policy_sha256": "0".repeat(64),
        });
        match code {
            0 => outputs["status"] = json!(if events == 0 { "IDLE" } else { "HANDED_OFF" }),
            12 => {
                outputs["status"] = json!(if events == 0 { "IDLE" } else { "HANDED_OFF" });
                outputs["stopped"] = json!(true);
            }
            _ => {
                outputs["status"] = json!("FAILED");
                outputs["error_class"] = json!("stand_in");
                outputs["exit_code"] = json!(code);
                outputs["guidance"] = json!("a stand-in failure");
            }
        }
        let write = if code == 130 || code == 143 {
            ":".to_string()
        } else {
            // The outputs file, else Kestra's task protocol on stdout (as `handoff` without one).
            format!(
                "if [ -n \"$out\" ]; then printf '%s\\n' {json} > \"$out\"; else printf '%s\\n' {line}; fi",
                json = shell_quote(&outputs.to_string()),
                line = shell_quote(&format!("::{}::", json!({ "outputs": outputs }))),
            )
        };
        let pattern = if index + 1 == runs.len() {
            "*".to_string()
        } else {
            (index + 1).to_string()
        };
        cases.push_str(&format!("  {pattern}) {write}; exit {code} ;;\n"));
    }
    let script = format!(
        "#!/bin/sh\necho run >> {calls}\nn=$(($(wc -l < {calls})))\nout=\nprev=\nfor arg in \"$@\"; do\n  if [ \"$prev\" = --outputs-file ]; then out=\"$arg\"; fi\n  prev=\"$arg\"\ndone\ncase $n in\n{cases}esac\n",
        calls = shell_quote(&calls.display().to_string()),
    );
    let bin = dir.join("handoff");
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    calls
}

/// `handoff run`'s default lease, in seconds, as its help states it.
pub fn default_lease_seconds() -> u64 {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["run", "--help"])
        .output()
        .expect("handoff run --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let option = help
        .split("--lease-seconds")
        .nth(1)
        .expect("the --lease-seconds option");
    option
        .split("[default: ")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no default lease in {option}"))
}

/// The longest a replica set takes to elect a new primary, in seconds (MongoDB's election
/// timeout, 10 s by default, and the election itself): a retry sooner than this meets the same
/// `unavailable`.
pub const ELECTION_SECONDS: u64 = 12;

/// Reads `reader` line by line until a line contains `needle`; returns the lines read (panics after
/// 30 s or at the end of the stream).
pub fn read_until(reader: &mut impl std::io::BufRead, needle: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut lines = Vec::new();
    while std::time::Instant::now() < deadline {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let found = line.contains(needle);
        lines.push(line);
        if found {
            return lines;
        }
    }
    panic!("{needle:?} never came: {lines:?}");
}

/// Sends `signal` (e.g. "TERM") to the process `pid`.
pub fn send_signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

pub fn count_calls(calls: &Path) -> usize {
    std::fs::read_to_string(calls)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

pub fn insert_two_orders(live: &Live) {
    live.wait(
        live.coll("orders")
            .insert_many(vec![doc! {"a": 1}, doc! {"a": 2}]),
    )
    .expect("insert");
}

/// Checks the outputs of a successful run as every engine sees them (strings or JSON values).
pub fn check_success(outputs: &BTreeMap<String, String>, status: &str, events: usize, what: &str) {
    assert_eq!(outputs["status"], status, "{what}: {outputs:?}");
    assert_eq!(outputs["events_handed_off"], events.to_string(), "{what}");
    assert_eq!(outputs["consumer_id"], "orders-to-outbox", "{what}");
    assert_eq!(outputs["events_skipped"], "0", "{what}");
    assert_eq!(outputs["policy_sha256"].len(), 64, "{what}: {outputs:?}");
    assert_eq!(outputs["last_event_id"].is_empty(), events == 0, "{what}");
}

/// A JSON object's values as the strings a YAML engine hands on (strings as they are).
pub fn as_strings(object: &Value) -> BTreeMap<String, String> {
    object
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {object}"))
        .iter()
        .map(|(key, value)| {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (key.clone(), text)
        })
        .collect()
}
