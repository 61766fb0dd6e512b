//! Replay scenarios: the default policy over recorded streams, run as the engine runs `handoff`.

use crate::support;

use serde_json::{Value, json};
use support::*;

fn demo_lines() -> Vec<Value> {
    vec![
        deployment(REPLICA_SET_ID),
        event(1, "insert"),
        event(2, "update"),
        batch_end(2),
        event(3, "replace"),
        event(4, "delete"),
        batch_end(5),
    ]
}

#[test]
fn fresh_consumer_hands_off_every_operation_in_order() {
    let s = Scratch::new();
    let fixture = s.fixture("demo.jsonl", &demo_lines());
    let out = ok(&replay(&fixture, &s.state(), &[]));
    assert_eq!(out["status"], "HANDED_OFF");
    assert_eq!(out["events_handed_off"], 4);
    assert_eq!(out["consumer_id"], "orders-to-outbox");
    assert_eq!(out["last_event_id"], baseline_event_id(&token(4)));
    assert_eq!(out["policy_sha256"].as_str().map(str::len), Some(64));

    let (checkpoint, outbox) = inspect(&s.state());
    let expected: Vec<String> = (1..=4).map(|i| baseline_event_id(&token(i))).collect();
    assert_eq!(outbox_ids(&outbox), expected);
    for (record, seq) in outbox.iter().zip(1..) {
        assert_eq!(record["consumer"], "orders-to-outbox");
        assert_eq!(record["source"], SOURCE);
        // The event is stored exactly as recorded, types included (qty is an Int64).
        assert_eq!(record["event"]["_id"], token(seq));
    }
    assert_eq!(outbox[0]["event"]["fullDocument"]["qty"], json!(1));
    assert_eq!(outbox[2]["event"]["operationType"], "replace");
    // Caught up: the idle watermark (the last post-batch token) is saved with resumeAfter.
    assert_eq!(checkpoint["_id"], "orders-to-outbox");
    assert_eq!(checkpoint["token"], batch_end(5)["$postBatchResumeToken"]);
    assert_eq!(checkpoint["mode"], "resumeAfter");
    assert_eq!(checkpoint["replicaSetId"], REPLICA_SET_ID);
}

#[test]
fn a_second_run_resumes_after_the_checkpoint_and_hands_off_only_new_events() {
    let s = Scratch::new();
    let first = s.fixture(
        "first.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            event(2, "insert"),
        ],
    );
    assert_eq!(ok(&replay(&first, &s.state(), &[]))["events_handed_off"], 2);
    // The same history, grown by two events: the next run sees only those.
    let grown = s.fixture(
        "grown.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            event(2, "insert"),
            event(3, "update"),
            event(4, "delete"),
        ],
    );
    let out = ok(&replay(&grown, &s.state(), &[]));
    assert_eq!(out["events_handed_off"], 2);
    let (_, outbox) = inspect(&s.state());
    let expected: Vec<String> = (1..=4).map(|i| baseline_event_id(&token(i))).collect();
    assert_eq!(outbox_ids(&outbox), expected);
    // Nothing new: idle, nothing written twice.
    let out = ok(&replay(&grown, &s.state(), &[]));
    assert_eq!(
        (out["status"].clone(), out["events_handed_off"].clone()),
        (json!("IDLE"), json!(0))
    );
    assert_eq!(out["last_event_id"], "");
    assert_eq!(inspect(&s.state()).1.len(), 4);
}

#[test]
fn max_events_caps_a_run_and_leaves_no_watermark_past_it() {
    let s = Scratch::new();
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=5).map(|i| event(i, "insert")));
    lines.push(batch_end(5));
    let fixture = s.fixture("five.jsonl", &lines);
    let out = ok(&replay(&fixture, &s.state(), &["--max-events", "2"]));
    assert_eq!(out["events_handed_off"], 2);
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 2);
    assert_eq!(checkpoint["token"], token(2));
    let out = ok(&replay(&fixture, &s.state(), &["--max-events", "2"]));
    assert_eq!(out["last_event_id"], baseline_event_id(&token(4)));
    let out = ok(&replay(&fixture, &s.state(), &["--max-events", "2"]));
    assert_eq!(out["events_handed_off"], 1);
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 5);
    assert_eq!(checkpoint["token"], batch_end(5)["$postBatchResumeToken"]);
}

#[test]
fn the_environment_variables_of_the_baseline_are_read() {
    let s = Scratch::new();
    let fixture = s.fixture("one.jsonl", &[event(1, "insert"), event(2, "insert")]);
    let output = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .env("SOURCE_DATABASE", "shop")
        .env("SOURCE_COLLECTION", "carts")
        .env("CONSUMER_ID", "carts-out")
        .env("CHECKPOINT_COLLECTION", "cp")
        .env("OUTBOX_COLLECTION", "ob")
        .env("MAX_EVENTS", "1")
        .env("MAX_WAIT_SECONDS", "1")
        .output()
        .unwrap();
    let out = ok(&output);
    assert_eq!(
        (out["consumer_id"].clone(), out["events_handed_off"].clone()),
        (json!("carts-out"), json!(1))
    );
    let dump = handoff()
        .args([
            "inspect",
            "--consumer-id",
            "carts-out",
            "--checkpoint-collection",
            "cp",
            "--outbox-collection",
            "ob",
            "--state",
        ])
        .arg(s.state())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("\"source\":\"shop.carts\""), "{text}");
    assert_eq!(text.lines().count(), 2);
    // A consumer the store does not know is refused with the near names, not listed as empty.
    let inspect_as = |consumer: &str, checkpoints: &str| {
        handoff()
            .args(["inspect", "--consumer-id", consumer])
            .args(["--checkpoint-collection", checkpoints, "--state"])
            .arg(s.state())
            .output()
            .unwrap()
    };
    refused(&inspect_as("carts-ot", "cp"), 2, "did you mean carts-out?");
    refused(&inspect_as("zzz", "cp"), 2, "cp holds carts-out");
    refused(
        &inspect_as("carts-out", "checkpoints"),
        2,
        "checkpoints holds no consumer",
    );
}

#[test]
fn an_idle_stream_saves_its_watermark() {
    let s = Scratch::new();
    let fixture = s.fixture("idle.jsonl", &[deployment(REPLICA_SET_ID), batch_end(7)]);
    let out = ok(&replay(&fixture, &s.state(), &[]));
    assert_eq!(out["status"], "IDLE");
    let (checkpoint, outbox) = inspect(&s.state());
    assert!(outbox.is_empty());
    assert_eq!(checkpoint["token"], batch_end(7)["$postBatchResumeToken"]);
}

#[test]
fn no_token_at_all_fails_instead_of_leaving_a_gap() {
    let s = Scratch::new();
    let fixture = s.fixture("empty.jsonl", &[deployment(REPLICA_SET_ID)]);
    fails(
        &replay(&fixture, &s.state(), &[]),
        9,
        "refusing to leave an uncheckpointed gap",
    );
    assert_eq!(inspect(&s.state()).0["token"], Value::Null);
}

#[test]
fn invalidate_saves_start_after_and_the_next_run_continues_on_the_new_collection() {
    let s = Scratch::new();
    let lines = vec![
        deployment(REPLICA_SET_ID),
        event(1, "insert"),
        event(2, "drop"),
        event(3, "invalidate"),
        // After the collection is recreated, a startAfter stream sees its new events.
        event(4, "insert"),
        batch_end(4),
    ];
    let fixture = s.fixture("invalidate.jsonl", &lines);
    let out = ok(&replay(&fixture, &s.state(), &[]));
    assert_eq!(out["status"], "INVALIDATED");
    assert_eq!(out["events_handed_off"], 2);
    // As the baseline reports it: the ID of the last committed event, the invalidate itself.
    assert_eq!(out["last_event_id"], baseline_event_id(&token(3)));
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(checkpoint["token"], token(3));
    assert_eq!(checkpoint["mode"], "startAfter");
    // The invalidate itself has no outbox record; the drop has one.
    assert_eq!(
        outbox_ids(&outbox),
        vec![baseline_event_id(&token(1)), baseline_event_id(&token(2))]
    );

    let out = ok(&replay(&fixture, &s.state(), &[]));
    assert_eq!(out["status"], "HANDED_OFF");
    assert_eq!(out["last_event_id"], baseline_event_id(&token(4)));
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 3);
    assert_eq!(checkpoint["mode"], "resumeAfter");
}

fn store(s: &Scratch) -> handoff::backend::redb_store::RedbStore {
    handoff::backend::redb_store::RedbStore::open(
        &s.state(),
        &handoff::domain::Collections {
            checkpoints: "kestra_change_checkpoints".into(),
            outbox: "kestra_change_outbox".into(),
            quarantine: "kestra_change_quarantine".into(),
        },
        std::time::Duration::from_secs(5),
    )
    .expect("open state")
}

fn bson_doc(value: &Value) -> bson::Document {
    bson::Document::try_from(value.as_object().expect("object").clone()).expect("extended json")
}

#[test]
fn resume_after_an_invalidate_token_fails_with_invalid_token() {
    use handoff::domain::{CheckpointStore, Commit, Consumer, Mode};
    let s = Scratch::new();
    let fixture = s.fixture(
        "inv.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            event(2, "invalidate"),
            event(3, "insert"),
        ],
    );
    assert_eq!(
        ok(&replay(&fixture, &s.state(), &[]))["status"],
        "INVALIDATED"
    );
    // A stale or hand-edited checkpoint: the invalidate token saved with resumeAfter.
    {
        let consumer = Consumer {
            consumer: "orders-to-outbox".into(),
            source: SOURCE.into(),
        };
        let saved = bson_doc(&token(2));
        store(&s)
            .commit(&Commit {
                consumer: &consumer,
                expected: Some(&saved),
                next: &saved,
                mode: Mode::ResumeAfter,
                outbox: vec![],
                quarantine: vec![],
                lease: None,
                policy: None,
            })
            .expect("rewrite mode");
    }
    let before = inspect(&s.state());
    let output = replay(&fixture, &s.state(), &[]);
    fails(&output, 7, "InvalidResumeToken (code 260)");
    assert!(stderr(&output).contains("reconcile from a verified snapshot before resetting"));
    assert_eq!(inspect(&s.state()), before);
}

#[test]
fn history_lost_fails_with_the_checkpoint_unchanged() {
    let s = Scratch::new();
    let first = s.fixture(
        "first.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert")],
    );
    ok(&replay(&first, &s.state(), &[]));
    let before = inspect(&s.state());
    // The retained history no longer holds token 1.
    let rolled = s.fixture(
        "rolled.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(5, "insert"),
            event(6, "insert"),
        ],
    );
    let output = replay(&rolled, &s.state(), &[]);
    fails(&output, 6, "ChangeStreamHistoryLost (code 286)");
    assert!(stderr(&output).contains("Check MongoDB and the oplog window"));
    assert_eq!(inspect(&s.state()), before);
    // The failed resume is counted by its class in the metrics line.
    assert_eq!(metric(&output, "resume_attempts_history_lost"), 1);
    assert_eq!(metric(&output, "resume_attempts_ok"), 0);

    // The server failing the stream mid-run stops it there; what was committed before stays.
    let s = Scratch::new();
    let mid = s.fixture(
        "mid.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            json!({"$error": {"code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "Resume of change stream was not possible"}}),
            event(2, "insert"),
        ],
    );
    fails(&replay(&mid, &s.state(), &[]), 6, "code 286");
    let (checkpoint, outbox) = inspect(&s.state());
    assert_eq!(outbox.len(), 1);
    assert_eq!(checkpoint["token"], token(1));

    // A fatal stream error has its own class.
    let s = Scratch::new();
    let fatal = s.fixture(
        "fatal.jsonl",
        &[json!({"$error": {"code": 280, "codeName": "ChangeStreamFatalError", "errmsg": "cannot resume"}})],
    );
    fails(&replay(&fatal, &s.state(), &[]), 8, "code 280");
}

#[test]
fn a_checkpoint_from_another_source_or_replica_set_is_refused() {
    let s = Scratch::new();
    let plain = s.fixture("plain.jsonl", &[event(1, "insert")]);
    ok(&replay(&plain, &s.state(), &[]));
    let before = inspect(&s.state());
    fails(
        &replay(&plain, &s.state(), &["--collection", "customers"]),
        4,
        "Consumer checkpoint belongs to another source; use the original source or a new consumer_id",
    );
    assert_eq!(inspect(&s.state()), before);

    let s = Scratch::new();
    let ours = s.fixture(
        "ours.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert")],
    );
    ok(&replay(&ours, &s.state(), &[]));
    let before = inspect(&s.state());
    let theirs = s.fixture(
        "theirs.jsonl",
        &[deployment("6740a1b2c3d4e5f6ffffffff"), event(1, "insert")],
    );
    fails(
        &replay(&theirs, &s.state(), &[]),
        4,
        "Consumer checkpoint belongs to another replica set; reconcile from a verified snapshot before reset",
    );
    assert_eq!(inspect(&s.state()), before);
}

#[test]
fn a_malformed_checkpoint_is_refused() {
    use handoff::domain::CheckpointStore;
    for (key, value) in [
        ("token", bson::Bson::String("826AE70DA0".into())),
        ("mode", bson::Bson::String("startAtOperationTime".into())),
        ("token", bson::Bson::Int64(7)),
    ] {
        let s = Scratch::new();
        let mut bad =
            handoff::domain::checkpoint::initial("orders-to-outbox", SOURCE, REPLICA_SET_ID);
        bad.insert(key, value);
        store(&s)
            .ensure_checkpoint("orders-to-outbox", bad)
            .expect("seed a bad checkpoint");
        let fixture = s.fixture("f.jsonl", &[deployment(REPLICA_SET_ID), event(1, "insert")]);
        fails(
            &replay(&fixture, &s.state(), &[]),
            5,
            "Checkpoint is malformed; restore a verified token before retrying",
        );
        assert!(inspect(&s.state()).1.is_empty());
    }
}

#[test]
fn bad_inputs_are_refused_before_anything_is_written() {
    let s = Scratch::new();
    let fixture = s.fixture("f.jsonl", &[deployment(REPLICA_SET_ID), event(1, "insert")]);
    for (args, needle) in [
        (
            vec!["--max-events", "0"],
            "max_events must be 1-500 and max_wait_seconds must be 1-30",
        ),
        (vec!["--max-events", "501"], "max_events must be 1-500"),
        (
            vec!["--max-wait-seconds", "31"],
            "max_wait_seconds must be 1-30",
        ),
        (vec!["--max-events", "ten"], "MAX_EVENTS must be an integer"),
        (
            vec!["--consumer-id", "9lives"],
            "CONSUMER_ID must contain 1-63 letters",
        ),
        (vec!["--database", "a.b"], "SOURCE_DATABASE must contain"),
        (vec!["--outbox-collection", "orders"], "must be distinct"),
        (
            vec!["--collection", "customers"],
            "the fixture was recorded from change_demo.orders",
        ),
        (vec!["--policy-param", "novalue"], "must be KEY=VALUE"),
        (
            vec!["--policy", "/nonexistent/policy.wasm"],
            "cannot read the policy",
        ),
    ] {
        let output = replay(&fixture, &s.state(), &args);
        fails(&output, 2, needle);
        assert!(!s.state().exists(), "{args:?} created the state store");
    }
    let broken = s.fixture("broken.jsonl", &[event(1, "insert")]);
    std::fs::write(
        &broken,
        "{\"_id\": {\"_data\": \"82\"}, \"operationType\": \"insert\"}\n{not json\n",
    )
    .unwrap();
    fails(
        &replay(&broken, &s.state(), &[]),
        2,
        "fixture line 2: not JSON",
    );
    fails(
        &replay(&s.path("missing.jsonl"), &s.state(), &[]),
        2,
        "cannot read fixture",
    );
    assert!(!s.state().exists());
}

#[test]
fn every_event_id_vector_matches_end_to_end() {
    // The recorded tokens go through the host's canonical text and the policy's hash, across the
    // component boundary, and must give the baseline's outbox IDs.
    let vectors: Value =
        serde_json::from_str(include_str!("fixtures/event-id-vectors.json")).expect("vectors");
    let vectors = vectors.as_array().expect("list");
    let s = Scratch::new();
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    for (i, vector) in vectors.iter().enumerate() {
        let token: Value =
            serde_json::from_str(vector["token_canonical_extjson"].as_str().unwrap()).unwrap();
        let mut e = event(i as u32 + 1, "insert");
        e["_id"] = token;
        lines.push(e);
    }
    let fixture = s.fixture("vectors.jsonl", &lines);
    ok(&replay(&fixture, &s.state(), &[]));
    let (_, outbox) = inspect(&s.state());
    let expected: Vec<String> = vectors
        .iter()
        .map(|v| v["event_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(outbox_ids(&outbox), expected);
}

#[test]
fn a_warm_start_uses_the_artifact_cache_and_survives_a_corrupt_one() {
    let s = Scratch::new();
    let cache = s.path("cache");
    let fixture = s.fixture("f.jsonl", &[deployment(REPLICA_SET_ID), event(1, "insert")]);
    let run = |state: &str| {
        handoff()
            .env("HANDOFF_CACHE_DIR", &cache)
            .arg("replay")
            .arg(&fixture)
            .arg("--state")
            .arg(s.path(state))
            .output()
            .unwrap()
    };
    ok(&run("a.redb"));
    let artifacts: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    let name = artifacts[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.ends_with(".cwasm") && name.len() > 64, "{name}");
    ok(&run("b.redb"));
    std::fs::write(&artifacts[0], b"not an artifact").unwrap();
    ok(&run("c.redb"));
    assert!(
        std::fs::metadata(&artifacts[0]).unwrap().len() > 1000,
        "the corrupt artifact was replaced"
    );
}

#[test]
fn a_state_store_in_missing_folders_is_created_with_them() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    let state = s.path("a/b/c.redb");
    let out = ok(&replay(&fixture, &state, &[]));
    assert_eq!(out["events_handed_off"], 1);
    assert_eq!(inspect(&state).1.len(), 1);
}

#[test]
fn a_refused_policy_creates_no_state_folder() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert")],
    );
    let junk = s.path("junk.wasm");
    std::fs::write(&junk, b"not a component").unwrap();
    let state = s.path("x/y/state.redb");
    let output = replay(&fixture, &state, &["--policy", junk.to_str().unwrap()]);
    fails(&output, 9, "not a WebAssembly component");
    assert!(!s.path("x").exists());
}

/// The embedded store is held by one process at a time, so a run's lease there only records the
/// holder: a run killed after claiming it, before committing anything, leaves no lease behind and
/// the next run hands off at once instead of waiting for the lease to expire.
#[test]
fn a_run_killed_before_its_first_commit_leaves_no_lease_in_the_state_store() {
    use std::io::{BufRead, BufReader};
    let s = Scratch::new();
    let fixture = s.fixture("demo.jsonl", &demo_lines());
    let mut child = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::SPIN_FOREVER])
        .args(["--policy-slice-ms", "60000"])
        .env("HANDOFF_LOG", "handoff::startup=debug")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // The policy's first host call comes after the claim; the policy then computes forever.
    let stderr = child.stderr.take().expect("stderr");
    let called = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("policy called the host"));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert!(called, "the spinning run never reached the policy");

    {
        use handoff::domain::CheckpointStore;
        let dump = store(&s).dump("orders-to-outbox").expect("dump");
        let checkpoint = dump.checkpoint.expect("the checkpoint the run created");
        assert!(dump.outbox.is_empty());
        assert!(
            !checkpoint.contains_key("owner") && !checkpoint.contains_key("leaseUntil"),
            "the killed run's claim outlived it: {checkpoint}"
        );
    }
    let out = ok(&replay(&fixture, &s.state(), &[]));
    assert_eq!(out["status"], "HANDED_OFF");
    assert_eq!(out["events_handed_off"], 4);
}
