//! `handoff deliver --state`: the embedded store's outbox (as `handoff replay` left it)
//! delivered to a real HTTP receiver that verifies every signature, the ledger kept in the same
//! file: every record once in hand-off order, retries under the same `webhook-id`, a record
//! refused for good dead and holding back only its key, replayed audited, a kill after the
//! effect delivering again under the same ID, and bad input delivering nothing.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::receiver::{QUICK, Receiver, Reply, SECRET, secret_bytes};
use support::*;

/// Event `seq` of `op` on the document of event `key`'s key.
fn event_on(seq: u32, op: &str, key: u32) -> Value {
    let mut e = event(seq, op);
    let id = json!({ "$oid": format!("6740a1b2c3d4e5f6{key:08x}") });
    e["documentKey"] = json!({ "_id": id.clone() });
    if e.get("fullDocument").is_some() {
        e["fullDocument"]["_id"] = id;
    }
    e
}

/// Six events of five keys: key 1 inserted (1) and updated (6), the batch ended.
fn six_events() -> Vec<Value> {
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=5).map(|seq| event(seq, "insert")));
    lines.extend([event_on(6, "update", 1), batch_end(6)]);
    lines
}

/// A state store holding the six events' records.
fn handed_off(s: &Scratch) -> Vec<String> {
    let fixture = s.fixture("six.jsonl", &six_events());
    ok(&replay(&fixture, &s.state(), &[]));
    let (_, outbox) = inspect(&s.state());
    let ids = outbox_ids(&outbox);
    assert_eq!(ids.len(), 6);
    ids
}

fn deliver_command(state: &Path, extra: &[&str]) -> Command {
    let mut command = handoff();
    command.arg("deliver").arg("--state").arg(state).args(extra);
    command
}

/// `handoff deliver SUBCOMMAND… --state STATE`.
fn operator(state: &Path, words: &[&str]) -> Output {
    handoff()
        .arg("deliver")
        .args(words)
        .arg("--state")
        .arg(state)
        .output()
        .expect("run handoff deliver")
}

fn to_webhook(state: &Path, receiver: &Receiver, extra: &[&str]) -> Output {
    webhook_command(state, receiver, extra)
        .output()
        .expect("run handoff deliver")
}

fn webhook_command(state: &Path, receiver: &Receiver, extra: &[&str]) -> Command {
    let mut command = deliver_command(
        state,
        &["--sink", &receiver.url(), "--max-wait-seconds", "1"],
    );
    command
        .args(QUICK)
        .args(extra)
        .env("HANDOFF_SINK_SECRET", SECRET);
    command
}

fn assert_code(output: &Output, expected: i32) {
    assert_eq!(
        output.status.code(),
        Some(expected),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        stderr(output)
    );
}

/// `deliver status --state --json`: the one delivery's figures.
fn figures(state: &Path) -> Value {
    let output = operator(state, &["status", "--json"]);
    assert_code(&output, 0);
    let status: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let deliveries = status["deliveries"].as_array().expect("deliveries");
    assert_eq!(deliveries.len(), 1, "{status}");
    deliveries[0].clone()
}

#[test]
fn an_embedded_outbox_reaches_a_webhook_in_order_once_and_a_second_run_sends_nothing() {
    let s = Scratch::new();
    let ids = handed_off(&s);
    let receiver = Receiver::start(&secret_bytes());
    // Every record's first attempt is answered 503: each is retried under its own ID.
    receiver.set_behaviour(|_, nth| {
        if nth == 1 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let output = to_webhook(&s.state(), &receiver, &["--concurrency", "3"]);
    assert_code(&output, 0);
    let report = outputs(&output);
    assert_eq!(report["records_admitted"], 6, "{report}");
    assert_eq!(report["records_delivered"], 6, "{report}");
    assert_eq!(report["records_retried"], 6, "{report}");
    assert_eq!(report["open_records"], 0, "{report}");
    assert!(receiver.all_signatures_valid());
    let counts = receiver.count_by_id();
    for id in &ids {
        assert_eq!(counts.get(id), Some(&2), "{id}: {counts:?}");
    }
    // Key 1's insert was accepted before its update.
    let accepted = receiver.accepted_ids();
    let at = |id: &String| accepted.iter().position(|a| a == id).expect("accepted");
    assert!(at(&ids[0]) < at(&ids[5]), "{accepted:?}");
    let delivery = figures(&s.state());
    assert_eq!(delivery["succeeded"], 6, "{delivery}");
    assert_eq!(delivery["open"], 0, "{delivery}");
    assert!(
        delivery["sink"]
            .as_str()
            .is_some_and(|sink| sink.starts_with("http://127.0.0.1")),
        "{delivery}"
    );
    // The outbox and checkpoint are as the run left them, and a second delivery admits and
    // sends nothing.
    let (_, outbox) = inspect(&s.state());
    assert_eq!(outbox_ids(&outbox), ids);
    let again = to_webhook(&s.state(), &receiver, &[]);
    assert_code(&again, 0);
    assert_eq!(outputs(&again)["records_admitted"], 0);
    assert_eq!(outputs(&again)["records_delivered"], 0);
    assert_eq!(receiver.seen().len(), 12);
    // Records handed off later are admitted after the others, once.
    let mut lines = six_events();
    lines.extend([event(7, "insert"), batch_end(7)]);
    let more = s.fixture("more.jsonl", &lines);
    ok(&replay(&more, &s.state(), &[]));
    receiver.set_behaviour(|_, _| Reply::status(200));
    let third = to_webhook(&s.state(), &receiver, &[]);
    assert_code(&third, 0);
    assert_eq!(outputs(&third)["records_admitted"], 1);
    assert_eq!(outputs(&third)["records_delivered"], 1);
    assert_eq!(receiver.seen().len(), 13);
    assert_eq!(figures(&s.state())["succeeded"], 7);
}

#[test]
fn a_dead_record_holds_back_only_its_key_and_is_replayed_audited_in_the_store() {
    let s = Scratch::new();
    let ids = handed_off(&s);
    let receiver = Receiver::start(&secret_bytes());
    let poison = ids[0].clone();
    let fixed = Arc::new(AtomicBool::new(false));
    let (refused, is_fixed) = (poison.clone(), fixed.clone());
    receiver.set_behaviour(move |seen, _| {
        if seen.id == refused && !is_fixed.load(Ordering::SeqCst) {
            Reply::status(422)
        } else {
            Reply::status(204)
        }
    });
    let output = to_webhook(&s.state(), &receiver, &[]);
    assert_code(&output, 17);
    let report = outputs(&output);
    assert_eq!(report["records_dead"], 1, "{report}");
    assert_eq!(report["records_delivered"], 4, "{report}");
    assert_eq!(report["open_records"], 1, "key 1's update waits: {report}");
    assert!(!receiver.accepted_ids().contains(&ids[5]));
    let listed = operator(&s.state(), &["dead", "list", "--json"]);
    assert_code(&listed, 0);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(listed["count"], 1, "{listed}");
    assert!(
        listed["dead"][0]["record"]
            .as_str()
            .is_some_and(|r| r.ends_with(&poison))
    );
    assert_eq!(listed["dead"][0]["error_class"], "permanent");
    // A replay without a reason is refused and changes nothing.
    let unreasoned = operator(&s.state(), &["dead", "replay", "--all"]);
    assert_code(&unreasoned, 2);
    assert_eq!(figures(&s.state())["dead"], 1);
    fixed.store(true, Ordering::SeqCst);
    let replay = operator(
        &s.state(),
        &["dead", "replay", "--all", "--reason", "receiver fixed"],
    );
    assert_code(&replay, 0);
    assert_eq!(figures(&s.state())["dead"], 0);
    let output = to_webhook(&s.state(), &receiver, &[]);
    assert_code(&output, 0);
    assert_eq!(outputs(&output)["records_delivered"], 2);
    let accepted = receiver.accepted_ids();
    let at = |id: &String| accepted.iter().position(|a| a == id).expect("accepted");
    assert!(at(&poison) < at(&ids[5]), "key 1 in order: {accepted:?}");
    // The replayed entry keeps who replayed it and why; nothing dead is left to discard.
    let discard = operator(
        &s.state(),
        &["dead", "discard", "--id", &poison, "--reason", "x"],
    );
    assert_code(&discard, 16);
    assert_eq!(figures(&s.state())["succeeded"], 6);
}

#[test]
fn a_kill_after_the_effect_delivers_again_under_the_same_id_from_the_store() {
    let s = Scratch::new();
    let ids = handed_off(&s);
    let receiver = Receiver::start(&secret_bytes());
    let victim = Arc::new(AtomicI32::new(0));
    let (pid, target) = (victim.clone(), ids[2].clone());
    receiver.set_behaviour(move |seen, nth| {
        if seen.id == target && nth == 1 {
            let pid = pid.load(Ordering::SeqCst);
            if pid > 0 {
                // SAFETY: a plain kill(2) of the child this test spawned.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        Reply::status(200)
    });
    let mut child = webhook_command(
        &s.state(),
        &receiver,
        &["--concurrency", "1", "--max-in-flight", "1"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn");
    victim.store(child.id() as i32, Ordering::SeqCst);
    assert!(!child.wait().expect("reap").success(), "killed");
    victim.store(0, Ordering::SeqCst);
    // The killed deliverer's claim on record 2 lasts its lease (5 s); then it is tried again.
    std::thread::sleep(Duration::from_secs(5));
    let output = to_webhook(&s.state(), &receiver, &[]);
    assert_code(&output, 0);
    let counts: BTreeMap<String, u32> = receiver.count_by_id();
    assert_eq!(counts.get(&ids[2]), Some(&2), "{counts:?}");
    for id in ids.iter().filter(|id| **id != ids[2]) {
        assert_eq!(counts.get(id), Some(&1), "{id}: {counts:?}");
    }
    assert!(receiver.all_signatures_valid());
    assert_eq!(figures(&s.state())["succeeded"], 6);
}

#[test]
fn bad_input_to_an_embedded_delivery_delivers_nothing_and_writes_nothing() {
    let s = Scratch::new();
    handed_off(&s);
    let receiver = Receiver::start(&secret_bytes());
    let before = std::fs::read(s.state()).expect("the store");
    // A projection commits with its ledger in the deployment: not from an embedded store.
    let projection = deliver_command(&s.state(), &["--sink", "mongodb:orders_view"])
        .output()
        .expect("deliver");
    refused(&projection, 2, "webhook");
    // Following a file only this process can write would wait forever.
    let follow = webhook_command(&s.state(), &receiver, &["--follow"])
        .output()
        .expect("deliver");
    refused(&follow, 2, "--follow");
    // No secret.
    let unsigned = deliver_command(&s.state(), &["--sink", &receiver.url()])
        .output()
        .expect("deliver");
    refused(&unsigned, 2, "secret");
    // No store there.
    let missing = webhook_command(&s.path("missing.redb"), &receiver, &[])
        .output()
        .expect("deliver");
    refused(&missing, 2, "no state store");
    assert!(!s.path("missing.redb").exists(), "no store was made");
    assert!(receiver.seen().is_empty());
    assert_eq!(std::fs::read(s.state()).expect("the store"), before);
}
