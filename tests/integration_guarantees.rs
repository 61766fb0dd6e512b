//! What neither the URI nor the data can weaken: checkpoint and outbox work
//! always uses majority writes, majority or snapshot reads and the primary, whatever the URI
//! asks; an event or a record over MongoDB's 16 MiB document limit stops the run with its own
//! exit code and nothing written; large events are inserted a batch at a time; a typical run
//! keeps to its round trips on one connection, and its figures still come when the lease's release
//! returns no checkpoint.

use crate::support;

use std::time::Duration;

use bson::{Document, doc};
use support::live::*;

/// The commands of checkpoint and outbox work (the driver's own handshakes, monitoring and
/// session clean-up excepted).
const DATA_COMMANDS: &[&str] = &[
    "bulkWrite",
    "insert",
    "update",
    "findAndModify",
    "find",
    "aggregate",
    "getMore",
    "commitTransaction",
    "abortTransaction",
    "replSetGetConfig",
    "getParameter",
    "killCursors",
];

fn command_name(c: &Document) -> &str {
    c.get_str("command").unwrap_or_default()
}

fn in_transaction(c: &Document) -> bool {
    c.get_bool("autocommit").ok() == Some(false)
}

#[test]
fn the_uri_cannot_weaken_the_concerns_or_move_reads_off_the_primary() {
    for preference in ["secondary", "secondaryPreferred"] {
        // Its own test server, whatever MONGODB_URI says: the commands the run sent are read back.
        let live = Live::with_config(mongo_sim::Config::default());
        let uri = format!(
            "{}&w=1&journal=false&readConcernLevel=local&readPreference={preference}",
            live.uri()
        );
        let run = |live: &Live| {
            live.command()
                .env("MONGODB_URI", &uri)
                .env("HANDOFF_LOG", "warn")
                .output()
                .unwrap()
        };
        live.server().clear_received_commands();
        let first = run(&live);
        assert_eq!(support::ok(&first)["status"], "IDLE");
        let start = live.checkpoint_token();
        live.insert(0..3);
        let second = run(&live);
        assert_eq!(support::ok(&second)["events_handed_off"], 3);
        assert!(
            support::stderr(&second).contains("the URI's concerns are ignored"),
            "{}",
            support::stderr(&second)
        );
        let stream = live.events_after(&start);
        assert_eq!(
            outbox_event_ids(&live.outbox()),
            stream.iter().map(event_id).collect::<Vec<_>>()
        );

        let received = live.received_from_handoff();
        let data: Vec<&Document> = received
            .iter()
            .filter(|c| DATA_COMMANDS.contains(&command_name(c)))
            .collect();
        let count = |name: &str| data.iter().filter(|c| command_name(c) == name).count();
        assert!(count("commitTransaction") >= 2, "{data:?}");
        assert!(count("aggregate") >= 2, "{data:?}");
        // MongoDB 8.0: a commit's writes in one bulkWrite.
        assert!(count("bulkWrite") >= 1, "{data:?}");
        // The lease: taken with an update (after the findAndModify that creates or reads the
        // checkpoint), given back in a bulkWrite with the run's record, outside any transaction.
        assert_eq!(count("insert"), 0, "{data:?}");
        assert_eq!(count("update"), 2, "two runs: {data:?}");
        assert_eq!(count("findAndModify"), 2, "two runs: {data:?}");
        let releases: Vec<&&Document> = data
            .iter()
            .filter(|c| command_name(c) == "bulkWrite" && c.get("autocommit").is_none())
            .collect();
        assert_eq!(releases.len(), 2, "two runs: {data:?}");
        assert!(
            data.iter()
                .filter(|c| matches!(command_name(c), "update" | "findAndModify"))
                .chain(releases.iter().copied())
                .all(|c| c.get("autocommit").is_none()),
            "{data:?}"
        );
        // The transaction lifetime is asked only when a commit meets a transient error.
        assert_eq!(count("getParameter"), 0, "{data:?}");
        for c in &data {
            let name = command_name(c);
            // Sent to the primary: no read preference, or `primary`. (`getMore` and
            // `killCursors` go to the server holding the cursor, which its `aggregate` chose; the
            // driver addresses that one server with `primaryPreferred`.)
            if let Ok(preference) = c.get_document("$readPreference")
                && !matches!(name, "getMore" | "killCursors")
            {
                assert_eq!(preference.get_str("mode").unwrap(), "primary", "{c:?}");
            }
            let write_concern = c.get_document("writeConcern").ok();
            let read_level = c
                .get_document("readConcern")
                .ok()
                .and_then(|r| r.get_str("level").ok());
            match name {
                // A transaction's writes are acknowledged at its commit.
                "commitTransaction" | "abortTransaction" => assert_eq!(
                    write_concern.and_then(|w| w.get_str("w").ok()),
                    Some("majority"),
                    "{c:?}"
                ),
                "bulkWrite" | "insert" | "update" | "findAndModify" if !in_transaction(c) => {
                    assert_eq!(
                        write_concern.and_then(|w| w.get_str("w").ok()),
                        Some("majority"),
                        "{c:?}"
                    )
                }
                _ => {}
            }
            if c.get_bool("startTransaction").ok() == Some(true) {
                assert_eq!(read_level, Some("snapshot"), "{c:?}");
            } else if matches!(name, "find" | "aggregate")
                && !in_transaction(c)
                // The oplog window (a figure, not data: MongoDB refuses majority reads of
                // `local`).
                && c.get_str("db").ok() != Some("local")
            {
                assert_eq!(read_level, Some("majority"), "{c:?}");
            }
            if in_transaction(c) && c.get_bool("startTransaction").ok() != Some(true) {
                assert!(read_level.is_none(), "{c:?}");
            }
        }
        // The checkpoint is written and the outbox inserted in transactions only; outside them
        // only the lease's end and the run's record (one bulkWrite a run).
        let namespaces = |c: &Document| -> Vec<String> {
            c.get_array("namespaces")
                .map(|n| {
                    n.iter()
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert!(
            data.iter()
                .filter(|c| command_name(c) == "bulkWrite" && !in_transaction(c))
                .all(|c| namespaces(c)
                    == [
                        "change_demo.kestra_change_checkpoints",
                        "change_demo.kestra_change_runs"
                    ]),
            "{data:?}"
        );
    }
}

/// Inserts `{_id, pad}` into the watched collection with a pad of `pad` bytes.
fn insert_padded(live: &Live, id: i32, pad: usize) {
    live.wait(
        live.coll("orders")
            .insert_one(doc! {"_id": id, "pad": "x".repeat(pad)}),
    )
    .expect("insert");
}

/// Asserts the run stopped on the document limit: exit 13, its class and guidance, no token.
fn assert_stopped_on_the_limit(output: &std::process::Output) {
    let log = support::stderr(output);
    assert_eq!(output.status.code(), Some(13), "{log}");
    assert!(log.contains("error[event_too_large]"), "{log}");
    assert!(log.contains("16 MiB"), "{log}");
    assert!(log.contains("--split-large-events"), "{log}");
    assert!(!log.contains("_data"), "a token was printed: {log}");
    let out = support::failure_outputs(output, 13);
    assert_eq!(out["events_handed_off"], 0);
    assert!(
        !out["guidance"]
            .as_str()
            .unwrap_or_default()
            .contains("_data"),
        "a token was printed in the outputs: {out}"
    );
}

#[test]
fn an_event_over_16_mib_stops_the_run_with_exit_13_and_nothing_written() {
    let live = Live::start();
    let start = live.start_consumer();
    // The document fits; its change event, with the event's own fields, does not.
    insert_padded(&live, 1, 16 * 1024 * 1024 - 64);
    for _ in 0..2 {
        let output = live.command().env("HANDOFF_LOG", "warn").output().unwrap();
        assert_stopped_on_the_limit(&output);
        assert_eq!(live.outbox_len(), 0);
        assert_eq!(live.checkpoint_token(), start, "the checkpoint moved");
    }
}

/// The size of the change event of `{_id: 1, pad: "x"}` inserted into a collection named like
/// the watched one (`probes`, as long as `orders`): events differ only by the pad's length.
fn event_size_with_one_byte_pad(live: &Live) -> usize {
    live.wait(async {
        let probes = live.coll("probes");
        let mut stream = probes
            .watch()
            .max_await_time(Duration::from_millis(200))
            .await
            .unwrap()
            .with_type::<Document>();
        probes
            .insert_one(doc! {"_id": 1, "pad": "x"})
            .await
            .unwrap();
        loop {
            if let Some(event) = stream.next_if_any().await.unwrap() {
                return bson::serialize_to_vec(&event).unwrap().len();
            }
        }
    })
}

#[test]
fn an_event_under_16_mib_whose_outbox_record_is_over_stops_the_run_with_exit_13() {
    let live = Live::start();
    let start = live.start_consumer();
    let limit = 16 * 1024 * 1024;
    // The event ends 40 bytes under the limit; its outbox record adds its ID, consumer and
    // source around it, well over 40 bytes.
    let pad = limit - 40 - (event_size_with_one_byte_pad(&live) - 1);
    insert_padded(&live, 1, pad);
    let events = live.events_after(&start);
    assert_eq!(events.len(), 1);
    let size = bson::serialize_to_vec(&events[0]).unwrap().len();
    assert_eq!(size, limit - 40, "the probe mispredicted the event's size");
    let output = live.command().env("HANDOFF_LOG", "warn").output().unwrap();
    assert_stopped_on_the_limit(&output);
    assert_eq!(live.outbox_len(), 0);
    assert_eq!(live.checkpoint_token(), start, "the checkpoint moved");
}

#[test]
fn a_batch_of_large_events_is_inserted_a_batch_at_a_time_and_handed_off_once() {
    // MongoDB 8.0 nearby: 30 MB of records would take far longer to decode for the driver's
    // bulkWrite model than one more round trip, so they go apart from the compare-and-set, in
    // insert commands of the records as they are. The same server answering slowly (its replica set
    // configuration takes a second): the compare-and-set and the records in bulkWrite commands. MongoDB 7.0:
    // insert commands.
    for (wire_version, slow, command) in [
        (25, false, "insert"),
        (25, true, "bulkWrite"),
        (21, false, "insert"),
    ] {
        // Its own test server, whatever MONGODB_URI says: the commands the run sent are read back.
        let live = Live::with_config(mongo_sim::Config {
            max_wire_version: wire_version,
            ..mongo_sim::Config::default()
        });
        let start = live.start_consumer();
        let events = 150;
        let documents: Vec<Document> = (0..events)
            .map(|i| doc! {"_id": i, "pad": "x".repeat(200 * 1024)})
            .collect();
        live.wait(live.coll("orders").insert_many(documents))
            .expect("insert");
        if slow {
            live.fail_point(
                doc! {"times": 1}.into(),
                doc! {
                    "failCommands": ["replSetGetConfig"],
                    "blockConnection": true,
                    "blockTimeMS": 1000,
                },
            );
        }
        live.server().clear_received_commands();
        let output = live
            .command()
            .args([
                "--policy",
                handoff_test_policies::BATCHING,
                "--policy-param",
                "batch_size=150",
            ])
            .output()
            .unwrap();
        let out = support::ok(&output);
        assert_eq!(out["events_handed_off"], events);
        let stream = live.events_after(&start);
        assert_eq!(stream.len(), events as usize);
        assert_eq!(
            outbox_event_ids(&live.outbox()),
            stream.iter().map(event_id).collect::<Vec<_>>()
        );
        assert_checkpoint_at_end(&live, stream.last().unwrap().get_document("_id").unwrap());
        let received = live.received_from_handoff();
        let sent = || received.iter();
        let commits = sent()
            .filter(|c| command_name(c) == "commitTransaction")
            .count();
        // No record goes the other way (a commit without records, the idle stream's position at
        // the end, is one bulkWrite on 8.0 whichever way records go).
        let records_elsewhere = if command == "bulkWrite" {
            sent()
                .filter(|c| command_name(c) == "insert")
                .filter(|c| c.get_str("collection").ok() == Some(OUTBOX))
                .count()
        } else {
            // (The lease's release and the run's record are one bulkWrite outside the commits.)
            sent()
                .filter(|c| command_name(c) == "bulkWrite")
                .filter(|c| c.get("autocommit").is_some())
                .filter(|c| c.get_i64("ops").unwrap() > 1)
                .count()
        };
        assert_eq!(
            records_elsewhere, 0,
            "wire version {wire_version}, slow {slow}: records not in {command} commands"
        );
        // Far fewer write commands than records: each carries many.
        let writes: Vec<i64> = sent()
            .filter(|c| command_name(c) == command && in_transaction(c))
            .filter(|c| command == "bulkWrite" || c.get_str("collection").ok() == Some(OUTBOX))
            .map(|c| {
                c.get_i64(if command == "bulkWrite" {
                    "ops"
                } else {
                    "documents"
                })
                .unwrap()
            })
            .collect();
        // A bulkWrite also carries each commit's compare-and-set.
        let updates = if command == "bulkWrite" {
            commits as i64
        } else {
            0
        };
        assert_eq!(
            writes.iter().sum::<i64>(),
            i64::from(events) + updates,
            "wire version {wire_version}, slow {slow}: {writes:?}"
        );
        assert!(
            writes.len() * 10 <= events as usize,
            "wire version {wire_version}, slow {slow}: {} {command} commands for {events} \
             records: {writes:?}",
            writes.len()
        );
    }
}

#[test]
fn a_duplicate_in_a_batch_names_that_record_and_writes_nothing() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..3);
    let events = live.events_after(&start);
    let taken = format!("{CONSUMER}/{}", event_id(&events[1]));
    live.wait(live.coll(OUTBOX).insert_one(doc! {"_id": &taken}))
        .expect("insert");
    let output = live
        .command()
        .args([
            "--policy",
            handoff_test_policies::BATCHING,
            "--policy-param",
            "batch_size=3",
        ])
        .output()
        .unwrap();
    support::fails(&output, 3, &format!("A record {taken} already exists"));
    // The batch's transaction is gone whole: the record before the duplicate is not there.
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert_eq!(live.checkpoint_token(), start, "the checkpoint moved");
}

/// The connections the test server has accepted so far.
fn connections_created(live: &Live) -> i64 {
    live.admin(doc! { "serverStatus": 1 })
        .get_document("connections")
        .and_then(|c| c.get_i64("totalCreated"))
        .expect("connections.totalCreated")
}

/// The figures measure from the token the run committed last, without reading the checkpoint
/// again, and the lease is given back after them; a release the server refuses (here the
/// `bulkWrite` with the run's record) fails nothing: the lease's end is sent again alone and the
/// run's outputs stand.
#[test]
fn the_figures_measure_from_the_committed_token_and_a_refused_release_fails_nothing() {
    let live = Live::with_config(mongo_sim::Config::default());
    assert_eq!(support::ok(&live.run(&[]))["status"], "IDLE");
    live.insert(0..3);
    // The run's commits (one bulkWrite each, three events and the idle position) pass; the
    // release, the fifth, fails.
    live.fail_point(
        doc! {"skip": 4, "times": 1}.into(),
        doc! {"failCommands": ["bulkWrite"], "errorCode": 2},
    );
    live.server().clear_received_commands();
    let run = live.run(&[]);
    let outputs = support::ok(&run);
    assert_eq!(live.fail_point_off(), 1, "the release was refused");
    assert_eq!(outputs["events_handed_off"], 3, "{outputs}");
    let sent = live.received_from_handoff();
    let checkpoint_finds = sent
        .iter()
        .filter(|c| command_name(c) == "find" && c.get_str("collection").ok() == Some(CHECKPOINTS))
        .count();
    assert_eq!(checkpoint_finds, 0, "{sent:?}");
    // The margin runs from the stored token to the oplog's oldest entry.
    let oldest = live
        .wait(
            live.client
                .database("local")
                .collection::<Document>("oplog.rs")
                .find_one(doc! {})
                .sort(doc! {"$natural": 1}),
        )
        .expect("oplog read")
        .expect("an oplog entry");
    let oldest = oldest.get_timestamp("ts").expect("ts");
    let token = live.checkpoint_token();
    let at = handoff::domain::token::cluster_time(&token).expect("token time");
    assert_eq!(
        outputs["oplog_margin_seconds"].as_i64(),
        Some(i64::from(at.time) - i64::from(oldest.time)),
        "{outputs}"
    );
    assert!(outputs["lag_seconds"].is_i64(), "{outputs}");
    // The lease's end, sent alone after the refusal, gave it back.
    let checkpoint = live.checkpoint().expect("the checkpoint");
    assert_eq!(
        checkpoint
            .get_datetime("leaseUntil")
            .expect("leaseUntil")
            .timestamp_millis(),
        0,
        "{checkpoint:?}"
    );
    assert!(
        live.commands_from_handoff()
            .iter()
            .rev()
            .take(4)
            .any(|c| c == "update"),
        "the lease's end sent alone"
    );
}

#[test]
fn a_typical_run_keeps_to_its_round_trips_on_one_connection() {
    let live = Live::with_config(mongo_sim::Config::default());
    assert_eq!(support::ok(&live.run(&[]))["status"], "IDLE");
    live.insert(0..10);
    live.server().clear_received_commands();
    let before = connections_created(&live);
    let run = live.run(&[]);
    let outputs = support::ok(&run);
    assert_eq!(outputs["events_handed_off"], 10);
    // The figures read at the end came back too.
    assert!(outputs["lag_seconds"].is_i64(), "{outputs}");
    assert!(outputs["oplog_margin_seconds"].is_i64(), "{outputs}");
    // The driver's monitor and the run's one connection: the cursor closed as the stream is
    // dropped and the figures read at the end wait for it instead of opening their own.
    assert_eq!(connections_created(&live) - before, 2);

    let commands = live.commands_from_handoff();
    let count = |name: &str| commands.iter().filter(|c| c.as_str() == name).count();
    // The deployment checked (the driver's handshakes and its monitor's `hello` aside).
    assert_eq!(count("replSetGetConfig"), 1, "{commands:?}");
    assert_eq!(count("listCollections"), 1, "{commands:?}");
    // The checkpoint created or read in one command, the lease taken (an update).
    assert_eq!(count("findAndModify"), 1, "{commands:?}");
    assert_eq!(count("update"), 1, "{commands:?}");
    assert_eq!(count("aggregate"), 1, "{commands:?}");
    // One transaction per event (its compare-and-set and record in one bulkWrite, then the
    // commit), one saving the idle stream's position at the end, and the lease given back in
    // the same bulkWrite as the run's record in its history.
    assert_eq!(count("bulkWrite"), 12, "{commands:?}");
    assert_eq!(count("commitTransaction"), 11, "{commands:?}");
    assert_eq!(count("insert"), 0, "{commands:?}");
    let sent = live.received_from_handoff();
    let release = sent
        .iter()
        .rfind(|c| command_name(c) == "bulkWrite")
        .expect("the release");
    assert!(!in_transaction(release), "{release:?}");
    assert_eq!(release.get_i64("ops").unwrap(), 2, "{release:?}");
    // The run history, read while the policy loads (for the forecast); the figures: the
    // oplog's oldest and newest entries, and the cluster time their replies carry (no `hello`
    // of its own, no read of the checkpoint of its own: the run knows the token it committed).
    assert_eq!(count("find"), 3, "{commands:?}");
    assert_eq!(count("getParameter"), 0, "{commands:?}");
    assert_eq!(count("endSessions"), 1, "{commands:?}");
}
