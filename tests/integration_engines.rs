//! The Airflow, Argo Workflows and GitHub Actions examples in `flows/`, each read the way its
//! engine reads it.
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
//! the task raises, with a stand-in `handoff`).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bson::doc;
use serde_json::{Value, json};
use support::live::Live;

/// The exit codes every example retries: conflict (3), unavailable (10) and a stop by a signal
/// after the last commit (12). Every other failure is permanent.
const RETRYABLE: [i32; 3] = [3, 10, 12];

/// The inputs every example exposes, with the Kestra flow's defaults.
const INPUT_DEFAULTS: [(&str, &str); 5] = [
    ("database", "change_demo"),
    ("collection", "orders"),
    ("consumer_id", "orders-to-outbox"),
    ("max_events", "50"),
    ("max_wait_seconds", "10"),
];

fn retryable(code: i32) -> bool {
    RETRYABLE.contains(&code)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load_yaml(relative: &str) -> (String, Value) {
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
fn documented_exit_codes() -> Vec<i32> {
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
    codes
}

/// The environment variables `handoff` reads, from its own help.
fn variables_handoff_reads() -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    for args in [&["run", "--help"][..], &["--help"][..]] {
        let help = support::handoff().args(args).output().unwrap();
        for part in String::from_utf8_lossy(&help.stdout).split("env: ").skip(1) {
            vars.insert(
                part.chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect(),
            );
        }
    }
    assert!(vars.contains("MONGODB_URI") && vars.contains("MAX_EVENTS"));
    vars
}

/// `dir` first on the PATH, then the test's own PATH (sh, bash, jq, python3…).
fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The folder of the `handoff` binary under test.
fn handoff_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_handoff"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A stand-in `handoff` in `dir`: it counts its runs in `dir/calls`, writes outputs shaped like the
/// real ones for `code` to its `--outputs-file` (none after a second signal, as the real one) and
/// exits with `code`.
fn fake_handoff(dir: &Path, code: i32) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let calls = dir.join("calls");
    let committed = json!({
        "events_handed_off": 0, "last_event_id": "", "consumer_id": "orders-to-outbox",
        "events_skipped": 0, "events_quarantined": 0, "policy_sha256": "0".repeat(64),
    });
    let mut outputs = committed.as_object().unwrap().clone();
    match code {
        0 => {
            outputs.insert("status".into(), json!("IDLE"));
        }
        12 => {
            outputs.insert("status".into(), json!("IDLE"));
            outputs.insert("stopped".into(), json!(true));
        }
        _ => {
            outputs.insert("status".into(), json!("FAILED"));
            outputs.insert("error_class".into(), json!("stand_in"));
            outputs.insert("exit_code".into(), json!(code));
            outputs.insert("guidance".into(), json!("a stand-in failure"));
        }
    }
    let write = if code == 130 || code == 143 {
        String::new()
    } else {
        format!(
            "printf '%s\\n' {} > \"$out\"",
            shell_quote(&Value::Object(outputs).to_string())
        )
    };
    let script = format!(
        "#!/bin/sh\necho run >> {calls}\nout=\nprev=\nfor arg in \"$@\"; do\n  if [ \"$prev\" = --outputs-file ]; then out=\"$arg\"; fi\n  prev=\"$arg\"\ndone\n{write}\nexit {code}\n",
        calls = shell_quote(&calls.display().to_string()),
    );
    let bin = dir.join("handoff");
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    calls
}

fn count_calls(calls: &Path) -> usize {
    std::fs::read_to_string(calls)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

fn insert_two_orders(live: &Live) {
    live.wait(
        live.coll("orders")
            .insert_many(vec![doc! {"a": 1}, doc! {"a": 2}]),
    )
    .expect("insert");
}

/// Checks the outputs of a successful run as every engine sees them (strings or JSON values).
fn check_success(outputs: &BTreeMap<String, String>, status: &str, events: usize, what: &str) {
    assert_eq!(outputs["status"], status, "{what}: {outputs:?}");
    assert_eq!(outputs["events_handed_off"], events.to_string(), "{what}");
    assert_eq!(outputs["consumer_id"], "orders-to-outbox", "{what}");
    assert_eq!(outputs["events_skipped"], "0", "{what}");
    assert_eq!(outputs["policy_sha256"].len(), 64, "{what}: {outputs:?}");
    assert_eq!(outputs["last_event_id"].is_empty(), events == 0, "{what}");
}

/// A JSON object's values as the strings a YAML engine hands on (strings as they are).
fn as_strings(object: &Value) -> BTreeMap<String, String> {
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

// --- Argo Workflows ---------------------------------------------------------------------------

/// The container of the retried template, run as the pod would run it.
struct ArgoPod<'a> {
    container: &'a Value,
    /// The declared `valueFrom.path` of the outputs parameter and its `default`.
    outputs_path: String,
    outputs_default: Option<String>,
}

impl ArgoPod<'_> {
    /// Runs the container's command (through `sh -c`) with its env, `{{workflow.parameters.x}}`
    /// rendered from `parameters` and the Secret's key as the URI, in a folder standing for the
    /// container's filesystem. Returns the exit code, the outputs parameter as Argo's executor
    /// saves it (the file, else the default) and what the container printed.
    fn run(&self, parameters: &BTreeMap<String, String>, uri: &str) -> (i32, String, String) {
        let fs = tempfile::tempdir().unwrap();
        let in_fs = |path: &str| fs.path().join(path.trim_start_matches('/'));
        let outputs_file = in_fs(&self.outputs_path);
        std::fs::create_dir_all(outputs_file.parent().unwrap()).unwrap();
        let mut argv: Vec<String> = Vec::new();
        for part in ["command", "args"] {
            for word in self.container[part].as_array().into_iter().flatten() {
                let word = argo_render(word.as_str().unwrap(), parameters);
                // Paths the template names are paths in the container's filesystem.
                argv.push(if word == self.outputs_path {
                    outputs_file.display().to_string()
                } else {
                    word
                });
            }
        }
        let script: Vec<String> = argv.iter().map(|w| shell_quote(w)).collect();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script.join(" "))
            .env_clear()
            .env("PATH", path_with(&handoff_dir()))
            .env("HANDOFF_CACHE_DIR", support::cache_dir());
        for var in self.container["env"].as_array().unwrap() {
            let name = var["name"].as_str().unwrap();
            let value = if let Some(value) = var["value"].as_str() {
                argo_render(value, parameters)
            } else {
                assert!(
                    var["valueFrom"]["secretKeyRef"]["key"].is_string(),
                    "{name}: a value or a Secret's key"
                );
                uri.to_string()
            };
            command.env(name, value);
        }
        let output = command.output().unwrap();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let parameter = match std::fs::read_to_string(&outputs_file) {
            // Argo's executor trims one trailing newline off a parameter file.
            Ok(text) => text.strip_suffix('\n').unwrap_or(&text).to_string(),
            Err(_) => self
                .outputs_default
                .clone()
                .expect("no outputs file and no default"),
        };
        (output.status.code().unwrap_or(-1), parameter, printed)
    }
}

/// Argo's simple tags `{{workflow.parameters.NAME}}`; any other tag fails the check.
fn argo_render(text: &str, parameters: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..].find("}}").expect("a closed tag") + start;
        let tag = &rest[start + 2..end];
        let name = tag
            .strip_prefix("workflow.parameters.")
            .unwrap_or_else(|| panic!("a tag this check cannot render: {tag}"));
        out.push_str(&rest[..start]);
        out.push_str(
            parameters
                .get(name)
                .unwrap_or_else(|| panic!("undeclared parameter {name}")),
        );
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A step- or DAG-level output Argo computes from `valueFrom`: `parameter:
/// "{{steps.STEP.outputs.parameters.P}}"` (the value as it is), or `expression:
/// "jsonpath(steps.STEP.outputs.parameters.P, '$.KEY')"` — Argo's `jsonpath` function: the JSON
/// value at the path, stored with Go's `%v` (a JSON number from the file prints as its integer).
/// A missing key is an error in Argo too.
fn argo_output(value_from: &Value, step: &str, param: &str, value: &str) -> String {
    let reference = format!("steps.{step}.outputs.parameters.{param}");
    if let Some(parameter) = value_from["parameter"].as_str() {
        assert_eq!(parameter, format!("{{{{{reference}}}}}"));
        return value.to_string();
    }
    let expression = value_from["expression"]
        .as_str()
        .expect("valueFrom.parameter or valueFrom.expression");
    let inner = expression
        .trim()
        .strip_prefix("jsonpath(")
        .and_then(|e| e.strip_suffix(')'))
        .unwrap_or_else(|| panic!("an expression this check cannot evaluate: {expression}"));
    let (argument, path) = inner.split_once(',').unwrap();
    assert_eq!(argument.trim(), reference, "{expression}");
    let key = path
        .trim()
        .strip_prefix("'$.")
        .and_then(|p| p.strip_suffix('\''))
        .unwrap_or_else(|| panic!("a path this check cannot evaluate: {path}"));
    let json: Value = serde_json::from_str(value).expect("the outputs parameter is JSON");
    match json.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        other => panic!("jsonpath {key} on {value}: {other:?}"),
    }
}

/// Whether Argo retries an attempt of a template with this `retryStrategy` that exited with `code`.
/// A non-zero exit makes a Failed node; `retryPolicy` OnFailure or Always retries a Failed node
/// (OnError and OnTransientError do not); then `expression` must hold, with `lastRetry.exitCode`
/// the exit code as a string (Argo's retry scope). The expression is read as expr's
/// `lastRetry.exitCode in [...]` over string literals, the form the template uses; any other form
/// fails the check.
fn argo_retries(strategy: &Value, code: i32) -> bool {
    if code == 0 {
        return false;
    }
    let policy = strategy["retryPolicy"].as_str().unwrap_or("OnFailure");
    if !matches!(policy, "OnFailure" | "Always") {
        return false;
    }
    let Some(expression) = strategy["expression"].as_str() else {
        return true;
    };
    let list = expression
        .trim()
        .strip_prefix("lastRetry.exitCode in [")
        .and_then(|e| e.strip_suffix(']'))
        .unwrap_or_else(|| panic!("an expression this check cannot evaluate: {expression}"));
    let accepted: Vec<String> = list
        .split(',')
        .map(|item| {
            let item = item.trim();
            item.strip_prefix('\'')
                .and_then(|i| i.strip_suffix('\''))
                .or_else(|| item.strip_prefix('"').and_then(|i| i.strip_suffix('"')))
                .unwrap_or_else(|| panic!("not a string literal: {item} (exitCode is a string)"))
                .to_string()
        })
        .collect();
    accepted.contains(&code.to_string())
}

#[test]
fn argo_workflow_template_hands_off_and_retries_only_what_a_later_attempt_can_fix() {
    let (text, template) = load_yaml("argo/handoff-workflowtemplate.yaml");
    assert_eq!(template["apiVersion"], "argoproj.io/v1alpha1");
    assert_eq!(template["kind"], "WorkflowTemplate");
    let spec = &template["spec"];
    let templates = spec["templates"].as_array().expect("templates");
    let named = |name: &str| {
        templates
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no template {name}"))
    };
    let main = named(spec["entrypoint"].as_str().expect("an entrypoint"));
    let steps = main["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "one step group");
    let step = &steps[0][0];
    let step_name = step["name"].as_str().unwrap();
    let run = named(step["template"].as_str().unwrap());
    let container = &run["container"];

    // The parameters, each with a default; every tag names one of them.
    let mut parameters = BTreeMap::new();
    for parameter in spec["arguments"]["parameters"].as_array().unwrap() {
        parameters.insert(
            parameter["name"].as_str().unwrap().to_string(),
            parameter["value"].as_str().expect("a default").to_string(),
        );
    }
    for (name, default) in INPUT_DEFAULTS {
        assert_eq!(parameters[name], default);
    }
    argo_render(&text.replace("{{steps.", "<steps."), &parameters);

    // The command: `handoff run --outputs-file PATH`, PATH being the outputs parameter's file.
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(command[..3], ["handoff", "run", "--outputs-file"]);
    let file_parameters = run["outputs"]["parameters"].as_array().unwrap();
    assert_eq!(file_parameters.len(), 1);
    let file_parameter = &file_parameters[0];
    let file_param_name = file_parameter["name"].as_str().unwrap();
    let outputs_path = file_parameter["valueFrom"]["path"].as_str().unwrap();
    assert_eq!(command[3], outputs_path);
    let pod = ArgoPod {
        container,
        outputs_path: outputs_path.to_string(),
        outputs_default: file_parameter["valueFrom"]["default"]
            .as_str()
            .map(str::to_string),
    };

    // The URI comes from a Secret, never from a value; every variable is one handoff reads.
    let reads = variables_handoff_reads();
    let env = container["env"].as_array().unwrap();
    for var in env {
        let name = var["name"].as_str().unwrap();
        assert!(reads.contains(name), "handoff does not read {name}");
    }
    let uri_var = env.iter().find(|v| v["name"] == "MONGODB_URI").unwrap();
    assert!(uri_var["value"].is_null());
    assert!(uri_var["valueFrom"]["secretKeyRef"]["name"].is_string());

    // The retry strategy: a limit, a backoff, and only the retryable codes retried.
    let strategy = &run["retryStrategy"];
    let limit: u32 = strategy["limit"]
        .as_str()
        .map(|l| l.parse().unwrap())
        .or(strategy["limit"].as_u64().map(|l| l as u32))
        .expect("a limit");
    assert!(limit >= 1);
    assert!(strategy["backoff"]["duration"].is_string());
    for code in documented_exit_codes() {
        assert_eq!(
            argo_retries(strategy, code),
            retryable(code),
            "exit code {code}"
        );
    }

    // The workflow's outputs: every field of a successful run, read from the parameter.
    let outputs = main["outputs"]["parameters"].as_array().unwrap();
    let read = |parameter: &str| -> BTreeMap<String, String> {
        outputs
            .iter()
            .map(|o| {
                (
                    o["name"].as_str().unwrap().to_string(),
                    argo_output(&o["valueFrom"], step_name, file_param_name, parameter),
                )
            })
            .collect()
    };

    let live = Live::start();
    let uri = live.uri();
    let mut inputs = parameters.clone();
    inputs.insert("database".into(), live.db.clone());
    inputs.insert("max_wait_seconds".into(), "1".into());
    let (code, parameter, printed) = pod.run(&inputs, &uri);
    assert_eq!(code, 0, "{printed}");
    assert!(!printed.contains(&uri), "the URI was printed: {printed}");
    let fields = read(&parameter);
    check_success(&fields, "IDLE", 0, "argo");
    assert_eq!(
        serde_json::from_str::<Value>(&fields["outputs"]).unwrap(),
        serde_json::from_str::<Value>(&parameter).unwrap()
    );
    insert_two_orders(&live);
    let (code, parameter, printed) = pod.run(&inputs, &uri);
    assert_eq!(code, 0, "{printed}");
    check_success(&read(&parameter), "HANDED_OFF", 2, "argo");
    assert_eq!(live.outbox_len(), 2);

    // A failing attempt: not retried, and its node keeps the failure's outputs.
    inputs.insert("max_events".into(), "0".into());
    let (code, parameter, printed) = pod.run(&inputs, &uri);
    assert_eq!(code, 2, "{printed}");
    assert!(!argo_retries(strategy, code));
    let failed = as_strings(&serde_json::from_str::<Value>(&parameter).unwrap());
    assert_eq!(failed["status"], "FAILED");
    assert_eq!(failed["error_class"], "bad_input");
    assert_eq!(failed["exit_code"], "2");
    assert!(failed["guidance"].contains("max_events"), "{failed:?}");
}

// --- GitHub Actions ---------------------------------------------------------------------------

/// `$GITHUB_OUTPUT` read as the runner reads it (actions/runner, `FileCommandManager`): lines split
/// on LF; an empty line is skipped; `NAME=VALUE` when `=` comes before any `<<`; else
/// `NAME<<DELIMITER`, then the value's lines up to a line that is exactly the delimiter (the
/// newline before it is not part of the value); anything else fails the step. A later value of a
/// name replaces the earlier.
fn parse_github_output(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut outputs = BTreeMap::new();
    let mut lines = text.split_inclusive('\n');
    while let Some(raw) = lines.next() {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        if line.is_empty() {
            continue;
        }
        let equals = line.find('=');
        let heredoc = line.find("<<");
        match (equals, heredoc) {
            (Some(e), h) if h.is_none_or(|h| e < h) => {
                outputs.insert(line[..e].to_string(), line[e + 1..].to_string());
            }
            (_, Some(h)) => {
                let (name, delimiter) = (&line[..h], &line[h + 2..]);
                if name.is_empty() || delimiter.is_empty() {
                    return Err(format!(
                        "Invalid format '{line}'. Name must not be empty and delimiter must not be empty"
                    ));
                }
                let mut value = String::new();
                loop {
                    let Some(raw) = lines.next() else {
                        return Err(format!(
                            "Invalid value. Matching delimiter not found '{delimiter}'"
                        ));
                    };
                    if raw.strip_suffix('\n').unwrap_or(raw) == delimiter {
                        break;
                    }
                    if !raw.ends_with('\n') {
                        return Err("Invalid value. EOF marker missing new line.".into());
                    }
                    value.push_str(raw);
                }
                value.pop(); // the newline before the delimiter
                outputs.insert(name.to_string(), value);
            }
            _ => return Err(format!("Invalid format '{line}'")),
        }
    }
    Ok(outputs)
}

/// An env value of the workflow: a literal, `${{ secrets.MONGODB_URI }}`, `${{ inputs.NAME ||
/// 'DEFAULT' }}` (DEFAULT must be the input's own default: a scheduled run has no inputs) or
/// `${{ steps.ID.outputs.NAME }}` (empty when the step set no such output, as on GitHub).
fn github_render(
    value: &str,
    dispatch_inputs: &Value,
    inputs: &BTreeMap<String, String>,
    step_outputs: &BTreeMap<String, String>,
    uri: &str,
) -> String {
    let Some(expression) = value
        .trim()
        .strip_prefix("${{")
        .and_then(|v| v.strip_suffix("}}"))
    else {
        assert!(!value.contains("${{"), "{value}");
        return value.to_string();
    };
    let expression = expression.trim();
    if expression == "secrets.MONGODB_URI" {
        return uri.to_string();
    }
    if let Some(output) = expression.strip_prefix("steps.handoff.outputs.") {
        return step_outputs.get(output).cloned().unwrap_or_default();
    }
    let (input, default) = expression
        .strip_prefix("inputs.")
        .and_then(|e| e.split_once("||"))
        .unwrap_or_else(|| panic!("an expression this check cannot render: {expression}"));
    let (input, default) = (input.trim(), default.trim().trim_matches('\''));
    assert_eq!(
        dispatch_inputs[input]["default"].as_str(),
        Some(default),
        "a scheduled run's {input} must be the dispatch input's default"
    );
    inputs
        .get(input)
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// A step's `run` script run as the runner runs `shell: bash` (`bash --noprofile --norc -eo
/// pipefail FILE`), with its env, `$GITHUB_OUTPUT`, `$GITHUB_STEP_SUMMARY` and `$RUNNER_TEMP`.
/// Returns the exit code, what it printed and the outputs it set.
fn run_github_step(
    step: &Value,
    env: &BTreeMap<String, String>,
    path: &str,
) -> (i32, String, BTreeMap<String, String>) {
    assert_eq!(step["shell"], "bash");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.sh");
    std::fs::write(&script, step["run"].as_str().expect("a run script")).unwrap();
    let temp = dir.path().join("temp");
    std::fs::create_dir(&temp).unwrap();
    let output_file = dir.path().join("output");
    std::fs::write(&output_file, "").unwrap();
    let output = Command::new("bash")
        .args(["--noprofile", "--norc", "-eo", "pipefail"])
        .arg(&script)
        .env_clear()
        .envs(env)
        .env("PATH", path)
        .env("HANDOFF_CACHE_DIR", support::cache_dir())
        .env("RUNNER_TEMP", &temp)
        .env("GITHUB_OUTPUT", &output_file)
        .env("GITHUB_STEP_SUMMARY", dir.path().join("summary"))
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let outputs = parse_github_output(&std::fs::read_to_string(&output_file).unwrap())
        .unwrap_or_else(|e| panic!("the runner would fail the step: {e}\n{printed}"));
    (output.status.code().unwrap_or(-1), printed, outputs)
}

#[test]
fn github_actions_workflow_hands_off_and_retries_only_what_a_later_attempt_can_fix() {
    let (_, workflow) = load_yaml("github-actions/handoff.yml");
    let on = &workflow["on"];
    assert!(on["schedule"][0]["cron"].is_string(), "{on}");
    let dispatch_inputs = &on["workflow_dispatch"]["inputs"];
    for (name, default) in INPUT_DEFAULTS {
        assert_eq!(dispatch_inputs[name]["default"], default, "{name}");
    }
    assert_eq!(workflow["concurrency"]["cancel-in-progress"], false);
    let jobs = workflow["jobs"].as_object().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = jobs.values().next().unwrap();
    let steps = job["steps"].as_array().unwrap();
    let handoff_step = steps
        .iter()
        .find(|s| s["id"] == "handoff")
        .expect("the step with id handoff");
    let script = handoff_step["run"].as_str().unwrap();
    assert!(
        script.contains("handoff run --outputs-file"),
        "the step runs handoff with an outputs file"
    );
    // Expressions in a script are pasted in as text; values come in through the env only.
    assert!(!script.contains("${{"), "{script}");
    let step_env = handoff_step["env"].as_object().unwrap();
    assert_eq!(step_env["MONGODB_URI"], "${{ secrets.MONGODB_URI }}");
    let reads = variables_handoff_reads();
    for name in step_env.keys() {
        assert!(
            reads.contains(name) || script.contains(&format!("${name}")),
            "{name} is read neither by handoff nor by the step"
        );
    }
    // A later step reads the outputs, after a failure too.
    let report = steps
        .iter()
        .find(|s| {
            serde_json::to_string(&s["env"])
                .unwrap()
                .contains("steps.handoff.outputs.status")
        })
        .expect("a step reading steps.handoff.outputs.status");
    assert!(report["if"].as_str().unwrap().contains("always()"));

    let uri_free = |printed: &str, uri: &str| {
        assert!(!printed.contains(uri), "the URI was printed: {printed}");
    };
    let env_of = |step: &Value,
                  inputs: &BTreeMap<String, String>,
                  outputs: &BTreeMap<String, String>,
                  uri: &str| {
        step["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (
                    k.clone(),
                    github_render(&value, dispatch_inputs, inputs, outputs, uri),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };

    // Runs against the replica set, the inputs as a dispatch gives them.
    let live = Live::start();
    let uri = live.uri();
    let path = path_with(&handoff_dir());
    let mut inputs = BTreeMap::from([
        ("database".to_string(), live.db.clone()),
        ("max_wait_seconds".to_string(), "1".to_string()),
    ]);
    let no_outputs = BTreeMap::new();
    let run = |inputs: &BTreeMap<String, String>| {
        let env = env_of(handoff_step, inputs, &no_outputs, &uri);
        let (code, printed, outputs) = run_github_step(handoff_step, &env, &path);
        uri_free(&printed, &uri);
        let (report_code, report_printed, _) =
            run_github_step(report, &env_of(report, inputs, &outputs, &uri), &path);
        assert_eq!(report_code, 0, "{report_printed}");
        (code, printed, outputs, report_printed)
    };
    let (code, printed, outputs, report_printed) = run(&inputs);
    assert_eq!(code, 0, "{printed}");
    check_success(&outputs, "IDLE", 0, "github");
    assert_eq!(outputs["exit_code"], "0");
    assert_eq!(outputs["attempts"], "1");
    assert!(report_printed.contains("status IDLE"), "{report_printed}");
    let whole: Value = serde_json::from_str(&outputs["outputs"]).unwrap();
    assert_eq!(whole["status"], "IDLE");
    insert_two_orders(&live);
    let (code, printed, outputs, _) = run(&inputs);
    assert_eq!(code, 0, "{printed}");
    check_success(&outputs, "HANDED_OFF", 2, "github");
    assert_eq!(live.outbox_len(), 2);

    // A failing run: one attempt, the step fails, its outputs say why (a multi-line-safe value).
    inputs.insert("max_events".into(), "0".into());
    let (code, printed, outputs, report_printed) = run(&inputs);
    assert_eq!(code, 2, "{printed}");
    assert_eq!(outputs["status"], "FAILED");
    assert_eq!(outputs["error_class"], "bad_input");
    assert_eq!(outputs["exit_code"], "2");
    assert_eq!(outputs["attempts"], "1");
    assert!(outputs["guidance"].contains("max_events"), "{outputs:?}");
    assert!(
        report_printed.contains("::error::handoff failed: bad_input (exit 2, 1 attempt(s))"),
        "{report_printed}"
    );

    // The retry loop, with a stand-in handoff for every documented exit code.
    let max_attempts: usize = step_env["HANDOFF_MAX_ATTEMPTS"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(max_attempts >= 2);
    let stand_ins = tempfile::tempdir().unwrap();
    for code in documented_exit_codes() {
        let dir = stand_ins.path().join(code.to_string());
        let calls = fake_handoff(&dir, code);
        let mut env = env_of(
            handoff_step,
            &BTreeMap::new(),
            &no_outputs,
            "mongodb://unused",
        );
        env.insert("HANDOFF_RETRY_DELAY_SECONDS".into(), "0".into());
        let (exit, printed, outputs) = run_github_step(handoff_step, &env, &path_with(&dir));
        let expected = if retryable(code) { max_attempts } else { 1 };
        assert_eq!(count_calls(&calls), expected, "exit code {code}: {printed}");
        assert_eq!(exit, code, "the step fails with handoff's code: {printed}");
        assert_eq!(outputs["exit_code"], code.to_string());
        assert_eq!(outputs["attempts"], expected.to_string());
        let status = if code == 0 || code == 12 {
            "IDLE"
        } else {
            "FAILED"
        };
        assert_eq!(outputs["status"], status, "exit code {code}");
    }
}

// --- Airflow ----------------------------------------------------------------------------------

/// The Airflow names the DAG may import, and so the only names the stand-ins provide (Airflow 3:
/// the task SDK `airflow.sdk`; the exceptions in `airflow.sdk.exceptions` since 3.2, in
/// `airflow.exceptions` before). A misspelt or unknown name fails the import, as it would on a
/// worker.
const AIRFLOW_API: &str = r#"{
    "airflow.sdk": ["DAG", "Param", "Variable", "dag", "get_current_context", "task"],
    "airflow.sdk.exceptions": ["AirflowException", "AirflowFailException", "AirflowSkipException"],
    "airflow.exceptions": ["AirflowException", "AirflowFailException", "AirflowSkipException"]
}"#;

/// Loads a DAG file as an Airflow worker would, with stand-ins for the Airflow names it imports,
/// after reading it with `ast`: its Airflow imports, its constants, the one `@task` that runs
/// `HANDOFF_COMMAND` and that task's decorator arguments.
///
/// `inspect` reports what was read, what the DAG declared and the DAG's `retry_decision` for each
/// of the `codes` asked. `run` calls the task's function the
/// way Airflow runs a try (the DAG's params with overrides in `context["params"]`, a task instance
/// in `context["ti"]`, Variables from the request) and reports what Airflow would make of it: the
/// value returned (XCom `return_value`), the XComs pushed, the exception raised and the state —
/// success; failed for AirflowFailException (whatever retries are left); skipped for
/// AirflowSkipException; up_for_retry for any other exception while retries are left. After a
/// success the downstream task runs on the returned value.
const AIRFLOW_HARNESS: &str = r#"
import ast, collections.abc, importlib.util, json, os, sys, types, typing

path, mode, request = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
api = request["api"]
source = open(path, encoding="utf-8").read()
tree = ast.parse(source, path)

for node in ast.walk(tree):
    if isinstance(node, ast.Import):
        for alias in node.names:
            assert alias.name.split(".")[0] != "airflow", f"import {alias.name}: use from-imports"
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "airflow":
        for alias in node.names:
            assert alias.name in api.get(node.module, []), f"{node.module}.{alias.name} is not a known Airflow name"

constants = {}
for node in tree.body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        try:
            constants[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            pass

def decorator_arguments(function, name):
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id == name:
            return {}
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == name:
            return {k.arg: ast.unparse(k.value) for k in decorator.keywords}
    return None

runners = [
    f for f in ast.walk(tree)
    if isinstance(f, ast.FunctionDef) and decorator_arguments(f, "task") is not None
    and any(isinstance(n, ast.Name) and n.id == "HANDOFF_COMMAND" for n in ast.walk(f))
]
assert len(runners) == 1, "one @task runs HANDOFF_COMMAND"
runner = runners[0]

class AirflowException(Exception):
    pass

class AirflowFailException(AirflowException):
    pass

class AirflowSkipException(AirflowException):
    pass

declared = {"dags": [], "tasks": {}, "edges": []}

class XComArg:
    def __init__(self, task_id):
        self.task_id = task_id

def task(python_callable=None, **arguments):
    def wrap(function):
        declared["tasks"][function.__name__] = {"arguments": arguments, "function": function}
        def call(*args, **kwargs):
            upstream = [a.task_id for a in list(args) + list(kwargs.values()) if isinstance(a, XComArg)]
            declared["edges"].extend([u, function.__name__] for u in upstream)
            return XComArg(function.__name__)
        call.function = function
        return call
    return wrap(python_callable) if python_callable else wrap

def dag(dag_id=None, **arguments):
    def wrap(function):
        def build(*args, **kwargs):
            declared["dags"].append(dict(arguments, dag_id=dag_id or function.__name__))
            return function(*args, **kwargs)
        return build
    return wrap

class DAG:
    def __init__(self, *args, **kwargs):
        raise AssertionError("this check reads @dag-decorated DAGs")

class Param:
    def __init__(self, default=None, **schema):
        self.value = default
        self.schema = schema

class Variable:
    values = {}

    @staticmethod
    def get(key, default=None, deserialize_json=False):
        if key in Variable.values:
            return Variable.values[key]
        if default is not None:
            return default
        raise KeyError(f"Variable {key} does not exist")

context = {}

def get_current_context():
    return context

exceptions = {"AirflowException": AirflowException,
              "AirflowFailException": AirflowFailException,
              "AirflowSkipException": AirflowSkipException}
stand_ins = {
    "airflow": {},
    "airflow.sdk": {"DAG": DAG, "Param": Param, "Variable": Variable, "dag": dag,
                    "get_current_context": get_current_context, "task": task},
    "airflow.sdk.exceptions": exceptions,
    "airflow.exceptions": exceptions,
}
for name in ["airflow"] + sorted(api):
    assert name == "airflow" or sorted(stand_ins[name]) == sorted(api[name]), name
    module = types.ModuleType(name)
    module.__path__ = []
    module.__dict__.update(stand_ins[name])
    sys.modules[name] = module

spec = importlib.util.spec_from_file_location("handoff_dag_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert len(declared["dags"]) == 1, "the file declares one DAG"
the_dag = declared["dags"][0]
params = {k: (v.value if isinstance(v, Param) else v) for k, v in the_dag.get("params", {}).items()}

if mode == "inspect":
    result = {
        "constants": {k: v for k, v in constants.items() if isinstance(v, (list, dict, str, int))},
        "runner": runner.name,
        "runner_decorator": decorator_arguments(runner, "task"),
        "dag": {k: (v if isinstance(v, (str, int, bool, type(None))) else repr(v))
                for k, v in the_dag.items() if k != "params"},
        "params": params,
        "tasks": {name: {k: repr(v) for k, v in t["arguments"].items()} for name, t in declared["tasks"].items()},
        "retries": declared["tasks"][runner.name]["arguments"].get("retries", 0),
        "edges": declared["edges"],
        "decisions": {str(code): module.retry_decision(code) for code in request["codes"]},
    }
else:
    Variable.values = request["variables"]
    os.environ.clear()
    os.environ.update(request["environ"])
    params.update(request["params"])

    class TaskInstance:
        def __init__(self):
            self.xcom = {}

        def xcom_push(self, key, value):
            json.dumps(value)
            self.xcom[key] = value

    ti = TaskInstance()
    context.clear()
    context.update(params=params, ti=ti)
    retries = declared["tasks"][runner.name]["arguments"].get("retries", 0)
    result = {"returned": None, "raised": None, "message": None}
    try:
        result["returned"] = declared["tasks"][runner.name]["function"]()
        result["state"] = "success"
    except AirflowFailException as error:
        result.update(raised=type(error).__name__, message=str(error), state="failed")
    except AirflowSkipException as error:
        result.update(raised=type(error).__name__, message=str(error), state="skipped")
    except Exception as error:
        result.update(raised=type(error).__name__, message=str(error),
                      state="up_for_retry" if retries > 0 else "failed")
    if result["state"] == "success":
        # Airflow pushes the value returned as `return_value` and, when the task has multiple
        # outputs (asked for, or inferred from a Mapping return annotation), each key on its own.
        function = declared["tasks"][runner.name]["function"]
        multiple = declared["tasks"][runner.name]["arguments"].get("multiple_outputs")
        if multiple is None:
            hint = typing.get_type_hints(function).get("return") if "return" in function.__annotations__ else None
            origin = getattr(hint, "__origin__", hint)
            multiple = isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)
        ti.xcom_push("return_value", result["returned"])
        if multiple:
            for key, value in result["returned"].items():
                ti.xcom_push(key, value)
    result["xcom"] = ti.xcom
    if result["state"] == "success":
        for upstream, downstream in declared["edges"]:
            if upstream == runner.name:
                declared["tasks"][downstream]["function"](result["returned"])
with open(request["result"], "w", encoding="utf-8") as file:
    json.dump(result, file)
"#;

fn airflow(mode: &str, request: Value) -> (Value, String) {
    let dag = root().join("flows/airflow/handoff_dag.py");
    let dir = tempfile::tempdir().unwrap();
    let result_file = dir.path().join("result.json");
    let mut request = request;
    request["api"] = serde_json::from_str(AIRFLOW_API).unwrap();
    request["result"] = json!(result_file);
    let output = Command::new("python3")
        .arg("-c")
        .arg(AIRFLOW_HARNESS)
        .arg(&dag)
        .arg(mode)
        .arg(request.to_string())
        .output()
        .expect("python3");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the DAG did not load: {printed}");
    let result = std::fs::read_to_string(&result_file).expect("a result");
    (serde_json::from_str(&result).unwrap(), printed)
}

#[test]
fn airflow_dag_hands_off_and_retries_only_what_a_later_attempt_can_fix() {
    let codes = documented_exit_codes();
    let (dag, _) = airflow("inspect", json!({ "codes": codes }));
    let constants = &dag["constants"];
    assert_eq!(
        constants["HANDOFF_COMMAND"],
        json!(["handoff", "run", "--outputs-file"])
    );
    let declared_retryable: BTreeSet<i64> = constants["RETRYABLE_EXIT_CODES"]
        .as_object()
        .expect("RETRYABLE_EXIT_CODES")
        .keys()
        .map(|k| k.parse().unwrap())
        .collect();
    assert_eq!(
        declared_retryable,
        RETRYABLE.iter().map(|&c| i64::from(c)).collect()
    );
    let uri_variable = constants["URI_VARIABLE"].as_str().expect("URI_VARIABLE");
    // Airflow masks the value of a Variable whose name holds a sensitive word.
    assert!(uri_variable.contains("secret"), "{uri_variable}");
    assert!(dag["retries"].as_u64().unwrap() >= 1, "{dag}");
    assert!(dag["runner_decorator"]["retry_delay"].is_string(), "{dag}");
    assert_eq!(dag["dag"]["max_active_runs"], 1, "one run at a time");
    assert_eq!(dag["dag"]["catchup"], false);
    for (name, default) in [
        ("database", json!("change_demo")),
        ("collection", json!("orders")),
        ("consumer_id", json!("orders-to-outbox")),
        ("checkpoint_collection", json!("kestra_change_checkpoints")),
        ("outbox_collection", json!("kestra_change_outbox")),
        ("max_events", json!(50)),
        ("max_wait_seconds", json!(10)),
    ] {
        assert_eq!(dag["params"][name], default, "{name}");
    }
    // The DAG's own decision function, for every documented exit code.
    for code in &codes {
        let expected = match *code {
            0 => "success",
            c if retryable(c) => "retry",
            _ => "fail",
        };
        assert_eq!(
            dag["decisions"][code.to_string()],
            expected,
            "exit code {code}"
        );
    }
    let runner = dag["runner"].as_str().unwrap();
    assert!(
        dag["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e[0] == runner),
        "a downstream task reads the returned outputs: {dag}"
    );

    let live = Live::start();
    let uri = live.uri();
    let run = |params: Value, path: String| {
        let (result, printed) = airflow(
            "run",
            json!({
                "variables": {(uri_variable): uri},
                "environ": {
                    "PATH": path,
                    "HANDOFF_CACHE_DIR": support::cache_dir(),
                },
                "params": params,
            }),
        );
        assert!(!printed.contains(&uri), "the URI was printed: {printed}");
        (result, printed)
    };
    let params = json!({"database": live.db, "max_wait_seconds": 1});
    let success = |status: &str, events: usize| {
        let (result, printed) = run(params.clone(), path_with(&handoff_dir()));
        assert_eq!(result["state"], "success", "{result} {printed}");
        // Returned (XCom return_value, and each key on its own: a dict return annotation) and
        // pushed as XCom `outputs`: the same dict.
        assert_eq!(result["xcom"]["return_value"], result["returned"]);
        assert_eq!(result["xcom"]["outputs"], result["returned"]);
        assert_eq!(result["xcom"]["status"], status);
        check_success(&as_strings(&result["returned"]), status, events, "airflow");
    };
    success("IDLE", 0);
    insert_two_orders(&live);
    success("HANDED_OFF", 2);
    assert_eq!(live.outbox_len(), 2);

    // A failing run: failed at once (no retry), its outputs pushed to XCom.
    let mut bad = params.clone();
    bad["max_events"] = json!(0);
    let (result, printed) = run(bad, path_with(&handoff_dir()));
    assert_eq!(result["state"], "failed", "{result} {printed}");
    assert_eq!(result["raised"], "AirflowFailException");
    let outputs = &result["xcom"]["outputs"];
    assert_eq!(outputs["status"], "FAILED");
    assert_eq!(outputs["error_class"], "bad_input");
    assert_eq!(outputs["exit_code"], 2);
    assert!(
        result["message"].as_str().unwrap().contains("bad_input"),
        "{result}"
    );

    // Every documented exit code, with a stand-in handoff: the state Airflow gives the try.
    let stand_ins = tempfile::tempdir().unwrap();
    for &code in &codes {
        let dir = stand_ins.path().join(code.to_string());
        let calls = fake_handoff(&dir, code);
        let (result, printed) = run(params.clone(), path_with(&dir));
        let expected = match code {
            0 => "success",
            c if retryable(c) => "up_for_retry",
            _ => "failed",
        };
        assert_eq!(
            result["state"], expected,
            "exit code {code}: {result} {printed}"
        );
        assert_eq!(count_calls(&calls), 1);
        let outputs = &result["xcom"]["outputs"];
        let status = if code == 0 || code == 12 {
            "IDLE"
        } else {
            "FAILED"
        };
        assert_eq!(outputs["status"], status, "exit code {code}: {result}");
        if code != 0 && code != 12 {
            assert_eq!(outputs["exit_code"], code, "{result}");
        }
    }
}

#[test]
fn the_github_output_reader_follows_the_runner() {
    let parsed =
        parse_github_output("a=1\n\nb<<EOF\nline 1\nline 2\nEOF\nc=x=y\nd<<E\n\nE\n").unwrap();
    assert_eq!(parsed["a"], "1");
    assert_eq!(parsed["b"], "line 1\nline 2");
    assert_eq!(parsed["c"], "x=y");
    assert_eq!(parsed["d"], "");
    assert!(parse_github_output("b<<EOF\nno end\n").is_err());
    assert!(parse_github_output("no separator\n").is_err());
    assert!(parse_github_output("<<EOF\nx\nEOF\n").is_err());
}
