//! Kestra as the flows' checks see it: Pebble's `{{ … }}` expressions the flows use, rendered
//! with the inputs, a `ForEach` iteration's value and the secret; a script task run as its Process
//! runner runs it; its output read as Kestra's task log line matcher reads it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::engines;

/// Every `{{ … }}` expression of a text.
pub fn expressions(text: &str) -> Vec<String> {
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

/// A minimal Pebble substitution: inputs (with overrides), a `ForEach` iteration's value and the
/// secret.
pub fn render(
    template: &str,
    inputs: &BTreeMap<String, String>,
    value: Option<&str>,
    uri: &str,
) -> String {
    let mut out = template.to_string();
    for expr in expressions(template) {
        let value = if let Some(name) = expr.strip_prefix("inputs.") {
            inputs
                .get(name)
                .unwrap_or_else(|| panic!("undeclared input {name}"))
                .clone()
        } else if let ("taskrun.value", Some(value)) = (expr.as_str(), value) {
            value.to_string()
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
pub fn expr_raw(template: &str, expr: &str) -> String {
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

/// What Kestra makes of a task's output: the merged outputs, the metrics and the log lines.
pub struct Kestra {
    pub vars: serde_json::Map<String, Value>,
    pub metrics: Vec<Value>,
    /// (level, message), in order.
    pub logs: Vec<(String, String)>,
}

/// Reads a task's output as Kestra's task log line matcher does: a line matching
/// `^::(\{.*})::$` is one JSON object whose `outputs` are merged, whose `metrics` are recorded
/// and whose `logs` are logged at their `level` (one of slf4j's level names); any other line is
/// logged as it is, at INFO from stdout and at ERROR from stderr.
pub fn kestra_parse(stdout: &str, stderr: &str) -> Kestra {
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

pub struct Capture<'a> {
    pub task: &'a Value,
    pub inputs: BTreeMap<String, String>,
    /// `{{ taskrun.value }}`: the value of the `ForEach` iteration the task runs in.
    pub value: Option<String>,
}

impl Capture<'_> {
    /// Starts the capture task as its runner would: a working directory with the namespace files,
    /// `handoff` found on `path`, the rendered env, the commands as one script `sh -c "set -e
    /// …"` (the script tasks' `failFast`), stdout and stderr piped.
    pub fn spawn(&self, uri: &str, workdir: &Path, path: &str) -> Child {
        let env = self.task["env"].as_object().expect("capture task env");
        let commands: Vec<String> = self.task["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .map(|c| {
                render(
                    c.as_str().unwrap(),
                    &self.inputs,
                    self.value.as_deref(),
                    uri,
                )
            })
            .collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("set -e\n{}", commands.join("\n")))
            .current_dir(workdir);
        cmd.env_clear()
            .env("PATH", path)
            .env("HANDOFF_CACHE_DIR", super::cache_dir());
        for (key, value) in env {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            cmd.env(
                key,
                render(&value, &self.inputs, self.value.as_deref(), uri),
            );
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Runs the capture task (see [`Capture::spawn`]) with the `handoff` under test. Returns the
    /// exit code and what Kestra makes of stdout and stderr.
    pub fn run(&self, uri: &str, workdir: &Path) -> (i32, Kestra) {
        self.run_with(uri, workdir, &engines::path_with(&engines::handoff_dir()))
    }

    pub fn run_with(&self, uri: &str, workdir: &Path, path: &str) -> (i32, Kestra) {
        let output = self.spawn(uri, workdir, path).wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        (
            output.status.code().unwrap_or(-1),
            kestra_parse(&stdout, &stderr),
        )
    }
}

/// The values of a `ForEach` task, from the form the flows use: `{{ range(A, inputs.NAME - 1) }}`
/// (Pebble's `range` includes both ends) or a JSON array.
pub fn for_each_values(values: &str, inputs: &BTreeMap<String, String>) -> Vec<String> {
    if let Ok(Value::Array(list)) = serde_json::from_str::<Value>(values) {
        return list
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .collect();
    }
    let found = expressions(values);
    let [expr] = found.as_slice() else {
        panic!("a ForEach's values this check cannot evaluate: {values}");
    };
    let args = expr
        .strip_prefix("range(")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("a ForEach's values this check cannot evaluate: {values}"));
    let bound = |arg: &str| -> i64 {
        let arg = arg.trim();
        let (name, minus) = match arg.split_once('-') {
            Some((name, n)) => (name.trim(), n.trim().parse::<i64>().expect("a number")),
            None => (arg, 0),
        };
        let value = match name.strip_prefix("inputs.") {
            Some(input) => inputs[input].parse::<i64>().expect("an INT input"),
            None => name.parse().expect("a number"),
        };
        value - minus
    };
    let (from, to) = args.split_once(',').expect("range(from, to)");
    (bound(from)..=bound(to)).map(|i| i.to_string()).collect()
}
