//! `handoff deliver` end to end against the test server: a MongoDB projection holds every key
//! at its latest version with each effect exactly once, through SIGKILLs of a following
//! delivery under a steady writer; versions guard replays (an older version never overwrites or
//! revives a newer one); a delivery keeps its sink; bad input delivers nothing. The webhook's
//! scenarios run against a real HTTP receiver that verifies signatures (`support::receiver`).

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use serde_json::Value;
use support::live::*;

const LEDGER: &str = "kestra_change_deliveries";
const VIEW: &str = "orders_view";

/// `handoff deliver EXTRA…` on the test's deployment and database.
fn deliver_command(live: &Live, extra: &[&str]) -> std::process::Command {
    let mut command = live.operator_command(&["deliver"]);
    command
        .args(extra)
        .env_remove("HANDOFF_SINK")
        .env_remove("HANDOFF_SINK_SECRET")
        .env_remove("HANDOFF_DELIVERY");
    command
}

fn deliver(live: &Live, extra: &[&str]) -> Output {
    deliver_command(live, extra)
        .output()
        .expect("run handoff deliver")
}

/// The outputs of a command's `::{"outputs": …}::` line.
fn outputs(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("::{\"outputs\"")
                .map(|_| l.trim_start_matches("::").trim_end_matches("::"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no outputs line\nstdout: {stdout}\nstderr: {}",
                support::stderr(output)
            )
        });
    serde_json::from_str::<Value>(line).expect("outputs JSON")["outputs"].clone()
}

fn assert_code(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        support::stderr(output)
    );
}

/// Every document of `collection` by `_id`.
fn by_id(live: &Live, collection: &str) -> BTreeMap<String, Document> {
    live.records(collection)
        .into_iter()
        .map(|d| (format!("{:?}", d.get("_id")), d))
        .collect()
}

/// The projection's documents without the fields the delivery adds.
fn projection(live: &Live) -> BTreeMap<String, Document> {
    by_id(live, VIEW)
        .into_iter()
        .map(|(k, mut d)| {
            d.remove("_handoffVersion");
            d.remove("_handoffRecord");
            (k, d)
        })
        .collect()
}

/// The ledger's entries (not positions or tombstones), by status.
fn statuses(live: &Live) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for entry in live.records(LEDGER) {
        if let Ok(status) = entry.get_str("status") {
            *counts.entry(status.to_string()).or_default() += 1;
        }
    }
    counts
}

fn update(live: &Live, id: i32, qty: i32) {
    live.wait(
        live.coll("orders")
            .update_one(doc! {"_id": id}, doc! {"$set": {"qty": qty}}),
    )
    .expect("update");
}

fn delete(live: &Live, id: i32) {
    live.wait(live.coll("orders").delete_one(doc! {"_id": id}))
        .expect("delete");
}

/// Hands off everything written so far (bounded runs until one hands off nothing).
fn hand_off(live: &Live) {
    hand_off_with(live, &[]);
}

/// [`hand_off`] with the run's extra arguments (another policy).
fn hand_off_with(live: &Live, extra: &[&str]) {
    for _ in 0..20 {
        let output = live.run(extra);
        assert_code(&output, 0);
        if outputs(&output)["events_handed_off"] == 0 {
            return;
        }
    }
    panic!("the runs never caught up");
}

#[test]
fn a_projection_holds_every_key_at_its_latest_version_each_effect_once() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..30);
    for id in 0..10 {
        update(&live, id, id * 10);
    }
    for id in 20..25 {
        delete(&live, id);
    }
    hand_off(&live);
    let records = live.outbox_len();
    let sink = format!("mongodb:{VIEW}");
    let first = deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]);
    assert_code(&first, 0);
    let report = outputs(&first);
    assert_eq!(report["records_admitted"], records as u64, "{report}");
    assert_eq!(report["status"], "DRAINED");
    assert_eq!(report["open_records"], 0);
    assert_eq!(report["dead_records"], 0);
    assert_eq!(projection(&live), by_id(&live, "orders"));
    assert_eq!(statuses(&live).get("succeeded"), Some(&records));
    // Every projected document names the record that wrote it: the key's latest.
    for document in live.records(VIEW) {
        assert!(document.get_i64("_handoffVersion").is_ok(), "{document}");
    }
    // A second delivery admits and writes nothing.
    let second = deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]);
    assert_code(&second, 0);
    let report = outputs(&second);
    assert_eq!(report["records_admitted"], 0, "{report}");
    assert_eq!(report["records_delivered"], 0, "{report}");
    // New writes: only they are delivered.
    update(&live, 29, 290);
    delete(&live, 28);
    hand_off(&live);
    let third = deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]);
    assert_code(&third, 0);
    let report = outputs(&third);
    assert_eq!(report["records_admitted"], 2, "{report}");
    assert_eq!(report["records_delivered"], 2, "{report}");
    assert_eq!(projection(&live), by_id(&live, "orders"));
}

#[test]
fn an_older_version_never_overwrites_or_revives_a_newer_one() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    update(&live, 1, 11);
    delete(&live, 2);
    hand_off(&live);
    let sink = format!("mongodb:{VIEW}");
    assert_code(
        &deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]),
        0,
    );
    let before = by_id(&live, VIEW);
    // Every entry is made to be tried again, oldest first (a replay of the whole history): the
    // projection changes nothing, and the insert of the deleted key does not bring it back.
    live.wait(live.coll(LEDGER).update_many(
        doc! {"status": "succeeded"},
        doc! {"$set": {"status": "dead"}},
    ))
    .expect("mark dead");
    let replay = live.operator(&[
        "deliver",
        "dead",
        "replay",
        "--all",
        "--reason",
        "replay the history",
    ]);
    assert_code(&replay, 0);
    let again = deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]);
    assert_code(&again, 0);
    let report = outputs(&again);
    assert_eq!(report["records_delivered"], 5, "{report}");
    assert_eq!(
        report["records_superseded"], 5,
        "same or older versions: {report}"
    );
    assert_eq!(by_id(&live, VIEW), before);
    assert!(!by_id(&live, VIEW).contains_key(&format!("{:?}", Some(&Bson::Int32(2)))));
}

#[test]
fn a_delivery_keeps_its_sink_and_another_delivery_has_its_own_position() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..4);
    hand_off(&live);
    assert_code(
        &deliver(
            &live,
            &["--sink", "mongodb:view_a", "--max-wait-seconds", "1"],
        ),
        0,
    );
    let moved = deliver(
        &live,
        &["--sink", "mongodb:view_b", "--max-wait-seconds", "1"],
    );
    assert_code(&moved, 4);
    assert!(live.records("view_b").is_empty());
    let other = deliver(
        &live,
        &[
            "--delivery",
            "second",
            "--sink",
            "mongodb:view_b",
            "--max-wait-seconds",
            "1",
        ],
    );
    assert_code(&other, 0);
    assert_eq!(outputs(&other)["records_delivered"], 4);
    assert_eq!(live.records("view_a").len(), 4);
    assert_eq!(live.records("view_b").len(), 4);
}

/// A refused delivery's arguments, environment and what its error must say.
type Refused<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn bad_input_gets_a_clear_error_and_delivers_nothing() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..2);
    hand_off(&live);
    let cases: Vec<Refused> = vec![
        (vec![], vec![], "--sink"),
        (
            vec!["--sink", "ftp://example.com/x"],
            vec![],
            "must start with",
        ),
        (vec!["--sink", "mongodb:"], vec![], "COLLECTION"),
        (
            vec!["--sink", "mongodb:kestra_change_outbox"],
            vec![],
            "state",
        ),
        (vec!["--sink", "http://127.0.0.1:9/hook"], vec![], "secret"),
        (
            vec!["--sink", "http://127.0.0.1:9/hook"],
            vec![("HANDOFF_SINK_SECRET", "not-a-secret")],
            "secret",
        ),
        (
            vec!["--sink", "http://user:hunter2@127.0.0.1:9/hook"],
            vec![(
                "HANDOFF_SINK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            )],
            "credential",
        ),
        (
            vec!["--sink", "mongodb:v", "--delivery", "../x"],
            vec![],
            "delivery name",
        ),
        (
            vec!["--sink", "mongodb:v", "--lease-seconds", "5"],
            vec![],
            "--lease-seconds",
        ),
    ];
    for (args, envs, needle) in cases {
        let mut command = deliver_command(&live, &args);
        for (key, value) in &envs {
            command.env(key, value);
        }
        let output = command.output().expect("run handoff deliver");
        assert_code(&output, 2);
        let stderr = support::stderr(&output);
        assert!(
            stderr.to_lowercase().contains(&needle.to_lowercase()),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!stderr.contains("not-a-secret"), "{stderr}");
    }
    assert!(
        live.records(LEDGER).is_empty(),
        "a refused delivery wrote its ledger"
    );
    assert!(live.records("v").is_empty());
}

/// `deliver --follow` to the projection, its output piped.
fn follow_projection(live: &Live) -> Child {
    deliver_command(live, &["--sink", &format!("mongodb:{VIEW}"), "--follow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn deliver --follow")
}

#[test]
fn sigkills_of_a_following_delivery_leave_every_key_at_its_latest_version_each_write_once() {
    let live = Live::for_kills();
    live.start_consumer();
    live.insert(0..20);
    // The projection's own stream: every write the delivery makes to it, counted by record.
    let watch_from = live
        .wait(live.client.database("admin").run_command(doc! {"hello": 1}))
        .expect("hello")
        .get_document("$clusterTime")
        .ok()
        .and_then(|t| t.get_timestamp("clusterTime").ok());
    let writer = live.background(async |_client, db| {
        let orders = db.collection::<Document>("orders");
        for i in 0..600 {
            let id = i % 20;
            if i % 37 == 36 {
                orders.delete_one(doc! {"_id": id}).await.expect("delete");
                orders
                    .insert_one(doc! {"_id": id, "qty": i})
                    .await
                    .expect("insert");
            } else {
                orders
                    .update_one(doc! {"_id": id}, doc! {"$set": {"qty": i}})
                    .await
                    .expect("update");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let mut run = live
        .command()
        .arg("--follow")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn run --follow");
    let mut rng = support::Rng::new(support::seed("HANDOFF_DELIVERY_SEED"));
    let mut kills = 0;
    while kills < 20 {
        let mut child = follow_projection(&live);
        std::thread::sleep(Duration::from_millis(150 + rng.below(500)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        kills += 1;
    }
    writer.join().expect("the writer");
    // SAFETY: a plain kill(2) of the child this test spawned.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    assert_eq!(run.wait().expect("reap").code(), Some(0));
    hand_off(&live);
    let last = deliver(
        &live,
        &[
            "--sink",
            &format!("mongodb:{VIEW}"),
            "--max-wait-seconds",
            "1",
        ],
    );
    assert_code(&last, 0);
    assert_eq!(
        projection(&live),
        by_id(&live, "orders"),
        "after {kills} SIGKILLs"
    );
    let counts = statuses(&live);
    assert_eq!(
        counts.get("succeeded").copied().unwrap_or(0) + counts.get("ignored").copied().unwrap_or(0),
        live.outbox_len(),
        "{counts:?}"
    );
    // Each record wrote the projection at most once, whatever was killed when.
    let writes = projection_writes(&live, watch_from);
    let twice: Vec<_> = writes.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "records written twice: {twice:?}");
    assert!(!writes.is_empty());
    println!(
        "projection: {kills} SIGKILLs, {} records, {} writes, 0 twice",
        live.outbox_len(),
        writes.len()
    );
}

/// How many times each record wrote the projection, from its change stream since `from`.
fn projection_writes(live: &Live, from: Option<bson::Timestamp>) -> HashMap<String, u32> {
    live.rt.block_on(async {
        let view = live.client.database(&live.db).collection::<Document>(VIEW);
        let mut stream = view
            .watch()
            .start_at_operation_time(from.expect("a cluster time"))
            .max_await_time(Duration::from_millis(300))
            .await
            .expect("watch the projection");
        let mut writes = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match stream
                .next_if_any()
                .await
                .expect("read the projection's stream")
            {
                Some(event) => {
                    if let Some(full) = event.full_document
                        && let Ok(record) = full.get_str("_handoffRecord")
                    {
                        *writes.entry(record.to_string()).or_insert(0) += 1;
                    }
                }
                None => break,
            }
        }
        writes
    })
}

// --- The webhook, against a real receiver that verifies every signature. ---

/// `handoff deliver` to the receiver, with fast retries.
fn webhook_command(live: &Live, receiver: &Receiver, extra: &[&str]) -> std::process::Command {
    let mut command = deliver_command(
        live,
        &[
            "--delivery",
            "hooks",
            "--sink",
            &receiver.url(),
            "--max-wait-seconds",
            "2",
        ],
    );
    command
        .args(QUICK)
        .args(extra)
        .env("HANDOFF_SINK_SECRET", SECRET);
    command
}

fn to_webhook(live: &Live, receiver: &Receiver, extra: &[&str]) -> Output {
    webhook_command(live, receiver, extra)
        .output()
        .expect("run handoff deliver")
}

/// The webhook IDs of the outbox's records (the event IDs), in hand-off order.
fn webhook_ids(live: &Live) -> Vec<String> {
    outbox_event_ids(&live.outbox())
}

use support::receiver::{QUICK, Receiver, Reply, SECRET, secret_bytes};

#[test]
fn a_webhook_gets_every_record_signed_once_and_retries_carry_the_same_id() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..12);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    // 500 then 200 for every record; 429 with Retry-After 1 s for one of them first.
    let throttled = webhook_ids(&live)[3].clone();
    let slow = throttled.clone();
    receiver.set_behaviour(move |seen, nth| {
        if seen.id == slow && nth == 1 {
            Reply::status(429).header("Retry-After", "1")
        } else if nth == 1 {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    });
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 0);
    let report = outputs(&output);
    assert_eq!(report["records_delivered"], 12, "{report}");
    assert_eq!(report["records_retried"], 12, "{report}");
    assert!(receiver.all_signatures_valid());
    let ids = webhook_ids(&live);
    let counts = receiver.count_by_id();
    for id in &ids {
        assert_eq!(counts.get(id), Some(&2), "{id}: {counts:?}");
    }
    let accepted = receiver.accepted_ids();
    assert_eq!(accepted.len(), 12);
    // The body is the record: its `_id` is `<consumer>/<webhook-id>`.
    for seen in receiver.seen() {
        let id = seen.body["_id"].as_str().expect("the record's _id");
        assert!(id.ends_with(&seen.id), "{id} vs {}", seen.id);
    }
    // Retry-After held the throttled record back a second.
    let times: Vec<Instant> = receiver
        .seen()
        .iter()
        .filter(|s| s.id == throttled)
        .map(|s| s.at)
        .collect();
    assert!(times[1].duration_since(times[0]) >= Duration::from_millis(950));
    assert_eq!(statuses(&live).get("succeeded"), Some(&12));
}

#[test]
fn admission_failing_beside_delivery_ends_it_unavailable_and_the_next_run_loses_nothing() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..4);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    assert_code(&to_webhook(&live, &receiver, &[]), 0);
    assert_eq!(receiver.accepted_ids().len(), 4);
    // New records come while the ledger refuses new entries: the admitting side fails (the
    // delivery's position exists, so nothing is admitted before it starts), and the delivery
    // ends with the server's failure, not a hang, not a success.
    live.insert(4..10);
    hand_off(&live);
    live.fail_point(
        Bson::String("alwaysOn".into()),
        doc! {"failCommands": ["insert"], "errorCode": 2, "errmsg": "refused by the test"},
    );
    let started = Instant::now();
    let output = to_webhook(&live, &receiver, &["--follow", "--max-duration", "20s"]);
    live.fail_point_off();
    // A deadline would end it 0 (DEADLINE): only the failure ends it 10.
    assert_code(&output, 10);
    let stderr = support::stderr(&output);
    assert!(stderr.contains("admitting outbox records"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(receiver.accepted_ids().len(), 4);
    // Nothing was lost or delivered twice.
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 0);
    assert_eq!(outputs(&output)["records_delivered"], 6);
    let counts = receiver.count_by_id();
    assert_eq!(counts.len(), 10, "{counts:?}");
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
}

#[test]
fn a_record_refused_for_good_is_dead_holds_back_only_its_key_and_is_replayed_audited() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..6);
    update(&live, 2, 20);
    hand_off(&live);
    let ids = webhook_ids(&live);
    // The insert of key 2 is refused (400) until the receiver is fixed.
    let poison = ids[2].clone();
    let receiver = Receiver::start(&secret_bytes());
    let refused = poison.clone();
    let fixed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let is_fixed = fixed.clone();
    receiver.set_behaviour(move |seen, _| {
        if seen.id == refused && !is_fixed.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::status(400)
        } else {
            Reply::status(204)
        }
    });
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 17);
    let report = outputs(&output);
    assert_eq!(report["records_dead"], 1, "{report}");
    assert_eq!(report["records_delivered"], 5, "{report}");
    assert_eq!(
        report["open_records"], 1,
        "key 2's update waits behind it: {report}"
    );
    assert_eq!(
        receiver.count_by_id().get(&poison),
        Some(&1),
        "a 400 is not retried"
    );
    assert!(
        !receiver.accepted_ids().contains(&ids[6]),
        "key 2's update went before its insert"
    );
    // Listed, with the receiver's reason.
    let listed = live.operator(&["deliver", "dead", "list", "--delivery", "hooks", "--json"]);
    assert_code(&listed, 0);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(listed["count"], 1);
    assert!(
        listed["dead"][0]["record"]
            .as_str()
            .unwrap_or_default()
            .ends_with(&poison)
    );
    assert_eq!(listed["dead"][0]["error_class"], "permanent");
    // Replayed once the receiver is fixed: audited, then delivered, then key 2's update.
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let replay = live.operator(&[
        "deliver",
        "dead",
        "replay",
        "--delivery",
        "hooks",
        "--id",
        &poison,
        "--reason",
        "receiver accepts the schema now",
    ]);
    assert_code(&replay, 0);
    let audit = live.records("kestra_change_audit");
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        audit[0].get_str("reason").ok(),
        Some("receiver accepts the schema now")
    );
    assert!(audit[0].get_str("by").is_ok_and(|by| !by.is_empty()));
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 0);
    assert_eq!(outputs(&output)["records_delivered"], 2);
    let accepted = receiver.accepted_ids();
    let at = |id: &String| accepted.iter().position(|a| a == id).expect("accepted");
    assert!(at(&poison) < at(&ids[6]), "key 2 in order");
    // Nothing dead is left; a discard of a record that is not dead changes nothing.
    let discard = live.operator(&[
        "deliver",
        "dead",
        "discard",
        "--delivery",
        "hooks",
        "--id",
        &poison,
        "--reason",
        "x",
    ]);
    assert_code(&discard, 16);
    assert_eq!(live.records("kestra_change_audit").len(), 1);
}

#[test]
fn a_kill_after_the_effect_delivers_again_under_the_same_id_and_one_before_delivers_once() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..5);
    hand_off(&live);
    let ids = webhook_ids(&live);
    let receiver = Receiver::start(&secret_bytes());
    // The receiver takes record 2 and kills the deliverer before answering: the effect is made,
    // the ledger does not know.
    let victim = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let pid = victim.clone();
    let target = ids[2].clone();
    receiver.set_behaviour(move |seen, nth| {
        if seen.id == target && nth == 1 {
            let pid = pid.load(std::sync::atomic::Ordering::SeqCst);
            if pid > 0 {
                // SAFETY: a plain kill(2) of the child this test spawned.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        Reply::status(200)
    });
    let mut child = webhook_command(
        &live,
        &receiver,
        &["--concurrency", "1", "--max-in-flight", "1"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn");
    victim.store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
    let status = child.wait().expect("reap");
    assert!(!status.success(), "the deliverer was killed");
    victim.store(0, std::sync::atomic::Ordering::SeqCst);
    // A killed deliverer's claim on a record it had not sent yet (planted as it leaves it).
    let planted = format!("hooks/{CONSUMER}/{}", ids[4]);
    live.wait(live.coll(LEDGER).update_one(
        doc! {"_id": &planted, "status": {"$ne": "succeeded"}},
        doc! {"$set": {"status": "in_progress", "owner": "handoff@gone:1:0.0", "leaseUntil": bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 1500)}},
    ))
    .expect("plant a claim");
    std::thread::sleep(Duration::from_secs(6));
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 0);
    let counts = receiver.count_by_id();
    assert_eq!(
        counts.get(&ids[2]),
        Some(&2),
        "the effect made before the kill is made again: {counts:?}"
    );
    for id in ids.iter().filter(|id| **id != ids[2]) {
        assert_eq!(counts.get(id), Some(&1), "{id}: {counts:?}");
    }
    assert!(receiver.all_signatures_valid());
    assert_eq!(statuses(&live).get("succeeded"), Some(&5));
}

#[test]
fn a_receiver_down_then_up_gets_everything_and_a_slow_one_never_sees_more_than_the_bound() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..10);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    receiver.stop();
    let child = webhook_command(
        &live,
        &receiver,
        &[
            "--follow",
            "--concurrency",
            "2",
            "--max-in-flight",
            "2",
            "--retry-max-seconds",
            "1",
            "--max-attempts",
            "100",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn");
    // Down for 20 s: every attempt is refused and tried again (at most a second apart).
    std::thread::sleep(Duration::from_secs(20));
    assert!(receiver.seen().is_empty());
    receiver.set_behaviour(|_, _| Reply::status(200).delay(Duration::from_millis(100)));
    receiver.restart();
    live.insert(10..20);
    hand_off(&live);
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.accepted_ids().len() < 20 {
        assert!(
            Instant::now() < deadline,
            "accepted {:?}",
            receiver.accepted_ids().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM ends the follow run after what is in flight.
    // SAFETY: a plain kill(2) of the child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = child.wait_with_output().expect("reap");
    assert_eq!(output.status.code(), Some(12), "stopped by SIGTERM");
    let counts = receiver.count_by_id();
    assert_eq!(counts.len(), 20);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    assert!(
        receiver.max_concurrent() <= 2,
        "{}",
        receiver.max_concurrent()
    );
    assert!(receiver.all_signatures_valid());
}

/// A sample's value in an OpenMetrics text (`name{labels} value`), by its name.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let (metric, value) = line.rsplit_once(' ')?;
        let family = metric.split('{').next()?;
        (family == name).then(|| value.parse().ok())?
    })
}

#[test]
fn a_throttled_receiver_holds_the_in_flight_bound_and_the_lag_rises_in_the_metrics() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..24);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    receiver.set_behaviour(|_, _| Reply::status(200).delay(Duration::from_millis(300)));
    let port = support::http::free_port();
    let child = webhook_command(
        &live,
        &receiver,
        &[
            "--follow",
            "--concurrency",
            "2",
            "--max-in-flight",
            "3",
            "--metrics-listen",
            &port.to_string(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn");
    let scrape = || {
        let reply = support::http::get(port, "/metrics")?;
        (reply.status == 200).then_some(reply.body)
    };
    let started = Instant::now();
    while support::http::status(port, "/readyz") != Some(200) {
        assert!(started.elapsed() < Duration::from_secs(20), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the receiver takes 300 ms a record, two at a time: never more than three records
    // in flight, the bound is shown beside them, and the lag (the oldest open record's wait)
    // rises from scrape to scrape.
    let mut lags = Vec::new();
    let mut most_in_flight = 0.0_f64;
    let mut body = String::new();
    while receiver.accepted_ids().len() < 24 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "accepted {}",
            receiver.accepted_ids().len()
        );
        body = scrape().expect("metrics while delivering");
        let in_flight = sample(&body, "handoff_delivery_in_flight_records").expect(&body);
        assert!(in_flight <= 3.0, "{in_flight} in flight:\n{body}");
        assert_eq!(
            sample(&body, "handoff_delivery_in_flight_records_limit"),
            Some(3.0)
        );
        most_in_flight = most_in_flight.max(in_flight);
        if receiver.accepted_ids().len() < 20 {
            lags.push(sample(&body, "handoff_delivery_lag_seconds").expect(&body));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        receiver.max_concurrent() <= 2,
        "{}",
        receiver.max_concurrent()
    );
    assert!(most_in_flight >= 2.0, "{most_in_flight}:\n{body}");
    assert!(lags.len() >= 4, "{lags:?}");
    assert!(
        lags.windows(2).all(|w| w[1] >= w[0]) && lags[lags.len() - 1] >= lags[0] + 0.5,
        "the lag should rise while the receiver is slow: {lags:?}"
    );
    // Caught up: every record delivered once, nothing open, no lag.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        body = scrape().expect("metrics");
        if sample(&body, "handoff_delivery_records_delivered_total") == Some(24.0)
            && sample(&body, "handoff_delivery_lag_seconds") == Some(0.0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        sample(&body, "handoff_delivery_records_dead_total"),
        Some(0.0)
    );
    assert_eq!(
        sample(&body, "handoff_delivery_in_flight_records"),
        Some(0.0)
    );
    assert!(
        body.contains("consumer=\"") && body.contains("delivery=\"hooks\""),
        "{body}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    // SAFETY: a plain kill(2) of the child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = child.wait_with_output().expect("reap");
    assert_eq!(output.status.code(), Some(12), "stopped by SIGTERM");
    assert!(receiver.count_by_id().values().all(|n| *n == 1));
}

#[test]
fn a_busy_metrics_address_refuses_the_delivery_before_it_delivers() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port().to_string();
    let output = to_webhook(&live, &receiver, &["--metrics-listen", &port]);
    assert_code(&output, 2);
    assert!(
        support::stderr(&output).contains("--metrics-listen"),
        "{}",
        support::stderr(&output)
    );
    assert!(receiver.seen().is_empty());
    assert!(statuses(&live).is_empty(), "{:?}", statuses(&live));
}

#[test]
fn reconcile_finds_planted_missing_orphan_and_stale_keys_and_repairs_them_audited() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..10);
    hand_off(&live);
    let sink = format!("mongodb:{VIEW}");
    assert_code(
        &deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]),
        0,
    );
    let reconcile = |extra: &[&str]| {
        let mut args = vec!["deliver", "reconcile", "--sink", &sink, "--json"];
        args.extend_from_slice(extra);
        live.operator(&args)
    };
    let clean = reconcile(&[]);
    assert_code(&clean, 0);
    // Planted: key 1 gone from the projection, key 2 changed there, key 99 only there; key 5
    // changed in the source and handed off, not delivered yet (in flight).
    let view = live.coll(VIEW);
    live.wait(view.delete_one(doc! {"_id": 1}))
        .expect("plant missing");
    live.wait(view.update_one(doc! {"_id": 2}, doc! {"$set": {"qty": -1}}))
        .expect("plant stale");
    live.wait(view.insert_one(doc! {"_id": 99, "qty": 0}))
        .expect("plant orphan");
    update(&live, 5, 55);
    hand_off(&live);
    // Its record waits for a retry: the entry failed, the projection still has the old version.
    assert_code(
        &deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]),
        0,
    );
    let later = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_600_000);
    live.wait(live.coll(LEDGER).update_one(
        doc! {"lane": "{\"k\": 5}", "status": "succeeded", "attempts": 1, "record": {"$in": live.outbox().iter().rev().take(1).filter_map(|r| r.get_str("_id").ok().map(str::to_string)).collect::<Vec<_>>()}},
        doc! {"$set": {"status": "failed", "nextAttemptAt": later}},
    ))
    .expect("plant a retry");
    live.wait(view.update_one(
        doc! {"_id": 5},
        doc! {"$set": {"qty": 0, "_handoffVersion": 1_i64}},
    ))
    .expect("the older version");
    let found = reconcile(&[]);
    assert_code(&found, 16);
    let report: Value = serde_json::from_slice(&found.stdout).expect("JSON");
    assert_eq!(
        report["missing"]["keys"],
        serde_json::json!(["1"]),
        "{report}"
    );
    assert_eq!(
        report["stale"]["keys"],
        serde_json::json!(["2"]),
        "{report}"
    );
    assert_eq!(
        report["orphan"]["keys"],
        serde_json::json!(["99"]),
        "{report}"
    );
    assert_eq!(report["compared"], 10);
    assert_eq!(report["in_flight"], 1, "{report}");
    // Repaired, audited; then nothing differs.
    let repaired = reconcile(&["--repair", "--reason", "projection restored from a backup"]);
    assert_code(&repaired, 0);
    let report: Value = serde_json::from_slice(&repaired.stdout).expect("JSON");
    assert_eq!(report["repaired"]["written"], 3, "{report}");
    let audit = live.records("kestra_change_audit");
    assert_eq!(audit.len(), 1);
    assert_eq!(
        audit[0].get_str("reason").ok(),
        Some("projection restored from a backup")
    );
    let after = reconcile(&[]);
    assert_code(&after, 0);
    let report: Value = serde_json::from_slice(&after.stdout).expect("JSON");
    assert_eq!(report["missing"]["count"], 0, "{report}");
    assert_eq!(report["in_flight"], 1, "{report}");
    // The retry comes due: the delivery writes the in-flight key, and nothing differs.
    live.wait(live.coll(LEDGER).update_many(
        doc! {"status": "failed"},
        doc! {"$set": {"nextAttemptAt": bson::DateTime::now()}},
    ))
    .expect("due now");
    let last = deliver(&live, &["--sink", &sink, "--max-wait-seconds", "1"]);
    assert_code(&last, 0);
    assert_eq!(outputs(&last)["records_delivered"], 1);
    assert_eq!(projection(&live), by_id(&live, "orders"));
    let report: Value = serde_json::from_slice(&reconcile(&[]).stdout).expect("JSON");
    assert_eq!(report["in_flight"], 0, "{report}");
    assert_eq!(report["stale"]["count"], 0, "{report}");
}

#[test]
fn reconcile_compares_what_the_policy_makes_of_the_source_and_repairs_through_it() {
    let shaped = ["--policy", handoff_test_policies::SHAPED_PROJECTION];
    let live = Live::start();
    assert_code(&live.run(&shaped), 0);
    live.insert(0..6);
    hand_off_with(&live, &shaped);
    let sink = format!("mongodb:{VIEW}");
    let mut args = vec!["--sink", sink.as_str(), "--max-wait-seconds", "1"];
    args.extend_from_slice(&shaped);
    assert_code(&deliver(&live, &args), 0);
    // The projection holds the policy's shape, not the source document.
    let view = live.coll(VIEW);
    let held = projection(&live);
    assert_eq!(held.len(), 6, "{held:?}");
    assert!(
        held.values()
            .all(|d| d.get_bool("shaped").ok() == Some(true)),
        "{held:?}"
    );
    let reconcile = |extra: &[&str]| {
        let mut args = vec!["deliver", "reconcile", "--sink", &sink, "--json"];
        args.extend_from_slice(extra);
        live.operator(&args)
    };
    let with_policy = |extra: &[&str]| {
        let mut args = shaped.to_vec();
        args.extend_from_slice(extra);
        reconcile(&args)
    };
    // Through the policy, nothing differs; the default's effects would call every key stale,
    // and another policy than the consumer's is refused before anything is compared.
    let clean = with_policy(&[]);
    assert_code(&clean, 0);
    let report: Value = serde_json::from_slice(&clean.stdout).expect("JSON");
    assert_eq!(report["compared"], 6, "{report}");
    assert_eq!(report["stale"]["count"], 0, "{report}");
    assert!(
        report["effects"]
            .as_str()
            .unwrap_or_default()
            .contains("shaped_projection"),
        "{report}"
    );
    let other = reconcile(&["--repair", "--reason", "the wrong policy"]);
    assert_ne!(other.status.code(), Some(0));
    assert!(
        support::stderr(&other).contains("policy"),
        "{}",
        support::stderr(&other)
    );
    assert!(live.records("kestra_change_audit").is_empty());
    // Planted: key 1 unshaped, key 2 gone, key 3 deleted in the source (the policy's delete
    // never reached the projection), key 99 only in the projection.
    live.wait(view.replace_one(doc! {"_id": 1}, doc! {"qty": 1, "note": "by hand"}))
        .expect("plant stale");
    live.wait(view.delete_one(doc! {"_id": 2}))
        .expect("plant missing");
    live.wait(live.coll("orders").delete_one(doc! {"_id": 3}))
        .expect("delete at the source");
    live.wait(view.insert_one(doc! {"_id": 99, "qty": 0, "shaped": true}))
        .expect("plant orphan");
    let found = with_policy(&[]);
    assert_code(&found, 16);
    let report: Value = serde_json::from_slice(&found.stdout).expect("JSON");
    assert_eq!(
        report["stale"]["keys"],
        serde_json::json!(["1"]),
        "{report}"
    );
    assert_eq!(
        report["missing"]["keys"],
        serde_json::json!(["2"]),
        "{report}"
    );
    let mut orphans: Vec<String> = report["orphan"]["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    orphans.sort();
    assert_eq!(orphans, ["3", "99"], "{report}");
    let repaired = with_policy(&["--repair", "--reason", "projection edited by hand"]);
    assert_code(&repaired, 0);
    let report: Value = serde_json::from_slice(&repaired.stdout).expect("JSON");
    assert_eq!(report["repaired"]["written"], 4, "{report}");
    assert_eq!(live.records("kestra_change_audit").len(), 1);
    // What the repair wrote is the policy's shape, under the repair's version.
    let held = projection(&live);
    assert_eq!(held.len(), 5, "{held:?}");
    for key in [1, 2] {
        let document = held
            .values()
            .find(|d| d.get_i32("_id").ok() == Some(key))
            .expect("repaired key");
        assert_eq!(document.get_bool("shaped").ok(), Some(true), "{document:?}");
        assert!(document.get("note").is_none(), "{document:?}");
    }
    let after = with_policy(&[]);
    assert_code(&after, 0);
    let report: Value = serde_json::from_slice(&after.stdout).expect("JSON");
    assert_eq!(report["compared"], 5, "{report}");
}

#[test]
fn reconcile_through_a_policy_answering_nonsense_or_never_repairs_nothing() {
    let sink = format!("mongodb:{VIEW}");
    for (policy, slice, says) in [
        (
            handoff_test_policies::SHAPED_NONSENSE,
            None,
            "answered nonsense",
        ),
        (
            handoff_test_policies::SHAPED_FOREVER,
            Some("300"),
            "computed for more than 300 ms",
        ),
    ] {
        let live = Live::start();
        let view = live.coll(VIEW);
        let with = ["--policy", policy];
        assert_code(&live.run(&with), 0);
        live.insert(0..3);
        hand_off_with(&live, &with);
        // The projection as a delivery would have left it, with one key planted stale and one
        // missing: a repair would write both.
        for source in live.records("orders") {
            live.wait(view.insert_one(source)).expect("project");
        }
        live.wait(view.update_one(doc! {"_id": 1}, doc! {"$set": {"qty": -1}}))
            .expect("plant stale");
        live.wait(view.delete_one(doc! {"_id": 2}))
            .expect("plant missing");
        let before = by_id(&live, VIEW);
        let mut args = vec![
            "deliver",
            "reconcile",
            "--sink",
            sink.as_str(),
            "--repair",
            "--reason",
            "hostile",
        ];
        args.extend_from_slice(&with);
        if let Some(slice) = slice {
            args.extend_from_slice(&["--policy-slice-ms", slice]);
        }
        let started = Instant::now();
        let output = live.operator(&args);
        assert_code(&output, 9);
        let stderr = support::stderr(&output);
        assert!(stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("forged"), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(by_id(&live, VIEW), before, "{policy}");
        assert!(live.records("kestra_change_audit").is_empty());
    }
}

#[test]
fn status_keeps_every_delivery_apart_and_alerts_on_lag_and_dead_records() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..4);
    hand_off(&live);
    assert_code(
        &deliver(
            &live,
            &[
                "--sink",
                &format!("mongodb:{VIEW}"),
                "--max-wait-seconds",
                "1",
            ],
        ),
        0,
    );
    // A second delivery whose receiver refuses one record for good and never got the rest.
    let receiver = Receiver::start(&secret_bytes());
    let poison = webhook_ids(&live)[0].clone();
    receiver.set_behaviour(move |seen, _| Reply::status(if seen.id == poison { 422 } else { 200 }));
    assert_code(
        &to_webhook(
            &live,
            &receiver,
            &["--max-records", "2", "--concurrency", "1"],
        ),
        17,
    );
    std::thread::sleep(Duration::from_millis(1100));
    let status = |extra: &[&str]| {
        let mut args = vec!["deliver", "status", "--json"];
        args.extend_from_slice(extra);
        live.operator(&args)
    };
    let calm = status(&[]);
    assert_code(&calm, 0);
    let report: Value = serde_json::from_slice(&calm.stdout).expect("JSON");
    let deliveries = report["deliveries"].as_array().expect("deliveries");
    assert_eq!(deliveries.len(), 2, "{report}");
    let by_name = |name: &str| {
        deliveries
            .iter()
            .find(|d| d["delivery"] == name)
            .unwrap_or_else(|| panic!("{name}: {report}"))
    };
    assert_eq!(by_name("default")["succeeded"], 4);
    assert_eq!(by_name("default")["open"], 0);
    assert!(by_name("default")["lag_seconds"].is_null());
    assert_eq!(by_name("hooks")["dead"], 1);
    assert_eq!(by_name("hooks")["succeeded"], 1);
    assert_eq!(by_name("hooks")["open"], 2);
    assert!(by_name("hooks")["lag_seconds"].as_f64().expect("a lag") >= 1.0);
    assert!(
        by_name("hooks")["sink"]
            .as_str()
            .is_some_and(|s| s.starts_with("http://127.0.0.1"))
    );
    let lagging = status(&["--max-lag-seconds", "1"]);
    assert_code(&lagging, 18);
    assert!(support::stderr(&lagging).contains("delivery hooks lags"));
    assert!(!support::stderr(&lagging).contains("delivery default"));
    assert_code(&status(&["--max-lag-seconds", "3600"]), 0);
    assert_code(&status(&["--fail-on-dead"]), 17);
    // The consumer's own status shows its deliveries beside its position, and alerts on their
    // lag with its own exit code.
    let main = |extra: &[&str]| {
        let mut args = vec!["status"];
        args.extend_from_slice(extra);
        live.operator(&args)
    };
    let shown = main(&["--json"]);
    assert_code(&shown, 0);
    let report: Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    let listed = report["deliveries"].as_array().expect("deliveries");
    assert_eq!(listed.len(), 2, "{report}");
    let text = main(&[]);
    assert_code(&text, 0);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("hooks") && text.contains("default"), "{text}");
    let lagging = main(&["--max-delivery-lag", "1s"]);
    assert_code(&lagging, 18);
    assert!(support::stderr(&lagging).contains("delivery hooks lags"));
    assert_code(&main(&["--max-delivery-lag", "1h"]), 0);
    assert_code(&main(&["--max-delivery-lag", "soon"]), 2);
}

/// Records with no `_id` string in the receiver's view: the bodies it saw, by `webhook-id`.
fn bodies(receiver: &Receiver) -> BTreeMap<String, (Value, BTreeMap<String, String>)> {
    receiver
        .seen()
        .into_iter()
        .map(|s| (s.id.clone(), (s.body.clone(), s.headers.clone())))
        .collect()
}

#[test]
fn the_policy_shapes_what_a_webhook_gets_refuses_what_it_cannot_shape_and_ignores_a_conflict() {
    let domain_events = ["--policy", handoff_test_policies::DOMAIN_EVENTS];
    let live = Live::start();
    assert_code(&live.run(&domain_events), 0);
    live.insert(0..6);
    hand_off_with(&live, &domain_events);
    let receiver = Receiver::start(&secret_bytes());
    // The receiver holds the event of aggregate 2 already: 409 Conflict, which the policy
    // classifies as ignored (the host alone would make it dead).
    receiver.set_behaviour(|seen, _| {
        if seen.body["aggregateId"] == 2 {
            Reply::status(409)
        } else {
            Reply::status(200)
        }
    });
    let output = to_webhook(&live, &receiver, &domain_events);
    assert_code(&output, 0);
    let report = outputs(&output);
    assert_eq!(report["records_delivered"], 5, "{report}");
    assert_eq!(report["records_ignored"], 1, "{report}");
    assert_eq!(report["records_dead"], 0, "{report}");
    assert!(receiver.all_signatures_valid());
    let seen = bodies(&receiver);
    assert_eq!(seen.len(), 6, "{seen:?}");
    for (id, (body, headers)) in &seen {
        // The domain event itself, not the outbox record: no token, no consumer, no raw event.
        assert_eq!(body["id"], id.as_str(), "{body}");
        assert_eq!(body["type"], "OrderCreated", "{body}");
        assert!(
            body.get("token").is_none() && body.get("consumer").is_none(),
            "{body}"
        );
        assert!(body["payload"].is_object(), "{body}");
        assert_eq!(
            headers.get("handoff-event-type").map(String::as_str),
            Some("OrderCreated")
        );
        // The sink's own headers stay the sink's.
        assert_eq!(
            headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
    }
    assert_eq!(statuses(&live).get("succeeded"), Some(&5));
    assert_eq!(statuses(&live).get("ignored"), Some(&1));
    let ignored: Vec<Document> = live
        .records(LEDGER)
        .into_iter()
        .filter(|e| e.get_str("status").ok() == Some("ignored"))
        .collect();
    assert_eq!(
        ignored[0].get_str("lastErrorClass").ok(),
        Some("policy_ignored"),
        "{ignored:?}"
    );

    // The same policy on an outbox of raw change events (the default policy's): it cannot
    // shape them, so each goes dead with its reason, and none reaches the receiver.
    let raw = Live::start();
    raw.start_consumer();
    raw.insert(0..3);
    hand_off(&raw);
    let receiver = Receiver::start(&secret_bytes());
    let output = to_webhook(&raw, &receiver, &domain_events);
    assert_code(&output, 17);
    assert_eq!(outputs(&output)["records_dead"], 3);
    assert!(receiver.seen().is_empty());
    let dead: Vec<Document> = raw
        .records(LEDGER)
        .into_iter()
        .filter(|e| e.get_str("status").ok() == Some("dead"))
        .collect();
    assert_eq!(dead.len(), 3);
    for entry in &dead {
        assert_eq!(
            entry.get_str("lastErrorClass").ok(),
            Some("policy_refused"),
            "{entry:?}"
        );
        assert!(
            entry
                .get_str("lastError")
                .unwrap_or_default()
                .contains("eventType"),
            "{entry:?}"
        );
    }
}

#[test]
fn a_policy_answering_nonsense_or_never_delivers_nothing_and_loses_nothing() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    hand_off(&live);
    let receiver = Receiver::start(&secret_bytes());
    let output = to_webhook(
        &live,
        &receiver,
        &["--policy", handoff_test_policies::EFFECTS_NONSENSE],
    );
    assert_code(&output, 9);
    let stderr = support::stderr(&output);
    assert!(stderr.contains("answered nonsense"), "{stderr}");
    assert!(
        !stderr.contains("forged"),
        "the policy's header text is not echoed: {stderr}"
    );
    assert!(receiver.seen().is_empty());

    let started = Instant::now();
    let output = to_webhook(
        &live,
        &receiver,
        &[
            "--policy",
            handoff_test_policies::EFFECTS_FOREVER,
            "--policy-slice-ms",
            "300",
        ],
    );
    assert_code(&output, 9);
    assert!(
        support::stderr(&output).contains("computed for more than 300 ms"),
        "{}",
        support::stderr(&output)
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(receiver.seen().is_empty());

    // The contract's host is not there while effects are decided: the call fails the policy.
    let output = to_webhook(
        &live,
        &receiver,
        &["--policy", handoff_test_policies::EFFECTS_HOST_CALL],
    );
    assert_code(&output, 9);
    let stderr = support::stderr(&output);
    assert!(stderr.contains("no run exists"), "{stderr}");
    assert!(receiver.seen().is_empty());
    let counts = statuses(&live);
    assert!(
        !counts.contains_key("succeeded") && !counts.contains_key("dead"),
        "{counts:?}"
    );

    // Nothing was lost: the default's effects deliver every record.
    let output = to_webhook(&live, &receiver, &[]);
    assert_code(&output, 0);
    assert_eq!(outputs(&output)["records_delivered"], 3);
    assert_eq!(receiver.accepted_ids().len(), 3);
}
