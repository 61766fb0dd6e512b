//! The operator's commands on a live deployment: `status` (lag, oplog margin, outbox), the
//! figures every run reports, the evidence a failed run carries, and the audited
//! `checkpoint reset`.
//!
//! Each test starts its own test server: the figures are checked against times the test itself
//! knows (the first write of a fresh server is the oldest entry of its oplog).

use crate::support;

use std::time::Duration;

use bson::{Document, Timestamp, doc};
use mongo_sim::Config;
use serde_json::Value;
use support::live::{CHECKPOINTS, CONSUMER, Live, OUTBOX};

const AUDIT: &str = "kestra_change_audit";

fn sim(history_limit: usize) -> Live {
    Live::with_config(Config {
        history_limit,
        ..Config::default()
    })
}

/// A write's cluster time, from the reply to the `insert` command.
fn insert_at(d: &Live, coll: &str, docs: Vec<Document>) -> Timestamp {
    let reply = d
        .wait(
            d.client
                .database(&d.db)
                .run_command(doc! { "insert": coll, "documents": docs }),
        )
        .expect("insert");
    reply.get_timestamp("operationTime").expect("operationTime")
}

fn time_of(value: &Value) -> (u64, u64) {
    (
        value["t"].as_u64().expect("seconds"),
        value["i"].as_u64().expect("increment"),
    )
}

#[test]
fn status_reports_position_lag_margin_and_outbox_against_known_times() {
    let d = sim(10_000);
    // The first write of a fresh server: the oldest entry of its oplog.
    let first = insert_at(&d, "marker", vec![doc! { "_id": 1 }]);
    support::ok(&d.run(&[]));
    std::thread::sleep(Duration::from_millis(2_100));
    let inserted = insert_at(&d, "orders", (0..3).map(|i| doc! { "_id": i }).collect());
    let run = support::ok(&d.run(&[]));
    assert_eq!(run["events_handed_off"], 3);

    let status = support::json_stdout(&d.operator(&["status", "--json"]));
    assert_eq!(status["consumer"], CONSUMER);
    assert_eq!(status["checkpoint"]["has_token"], true);
    assert_eq!(status["checkpoint"]["mode"], "resumeAfter");
    assert!(status["checkpoint"]["lease"].is_null(), "{status}");
    assert_eq!(
        time_of(&status["oldest_oplog_time"]),
        (u64::from(first.time), u64::from(first.increment))
    );
    let checkpoint = time_of(&status["checkpoint_cluster_time"]);
    // The idle watermark stands at or after the events it covers.
    assert!(checkpoint >= (u64::from(inserted.time), u64::from(inserted.increment)));
    let cluster = time_of(&status["cluster_time"]);
    assert!(cluster >= checkpoint);
    assert_eq!(
        status["lag_seconds"].as_i64(),
        Some(cluster.0 as i64 - checkpoint.0 as i64)
    );
    let margin = status["oplog_margin_seconds"].as_i64().expect("margin");
    assert_eq!(margin, checkpoint.0 as i64 - i64::from(first.time));
    assert!(margin >= 2, "{status}");
    assert_eq!(status["estimated_gap_seconds"], 0);
    assert_eq!(status["outbox"]["records"], 3);
    assert_eq!(
        time_of(&status["outbox"]["last_record_cluster_time"]),
        (u64::from(inserted.time), u64::from(inserted.increment))
    );

    // The human view names every figure and never a token.
    let human = d.operator(&["status"]);
    assert_eq!(human.status.code(), Some(0));
    let text = String::from_utf8_lossy(&human.stdout);
    for label in [
        "checkpoint at",
        "lag",
        "oldest in oplog",
        "oplog margin",
        "3 records",
    ] {
        assert!(text.contains(label), "{label} missing: {text}");
    }
    let token = d
        .checkpoint()
        .expect("checkpoint")
        .get_document("token")
        .expect("token")
        .get_str("_data")
        .expect("_data")
        .to_string();
    assert!(!text.contains(&token) && !String::from_utf8_lossy(&human.stderr).contains(&token));

    // --min-margin: a margin large enough passes, a larger one asks for attention.
    assert_eq!(
        d.operator(&["status", "--min-margin", "1s"]).status.code(),
        Some(0)
    );
    let short = d.operator(&["status", "--min-margin", "6h"]);
    assert_eq!(short.status.code(), Some(16), "{}", support::stderr(&short));
    assert!(support::stderr(&short).contains("under --min-margin"));

    // The HTML report is written, self-contained.
    let dir = tempfile::tempdir().expect("temporary folder");
    let html = dir.path().join("status.html");
    let written = d.operator(&["status", "--html", html.to_str().expect("path")]);
    assert_eq!(written.status.code(), Some(0));
    let page = std::fs::read_to_string(&html).expect("report");
    assert!(page.contains("oplog margin") && !page.contains("<script"));
}

/// A consumer no checkpoint names is a typo or a consumer that never ran: `status` refuses it
/// (exit 2) and names the near databases and consumers, rather than reading as healthy.
#[test]
fn status_of_a_consumer_no_checkpoint_names_is_refused_with_the_near_names() {
    let d = sim(1_000);
    let nothing = d.operator(&["status", "--json"]);
    support::refused(&nothing, 2, "does not exist");
    assert!(nothing.stdout.is_empty());
    support::ok(&d.run(&[]));
    let typo = d.operator(&["status", "--consumer-id", "orders-to-outbx"]);
    support::refused(&typo, 2, &format!("did you mean {CONSUMER}?"));
    let other = d.operator(&["status", "--consumer-id", "zzz"]);
    support::refused(&other, 2, &format!("holds {CONSUMER}"));
    let elsewhere = d.operator(&["status", "--checkpoint-collection", "checkpoint"]);
    support::refused(&elsewhere, 2, "holds no consumer");
    let database = format!("{}x", d.db);
    let mistyped = d.operator(&["status", "--database", &database]);
    support::refused(&mistyped, 2, &format!("did you mean {}?", d.db));
    // The consumer itself is read.
    let status = support::json_stdout(&d.operator(&["status", "--json"]));
    assert_eq!(status["consumer"], CONSUMER);
    // Bad input is refused before anything is read.
    let bad = d.operator(&["status", "--consumer-id", "no spaces"]);
    assert_eq!(bad.status.code(), Some(2));
    let bad = d.operator(&["status", "--min-margin", "soon"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn every_run_reports_lag_age_and_margin_as_outputs_and_gauges() {
    let d = sim(10_000);
    let first = insert_at(&d, "marker", vec![doc! { "_id": 1 }]);
    support::ok(&d.run(&[]));
    std::thread::sleep(Duration::from_millis(1_100));
    insert_at(&d, "orders", vec![doc! { "_id": 1 }]);
    let output = d.run(&[]);
    let outputs = support::ok(&output);
    let lag = outputs["lag_seconds"].as_i64().expect("lag");
    assert!((0..=5).contains(&lag), "{outputs}");
    let age = outputs["checkpoint_age_seconds"].as_i64().expect("age");
    assert!((-5..=5).contains(&age), "{outputs}");
    let checkpoint = d.checkpoint().expect("checkpoint");
    let token = checkpoint.get_document("token").expect("token");
    let at = handoff::domain::token::cluster_time(token).expect("token time");
    assert_eq!(
        outputs["oplog_margin_seconds"].as_i64(),
        Some(i64::from(at.time) - i64::from(first.time))
    );
    for name in [
        "lag_seconds",
        "checkpoint_age_seconds",
        "oplog_margin_seconds",
    ] {
        assert_eq!(support::metric(&output, name), outputs[name], "{name}");
    }
    let metrics = support::protocol_line(&output, "metrics");
    for m in metrics.as_array().expect("metrics") {
        assert_eq!(
            m["tags"],
            serde_json::json!({ "consumer": CONSUMER }),
            "{m}"
        );
    }
}

#[test]
fn lost_history_carries_evidence_and_an_audited_reset_recovers() {
    let d = sim(8);
    support::ok(&d.run(&[]));
    let before = d.checkpoint().expect("checkpoint");
    insert_at(&d, "orders", (0..20).map(|i| doc! { "_id": i }).collect());
    let output = d.run(&[]);
    let failed = support::fails(&output, 6, "ChangeStreamHistoryLost");
    let evidence = &failed["evidence"];
    assert!(
        evidence["checkpoint_cluster_time"]["t"].is_u64(),
        "{failed}"
    );
    assert!(evidence["oldest_oplog_time"]["t"].is_u64(), "{failed}");
    assert!(evidence["estimated_gap_seconds"].is_i64(), "{failed}");
    assert!(
        time_of(&evidence["checkpoint_cluster_time"]) < time_of(&evidence["oldest_oplog_time"]),
        "{failed}"
    );
    // One path to run in order (recover), and the same by hand apart from it: a list that
    // held both would move the checkpoint a second time after a recovery.
    let next: Vec<&str> = evidence["next_commands"]
        .as_array()
        .expect("next commands")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(next.len(), 1, "{next:?}");
    assert!(next[0].starts_with("handoff recover "), "{next:?}");
    let next: Vec<&str> = evidence["next_commands_by_hand"]
        .as_array()
        .expect("the commands by hand")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        next.iter().any(|c| c.starts_with("handoff status")),
        "{next:?}"
    );
    assert!(
        next.iter()
            .any(|c| c.contains("checkpoint reset") && c.contains("--to now")),
        "{next:?}"
    );
    let guidance = failed["guidance"].as_str().expect("guidance");
    assert!(
        guidance.contains(". Evidence: checkpoint at cluster time"),
        "{guidance}"
    );
    assert!(guidance.contains("Next: handoff recover"), "{guidance}");
    assert!(
        guidance.contains("or, by hand: handoff status"),
        "{guidance}"
    );
    assert!(support::stderr(&output).contains("oldest oplog entry"));

    // A dry run shows the move and writes nothing.
    let reset = ["checkpoint", "reset", "--to", "now"];
    let dry = support::json_stdout(&d.operator(&[&reset[..], &["--dry-run", "--json"]].concat()));
    assert_eq!(dry["applied"], false);
    assert_eq!(dry["to"]["mode"], "resumeAfter");
    assert!(dry["gap_seconds"].is_i64(), "{dry}");
    assert_eq!(
        d.checkpoint().expect("checkpoint").get("token"),
        before.get("token")
    );
    assert!(d.records(AUDIT).is_empty());

    // A reason is required.
    let unexplained = d.operator(&reset);
    assert_eq!(unexplained.status.code(), Some(2));
    assert!(support::stderr(&unexplained).contains("--reason"));
    assert!(d.records(AUDIT).is_empty());

    // The reset: checkpoint moved, revision counted, audit record in place.
    let prior = d.checkpoint().expect("checkpoint");
    assert_eq!(prior.get("token"), before.get("token"));
    let applied = support::json_stdout(
        &d.operator(&[&reset[..], &["--reason", "history lost in test", "--json"]].concat()),
    );
    assert_eq!(applied["applied"], true);
    let after = d.checkpoint().expect("checkpoint");
    assert_ne!(after.get("token"), before.get("token"));
    assert_eq!(
        after.get_i64("revision").expect("revision"),
        prior.get_i64("revision").expect("revision") + 1
    );
    let records = d.records(AUDIT);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.get_str("reason").ok(), Some("history lost in test"));
    assert_eq!(record.get_str("consumer").ok(), Some(CONSUMER));
    assert!(
        record
            .get_str("command")
            .expect("command")
            .contains("--to now")
    );
    assert!(!record.get_str("by").expect("by").is_empty());
    assert!(record.get_datetime("at").is_ok());
    for key in ["from", "to", "evidence"] {
        assert!(record.get_document(key).is_ok(), "{key}: {record}");
    }
    assert!(
        record
            .get_document("evidence")
            .expect("evidence")
            .contains_key("gap_seconds"),
        "{record}"
    );

    // The consumer runs again from there.
    support::ok(&d.run(&[]));
    insert_at(&d, "orders", vec![doc! { "_id": 100 }]);
    let run = support::ok(&d.run(&[]));
    assert_eq!(run["events_handed_off"], 1);
    assert_eq!(d.outbox().len(), 1);
}

#[test]
fn a_reset_to_a_time_hands_off_from_that_time() {
    let d = sim(10_000);
    insert_at(&d, "orders", vec![doc! { "_id": "early" }]);
    std::thread::sleep(Duration::from_millis(1_100));
    let later = insert_at(&d, "orders", vec![doc! { "_id": "late" }]);
    // The consumer starts after both writes: neither is handed off.
    support::ok(&d.run(&[]));
    assert!(d.outbox().is_empty());
    let at = format!("{}.{}", later.time, later.increment);
    let out = d.operator(&[
        "checkpoint",
        "reset",
        "--to-time",
        &at,
        "--reason",
        "replay the late write",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let run = support::ok(&d.run(&[]));
    assert_eq!(run["events_handed_off"], 1);
    let records = d.outbox();
    assert_eq!(records.len(), 1);
    let key = records[0]
        .get_document("event")
        .and_then(|e| e.get_document("documentKey"))
        .and_then(|k| k.get_str("_id"))
        .expect("document key");
    assert_eq!(key, "late");
}

#[test]
fn a_reset_is_refused_while_a_run_holds_the_consumer_or_on_bad_input() {
    let d = sim(1_000);
    support::ok(&d.run(&[]));
    let before = d.checkpoint().expect("checkpoint");
    let until = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000);
    d.wait(d.coll(CHECKPOINTS).update_one(
        doc! { "_id": CONSUMER },
        doc! { "$set": { "owner": "another-run", "leaseUntil": until } },
    ))
    .expect("lease");
    let held = d.operator(&["checkpoint", "reset", "--to", "now", "--reason", "x"]);
    assert_eq!(held.status.code(), Some(3), "{}", support::stderr(&held));
    assert!(support::stderr(&held).contains("holds this consumer"));

    for bad in [
        &[
            "checkpoint",
            "reset",
            "--to-time",
            "yesterday",
            "--reason",
            "x",
        ][..],
        &[
            "checkpoint",
            "reset",
            "--to-token",
            "{\"x\": 1}",
            "--reason",
            "x",
        ],
        &[
            "checkpoint",
            "reset",
            "--to-token",
            "not json",
            "--reason",
            "x",
        ],
        &["checkpoint", "reset", "--to", "later", "--reason", "x"],
        &["checkpoint", "reset", "--reason", "x"],
        &[
            "checkpoint",
            "reset",
            "--to",
            "now",
            "--reason",
            "x",
            "--audit-collection",
            OUTBOX,
        ],
    ] {
        let out = d.operator(bad);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad:?}: {}",
            support::stderr(&out)
        );
    }
    // A consumer without a checkpoint (a mistyped id, say) is not created by a reset.
    let nobody = d.operator(&[
        "checkpoint",
        "reset",
        "--to",
        "now",
        "--reason",
        "x",
        "--consumer-id",
        "nobody",
    ]);
    assert_eq!(
        nobody.status.code(),
        Some(2),
        "{}",
        support::stderr(&nobody)
    );
    assert!(support::stderr(&nobody).contains("has no checkpoint"));
    let count = d
        .wait(d.coll(CHECKPOINTS).count_documents(doc! {}))
        .expect("count");
    assert_eq!(count, 1);
    let after = d.checkpoint().expect("checkpoint");
    assert_eq!(after.get("token"), before.get("token"));
    assert!(d.records(AUDIT).is_empty());
}

#[test]
fn a_reset_to_a_time_the_oplog_no_longer_holds_is_refused() {
    let d = sim(8);
    let early = insert_at(&d, "orders", vec![doc! { "_id": 0 }]);
    support::ok(&d.run(&[]));
    insert_at(&d, "orders", (1..20).map(|i| doc! { "_id": i }).collect());
    let before = d.checkpoint().expect("checkpoint");
    let at = format!("{}.{}", early.time, early.increment);
    let out = d.operator(&[
        "checkpoint",
        "reset",
        "--to-time",
        &at,
        "--reason",
        "too far back",
    ]);
    assert_eq!(out.status.code(), Some(6), "{}", support::stderr(&out));
    // Refused by the window check, or by the server when it checks the start itself.
    let err = support::stderr(&out);
    assert!(
        err.contains("oldest entry of the oplog") || err.contains("no longer in the oplog"),
        "{err}"
    );
    assert_eq!(
        d.checkpoint().expect("checkpoint").get("token"),
        before.get("token")
    );
    assert!(d.records(AUDIT).is_empty());
}

#[test]
fn consumers_of_a_filtered_stream_are_refused_by_backfill_reconcile_and_recover() {
    let d = sim(10_000);
    support::ok(&d.run(&[
        "--pipeline",
        r#"[{"$match": {"fullDocument.qty": {"$gt": 1}}}]"#,
    ]));
    insert_at(&d, "orders", vec![doc! { "_id": 1, "qty": 1 }]);
    let backfill = d.operator(&["backfill", "--reason", "x"]);
    assert_eq!(
        backfill.status.code(),
        Some(2),
        "{}",
        support::stderr(&backfill)
    );
    assert!(support::stderr(&backfill).contains("plain collection stream"));
    let reconcile = d.operator(&["reconcile", "--repair", "--reason", "x"]);
    assert_eq!(
        reconcile.status.code(),
        Some(2),
        "{}",
        support::stderr(&reconcile)
    );
    assert!(support::stderr(&reconcile).contains("plain collection stream"));
    // Recover repairs as reconcile does: it names the commands that serve such a consumer.
    let recover = d.operator(&["recover", "--reason", "x"]);
    assert_eq!(
        recover.status.code(),
        Some(2),
        "{}",
        support::stderr(&recover)
    );
    assert!(support::stderr(&recover).contains("handoff checkpoint reset"));
    assert!(d.outbox().is_empty());
    assert!(d.records(AUDIT).is_empty());
}

#[test]
fn a_reset_after_the_present_is_refused_and_a_checkpoint_ahead_is_an_error() {
    let d = sim(10_000);
    support::ok(&d.run(&[]));
    let before = d.checkpoint().expect("checkpoint");
    let future = [
        "checkpoint",
        "reset",
        "--to-time",
        "2096-01-01T00:00:00Z",
        "--reason",
        "typo in the year",
    ];
    let refused = d.operator(&future);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        support::stderr(&refused)
    );
    let err = support::stderr(&refused);
    assert!(err.contains("after the deployment's present"), "{err}");
    assert!(err.contains("--allow-future"), "{err}");
    assert_eq!(
        d.checkpoint().expect("checkpoint").get("token"),
        before.get("token")
    );
    assert!(d.records(AUDIT).is_empty());
    // A forged token as far ahead is refused the same way.
    let token = r#"{"_data": "82F5A8B800000000012B0429296E1404"}"#;
    let forged = d.operator(&["checkpoint", "reset", "--to-token", token, "--reason", "x"]);
    assert_eq!(
        forged.status.code(),
        Some(2),
        "{}",
        support::stderr(&forged)
    );
    assert!(d.records(AUDIT).is_empty());

    // Said on purpose, it is written; status then reports the checkpoint as an error, and
    // --min-margin no longer reads it as healthy.
    let mut allowed = future.to_vec();
    allowed.push("--allow-future");
    let out = d.operator(&allowed);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(d.records(AUDIT).len(), 1);
    let status = d.operator(&["status", "--json"]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        support::stderr(&status)
    );
    let figures: Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let ahead = figures["checkpoint_ahead_seconds"]
        .as_i64()
        .expect("seconds ahead");
    assert!(ahead > 60 * 60 * 24 * 365, "{figures}");
    let human = d.operator(&["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("ERROR"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
    let checked = d.operator(&["status", "--min-margin", "1h"]);
    assert_eq!(
        checked.status.code(),
        Some(16),
        "{}",
        support::stderr(&checked)
    );
    assert!(support::stderr(&checked).contains("after the deployment's present"));
}
