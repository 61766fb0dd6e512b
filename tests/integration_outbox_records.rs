//! What the outbox holds, end to end on a replica set: records shaped by the `domain-events`
//! policy, the duplicates a checkpoint moved back meets (suppressed and counted, never a dead
//! end), a same-ID record of another event (a conflict), sources MongoDB opens no change stream
//! on (refused before anything is written), and the commands a run needs (the documented
//! least-privilege role).

use crate::support;

use bson::{Bson, Document, doc};
use futures_util::TryStreamExt;
use support::live::*;
use support::*;

const QUARANTINE: &str = "kestra_change_quarantine";

/// Moves the consumer's checkpoint back to `token`, as an operator resetting it would.
fn move_checkpoint_back(live: &Live, token: &Document) {
    let moved = live
        .wait(live.coll(CHECKPOINTS).update_one(
            doc! {"_id": CONSUMER},
            doc! {"$set": {"token": token.clone(), "mode": "resumeAfter"}},
        ))
        .expect("move the checkpoint back");
    assert_eq!(moved.modified_count, 1);
}

#[test]
fn the_domain_events_policy_writes_business_records() {
    let live = Live::start();
    let start = live.start_consumer();
    let orders = live.coll("orders");
    live.wait(orders.insert_one(doc! {"_id": "o-1", "total": 5, "version": 1}))
        .unwrap();
    live.wait(orders.update_one(
        doc! {"_id": "o-1"},
        doc! {"$set": {"total": 7, "version": 2}},
    ))
    .unwrap();
    // The update's document is looked up while the run reads it, so it is deleted after.
    let out = ok(&live.run(&["--policy", handoff_test_policies::DOMAIN_EVENTS]));
    assert_eq!(out["events_handed_off"], 2, "{out}");
    live.wait(orders.delete_one(doc! {"_id": "o-1"})).unwrap();
    let out = ok(&live.run(&["--policy", handoff_test_policies::DOMAIN_EVENTS]));
    assert_eq!(out["events_handed_off"], 1, "{out}");
    let events = live.events_after(&start);
    let outbox = live.outbox();
    let shown: Vec<(String, Bson, Option<Bson>)> = outbox
        .iter()
        .map(|r| {
            (
                r.get_str("eventType").unwrap().to_string(),
                r.get("aggregateId").unwrap().clone(),
                r.get("aggregateVersion").cloned(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            (
                "OrderCreated".into(),
                Bson::from("o-1"),
                Some(Bson::Int32(1))
            ),
            (
                "OrderUpdated".into(),
                Bson::from("o-1"),
                Some(Bson::Int32(2))
            ),
            ("OrderDeleted".into(), Bson::from("o-1"), None),
        ]
    );
    // The payload is the document without its `_id`; the record keeps the event and its token.
    assert_eq!(
        outbox[0].get_document("payload").unwrap(),
        &doc! {"total": 5, "version": 1}
    );
    assert_eq!(
        outbox[1].get_document("payload").unwrap(),
        &doc! {"total": 7, "version": 2}
    );
    assert_eq!(outbox[2].get_document("payload").unwrap(), &doc! {});
    for (record, event) in outbox.iter().zip(&events) {
        assert_eq!(
            record.get_str("_id").unwrap(),
            format!("{CONSUMER}/{}", event_id(event))
        );
        assert_eq!(record.get_str("consumer").unwrap(), CONSUMER);
        assert_eq!(record.get_i64("schemaVersion").unwrap(), 1);
        assert_eq!(record.get("token"), event.get("_id"));
        let kept = record.get_document("event").unwrap();
        assert_eq!(kept.get("_id"), event.get("_id"));
        assert_eq!(kept.get("operationType"), event.get("operationType"));
        assert!(record.get_timestamp("clusterTime").is_ok());
    }
    assert_checkpoint_at_end(&live, events[2].get_document("_id").unwrap());

    // Without the raw event, and with the policy's parameters.
    live.wait(orders.insert_one(doc! {"_id": "o-3", "rev": 9}))
        .unwrap();
    let out = ok(&live.run(&[
        "--policy",
        handoff_test_policies::DOMAIN_EVENTS,
        "--policy-param",
        "entity=Payment",
        "--policy-param",
        "version-field=rev",
        "--policy-param",
        "schema-version=3",
        "--outbox-keep-event",
        "false",
    ]));
    assert_eq!(out["events_handed_off"], 1, "{out}");
    let last = live.outbox().pop().unwrap();
    assert_eq!(last.get_str("eventType").unwrap(), "PaymentCreated");
    assert_eq!(last.get_i64("schemaVersion").unwrap(), 3);
    assert_eq!(last.get("aggregateVersion"), Some(&Bson::Int32(9)));
    assert!(!last.contains_key("event"), "{last:?}");
    assert!(last.contains_key("token"));
}

/// The run after an operator moved the checkpoint back meets records it already wrote: it ends
/// normally, rewrites nothing, counts them, and goes on with what is new.
fn replays_after_moving_back(policy: &[&str], collection: &str) {
    // The deployment (MongoDB 8.0 on the test server: commits in bulkWrite), then MongoDB 7.0.
    for live in [Live::start(), seven_oh()] {
        replays_after_moving_back_on(live, policy, collection);
    }
}

/// A test server of its own answering as MongoDB 7.0 (no bulkWrite).
fn seven_oh() -> Live {
    Live::with_config(mongo_sim::Config {
        max_wire_version: 21,
        ..mongo_sim::Config::default()
    })
}

fn replays_after_moving_back_on(live: Live, policy: &[&str], collection: &str) {
    let start = live.start_consumer();
    live.wait(live.coll("orders").insert_many(vec![
        doc! {"_id": 1, "fullDocument": 1},
        doc! {"_id": 2},
        doc! {"_id": 3},
    ]))
    .unwrap();
    let first = ok(&live.run(policy));
    assert_eq!(first["duplicates_suppressed"], 0, "{first}");
    let before = live.records(collection);
    assert_eq!(before.len(), 3, "{policy:?}");
    let end = live.checkpoint_token();

    move_checkpoint_back(&live, &start);
    live.insert(10..11);
    let mut args = policy.to_vec();
    args.extend(["--log-format", "kestra"]);
    let output = live
        .command()
        .env("HANDOFF_LOG", "info")
        .args(&args)
        .output()
        .expect("run handoff");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let outputs = outputs(&output);
    assert_eq!(outputs["duplicates_suppressed"], 3, "{outputs}");
    assert_eq!(metric(&output, "duplicates_suppressed"), 3);
    assert_eq!(metric(&output, "resume_attempts_ok"), 1);
    assert_eq!(metric(&output, "resume_attempts_history_lost"), 0);
    let after = live.records(collection);
    // The three records stand as written; only the new event was added.
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(after[..3], before[..]);
    assert_ne!(live.checkpoint_token(), end);
    // Each suppressed record is logged by its `_id`.
    let logs = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        logs.matches("record already handed off for this event")
            .count(),
        3,
        "{logs}"
    );
}

/// Fields whose names read as Extended JSON (`{"$oid": ...}`, `{"$numberLong": ...}`) are data like
/// any other: the record's event holds them as the server sent them, not turned into the types
/// they name.
#[test]
fn an_event_whose_fields_read_as_extended_json_is_handed_off_as_sent() {
    let live = Live::start();
    live.start_consumer();
    let document = doc! {
        "_id": "dollar-fields",
        "x": {"$oid": "0123456789abcdef01234567"},
        "y": {"$numberLong": "5"},
        "z": {"$date": 1_i32},
        "w": {"$binary": {"base64": "AA==", "subType": "00"}},
    };
    live.wait(live.coll("orders").insert_one(document.clone()))
        .unwrap();
    let out = ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 1, "{out}");
    // Read back encoded and decoded directly: a serde decoding here would turn the fields into
    // the types they name, whatever the record holds.
    let outbox = live.coll(OUTBOX).clone_with_type::<bson::RawDocumentBuf>();
    let raw: Vec<bson::RawDocumentBuf> = live
        .wait(async { outbox.find(doc! {}).await?.try_collect().await })
        .unwrap();
    assert_eq!(raw.len(), 1);
    let record = Document::try_from(raw[0].as_ref()).unwrap();
    let event = record.get_document("event").unwrap();
    assert_eq!(event.get_document("fullDocument").unwrap(), &document);
    assert_eq!(
        event.get_document("documentKey").unwrap(),
        &doc! {"_id": "dollar-fields"}
    );
}

#[test]
fn a_checkpoint_moved_back_replays_into_counted_duplicates() {
    replays_after_moving_back(&[], OUTBOX);
}

#[test]
fn a_checkpoint_moved_back_replays_batches_into_counted_duplicates() {
    replays_after_moving_back(
        &[
            "--policy",
            handoff_test_policies::BATCHING,
            "--policy-param",
            "batch_size=2",
        ],
        OUTBOX,
    );
}

#[test]
fn a_checkpoint_moved_back_replays_shaped_records_into_counted_duplicates() {
    replays_after_moving_back(&["--policy", handoff_test_policies::DOMAIN_EVENTS], OUTBOX);
}

#[test]
fn a_checkpoint_moved_back_replays_quarantined_events_into_counted_duplicates() {
    // Documents without a schemaVersion are all quarantined by the quarantine policy.
    replays_after_moving_back(&["--policy", handoff_test_policies::QUARANTINE], QUARANTINE);
}

#[test]
fn a_record_of_another_event_under_the_same_id_is_a_conflict() {
    // The same `_id`, written for another event (another token), or planted with the event's
    // own token (tokens are not secret) for another source or consumer.
    let plants: [fn(&Document, &str) -> Document; 3] = [
        |_, source| doc! {"consumer": CONSUMER, "source": source, "token": {"_data": "planted"}},
        |token, _| doc! {"consumer": CONSUMER, "source": "elsewhere.orders", "token": token.clone()},
        |token, source| doc! {"consumer": "someone-else", "source": source, "event": {"_id": token.clone()}},
    ];
    for (planted, live) in plants
        .into_iter()
        .flat_map(|planted| [(planted, Live::start()), (planted, seven_oh())])
    {
        let start = live.start_consumer();
        live.insert(0..2);
        let events = live.events_after(&start);
        let taken = format!("{CONSUMER}/{}", event_id(&events[0]));
        let source = format!("{}.orders", live.db);
        let mut record = planted(events[0].get_document("_id").unwrap(), &source);
        record.insert("_id", &taken);
        live.wait(live.coll(OUTBOX).insert_one(record)).unwrap();
        let output = live.run(&[]);
        fails(
            &output,
            3,
            &format!("A record {taken} already exists for another event"),
        );
        assert_eq!(live.outbox_len(), 1);
        assert_eq!(live.checkpoint_token(), start);
    }
}

#[test]
fn views_and_time_series_collections_are_refused_before_anything_is_written() {
    let live = Live::start();
    let db = live.client.database(&live.db);
    live.wait(db.run_command(doc! {"create": "readings", "timeseries": {"timeField": "at"}}))
        .expect("create a time-series collection");
    live.wait(db.run_command(doc! {"create": "orders_view", "viewOn": "orders", "pipeline": []}))
        .expect("create a view");
    for (collection, needle) in [
        (
            "readings",
            "is a time-series collection: MongoDB opens no change stream",
        ),
        (
            "orders_view",
            "is a view: MongoDB opens no change stream on a view",
        ),
    ] {
        let output = live.run(&["--collection", collection]);
        fails(&output, 2, needle);
        assert!(live.checkpoint().is_none(), "{collection}");
        assert_eq!(live.outbox_len(), 0);
    }
    // A regular collection of the same database still runs.
    ok(&live.run(&[]));
    assert!(live.checkpoint().is_some());
}

#[test]
fn a_missing_privilege_is_named_and_not_retried_as_an_outage() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..2);
    let (_, insert) = live.transaction_writes();
    for (command, code, needle) in [
        (
            "replSetGetConfig",
            11,
            "MongoDB accepted the credentials but refused an operation this user is not allowed to run",
        ),
        ("aggregate", 8, "Unauthorized"),
        (
            insert,
            11,
            "MongoDB accepted the credentials but refused an operation this user is not allowed to run",
        ),
    ] {
        live.fail_point(
            Bson::Document(doc! {"times": 1}),
            doc! {"failCommands": [command], "errorCode": 13},
        );
        let output = live.run(&[]);
        live.fail_point_off();
        let out = fails(&output, code, needle);
        assert!(
            stderr(&output).contains("Least privilege") || code == 8,
            "{command}: {}",
            stderr(&output)
        );
        assert_eq!(out["exit_code"], code, "{command}");
        assert_eq!(live.outbox_len(), 0, "{command}");
        assert_eq!(live.checkpoint_token(), start, "{command}");
    }
    // With the privilege back, the same consumer goes on.
    assert_eq!(ok(&live.run(&[]))["events_handed_off"], 2);
}

/// The rows of the README's least-privilege table: the commands a row names, and what it names
/// them on.
fn documented_commands() -> Vec<(Vec<String>, String)> {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .unwrap();
    let section = readme
        .split("## Least privilege")
        .nth(1)
        .expect("README has a Least privilege section");
    let rows: Vec<(Vec<String>, String)> = section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let commands = cells[1]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect();
            (commands, cells[2].to_string())
        })
        .collect();
    assert!(rows.len() >= 5, "{rows:?}");
    rows
}

/// Every command `handoff run` sends — through a fresh consumer, hand-offs, quarantine records,
/// duplicates after a moved checkpoint and an invalidation — is in the README's table, on what
/// the table says. With `MONGODB_URI`, the same consumer also runs as a user holding only the
/// documented role.
#[test]
fn a_run_needs_only_the_documented_privileges() {
    let rows = documented_commands();
    let scenario = |live: &Live, uri: &str| {
        let run = |extra: &[&str]| {
            let output = live
                .command()
                .env("MONGODB_URI", uri)
                .args(extra)
                .output()
                .expect("run handoff");
            ok(&output)
        };
        run(&[]);
        let start = live.checkpoint_token();
        live.insert(0..3);
        run(&[]);
        live.insert(3..5);
        run(&["--policy", handoff_test_policies::QUARANTINE]);
        move_checkpoint_back(live, &start);
        run(&[]);
        live.wait(live.coll("orders").drop()).unwrap();
        run(&[]);
    };
    // MongoDB 8.0 (a commit's writes in one bulkWrite) and 7.0 (an update and inserts).
    for (wire_version, writes) in [(25, &["bulkWrite"][..]), (21, &["update", "insert"][..])] {
        let live = Live::with_config(mongo_sim::Config {
            max_wire_version: wire_version,
            ..mongo_sim::Config::default()
        });
        let server = live.server();
        server.clear_received_commands();
        scenario(&live, &live.uri());
        let received = live.received_from_handoff();
        let sent: Vec<&Document> = received.iter().collect();
        assert!(sent.len() > 20, "{} commands", sent.len());
        let mut seen = std::collections::BTreeSet::new();
        for command in sent {
            let name = command.get_str("command").unwrap();
            let on: Vec<&str> = rows
                .iter()
                .filter(|(names, _)| names.iter().any(|n| n == name))
                .map(|(_, on)| on.as_str())
                .collect();
            assert!(
                !on.is_empty(),
                "handoff sent {name}, which the README does not list"
            );
            if let Ok(collection) = command.get_str("collection") {
                let documented = match collection {
                    "orders" => "source",
                    CHECKPOINTS => "checkpoint",
                    OUTBOX => "outbox",
                    QUARANTINE => "quarantine",
                    "oplog.rs" => "oplog",
                    other => panic!("handoff sent {name} on {other}"),
                };
                assert!(
                    on.iter().any(|o| o.contains(documented)),
                    "{name} on {collection}: the README lists it on {on:?}"
                );
            }
            seen.insert(name.to_string());
        }
        let needed = [
            "replSetGetConfig",
            "aggregate",
            "findAndModify",
            "find",
            "listCollections",
        ];
        for needed in needed.iter().chain(writes) {
            assert!(
                seen.contains(*needed),
                "wire version {wire_version}: {seen:?}"
            );
        }
        // `update` stays on 8.0 too: the lease is taken and given back with one each.
        let replaced: &[&str] = if wire_version >= 25 {
            &["insert"]
        } else {
            &["bulkWrite"]
        };
        for absent in replaced {
            assert!(
                !seen.contains(*absent),
                "wire version {wire_version}: {seen:?}"
            );
        }
    }

    // On a real replica set: a user holding only the documented role runs the same consumer.
    if let Some(uri) = shared_uri() {
        let live = Live::start();
        let user_uri = least_privileged_user(&live, &uri);
        scenario(&live, &user_uri);
        assert!(live.outbox_len() >= 3);
    }
}

/// Creates the README's role for this test's database and a user holding only it; returns the
/// URI that logs in as that user.
fn least_privileged_user(live: &Live, uri: &str) -> String {
    let admin = live.client.database("admin");
    let db = &live.db;
    let role = format!("{db}_handoff");
    let collection = |name: &str| doc! {"db": db, "collection": name};
    live.wait(admin.run_command(doc! {
        "createRole": &role,
        "privileges": [
            {"resource": {"cluster": true}, "actions": ["replSetGetConfig", "getParameter"]},
            {"resource": collection("orders"), "actions": ["find", "changeStream"]},
            {"resource": collection(CHECKPOINTS), "actions": ["find", "insert", "update"]},
            {"resource": collection(OUTBOX), "actions": ["find", "insert"]},
            {"resource": collection(QUARANTINE), "actions": ["find", "insert"]},
            {"resource": {"db": "local", "collection": "oplog.rs"}, "actions": ["find"]},
        ],
        "roles": [],
    }))
    .expect("createRole");
    let password = format!("p{}", std::process::id());
    live.wait(admin.run_command(doc! {
        "createUser": &role,
        "pwd": &password,
        "roles": [{"role": &role, "db": "admin"}],
    }))
    .expect("createUser");
    let rest = uri
        .strip_prefix("mongodb://")
        .expect("a mongodb:// URI to log in with");
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let separator = if hosts.contains('?') { '&' } else { '?' };
    let hosts = if hosts.contains('/') {
        hosts.to_string()
    } else {
        format!("{hosts}/")
    };
    format!("mongodb://{role}:{password}@{hosts}{separator}authSource=admin")
}
