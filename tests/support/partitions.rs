//! Partitioned consumers under writes: a paced writer whose every write says its place, and the
//! check that N partitions handed each write off once, each key by one partition, in order.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bson::{Document, doc};

use super::Rng;
use super::live::{CHECKPOINTS, Live};

/// Inserts keys `0..keys` (`v: 0`), then `updates` updates of random keys setting `v` to
/// 1, 2, … in order, with pauses of up to 12 ms. Returns the number of writes.
pub async fn write_keys(db: mongodb::Database, keys: i32, updates: i32, seed: u64) -> usize {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let orders = db.collection::<Document>("orders");
    for key in 0..keys {
        orders
            .insert_one(doc! {"_id": key, "v": 0})
            .await
            .expect("insert");
    }
    for v in 1..=updates {
        let key = rng.below(keys as u64) as i32;
        orders
            .update_one(doc! {"_id": key}, doc! {"$set": {"v": v}})
            .await
            .expect("update");
        tokio::time::sleep(Duration::from_millis(rng.below(12))).await;
    }
    (keys + updates) as usize
}

/// Checks the outbox of [`write_keys`]' writes handed off by `partitions` consumers: `expected`
/// records, none twice, each key's events by one consumer and in the order they were written,
/// every consumer with some.
pub fn check_partitioned(outbox: &[Document], expected: usize, partitions: usize, seed: u64) {
    assert_eq!(outbox.len(), expected, "every write once (seed {seed})");
    let mut partition_of = HashMap::new();
    let mut last_v = HashMap::new();
    let mut ids = HashSet::new();
    for record in outbox {
        let id = record.get_str("_id").expect("_id").to_string();
        assert!(ids.insert(id), "a record twice (seed {seed})");
        let consumer = record.get_str("consumer").expect("consumer").to_string();
        let event = record.get_document("event").expect("event");
        let key = event
            .get_document("documentKey")
            .and_then(|k| k.get_i32("_id"))
            .expect("documentKey._id");
        let v = event
            .get_document("updateDescription")
            .ok()
            .and_then(|u| u.get_document("updatedFields").ok())
            .and_then(|f| f.get_i32("v").ok())
            .or_else(|| {
                event
                    .get_document("fullDocument")
                    .ok()
                    .and_then(|d| d.get_i32("v").ok())
            })
            .expect("the write's v");
        let first = partition_of.entry(key).or_insert_with(|| consumer.clone());
        assert_eq!(
            *first, consumer,
            "key {key} in two partitions (seed {seed})"
        );
        let before = last_v.insert(key, v);
        assert!(
            before.is_none_or(|b| b < v),
            "key {key}: {v} after {before:?} (seed {seed})"
        );
    }
    let used: HashSet<_> = partition_of.values().collect();
    assert_eq!(
        used.len(),
        partitions,
        "every partition handed some off (seed {seed})"
    );
}

/// Waits until each of `consumers` has saved its starting position (a new checkpoint's token is
/// null until then): a partition's consumer starts where its first run starts.
pub fn started(live: &Live, consumers: &[String]) {
    let started = Instant::now();
    let filter = doc! {"_id": {"$in": consumers}, "token": {"$type": "object"}};
    while live
        .wait(live.coll(CHECKPOINTS).count_documents(filter.clone()))
        .expect("count")
        < consumers.len() as u64
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the partitions never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until a run holds `consumer`'s lease (its lease runs into the future).
pub fn claimed(live: &Live, consumer: &str) {
    let started = Instant::now();
    loop {
        let checkpoint = live
            .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer}))
            .expect("find the checkpoint");
        let until = checkpoint.and_then(|c| c.get_datetime("leaseUntil").ok().copied());
        if until.is_some_and(|until| until > bson::DateTime::now()) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no run took {consumer}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ends a consumer's lease now, as time would after its run was killed.
pub fn expire_lease_of(live: &Live, consumer: &str) {
    live.wait(live.coll(CHECKPOINTS).update_one(
        doc! {"_id": consumer},
        doc! {"$set": {"leaseUntil": bson::DateTime::from_millis(0)}},
    ))
    .expect("expire the lease");
}
