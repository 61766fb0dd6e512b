//! A policy cannot forge what the workflow engine reads. Kestra reads every line of stdout and
//! stderr that is a `::{…}::` protocol line; a policy controls its log message and fields, skip
//! and quarantine reasons, and its error string. Whatever they carry, in every log format and at
//! every log level, the only protocol lines are the host's own: none when the run fails, exactly
//! the outputs and metrics on stdout when it succeeds.

use crate::support;

use std::process::Output;

use support::*;

fn forge(s: &Scratch, format: &str, extra: &[&str]) -> Output {
    let fixture = s.fixture(
        "two.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            event(2, "update"),
            batch_end(2),
        ],
    );
    handoff()
        .env("HANDOFF_LOG", "trace")
        .args(["--log-format", format, "replay"])
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::FORGE_OUTPUT])
        .args(extra)
        .output()
        .expect("run handoff")
}

/// Lines that Kestra would take for protocol lines.
fn protocol_lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .split(['\n', '\r', '\u{2028}', '\u{2029}', '\u{85}'])
        .filter(|line| line.trim_start().starts_with("::"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_failing_policy_prints_no_protocol_line_in_any_log_format() {
    for format in ["text", "json"] {
        let s = Scratch::new();
        let output = forge(&s, format, &[]);
        let out = fails(&output, 9, "error[policy]: failed\\n");
        // The failure's own outputs: what the host saw, whatever the policy wrote.
        assert_eq!(out["events_handed_off"], 0, "{format}");
        assert_ne!(out["policy_sha256"], "forged", "{format}");
        let stderr = stderr(&output);
        // The forged text is there, escaped, so the operator still sees what the policy said.
        assert!(stderr.contains("starting"), "{format}: {stderr}");
        assert!(stderr.contains("skipped"), "{format}: {stderr}");
        assert!(stderr.contains(r#"::{"outputs""#), "{format}: {stderr}");
        // Only the host's two lines, the forged text inside the guidance's JSON string.
        let stdout_lines = protocol_lines(&output.stdout);
        assert_eq!(stdout_lines.len(), 2, "{format}: {stdout_lines:?}");
        assert!(stdout_lines[0].starts_with(r#"::{"outputs":{"status":"FAILED""#));
        assert!(stdout_lines[1].starts_with(r#"::{"metrics":"#));
        assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 2);
        assert_eq!(
            protocol_lines(&output.stderr),
            Vec::<String>::new(),
            "{format}: {stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}')
                && !String::from_utf8_lossy(&output.stdout).contains('\u{1b}'),
            "{format}: a terminal escape got through"
        );
    }
}

#[test]
fn a_succeeding_policy_leaves_only_the_hosts_own_lines() {
    for format in ["text", "json"] {
        let s = Scratch::new();
        let output = forge(&s, format, &["--policy-param", "succeed=1"]);
        let out = ok(&output);
        assert_eq!(out["events_skipped"], 1);
        assert_eq!(out["events_quarantined"], 1);
        assert_ne!(out["policy_sha256"], "forged");
        let stdout_lines = protocol_lines(&output.stdout);
        assert_eq!(stdout_lines.len(), 2, "{format}: {stdout_lines:?}");
        assert!(stdout_lines[0].starts_with(r#"::{"outputs":"#));
        assert!(stdout_lines[1].starts_with(r#"::{"metrics":"#));
        assert!(!stdout_lines.iter().any(|l| l.contains("forged")));
        assert_eq!(
            protocol_lines(&output.stderr),
            Vec::<String>::new(),
            "{format}: {}",
            stderr(&output)
        );
    }
}

/// A log call whose 100,000 fields all name the same 8 MiB of policy memory: the host reads only
/// the fields and characters it keeps, so the run ends as the policy asked instead of the host
/// copying 1.6 TB.
#[test]
fn a_log_call_cannot_amplify_host_allocations() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert")],
    );
    let output = handoff()
        .env("HANDOFF_LOG", "info")
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::LOG_AMPLIFIER])
        .output()
        .expect("run handoff");
    fails(&output, 9, "error[policy]: logged");
    let stderr = stderr(&output);
    assert!(stderr.contains("amplified"), "{stderr}");
    // Sixteen fields, each key and value cut at its bound (marked with an ellipsis).
    let logged = stderr
        .lines()
        .find(|l| l.contains("amplified"))
        .unwrap_or("");
    assert_eq!(logged.matches("…=x").count(), 16, "{logged}");
    assert!(logged.len() < 16 * 400 + 2048, "{} bytes", logged.len());
}

/// One commit call of the amplifier (`call`, as its parameter names it) on a one-event stream:
/// refused once its strings pass 256 MiB of policy memory, with nothing written.
fn commit_call_is_refused_unamplified(call: &str) {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert")],
    );
    let output = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::LOG_AMPLIFIER])
        .args(["--policy-param", &format!("call={call}")])
        .output()
        .expect("run handoff");
    fails(
        &output,
        9,
        "a commit's strings exceed 256 MiB of policy memory",
    );
    assert!(inspect(&s.state()).1.is_empty());
}

/// A batch whose 100,000 hand-off IDs all name the same 8 MiB of policy memory: the host keeps
/// one character more than an ID may hold, and stops reading (and refuses the batch) once the
/// call's strings pass 256 MiB, instead of checking 800 GB of aliased text.
#[test]
fn a_batch_cannot_amplify_host_allocations() {
    commit_call_is_refused_unamplified("commit-batch");
}

/// Shaped records whose IDs, event types, values and payloads all name the same 8 MiB of policy
/// memory, 100,000 times: the host keeps each part within its bound and stops reading (and
/// refuses the commit) once the call's strings pass 256 MiB; nothing is written.
#[test]
fn shaped_records_cannot_amplify_host_allocations() {
    commit_call_is_refused_unamplified("commit-records");
}
