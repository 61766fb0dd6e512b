//! The Argo Workflows example (`flows/argo`), read as Argo reads it (see `support::engines`).

use crate::support;
use crate::support::engines::*;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use support::live::Live;

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
    let reads = support::variables_handoff_reads();
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
