//! What the outbox holds, end to end on a replica set: records shaped by the `domain-events`
//! policy, the duplicates a checkpoint moved back meets (suppressed and counted, never a dead
//! end), a same-ID record of another event (a conflict), sources MongoDB opens no change stream
//! on (refused before anything is written), and the commands each writing command sends (the
//! documented least privilege: each command's table and role).

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

/// The README's least privilege for one command (its subsection of "Least privilege"): the rows
/// of its table and the privileges of its role.
struct Documented {
    rows: Vec<Row>,
    role: Vec<Document>,
}

/// A row of a least-privilege table: the commands it names, what it names them on, and the
/// privilege actions it lists.
#[derive(Debug)]
struct Row {
    commands: Vec<String>,
    on: String,
    actions: Vec<String>,
}

/// The words between backticks in `text`.
fn quoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn documented(command: &str) -> Documented {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .unwrap();
    let part = readme
        .split("\n### Least privilege\n")
        .nth(1)
        .expect("README has a Least privilege section");
    let part = part.split("\n## ").next().unwrap();
    let section = part
        .split(&format!("\n#### `{command}`\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("README's Least privilege has no section for `{command}`"));
    let section = section.split("\n#### ").next().unwrap();
    let rows: Vec<Row> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            Row {
                commands: quoted(cells[1]),
                on: cells[2].to_string(),
                actions: quoted(cells[3]),
            }
        })
        .collect();
    assert!(rows.len() >= 5, "{command}: {rows:?}");
    // The role: the block after `<!-- role: COMMAND -->`, its `createRole` argument as JSON.
    let block = section
        .split(&format!("<!-- role: {command} -->\n```js\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("`{command}` has no role block"));
    let block = block.split("\n```").next().unwrap();
    let argument = block
        .split_once("createRole(")
        .and_then(|(_, rest)| rest.rsplit_once(')'))
        .map(|(argument, _)| argument)
        .unwrap_or_else(|| panic!("`{command}`'s role block calls no createRole: {block}"));
    let role: serde_json::Value = serde_json::from_str(argument)
        .unwrap_or_else(|e| panic!("`{command}`'s role is not JSON ({e}): {argument}"));
    let role = match Bson::try_from(role).expect("a role in Extended JSON") {
        Bson::Document(role) => role,
        other => panic!("`{command}`'s role is not a document: {other}"),
    };
    let role = role
        .get_array("privileges")
        .expect("privileges")
        .iter()
        .map(|p| p.as_document().expect("a privilege").clone())
        .collect();
    Documented { rows, role }
}

const AUDIT: &str = "kestra_change_audit";
const SIGNALS: &str = "kestra_change_signals";
const BACKFILL_STATES: &str = "kestra_change_backfill";
const REGISTRY: &str = "kestra_change_registry";
const RUNS: &str = "kestra_change_runs";

/// What a table's "on" cell calls the collection `collection` of the test's database.
fn target_of(collection: &str) -> &'static str {
    match collection {
        "orders" => "source collection",
        CHECKPOINTS => "checkpoint collection",
        OUTBOX => "outbox collection",
        QUARANTINE => "quarantine collection",
        AUDIT => "audit collection",
        SIGNALS => "signal collection",
        BACKFILL_STATES => "backfill state collection",
        REGISTRY => "registry collection",
        RUNS => "runs collection",
        "oplog.rs" => "`local.oplog.rs`",
        "version" => "`config.version`",
        // The cursor of a change stream on the whole database.
        "$cmd.aggregate" => "source database",
        other => panic!("handoff sent a command on {other}"),
    }
}

/// The resource a table's target names, in the README's database `shop`; `None` for a target
/// no privilege is about (`—`) and for the registry, which a consumer under the default names
/// never writes.
fn resource_of(target: &str) -> Option<Document> {
    let collection = |name: &str| Some(doc! {"db": "shop", "collection": name});
    match target {
        "—" | "registry collection" => None,
        "cluster" => Some(doc! {"cluster": true}),
        "source database" => collection(""),
        "`local.oplog.rs`" => Some(doc! {"db": "local", "collection": "oplog.rs"}),
        "`config.version`" => Some(doc! {"db": "config", "collection": "version"}),
        other => {
            let name = [
                "orders",
                CHECKPOINTS,
                OUTBOX,
                QUARANTINE,
                AUDIT,
                SIGNALS,
                BACKFILL_STATES,
                RUNS,
            ]
            .into_iter()
            .find(|name| target_of(name) == other)
            .unwrap_or_else(|| panic!("a table names an unknown target: {other:?}"));
            collection(name)
        }
    }
}

/// Whether the role grants `action` on `resource` (a collection's actions are also granted by
/// a privilege on its whole database).
fn grants(role: &[Document], resource: &Document, action: &str) -> bool {
    let database = resource
        .get_str("db")
        .ok()
        .map(|db| doc! {"db": db, "collection": ""});
    role.iter().any(|privilege| {
        let on = privilege.get_document("resource").expect("a resource");
        (on == resource || Some(on) == database.as_ref())
            && privilege
                .get_array("actions")
                .expect("actions")
                .iter()
                .any(|a| a.as_str() == Some(action))
    })
}

/// The role grants every action of the table, and nothing the table does not list.
fn role_matches_table(command: &str, documented: &Documented) {
    let mut listed = Vec::new();
    for row in &documented.rows {
        for target in row.on.split(", ") {
            let Some(resource) = resource_of(target) else {
                continue;
            };
            for action in &row.actions {
                assert!(
                    grants(&documented.role, &resource, action),
                    "`{command}`: the role does not grant {action} on {resource}: {row:?}"
                );
                listed.push((resource.clone(), action.clone()));
            }
        }
    }
    for privilege in &documented.role {
        let resource = privilege.get_document("resource").unwrap();
        for action in privilege.get_array("actions").unwrap() {
            let action = action.as_str().unwrap();
            assert!(
                listed.iter().any(|(r, a)| r == resource && a == action),
                "`{command}`: the role grants {action} on {resource}, which its table does not list"
            );
        }
    }
}

/// Every command `sent` is in the table, on what the table says.
fn sent_commands_are_documented(command: &str, documented: &Documented, sent: &[Document]) {
    for sent in sent {
        let name = sent.get_str("command").unwrap();
        let rows: Vec<&Row> = documented
            .rows
            .iter()
            .filter(|row| row.commands.iter().any(|n| n == name))
            .collect();
        assert!(
            !rows.is_empty(),
            "`{command}` sent {name}, which its README table does not list"
        );
        let mut targets: Vec<&str> = Vec::new();
        if let Ok(collection) = sent.get_str("collection") {
            targets.push(target_of(collection));
        } else if name == "aggregate" && sent.get_str("db").ok() != Some("admin") {
            targets.push("source database");
        }
        if let Ok(namespaces) = sent.get_array("namespaces") {
            for namespace in namespaces {
                let (_, collection) = namespace.as_str().unwrap().split_once('.').unwrap();
                targets.push(target_of(collection));
            }
        }
        for target in targets {
            assert!(
                rows.iter()
                    .any(|row| row.on.split(", ").any(|o| o == target)),
                "`{command}` sent {name} on the {target}: its README table lists {name} on {:?}",
                rows.iter().map(|r| &r.on).collect::<Vec<_>>()
            );
        }
    }
}

/// An operator command as the user of `uri`, on the test's database.
fn operator_as(live: &Live, uri: &str, args: &[&str]) {
    let output = support::handoff()
        .args(args)
        .env("MONGODB_URI", uri)
        .env("SOURCE_DATABASE", &live.db)
        .env_remove(support::env_names::AUDIT_COLLECTION)
        .env_remove("HANDOFF_OPERATOR")
        .output()
        .expect("run handoff");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}",
        stderr(&output)
    );
}

/// `handoff run` as the user of `uri`.
fn run_as(live: &Live, uri: &str, extra: &[&str]) {
    let output = live
        .command()
        .env("MONGODB_URI", uri)
        .args(extra)
        .output()
        .expect("run handoff");
    ok(&output);
}

/// A consumer of the quarantine policy whose source holds documents it hands off and documents
/// it quarantines.
fn quarantining_consumer(live: &Live) {
    run_as(
        live,
        &live.uri(),
        &["--policy", handoff_test_policies::QUARANTINE],
    );
    live.wait(live.coll("orders").insert_many((0..6).map(|i| {
        let version = if i % 3 == 0 { 99 } else { 1 };
        doc! {"_id": i, "schemaVersion": version}
    })))
    .expect("insert");
}

/// One writing command: the README section it is documented in, what the consumer needs before
/// it, what it does as the user of a URI, and the commands it must have sent.
struct Case {
    section: &'static str,
    setup: fn(&Live),
    exercise: fn(&Live, &str),
    sends: &'static [&'static str],
}

const CASES: [Case; 6] = [
    // Through a fresh consumer, hand-offs, quarantine records, duplicates after a moved
    // checkpoint and an invalidation.
    Case {
        section: "run",
        setup: |_| {},
        exercise: |live, uri| {
            run_as(live, uri, &[]);
            let start = live.checkpoint_token();
            live.insert(0..3);
            run_as(live, uri, &[]);
            live.insert(3..5);
            run_as(live, uri, &["--policy", handoff_test_policies::QUARANTINE]);
            move_checkpoint_back(live, &start);
            run_as(live, uri, &[]);
            live.wait(live.coll("orders").drop()).unwrap();
            run_as(live, uri, &[]);
        },
        sends: &[
            "replSetGetConfig",
            "aggregate",
            "findAndModify",
            "find",
            "listCollections",
        ],
    },
    // A dry run, a move to the present, a move back to a token.
    Case {
        section: "checkpoint reset",
        setup: |live| {
            run_as(live, &live.uri(), &[]);
            live.insert(0..2);
            run_as(live, &live.uri(), &[]);
        },
        exercise: |live, uri| {
            let before = live.checkpoint_token();
            operator_as(
                live,
                uri,
                &["checkpoint", "reset", "--to", "now", "--dry-run"],
            );
            operator_as(
                live,
                uri,
                &["checkpoint", "reset", "--to", "now", "--reason", "a test"],
            );
            let token = Bson::Document(before).into_relaxed_extjson().to_string();
            operator_as(
                live,
                uri,
                &[
                    "checkpoint",
                    "reset",
                    "--to-token",
                    &token,
                    "--mode",
                    "resumeAfter",
                    "--reason",
                    "a test",
                ],
            );
            assert_eq!(live.records(AUDIT).len(), 2);
        },
        sends: &["update", "insert", "aggregate", "find"],
    },
    Case {
        section: "backfill",
        setup: quarantining_consumer,
        exercise: |live, uri| {
            operator_as(
                live,
                uri,
                &[
                    "backfill",
                    "--policy",
                    handoff_test_policies::QUARANTINE,
                    "--reason",
                    "a test",
                ],
            );
            assert_eq!(live.records(QUARANTINE).len(), 2);
            assert_eq!(live.outbox_len(), 4);
        },
        sends: &["aggregate", "findAndModify", "insert", "delete", "update"],
    },
    // Records lost from both collections: the repair hands off and quarantines again.
    Case {
        section: "reconcile --repair",
        setup: |live| {
            quarantining_consumer(live);
            run_as(
                live,
                &live.uri(),
                &["--policy", handoff_test_policies::QUARANTINE],
            );
            for collection in [OUTBOX, QUARANTINE] {
                live.wait(live.coll(collection).delete_many(doc! {}))
                    .expect("delete");
            }
        },
        exercise: |live, uri| {
            operator_as(
                live,
                uri,
                &[
                    "reconcile",
                    "--policy",
                    handoff_test_policies::QUARANTINE,
                    "--repair",
                    "--reason",
                    "a test",
                ],
            );
            assert_eq!(live.records(QUARANTINE).len(), 2);
            assert_eq!(live.outbox_len(), 4);
        },
        sends: &["aggregate", "count", "insert"],
    },
    // History lost under a consumer of the quarantine policy: the move, then the repair.
    Case {
        section: "recover",
        setup: |live| {
            quarantining_consumer(live);
            let policy = ["--policy", handoff_test_policies::QUARANTINE];
            run_as(live, &live.uri(), &policy);
            live.wait(
                live.coll("orders")
                    .insert_many((100..160).map(|i| doc! {"_id": i, "schemaVersion": 1})),
            )
            .expect("insert");
            for round in 0..2 {
                live.wait(
                    live.coll("orders")
                        .update_many(doc! {"_id": {"$gte": 100}}, doc! {"$set": {"round": round}}),
                )
                .expect("update");
            }
            let output = live.command().args(policy).output().expect("run handoff");
            if output.status.code() != Some(6) {
                // A replica set does not lose its history on demand: a recovery killed after its
                // move leaves the repair the same work.
                ok(&output);
                live.wait(
                    live.coll(OUTBOX)
                        .delete_many(doc! {"event.documentKey._id": {"$gte": 100}}),
                )
                .expect("delete");
                live.wait(live.coll(CHECKPOINTS).update_one(
                    doc! {"_id": CONSUMER},
                    doc! {"$set": {"recovering": {"reason": "a test"}}},
                ))
                .expect("plant a recovery");
            }
        },
        exercise: |live, uri| {
            operator_as(
                live,
                uri,
                &[
                    "recover",
                    "--policy",
                    handoff_test_policies::QUARANTINE,
                    "--reason",
                    "a test",
                ],
            );
            let checkpoint = live.checkpoint().expect("checkpoint");
            assert!(checkpoint.get("recovering").is_none(), "{checkpoint}");
            assert_eq!(live.records(QUARANTINE).len(), 2);
            assert_eq!(live.outbox_len(), 64);
        },
        sends: &["aggregate", "count", "update", "insert"],
    },
    // The lease of a run that died, given back.
    Case {
        section: "lease release",
        setup: |live| {
            run_as(live, &live.uri(), &[]);
            let until =
                bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 60_000);
            live.wait(live.coll(CHECKPOINTS).update_one(
                doc! {"_id": CONSUMER},
                doc! {"$set": {"owner": "handoff@lost:1:1", "leaseUntil": until}},
            ))
            .expect("plant a lease");
        },
        exercise: |live, uri| {
            operator_as(live, uri, &["lease", "release", "--reason", "a test"]);
            assert_eq!(live.records(AUDIT).len(), 1);
        },
        sends: &["find", "update", "insert"],
    },
];

/// Sets the case up on `live`, runs it, and checks every command it sent against its table;
/// returns them.
fn sent_by(case: &Case, documented: &Documented, live: &Live) -> Vec<Document> {
    (case.setup)(live);
    live.server().clear_received_commands();
    (case.exercise)(live, &live.uri());
    let sent = live.received_from_handoff();
    sent_commands_are_documented(case.section, documented, &sent);
    sent
}

/// Every command each writing command sends is in its README table, on what the table says, and
/// the README's role for it grants what the table lists and no more. With `MONGODB_URI`, each
/// command also runs as a user holding only its documented role on a real replica set.
#[test]
fn every_writing_command_needs_only_the_documented_privileges() {
    for case in &CASES {
        let documented = documented(case.section);
        role_matches_table(case.section, &documented);
        // MongoDB 8.0 (a commit's writes in one bulkWrite) and 7.0 (an update and inserts).
        for wire_version in [25, 21] {
            let live = Live::with_config(mongo_sim::Config {
                max_wire_version: wire_version,
                // Small enough for `recover`'s setup to lose the consumer's history (180
                // events), large enough for its repair's writes (about 65).
                history_limit: if case.section == "recover" {
                    100
                } else {
                    mongo_sim::Config::default().history_limit
                },
                ..mongo_sim::Config::default()
            });
            let sent = sent_by(case, &documented, &live);
            let seen: std::collections::BTreeSet<&str> =
                sent.iter().map(|c| c.get_str("command").unwrap()).collect();
            let writes: &[&str] = match (case.section, wire_version) {
                ("run", 25) => &["bulkWrite"],
                ("run", _) => &["update", "insert"],
                _ => &[],
            };
            for needed in case.sends.iter().chain(writes) {
                assert!(
                    seen.contains(needed),
                    "`{}` on wire version {wire_version} sent no {needed}: {seen:?}",
                    case.section
                );
            }
            if case.section == "run" {
                // `update` stays on 8.0 too: the lease is taken with one.
                let replaced = if wire_version >= 25 {
                    "insert"
                } else {
                    "bulkWrite"
                };
                assert!(
                    !seen.contains(replaced),
                    "wire version {wire_version}: {seen:?}"
                );
            }
        }

        // Through a sharded cluster's mongos (a recovery's setup, which makes the replica set
        // forget the consumer's position, is the replica set's).
        if case.section != "recover" {
            let live = Live::sharded(2);
            let sent = sent_by(case, &documented, &live);
            let seen: std::collections::BTreeSet<&str> =
                sent.iter().map(|c| c.get_str("command").unwrap()).collect();
            assert!(
                !seen.contains("replSetGetConfig"),
                "`{}` through mongos: {seen:?}",
                case.section
            );
        }

        // On a real replica set: a user holding only the documented role runs the command.
        if let Some(uri) = shared_uri() {
            let live = Live::start();
            (case.setup)(&live);
            let user_uri = least_privileged_user(&live, &uri, &documented.role);
            (case.exercise)(&live, &user_uri);
        }
    }
}

/// Creates a role with the README's `privileges` for this test's database (`shop` in the README)
/// and a user holding only it; returns the URI that logs in as that user.
fn least_privileged_user(live: &Live, uri: &str, privileges: &[Document]) -> String {
    static USERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let admin = live.client.database("admin");
    let db = &live.db;
    let n = USERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let role = format!("{db}_handoff_{n}");
    let privileges: Vec<Document> = privileges
        .iter()
        .map(|privilege| {
            let mut privilege = privilege.clone();
            let resource = privilege.get_document_mut("resource").unwrap();
            if resource.get_str("db").ok() == Some("shop") {
                resource.insert("db", db.as_str());
            }
            privilege
        })
        .collect();
    live.wait(admin.run_command(doc! {
        "createRole": &role,
        "privileges": privileges,
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
