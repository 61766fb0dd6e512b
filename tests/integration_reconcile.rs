//! `handoff reconcile` against a replica set: a consumer's outbox that describes its source
//! reports 0/0/0; planted missing, orphan and stale keys are found exactly, with their exit code;
//! writes after the checkpoint are in flight, not differences; `--repair` hands off correction
//! records with one audit record, after which reconcile reports 0/0/0, and a second repair
//! writes nothing; outboxes that cannot be reconciled and bad flags are clear errors that write
//! nothing.

use crate::support;

use std::process::Output;

use bson::{Bson, Document, doc};
use serde_json::Value;
use support::live::*;

const AUDIT: &str = "kestra_change_audit";

/// `handoff reconcile --json EXTRA…` on the test's deployment and database.
fn reconcile(live: &Live, extra: &[&str]) -> Output {
    support::handoff()
        .arg("reconcile")
        .arg("--json")
        .args(extra)
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .env_remove(support::env_names::AUDIT_COLLECTION)
        .env_remove("HANDOFF_OPERATOR")
        .output()
        .expect("run handoff reconcile")
}

/// The JSON report of a reconcile that exited with `code`.
fn report(output: &Output, code: i32) -> Value {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        support::stderr(output)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON document on stdout")
}

/// `(missing, orphan, stale)` counts.
fn counts(report: &Value) -> (u64, u64, u64) {
    let n = |kind: &str| report[kind]["count"].as_u64().expect("a count");
    (n("missing"), n("orphan"), n("stale"))
}

fn keys(report: &Value, kind: &str) -> Vec<String> {
    report[kind]["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("a key text").to_string())
        .collect()
}

fn source_name(live: &Live) -> String {
    format!("{}.orders", live.db)
}

fn key_of(record: &Document) -> Option<Bson> {
    record
        .get_document("event")
        .ok()?
        .get_document("documentKey")
        .ok()?
        .get("_id")
        .cloned()
}

/// The outbox records of one document key.
fn records_of(live: &Live, key: i32) -> Vec<Document> {
    live.outbox()
        .into_iter()
        .filter(|r| key_of(r) == Some(Bson::Int32(key)))
        .collect()
}

fn count(live: &Live, collection: &str) -> u64 {
    live.wait(live.coll(collection).count_documents(doc! {}))
        .expect("count")
}

/// A consumer that ran over inserts, updates and deletes: documents 0..10 with 8 and 9 deleted.
fn consumer_with_history(live: &Live) {
    live.start_consumer();
    live.insert(0..10);
    let orders = live.coll("orders");
    for id in 0..5 {
        live.wait(orders.update_one(
            doc! {"_id": id},
            doc! {"$set": {"qty": id * 10, "note": "x"}},
        ))
        .expect("update");
    }
    live.wait(orders.delete_many(doc! {"_id": {"$in": [8, 9]}}))
        .expect("delete");
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 17, "{out}");
}

#[test]
fn planted_differences_are_found_exactly_and_a_repair_clears_them() {
    let live = Live::start();
    consumer_with_history(&live);
    let first = reconcile(&live, &[]);
    // The default log filter (no HANDOFF_LOG): a long command's progress, its last line at
    // least, and nothing else below a warning.
    let log = support::stderr(&first);
    assert!(
        log.lines()
            .any(|l| l.contains("INFO handoff::progress") && l.contains("finished=true")),
        "{log}"
    );
    assert!(
        log.lines()
            .all(|l| !(l.contains(" INFO ") || l.contains(" DEBUG "))
                || l.contains("handoff::progress")),
        "{log}"
    );
    let clean = report(&first, 0);
    assert_eq!(counts(&clean), (0, 0, 0), "{clean}");
    assert_eq!(clean["checked"], 8, "{clean}");
    assert_eq!(clean["in_flight"]["count"], 0, "{clean}");
    assert_eq!(clean["consumer"], CONSUMER);
    assert_eq!(clean["source"], source_name(&live));
    assert!(clean["checkpoint_cluster_time"].is_string(), "{clean}");

    // Missing: document 1's records lost. Stale: document 2's records say another quantity.
    // Orphan: a record for a document 100 the source never held.
    let outbox = live.coll(OUTBOX);
    live.wait(outbox.delete_many(doc! {"event.documentKey._id": 1}))
        .expect("delete records");
    live.wait(outbox.update_many(
        doc! {"event.documentKey._id": 2},
        doc! {"$set": {"event.fullDocument.qty": 999}},
    ))
    .expect("change records");
    let template = records_of(&live, 3).remove(0);
    let event = template.get_document("event").expect("event");
    live.wait(outbox.insert_one(doc! {
        "_id": format!("{CONSUMER}/planted-orphan"),
        "consumer": CONSUMER,
        "source": source_name(&live),
        "event": {
            "_id": event.get_document("_id").expect("token").clone(),
            "operationType": "insert",
            "clusterTime": event.get_timestamp("clusterTime").expect("clusterTime"),
            "ns": event.get_document("ns").expect("ns").clone(),
            "documentKey": {"_id": 100},
            "fullDocument": {"_id": 100, "qty": 1},
        },
    }))
    .expect("plant an orphan");

    // Writes after the checkpoint, not yet handed off: in flight, never differences.
    let orders = live.coll("orders");
    live.wait(orders.insert_one(doc! {"_id": 50, "qty": 5}))
        .expect("insert");
    live.wait(orders.update_one(doc! {"_id": 3}, doc! {"$set": {"qty": 33}}))
        .expect("update");
    live.wait(orders.delete_one(doc! {"_id": 4}))
        .expect("delete");

    let outbox_before = count(&live, OUTBOX);
    let found = report(&reconcile(&live, &[]), 16);
    assert_eq!(counts(&found), (1, 1, 1), "{found}");
    assert_eq!(keys(&found, "missing"), ["1"]);
    assert_eq!(keys(&found, "orphan"), ["100"]);
    assert_eq!(keys(&found, "stale"), ["2"]);
    assert_eq!(found["in_flight"]["count"], 3, "{found}");
    assert_eq!(found["differences"], 3, "{found}");

    // The human view names the same keys; --limit bounds the lists, not the counts.
    let human = support::handoff()
        .arg("reconcile")
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .output()
        .expect("reconcile");
    assert_eq!(human.status.code(), Some(16), "{}", support::stderr(&human));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("missing        1"), "{text}");
    assert!(text.contains("result: 3 differences"), "{text}");
    assert!(
        support::stderr(&human).contains("error[attention]"),
        "{}",
        support::stderr(&human)
    );
    // The HTML report lists the same keys, self-contained.
    let dir = tempfile::tempdir().expect("temporary folder");
    let page = dir.path().join("reconcile.html");
    let html = reconcile(&live, &["--html", page.to_str().expect("path")]);
    assert_eq!(html.status.code(), Some(16), "{}", support::stderr(&html));
    let page = std::fs::read_to_string(&page).expect("the report was written");
    for needle in [
        "missing keys",
        "orphan keys",
        "stale keys",
        "<td>100</td>",
        "in flight",
    ] {
        assert!(page.contains(needle), "{needle}: {page}");
    }
    assert!(!page.contains("<script") && !page.contains("http"));
    let limited = report(&reconcile(&live, &["--limit", "0"]), 16);
    assert_eq!(counts(&limited), (1, 1, 1));
    assert!(keys(&limited, "stale").is_empty());

    // --since: only keys whose latest record is at or after the time.
    let stale_time = records_of(&live, 2)
        .iter()
        .map(|r| {
            r.get_document("event")
                .unwrap()
                .get_timestamp("clusterTime")
                .unwrap()
        })
        .max()
        .expect("records of 2");
    let after = format!("{}.{}", stale_time.time + 100_000, 0);
    let none = report(&reconcile(&live, &["--since", &after]), 0);
    assert_eq!(counts(&none), (0, 0, 0), "{none}");
    assert_eq!(none["checked"], 0, "{none}");
    let at = format!("{}.{}", stale_time.time, stale_time.increment);
    let since = report(&reconcile(&live, &["--since", &at]), 16);
    assert_eq!(keys(&since, "stale"), ["2"], "{since}");
    assert_eq!(
        count(&live, OUTBOX),
        outbox_before,
        "reconcile wrote records"
    );
    assert_eq!(count(&live, AUDIT), 0, "reconcile wrote an audit record");

    // The repair: one correction record per difference, one audit record.
    let repaired = report(&reconcile(&live, &["--repair", "--reason", "planted"]), 0);
    assert_eq!(repaired["repair"]["written"], 3, "{repaired}");
    assert_eq!(count(&live, OUTBOX), outbox_before + 3);
    let audits = live.records(AUDIT);
    assert_eq!(audits.len(), 1, "{audits:?}");
    let audit = &audits[0];
    assert_eq!(audit.get_str("command").unwrap(), "reconcile --repair");
    assert_eq!(audit.get_str("reason").unwrap(), "planted");
    assert_eq!(audit.get_str("consumer").unwrap(), CONSUMER);
    let evidence = audit.get_document("evidence").unwrap();
    assert_eq!(evidence.get_i64("missing").unwrap(), 1);
    assert_eq!(evidence.get_i64("orphan").unwrap(), 1);
    assert_eq!(evidence.get_i64("stale").unwrap(), 1);
    let corrections: Vec<Document> = live
        .outbox()
        .into_iter()
        .filter(|r| r.get_document("snapshot").is_ok())
        .collect();
    assert_eq!(corrections.len(), 3);
    for record in &corrections {
        let event = record.get_document("event").unwrap();
        assert_eq!(event.get_str("operationType").unwrap(), "snapshot");
        assert_eq!(
            record
                .get_document("snapshot")
                .unwrap()
                .get_str("command")
                .unwrap(),
            "reconcile"
        );
        let key = key_of(record).unwrap();
        let held = live
            .wait(live.coll("orders").find_one(doc! {"_id": key.clone()}))
            .unwrap();
        match held {
            Some(document) => assert_eq!(
                event.get_document("fullDocument").unwrap(),
                &document,
                "{record}"
            ),
            None => {
                assert_eq!(key, Bson::Int32(100));
                assert_eq!(event.get("fullDocument"), Some(&Bson::Null));
            }
        }
        assert!(
            record
                .get_str("_id")
                .unwrap()
                .starts_with(&format!("{CONSUMER}/"))
        );
    }
    let after_repair = report(&reconcile(&live, &[]), 0);
    assert_eq!(counts(&after_repair), (0, 0, 0), "{after_repair}");
    assert_eq!(after_repair["in_flight"]["count"], 3, "{after_repair}");

    // A second repair finds nothing to repair and writes nothing.
    let again = report(&reconcile(&live, &["--repair", "--reason", "again"]), 0);
    assert_eq!(again["repair"]["written"], 0, "{again}");
    assert_eq!(count(&live, OUTBOX), outbox_before + 3);
    assert_eq!(count(&live, AUDIT), 1);

    // The consumer hands the in-flight writes off: nothing is in flight or different.
    support::ok(&live.run(&[]));
    let settled = report(&reconcile(&live, &[]), 0);
    assert_eq!(counts(&settled), (0, 0, 0), "{settled}");
    assert_eq!(settled["in_flight"]["count"], 0, "{settled}");
    assert_eq!(settled["checked"], 8, "{settled}");
}

#[test]
fn the_repair_checkpoint_is_untouched() {
    let live = Live::start();
    consumer_with_history(&live);
    let before = live.position();
    live.wait(
        live.coll(OUTBOX)
            .delete_many(doc! {"event.documentKey._id": 5}),
    )
    .expect("delete records");
    let repaired = report(&reconcile(&live, &["--repair", "--reason", "lost"]), 0);
    assert_eq!(repaired["missing"]["count"], 1, "{repaired}");
    assert_eq!(repaired["repair"]["written"], 1, "{repaired}");
    assert_eq!(live.position(), before);
    assert_eq!(counts(&report(&reconcile(&live, &[]), 0)), (0, 0, 0));
}

#[test]
fn a_shaped_record_without_its_event_is_a_clear_error() {
    let live = Live::start();
    consumer_with_history(&live);
    live.wait(live.coll(OUTBOX).insert_one(doc! {
        "_id": format!("{CONSUMER}/shaped"),
        "consumer": CONSUMER,
        "source": source_name(&live),
        "eventType": "order.changed",
        "payload": {"qty": 1},
    }))
    .expect("insert a shaped record");
    let out = reconcile(&live, &[]);
    support::refused(&out, 2, "1 of its records");
    assert!(support::stderr(&out).contains("without their change event"));
    assert!(out.stdout.is_empty(), "no report on a refusal");
}

#[test]
fn a_consumer_that_never_ran_and_too_many_in_flight_keys_are_clear_errors() {
    let live = Live::start();
    live.insert(0..3);
    support::refused(&reconcile(&live, &[]), 2, "never ran");

    live.start_consumer();
    live.insert(10..13);
    let out = reconcile(&live, &["--max-in-flight", "2"]);
    support::refused(&out, 3, "run the consumer first");
    let ok = report(&reconcile(&live, &["--max-in-flight", "3"]), 16);
    // Documents 0..3 were there before the consumer started: never handed off, missing.
    assert_eq!(counts(&ok), (3, 0, 0), "{ok}");
    assert_eq!(ok["in_flight"]["count"], 3, "{ok}");
}

#[test]
fn bad_flags_exit_2_and_write_nothing() {
    let live = Live::start();
    consumer_with_history(&live);
    live.wait(
        live.coll(OUTBOX)
            .delete_many(doc! {"event.documentKey._id": 0}),
    )
    .expect("delete records");
    let outbox = count(&live, OUTBOX);
    for flags in [
        &["--repair"][..],
        &["--reason", "why"],
        &["--repair", "--reason", " "],
        &["--since", "yesterday"],
        &["--since", "12.x"],
        &["--chunk-size", "0"],
        &["--limit", "-1"],
        &["--max-in-flight", "0"],
        &["--audit-collection", "1bad", "--repair", "--reason", "x"],
        &[
            "--audit-collection",
            "kestra_change_outbox",
            "--repair",
            "--reason",
            "x",
        ],
        &["--consumer-id", "bad id", "--repair", "--reason", "x"],
    ] {
        let out = reconcile(&live, flags);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            support::stderr(&out)
        );
        assert!(
            support::stderr(&out).contains("error[bad_input]"),
            "{flags:?}: {}",
            support::stderr(&out)
        );
    }
    assert_eq!(count(&live, OUTBOX), outbox);
    assert_eq!(count(&live, AUDIT), 0);
    let help = support::handoff()
        .args(["reconcile", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("16   attention"), "{text}");
    assert!(text.contains("--since"), "{text}");
}

#[test]
fn keys_of_every_type_are_read_chunk_by_chunk() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..1100);
    let oid = bson::oid::ObjectId::new();
    let others = vec![
        doc! {"_id": "a-string", "n": 1},
        doc! {"_id": "b-string", "n": {"nested": [1, 2]}},
        doc! {"_id": oid, "n": 3},
        doc! {"_id": {"compound": 1, "key": "x"}, "n": 4},
        doc! {"_id": 1.5, "n": 5},
        doc! {"_id": 7_000_000_000_i64, "n": 6},
        doc! {"_id": bson::DateTime::from_millis(1_000), "n": 7},
    ];
    live.wait(live.coll("orders").insert_many(others))
        .expect("insert");
    let mut handed_off = 0;
    loop {
        let out = support::ok(&live.run(&[]));
        let n = out["events_handed_off"].as_u64().expect("a count");
        handed_off += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(handed_off, 1107);
    let clean = report(&reconcile(&live, &["--chunk-size", "250"]), 0);
    assert_eq!(counts(&clean), (0, 0, 0), "{clean}");
    assert_eq!(clean["checked"], 1107, "{clean}");

    // One stale key of another type, and one missing among the numbers, are found.
    let outbox = live.coll(OUTBOX);
    live.wait(outbox.update_many(
        doc! {"event.documentKey._id": oid},
        doc! {"$set": {"event.fullDocument.n": 30}},
    ))
    .expect("change records");
    live.wait(outbox.delete_many(doc! {"event.documentKey._id": 1099}))
        .expect("delete records");
    let found = report(&reconcile(&live, &["--chunk-size", "7"]), 16);
    assert_eq!(counts(&found), (1, 0, 1), "{found}");
    assert_eq!(keys(&found, "missing"), ["1099"]);
    assert_eq!(
        keys(&found, "stale"),
        [format!("{{\"$oid\":\"{}\"}}", oid.to_hex())]
    );
}

#[test]
fn a_partitioned_consumer_is_refused() {
    let live = Live::start();
    support::ok(&live.run(&["--partition", "0/2"]));
    live.insert(0..4);
    support::ok(&live.run(&["--partition", "0/2"]));
    let out = reconcile(&live, &[]);
    support::refused(&out, 2, "one partition (0/2)");
}

#[test]
fn writes_while_reconcile_reads_are_in_flight_not_differences() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..600);
    while support::ok(&live.run(&[]))["events_handed_off"] != 0 {}
    let mut child = support::handoff()
        .args(["reconcile", "--json", "--chunk-size", "5"])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn reconcile");
    let orders = live.coll("orders");
    let mut writes = 0;
    while child.try_wait().expect("reconcile's state").is_none() {
        let id = writes % 600;
        live.wait(orders.update_one(doc! {"_id": id}, doc! {"$inc": {"qty": 1}}))
            .expect("update");
        live.wait(orders.insert_one(doc! {"_id": 10_000 + writes, "qty": 0}))
            .expect("insert");
        writes += 1;
    }
    let output = child.wait_with_output().expect("reconcile's output");
    let found = report(&output, 0);
    assert!(writes > 0);
    assert_eq!(counts(&found), (0, 0, 0), "{found}");
    assert!(found["in_flight"]["count"].as_u64().unwrap() > 0, "{found}");
    // Once handed off, nothing is in flight and nothing differs.
    while support::ok(&live.run(&[]))["events_handed_off"] != 0 {}
    let settled = report(&reconcile(&live, &[]), 0);
    assert_eq!(counts(&settled), (0, 0, 0), "{settled}");
    assert_eq!(settled["in_flight"]["count"], 0, "{settled}");
    assert_eq!(settled["checked"], 600 + writes as u64, "{settled}");
}

#[test]
fn a_repair_under_concurrent_writes_leaves_the_outbox_describing_the_source() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..300);
    while support::ok(&live.run(&[]))["events_handed_off"] != 0 {}
    // 250 documents whose records were lost; the repair reads them while they are updated and
    // deleted, and the consumer's next runs hand those writes off after the corrections.
    live.wait(
        live.coll(OUTBOX)
            .delete_many(doc! {"event.documentKey._id": {"$lt": 250}}),
    )
    .expect("delete records");
    let mut child = support::handoff()
        .args([
            "reconcile",
            "--json",
            "--repair",
            "--reason",
            "lost records",
        ])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn reconcile");
    let orders = live.coll("orders");
    let mut writes = 0;
    while child.try_wait().expect("reconcile's state").is_none() {
        let id = writes % 300;
        live.wait(orders.update_one(doc! {"_id": id}, doc! {"$inc": {"qty": 1}}))
            .expect("update");
        if writes % 7 == 0 {
            live.wait(orders.delete_one(doc! {"_id": (writes * 13) % 300}))
                .expect("delete");
        }
        writes += 1;
    }
    let repaired = report(&child.wait_with_output().expect("output"), 0);
    assert!(
        repaired["repair"]["written"].as_u64().unwrap() > 0,
        "{repaired}"
    );
    assert_eq!(count(&live, AUDIT), 1);
    while support::ok(&live.run(&[]))["events_handed_off"] != 0 {}
    let settled = report(&reconcile(&live, &[]), 0);
    assert_eq!(counts(&settled), (0, 0, 0), "{settled}");
    assert_eq!(settled["in_flight"]["count"], 0, "{settled}");
}

/// The quarantine policy's consumer: a poison document (schema version 99, a card number)
/// quarantined by its run, and a good one handed off.
fn quarantining_consumer(live: &Live) -> Vec<&'static str> {
    let policy = vec!["--policy", handoff_test_policies::QUARANTINE];
    live.start_consumer();
    live.wait(live.coll("orders").insert_many([
        doc! { "_id": 1, "schemaVersion": 1, "total": 10 },
        doc! { "_id": 2, "schemaVersion": 99, "card": "4111111111111111" },
    ]))
    .expect("insert");
    support::ok(&live.run(&policy));
    assert_eq!(live.outbox_len(), 1);
    assert_eq!(live.records("kestra_change_quarantine").len(), 1);
    policy
}

#[test]
fn a_key_the_policy_quarantined_is_held_not_missing_and_never_repaired_into_the_outbox() {
    let live = Live::start();
    let policy = quarantining_consumer(&live);

    // Compared with what the quarantine policy produces: nothing differs.
    let held = report(&reconcile(&live, &policy), 0);
    assert_eq!(counts(&held), (0, 0, 0), "{held}");
    assert_eq!(held["held_by_policy"]["quarantined"]["count"], 1, "{held}");
    assert_eq!(keys(&held["held_by_policy"], "quarantined"), vec!["2"]);
    // Another policy (the default, which would hand the poison document off) or other
    // parameters would not decide what the consumer's runs decide: refused, nothing written.
    let default = reconcile(&live, &["--repair", "--reason", "forgot the policy"]);
    support::refused(&default, 4, "the consumer's runs use");
    let mut other = policy.clone();
    other.extend([
        "--policy-param",
        "supported=1,99",
        "--repair",
        "--reason",
        "r",
    ]);
    support::refused(&reconcile(&live, &other), 4, "other parameters");
    assert_eq!(live.outbox_len(), 1);
    assert!(live.records(AUDIT).is_empty());

    // A repair with the consumer's policy writes nothing for the held key …
    let mut repair = policy.clone();
    repair.extend(["--repair", "--reason", "verify after an incident"]);
    let repaired = report(&reconcile(&live, &repair), 0);
    assert_eq!(repaired["repair"]["written"], 0, "{repaired}");
    assert_eq!(live.outbox_len(), 1);
    // … and, once a record is really lost, writes the policy's record for that key only.
    live.wait(live.coll(OUTBOX).delete_many(doc! {}))
        .expect("delete");
    let repaired = report(&reconcile(&live, &repair), 0);
    assert_eq!(repaired["missing"]["count"], 1, "{repaired}");
    assert_eq!(repaired["repair"]["written"], 1, "{repaired}");
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 1);
    let event = outbox[0].get_document("event").unwrap();
    assert_eq!(event.get_str("operationType").unwrap(), "snapshot");
    assert_eq!(
        event.get_document("documentKey").unwrap(),
        &doc! { "_id": 1 }
    );
    assert!(
        !format!("{outbox:?}").contains("4111111111111111"),
        "the poison document never reaches the outbox"
    );
    assert_eq!(counts(&report(&reconcile(&live, &policy), 0)), (0, 0, 0));
}

#[test]
fn a_policy_built_before_snapshot_runs_is_refused_before_anything_is_read() {
    let live = Live::start();
    quarantining_consumer(&live);
    live.wait(live.coll(OUTBOX).delete_many(doc! {}))
        .expect("delete");
    let out = reconcile(
        &live,
        &[
            "--policy",
            handoff_test_policies::LEGACY_V1_1,
            "--repair",
            "--reason",
            "a test",
        ],
    );
    support::refused(&out, 2, "contract 1.3.0 or later");
    assert!(live.outbox().is_empty());
    assert!(live.records(AUDIT).is_empty());
}

/// The README's sequence after lost history, as written, for a consumer of each shipped policy:
/// `status`, `checkpoint reset --to now --dry-run`, the reset, `run`, `reconcile --repair`, then
/// `reconcile`, which says 0/0/0. The outbox then holds only records the policy produces.
#[test]
fn the_recovery_sequence_leaves_only_what_each_shipped_policy_produces() {
    let shipped = [
        ("default", handoff_test_policies::DEFAULT),
        ("batching", handoff_test_policies::BATCHING),
        ("quarantine", handoff_test_policies::QUARANTINE),
        ("domain-events", handoff_test_policies::DOMAIN_EVENTS),
    ];
    for (name, path) in shipped {
        // A history that 70 writes overflow, and that the sequence's own writes do not.
        let live = Live::with_config(mongo_sim::Config {
            history_limit: 50,
            ..mongo_sim::Config::default()
        });
        let policy = ["--policy", path];
        support::ok(&live.run(&policy));
        // The consumer falls behind: its history is lost, poison documents among the writes.
        live.wait(live.coll("orders").insert_many((0..10).map(|i| {
            if i % 5 == 0 {
                doc! { "_id": i, "schemaVersion": 99, "card": "4111111111111111", "n": 0 }
            } else {
                doc! { "_id": i, "schemaVersion": 1, "n": 0 }
            }
        })))
        .expect("insert");
        for round in 1..=6 {
            live.wait(
                live.coll("orders")
                    .update_many(doc! {}, doc! { "$set": { "n": round } }),
            )
            .expect("update");
        }
        support::fails(&live.run(&policy), 6, "ChangeStreamHistoryLost");

        let status = live.operator(&["status"]);
        assert!(
            status.status.success(),
            "{name}: {}",
            support::stderr(&status)
        );
        let dry = live.operator(&["checkpoint", "reset", "--to", "now", "--dry-run"]);
        assert!(dry.status.success(), "{name}: {}", support::stderr(&dry));
        let reset = live.operator(&[
            "checkpoint",
            "reset",
            "--to",
            "now",
            "--reason",
            "INC-42: oplog too small",
        ]);
        assert!(
            reset.status.success(),
            "{name}: {}",
            support::stderr(&reset)
        );
        support::ok(&live.run(&policy));
        let mut repair = policy.to_vec();
        repair.extend(["--repair", "--reason", "after INC-42 reset"]);
        let repaired = report(&reconcile(&live, &repair), 0);
        // Every document is missing, the poison ones too: the quarantine does not hold them.
        assert_eq!(counts(&repaired), (10, 0, 0), "{name}: {repaired}");
        let held = &repaired["held_by_policy"]["quarantined"]["count"];
        assert_eq!(held, 0, "{name}: {repaired}");
        let last = report(&reconcile(&live, &policy), 0);
        assert_eq!(counts(&last), (0, 0, 0), "{name}: {last}");
        // The repair quarantined the poison documents as the policy's runs would have.
        let poison = if name == "quarantine" { 2 } else { 0 };
        assert_eq!(
            last["held_by_policy"]["quarantined"]["count"], poison,
            "{name}: {last}"
        );
        let quarantine = live.records("kestra_change_quarantine");
        assert_eq!(quarantine.len(), poison as usize, "{name}");
        for record in &quarantine {
            let event = record.get_document("event").unwrap();
            assert_eq!(event.get_str("operationType").unwrap(), "snapshot");
            let document = event.get_document("fullDocument").unwrap();
            assert_eq!(document.get_i32("schemaVersion").unwrap(), 99);
        }

        let outbox = live.outbox();
        assert!(!outbox.is_empty(), "{name}");
        for record in &outbox {
            let event = record.get_document("event").expect("the event is kept");
            let version = event
                .get_document("fullDocument")
                .ok()
                .and_then(|d| d.get("schemaVersion").cloned());
            match name {
                "quarantine" => assert!(
                    !matches!(version, Some(v) if v != bson::Bson::Int32(1)),
                    "{name}: a record the policy refuses: {record}"
                ),
                "domain-events" => {
                    let kind = record.get_str("eventType").expect("a typed record");
                    assert!(kind.starts_with("Order"), "{name}: {record}");
                }
                _ => assert!(record.get("eventType").is_none(), "{name}: {record}"),
            }
        }
        assert_eq!(
            outbox.len(),
            if name == "quarantine" { 8 } else { 10 },
            "{name}"
        );
        if name == "quarantine" {
            assert!(!format!("{outbox:?}").contains("4111111111111111"));
        }
    }
}
