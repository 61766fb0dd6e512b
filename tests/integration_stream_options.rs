//! Shaping the stream: a pipeline, the document options, a database- or deployment-wide scope
//! and the invalidation marker, each end to end; the configuration bound to the checkpoint, a
//! change refused and then accepted; bad options refused before anything is written.

use crate::support;

use bson::{Bson, Document, doc};
use handoff::domain::StreamConfig;
use handoff::domain::config::parse_pipeline;
use sha2::Digest;
use support::live::*;

fn operation_types(outbox: &[Document]) -> Vec<String> {
    outbox
        .iter()
        .map(|r| {
            r.get_document("event")
                .and_then(|e| e.get_str("operationType"))
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

const INSERTS_ONLY: &str = r#"[{"$match": {"operationType": "insert"}}]"#;

#[test]
fn a_pipeline_filters_the_stream_and_is_recorded_on_the_checkpoint() {
    let live = Live::start();
    let scratch = support::Scratch::new();
    let file = scratch.path("pipeline.json");
    std::fs::write(&file, INSERTS_ONLY).unwrap();
    let file = file.to_str().unwrap().to_string();
    support::ok(&live.run(&["--pipeline", &file]));
    live.insert(0..3);
    live.wait(
        live.coll("orders")
            .update_one(doc! {"_id": 1}, doc! {"$set": {"qty": 5}}),
    )
    .unwrap();
    live.wait(live.coll("orders").delete_one(doc! {"_id": 2}))
        .unwrap();
    let out = support::ok(&live.run(&["--pipeline", &file]));
    assert_eq!(out["events_handed_off"], 3);
    assert_eq!(operation_types(&live.outbox()), ["insert"; 3]);
    let checkpoint = live.checkpoint().unwrap();
    let expected = StreamConfig {
        pipeline: parse_pipeline(INSERTS_ONLY).unwrap(),
        ..StreamConfig::default()
    };
    assert_eq!(
        checkpoint.get_document("config").unwrap(),
        &expected.to_document()
    );
    assert_eq!(
        checkpoint.get_str("configDigest").unwrap(),
        expected.digest()
    );
    // The same pipeline given inline in the environment is the same configuration.
    live.insert(10..11);
    let out = live
        .command()
        .env(support::env_names::PIPELINE, INSERTS_ONLY)
        .output()
        .unwrap();
    assert_eq!(support::ok(&out)["events_handed_off"], 1);
    // Under its former name (`PIPELINE`) too, with a warning that names both.
    live.insert(11..12);
    live.wait(live.coll("orders").delete_one(doc! {"_id": 11}))
        .unwrap();
    let out = live
        .command()
        .env("PIPELINE", INSERTS_ONLY)
        .output()
        .unwrap();
    assert_eq!(support::ok(&out)["events_handed_off"], 1);
    let err = support::stderr(&out);
    assert!(
        err.contains("read a variable under its former name")
            && err.contains("PIPELINE")
            && err.contains(support::env_names::PIPELINE),
        "{err}"
    );
    // The filter names inserts only, yet an invalidation still ends the run with startAfter.
    live.wait(live.coll("orders").drop()).unwrap();
    let out = support::ok(&live.run(&["--pipeline", &file]));
    assert_eq!(out["status"], "INVALIDATED");
    assert_eq!(
        live.checkpoint().unwrap().get_str("mode").unwrap(),
        "startAfter"
    );
    live.insert(20..21);
    assert_eq!(
        support::ok(&live.run(&["--pipeline", &file]))["events_handed_off"],
        1
    );
}

#[test]
fn another_configuration_is_refused_then_accepted_with_a_reason() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..2);
    let before = live.checkpoint().unwrap();
    let refused = live.run(&["--full-document", "default"]);
    let out = support::fails(
        &refused,
        4,
        "fullDocument: checkpoint updateLookup, this run default",
    );
    assert_eq!(out["events_handed_off"], 0);
    assert!(support::stderr(&refused).contains("--accept-config-change"));
    assert_eq!(live.checkpoint().unwrap(), before, "nothing was written");
    assert_eq!(live.outbox_len(), 0);

    let accepted = live.run(&[
        "--full-document",
        "default",
        "--accept-config-change",
        "updates no longer need the whole order",
    ]);
    assert_eq!(support::ok(&accepted)["events_handed_off"], 2);
    let checkpoint = live.checkpoint().unwrap();
    let changes = checkpoint.get_array("configChanges").unwrap();
    assert_eq!(changes.len(), 1);
    let change = changes[0].as_document().unwrap();
    assert_eq!(
        change.get_str("reason").unwrap(),
        "updates no longer need the whole order"
    );
    assert_eq!(
        change.get_str("from").unwrap(),
        StreamConfig::default().digest()
    );
    assert_eq!(
        change.get_str("to").unwrap(),
        checkpoint.get_str("configDigest").unwrap()
    );
    assert_eq!(
        checkpoint
            .get_document("config")
            .unwrap()
            .get_str("fullDocument")
            .unwrap(),
        "default"
    );
    // From now on the new configuration is the recorded one, and the old one is refused.
    support::ok(&live.run(&["--full-document", "default"]));
    support::fails(
        &live.run(&[]),
        4,
        "fullDocument: checkpoint default, this run updateLookup",
    );
}

#[test]
fn a_checkpoint_the_baseline_created_has_the_baselines_configuration() {
    let live = Live::start();
    let start = live.start_consumer();
    // What the baseline task leaves: no revision, lease or configuration.
    live.wait(live.coll(CHECKPOINTS).update_one(
        doc! {"_id": CONSUMER},
        doc! {"$unset": {"revision": "", "owner": "", "leaseUntil": "", "config": "", "configDigest": ""}},
    ))
    .unwrap();
    live.insert(0..2);
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 2);
    let checkpoint = live.checkpoint().unwrap();
    assert_eq!(
        checkpoint.get_str("configDigest").unwrap(),
        StreamConfig::default().digest()
    );
    assert!(checkpoint.get_i64("revision").unwrap() >= 3);
    assert_eq!(live.events_after(&start).len(), 2);
    // Another configuration on such a checkpoint is a change like any other.
    support::fails(
        &live.run(&["--pipeline", INSERTS_ONLY]),
        4,
        "pipeline: checkpoint 0 stage(s)",
    );
}

#[test]
fn a_database_stream_hands_off_every_collection_but_the_consumers_own() {
    let live = Live::start();
    support::ok(&live.run(&["--scope", "database"]));
    live.insert(0..2);
    live.wait(live.coll("invoices").insert_one(doc! {"_id": "i-1"}))
        .unwrap();
    let out = support::ok(&live.run(&["--scope", "database"]));
    assert_eq!(out["events_handed_off"], 3);
    let outbox = live.outbox();
    let namespaces: Vec<String> = outbox
        .iter()
        .map(|r| {
            r.get_document("event")
                .and_then(|e| e.get_document("ns"))
                .and_then(|ns| ns.get_str("coll"))
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(namespaces, ["orders", "orders", "invoices"]);
    for record in &outbox {
        assert_eq!(record.get_str("source").unwrap(), live.db);
    }
    let checkpoint = live.checkpoint().unwrap();
    assert_eq!(checkpoint.get_str("source").unwrap(), live.db);
    // Its own commits made events of the checkpoint and outbox collections: none came back.
    assert_eq!(
        support::ok(&live.run(&["--scope", "database"]))["events_handed_off"],
        0
    );
    // The scope is part of the consumer's identity.
    support::fails(&live.run(&[]), 4, "another source");
}

#[test]
fn a_deployment_stream_sees_every_database() {
    let live = Live::start();
    support::ok(&live.run(&["--scope", "deployment"]));
    live.insert(0..1);
    let other = format!("{}_other", live.db);
    live.wait(
        live.client
            .database(&other)
            .collection::<Document>("parcels")
            .insert_one(doc! {"_id": 1}),
    )
    .unwrap();
    let out = support::ok(&live.run(&["--scope", "deployment"]));
    assert_eq!(out["events_handed_off"], 2);
    let databases: Vec<String> = live
        .outbox()
        .iter()
        .map(|r| {
            r.get_document("event")
                .and_then(|e| e.get_document("ns"))
                .and_then(|ns| ns.get_str("db"))
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(databases, [live.db.clone(), other]);
    assert_eq!(live.checkpoint().unwrap().get_str("source").unwrap(), "*");
}

#[test]
fn full_document_default_leaves_updates_without_the_document() {
    let live = Live::start();
    support::ok(&live.run(&["--full-document", "default"]));
    live.insert(0..1);
    live.wait(
        live.coll("orders")
            .update_one(doc! {"_id": 0}, doc! {"$set": {"qty": 9}}),
    )
    .unwrap();
    support::ok(&live.run(&["--full-document", "default"]));
    let outbox = live.outbox();
    assert_eq!(operation_types(&outbox), ["insert", "update"]);
    let update = outbox[1].get_document("event").unwrap();
    assert!(
        !matches!(update.get("fullDocument"), Some(Bson::Document(_))),
        "{update}"
    );
}

#[test]
fn an_invalidation_marker_is_handed_off_under_the_invalidations_own_id() {
    let live = Live::start();
    support::ok(&live.run(&["--invalidate-marker"]));
    live.insert(0..1);
    live.wait(live.coll("orders").drop()).unwrap();
    let out = support::ok(&live.run(&["--invalidate-marker"]));
    assert_eq!(out["status"], "INVALIDATED");
    // The marker is not one of the events the policy handed off.
    assert_eq!(out["events_handed_off"], 2);
    let outbox = live.outbox();
    assert_eq!(operation_types(&outbox), ["insert", "drop", "invalidate"]);
    let marker = &outbox[2];
    assert_eq!(marker.get_str("marker").unwrap(), "invalidate");
    let token = marker
        .get_document("event")
        .unwrap()
        .get_document("_id")
        .unwrap();
    let id = hex::encode(sha2::Sha256::digest(
        handoff::domain::token::canonical_text(token).as_bytes(),
    ));
    assert_eq!(marker.get_str("_id").unwrap(), format!("{CONSUMER}/{id}"));
    assert_eq!(out["last_event_id"], id.as_str());
    assert_eq!(live.checkpoint_token(), *token);
    assert_eq!(
        live.checkpoint().unwrap().get_str("mode").unwrap(),
        "startAfter"
    );
}

#[test]
fn bad_stream_options_are_refused_before_anything_is_written() {
    let live = Live::start();
    let scratch = support::Scratch::new();
    let missing = scratch.path("missing.json");
    for (args, needle) in [
        (
            vec!["--scope", "galaxy"],
            "--scope \"galaxy\" is not one of",
        ),
        (
            vec!["--full-document", "sometimes"],
            "--full-document \"sometimes\"",
        ),
        (
            vec!["--full-document-before-change", "on"],
            "--full-document-before-change \"on\"",
        ),
        (
            vec!["--pipeline", r#"[{"$group": {"_id": 1}}]"#],
            "$group is not allowed",
        ),
        (
            vec!["--pipeline", r#"[{"$unset": "_id"}]"#],
            "_id (the event's resume token)",
        ),
        (vec!["--pipeline", "[1"], "not JSON"),
        (vec!["--pipeline", missing.to_str().unwrap()], "cannot read"),
        (vec!["--accept-config-change", " "], "needs a reason"),
    ] {
        support::fails(&live.run(&args), 2, needle);
    }
    assert!(live.checkpoint().is_none());
    assert!(
        !live.user_databases().contains(&live.db),
        "nothing was written"
    );
}

fn run_command(live: &Live, command: Document) {
    live.wait(live.client.database(&live.db).run_command(command))
        .expect("command");
}

#[test]
fn pre_and_post_images_reach_the_outbox() {
    let live = Live::start();
    run_command(
        &live,
        doc! {"create": "orders", "changeStreamPreAndPostImages": {"enabled": true}},
    );
    let images = [
        "--full-document",
        "required",
        "--full-document-before-change",
        "whenAvailable",
    ];
    support::ok(&live.run(&images));
    live.insert(0..1);
    let orders = live.coll("orders");
    live.wait(orders.update_one(doc! {"_id": 0}, doc! {"$set": {"qty": 1}}))
        .unwrap();
    live.wait(orders.update_one(doc! {"_id": 0}, doc! {"$set": {"qty": 2}}))
        .unwrap();
    live.wait(orders.delete_one(doc! {"_id": 0})).unwrap();
    assert_eq!(support::ok(&live.run(&images))["events_handed_off"], 4);
    let events: Vec<Document> = live
        .outbox()
        .iter()
        .map(|r| r.get_document("event").unwrap().clone())
        .collect();
    // The first update: the document after it (its post-image, not the current one) and before.
    assert_eq!(
        events[1].get_document("fullDocument").unwrap(),
        &doc! {"_id": 0, "qty": 1}
    );
    assert_eq!(
        events[1].get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 0, "qty": 0}
    );
    assert_eq!(
        events[3].get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 0, "qty": 2}
    );
}

#[test]
fn a_required_image_that_is_missing_stops_the_run_until_the_consumer_moves_on() {
    let live = Live::start();
    let required = ["--full-document-before-change", "required"];
    support::ok(&live.run(&required));
    live.insert(0..1);
    live.wait(
        live.coll("orders")
            .update_one(doc! {"_id": 0}, doc! {"$set": {"qty": 1}}),
    )
    .unwrap();
    // The collection keeps no images: the run says so at its start, reading nothing.
    let before = live.checkpoint_token();
    let refused = live.run(&required);
    let out = support::fails(&refused, 15, "does not record them");
    assert!(support::stderr(&refused).contains("collMod"));
    assert_eq!(out["events_handed_off"], 0);
    assert_eq!(live.checkpoint_token(), before);
    // Enabled now, the collection still holds no image of the update made before: that event
    // stops the run, the insert before it (no pre-image to require) and the update both stay.
    run_command(
        &live,
        doc! {"collMod": "orders", "changeStreamPreAndPostImages": {"enabled": true}},
    );
    let failed = live.run(&required);
    let out = support::fails(&failed, 15, "Enable changeStreamPreAndPostImages");
    assert_eq!(out["error_class"], "image_missing");
    assert_eq!(
        live.checkpoint_token(),
        before,
        "the checkpoint stays before the update"
    );
    assert!(
        support::stderr(&failed).contains("NoMatchingDocument (code 47)"),
        "{}",
        support::stderr(&failed)
    );
    // Every run stops there, until the consumer continues with whenAvailable.
    support::fails(&live.run(&required), 15, "image");
    let out = support::ok(&live.run(&[
        "--full-document-before-change",
        "whenAvailable",
        "--accept-config-change",
        "images were off for these updates",
    ]));
    assert_eq!(out["events_handed_off"], 2);
    let update = live.outbox()[1].get_document("event").unwrap().clone();
    assert_eq!(update.get("fullDocumentBeforeChange"), Some(&Bson::Null));
}
