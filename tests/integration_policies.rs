//! Policies loaded from files: a second policy swapped in without rebuilding the host, and hostile
//! ones that the sandbox stops or the host refuses — with nothing committed and a clear error.

use crate::support;

use handoff::runtime::policy::CONTRACT;

use serde_json::Value;
use support::*;

fn policy_run(policy: &str, extra: &[&str]) -> (Scratch, std::process::Output) {
    let s = Scratch::new();
    let fixture = s.three_events();
    let mut args = vec!["--policy", policy];
    args.extend_from_slice(extra);
    let output = replay(&fixture, &s.state(), &args);
    (s, output)
}

/// Nothing was handed off and the checkpoint never moved.
fn nothing_committed(s: &Scratch) {
    let (checkpoint, outbox) = inspect(&s.state());
    assert!(outbox.is_empty(), "{outbox:?}");
    assert_eq!(checkpoint["token"], Value::Null);
}

#[test]
fn a_second_policy_is_loaded_from_a_file_without_rebuilding_the_host() {
    let (s, output) = policy_run(
        handoff_test_policies::PREFIXED_IDS,
        &["--policy-param", "prefix=shop"],
    );
    let out = ok(&output);
    assert_eq!(out["events_handed_off"], 3);
    let (checkpoint, outbox) = inspect(&s.state());
    let ids = outbox_ids(&outbox);
    let expected: Vec<String> = [(1, "insert"), (2, "update"), (3, "delete")]
        .iter()
        .map(|(seq, op)| format!("shop-{op}-{}", &baseline_event_id(&token(*seq))[..16]))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(out["last_event_id"], expected[2]);
    assert_eq!(checkpoint["token"], batch_end(3)["$postBatchResumeToken"]);
    // Its digest is reported, and differs from the embedded default's.
    let bytes = std::fs::read(handoff_test_policies::PREFIXED_IDS).unwrap();
    use sha2::Digest;
    assert_eq!(
        out["policy_sha256"],
        hex::encode(sha2::Sha256::digest(&bytes))
    );
    let default = ok(&replay(&s.three_events(), &s.path("default.redb"), &[]));
    assert_ne!(default["policy_sha256"], out["policy_sha256"]);
}

#[test]
fn an_endless_loop_is_stopped_by_the_compute_slice() {
    let (s, output) = policy_run(
        handoff_test_policies::SPIN_FOREVER,
        &["--policy-slice-ms", "200"],
    );
    fails(
        &output,
        9,
        "the policy computed for more than 200 ms without calling the host",
    );
    nothing_committed(&s);
}

#[test]
fn an_endless_loop_is_stopped_by_the_run_deadline_too() {
    let (s, output) = policy_run(
        handoff_test_policies::SPIN_FOREVER,
        &["--policy-slice-ms", "600000", "--run-timeout-seconds", "1"],
    );
    fails(&output, 9, "the policy exceeded the run deadline of 1 s");
    nothing_committed(&s);
}

#[test]
fn a_memory_bomb_is_stopped_by_the_cap() {
    let (s, output) = policy_run(
        handoff_test_policies::MEMORY_HOG,
        &["--policy-memory-mib", "16"],
    );
    fails(&output, 9, "the policy exceeded its memory cap");
    nothing_committed(&s);
}

#[test]
fn unbounded_recursion_traps() {
    let (s, output) = policy_run(handoff_test_policies::DEEP_RECURSION, &[]);
    fails(&output, 9, "nothing after the last commit was written");
    nothing_committed(&s);
}

#[test]
fn a_panicking_policy_traps() {
    let (s, output) = policy_run(handoff_test_policies::TRAP, &[]);
    fails(&output, 9, "the policy trapped");
    nothing_committed(&s);
}

#[test]
fn a_token_the_stream_never_delivered_is_refused() {
    let (s, output) = policy_run(handoff_test_policies::FORGED_TOKEN, &[]);
    fails(
        &output,
        9,
        "policy decision rejected: the token was not delivered by the stream",
    );
    nothing_committed(&s);
}

#[test]
fn skipping_a_delivered_event_is_refused() {
    let (s, output) = policy_run(handoff_test_policies::SKIP_AHEAD, &[]);
    fails(&output, 9, "events must be committed in delivery order");
    nothing_committed(&s);
}

#[test]
fn a_report_that_disagrees_with_the_commits_fails_the_run_but_keeps_the_commit() {
    let (s, output) = policy_run(handoff_test_policies::FALSE_REPORT, &[]);
    fails(&output, 9, "disagrees with what was committed");
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox_ids(&outbox), vec!["first".to_string()]);
    assert_eq!(checkpoint["token"], token(1));
}

#[test]
fn a_component_using_sockets_runs_with_every_use_denied() {
    let (s, output) = policy_run(handoff_test_policies::NET_CLIENT, &[]);
    fails(
        &output,
        9,
        "connected: false, bound: false, resolved: false",
    );
    nothing_committed(&s);
}

#[test]
fn a_component_importing_what_the_contract_lacks_is_refused_at_load() {
    let (s, output) = policy_run(handoff_test_policies::FOREIGN_IMPORT, &[]);
    fails(
        &output,
        9,
        "imports what the host does not grant: handoff:policy/backdoor",
    );
    assert!(
        !s.state().exists(),
        "a refused policy must not create the state store"
    );
}

#[test]
fn a_core_module_and_a_non_policy_component_are_refused() {
    let s = Scratch::new();
    let fixture = s.three_events();
    let core = s.path("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    fails(
        &replay(&fixture, &s.state(), &["--policy", core.to_str().unwrap()]),
        9,
        "is a core WebAssembly module, not a component",
    );
    let junk = s.path("junk.wasm");
    std::fs::write(&junk, b"#!/bin/sh\necho hi\n").unwrap();
    fails(
        &replay(&fixture, &s.state(), &["--policy", junk.to_str().unwrap()]),
        9,
        "not a WebAssembly component",
    );
    // The smallest valid component exports nothing: not a handoff policy.
    let empty = s.path("empty.wasm");
    std::fs::write(&empty, b"\0asm\x0d\0\x01\0").unwrap();
    fails(
        &replay(&fixture, &s.state(), &["--policy", empty.to_str().unwrap()]),
        9,
        &format!("not a handoff policy: it exports no handoff:policy/policy@{CONTRACT}"),
    );
    assert!(!s.state().exists());
}

/// A policy declares the parameters it reads (contract 1.4): a run given another is refused with
/// the declared names, before any state exists; a policy that declares none refuses every one;
/// a policy built without `declared` runs with a warning that nothing was checked.
#[test]
fn a_parameter_the_policy_does_not_read_is_refused_before_anything_is_written() {
    let (s, output) = policy_run(
        handoff_test_policies::BATCHING,
        &["--policy-param", "batch_sise=3"],
    );
    let out = fails(&output, 2, "reads no parameter batch_sise");
    assert!(stderr(&output).contains("did you mean batch_size?"));
    assert_eq!(out["events_handed_off"], 0);
    assert!(!s.state().exists(), "no state was created");

    let (s, output) = policy_run(
        handoff_test_policies::DEFAULT,
        &["--policy-param", "batch_size=3"],
    );
    fails(&output, 2, "it reads none");
    assert!(!s.state().exists());

    let (_, output) = policy_run(
        handoff_test_policies::BATCHING,
        &["--policy-param", "batch_size=2"],
    );
    assert_eq!(ok(&output)["events_handed_off"], 3);

    // Built on the world without `declared`: nothing to check against, and it says so.
    let (_, output) = policy_run(
        handoff_test_policies::PREFIXED_IDS,
        &["--policy-param", "anything=1"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("the names of --policy-param are not checked"));

    // `policy check` lists what a policy reads.
    let check = handoff()
        .args(["policy", "check", handoff_test_policies::BATCHING])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&check.stdout).contains("param:     batch_size"));
}

/// A policy that never answers which parameters it reads is refused within its bound, before
/// any run (it is asked when a run is given parameters, and by `policy check`).
#[test]
fn a_policy_that_never_declares_its_parameters_is_refused_in_bounded_time() {
    let started = std::time::Instant::now();
    let (s, output) = policy_run(
        handoff_test_policies::DECLARES_FOREVER,
        &["--policy-param", "x=1"],
    );
    fails(&output, 9, "cannot say which parameters it reads");
    assert!(stderr(&output).contains("took longer than"));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(!s.state().exists());
    // A wait is no way around the bound: every import traps while a policy answers.
    let started = std::time::Instant::now();
    let (s, output) = policy_run(
        handoff_test_policies::DECLARES_ASLEEP,
        &["--policy-param", "x=1"],
    );
    fails(&output, 9, "cannot say which parameters it reads");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(!s.state().exists());
    // Nor is a list too long: refused before it is copied.
    let (s, output) = policy_run(
        handoff_test_policies::DECLARES_TOO_MANY,
        &["--policy-param", "x=1"],
    );
    fails(&output, 9, "declares 200 parameters, more than 100");
    assert!(!s.state().exists());
    let check = handoff()
        .args(["policy", "check", handoff_test_policies::DECLARES_FOREVER])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(9), "{}", stderr(&check));
}
