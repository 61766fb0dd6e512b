//! The binary as users and engines meet it: `--version`, help with examples and exit codes,
//! completions and the manual page, Kestra log lines, and the outputs of a run on stdout and in
//! `--outputs-file`, on success and on failure.

use crate::support;

use std::process::Command;

use handoff::error::HandoffError;
use serde_json::Value;
use support::*;

/// Every failure class, one value each.
fn every_class() -> Vec<HandoffError> {
    vec![
        HandoffError::Internal(anyhow::anyhow!("x")),
        HandoffError::BadInput(String::new()),
        HandoffError::Conflict(String::new()),
        HandoffError::Mismatch(String::new()),
        HandoffError::MalformedCheckpoint(String::new()),
        HandoffError::HistoryLost(String::new()),
        HandoffError::InvalidToken(String::new()),
        HandoffError::StreamFatal(String::new()),
        HandoffError::Policy(String::new()),
        HandoffError::Unavailable(String::new()),
        HandoffError::Authentication(String::new()),
        HandoffError::EventTooLarge(String::new()),
    ]
}

fn text(args: &[&str]) -> String {
    let output = handoff().args(args).output().expect("run handoff");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}",
        stderr(&output)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn version_names_the_contract_the_engine_and_the_commit() {
    let version = text(&["--version"]);
    let contract = handoff::runtime::policy::CONTRACT;
    assert!(
        version.contains(&format!("contract: handoff:policy@{contract} ")),
        "{version}"
    );
    assert!(
        version.contains(&format!(
            "built for {}.0.0 up to {contract}",
            contract.major
        )),
        "{version}"
    );
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))
        .expect("Cargo.lock");
    let wasmtime = lock
        .split("name = \"wasmtime\"\nversion = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("wasmtime in Cargo.lock");
    assert!(
        version.contains(&format!("engine:   wasmtime {wasmtime}")),
        "{version}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let expected = head.unwrap_or_else(|| "unknown".into());
    assert!(
        version.contains(&format!("commit:   {expected}")),
        "{version}"
    );
}

#[test]
fn every_commands_help_shows_an_example_and_every_exit_code() {
    let commands: &[&[&str]] = &[
        &["run"],
        &["replay"],
        &["inspect"],
        &["record"],
        &["policy", "new"],
        &["policy", "check"],
        &["policy", "test"],
        &["policy", "precompile"],
        &["policy", "export-default"],
        &["completions"],
        &["man"],
        &["lease", "release"],
        &["checkpoint", "reset"],
        &["recover"],
    ];
    let mut codes: Vec<u8> = every_class().iter().map(HandoffError::exit_code).collect();
    codes.extend([
        handoff::error::STOPPED_EXIT_CODE,
        handoff::run::watchdog::WATCHDOG_EXIT_CODE,
    ]);
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let help = text(&args);
        assert!(help.contains("Example:\n  "), "{command:?}: {help}");
        assert!(help.contains("Exit codes:"), "{command:?}: {help}");
        for code in &codes {
            assert!(
                help.lines().any(|l| l.starts_with(&format!("  {code} "))),
                "{command:?} does not explain exit code {code}"
            );
        }
        assert!(help.contains("130, 143"), "{command:?}");
        let lost =
            &help[help.find("\n  6 ").expect("exit code 6")..help.find("\n  7 ").expect("7")];
        support::assert_recovery_order(lost, &format!("{command:?} --help"));
    }
}

#[test]
fn completions_and_the_manual_page_cover_every_command() {
    let bash = text(&["completions", "bash"]);
    let checked = Command::new("bash")
        .arg("-n")
        .stdin(std::process::Stdio::piped())
        .arg("/dev/stdin")
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(bash.as_bytes())?;
            child.wait()
        })
        .expect("bash");
    assert!(
        checked.success(),
        "the bash completion script does not parse"
    );
    let man = text(&["man"]);
    assert!(man.contains(".TH handoff 1"), "{man}");
    for command in [
        "run",
        "replay",
        "inspect",
        "policy",
        "record",
        "completions",
    ] {
        assert!(bash.contains(command), "bash completion lacks {command}");
        assert!(text(&["completions", "zsh"]).contains(command));
        assert!(man.contains(command), "the manual page lacks {command}");
    }
    assert!(bash.contains("--outputs-file"));
    // A flag's values complete too.
    assert!(bash.contains("kestra"));
    // A refused shell is an error, not a panic.
    let output = handoff().args(["completions", "cmd.exe"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// Every page another page refers to (`handoff-run(1)`, `handoff-checkpoint-reset(1)`, …) is
/// written by `man --dir`, and `man COMMAND…` prints that command's own page.
#[test]
fn every_command_has_a_manual_page_and_every_reference_exists() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pages = dir.path().join("man1");
    let output = handoff()
        .args(["man", "--dir"])
        .arg(&pages)
        .output()
        .expect("run handoff");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let written: std::collections::BTreeSet<String> = std::fs::read_dir(&pages)
        .expect("pages")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    for page in [
        "handoff.1",
        "handoff-run.1",
        "handoff-status.1",
        "handoff-checkpoint-reset.1",
        "handoff-policy-test.1",
        "handoff-reconcile.1",
        "handoff-recover.1",
    ] {
        assert!(written.contains(page), "{page} missing from {written:?}");
    }
    let mut references = 0;
    for page in &written {
        let text = std::fs::read_to_string(pages.join(page)).expect("page");
        // A reference is a word `handoff\-…(1)` (roff escapes the hyphens).
        for word in text.split_whitespace().filter(|w| w.ends_with("(1)")) {
            let name = word.trim_end_matches("(1)").replace("\\-", "-");
            if name.starts_with("handoff") {
                let file = format!("{name}.1");
                assert!(
                    written.contains(&file),
                    "{page} refers to {file}, which is not written"
                );
                references += 1;
            }
        }
    }
    assert!(references >= written.len() - 1, "{references} references");
    let reset = text(&["man", "checkpoint", "reset"]);
    assert!(reset.contains(".TH handoff-checkpoint-reset 1"), "{reset}");
    assert!(reset.contains("\\-\\-to\\-time"), "{reset}");
    let recover = text(&["man", "recover"]);
    assert!(recover.contains(".TH handoff-recover 1"), "{recover}");
    assert!(recover.contains("\\-\\-dry\\-run"), "{recover}");
    let output = handoff().args(["man", "chekpoint"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("checkpoint"),
        "{}",
        stderr(&output)
    );
}

/// The protocol lines of stdout, each parsed; panics on any other line.
fn protocol_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            let inner = line
                .strip_prefix("::")
                .and_then(|l| l.strip_suffix("::"))
                .unwrap_or_else(|| panic!("not a protocol line: {line}"));
            serde_json::from_str(inner).expect("a protocol line is JSON")
        })
        .collect()
}

#[test]
fn kestra_log_format_writes_every_log_line_as_a_protocol_line_on_stdout() {
    let s = Scratch::new();
    let output = handoff()
        .env("HANDOFF_LOG", "debug")
        .args(["--log-format", "kestra", "replay"])
        .arg(s.three_events())
        .arg("--state")
        .arg(s.state())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(output.stderr.is_empty(), "stderr: {}", stderr(&output));
    let lines = protocol_lines(&output.stdout);
    let logs: Vec<&Value> = lines.iter().filter_map(|l| l.get("logs")).collect();
    let levels: Vec<&str> = logs
        .iter()
        .flat_map(|l| l.as_array().expect("a list"))
        .map(|l| l["level"].as_str().expect("a level"))
        .collect();
    assert!(
        levels.contains(&"INFO") && levels.contains(&"DEBUG"),
        "{levels:?}"
    );
    assert!(!levels.contains(&"ERROR"), "{levels:?}");
    let messages: Vec<&str> = logs
        .iter()
        .flat_map(|l| l.as_array().expect("a list"))
        .map(|l| l["message"].as_str().expect("a message"))
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("run finished")),
        "{messages:?}"
    );
    assert!(lines.iter().any(|l| l.get("outputs").is_some()));
}

#[test]
fn the_outputs_file_holds_the_outputs_of_a_finished_and_of_a_failed_run() {
    let s = Scratch::new();
    let file = s.path("outputs.json");
    let output = handoff()
        .arg("replay")
        .arg(s.three_events())
        .arg("--state")
        .arg(s.state())
        .arg("--outputs-file")
        .arg(&file)
        .output()
        .unwrap();
    let printed = ok(&output);
    let written: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(written, printed);
    assert_eq!(written["status"], "HANDED_OFF");
    assert_eq!(written["events_handed_off"], 3);

    // A failure after a commit: the policy hands the first event off, then reports two. Its
    // outputs say what was committed, why it failed and what to do.
    let state = s.path("failing.redb");
    let output = handoff()
        .env("HANDOFF_OUTPUTS_FILE", &file)
        .arg("replay")
        .arg(s.three_events())
        .arg("--state")
        .arg(&state)
        .args(["--policy", handoff_test_policies::FALSE_REPORT])
        .output()
        .unwrap();
    let code = output.status.code().expect("an exit code");
    assert_eq!(code, 9, "{}", stderr(&output));
    let printed = failure_outputs(&output, 9);
    let written: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(written, printed);
    assert_eq!(written["error_class"], "policy");
    let (_, outbox) = inspect(&state);
    assert_eq!(written["events_handed_off"], outbox.len());
    assert!(!outbox.is_empty(), "the failure came after commits");
    assert_eq!(written["policy_sha256"].as_str().map(str::len), Some(64));

    // A path that cannot be written is refused before anything is read or written.
    let state = s.path("never.redb");
    let output = handoff()
        .arg("replay")
        .arg(s.three_events())
        .arg("--state")
        .arg(&state)
        .arg("--outputs-file")
        .arg(s.path("missing/folder/outputs.json"))
        .output()
        .unwrap();
    let out = fails(&output, 2, "--outputs-file");
    assert_eq!(out["events_handed_off"], 0);
    assert!(!state.exists());
}

/// Every line of stdout and stderr that starts a protocol line (`::`).
fn protocol_starts(output: &std::process::Output) -> Vec<String> {
    [&output.stdout, &output.stderr]
        .into_iter()
        .flat_map(|bytes| {
            String::from_utf8_lossy(bytes)
                .split(['\n', '\r', '\u{2028}', '\u{2029}', '\u{85}'])
                .map(str::trim_start)
                .filter(|line| line.starts_with("::"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_refused_argument_value_cannot_start_a_line() {
    let forged = "::{\"outputs\":{\"status\":\"HANDED_OFF\",\"events_handed_off\":9}}::";
    for format in ["text", "json", "kestra"] {
        for (how, value) in [
            ("env", format!("true\n{forged}")),
            ("env", format!("true\r{forged}")),
            ("env", format!("true\u{2028}{forged}")),
            ("flag", format!("true\n{forged}")),
        ] {
            let mut command = handoff();
            command.args(["--log-format", format, "run"]);
            if how == "env" {
                command.env(support::env_names::OUTBOX_KEEP_EVENT, &value);
            } else {
                command.arg(format!("--outbox-keep-event={value}"));
            }
            let output = command.output().expect("run handoff");
            assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
            // The protocol lines are the run's own (its outputs, reporting the refusal, and its
            // metrics): none carries the forged line.
            let lines = protocol_starts(&output);
            let outputs_lines = lines
                .iter()
                .filter(|l| l.starts_with("::{\"outputs\""))
                .count();
            assert_eq!(outputs_lines, 1, "{format} {how}: {lines:?}");
            assert!(
                lines.iter().all(|l| !l.contains("HANDED_OFF")),
                "{format} {how}: {lines:?}"
            );
            let outputs = failure_outputs(&output, 2);
            assert_eq!(outputs["error_class"], "bad_input");
            assert!(
                stderr(&output).contains("--outbox-keep-event"),
                "{}",
                stderr(&output)
            );
        }
    }
}

#[test]
fn a_refused_argument_never_prints_a_uri_credential() {
    for args in [
        // A URI given without `--uri`.
        vec![
            "status",
            "mongodb://app_user:s3cretPw@db.example:27017/?replicaSet=rs0",
        ],
        vec!["run", "mongodb://app_user:s3cretPw@db.example/"],
        // An unparsable one, its password holding `@` and `/`.
        vec![
            "checkpoint",
            "reset",
            "mongodb+srv://app_user:s3cret/Pw@x@db.example/",
        ],
        // As the value of a flag that refuses it.
        vec![
            "run",
            "--max-events",
            "mongodb://app_user:s3cretPw@db.example/",
        ],
    ] {
        let output = handoff().args(&args).output().expect("run handoff");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            stderr(&output)
        );
        assert!(printed.contains("error[bad_input]"), "{printed}");
        for secret in ["s3cret", "app_user"] {
            assert!(
                !printed.contains(secret),
                "{args:?} printed {secret}: {printed}"
            );
        }
    }
}
