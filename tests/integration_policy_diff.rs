//! `policy diff`: two policies decide the same events in the replay sandbox and what differs is
//! told per event: an ID changed (exit 16 unless allowed), a shape, a decision; over a fixture, a
//! folder of cases, or a consumer's outbox read without a write; `policy check --against`; and
//! the README's upgrade block runs as written.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use quick_xml::events::Event;
use serde_json::Value;
use support::live::Live;
use support::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn demo() -> String {
    workspace()
        .join("tests/fixtures/demo.jsonl")
        .display()
        .to_string()
}

fn policy(args: &[&str]) -> Output {
    handoff().arg("policy").args(args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The embedded default policy, written out.
fn default_policy(s: &Scratch) -> String {
    let path = s.path("default.wasm");
    let output = policy(&["export", "default", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    path.display().to_string()
}

/// `policy diff --old OLD --new NEW` with `extra`, its exit code and its JSON document.
fn diff_json(old: &str, new: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = vec!["diff", "--old", old, "--new", new, "--format", "json"];
    args.extend_from_slice(extra);
    let output = policy(&args);
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&output), stderr(&output)));
    (output.status.code(), json)
}

#[test]
fn the_default_against_itself_differs_in_nothing() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let output = policy(&["diff", "--old", &default, "--new", &default, &demo()]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    assert!(text.contains("differ:  0 of 5 events"), "{text}");
    assert!(text.contains("verdict: no event changes its ID"), "{text}");
}

#[test]
fn other_ids_flag_every_event_and_exit_16_unless_allowed() {
    let s = Scratch::new();
    let default = default_policy(&s);
    for other in [
        handoff_test_policies::PREFIXED_IDS,
        handoff_test_policies::KEYED_IDS,
    ] {
        let output = policy(&["diff", "--old", &default, "--new", other, &demo()]);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(16), "{text}{}", stderr(&output));
        assert!(stderr(&output).contains("error[attention]"), "{text}");
        let flagged: Vec<&str> = text.lines().filter(|l| l.starts_with("id ")).collect();
        assert_eq!(flagged.len(), 5, "{text}");
        for (n, line) in flagged.iter().enumerate() {
            assert!(line.contains(&format!("event {} (", n + 1)), "{line}");
            assert!(line.contains("re-delivery risk"), "{line}");
        }
        let (code, json) = diff_json(&default, other, &[&demo(), "--allow-id-change"]);
        assert_eq!(code, Some(0), "{json}");
        assert_eq!(json["counts"]["id"], 5, "{json}");
        assert_eq!(json["counts"]["decision"], 0, "{json}");
        assert_eq!(json["id_changed"], true);
        let change = &json["differences"][0]["id_changes"][0];
        assert_eq!(change["old"], baseline_event_id(&first_token(&demo())));
        assert_ne!(change["new"], change["old"]);
    }
}

/// The token of a fixture's first event.
fn first_token(fixture: &str) -> Value {
    std::fs::read_to_string(fixture)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v.get("operationType").is_some())
        .unwrap()["_id"]
        .clone()
}

#[test]
fn a_shaping_policy_changes_every_shape_and_no_id() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let cases = workspace().join("guest/default/cases/every-operation");
    let (code, json) = diff_json(
        &default,
        handoff_test_policies::DOMAIN_EVENTS,
        &[cases.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["counts"]["id"], 0, "{json}");
    assert_eq!(json["counts"]["shape"], json["events"], "{json}");
    let shape = json["differences"][0]["shape"].as_array().unwrap();
    assert!(
        shape
            .iter()
            .any(|c| c["path"] == "eventType" && c["old"].is_null() && c["new"] == "string"),
        "{json}"
    );
    // The raw event is the same on both sides: not a change.
    assert!(!shape.iter().any(|c| c["path"] == "event"), "{json}");
}

/// The JUnit testcases: (name, failure type if any).
fn junit_cases(xml: &str) -> Vec<(String, Option<String>)> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut cases: Vec<(String, Option<String>)> = Vec::new();
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"testcase" => {
                let name = e.try_get_attribute("name").unwrap().unwrap();
                cases.push((name.unescape_value().unwrap().into_owned(), None));
            }
            Event::Start(e) if e.name().as_ref() == b"failure" => {
                let kind = e.try_get_attribute("type").unwrap().unwrap();
                cases.last_mut().unwrap().1 = Some(kind.unescape_value().unwrap().into_owned());
            }
            Event::Eof => break,
            _ => {}
        }
    }
    cases
}

#[test]
fn quarantining_poison_events_is_a_decision_change() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let case = workspace().join("guest/quarantine/cases/unsupported-schema-versions");
    let case = case.to_str().unwrap();
    // `supported` goes to the quarantine policy, which reads it, not to the default.
    let params = ["--policy-param", "supported=1,2"];
    let quarantine = handoff_test_policies::QUARANTINE;
    let (code, json) = diff_json(&default, quarantine, &[&params[..], &[case]].concat());
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["counts"]["decision"], 3, "{json}");
    assert_eq!(json["counts"]["id"], 0, "{json}");
    for difference in json["differences"].as_array().unwrap() {
        assert_eq!(difference["old"]["decision"], "handed_off");
        assert_eq!(difference["new"]["decision"], "quarantined");
    }
    let args = [
        "diff", "--old", &default, "--new", quarantine, "--format", "junit", case,
    ];
    let output = policy(&[&args[..], &params[..]].concat());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let cases = junit_cases(&stdout(&output));
    assert_eq!(cases.len(), 6, "{cases:?}");
    let failed: Vec<_> = cases
        .iter()
        .filter_map(|(_, kind)| kind.as_deref())
        .collect();
    assert_eq!(failed, ["decision-change,records-removed"; 3], "{cases:?}");
    // A parameter neither policy reads is refused.
    let output = policy(&[
        "diff",
        "--old",
        &default,
        "--new",
        quarantine,
        case,
        "--policy-param",
        "nope=1",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("neither policy reads"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn bad_input_is_refused_with_nothing_run_or_written() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let not_a_component = s.path("policy.wasm");
    std::fs::write(&not_a_component, b"not a component").unwrap();
    let not_a_component = not_a_component.to_str().unwrap();
    let missing = s.path("missing.jsonl");
    let cache = s.path("cache");
    std::fs::create_dir(&cache).unwrap();
    for (args, needle) in [
        (
            vec!["--old", &default, "--new", not_a_component, &demo()],
            "not a WebAssembly component",
        ),
        (
            vec!["--old", not_a_component, "--new", &default, &demo()],
            "not a WebAssembly component",
        ),
        (
            vec![
                "--old",
                &default,
                "--new",
                &default,
                missing.to_str().unwrap(),
            ],
            "cannot read fixture",
        ),
        (
            vec![
                "--old",
                &default,
                "--new",
                &default,
                "--policy-param",
                "x",
                &demo(),
            ],
            "KEY=VALUE",
        ),
    ] {
        let output = handoff()
            .args(["policy", "diff"])
            .args(&args)
            .env(support::env_names::CACHE_DIR, &cache)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).contains(needle), "{}", stderr(&output));
        assert!(output.stdout.is_empty(), "{}", stdout(&output));
        assert_eq!(
            std::fs::read_dir(&cache).unwrap().count(),
            0,
            "{args:?} wrote the cache"
        );
    }
}

#[test]
fn a_policy_that_fails_fails_the_diff() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let output = policy(&[
        "diff",
        "--old",
        &default,
        "--new",
        handoff_test_policies::TRAP,
        &demo(),
    ]);
    assert_eq!(output.status.code(), Some(9), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the new policy"),
        "{}",
        stderr(&output)
    );
    assert!(output.stdout.is_empty(), "{}", stdout(&output));
}

#[test]
fn check_against_diffs_over_the_shipped_sample() {
    let s = Scratch::new();
    let default = default_policy(&s);
    let output = policy(&["check", &default, "--against", &default]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    let verdict = text
        .find("verdict:   this host runs it")
        .expect("the check first");
    let diff = text.find("diff against").expect("then the diff");
    assert!(verdict < diff, "{text}");
    assert!(text.contains("differ:  0 of 3 events"), "{text}");
    let prefixed = handoff_test_policies::PREFIXED_IDS;
    let output = policy(&["check", prefixed, "--against", &default]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(16), "{text}{}", stderr(&output));
    assert!(
        text.contains("differ:  3 of 3 events: 3 ID changed"),
        "{text}"
    );
    let output = policy(&[
        "check",
        prefixed,
        "--against",
        &default,
        "--allow-id-change",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// Commands that write, none of which a diff from the outbox may send.
const WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "bulkWrite",
    "findAndModify",
    "commitTransaction",
    "abortTransaction",
    "create",
    "createIndexes",
    "drop",
    "dropDatabase",
];

#[test]
fn from_outbox_decides_the_stored_events_without_a_write() {
    let live = Live::with_config(mongo_sim::Config::default());
    let s = Scratch::new();
    let default = default_policy(&s);
    let domain_events = handoff_test_policies::DOMAIN_EVENTS;
    let shaped = [
        "--consumer-id",
        "shaped",
        "--policy",
        domain_events,
        "--outbox-keep-event",
        "false",
    ];
    live.start_consumer();
    ok(&live.run(&shaped));
    live.insert(0..3);
    assert_eq!(ok(&live.run(&[]))["events_handed_off"], 3);
    assert_eq!(ok(&live.run(&shaped))["events_handed_off"], 3);

    live.server().clear_received_commands();
    let args = [
        "policy",
        "diff",
        "--old",
        &default,
        "--new",
        handoff_test_policies::PREFIXED_IDS,
    ];
    let output = live.operator(&[&args[..], &["--from-outbox", "--format", "json"]].concat());
    assert_eq!(output.status.code(), Some(16), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["events"], 3, "{json}");
    assert_eq!(json["counts"]["id"], 3, "{json}");
    let stored: Vec<String> = live
        .outbox()
        .iter()
        .filter_map(|r| {
            r.get_str("_id")
                .ok()?
                .strip_prefix("orders-to-outbox/")
                .map(str::to_string)
        })
        .collect();
    let old_ids: Vec<&str> = json["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["old"]["ids"][0].as_str().unwrap())
        .collect();
    assert_eq!(old_ids, stored[..3], "{json}");
    let sent = live.commands_from_handoff();
    assert!(sent.iter().any(|c| c == "find"), "{sent:?}");
    assert!(
        !sent.iter().any(|c| WRITES.contains(&c.as_str())),
        "{sent:?}"
    );

    // Against itself, the most recent record only.
    let output = live.operator(&[
        "policy",
        "diff",
        "--old",
        &default,
        "--new",
        &default,
        "--from-outbox",
        "--limit",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("differ:  0 of 1 events"),
        "{}",
        stdout(&output)
    );
    // Nothing from a time after the last record.
    let output = live.operator(&[&args[..], &["--from-outbox", "--since", "4000000000"]].concat());
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("holds no record"),
        "{}",
        stderr(&output)
    );
    // A consumer whose records keep no event: refused, and said why.
    let output =
        live.operator(&[&args[..], &["--from-outbox", "--consumer-id", "shaped"]].concat());
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("does not store the change events")
            && stderr(&output).contains("--outbox-keep-event false"),
        "{}",
        stderr(&output)
    );
    assert!(output.stdout.is_empty());
    let sent = live.commands_from_handoff();
    assert!(
        !sent.iter().any(|c| WRITES.contains(&c.as_str())),
        "{sent:?}"
    );
}

/// The README's upgrade block, run as written in an empty folder: the diff passes and the
/// candidate is deployed.
#[test]
fn the_readme_upgrade_block_runs_as_written() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let block = readme
        .split_once("<!-- policy-diff: upgrade -->\n```sh\n")
        .expect("the README's upgrade block")
        .1;
    let script = &block[..block.find("\n```").expect("the block's end")];
    let s = Scratch::new();
    let bin = Path::new(env!("CARGO_BIN_EXE_handoff")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut sh = Command::new("sh");
    for (key, value) in handoff().get_envs() {
        match value {
            Some(value) => sh.env(key, value),
            None => sh.env_remove(key),
        };
    }
    let output = sh
        .args(["-c", script])
        .env("PATH", path)
        .current_dir(s.dir.path())
        .output()
        .unwrap();
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}{}", stderr(&output));
    assert!(text.contains("2 decision changed"), "{text}");
    let project = s.path("shop-policy");
    assert_eq!(
        std::fs::read(project.join("handoff/policy.wasm")).expect("deployed"),
        std::fs::read(project.join("candidate.wasm")).unwrap()
    );
}
