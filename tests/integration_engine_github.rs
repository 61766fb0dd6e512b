//! The GitHub Actions example (`flows/github-actions`), read as the runner reads it (see
//! `support::engines`).

use crate::support;
use crate::support::engines::*;

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::live::Live;

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

/// A step's `run` script started as the runner starts `shell: bash` (`bash --noprofile --norc -eo
/// pipefail FILE`), with its env, `$GITHUB_OUTPUT`, `$GITHUB_STEP_SUMMARY` and `$RUNNER_TEMP`, its
/// stdout and stderr piped. Returns the process, the folder holding those files (kept while it
/// lives) and the path of `$GITHUB_OUTPUT`.
fn spawn_github_step(
    step: &Value,
    env: &BTreeMap<String, String>,
    path: &str,
) -> (Child, tempfile::TempDir, PathBuf) {
    assert_eq!(step["shell"], "bash");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.sh");
    std::fs::write(&script, step["run"].as_str().expect("a run script")).unwrap();
    let temp = dir.path().join("temp");
    std::fs::create_dir(&temp).unwrap();
    let output_file = dir.path().join("output");
    std::fs::write(&output_file, "").unwrap();
    let child = Command::new("bash")
        .args(["--noprofile", "--norc", "-eo", "pipefail"])
        .arg(&script)
        .env_clear()
        .envs(env)
        .env("PATH", path)
        .env("HANDOFF_CACHE_DIR", support::cache_dir())
        .env("RUNNER_TEMP", &temp)
        .env("GITHUB_OUTPUT", &output_file)
        .env("GITHUB_STEP_SUMMARY", dir.path().join("summary"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, dir, output_file)
}

/// A step's `run` script run to its end (see [`spawn_github_step`]). Returns the exit code, what
/// it printed and the outputs it set.
fn run_github_step(
    step: &Value,
    env: &BTreeMap<String, String>,
    path: &str,
) -> (i32, String, BTreeMap<String, String>) {
    let (child, _dir, output_file) = spawn_github_step(step, env, path);
    let output = child.wait_with_output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let outputs = parse_github_output(&std::fs::read_to_string(&output_file).unwrap())
        .unwrap_or_else(|e| panic!("the runner would fail the step: {e}\n{printed}"));
    (output.status.code().unwrap_or(-1), printed, outputs)
}

/// The Node runtime (`runs.using` of the tag's action.yml) of the action versions the workflow may
/// use. Runners no longer run actions on Node 20 or older, so only node24 actions are listed.
const NODE24_ACTIONS: &[&str] = &[
    "actions/checkout@v5",
    "actions/checkout@v6",
    "actions/checkout@v7",
    "actions/cache@v5",
    "actions/cache/restore@v5",
    "actions/cache/save@v5",
];

/// The files whose change must rebuild the cached binary: the workspace manifest (its
/// `[workspace.dependencies]` and profiles), the lock file, the toolchain, and the folders of every
/// crate and contract `cargo build -p handoff` compiles.
const BUILD_INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "rust-toolchain.toml",
    "host/**",
    "guest/**",
    "wit/**",
];

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
    let reads = support::variables_handoff_reads();
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

/// The workflow's one job.
fn the_job() -> Value {
    let (_, workflow) = load_yaml("github-actions/handoff.yml");
    let jobs = workflow["jobs"].as_object().expect("jobs");
    jobs.values().next().expect("a job").clone()
}

#[test]
fn github_actions_workflow_runs_on_node24_and_caches_the_binary_whatever_the_run_does() {
    let job = the_job();
    let steps = job["steps"].as_array().unwrap();
    for step in steps {
        if let Some(uses) = step["uses"].as_str() {
            assert!(
                NODE24_ACTIONS.contains(&uses),
                "{uses} does not run on Node 24 (or is not one this check knows)"
            );
        }
    }
    let position = |wanted: &dyn Fn(&Value) -> bool| {
        steps
            .iter()
            .position(wanted)
            .unwrap_or_else(|| panic!("a step is missing: {steps:?}"))
    };
    // The combined action saves in its post step, only when the whole job succeeded.
    assert!(
        !steps.iter().any(|s| s["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/cache@"))),
        "restore and save separately"
    );
    let restore = position(&|s: &Value| {
        s["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/cache/restore@"))
    });
    let build = position(&|s: &Value| {
        s["run"]
            .as_str()
            .is_some_and(|r| r.contains("cargo build --release --locked -p handoff"))
    });
    let save = position(&|s: &Value| {
        s["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/cache/save@"))
    });
    let handoff = position(&|s: &Value| s["id"] == "handoff");
    let restore_id = steps[restore]["id"]
        .as_str()
        .expect("the restore step's id");
    let key = steps[restore]["with"]["key"].as_str().unwrap();
    let hashed = key
        .split("hashFiles(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("hashFiles in the key");
    let hashed: Vec<&str> = hashed
        .split(',')
        .map(|p| p.trim().trim_matches('\''))
        .collect();
    for input in BUILD_INPUTS {
        assert!(hashed.contains(input), "the key misses {input}: {key}");
    }
    // Every crate of the workspace the binary is built from lies under a hashed folder.
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root().join("Cargo.toml")).unwrap()).unwrap();
    for member in manifest["workspace"]["members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        if member.starts_with("tests/") {
            continue; // test-only crates: `cargo build -p handoff` does not compile them
        }
        assert!(
            hashed.iter().any(|p| p
                .strip_suffix("/**")
                .is_some_and(|dir| member.starts_with(dir))),
            "the key misses {member}: {key}"
        );
    }
    assert_eq!(
        steps[save]["with"]["path"], steps[restore]["with"]["path"],
        "the saved path is the restored one"
    );
    assert_eq!(
        steps[save]["with"]["key"],
        format!("${{{{ steps.{restore_id}.outputs.cache-primary-key }}}}"),
        "saved under the key the restore missed"
    );
    // Saved once built, whatever the run does next: before the run, or after it with always().
    assert!(build < save, "the save follows the build");
    let condition = steps[save]["if"].as_str().unwrap_or("");
    assert!(
        save < handoff || condition.contains("always()"),
        "a failed or cancelled run would skip the save: {condition:?}"
    );
    let build_id = steps[build]["id"].as_str().expect("the build step's id");
    assert!(
        condition.contains(&format!("steps.{build_id}.outcome == 'success'")),
        "only a binary that was built is saved: {condition:?}"
    );
}

#[test]
fn github_actions_step_passes_a_cancellation_on_to_handoff_and_still_writes_outputs() {
    let job = the_job();
    let step = job["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "handoff")
        .unwrap();
    let live = Live::start();
    let uri = live.uri();
    let mut env: BTreeMap<String, String> = step["env"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    for (name, value) in [
        ("MONGODB_URI", uri.as_str()),
        ("SOURCE_DATABASE", live.db.as_str()),
        ("SOURCE_COLLECTION", "orders"),
        ("CONSUMER_ID", "orders-to-outbox"),
        ("CHECKPOINT_COLLECTION", "kestra_change_checkpoints"),
        ("OUTBOX_COLLECTION", "kestra_change_outbox"),
        ("MAX_EVENTS", "50"),
        ("MAX_WAIT_SECONDS", "30"),
        ("HANDOFF_RETRY_DELAY_SECONDS", "0"),
    ] {
        env.insert(name.into(), value.into());
    }
    let (mut child, _dir, output_file) = spawn_github_step(step, &env, &path_with(&handoff_dir()));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    read_until(&mut stderr, "run starting");
    let rest = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    // Cancelling: the runner sends SIGINT to the step's shell, then SIGTERM 7.5 s later and kills
    // it 2.5 s after that. Both signals are sent here, the second at once: only the first may
    // reach handoff (a second one would end it without outputs).
    let sent = Instant::now();
    send_signal(child.id(), "INT");
    std::thread::sleep(Duration::from_millis(200));
    send_signal(child.id(), "TERM");
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let printed = rest.join().unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the runner kills the step 10 s after the cancellation; it took {took:?}: {printed}"
    );
    assert_eq!(status.code(), Some(12), "{status:?}: {printed}");
    let outputs = parse_github_output(&std::fs::read_to_string(&output_file).unwrap())
        .unwrap_or_else(|e| panic!("the runner would fail the step: {e}\n{printed}"));
    assert_eq!(outputs["exit_code"], "12", "{outputs:?}");
    assert_eq!(outputs["stopped"], "true", "{outputs:?}");
    assert_eq!(outputs["status"], "IDLE", "{outputs:?}");
    assert_eq!(
        outputs["attempts"], "1",
        "a cancelled run is not retried: {outputs:?}"
    );
    assert!(!printed.contains(&uri));
}
