//! Faults injected through fail points (`configureFailPoint`): each run either recovers with nothing
//! lost or repeated, or stops with a clear error, its documented exit code, and a checkpoint that
//! matches the outbox. The next unhindered run then hands off the rest exactly once.

use crate::support;

use std::time::{Duration, Instant};

use bson::{Document, doc};
use mongo_sim::Config;
use support::live::*;

/// After a fault: an unhindered run hands off what is left, and the outbox holds every event of
/// the stream after `start` exactly once, in order, with the checkpoint at the end.
fn assert_all_handed_off_once(live: &Live, start: &Document, events: usize) {
    // A run whose writes were refused could not give its lease back either.
    live.expire_lease();
    support::ok(&live.run(&[]));
    let stream = live.events_after(start);
    assert_eq!(stream.len(), events);
    assert_eq!(
        outbox_event_ids(&live.outbox()),
        stream.iter().map(event_id).collect::<Vec<_>>()
    );
    assert_checkpoint_at_end(live, stream.last().unwrap().get_document("_id").unwrap());
}

/// The outbox holds exactly the stream's events up to the checkpoint (an event's token or a
/// high-water mark), each once and in order: nothing was skipped and nothing lies beyond it.
fn assert_checkpoint_matches_outbox(live: &Live, start: &Document) {
    // Checkpoint and outbox move together; read them until no commit lands in between.
    let (checkpoint, outbox) = loop {
        let before = live.checkpoint_token();
        let outbox = live.outbox();
        if live.checkpoint_token() == before {
            break (before, outbox);
        }
    };
    let at = token_hex(&checkpoint);
    let stream = live.events_after(start);
    let (upto, beyond): (Vec<_>, Vec<_>) = stream
        .iter()
        .partition(|e| token_hex(e.get_document("_id").unwrap()) <= at);
    assert_eq!(
        outbox_event_ids(&outbox),
        upto.into_iter().map(event_id).collect::<Vec<_>>()
    );
    // The start, an event's token or a high-water mark, whatever the deployment's token layout:
    // the server resumes from it at the first event the outbox does not hold.
    assert_eq!(
        live.events_after(&checkpoint)
            .iter()
            .map(event_id)
            .collect::<Vec<_>>(),
        beyond.into_iter().map(event_id).collect::<Vec<_>>(),
        "the checkpoint {at} is no position of the stream"
    );
}

#[test]
fn a_write_conflict_on_commit_is_retried_and_committed_once() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..4);
    live.fail_point(
        doc! {"times": 2}.into(),
        doc! {"failCommands": ["commitTransaction"], "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
    );
    let output = live.run(&[]);
    let out = support::ok(&output);
    assert_eq!(out["events_handed_off"], 4);
    let retries = support::stderr(&output)
        .matches("transient transaction error; retrying")
        .count();
    assert_eq!(retries, 2, "{}", support::stderr(&output));
    // The metrics line counts them.
    assert_eq!(support::metric(&output, "transaction_retries"), 2);
    assert_all_handed_off_once(&live, &start, 4);
    if shared_uri().is_none() {
        // The retry window comes from the server's transaction lifetime, asked once, when the
        // first transient error arrived (a routine run never asks).
        let asked = live
            .commands_from_handoff()
            .iter()
            .filter(|c| *c == "getParameter")
            .count();
        assert_eq!(asked, 1);
    }
}

#[test]
fn a_transaction_lifetime_the_server_did_not_give_is_asked_again() {
    // Its own test server, whatever MONGODB_URI says: the commands the run sent are read back.
    let live = Live::with_config(Config::default());
    let start = live.start_consumer();
    live.insert(0..4);
    // The first commit fails as transient, then the question about the lifetime fails, then the
    // second commit fails as transient: the 60 s assumed the first time is not kept.
    live.fail_point(
        doc! {"times": 3}.into(),
        doc! {"failCommands": ["commitTransaction", "getParameter"], "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
    );
    live.server().clear_received_commands();
    let output = live.run(&[]);
    assert_eq!(support::ok(&output)["events_handed_off"], 4);
    assert_eq!(support::metric(&output, "transaction_retries"), 2);
    let asked = live
        .commands_from_handoff()
        .iter()
        .filter(|c| *c == "getParameter")
        .count();
    assert_eq!(asked, 2);
    assert_all_handed_off_once(&live, &start, 4);
}

#[test]
fn a_connection_closed_on_get_more_is_resumed_without_loss_or_repeat() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..3);
    // The stream is cut twice, after the run has read some events.
    live.fail_point(
        doc! {"skip": 1, "times": 2}.into(),
        doc! {"failCommands": ["getMore"], "closeConnection": true},
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = live.background(async move |_, db| {
        let orders = db.collection::<Document>("orders");
        rx.recv().unwrap();
        for i in 3..12 {
            orders.insert_one(doc! {"_id": i}).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let child = live.spawn(&["--max-wait-seconds", "2"]);
    tx.send(()).unwrap();
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let out = support::ok(&output);
    assert_eq!(live.fail_point_off(), 2, "the stream was not cut twice");
    let handed_off = out["events_handed_off"].as_u64().unwrap() as usize;
    assert_eq!(live.outbox_len(), handed_off);
    assert_checkpoint_matches_outbox(&live, &start);
    assert_all_handed_off_once(&live, &start, 12);
}

#[test]
fn a_commit_slower_than_the_run_deadline_stops_the_run_with_the_checkpoint_intact() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..5);
    live.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "blockConnection": true, "blockTimeMS": 2500},
    );
    let started = Instant::now();
    let output = live.run(&["--run-timeout-seconds", "1"]);
    let took = started.elapsed();
    // The blocked commit was in flight when the deadline passed: the host stops waiting, says
    // its outcome is unknown, and writes nothing more; whatever the server did with it stands.
    support::fails(
        &output,
        10,
        "the run deadline passed while a transaction was in flight",
    );
    eprintln!(
        "slow commit: stopped after {took:?}: {}",
        support::stderr(&output).trim()
    );
    assert!(took < Duration::from_secs(15), "stopping took {took:?}");
    assert!(live.outbox_len() <= 1);
    assert_checkpoint_matches_outbox(&live, &start);
    // The server may still apply the abandoned commit while the next run starts; that run then
    // loses its compare-and-set (exit 3) instead of writing anything twice, and a later run
    // finishes the work.
    let next = live.run(&[]);
    assert!(
        matches!(next.status.code(), Some(0 | 3)),
        "{}",
        support::stderr(&next)
    );
    assert_checkpoint_matches_outbox(&live, &start);
    assert_all_handed_off_once(&live, &start, 5);
}

#[test]
fn a_commit_blocked_far_past_the_run_deadline_does_not_hold_the_run() {
    // The run's wall time includes its host calls: a commit the server holds for 8 s must not
    // keep a 1 s run alive for 8 s. Whatever the commit's fate, the checkpoint matches the outbox.
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..3);
    live.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "blockConnection": true, "blockTimeMS": 8000},
    );
    let started = Instant::now();
    let output = live.run(&["--run-timeout-seconds", "1"]);
    let took = started.elapsed();
    assert_ne!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    let code = output.status.code().expect("an exit code");
    let out = support::failure_outputs(&output, code);
    assert_eq!(out["events_handed_off"], 0, "{out}");
    assert_eq!(live.fail_point_off(), 1, "the commit was never held");
    assert_checkpoint_matches_outbox(&live, &start);
    assert!(
        took < Duration::from_secs(5),
        "a 1 s run stopped only after {took:?}: {}",
        support::stderr(&output).trim()
    );
}

#[test]
fn history_lost_while_a_run_reads_fails_with_the_checkpoint_untouched() {
    let live = Live::with_config(Config {
        history_limit: 10,
        ..Config::default()
    });
    let start = live.start_consumer();
    live.insert(0..2);
    let mut child = live.command();
    let mut child = child
        .env("HANDOFF_LOG", "handoff=debug")
        .args(["--max-wait-seconds", "5"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the run has committed the two events and waits for more, a burst pushes its resume
    // point out of the retained history.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let mut committed = 0;
    while committed < 2 {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0,
            "the run ended early: {log}"
        );
        committed += usize::from(line.contains("event committed"));
        log.push_str(&line);
    }
    let before = live.position();
    live.insert(100..140);
    std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(6), "{log}");
    assert!(log.contains("error[history_lost]"), "{log}");
    assert!(log.contains("ChangeStreamHistoryLost"), "{log}");
    assert!(
        log.contains("reconcile from a verified snapshot before resetting this consumer"),
        "{log}"
    );
    assert_eq!(live.position(), before);
    // What the run committed stands: its two events, the checkpoint at the second.
    let outbox = live.outbox();
    assert_eq!(outbox_event_ids(&outbox).len(), 2);
    assert_eq!(
        outbox[1]
            .get_document("event")
            .unwrap()
            .get_document("_id")
            .unwrap(),
        &live.checkpoint_token()
    );
    assert_ne!(live.checkpoint_token(), start);
    // The next run fails the same way and still writes nothing: the gap is never skipped.
    support::fails(&live.run(&[]), 6, "ChangeStreamHistoryLost");
    assert_eq!(live.position(), before);
    assert_eq!(live.outbox_len(), 2);
}

/// `NotWritablePrimary` on one command: the run either recovers with nothing lost or stops as
/// unavailable (exit 10) with the checkpoint matching the outbox.
fn not_writable_primary(wire_version: i32, command: &str, mode: Document) -> Option<i32> {
    // Transient errors are retried for the server's transaction lifetime plus 15 s: a 1 s
    // lifetime keeps a refusal on every attempt to about 16 s of retries.
    let live = Live::with_config(Config {
        transaction_lifetime: Duration::from_secs(1),
        max_wire_version: wire_version,
        ..Config::default()
    });
    let start = live.start_consumer();
    live.insert(0..4);
    live.fail_point(
        mode.into(),
        doc! {"failCommands": [command], "errorCode": 10107},
    );
    let output = live.run(&[]);
    assert!(
        live.fail_point_off() >= 1,
        "{command}: the fail point never fired"
    );
    match output.status.code() {
        Some(0) => {
            let out = support::outputs(&output);
            assert_eq!(out["events_handed_off"], 4);
        }
        Some(10) => {
            let err = support::stderr(&output);
            assert!(err.contains("error[unavailable]"), "{err}");
            assert!(err.contains("NotWritablePrimary"), "{err}");
            let out = support::failure_outputs(&output, 10);
            assert_eq!(out["error_class"], "unavailable");
        }
        other => panic!(
            "{command}: unexpected exit {other:?}: {}",
            support::stderr(&output)
        ),
    }
    assert_checkpoint_matches_outbox(&live, &start);
    assert_all_handed_off_once(&live, &start, 4);
    output.status.code()
}

#[test]
fn a_primary_refusing_writes_never_loses_or_repeats_an_event() {
    // MongoDB 8.0 (one bulkWrite per transaction) and 7.0 (an update and an insert).
    for (wire_version, update, insert) in [(25, "bulkWrite", "bulkWrite"), (21, "update", "insert")]
    {
        let mut outcomes = Vec::new();
        for (command, mode) in [
            // The checkpoint upsert (a retryable write); the first update is the compare-and-set
            // inside the first handoff transaction, the second the next one's.
            ("findAndModify", doc! {"times": 1}),
            (update, doc! {"times": 1}),
            (update, doc! {"skip": 1, "times": 1}),
            (insert, doc! {"times": 1}),
            ("commitTransaction", doc! {"times": 1}),
            ("commitTransaction", doc! {"skip": 2, "times": 3}),
            (update, doc! {"skip": 1, "times": 50}),
        ] {
            let outcome = not_writable_primary(wire_version, command, mode.clone());
            outcomes.push((command, mode, outcome));
        }
        eprintln!("wire version {wire_version}: {outcomes:?}");
        // A refusal on every attempt cannot be recovered within the run: it stops as unavailable.
        assert_eq!(outcomes.last().unwrap().2, Some(10));
    }
}

#[test]
fn a_failed_commit_leaves_no_transaction_open_for_the_next_run() {
    // Its own test server, whatever MONGODB_URI says: the commands the run sent are read back.
    let live = Live::with_config(Config::default());
    let start = live.start_consumer();
    live.insert(0..3);
    // A non-transient failure in front of the commit: the transaction stays open on the server
    // unless the run ends it.
    live.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "errorCode": 8},
    );
    live.server().clear_received_commands();
    let failed = live.command().env("HANDOFF_LOG", "warn").output().unwrap();
    assert_eq!(
        failed.status.code(),
        Some(10),
        "{}",
        support::stderr(&failed)
    );
    assert_eq!(live.fail_point_off(), 1);
    // The failed run ended its transaction, then its sessions, before it exited.
    let sent = live.commands_from_handoff();
    let commit = sent.iter().position(|c| c == "commitTransaction");
    let abort = sent.iter().rposition(|c| c == "abortTransaction");
    let ended = sent.iter().rposition(|c| c == "endSessions");
    assert!(
        commit < abort && abort < ended && commit.is_some(),
        "{sent:?}"
    );
    assert_eq!(live.outbox_len(), 0, "the failed commit wrote records");
    assert_eq!(
        live.checkpoint_token(),
        start,
        "the failed commit moved the checkpoint"
    );
    // The next run at once: its compare-and-set meets no transaction left open.
    let next = live.command().env("HANDOFF_LOG", "warn").output().unwrap();
    let out = support::ok(&next);
    assert_eq!(out["events_handed_off"], 3);
    let log = support::stderr(&next);
    assert!(
        !log.contains("transient transaction error; retrying"),
        "the next run met the failed run's transaction: {log}"
    );
    assert_all_handed_off_once(&live, &start, 3);
}

#[test]
fn a_transaction_a_killed_run_left_open_is_waited_out_within_the_server_lifetime() {
    // Longer than the fixed retry window of earlier versions (15 s), shorter than MongoDB's 60 s.
    let live = Live::with_config(Config {
        transaction_lifetime: Duration::from_secs(20),
        ..Config::default()
    });
    let start = live.start_consumer();
    live.insert(0..2);
    // What a killed run leaves behind: a transaction holding the checkpoint that nobody ends.
    let mut holder = live.wait(live.client.start_session()).unwrap();
    live.wait(holder.start_transaction()).unwrap();
    live.wait(
        live.coll(CHECKPOINTS)
            .update_one(doc! {"_id": CONSUMER}, doc! {"$set": {"held": true}})
            .session(&mut holder),
    )
    .unwrap();
    std::mem::forget(holder);
    // The run's first write on the checkpoint (taking its lease) waits for that transaction, as
    // MongoDB makes a write outside a transaction wait for one holding its document, until the
    // server expires it; then the run goes on.
    let output = live.command().env("HANDOFF_LOG", "warn").output().unwrap();
    let out = support::ok(&output);
    assert_eq!(out["events_handed_off"], 2);
    assert!(
        live.checkpoint().unwrap().get("held").is_none(),
        "the abandoned transaction's write was applied"
    );
    assert_all_handed_off_once(&live, &start, 2);
}

/// A server without `bulkWrite` — older than MongoDB 8.0 (the driver refuses before sending), or
/// 8.0 at feature compatibility version 7.0 (the server refuses) — costs the first commit one
/// abandoned transaction, no retry, and the run goes on with separate writes.
#[test]
fn a_server_without_bulk_write_is_written_with_separate_commands_at_no_retry() {
    for (wire_version, lowered) in [(21, false), (25, true)] {
        let live = Live::with_config(Config {
            max_wire_version: wire_version,
            ..Config::default()
        });
        if lowered {
            live.wait(
                live.client
                    .database("admin")
                    .run_command(doc! {"setFeatureCompatibilityVersion": "7.0", "confirm": true}),
            )
            .expect("feature compatibility version lowered");
        }
        let start = live.start_consumer();
        live.insert(0..3);
        live.server().clear_received_commands();
        let output = live.run(&[]);
        let out = support::ok(&output);
        assert_eq!(out["events_handed_off"], 3);
        assert_eq!(support::metric(&output, "transaction_retries"), 0);
        assert!(
            !support::stderr(&output).contains("retrying"),
            "{}",
            support::stderr(&output)
        );
        let sent = live.commands_from_handoff();
        let count = |name: &str| sent.iter().filter(|c| *c == name).count();
        // Asked once (8.0 at 7.0's feature compatibility version answers), never by a driver
        // that knows the server is older.
        assert_eq!(count("bulkWrite"), usize::from(lowered), "{sent:?}");
        // Each transaction is a compare-and-set and its records (the last one may move the
        // checkpoint alone, to the stream's position).
        assert_eq!(count("insert"), 3, "{sent:?}");
        // And the lease: taken with an update (after the findAndModify that reads the
        // checkpoint), given back with another, and the run's record (an upsert) beside it.
        assert_eq!(count("update"), count("commitTransaction") + 3, "{sent:?}");
        assert_eq!(count("findAndModify"), 1, "{sent:?}");
        assert!(count("abortTransaction") <= 1, "{sent:?}");
        assert_eq!(count("getParameter"), 0, "{sent:?}");
        assert_all_handed_off_once(&live, &start, 3);
    }
}

/// An operator's writes go through the same transaction runner as a run's commits: a reset whose
/// commit meets a transient error is retried and written once; a repair whose commit's outcome
/// is unknown has its commit retried, and its records are written once.
#[test]
fn operator_writes_meet_the_runners_retries_and_are_written_once() {
    let live = Live::with_config(Config::default());
    live.start_consumer();
    live.insert(0..3);
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 3);
    let before = live.checkpoint_token();
    live.insert(3..5);

    live.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
    );
    let reset = live.operator(&[
        "checkpoint",
        "reset",
        "--to",
        "now",
        "--reason",
        "fault test",
    ]);
    assert!(reset.status.success(), "{}", support::stderr(&reset));
    assert_eq!(
        live.fail_point_off(),
        1,
        "the reset's first commit was refused"
    );
    assert_ne!(live.checkpoint_token(), before, "the checkpoint moved");
    assert_eq!(
        live.records("kestra_change_audit").len(),
        1,
        "one audit record"
    );

    // Documents 3 and 4 were skipped by the reset: the repair hands them off.
    live.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "errorCode": 50, "errorLabels": ["UnknownTransactionCommitResult"]},
    );
    let repair = live.operator(&["reconcile", "--repair", "--reason", "fault test", "--json"]);
    assert_eq!(
        repair.status.code(),
        Some(0),
        "{}",
        support::stderr(&repair)
    );
    assert_eq!(
        live.fail_point_off(),
        1,
        "the repair's commit result was unknown once"
    );
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 5, "{outbox:?}");
    let mut ids: Vec<String> = outbox
        .iter()
        .map(|r| r.get_str("_id").expect("an id").to_string())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "each record once");
    assert_eq!(live.records("kestra_change_audit").len(), 2);
    let check = live.operator(&["reconcile", "--json"]);
    assert_eq!(check.status.code(), Some(0), "{}", support::stderr(&check));
}
