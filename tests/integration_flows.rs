//! The Kestra flows in `flows/`, checked against the task contract the engine relies on.
//!
//! Kestra cannot run here, so each flow is verified the way the engine would use it: the YAML
//! parses; it keeps the baseline flow's identity, triggers, inputs and concurrency; every
//! `{{ inputs.x }}` is declared; every variable the capture task passes is one `handoff` reads; the
//! capture task's commands, rendered with the inputs' defaults and a replica set's URI in place of
//! the secret (a test server's, or `MONGODB_URI`'s with a database of the test's own), run in a
//! working directory holding the namespace files; its stdout is parsed as Kestra parses it; and the
//! values later tasks reference exist with the right types.

use crate::support;
use crate::support::engines;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bson::doc;
use serde_json::Value;
use support::kestra::{Capture, Kestra, expressions, kestra_parse};
use support::live::Live;

const BASELINE_INPUTS: &[(&str, &str, &str)] = &[
    ("database", "STRING", "change_demo"),
    ("collection", "STRING", "orders"),
    ("consumer_id", "STRING", "orders-to-outbox"),
    (
        "checkpoint_collection",
        "STRING",
        "kestra_change_checkpoints",
    ),
    ("outbox_collection", "STRING", "kestra_change_outbox"),
    ("docker_network", "STRING", "bridge"),
    ("max_events", "INT", "50"),
    ("max_wait_seconds", "INT", "10"),
];

/// Folders of `flows/` holding other engines' examples (checked by the `integration_engine_*` suites)
/// and the scale-out examples (`integration_scale_out`).
const OTHER_ENGINES: &[&str] = &[
    "airflow",
    "argo",
    "github-actions",
    "kestra-partitions",
    "kubernetes",
];

fn flows() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../flows");
    let mut found = Vec::new();
    for dir in std::fs::read_dir(&root).expect("flows/") {
        let dir = dir.unwrap().path();
        if dir.is_dir() && !OTHER_ENGINES.iter().any(|engine| dir.ends_with(engine)) {
            for file in std::fs::read_dir(&dir).unwrap() {
                let file = file.unwrap().path();
                if matches!(
                    file.extension().and_then(|e| e.to_str()),
                    Some("yml" | "yaml")
                ) {
                    found.push(file);
                }
            }
        }
    }
    found.sort();
    assert!(
        found.len() >= 2,
        "a flow for the Process runner and one for the Docker runner: {found:?}"
    );
    found
}

fn load(path: &Path) -> (String, Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (text, serde_json::to_value(yaml).unwrap())
}

/// The capture task's variables (`outputs.capture_and_checkpoint.vars.X`) a part of a flow reads.
fn capture_vars_read(part: &Value) -> BTreeSet<String> {
    expressions(&serde_json::to_string(part).unwrap())
        .into_iter()
        .filter_map(|e| {
            let rest = e.split("outputs.capture_and_checkpoint.vars.").nth(1)?;
            Some(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            )
        })
        .collect()
}

/// What the flow does after an attempt of the capture task ended with `code` and these outputs, as
/// Kestra runs it: a non-zero exit fails the task, and its `retry` runs it again (while attempts
/// are left); a task that succeeded hands its outputs on to the next task, and
/// `fail_on_permanent_failure` fails the execution when its condition holds.
#[derive(Debug, PartialEq)]
enum Next {
    /// The execution goes on to the report and the alerts.
    Continue,
    /// The task failed: Kestra's retry applies.
    Retry,
    /// The execution fails at once, without a retry; its `errors` branch runs.
    FailExecution,
}

fn next_after(flow: &Value, code: i32, vars: &serde_json::Map<String, Value>) -> Next {
    if code != 0 {
        return Next::Retry;
    }
    let tasks = flow["tasks"].as_array().unwrap();
    let capture = tasks
        .iter()
        .position(|t| t["id"] == "capture_and_checkpoint")
        .unwrap();
    let next = &tasks[capture + 1];
    if next["type"] != "io.kestra.plugin.core.execution.Fail" {
        return Next::Continue;
    }
    let condition = next["condition"].as_str().expect("a Fail task's condition");
    let expression = expressions(condition);
    assert_eq!(expression.len(), 1, "{condition}");
    // `outputs.capture_and_checkpoint.vars.NAME == 'VALUE'`, the form the flows use.
    let (left, right) = expression[0]
        .split_once("==")
        .unwrap_or_else(|| panic!("a condition this check cannot evaluate: {condition}"));
    let name = left
        .trim()
        .strip_prefix("outputs.capture_and_checkpoint.vars.")
        .unwrap_or_else(|| panic!("a condition this check cannot evaluate: {condition}"));
    let value = right.trim().trim_matches('\'');
    if vars.get(name).and_then(Value::as_str) == Some(value) {
        Next::FailExecution
    } else {
        Next::Continue
    }
}

/// The waits between the attempts of a task with this `retry`, in seconds, as Kestra computes
/// them (`nextRetryDate`, after the attempt ended): constant waits `interval`; random at least
/// `minInterval`; exponential `interval × factor^(n-1)` since its 2026 fix but
/// `interval × factor × (n-1)` before it (0 s before the first retry), so the shorter of the two.
/// Waits past `maxDuration` (from the first attempt) are not made.
fn kestra_retry_waits(retry: &Value) -> Vec<u64> {
    let seconds = |name: &str| retry[name].as_str().map(iso8601_seconds);
    let attempts = retry["maxAttempts"]
        .as_u64()
        .or(retry["maxAttempt"].as_u64())
        .expect("maxAttempts");
    let mut waits = Vec::new();
    for n in 1..attempts {
        let wait = match retry["type"].as_str().unwrap() {
            "constant" => seconds("interval").unwrap(),
            "random" => seconds("minInterval").unwrap(),
            "exponential" => {
                let interval = seconds("interval").unwrap();
                let factor = retry["delayFactor"].as_f64().unwrap_or(2.0) as u64;
                let fixed = interval * factor.pow(n as u32 - 1);
                let before = interval * factor * (n - 1);
                fixed.min(before).min(seconds("maxInterval").unwrap())
            }
            other => panic!("a retry type this check does not know: {other}"),
        };
        waits.push(wait);
    }
    if let Some(budget) = seconds("maxDuration") {
        let mut total = 0;
        waits.retain(|wait| {
            total += wait;
            total <= budget
        });
    }
    waits
}

/// An ISO 8601 duration of whole seconds, minutes or hours (`PT30S`, `PT1M`, `PT2H`), in seconds.
fn iso8601_seconds(text: &str) -> u64 {
    let rest = text.strip_prefix("PT").expect("an ISO 8601 duration");
    let (number, unit) = rest.split_at(rest.len() - 1);
    let number: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("a duration this check cannot read: {text}"));
    match unit {
        "S" => number,
        "M" => number * 60,
        "H" => number * 3600,
        _ => panic!("a duration this check cannot read: {text}"),
    }
}

/// The processes `pid` started (Linux: `/proc/PID/task/PID/children`).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn every_flow_keeps_the_baseline_contract_and_runs_against_a_replica_set() {
    let reads = support::variables_handoff_reads();
    for path in flows() {
        let (text, flow) = load(&path);
        let name = path.display().to_string();
        assert_eq!(
            flow["id"], "mongodb-change-stream-resume-token-recovery",
            "{name}"
        );
        assert_eq!(flow["namespace"], "company.team", "{name}");
        assert_eq!(flow["concurrency"]["limit"], 1, "{name}");
        assert_eq!(flow["concurrency"]["behavior"], "QUEUE", "{name}");
        let triggers = flow["triggers"].as_array().unwrap();
        assert_eq!(triggers[0]["type"], "io.kestra.plugin.core.trigger.Webhook");
        assert_eq!(
            triggers[1]["type"],
            "io.kestra.plugin.core.trigger.Schedule"
        );
        assert_eq!(triggers[1]["disabled"], true);

        // Inputs: the baseline's ids, types and defaults, each described.
        let mut defaults = BTreeMap::new();
        let inputs = flow["inputs"].as_array().unwrap();
        assert_eq!(inputs.len(), BASELINE_INPUTS.len(), "{name}");
        for (input, (id, ty, default)) in inputs.iter().zip(BASELINE_INPUTS) {
            assert_eq!(
                (
                    input["id"].as_str().unwrap(),
                    input["type"].as_str().unwrap()
                ),
                (*id, *ty),
                "{name}"
            );
            let value = match &input["defaults"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert_eq!(value, *default, "{name}: {id}");
            assert!(
                input["description"].as_str().is_some_and(|d| d.len() > 10),
                "{name}: {id}"
            );
            defaults.insert(id.to_string(), value);
        }
        for expr in expressions(&text) {
            if let Some(input) = expr.strip_prefix("inputs.") {
                let input = input.split([' ', '}', '.']).next().unwrap();
                assert!(
                    defaults.contains_key(input),
                    "{name} uses undeclared input {input}"
                );
            }
        }

        // The capture task: handoff, fed only variables it reads, policy from the namespace files.
        let tasks = flow["tasks"].as_array().unwrap();
        let task = tasks
            .iter()
            .find(|t| t["id"] == "capture_and_checkpoint")
            .expect("capture task");
        assert!(
            task["commands"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| c.as_str().unwrap().lines())
                .any(|line| line.trim_start().starts_with("handoff run")),
            "{name}: the task runs handoff run"
        );
        for key in task["env"].as_object().unwrap().keys() {
            assert!(
                reads.contains(key),
                "{name} passes {key}, which handoff does not read"
            );
        }
        assert_eq!(task["namespaceFiles"]["enabled"], true, "{name}");
        let policy_file = task["env"]["HANDOFF_POLICY"]
            .as_str()
            .expect("policy from the namespace files");
        assert!(
            task["namespaceFiles"]["include"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == policy_file)
        );
        assert!(task["retry"].is_object(), "{name}");
        assert!(
            flow["errors"].as_array().is_some_and(|e| !e.is_empty()),
            "{name}"
        );
        let runner = task["taskRunner"]["type"].as_str().unwrap();
        if runner.ends_with("docker.Docker") {
            assert!(
                task["containerImage"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("handoff")),
                "{name}"
            );
            let dockerfile = path.parent().unwrap().join("Dockerfile");
            let dockerfile = std::fs::read_to_string(&dockerfile)
                .expect("the image's Dockerfile beside the flow");
            assert!(dockerfile.contains("cargo build --release --locked -p handoff"));
        } else {
            assert_eq!(runner, "io.kestra.plugin.core.runner.Process", "{name}");
        }

        // The values later tasks read (the errors branch reads a failed run's, checked below).
        let mut succeeding = flow.clone();
        succeeding
            .as_object_mut()
            .expect("a flow object")
            .remove("errors");
        // A Fail task's message is rendered only when its condition holds (a failed run).
        for task in succeeding["tasks"].as_array_mut().unwrap() {
            if task["type"] == "io.kestra.plugin.core.execution.Fail" {
                task.as_object_mut().unwrap().remove("errorMessage");
            }
        }
        let referenced = capture_vars_read(&succeeding);
        // Quarantined events alert the operators.
        assert!(
            tasks
                .iter()
                .any(|t| t["type"] == "io.kestra.plugin.core.flow.If"
                    && t["condition"]
                        .as_str()
                        .is_some_and(|c| c.contains("vars.events_quarantined > 0"))
                    && t["then"].as_array().is_some_and(|then| !then.is_empty())),
            "{name}: no alert on quarantined events"
        );
        assert!(
            referenced.contains("status") && referenced.contains("events_handed_off"),
            "{referenced:?}"
        );

        // Run it: idle, handed off, invalidated, failing.
        let live = Live::start();
        let uri = live.uri();
        let workdir = tempfile::tempdir().unwrap();
        let policy_path = workdir.path().join(policy_file);
        let export = support::handoff()
            .args(["policy", "export-default"])
            .arg(&policy_path)
            .output()
            .unwrap();
        assert!(export.status.success());
        // The database input names the test's database (the default on a test server of its own).
        let mut inputs = defaults.clone();
        inputs.insert("database".into(), live.db.clone());
        let capture = Capture {
            task,
            inputs: inputs.clone(),
            value: None,
        };
        let check = |expected_status: &str, expected_events: Option<u64>| {
            let (code, kestra) = capture.run(&uri, workdir.path());
            assert_eq!(code, 0, "{name}: {:?}", kestra.logs);
            assert_eq!(
                next_after(&flow, code, &kestra.vars),
                Next::Continue,
                "{name}"
            );
            let Kestra {
                vars,
                metrics,
                logs,
            } = kestra;
            // Routine logs keep their level: nothing of a successful run shows as an error.
            assert!(
                logs.iter().all(|(level, _)| level != "ERROR"),
                "{name}: {logs:?}"
            );
            assert!(
                logs.iter()
                    .any(|(level, message)| level == "INFO" && message.contains("run finished")),
                "{name}: {logs:?}"
            );
            for key in &referenced {
                assert!(
                    vars.contains_key(key),
                    "{name}: later tasks read vars.{key}: {vars:?}"
                );
            }
            assert_eq!(vars["status"], expected_status, "{name}");
            assert!(vars["events_handed_off"].is_u64());
            if let Some(n) = expected_events {
                assert_eq!(vars["events_handed_off"], n);
            }
            assert_eq!(vars["consumer_id"], "orders-to-outbox");
            assert!(vars["last_event_id"].is_string());
            assert_eq!(vars["policy_sha256"].as_str().map(str::len), Some(64));
            let counter = metrics
                .iter()
                .find(|m| m["name"] == "events_handed_off")
                .expect("counter");
            assert_eq!(counter["type"], "counter");
            assert_eq!(
                metrics
                    .iter()
                    .find(|m| m["name"] == "run_duration")
                    .expect("timer")["type"],
                "timer"
            );
        };
        check("IDLE", Some(0));
        live.wait(
            live.coll("orders")
                .insert_many(vec![doc! {"a": 1}, doc! {"a": 2}]),
        )
        .expect("insert");
        check("HANDED_OFF", Some(2));
        live.wait(live.coll("orders").drop()).expect("drop");
        check("INVALIDATED", None);

        // A failing run leaves outputs Kestra keeps for the task: what the errors branch reads. A
        // permanent failure ends the task without a retry, and the execution fails.
        let failure_vars = capture_vars_read(&flow["errors"]);
        assert!(
            failure_vars.contains("error_class") && failure_vars.contains("guidance"),
            "{name}: the errors branch reads the failure's class and guidance: {failure_vars:?}"
        );
        let mut bad = Capture {
            task,
            inputs,
            value: None,
        };
        bad.inputs.insert("max_events".into(), "0".into());
        let (code, kestra) = bad.run(&uri, workdir.path());
        assert_eq!(
            next_after(&flow, code, &kestra.vars),
            Next::FailExecution,
            "{name}: {code} {:?}",
            kestra.vars
        );
        for key in &failure_vars {
            assert!(
                kestra.vars.contains_key(key),
                "{name}: errors read vars.{key}: {:?}",
                kestra.vars
            );
        }
        assert_eq!(kestra.vars["status"], "FAILED");
        assert_eq!(kestra.vars["error_class"], "bad_input");
        assert_eq!(kestra.vars["exit_code"], 2);
        assert_eq!(kestra.vars["events_handed_off"], 0);
        assert!(
            kestra.vars["guidance"]
                .as_str()
                .unwrap()
                .contains("max_events"),
            "{:?}",
            kestra.vars
        );
        // The failure itself is the one line logged as an error.
        let errors: Vec<_> = kestra.logs.iter().filter(|(l, _)| l == "ERROR").collect();
        assert_eq!(errors.len(), 1, "{name}: {:?}", kestra.logs);
        assert!(errors[0].1.starts_with("error[bad_input]"), "{errors:?}");
        std::fs::remove_file(&policy_path).unwrap();
        let (code, kestra) = capture.run(&uri, workdir.path());
        assert_eq!(
            next_after(&flow, code, &kestra.vars),
            Next::FailExecution,
            "{name}: a missing policy file must fail the execution"
        );
        assert_eq!(kestra.vars["exit_code"], 2, "{name}");
        assert_eq!(kestra.vars["error_class"], "bad_input", "{name}");
    }
}

/// The inputs' defaults of a flow, as strings.
fn input_defaults(flow: &Value) -> BTreeMap<String, String> {
    flow["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|input| {
            let value = match &input["defaults"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (input["id"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

#[test]
fn every_flow_retries_only_what_a_later_attempt_can_fix_after_the_lease_and_stops_handoff_gently() {
    let lease = engines::default_lease_seconds();
    let codes = engines::documented_exit_codes();
    let stand_ins = tempfile::tempdir().unwrap();
    for path in flows() {
        let (_, flow) = load(&path);
        let name = path.display().to_string();
        let task = flow["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == "capture_and_checkpoint")
            .expect("capture task");

        // The waits: each one outlasts handoff's lease (a crashed run's lease has expired by the
        // next attempt) and so a replica-set election.
        let waits = kestra_retry_waits(&task["retry"]);
        assert!(waits.len() >= 2, "{name}: at least two retries: {waits:?}");
        assert!(lease > engines::ELECTION_SECONDS);
        for wait in &waits {
            assert!(
                *wait >= lease,
                "{name}: a retry after {wait} s comes before the {lease} s lease has expired: {waits:?}"
            );
        }

        // Every documented exit code, with a stand-in handoff: only 3, 10 and 12 are retried; any
        // other failure fails the execution at once, its outputs kept for the errors branch.
        let capture = Capture {
            task,
            inputs: input_defaults(&flow),
            value: None,
        };
        let workdir = tempfile::tempdir().unwrap();
        for &code in &codes {
            let dir = stand_ins
                .path()
                .join(format!("{}-{code}", path.parent().unwrap().display()).replace('/', "_"));
            let calls = engines::fake_handoff(&dir, code);
            let (exit, kestra) = capture.run_with(
                "mongodb://unused",
                workdir.path(),
                &engines::path_with(&dir),
            );
            assert_eq!(engines::count_calls(&calls), 1, "{name}: exit code {code}");
            let expected = match code {
                0 => Next::Continue,
                c if engines::retryable(c) => Next::Retry,
                _ => Next::FailExecution,
            };
            assert_eq!(
                next_after(&flow, exit, &kestra.vars),
                expected,
                "{name}: exit code {code}: task exit {exit}, {:?}",
                kestra.vars
            );
            if expected == Next::Retry {
                assert_eq!(exit, code, "{name}: the task fails with handoff's code");
            }
            if expected == Next::FailExecution {
                assert_eq!(kestra.vars["exit_code"], code, "{name}: {:?}", kestra.vars);
                assert_eq!(kestra.vars["status"], "FAILED", "{name}");
            }
        }

        // Killing the task: SIGTERM reaches handoff once, and it stops after its in-flight commit
        // with its outputs, before anything kills it. The Docker runner stops the container (with
        // its killGracePeriod; without one it kills it at once): docker stop signals the
        // container's PID 1, the task's shell, only. The Process runner signals every process the
        // task started, then the shell.
        let docker = task["taskRunner"]["type"]
            .as_str()
            .unwrap()
            .ends_with("docker.Docker");
        let grace = if docker {
            let grace = task["taskRunner"]["killGracePeriod"]
                .as_str()
                .unwrap_or_else(|| {
                    panic!("{name}: no killGracePeriod: the container is killed at once")
                });
            let grace = iso8601_seconds(grace);
            assert!(grace >= 30, "{name}: {grace} s to finish a commit");
            Duration::from_secs(grace)
        } else {
            Duration::from_secs(30)
        };
        let live = Live::start();
        let uri = live.uri();
        let policy = workdir
            .path()
            .join(task["env"]["HANDOFF_POLICY"].as_str().unwrap());
        std::fs::create_dir_all(policy.parent().unwrap()).unwrap();
        let export = support::handoff()
            .args(["policy", "export-default"])
            .arg(&policy)
            .output()
            .unwrap();
        assert!(export.status.success());
        let mut inputs = input_defaults(&flow);
        inputs.insert("database".into(), live.db.clone());
        inputs.insert("max_wait_seconds".into(), "30".into());
        let capture = Capture {
            task,
            inputs,
            value: None,
        };
        let mut child = capture.spawn(
            &uri,
            workdir.path(),
            &engines::path_with(&engines::handoff_dir()),
        );
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut seen = engines::read_until(&mut stdout, "run starting").concat();
        let stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
        let sent = Instant::now();
        if !docker {
            for pid in children_of(child.id()) {
                engines::send_signal(pid, "TERM");
            }
        }
        engines::send_signal(child.id(), "TERM");
        seen.push_str(&std::io::read_to_string(stdout).unwrap());
        let status = child.wait().unwrap();
        let took = sent.elapsed();
        let kestra = kestra_parse(&seen, &stderr.join().unwrap());
        assert!(took < grace, "{name}: stopping took {took:?}");
        assert_eq!(
            kestra.vars["stopped"], true,
            "{name}: {status:?} {:?}",
            kestra.logs
        );
        assert_eq!(kestra.vars["status"], "IDLE", "{name}");
        if docker {
            assert_eq!(
                status.code(),
                Some(12),
                "{name}: the task ends with handoff's code"
            );
        }
    }
}
