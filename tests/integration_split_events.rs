//! Events over 16 MiB: without `--split-large-events` the run stops with their own class and says
//! to enable it; with it, an event's fragments are handed off as one event, one record each, in
//! one transaction, runs killed at any moment while they are read or committed lose and
//! duplicate nothing, and an event handed off again after a reset, split otherwise or whole, is a
//! duplicate.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use bson::{Bson, Document, doc};
use support::live::*;

/// Half of an oversized event: a document field of this many bytes (an update's event carries
/// it twice, in `updateDescription` and in the looked-up `fullDocument`).
const HALF: usize = 9 << 20;

/// Inserts `{_id: key, a: …}` and rewrites `a`: the update's event is about 18 MiB.
fn big_update(live: &Live, key: i32, fill: char) {
    let orders = live.coll("orders");
    live.wait(orders.insert_one(doc! {"_id": key, "a": "-".repeat(HALF)}))
        .unwrap();
    live.wait(orders.update_one(
        doc! {"_id": key},
        doc! {"$set": {"a": fill.to_string().repeat(HALF)}},
    ))
    .unwrap();
}

const SPLIT: [&str; 1] = ["--split-large-events"];

/// `checkpoint reset` of the consumer back to `token` (resumeAfter): every event after it is
/// handed off again.
fn reset_to(live: &Live, token: &Document) {
    let token =
        serde_json::to_string(&Bson::Document(token.clone()).into_relaxed_extjson()).unwrap();
    let output = support::handoff()
        .args(["checkpoint", "reset", "--to-token", &token])
        .args(["--mode", "resumeAfter", "--reason", "hand off again"])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", support::stderr(&output));
}

/// A first, idle run with `args`: where the consumer starts.
fn start_consumer(live: &Live, args: &[&str]) -> Document {
    assert_eq!(support::ok(&live.run(args))["status"], "IDLE");
    live.checkpoint_token()
}

/// The `_id`s of the outbox records, in insertion order.
fn outbox_ids(live: &Live) -> Vec<String> {
    live.outbox()
        .iter()
        .map(|r| r.get_str("_id").unwrap().to_string())
        .collect()
}

/// The records of each event, by event ID, with their fragment numbers.
fn by_event(outbox: &[Document]) -> HashMap<String, Vec<(u32, u32, Document)>> {
    let mut events: HashMap<String, Vec<(u32, u32, Document)>> = HashMap::new();
    for record in outbox {
        let id = record.get_str("_id").unwrap();
        let event = record.get_document("event").unwrap().clone();
        let (base, k, n) = match id.rsplit_once('.') {
            Some((base, part)) if part.contains("of") => {
                let (k, n) = part.split_once("of").unwrap();
                (base.to_string(), k.parse().unwrap(), n.parse().unwrap())
            }
            _ => (id.to_string(), 1, 1),
        };
        events.entry(base).or_default().push((k, n, event));
    }
    events
}

/// An event put together again from its fragments' fields.
fn reassemble(parts: &[(u32, u32, Document)]) -> Document {
    let mut whole = Document::new();
    for (_, _, fragment) in parts {
        for (key, value) in fragment {
            if key != "_id" && key != "splitEvent" {
                whole.insert(key.clone(), value.clone());
            }
        }
    }
    whole
}

#[test]
fn an_event_over_16_mib_stops_the_run_until_it_is_split_then_goes_as_one() {
    let live = Live::start();
    live.start_consumer();
    big_update(&live, 1, 'u');
    let stopped = live.run(&[]);
    support::fails(&stopped, 13, "--split-large-events");
    assert!(
        live.outbox().iter().all(|r| r
            .get_document("event")
            .unwrap()
            .get_str("operationType")
            .unwrap()
            == "insert"),
        "the update was not handed off"
    );

    let out = support::ok(&live.run(&[
        "--split-large-events",
        "--accept-config-change",
        "events over 16 MiB",
    ]));
    assert_eq!(out["status"], "HANDED_OFF");
    let outbox = live.outbox();
    let events = by_event(&outbox);
    assert_eq!(events.len(), 2, "the insert and the update");
    let update = events
        .values()
        .find(|parts| parts.len() > 1)
        .expect("the update in fragments");
    let n = update.len() as u32;
    for (index, (k, of, fragment)) in update.iter().enumerate() {
        assert_eq!((*k, *of), (index as u32 + 1, n));
        assert_eq!(
            fragment.get_document("splitEvent").unwrap(),
            &doc! {"fragment": *k as i32, "of": n as i32}
        );
        assert!(fragment.to_vec().unwrap().len() <= 16 << 20);
    }
    let whole = reassemble(update);
    assert_eq!(whole.get_str("operationType").unwrap(), "update");
    let after = "u".repeat(HALF);
    assert_eq!(
        whole
            .get_document("fullDocument")
            .unwrap()
            .get_str("a")
            .unwrap(),
        after
    );
    assert_eq!(
        whole
            .get_document("updateDescription")
            .unwrap()
            .get_document("updatedFields")
            .unwrap()
            .get_str("a")
            .unwrap(),
        after
    );
    // The checkpoint is at the last fragment, or at an idle watermark past it; the next run
    // finds nothing more.
    let last = update
        .last()
        .unwrap()
        .2
        .get_document("_id")
        .unwrap()
        .clone();
    assert!(token_hex(&live.checkpoint_token()) >= token_hex(&last));
    assert_eq!(support::ok(&live.run(&SPLIT))["events_handed_off"], 0);
}

#[test]
fn runs_killed_among_split_events_lose_and_duplicate_nothing() {
    // A killed run's open transaction holds the checkpoint until the server expires it: a short
    // lifetime keeps the test short (the next run waits it out, as it would on MongoDB).
    let live = Live::with_config(mongo_sim::Config {
        transaction_lifetime: Duration::from_secs(1),
        ..mongo_sim::Config::default()
    });
    support::ok(&live.run(&SPLIT));
    for (key, fill) in [(1, 'a'), (2, 'b'), (3, 'c')] {
        big_update(&live, key, fill);
    }
    let mut kills = 0;
    for delay_ms in [150, 400, 700, 1000, 1400, 2000] {
        let mut child = live.spawn(&["--split-large-events", "--max-events", "500"]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        let _ = child.wait();
        // The killed run's lease would hold the consumer for a minute: expire it, as time would.
        live.expire_lease();
    }
    while support::ok(&live.run(&SPLIT))["events_handed_off"] != 0 {}

    let outbox = live.outbox();
    let events = by_event(&outbox);
    // Three inserts and three updates, each update in all its fragments, each record once.
    assert_eq!(events.len(), 6, "{kills} kills");
    let mut ids: Vec<&str> = outbox.iter().map(|r| r.get_str("_id").unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), outbox.len());
    for parts in events.values() {
        let n = parts[0].1;
        let mut numbers: Vec<u32> = parts.iter().map(|p| p.0).collect();
        numbers.sort_unstable();
        assert_eq!(numbers, (1..=n).collect::<Vec<_>>(), "every fragment, once");
        assert!(parts.iter().all(|p| p.1 == n));
    }
    let updates: Vec<Document> = events
        .values()
        .filter(|parts| parts.len() > 1)
        .map(|parts| reassemble(parts))
        .collect();
    assert_eq!(updates.len(), 3);
    for update in &updates {
        let key = update
            .get_document("documentKey")
            .unwrap()
            .get_i32("_id")
            .unwrap();
        let fill = ['a', 'b', 'c'][key as usize - 1];
        assert_eq!(
            update
                .get_document("fullDocument")
                .unwrap()
                .get("a")
                .and_then(Bson::as_str)
                .map(|a| a.len() == HALF && a.chars().all(|c| c == fill)),
            Some(true)
        );
    }
    eprintln!("{kills} runs killed among the split events");
    assert!(kills >= 1, "no run was killed: the test tested nothing");
}

#[test]
fn an_event_split_otherwise_after_a_reset_is_a_duplicate() {
    let live = Live::start();
    // Pre-images make the update larger when a run asks for them.
    live.wait(
        live.client.database(&live.db).run_command(
            doc! {"create": "orders", "changeStreamPreAndPostImages": {"enabled": true}},
        ),
    )
    .unwrap();
    let start = start_consumer(&live, &SPLIT);
    big_update(&live, 1, 'u');
    let first = support::ok(&live.run(&SPLIT));
    assert_eq!(first["events_handed_off"], 2);
    let before = outbox_ids(&live);
    let events = by_event(&live.outbox());
    assert_eq!(
        events.values().map(Vec::len).max(),
        Some(2),
        "the update in two fragments: {before:?}"
    );

    // Handed off again with its pre-image, the update is split in three: its ID (its first
    // fragment's token) is the same, and the event is not written again.
    reset_to(&live, &start);
    let again = support::ok(&live.run(&[
        "--split-large-events",
        "--full-document-before-change",
        "whenAvailable",
        "--accept-config-change",
        "pre-images",
    ]));
    assert_eq!(again["events_handed_off"], 2, "{again}");
    assert_eq!(again["duplicates_suppressed"], 2, "{again}");
    assert_eq!(outbox_ids(&live), before);
}

#[test]
fn an_event_split_or_whole_after_a_reset_is_a_duplicate_under_the_same_id() {
    let live = Live::start();
    let policy = ["--policy", handoff_test_policies::KEYED_IDS];
    let lookup = |full_document: &'static str| -> Vec<&'static str> {
        let mut args = policy.to_vec();
        args.extend([
            "--split-large-events",
            "--full-document",
            full_document,
            "--accept-config-change",
            "document lookups",
        ]);
        args
    };
    // Without the looked-up document, an update of `a` is about 9 MiB: whole.
    let start = start_consumer(&live, &lookup("default"));
    big_update(&live, 1, 'a');
    let first = support::ok(&live.run(&lookup("default")));
    assert_eq!(first["events_handed_off"], 2);
    let stored_whole = outbox_ids(&live);
    assert_eq!(stored_whole.len(), 2, "{stored_whole:?}");

    // Stored whole, handed off again in fragments (the document looked up makes it 18 MiB).
    reset_to(&live, &start);
    let again = support::ok(&live.run(&lookup("updateLookup")));
    assert_eq!(again["duplicates_suppressed"], 2, "{again}");
    assert_eq!(outbox_ids(&live), stored_whole);

    // Another update stored in fragments, handed off again whole.
    big_update(&live, 2, 'b');
    support::ok(&live.run(&lookup("updateLookup")));
    let stored = outbox_ids(&live);
    let events = by_event(&live.outbox());
    assert_eq!(events.len(), 4, "{stored:?}");
    assert_eq!(
        stored.len(),
        5,
        "the second update in two fragments: {stored:?}"
    );
    reset_to(&live, &start);
    let again = support::ok(&live.run(&lookup("default")));
    assert_eq!(again["events_handed_off"], 4, "{again}");
    assert_eq!(again["duplicates_suppressed"], 4, "{again}");
    assert_eq!(outbox_ids(&live), stored);
}

/// A document whose one field fills 16 MiB: its insert event cannot be split, since no fragment
/// can hold that field beside a token.
const UNSPLITTABLE: usize = (16 << 20) - 64;

/// An event with a field too large for any fragment (MongoDB's 7182500) stops the run with the
/// class of events too large, saying what can be done instead of splitting; nothing is written.
#[test]
fn an_event_too_large_for_any_fragment_stops_the_run_as_too_large() {
    let live = Live::start();
    assert_eq!(support::ok(&live.run(&SPLIT))["status"], "IDLE");
    let before = live.checkpoint_token();
    live.wait(
        live.coll("orders")
            .insert_one(doc! {"_id": 1, "a": "x".repeat(UNSPLITTABLE)}),
    )
    .unwrap();
    let output = live.run(&SPLIT);
    let out = support::fails(&output, 13, "code 7182500");
    assert_eq!(out["error_class"], "event_too_large");
    let guidance = out["guidance"].as_str().unwrap();
    assert!(
        guidance.contains("a field too large for any fragment"),
        "{guidance}"
    );
    assert!(guidance.contains("$project"), "{guidance}");
    assert!(
        !guidance.contains("Run with --split-large-events"),
        "the run already splits: {guidance}"
    );
    assert_eq!(live.outbox_len(), 0);
    assert_eq!(live.checkpoint_token(), before);
}

/// A recorded stream failing with 7182500 is classified the same way.
#[test]
fn a_recorded_stream_that_cannot_split_an_event_fails_as_too_large() {
    let s = support::Scratch::new();
    let fixture = s.fixture(
        "unsplittable.jsonl",
        &[
            support::deployment(support::REPLICA_SET_ID),
            support::event(1, "insert"),
            serde_json::json!({"$error": {"code": 7182500, "codeName": "Location7182500",
                "errmsg": "Splitting change event failed"}}),
        ],
    );
    let output = support::replay(&fixture, &s.state(), &[]);
    let out = support::fails(&output, 13, "code 7182500");
    assert!(
        out["guidance"]
            .as_str()
            .unwrap()
            .contains("a field too large for any fragment"),
        "{out}"
    );
    let (checkpoint, outbox) = support::inspect(&s.state());
    assert_eq!(outbox.len(), 1, "the event before it stands");
    assert_eq!(checkpoint["token"], support::token(1));
}
