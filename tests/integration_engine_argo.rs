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

/// How an attempt of the retried template ended, as Argo's retry scope sees it: the node's phase
/// (`Failed`: the main container exited non-zero; `Error`: the pod was deleted or lost, or an init
/// or wait container failed), `lastRetry.exitCode` (the main container's exit code as a string;
/// "-1" in Argo's documentation, "0" in its controller, when there is none) and the node's message.
struct Attempt<'a> {
    phase: &'a str,
    exit_code: &'a str,
    message: &'a str,
}

/// Whether Argo retries the template after `attempt` (the retry limit aside): `retryPolicy` —
/// Always retries Failed and Error nodes, OnFailure only Failed ones, OnError only Error ones; when
/// none is given, Always with an expression (3.5 and later), else OnFailure — and then
/// `expression`, evaluated as expr evaluates it over the retry scope.
fn argo_retries(strategy: &Value, attempt: &Attempt) -> bool {
    let expression = strategy["expression"].as_str();
    let policy = strategy["retryPolicy"]
        .as_str()
        .unwrap_or(if expression.is_some() {
            "Always"
        } else {
            "OnFailure"
        });
    let by_policy = match (policy, attempt.phase) {
        ("Always", "Failed" | "Error") => true,
        ("OnFailure", "Failed") | ("OnError", "Error") => true,
        ("Always" | "OnFailure" | "OnError", _) => false,
        (other, _) => panic!("a retryPolicy this check does not evaluate: {other}"),
    };
    let Some(expression) = expression else {
        return by_policy;
    };
    let scope = BTreeMap::from([
        ("lastRetry.status", attempt.phase),
        ("lastRetry.exitCode", attempt.exit_code),
        ("lastRetry.message", attempt.message),
        ("lastRetry.duration", "12.5"),
    ]);
    by_policy && expr_eval(expression, &scope)
}

/// A value of the expr language, as far as retry expressions use it.
#[derive(Clone, Debug, PartialEq)]
enum ExprValue {
    Str(String),
    Int(i64),
    Bool(bool),
    List(Vec<ExprValue>),
}

/// Evaluates an expr-language (github.com/expr-lang/expr) boolean expression over string
/// variables: string and integer literals (a string never equals a number), variables, lists, `==`, `!=`, `in`, `not in`, `!`, `&&`/`and`,
/// `||`/`or` and parentheses, with expr's precedence (`||` below `&&` below comparisons). Anything
/// else fails the check.
fn expr_eval(expression: &str, scope: &BTreeMap<&str, &str>) -> bool {
    let tokens = expr_tokens(expression);
    let mut position = 0;
    let value = expr_or(&tokens, &mut position, scope);
    assert_eq!(
        position,
        tokens.len(),
        "unparsed: {:?}",
        &tokens[position..]
    );
    match value {
        ExprValue::Bool(b) => b,
        other => panic!("not a boolean: {other:?} from {expression}"),
    }
}

fn expr_tokens(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' {
            let end = chars[i + 1..]
                .iter()
                .position(|&d| d == c)
                .expect("a closed string")
                + i
                + 1;
            tokens.push(chars[i..=end].iter().collect());
            i = end + 1;
        } else if "[](),".contains(c) {
            tokens.push(c.to_string());
            i += 1;
        } else if i + 1 < chars.len()
            && ["==", "!=", "||", "&&"].contains(&&*format!("{c}{}", chars[i + 1]))
        {
            tokens.push(format!("{c}{}", chars[i + 1]));
            i += 2;
        } else if c == '!' {
            tokens.push("!".into());
            i += 1;
        } else if c.is_alphanumeric() || c == '_' || c == '.' || c == '-' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || "_.-".contains(chars[i])) {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else {
            panic!("a character this check cannot read: {c:?} in {text}");
        }
    }
    tokens
}

fn expr_or(tokens: &[String], at: &mut usize, scope: &BTreeMap<&str, &str>) -> ExprValue {
    let mut value = expr_and(tokens, at, scope);
    while *at < tokens.len() && (tokens[*at] == "||" || tokens[*at] == "or") {
        *at += 1;
        let right = expr_and(tokens, at, scope);
        value = ExprValue::Bool(expr_bool(&value) || expr_bool(&right));
    }
    value
}

fn expr_and(tokens: &[String], at: &mut usize, scope: &BTreeMap<&str, &str>) -> ExprValue {
    let mut value = expr_comparison(tokens, at, scope);
    while *at < tokens.len() && (tokens[*at] == "&&" || tokens[*at] == "and") {
        *at += 1;
        let right = expr_comparison(tokens, at, scope);
        value = ExprValue::Bool(expr_bool(&value) && expr_bool(&right));
    }
    value
}

fn expr_comparison(tokens: &[String], at: &mut usize, scope: &BTreeMap<&str, &str>) -> ExprValue {
    let left = expr_unary(tokens, at, scope);
    let Some(operator) = tokens.get(*at) else {
        return left;
    };
    let negated_in = operator == "not" && tokens.get(*at + 1).is_some_and(|t| t == "in");
    match operator.as_str() {
        "==" | "!=" => {
            *at += 1;
            let right = expr_unary(tokens, at, scope);
            ExprValue::Bool((left == right) == (operator == "=="))
        }
        "in" => {
            *at += 1;
            let ExprValue::List(items) = expr_unary(tokens, at, scope) else {
                panic!("`in` takes a list");
            };
            ExprValue::Bool(items.contains(&left))
        }
        _ if negated_in => {
            *at += 2;
            let ExprValue::List(items) = expr_unary(tokens, at, scope) else {
                panic!("`not in` takes a list");
            };
            ExprValue::Bool(!items.contains(&left))
        }
        _ => left,
    }
}

fn expr_unary(tokens: &[String], at: &mut usize, scope: &BTreeMap<&str, &str>) -> ExprValue {
    let token = tokens.get(*at).expect("an operand").clone();
    *at += 1;
    match token.as_str() {
        "!" | "not" => ExprValue::Bool(!expr_bool(&expr_unary(tokens, at, scope))),
        "(" => {
            let value = expr_or(tokens, at, scope);
            assert_eq!(tokens[*at], ")");
            *at += 1;
            value
        }
        "[" => {
            let mut items = Vec::new();
            while tokens[*at] != "]" {
                items.push(expr_or(tokens, at, scope));
                if tokens[*at] == "," {
                    *at += 1;
                }
            }
            *at += 1;
            ExprValue::List(items)
        }
        "true" | "false" => ExprValue::Bool(token == "true"),
        t if t.parse::<i64>().is_ok() => ExprValue::Int(t.parse().unwrap()),
        t if t.starts_with('\'') || t.starts_with('"') => {
            ExprValue::Str(t[1..t.len() - 1].to_string())
        }
        name => ExprValue::Str(
            scope
                .get(name)
                .unwrap_or_else(|| panic!("a variable the retry scope does not have: {name}"))
                .to_string(),
        ),
    }
}

fn expr_bool(value: &ExprValue) -> bool {
    match value {
        ExprValue::Bool(b) => *b,
        other => panic!("not a boolean: {other:?}"),
    }
}

/// An Argo duration (`"30"` seconds, `"30s"`, `"2m"`, `"1h"`), in seconds.
fn argo_seconds(text: &str) -> u64 {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let number: u64 = number.parse().unwrap();
    match unit {
        "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        _ => panic!("a duration this check cannot read: {text}"),
    }
}

/// The waits between the attempts, in seconds, as Argo's controller computes them: before retry n
/// (from 1) `duration × factor^(n-1)`, at most `cap`; `maxDuration` is no cap on a wait but the
/// budget of the attempts and waits together, from the first attempt's start — with each attempt
/// taking `attempt` seconds, a retry whose wait would end past it is not made.
fn argo_waits(strategy: &Value, attempt: u64) -> Vec<u64> {
    let limit: u64 = strategy["limit"]
        .as_str()
        .map(|l| l.parse().unwrap())
        .or(strategy["limit"].as_u64())
        .expect("a limit");
    let backoff = &strategy["backoff"];
    let duration = argo_seconds(backoff["duration"].as_str().expect("a backoff duration"));
    let factor: u64 = match &backoff["factor"] {
        Value::String(f) => f.parse().unwrap(),
        Value::Number(f) => f.as_u64().unwrap(),
        _ => 1,
    };
    let cap = backoff["cap"].as_str().map(argo_seconds);
    let budget = backoff["maxDuration"].as_str().map(argo_seconds);
    let mut waits = Vec::new();
    let mut elapsed = attempt;
    for n in 1..=limit {
        let mut wait = duration * factor.pow(n as u32 - 1);
        if let Some(cap) = cap {
            wait = wait.min(cap);
        }
        if budget.is_some_and(|budget| elapsed + wait > budget) {
            break;
        }
        waits.push(wait);
        elapsed += wait + attempt;
    }
    waits
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

    // The retry strategy: only the retryable codes of handoff retried, and every failure of the
    // pod rather than of handoff.
    let strategy = &run["retryStrategy"];
    for code in documented_exit_codes() {
        let exit_code = code.to_string();
        let attempt = Attempt {
            phase: if code == 0 { "Succeeded" } else { "Failed" },
            exit_code: &exit_code,
            message: "",
        };
        assert_eq!(
            code != 0 && argo_retries(strategy, &attempt),
            retryable(code),
            "exit code {code}"
        );
    }
    let pod_failures = [
        // The pod deleted (a node drained, `kubectl delete pod`): no exit code, or handoff's own
        // after the SIGTERM the deletion sends.
        ("Error", "-1", "pod deleted"),
        ("Error", "0", "pod deleted"),
        ("Error", "12", "pod deleted"),
        // Out of memory: the kernel's SIGKILL.
        ("Failed", "137", "OOMKilled (exit code 137)"),
        // Evicted: killed, or failed before handoff started.
        (
            "Failed",
            "137",
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.",
        ),
        (
            "Failed",
            "0",
            "The node was low on resource: ephemeral-storage. Container main was using 1Gi.",
        ),
        // The pod failed before its main container started (an image pull, an init container).
        (
            "Error",
            "0",
            "Pod failed before main container starts due to ErrImagePull",
        ),
    ];
    for (phase, exit_code, message) in pod_failures {
        let attempt = Attempt {
            phase,
            exit_code,
            message,
        };
        assert!(
            argo_retries(strategy, &attempt),
            "not retried: {phase} {exit_code} {message}"
        );
    }
    // A second signal (the engine stopping the task) is not retried.
    for code in ["130", "143"] {
        let attempt = Attempt {
            phase: "Failed",
            exit_code: code,
            message: "",
        };
        assert!(!argo_retries(strategy, &attempt), "exit code {code}");
    }
    // The waits: each one outlasts handoff's lease; the budget (maxDuration) holds every retry of
    // the limit with attempts of up to 2 minutes.
    let lease = default_lease_seconds();
    let limit = strategy["limit"]
        .as_str()
        .map(|l| l.parse::<usize>().unwrap())
        .expect("a limit");
    assert!(limit >= 2);
    let waits = argo_waits(strategy, 120);
    assert_eq!(waits.len(), limit, "the budget cuts the retries: {waits:?}");
    assert!(
        waits
            .iter()
            .all(|wait| *wait >= lease && *wait > ELECTION_SECONDS),
        "a wait shorter than the {lease} s lease: {waits:?}"
    );
    // maxDuration is the budget of every attempt, not a cap on one wait: with 5m as the old
    // template had it, the third retry of 1 m doubling would never come.
    let mut capped = strategy.clone();
    capped["backoff"]["maxDuration"] = Value::from("5m");
    assert!(argo_waits(&capped, 120).len() < limit);

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
    let exit_code = code.to_string();
    let attempt = Attempt {
        phase: "Failed",
        exit_code: &exit_code,
        message: "",
    };
    assert!(!argo_retries(strategy, &attempt));
    let failed = as_strings(&serde_json::from_str::<Value>(&parameter).unwrap());
    assert_eq!(failed["status"], "FAILED");
    assert_eq!(failed["error_class"], "bad_input");
    assert_eq!(failed["exit_code"], "2");
    assert!(failed["guidance"].contains("max_events"), "{failed:?}");
}

#[test]
fn the_expr_reader_follows_expr() {
    let scope = BTreeMap::from([("lastRetry.status", "Error"), ("lastRetry.exitCode", "137")]);
    let eval = |expression: &str| expr_eval(expression, &scope);
    assert!(eval("lastRetry.status == 'Error'"));
    assert!(!eval("lastRetry.status != \"Error\""));
    assert!(eval("lastRetry.exitCode in ['3', '137']"));
    assert!(!eval("lastRetry.exitCode in ['3', '10']"));
    assert!(eval("lastRetry.exitCode not in ['3', '10']"));
    // `&&` binds tighter than `||`.
    assert!(eval("'a' == 'a' || 'b' == 'c' && false"));
    assert!(!eval("('a' == 'a' || 'b' == 'c') && false"));
    assert!(eval("!(lastRetry.status == 'Failed') and true"));
    // The exit code is a string: a number never equals it.
    assert!(!eval("lastRetry.exitCode in [137]"));
}
