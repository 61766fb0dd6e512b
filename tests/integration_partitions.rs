//! Partitioned consumers: N runs share one source, each with its own checkpoint, and between them
//! hand off every event exactly once, the events of one document key by one partition, in order.

use crate::support;

use std::collections::{HashMap, HashSet};

use bson::{Bson, Document, doc};
use handoff::domain::config::Partition;
use mongo_sim::expression::hashed_index_key;
use support::live::*;

const PARTITIONS: u32 = 3;

fn consumer(i: u32) -> String {
    format!("orders-part-{i}")
}

fn run_partition(live: &Live, i: u32) -> serde_json::Value {
    let partition = format!("{i}/{PARTITIONS}");
    support::ok(&live.run(&["--consumer-id", &consumer(i), "--partition", &partition]))
}

fn records_of(live: &Live, i: u32) -> Vec<Document> {
    live.records(OUTBOX)
        .into_iter()
        .filter(|r| r.get_str("consumer").ok() == Some(consumer(i).as_str()))
        .collect()
}

#[test]
fn partitions_hand_off_every_event_exactly_once_and_keep_each_keys_order() {
    let live = Live::start();
    for i in 0..PARTITIONS {
        assert_eq!(run_partition(&live, i)["status"], "IDLE");
    }
    let start = live
        .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer(0)}))
        .unwrap()
        .unwrap()
        .get_document("token")
        .unwrap()
        .clone();
    // Keys of several types; each written several times.
    let orders = live.coll("orders");
    let keys: Vec<Bson> = (0..30)
        .map(Bson::Int32)
        .chain((0..10).map(|k| Bson::String(format!("k-{k}"))))
        .collect();
    for key in &keys {
        live.wait(orders.insert_one(doc! {"_id": key.clone(), "n": 0}))
            .unwrap();
    }
    for key in keys.iter().step_by(3) {
        live.wait(orders.update_one(doc! {"_id": key.clone()}, doc! {"$set": {"n": 1}}))
            .unwrap();
    }
    for key in keys.iter().step_by(4) {
        live.wait(orders.delete_one(doc! {"_id": key.clone()}))
            .unwrap();
    }
    let mut handed_off = 0;
    for i in 0..PARTITIONS {
        handed_off += run_partition(&live, i)["events_handed_off"]
            .as_u64()
            .unwrap();
    }

    let stream = live.events_after(&start);
    assert_eq!(handed_off as usize, stream.len());
    // Where each event went, checked against MongoDB's hashed-index function computed here.
    let mut seen = HashSet::new();
    let mut partition_of_key: HashMap<String, u32> = HashMap::new();
    for i in 0..PARTITIONS {
        let records = records_of(&live, i);
        assert!(!records.is_empty(), "partition {i} got nothing");
        let mut last_seq: HashMap<String, usize> = HashMap::new();
        for record in records {
            let event = record.get_document("event").unwrap();
            let key = event
                .get_document("documentKey")
                .unwrap()
                .get("_id")
                .unwrap();
            assert_eq!(
                Partition::of_hash(hashed_index_key(key, 0), PARTITIONS),
                i,
                "{key} in partition {i}"
            );
            let token = handoff::domain::token::canonical_text(event.get_document("_id").unwrap());
            assert!(seen.insert(token.clone()), "{token} handed off twice");
            let at = stream
                .iter()
                .position(|e| e.get_document("_id").unwrap() == event.get_document("_id").unwrap())
                .expect("an event of the stream");
            let name = key.to_string();
            if let Some(before) = last_seq.insert(name.clone(), at) {
                assert!(before < at, "the events of {name} out of order");
            }
            assert_eq!(*partition_of_key.entry(name).or_insert(i), i);
        }
    }
    assert_eq!(seen.len(), stream.len(), "every event once");
    // Each partition's checkpoint is its own, and records its share.
    for i in 0..PARTITIONS {
        let checkpoint = live
            .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer(i)}))
            .unwrap()
            .unwrap();
        let partition = checkpoint
            .get_document("config")
            .unwrap()
            .get_document("partition")
            .unwrap()
            .clone();
        assert_eq!(
            partition,
            doc! {"index": i64::from(i), "count": i64::from(PARTITIONS)}
        );
    }
}

#[test]
fn a_dropped_collection_is_handed_off_once_and_invalidates_every_partition() {
    let live = Live::start();
    for i in 0..PARTITIONS {
        run_partition(&live, i);
    }
    live.insert(0..6);
    live.wait(live.coll("orders").drop()).unwrap();
    let mut statuses = Vec::new();
    for i in 0..PARTITIONS {
        statuses.push(run_partition(&live, i)["status"].clone());
        let checkpoint = live
            .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer(i)}))
            .unwrap()
            .unwrap();
        assert_eq!(
            checkpoint.get_str("mode").unwrap(),
            "startAfter",
            "partition {i}"
        );
    }
    assert!(statuses.iter().all(|s| s == "INVALIDATED"), "{statuses:?}");
    let drops: Vec<u32> = (0..PARTITIONS)
        .filter(|i| {
            records_of(&live, *i).iter().any(|r| {
                r.get_document("event")
                    .unwrap()
                    .get_str("operationType")
                    .unwrap()
                    == "drop"
            })
        })
        .collect();
    assert_eq!(
        drops,
        [Partition::of_hash(
            hashed_index_key(&Bson::Null, 0),
            PARTITIONS
        )],
        "the drop, which has no document key, goes to the partition of null"
    );
    // The six inserts and the drop, once each.
    let records: usize = (0..PARTITIONS).map(|i| records_of(&live, i).len()).sum();
    assert_eq!(records, 6 + 1);
}

#[test]
fn a_bad_partition_is_refused_and_another_is_a_configuration_change() {
    let live = Live::start();
    for bad in ["3/3", "1", "x/2", "0/0", "0/2000"] {
        support::fails(&live.run(&["--partition", bad]), 2, "--partition:");
    }
    assert!(live.checkpoint().is_none());
    support::ok(&live.run(&["--partition", "0/2"]));
    support::fails(
        &live.run(&["--partition", "1/2"]),
        4,
        "partition: checkpoint 0/2, this run 1/2",
    );
}

#[test]
fn no_reason_moves_a_consumer_to_another_partition() {
    let live = Live::start();
    support::ok(&live.run(&["--partition", "0/2"]));
    support::ok(&live.run(&["--consumer-id", "whole"]));
    let checkpoint_of = |consumer: &str| {
        live.wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer}))
            .unwrap()
            .unwrap()
    };
    let before = [checkpoint_of(CONSUMER), checkpoint_of("whole")];
    for (consumer, partition, difference) in [
        (CONSUMER, Some("1/2"), "checkpoint 0/2, this run 1/2"),
        (CONSUMER, Some("0/4"), "checkpoint 0/2, this run 0/4"),
        (CONSUMER, None, "checkpoint 0/2, this run none"),
        ("whole", Some("0/2"), "checkpoint none, this run 0/2"),
    ] {
        let mut args = vec![
            "--consumer-id",
            consumer,
            "--accept-config-change",
            "more throughput",
        ];
        if let Some(partition) = partition {
            args.extend(["--partition", partition]);
        }
        let refused = live.run(&args);
        support::fails(&refused, 4, difference);
        let message = support::stderr(&refused);
        assert!(
            message.contains("part of a consumer's identity")
                && message.contains("new consumer ID"),
            "{message}"
        );
    }
    // Nothing was recorded: each checkpoint still stands for its own partition, unchanged.
    let after = [checkpoint_of(CONSUMER), checkpoint_of("whole")];
    for (before, after) in before.iter().zip(&after) {
        assert_eq!(after.get("config"), before.get("config"));
        assert_eq!(after.get("token"), before.get("token"));
        assert!(after.get("configChanges").is_none(), "{after}");
    }

    // Another change within the same partition is accepted with a reason, and recorded.
    let refused = live.run(&["--partition", "0/2", "--full-document", "default"]);
    support::fails(&refused, 4, "--accept-config-change");
    support::ok(&live.run(&[
        "--partition",
        "0/2",
        "--full-document",
        "default",
        "--accept-config-change",
        "no lookups",
    ]));
    let changes = checkpoint_of(CONSUMER)
        .get_array("configChanges")
        .unwrap()
        .clone();
    assert_eq!(changes.len(), 1);
}
