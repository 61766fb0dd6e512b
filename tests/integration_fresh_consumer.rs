//! A fresh consumer's first run saves the stream's starting position before it delivers a single
//! event. Whatever ends that run before its first commit — a kill, a failed commit — the next run
//! resumes from that position: the events written in between are handed off, never skipped by a
//! stream opened "now" a second time.

use crate::support;

use std::time::{Duration, Instant};

use bson::{Bson, doc};
use support::live::*;

/// Waits until the run has saved a starting position (at most a few seconds: a run that never
/// saves one is then interrupted anyway, and the assertions below catch the loss).
fn wait_for_a_saved_position(live: &Live) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        if live
            .checkpoint()
            .is_some_and(|c| matches!(c.get("token"), Some(Bson::Document(_))))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The `_id`s of the documents whose events reached the outbox, in order.
fn handed_off_documents(live: &Live) -> Vec<i32> {
    live.outbox()
        .iter()
        .map(|record| {
            record
                .get_document("event")
                .and_then(|e| e.get_document("documentKey"))
                .and_then(|k| k.get_i32("_id"))
                .expect("documentKey._id")
        })
        .collect()
}

fn insert(live: &Live, id: i32) {
    live.wait(live.coll("orders").insert_one(doc! {"_id": id}))
        .expect("insert");
}

#[test]
fn a_first_run_killed_before_its_first_commit_loses_nothing() {
    let live = Live::start();
    let mut first = live.spawn(&["--max-wait-seconds", "10"]);
    let saved = wait_for_a_saved_position(&live);
    first.kill().expect("kill");
    first.wait().expect("reap");
    assert!(saved, "the first run saved no starting position");
    // Its lease would hold the consumer until it expires.
    live.expire_lease();
    insert(&live, 100);
    insert(&live, 101);
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 2);
    assert_eq!(handed_off_documents(&live), vec![100, 101]);
}

#[test]
fn a_first_run_whose_first_commit_fails_loses_nothing() {
    let live = Live::start();
    // The starting position's own transaction passes; the first event's commit fails for good.
    live.fail_point(
        doc! {"skip": 1, "times": 1}.into(),
        doc! {"failCommands": ["commitTransaction"], "errorCode": 8},
    );
    let first = live.spawn(&["--max-wait-seconds", "3"]);
    let saved = wait_for_a_saved_position(&live);
    insert(&live, 100);
    let output = first.wait_with_output().expect("first run");
    assert!(saved, "the first run saved no starting position");
    support::fails(&output, 10, "error[unavailable]");
    assert!(live.outbox().is_empty());
    insert(&live, 101);
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 2);
    assert_eq!(handed_off_documents(&live), vec![100, 101]);
}

/// A watched database or collection that does not exist is allowed (the stream waits for its
/// first write) but named in a warning with the near names: a typo does not pass silently.
#[test]
fn a_watched_namespace_that_does_not_exist_is_warned_of_with_the_near_names() {
    let live = Live::start();
    live.insert(0..1);
    let typo = format!("{}x", live.db);
    let output = live.run(&["--database", &typo]);
    support::ok(&output);
    let err = support::stderr(&output);
    assert!(
        err.contains(&format!(
            "the database {typo} does not exist; did you mean {}?",
            live.db
        )),
        "{err}"
    );
    let output = live.run(&["--collection", "ordres"]);
    support::ok(&output);
    let err = support::stderr(&output);
    assert!(
        err.contains("does not exist; did you mean orders?"),
        "{err}"
    );
    // The collection itself raises no warning.
    let output = live.run(&[]);
    assert!(!support::stderr(&output).contains("does not exist"));
}
