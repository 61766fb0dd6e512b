//! Hostile policies beyond those of the policies suite: oversized outbox IDs, decisions that move
//! the checkpoint backwards, reaching for host files and environment, and hoarding events without
//! committing them. Each is stopped or refused with a clear error and exit code 9, nothing it
//! attempted is committed, and the default policy then continues on the same state as if the
//! hostile run had never happened.

use crate::support;

use std::path::PathBuf;

use serde_json::Value;
use support::live::*;
use support::*;

/// The canonical text of a token built by `support::token`.
fn token_text(seq: u32) -> String {
    format!(
        "{{\"_data\": \"{}\"}}",
        token(seq)["_data"].as_str().unwrap()
    )
}

/// A recorded stream of `n` events (inserts, updates and deletes), ending its batch.
fn stream(s: &Scratch, name: &str, n: u32) -> PathBuf {
    let ops = ["insert", "update", "delete"];
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=n).map(|i| event(i, ops[i as usize % 3])));
    lines.push(batch_end(n));
    s.fixture(name, &lines)
}

fn hostile(
    fixture: &std::path::Path,
    s: &Scratch,
    policy: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec!["--policy", policy];
    args.extend_from_slice(extra);
    replay(fixture, &s.state(), &args)
}

/// The default policy continues on the state: every event of the stream ends in the outbox once,
/// in order, and the checkpoint at the stream's end.
fn default_policy_finishes(s: &Scratch, fixture: &std::path::Path, n: u32) {
    while ok(&replay(fixture, &s.state(), &["--max-events", "500"]))["events_handed_off"] != 0 {}
    let (checkpoint, outbox) = inspect(&s.state());
    let expected: Vec<String> = (1..=n).map(|i| baseline_event_id(&token(i))).collect();
    assert_eq!(outbox_ids(&outbox), expected);
    assert_eq!(checkpoint["token"], batch_end(n)["$postBatchResumeToken"]);
}

#[test]
fn an_outbox_id_longer_than_200_characters_is_refused() {
    let s = Scratch::new();
    let fixture = stream(&s, "three.jsonl", 3);
    for len in ["201", "100000"] {
        fails(
            &hostile(
                &fixture,
                &s,
                handoff_test_policies::HUGE_ID,
                &["--policy-param", &format!("len={len}")],
            ),
            9,
            "ID must be 1-200 characters from [A-Za-z0-9._:-]",
        );
        let (checkpoint, outbox) = inspect(&s.state());
        assert!(outbox.is_empty());
        assert_eq!(checkpoint["token"], Value::Null);
    }
    default_policy_finishes(&s, &fixture, 3);
    // 200 characters is the limit, not past it.
    let s = Scratch::new();
    let out = ok(&hostile(
        &fixture,
        &s,
        handoff_test_policies::HUGE_ID,
        &["--policy-param", "len=200"],
    ));
    assert_eq!(out["events_handed_off"], 1);
    assert_eq!(outbox_ids(&inspect(&s.state()).1), vec!["x".repeat(200)]);
}

#[test]
fn committing_an_old_token_again_is_refused() {
    let s = Scratch::new();
    ok(&replay(&stream(&s, "three.jsonl", 3), &s.state(), &[]));
    let before = inspect(&s.state());
    // The stream goes on after the checkpoint (the first batch's end) with two more events.
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=3).map(|i| event(i, ["insert", "update", "delete"][i as usize % 3])));
    lines.push(batch_end(3));
    lines.extend([event(4, "update"), event(5, "delete"), batch_end(5)]);
    let longer = s.fixture("five.jsonl", &lines);
    let old = format!("old={}", token_text(2));
    let output = hostile(
        &longer,
        &s,
        handoff_test_policies::MOVE_BACKWARDS,
        &["--policy-param", "how=commit", "--policy-param", &old],
    );
    fails(
        &output,
        9,
        "policy decision rejected: the token was not delivered by the stream",
    );
    assert_eq!(inspect(&s.state()), before);
    default_policy_finishes(&s, &longer, 5);
}

#[test]
fn saving_an_old_token_as_the_watermark_is_refused() {
    let s = Scratch::new();
    ok(&replay(&stream(&s, "three.jsonl", 3), &s.state(), &[]));
    let before = inspect(&s.state());
    // An idle batch after the checkpoint: the stream's watermark moves on without an event.
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=3).map(|i| event(i, "insert")));
    lines.push(batch_end(3));
    lines.push(batch_end(4));
    let idle = s.fixture("idle.jsonl", &lines);
    for old in [token_text(2), token_text(1)] {
        let output = hostile(
            &idle,
            &s,
            handoff_test_policies::MOVE_BACKWARDS,
            &[
                "--policy-param",
                "how=watermark",
                "--policy-param",
                &format!("old={old}"),
            ],
        );
        fails(
            &output,
            9,
            "policy decision rejected: the token is not the stream's current watermark",
        );
        assert_eq!(inspect(&s.state()), before);
    }
    // The default policy saves the real watermark.
    ok(&replay(&idle, &s.state(), &[]));
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 3);
    assert_eq!(checkpoint["token"], batch_end(4)["$postBatchResumeToken"]);
}

#[test]
fn committing_a_committed_event_a_second_time_is_refused() {
    let s = Scratch::new();
    let fixture = stream(&s, "three.jsonl", 3);
    let output = hostile(
        &fixture,
        &s,
        handoff_test_policies::MOVE_BACKWARDS,
        &["--policy-param", "how=recommit"],
    );
    fails(&output, 9, "policy decision rejected");
    // The first commit was legitimate and stands; the second wrote nothing.
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox_ids(&outbox), vec!["first".to_string()]);
    assert_eq!(checkpoint["token"], token(1));
    // The default policy continues after it: events 2 and 3 follow, none is repeated.
    ok(&replay(&fixture, &s.state(), &[]));
    let (checkpoint, outbox) = inspect(&s.state());
    let mut expected = vec!["first".to_string()];
    expected.extend((2..=3).map(|i| baseline_event_id(&token(i))));
    assert_eq!(outbox_ids(&outbox), expected);
    assert_eq!(checkpoint["token"], batch_end(3)["$postBatchResumeToken"]);
}

/// Stdout and stderr of a run, together.
fn all_output(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_policy_reading_host_files_finds_none() {
    let s = Scratch::new();
    let fixture = stream(&s, "three.jsonl", 3);
    let secret_dir = tempfile::tempdir().unwrap();
    let canary = "file-canary-5b1e0c7d";
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, canary).unwrap();
    std::fs::write(secret_dir.path().join("listed-canary-9e2f"), "").unwrap();
    let path = format!("path={}", secret.display());
    for extra in [&["--policy-param", path.as_str()][..], &[][..]] {
        let output = hostile(&fixture, &s, handoff_test_policies::READ_FILE, extra);
        fails(&output, 9, "no file access: the sandbox granted no files");
        let all = all_output(&output);
        assert!(
            !all.contains(canary) && !all.contains("listed-canary"),
            "{all}"
        );
        let (checkpoint, outbox) = inspect(&s.state());
        assert!(outbox.is_empty(), "{outbox:?}");
        assert_eq!(checkpoint["token"], Value::Null);
    }
    default_policy_finishes(&s, &fixture, 3);
}

#[test]
fn a_policy_reading_the_environment_gets_nothing() {
    let s = Scratch::new();
    let fixture = stream(&s, "three.jsonl", 3);
    let canary = "env-canary-0c4d7a19";
    let output = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::READ_ENV])
        .env("HANDOFF_TEST_SECRET", canary)
        .output()
        .unwrap();
    fails(&output, 9, "no environment: 0 variables, 0 arguments");
    assert!(!all_output(&output).contains(canary));
    let (checkpoint, outbox) = inspect(&s.state());
    assert!(outbox.is_empty());
    assert_eq!(checkpoint["token"], Value::Null);
    default_policy_finishes(&s, &fixture, 3);
}

#[test]
fn a_policy_that_never_commits_what_it_reads_is_stopped_at_max_events() {
    let s = Scratch::new();
    let fixture = stream(&s, "many.jsonl", 1005);
    // The host itself enforces the run's max_events: reading one more is refused.
    let output = hostile(&fixture, &s, handoff_test_policies::HOARD, &[]);
    fails(
        &output,
        9,
        "policy decision rejected: the run already read max_events = 50 events",
    );
    let output = hostile(
        &fixture,
        &s,
        handoff_test_policies::HOARD,
        &["--max-events", "500"],
    );
    fails(
        &output,
        9,
        "policy decision rejected: the run already read max_events = 500 events",
    );
    let (checkpoint, outbox) = inspect(&s.state());
    assert!(outbox.is_empty());
    assert_eq!(checkpoint["token"], Value::Null);
    // The host and the state stay healthy: the default policy hands off all 1,005 events.
    default_policy_finishes(&s, &fixture, 1005);
}

#[test]
fn a_hostile_policy_against_mongodb_leaves_the_deployment_healthy() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..4);
    let before = live.position();
    for (policy, extra, needle) in [
        (
            handoff_test_policies::HUGE_ID,
            vec![],
            "ID must be 1-200 characters",
        ),
        (
            handoff_test_policies::FORGED_TOKEN,
            vec![],
            "a consumer with a saved token cannot start from now",
        ),
        (
            handoff_test_policies::READ_ENV,
            vec![],
            "no environment: 0 variables, 0 arguments",
        ),
        (
            handoff_test_policies::MOVE_BACKWARDS,
            vec![
                "--policy-param",
                "how=watermark",
                "--policy-param",
                "old={\"_data\": \"82\"}",
            ],
            "policy decision rejected",
        ),
    ] {
        let mut args = vec!["--policy", policy];
        args.extend(extra);
        fails(&live.run(&args), 9, needle);
        assert_eq!(live.position(), before);
        assert_eq!(live.outbox_len(), 0);
    }
    let out = ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 4);
    let stream = live.events_after(&start);
    assert_eq!(
        outbox_event_ids(&live.outbox()),
        stream.iter().map(event_id).collect::<Vec<_>>()
    );
    assert_checkpoint_at_end(&live, stream.last().unwrap().get_document("_id").unwrap());
}

/// A policy-shaped record that breaks a rule of the contract is refused with its reason (exit 9)
/// and nothing is written; a well-formed one is stored with the fields the policy chose.
#[test]
fn shaped_records_breaking_the_contract_are_refused() {
    let s = Scratch::new();
    let fixture = stream(&s, "three.jsonl", 3);
    for (attack, message) in [
        ("dollar-key", "the payload holds a key starting with `$`"),
        ("nul-key", "the payload holds a key with a NUL character"),
        (
            "top-level-id",
            "the payload may not hold an `_id` at its top level",
        ),
        ("event-type", "an eventType must be 1-100 characters"),
        ("aggregate-document", "the aggregateId must be one value"),
        ("not-json", "the payload is not JSON"),
        ("payload-array", "the payload must be a document"),
        ("oversized-payload", "the payload is over 4194304 bytes"),
        (
            "many-values",
            "the payloads of one commit hold more than 1048576 values",
        ),
    ] {
        fails(
            &hostile(
                &fixture,
                &s,
                handoff_test_policies::HOSTILE_RECORDS,
                &["--policy-param", &format!("attack={attack}")],
            ),
            9,
            message,
        );
        let (checkpoint, outbox) = inspect(&s.state());
        assert!(outbox.is_empty(), "{attack}");
        assert_eq!(checkpoint["token"], Value::Null, "{attack}");
    }
    let out = ok(&hostile(
        &fixture,
        &s,
        handoff_test_policies::HOSTILE_RECORDS,
        &["--policy-param", "attack=valid"],
    ));
    assert_eq!(out["events_handed_off"], 1);
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 1);
    let record = &outbox[0];
    assert_eq!(record["_id"], "orders-to-outbox/shaped-1");
    assert_eq!(record["eventType"], "OrderCreated");
    assert_eq!(record["schemaVersion"], 1);
    assert_eq!(record["aggregateId"], "o-1");
    assert_eq!(record["aggregateVersion"], 7);
    assert_eq!(record["payload"]["total"], 5);
    // Extended JSON in the payload is stored as its BSON type.
    assert!(record["payload"]["at"]["$date"].is_string(), "{record}");
    assert_eq!(record["token"], token(1));
    assert_eq!(record["event"]["_id"], token(1));
    assert_eq!(checkpoint["token"], token(1));
}
