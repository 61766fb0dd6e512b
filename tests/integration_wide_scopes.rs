//! Database and deployment streams beside other consumers: no consumer's state (whatever its
//! collections are called, whatever database holds them) ever comes back as an event, not even
//! when it is registered while a stream runs; and the operator's commands serve wide consumers
//! (`status`, `checkpoint reset`, the evidence of a failed run) or refuse them with guidance
//! (`reconcile`, `backfill`).

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::Config;
use serde_json::Value;
use support::live::{CHECKPOINTS, Live, OUTBOX};

const AUDIT: &str = "kestra_change_audit";
const REGISTRY: &str = "kestra_change_registry";

/// An operator command on the test's deployment, with no other variable set.
fn operator(live: &Live, args: &[&str]) -> Output {
    support::handoff()
        .args(args)
        .env("MONGODB_URI", live.uri())
        // A `run` among the commands ends after a second without events.
        .env("MAX_WAIT_SECONDS", "1")
        .output()
        .expect("run handoff")
}

fn documents(live: &Live, database: &str, collection: &str) -> Vec<Document> {
    live.rt.block_on(async {
        live.client
            .database(database)
            .collection::<Document>(collection)
            .find(doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("collect")
    })
}

/// `db.coll` of each record's event, in the outbox's order.
fn namespaces(records: &[Document]) -> Vec<String> {
    records
        .iter()
        .map(|record| {
            let ns = record
                .get_document("event")
                .and_then(|event| event.get_document("ns"))
                .expect("the event's namespace");
            format!(
                "{}.{}",
                ns.get_str("db").expect("db"),
                ns.get_str("coll").expect("coll")
            )
        })
        .collect()
}

fn events(output: &Output) -> i64 {
    support::ok(output)["events_handed_off"]
        .as_i64()
        .expect("events_handed_off")
}

#[test]
fn two_deployment_consumers_hand_off_only_the_applications_events() {
    let live = Live::start();
    let (a, b) = (live.db.clone(), format!("{}_b", live.db));
    let app = format!("{}_app", live.db);
    let a_args = [
        "--scope",
        "deployment",
        "--database",
        &a,
        "--consumer-id",
        "a",
    ];
    let b_args = [
        "--scope",
        "deployment",
        "--database",
        &b,
        "--consumer-id",
        "b",
    ];
    assert_eq!(support::ok(&live.run(&a_args))["status"], "IDLE");
    assert_eq!(support::ok(&live.run(&b_args))["status"], "IDLE");
    let orders = live.client.database(&app).collection::<Document>("orders");
    live.wait(orders.insert_one(doc! {"_id": 1, "qty": 1}))
        .unwrap();
    // An application's document that looks like a handoff record is still the application's.
    live.wait(orders.insert_one(doc! {
        "_id": "a/0000", "consumer": "a", "source": "*", "event": {"operationType": "insert"}
    }))
    .unwrap();
    let mut handed_off = Vec::new();
    for round in 0..4 {
        handed_off.push((events(&live.run(&a_args)), events(&live.run(&b_args))));
        // The outboxes' readers mark what they read, then delete it: updates and deletes
        // (which carry no document) of the records are handoff's state too.
        for database in [&a, &b] {
            let outbox = live
                .client
                .database(database)
                .collection::<Document>(OUTBOX);
            if round == 1 {
                live.wait(outbox.update_many(doc! {}, doc! {"$set": {"read": true}}))
                    .unwrap();
            }
            if round == 2 {
                live.wait(outbox.delete_many(doc! {})).unwrap();
            }
        }
        if round == 0 {
            for database in [&a, &b] {
                assert_eq!(
                    namespaces(&documents(&live, database, OUTBOX)),
                    [format!("{app}.orders"), format!("{app}.orders")],
                    "{database}"
                );
            }
        }
    }
    assert_eq!(handed_off, [(2, 2), (0, 0), (0, 0), (0, 0)]);
}

#[test]
fn a_consumer_with_its_own_collection_names_stays_out_of_every_wide_stream() {
    let live = Live::start();
    let shop = live.db.clone();
    let wide = format!("{}_wide", live.db);
    let deployment = [
        "--scope",
        "deployment",
        "--database",
        &wide,
        "--consumer-id",
        "w",
    ];
    // Beside it in the same database, a database consumer whose updates carry no document.
    let database = [
        "--scope",
        "database",
        "--database",
        &shop,
        "--consumer-id",
        "d",
        "--full-document",
        "default",
    ];
    let custom = [
        "--database",
        &shop,
        "--consumer-id",
        "c",
        "--checkpoint-collection",
        "c_points",
        "--outbox-collection",
        "c_box",
        "--quarantine-collection",
        "c_quarantine",
    ];
    assert_eq!(events(&live.run(&deployment)), 0);
    assert_eq!(events(&live.run(&database)), 0);
    assert_eq!(events(&live.run(&custom)), 0);
    live.insert(0..1);
    assert_eq!(events(&live.run(&custom)), 1);
    let c_box = live.coll("c_box");
    live.wait(c_box.update_many(doc! {}, doc! {"$set": {"read": true}}))
        .unwrap();
    live.wait(c_box.delete_many(doc! {})).unwrap();
    // The application's one insert, and nothing of consumer c.
    assert_eq!(events(&live.run(&deployment)), 1);
    assert_eq!(events(&live.run(&database)), 1);
    for (db, consumer) in [(&wide, "w"), (&shop, "d")] {
        let records: Vec<Document> = documents(&live, db, OUTBOX)
            .into_iter()
            .filter(|r| r.get_str("consumer").ok() == Some(consumer))
            .collect();
        assert_eq!(
            namespaces(&records),
            [format!("{shop}.orders")],
            "{consumer}"
        );
    }
    assert_eq!(events(&live.run(&deployment)), 0);
    assert_eq!(events(&live.run(&database)), 0);
    // How they knew: consumer c listed its collections before writing them.
    let mut registered: Vec<String> = documents(&live, &shop, REGISTRY)
        .iter()
        .map(|d| d.get_str("_id").unwrap().to_string())
        .collect();
    registered.sort();
    assert_eq!(registered, ["c_box", "c_points", "c_quarantine"]);
}

#[test]
fn a_state_collection_registered_while_the_stream_runs_is_left_out() {
    let live = Live::start();
    let other = format!("{}_c", live.db);
    // Hands off updates only: the registry's inserts must reach the host all the same.
    let pipeline = r#"[{"$match": {"operationType": "update"}}]"#;
    let wide = ["--scope", "deployment", "--pipeline", pipeline];
    assert_eq!(events(&live.run(&wide)), 0);
    // The other database exists, with an empty registry, when the stream opens.
    let parcels = live
        .client
        .database(&other)
        .collection::<Document>("parcels");
    live.wait(parcels.insert_one(doc! {"_id": 1, "state": "new"}))
        .unwrap();
    let mut running = live
        .command()
        .args(wide)
        .env("MAX_WAIT_SECONDS", "30")
        .env("MAX_EVENTS", "1")
        .env("HANDOFF_LOG", "handoff=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff");
    let mut log = BufReader::new(running.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            Instant::now() < deadline && log.read_line(&mut line).unwrap() > 0,
            "the stream never opened: {seen:?}"
        );
        if line.contains("change stream opened") {
            break;
        }
        seen.push(line);
    }
    // A consumer of the other database starts (its checkpoint is updated: a claim, a start
    // position, a lease given back) while the stream runs...
    let custom = [
        "--database",
        &other,
        "--collection",
        "parcels",
        "--consumer-id",
        "c",
        "--checkpoint-collection",
        "c_points",
        "--outbox-collection",
        "c_box",
    ];
    assert_eq!(events(&live.run(&custom)), 0);
    // ... then the application's update: the run's one event.
    live.wait(parcels.update_one(doc! {"_id": 1}, doc! {"$set": {"state": "sent"}}))
        .unwrap();
    let mut rest = Vec::new();
    log.read_to_end(&mut rest).expect("the run's log");
    let mut output = running.wait_with_output().expect("the run ends");
    output.stderr = rest;
    assert_eq!(events(&output), 1);
    assert_eq!(
        namespaces(&live.outbox()),
        [format!("{other}.parcels")],
        "{}",
        support::stderr(&output)
    );
}

#[test]
fn status_and_reset_serve_database_and_deployment_consumers() {
    let live = Live::start();
    let state = format!("{}_state", live.db);
    for scope in ["database", "deployment"] {
        let consumer = format!("wide-{scope}");
        let target = [
            "--scope",
            scope,
            "--database",
            &state,
            "--consumer-id",
            &consumer,
        ];
        assert_eq!(events(&live.run(&target)), 0);
        live.wait(
            live.client
                .database(&state)
                .collection::<Document>("orders")
                .insert_one(doc! {"_id": scope}),
        )
        .unwrap();
        assert_eq!(events(&live.run(&target)), 1);
        let source = if scope == "database" {
            state.as_str()
        } else {
            "*"
        };

        let status = support::json_stdout(&operator(
            &live,
            &[&["status", "--json"][..], &target].concat(),
        ));
        assert_eq!(status["source"], source, "{status}");
        assert_eq!(status["checkpoint"]["source"], source, "{status}");
        assert_eq!(status["outbox"]["records"], 1, "{status}");
        let human = operator(&live, &[&["status"][..], &target].concat());
        let human = String::from_utf8_lossy(&human.stdout).into_owned();
        assert!(!human.contains("belongs to"), "{human}");

        let checkpoints = live
            .client
            .database(&state)
            .collection::<Document>(CHECKPOINTS);
        let read = || {
            live.wait(checkpoints.find_one(doc! {"_id": &consumer}))
                .unwrap()
                .expect("a checkpoint")
        };
        let before = read();
        let reset = [
            &["checkpoint", "reset", "--to", "now", "--json"][..],
            &target,
            &["--reason", "wide reset in test"],
        ]
        .concat();
        let applied = support::json_stdout(&operator(&live, &reset));
        assert_eq!(applied["applied"], true, "{applied}");
        assert_eq!(applied["source"], source, "{applied}");
        let after = read();
        assert_ne!(after.get("token"), before.get("token"));
        assert_eq!(
            after.get_i64("revision").unwrap(),
            before.get_i64("revision").unwrap() + 1
        );
        let audit = documents(&live, &state, AUDIT);
        assert_eq!(
            audit
                .iter()
                .filter(|r| r.get_str("consumer").ok() == Some(consumer.as_str()))
                .count(),
            1
        );
        // The consumer goes on from the new position.
        assert_eq!(events(&live.run(&target)), 0);

        // Without its scope the command names the flag that was missing.
        let unscoped = operator(
            &live,
            &[
                "checkpoint",
                "reset",
                "--to",
                "now",
                "--database",
                &state,
                "--consumer-id",
                &consumer,
                "--reason",
                "r",
            ],
        );
        support::refused(&unscoped, 4, "--scope");

        // Reconcile and backfill compare or copy one collection: refused, pointing to what
        // serves such a consumer, with nothing written.
        let revision = read().get_i64("revision").unwrap();
        for command in [
            vec!["reconcile"],
            vec!["reconcile", "--repair", "--reason", "r"],
            vec!["backfill", "--reason", "r"],
        ] {
            let refused = operator(&live, &[&command[..], &target].concat());
            support::refused(&refused, 2, &format!("handoff status --scope {scope}"));
            support::refused(
                &refused,
                2,
                &format!("handoff checkpoint reset --scope {scope}"),
            );
        }
        assert_eq!(read().get_i64("revision").unwrap(), revision);
        assert_eq!(
            documents(&live, &state, AUDIT).len(),
            if scope == "database" { 1 } else { 2 }
        );
    }
}

#[test]
fn a_wide_pipeline_that_drops_the_namespace_is_refused_before_anything_is_written() {
    let live = Live::start();
    for pipeline in [
        r#"[{"$project": {"operationType": 1, "fullDocument": 1}}]"#,
        r#"[{"$unset": "ns"}]"#,
    ] {
        let out = live.run(&["--scope", "database", "--pipeline", pipeline]);
        support::fails(&out, 2, "ns (the event's namespace");
    }
    assert!(live.checkpoint().is_none());
    assert!(live.user_databases().iter().all(|db| *db != live.db));
}

#[test]
fn the_evidence_of_a_deployment_consumer_names_commands_that_work() {
    let live = Live::with_config(Config {
        history_limit: 8,
        ..Config::default()
    });
    let target = [
        "--scope",
        "deployment",
        "--database",
        "wide_state",
        "--consumer-id",
        "everything",
    ];
    assert_eq!(events(&live.run(&target)), 0);
    live.wait(
        live.client
            .database("shop")
            .collection::<Document>("orders")
            .insert_many((0..20).map(|i| doc! {"_id": i}).collect::<Vec<_>>()),
    )
    .unwrap();
    let failed = support::fails(&live.run(&target), 6, "ChangeStreamHistoryLost");
    let next: Vec<String> = failed["evidence"]["next_commands"]
        .as_array()
        .expect("next commands")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let flags = "--scope deployment --database wide_state --consumer-id everything";
    assert_eq!(
        next,
        [
            format!("handoff status {flags}"),
            format!("handoff checkpoint reset {flags} --to now --reason '<why>' --dry-run"),
            format!("handoff checkpoint reset {flags} --to now --reason '<why>'"),
            format!("handoff run {flags}"),
        ]
    );
    // Each works as given.
    for command in &next {
        let command = command.replace("'<why>'", "evidence-followed");
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let output = operator(&live, &args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command}: {}",
            support::stderr(&output)
        );
    }
    assert_eq!(events(&live.run(&target)), 0);
}
