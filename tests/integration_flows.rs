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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use bson::doc;
use serde_json::Value;
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

/// Folders of `flows/` holding other engines' examples (checked by the `integration_engine_*` suites).
const OTHER_ENGINES: &[&str] = &["airflow", "argo", "github-actions"];

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

/// Every `{{ … }}` expression of a text.
fn expressions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let Some(end) = rest[start..].find("}}") else {
            break;
        };
        out.push(rest[start + 2..start + end].trim().to_string());
        rest = &rest[start + end + 2..];
    }
    out
}

/// A minimal Pebble substitution: inputs (with overrides) and the secret.
fn render(template: &str, inputs: &BTreeMap<String, String>, uri: &str) -> String {
    let mut out = template.to_string();
    for expr in expressions(template) {
        let value = if let Some(name) = expr.strip_prefix("inputs.") {
            inputs
                .get(name)
                .unwrap_or_else(|| panic!("undeclared input {name}"))
                .clone()
        } else if expr == "secret('MONGODB_URI')" {
            uri.to_string()
        } else {
            panic!("the capture task uses an expression this check cannot render: {expr}");
        };
        out = out.replace(&format!("{{{{{}}}}}", expr_raw(template, &expr)), &value);
    }
    out
}

/// The exact text between the braces of the first occurrence of `expr` (spacing preserved).
fn expr_raw(template: &str, expr: &str) -> String {
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..].find("}}").unwrap();
        let raw = &rest[start + 2..start + end];
        if raw.trim() == expr {
            return raw.to_string();
        }
        rest = &rest[start + end + 2..];
    }
    unreachable!()
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

/// What Kestra makes of a task's output: the merged outputs, the metrics and the log lines.
struct Kestra {
    vars: serde_json::Map<String, Value>,
    metrics: Vec<Value>,
    /// (level, message), in order.
    logs: Vec<(String, String)>,
}

/// Reads a task's output as Kestra's task log line matcher does: a line matching
/// `^::(\{.*})::$` is one JSON object whose `outputs` are merged, whose `metrics` are recorded
/// and whose `logs` are logged at their `level` (one of slf4j's level names); any other line is
/// logged as it is, at INFO from stdout and at ERROR from stderr.
fn kestra_parse(stdout: &str, stderr: &str) -> Kestra {
    let mut parsed = Kestra {
        vars: serde_json::Map::new(),
        metrics: Vec::new(),
        logs: Vec::new(),
    };
    for line in stdout.lines() {
        let Some(inner) = line
            .strip_prefix("::")
            .and_then(|l| l.strip_suffix("::"))
            .filter(|inner| inner.starts_with('{') && inner.ends_with('}'))
        else {
            parsed.logs.push(("INFO".into(), line.to_string()));
            continue;
        };
        let value: Value = serde_json::from_str(inner).expect("a task protocol line is JSON");
        if let Some(Value::Object(outputs)) = value.get("outputs") {
            parsed.vars.extend(outputs.clone());
        }
        if let Some(Value::Array(m)) = value.get("metrics") {
            parsed.metrics.extend(m.clone());
        }
        if let Some(Value::Array(logs)) = value.get("logs") {
            for log in logs {
                let level = log["level"].as_str().expect("a log level");
                assert!(
                    ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
                    "not an slf4j level: {level}"
                );
                let message = log["message"].as_str().expect("a log message");
                parsed.logs.push((level.into(), message.into()));
            }
        }
    }
    for line in stderr.lines() {
        parsed.logs.push(("ERROR".into(), line.to_string()));
    }
    parsed
}

struct Capture<'a> {
    task: &'a Value,
    inputs: BTreeMap<String, String>,
}

impl Capture<'_> {
    /// Runs the capture task as its runner would: a working directory with the namespace files,
    /// `handoff` on the PATH, the rendered env, each command through `sh -c`. Returns the exit
    /// code and what Kestra makes of stdout and stderr.
    fn run(&self, uri: &str, workdir: &Path) -> (i32, Kestra) {
        let env = self.task["env"].as_object().expect("capture task env");
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_handoff")).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for command in self.task["commands"].as_array().expect("commands") {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(render(command.as_str().unwrap(), &self.inputs, uri))
                .current_dir(workdir);
            cmd.env_clear()
                .env("PATH", &path)
                .env("HANDOFF_CACHE_DIR", support::cache_dir());
            for (key, value) in env {
                let value = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                cmd.env(key, render(&value, &self.inputs, uri));
            }
            let output = cmd.output().unwrap();
            stdout.push_str(&String::from_utf8_lossy(&output.stdout));
            stderr.push_str(&String::from_utf8_lossy(&output.stderr));
            if !output.status.success() {
                let code = output.status.code().unwrap_or(-1);
                return (code, kestra_parse(&stdout, &stderr));
            }
        }
        (0, kestra_parse(&stdout, &stderr))
    }
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
                .any(|c| c.as_str().unwrap().starts_with("handoff run"))
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
        };
        let check = |expected_status: &str, expected_events: Option<u64>| {
            let (code, kestra) = capture.run(&uri, workdir.path());
            assert_eq!(code, 0, "{name}: {:?}", kestra.logs);
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

        // A failing run exits non-zero, so the flow's retry and errors branch fire, and leaves
        // outputs Kestra keeps for the failed task: what the errors branch reads.
        let failure_vars = capture_vars_read(&flow["errors"]);
        assert!(
            failure_vars.contains("error_class") && failure_vars.contains("guidance"),
            "{name}: the errors branch reads the failure's class and guidance: {failure_vars:?}"
        );
        let mut bad = Capture { task, inputs };
        bad.inputs.insert("max_events".into(), "0".into());
        let (code, kestra) = bad.run(&uri, workdir.path());
        assert_eq!(code, 2, "{name}");
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
        assert_eq!(code, 2, "{name}: a missing policy file must fail the task");
        assert_eq!(kestra.vars["error_class"], "bad_input", "{name}");
    }
}
