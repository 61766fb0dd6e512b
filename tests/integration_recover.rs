//! `handoff recover` against a test server whose history is small enough to lose: after a run
//! exits 6, one command moves the checkpoint and repairs the outbox through the policy, after
//! which the next run and `reconcile` find nothing missing, orphaned or stale and no event twice
//! (with the default policy and the quarantine policy, whose poison documents stay
//! quarantined); a writer during the repair loses nothing; a recovery killed after its move, or
//! whose repair outran the oplog, is completed by the next; and what has nothing to recover, or
//! cannot be recovered here, is refused with nothing written.

use crate::support;

use std::collections::HashSet;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use serde_json::Value;
use support::live::{CHECKPOINTS, CONSUMER, Live};

const AUDIT: &str = "kestra_change_audit";
const QUARANTINE: &str = "kestra_change_quarantine";

/// A test server that keeps `history_limit` change events, its abandoned transactions expiring
/// after 2 s.
fn sim(history_limit: usize) -> Live {
    Live::with_config(mongo_sim::Config {
        history_limit,
        transaction_lifetime: Duration::from_secs(2),
        ..mongo_sim::Config::default()
    })
}

/// `handoff recover ARGS…` on the test's database.
fn recover(live: &Live, args: &[&str]) -> Output {
    live.operator(&[&["recover"][..], args].concat())
}

/// `(missing, orphan, stale)` of a reconcile report, or of a recovery's repair.
fn counts(report: &Value) -> (u64, u64, u64) {
    let n = |v: &Value| v.as_u64().or_else(|| v["count"].as_u64()).expect("a count");
    (
        n(&report["missing"]),
        n(&report["orphan"]),
        n(&report["stale"]),
    )
}

/// `reconcile --json` with `policy`, which must find the outbox describing the source.
fn reconciled(live: &Live, policy: &[&str]) -> Value {
    let report =
        support::json_stdout(&live.operator(&[&["reconcile", "--json"][..], policy].concat()));
    assert_eq!(counts(&report), (0, 0, 0), "{report}");
    report
}

/// Documents `ids`, every fifth of a schema the quarantine policy refuses (poison).
fn insert_orders(live: &Live, ids: std::ops::Range<i32>) {
    live.wait(live.coll("orders").insert_many(ids.map(|i| {
        if i % 5 == 0 {
            doc! { "_id": i, "schemaVersion": 99, "card": "4111111111111111", "n": 0 }
        } else {
            doc! { "_id": i, "schemaVersion": 1, "n": 0 }
        }
    })))
    .expect("insert");
}

/// `rounds` updates of every document of the good schema.
fn update_rounds(live: &Live, rounds: i32) {
    for round in 1..=rounds {
        live.wait(
            live.coll("orders")
                .update_many(doc! { "schemaVersion": 1 }, doc! { "$set": { "n": round } }),
        )
        .expect("update");
    }
}

/// The consumer's outbox holds each event (change or correction) once.
fn each_event_once(live: &Live) {
    let mut seen = HashSet::new();
    for record in live.outbox() {
        let event = record.get_document("event").expect("the event is kept");
        let token = event.get_document("_id").expect("the event's token");
        assert!(
            seen.insert(format!("{token:?}")),
            "handed off twice: {record}"
        );
    }
    assert!(!seen.is_empty());
}

/// Waits until `handoff` sent `n` commands named `command`, failing if `child` ends first.
fn wait_for_sent(live: &Live, child: &mut std::process::Child, command: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let sent = || {
        live.commands_from_handoff()
            .iter()
            .filter(|c| *c == command)
            .count()
    };
    while sent() < n {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("recover ended ({status}) before its {n}th {command}");
        }
        assert!(Instant::now() < deadline, "no {n}th {command}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A spawned `handoff recover --json ARGS…`.
fn spawn_recover(live: &Live, args: &[&str]) -> std::process::Child {
    live.operator_command(&[&["recover", "--json"][..], args].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff recover")
}

/// Snapshot records of the outbox, keyed by document: each key at most once.
fn snapshot_keys_once(live: &Live) -> usize {
    let mut keys = HashSet::new();
    for record in live.outbox() {
        let event = record.get_document("event").expect("event");
        if event.get_str("operationType").ok() == Some("snapshot") {
            let key = event.get_document("documentKey").expect("key").get("_id");
            assert!(
                keys.insert(format!("{key:?}")),
                "two correction records for {key:?}"
            );
        }
    }
    keys.len()
}

#[test]
fn lost_history_is_recovered_in_one_command_with_the_default_and_the_quarantine_policy() {
    let shipped = [
        ("default", None),
        ("quarantine", Some(handoff_test_policies::QUARANTINE)),
    ];
    for (name, path) in shipped {
        // 200 events of history: the lost window's 212 writes overflow it, the recovery's own
        // writes (about 45) do not.
        let live = sim(200);
        let policy: Vec<&str> = path.map_or(vec![], |p| vec!["--policy", p]);
        support::ok(&live.run(&policy));
        insert_orders(&live, 0..10);
        let handed_off = if name == "quarantine" { 8 } else { 10 };
        assert_eq!(
            support::ok(&live.run(&policy))["events_handed_off"],
            handed_off
        );
        // The lost window: 30 new documents (6 poison), 2 deleted, 6 updated six times.
        insert_orders(&live, 10..40);
        live.wait(
            live.coll("orders")
                .delete_many(doc! { "_id": { "$in": [1, 2] } }),
        )
        .expect("delete");
        update_rounds(&live, 6);
        let failed = support::fails(&live.run(&policy), 6, "ChangeStreamHistoryLost");
        let next = &failed["evidence"]["next_commands"];
        let first = next[0].as_str().expect("a command");
        assert_eq!(
            first,
            "handoff recover --database change_demo --collection orders --consumer-id \
             orders-to-outbox --reason '<why>'",
            "{name}: {next}"
        );
        let guidance = failed["guidance"].as_str().expect("guidance");
        let by_hand = "; or, by hand: handoff status ";
        assert!(
            guidance.contains(&format!("Next: {first}{by_hand}")),
            "{guidance}"
        );

        // A dry run shows the lost window and writes nothing.
        let before = live.checkpoint().expect("checkpoint");
        let dry = support::json_stdout(&recover(
            &live,
            &[&["--dry-run", "--json"][..], &policy].concat(),
        ));
        assert_eq!(dry["applied"], false, "{dry}");
        assert_eq!(dry["cause"], "history lost", "{dry}");
        let (from, to) = (&dry["lost"]["from"]["t"], &dry["lost"]["to"]["t"]);
        assert!(from.as_u64() <= to.as_u64() && to.is_u64(), "{dry}");
        assert!(dry["lost"]["gap_seconds"].is_i64(), "{dry}");
        assert!(dry["refused"].is_null(), "{dry}");
        let recover_next = dry["next_command"].as_str().expect("the next command");
        assert!(
            recover_next.starts_with("handoff recover --database change_demo"),
            "{dry}"
        );
        assert_eq!(recover_next.contains("--policy "), path.is_some(), "{dry}");
        assert_eq!(live.checkpoint(), Some(before.clone()));
        assert!(live.records(AUDIT).is_empty());

        // The recovery, as the evidence names it (with the consumer's policy).
        let command = first.replace("'<why>'", "INC-42");
        let mut args: Vec<&str> = command.split_whitespace().skip(2).collect();
        args.extend(["--json"]);
        args.extend(&policy);
        let done = support::json_stdout(&recover(&live, &args));
        assert_eq!(done["applied"], true, "{name}: {done}");
        assert_eq!(done["resumed"], false, "{done}");
        let repair = &done["repair"];
        assert_eq!(counts(repair), (30, 2, 6), "{name}: {done}");
        let held = if name == "quarantine" { 2 } else { 0 };
        assert_eq!(
            repair["held_by_policy"]["quarantined"], held,
            "{name}: {done}"
        );
        assert_eq!(repair["written"], 38, "{name}: {done}");
        assert_eq!(repair["in_flight"], 0, "{done}");
        let after = live.checkpoint().expect("checkpoint");
        assert_ne!(after.get("token"), before.get("token"));
        assert!(after.get("recovering").is_none(), "{after}");
        // The move, the repair and the completion, each audited.
        let audit = live.records(AUDIT);
        assert_eq!(audit.len(), 3, "{audit:?}");
        let reasons: Vec<_> = audit.iter().map(|r| r.get_str("reason").ok()).collect();
        assert_eq!(reasons, [Some("INC-42"); 3]);
        let moved = audit[0].get_document("evidence").expect("evidence");
        assert!(moved.get_document("recovering").is_ok(), "{moved}");
        let completed = audit[2].get_document("evidence").expect("evidence");
        assert_eq!(completed.get_i64("missing").ok(), Some(30), "{completed}");
        assert_eq!(completed.get_i64("correction_records").ok(), Some(38));
        let next = completed.get_str("next").expect("the next command");
        assert!(
            next.starts_with("handoff run --database change_demo"),
            "{next}"
        );

        // The next run goes on from the new position; the outbox then describes the source.
        support::ok(&live.run(&policy));
        insert_orders(&live, 101..102);
        assert_eq!(support::ok(&live.run(&policy))["events_handed_off"], 1);
        let last = reconciled(&live, &policy);
        let quarantined = if name == "quarantine" { 8 } else { 0 };
        assert_eq!(
            last["held_by_policy"]["quarantined"]["count"], quarantined,
            "{name}: {last}"
        );
        assert_eq!(
            live.records(QUARANTINE).len(),
            quarantined as usize,
            "{name}"
        );
        each_event_once(&live);
        if name == "default" {
            // Each record is the default policy's, under the ID it gives the event.
            support::live::outbox_event_ids(&live.outbox());
        } else {
            for record in live.outbox() {
                let event = record.get_document("event").expect("event");
                let version = event
                    .get_document("fullDocument")
                    .ok()
                    .and_then(|d| d.get("schemaVersion").cloned());
                assert!(
                    !matches!(version, Some(v) if v != Bson::Int32(1)),
                    "a record the policy refuses: {record}"
                );
            }
        }
        assert_eq!(
            snapshot_keys_once(&live),
            if name == "quarantine" { 32 } else { 38 }
        );

        // Recovered: nothing more to recover.
        let again = recover(&live, &[&["--reason", "again"][..], &policy].concat());
        support::refused(&again, 2, "Nothing to recover");
        assert_eq!(live.records(AUDIT).len(), 3);
    }
}

#[test]
fn a_writer_during_the_repair_loses_nothing_and_doubles_nothing() {
    let live = sim(300);
    support::ok(&live.run(&[]));
    insert_orders(&live, 0..20);
    support::ok(&live.run(&[]));
    insert_orders(&live, 20..60);
    update_rounds(&live, 7);
    support::fails(&live.run(&[]), 6, "ChangeStreamHistoryLost");

    // The repair's commit is held 1.5 s (the move's goes through): the writer changes documents
    // the repair read before, and others, while it waits.
    live.server().clear_received_commands();
    live.fail_point(
        doc! { "skip": 1, "times": 1 }.into(),
        doc! { "failCommands": ["commitTransaction"], "blockConnection": true, "blockTimeMS": 1500 },
    );
    let mut child = spawn_recover(&live, &["--reason", "INC-7"]);
    wait_for_sent(&live, &mut child, "commitTransaction", 2);
    let orders = live.coll("orders");
    live.wait(orders.update_many(
        doc! { "_id": { "$lt": 10 }, "schemaVersion": 1 },
        doc! { "$set": { "n": 100 } },
    ))
    .expect("update");
    live.wait(orders.delete_many(doc! { "_id": { "$in": [50, 51, 52] } }))
        .expect("delete");
    insert_orders(&live, 1000..1005);
    let output = child.wait_with_output().expect("recover ends");
    let done = support::json_stdout(&output);
    assert_eq!(
        live.fail_point_off(),
        1,
        "the repair's commit was never held"
    );
    assert_eq!(done["applied"], true, "{done}");
    assert!(done["repair"]["written"].as_u64() > Some(0), "{done}");

    // The next run hands off the writer's changes; nothing is missing, nothing twice.
    let run = support::ok(&live.run(&[]));
    assert!(run["events_handed_off"].as_u64() >= Some(8), "{run}");
    reconciled(&live, &[]);
    each_event_once(&live);
    snapshot_keys_once(&live);
}

#[test]
fn a_recovery_killed_after_its_move_is_completed_by_the_next() {
    // 150 documents to repair: two transactions (100, then 50).
    let live = sim(400);
    support::ok(&live.run(&[]));
    insert_orders(&live, 0..150);
    update_rounds(&live, 3);
    support::fails(&live.run(&[]), 6, "ChangeStreamHistoryLost");
    let lost = live.checkpoint_token();

    // The move's commit and the first repair transaction's go through; the second is held
    // (then failed), and the process is killed while it waits.
    live.server().clear_received_commands();
    live.fail_point(
        doc! { "skip": 2, "times": 1 }.into(),
        doc! {
            "failCommands": ["commitTransaction"],
            "blockConnection": true,
            "blockTimeMS": 30_000,
            "errorCode": 8,
        },
    );
    let mut child = spawn_recover(&live, &["--reason", "INC-9"]);
    wait_for_sent(&live, &mut child, "commitTransaction", 3);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    live.fail_point_off();

    let moved = live.checkpoint().expect("checkpoint");
    assert_ne!(moved.get_document("token").ok(), Some(&lost));
    let marker = moved
        .get_document("recovering")
        .expect("the recovery is recorded");
    assert_eq!(marker.get_str("reason").ok(), Some("INC-9"));
    assert_eq!(marker.get_str("cause").ok(), Some("history lost"));
    assert_eq!(snapshot_keys_once(&live), 100);
    assert_eq!(
        live.records(AUDIT).len(),
        2,
        "the move and the repair's start"
    );
    let status = support::json_stdout(&live.operator(&["status", "--json"]));
    assert_eq!(
        status["checkpoint"]["recovering"]["reason"], "INC-9",
        "{status}"
    );
    let human = live.operator(&["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("RECOVERING"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    // A dry run of the recovery in progress shows what its repair would write.
    let dry = support::json_stdout(&recover(&live, &["--dry-run", "--json"]));
    assert_eq!(dry["resumed"], true, "{dry}");
    assert_eq!(counts(&dry["repair"]), (50, 0, 0), "{dry}");
    assert_eq!(live.records(AUDIT).len(), 2);

    // The next recovery completes the repair without moving the checkpoint again.
    let done = support::json_stdout(&recover(&live, &["--reason", "INC-9 again", "--json"]));
    assert_eq!(done["resumed"], true, "{done}");
    assert_eq!(done["cause"], "history lost", "{done}");
    assert_eq!(counts(&done["repair"]), (50, 0, 0), "{done}");
    assert_eq!(done["repair"]["written"], 50, "{done}");
    let completed = live.checkpoint().expect("checkpoint");
    assert_eq!(completed.get("token"), moved.get("token"));
    assert!(completed.get("recovering").is_none(), "{completed}");
    assert_eq!(snapshot_keys_once(&live), 150);
    assert_eq!(live.records(AUDIT).len(), 4);

    support::ok(&live.run(&[]));
    reconciled(&live, &[]);
    each_event_once(&live);
}

#[test]
fn a_repair_that_outruns_the_oplog_stays_recorded_and_the_next_recovery_completes_it() {
    // 60 events of history: the lost window's 80 inserts overflow it, and so do the 80
    // correction records of the repair.
    let live = sim(60);
    support::ok(&live.run(&[]));
    insert_orders(&live, 0..80);
    support::fails(&live.run(&[]), 6, "ChangeStreamHistoryLost");
    support::refused(
        &recover(&live, &["--reason", "INC-11"]),
        6,
        "outran the oplog",
    );
    let recorded = live.checkpoint().expect("checkpoint");
    let first = recorded
        .get_document("recovering")
        .expect("the recovery")
        .clone();
    assert_eq!(snapshot_keys_once(&live), 80);
    // Moved again: what the repair wrote stands, nothing is left to write; the recovery is the
    // same one, and the window it lost first is the one told.
    let done = support::json_stdout(&recover(&live, &["--reason", "INC-11", "--json"]));
    assert_eq!(done["resumed"], false, "{done}");
    let lost_from = first.get_timestamp("lost_from").expect("lost_from");
    assert_eq!(
        done["lost"]["from"]["t"].as_u64(),
        Some(u64::from(lost_from.time)),
        "{done}"
    );
    assert_eq!(counts(&done["repair"]), (0, 0, 0), "{done}");
    assert!(
        live.checkpoint()
            .expect("checkpoint")
            .get("recovering")
            .is_none()
    );
    support::ok(&live.run(&[]));
    reconciled(&live, &[]);
    each_event_once(&live);
}

/// The checkpoint and the audit collection, to compare before and after a refusal.
fn state(live: &Live) -> (Option<Document>, usize) {
    (live.checkpoint(), live.records(AUDIT).len())
}

#[test]
fn what_cannot_or_need_not_be_recovered_is_refused_with_nothing_written() {
    let live = sim(100);
    support::ok(&live.run(&[]));
    insert_orders(&live, 0..5);
    support::ok(&live.run(&[]));
    let healthy = state(&live);

    // Nothing to recover: the stream resumes from the checkpoint.
    let out = recover(&live, &["--reason", "just in case"]);
    support::refused(&out, 2, "Nothing to recover");
    assert!(
        support::stderr(&out).contains("handoff run "),
        "{}",
        support::stderr(&out)
    );
    // A mistyped consumer is named, with the one there is.
    let out = recover(
        &live,
        &["--consumer-id", "orders-to-outbx", "--reason", "x"],
    );
    support::refused(&out, 2, "no consumer orders-to-outbx");
    assert!(support::stderr(&out).contains("orders-to-outbox"));
    // A reason is required, and must be printable.
    support::refused(&recover(&live, &[]), 2, "--reason is required");
    support::refused(&recover(&live, &["--reason", " "]), 2, "--reason");
    support::refused(&recover(&live, &["--reason", "a\u{7}b"]), 2, "U+0007");
    // A wider scope is recovered by hand.
    let out = recover(&live, &["--scope", "database", "--reason", "x"]);
    support::refused(&out, 2, "checkpoint reset");
    assert_eq!(state(&live), healthy);

    // Lost history under a run's lease: refused (exit 3), the holder named; the dry run says so.
    insert_orders(&live, 5..60);
    update_rounds(&live, 2);
    support::fails(&live.run(&[]), 6, "ChangeStreamHistoryLost");
    let until = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000);
    live.wait(live.coll(CHECKPOINTS).update_one(
        doc! { "_id": CONSUMER },
        doc! { "$set": { "owner": "handoff@worker-3:1:1", "leaseUntil": until } },
    ))
    .expect("plant a lease");
    let leased = state(&live);
    let out = recover(&live, &["--reason", "INC-5"]);
    support::refused(&out, 3, "handoff@worker-3:1:1");
    let dry = support::json_stdout(&recover(&live, &["--dry-run", "--json"]));
    assert!(
        dry["refused"].as_str().unwrap().contains("worker-3"),
        "{dry}"
    );
    assert_eq!(state(&live), leased);

    // A consumer of one partition: its outbox is not the collection's.
    let out = live.run(&["--consumer-id", "half", "--partition", "0/2"]);
    support::ok(&out);
    let out = recover(&live, &["--consumer-id", "half", "--reason", "x"]);
    support::refused(&out, 2, "partition");
    assert!(support::stderr(&out).contains("handoff checkpoint reset"));
    assert_eq!(live.records(AUDIT).len(), 0);
}
